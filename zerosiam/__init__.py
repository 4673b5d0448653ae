"""zerosiam: test-time adaptation without collapse (ZeroSiam), its baselines, protocols and benchmarks."""

from zerosiam.methods import Adapter, Recipe, adapt, available_methods, get_recipe, register
from zerosiam.zoo import available_models, load_model

__version__ = "0.1.0"

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
