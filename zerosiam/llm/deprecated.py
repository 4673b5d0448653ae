"""The language learner's old names, kept working for one release: it now says what the image learner
says, and each use of an old name warns once with a ``DeprecationWarning`` that names the new one.

    LMConfig            → LMSettings        (the learner's settings, as ``methods.Settings``)
    lr_predictor        → predictor_lr      (η_h, as ``Settings.predictor_lr``)
    predictor_distance  → predictor_drift   (‖θ_h − I‖_F, as the image adapter's history key)
    LMAdapter(config=)  → LMAdapter(settings=)
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

Class = TypeVar("Class", bound=type)


def warn_renamed(old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` is now ``new``; ``stacklevel`` as ``warnings.warn``'s, counted from the caller."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def renamed_fields(**renames: str) -> Callable[[Class], Class]:
    """A decorator for a dataclass whose fields were renamed, given as ``old="new"``: its constructor
    still takes the old keyword and its instances still answer to the old attribute, with a warning."""

    def decorate(cls: Class) -> Class:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for old, new in renames.items():
                if old in kwargs:
                    warn_renamed(f"{cls.__name__}({old}=…)", f"{new}=", stacklevel=2)
                    if new in kwargs:
                        raise TypeError(f"{cls.__name__} got both {old}= and its new name {new}=")
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        for old, new in renames.items():
            setattr(cls, old, _old_attribute(f"{cls.__name__}.{old}", f"{cls.__name__}.{new}", new))
        return cls

    return decorate


def _old_attribute(old: str, new: str, name: str) -> property:
    def read(self: Any) -> Any:
        warn_renamed(old, new)
        return getattr(self, name)

    return property(read, doc=f"Deprecated: ``{name}``.")
