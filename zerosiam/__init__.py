"""zerosiam: test-time adaptation without collapse (ZeroSiam), its baselines, protocols and benchmarks.

The public names below load on first use (PEP 562), so that importing one layer of the package
(``import zerosiam.parts``) brings in that layer and the ones beneath it, never the ones above.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "Adapter": "zerosiam.methods",
    "Recipe": "zerosiam.methods",
    "adapt": "zerosiam.methods",
    "available_methods": "zerosiam.methods",
    "get_recipe": "zerosiam.methods",
    "register": "zerosiam.methods",
    "available_models": "zerosiam.zoo",
    "load_model": "zerosiam.zoo",
}
__all__ = [
    "Adapter",
    "Recipe",
    "adapt",
    "available_methods",
    "available_models",
    "get_recipe",
    "load_model",
    "register",
]

if TYPE_CHECKING:
    from zerosiam.methods import Adapter, Recipe, adapt, available_methods, get_recipe, register
    from zerosiam.zoo import available_models, load_model


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'zerosiam' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
