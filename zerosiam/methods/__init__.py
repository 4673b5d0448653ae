"""Methods: the registry of recipes and ``adapt``, the one-line entry point."""

from __future__ import annotations

import dataclasses
import math

from torch import nn

from zerosiam.methods.adapter import Adapter, NonFiniteInputError, Settings, prepare_options
from zerosiam.methods.come import come
from zerosiam.methods.deyo import deyo
from zerosiam.methods.eata import eata, eta
from zerosiam.methods.hparams import Rates, resolve_rates
from zerosiam.methods.noadapt import noadapt
from zerosiam.methods.recipe import Asymmetry, Recipe
from zerosiam.methods.sar import sar
from zerosiam.methods.tent import tent
from zerosiam.methods.zerosiam import with_zerosiam, zerosiam

METHODS: dict[str, Recipe] = {}
COMPOSABLE_SUFFIX = "+zerosiam"


def register(recipe: Recipe) -> Recipe:
    """Make ``recipe`` available by its name to ``adapt`` and the benchmark."""
    METHODS[recipe.name] = recipe
    return recipe


for _recipe in (noadapt, tent, zerosiam, sar, eata, eta, deyo, come):
    register(_recipe)
# The paper's compositions (§ integration with EATA and DeYO), listed so that benchmarks see them.
for _recipe in (eata, deyo):
    register(with_zerosiam(_recipe))


def available_methods() -> list[str]:
    return list(METHODS)


def get_recipe(method: str | Recipe) -> Recipe:
    """A recipe by name; ``<name>+zerosiam`` composes ZeroSiam's asymmetry onto any adapting recipe."""
    if isinstance(method, Recipe):
        return method
    if method in METHODS:
        return METHODS[method]
    if method.endswith(COMPOSABLE_SUFFIX):
        base = get_recipe(method.removesuffix(COMPOSABLE_SUFFIX))
        if base.adapts and base.asymmetry is None:
            return with_zerosiam(base)
    raise ValueError(
        f"unknown method {method!r}; available: {', '.join(available_methods())} (or <method>+zerosiam)"
    )


_ASYMMETRY_FIELDS = {f.name for f in dataclasses.fields(Asymmetry)}
_RECIPE_FIELDS = {f.name for f in dataclasses.fields(Recipe)} - {"name"}


def _apply_overrides(recipe: Recipe, overrides: dict) -> tuple[Recipe, dict]:
    """Recipe fields and ZeroSiam's asymmetry options (alpha, predictor, divergence, stop_gradient);
    returns the recipe and the extras its parts take in ``prepare`` (e.g. EATA's ``clean_data``)."""
    fields = {k: overrides.pop(k) for k in list(overrides) if k in _RECIPE_FIELDS}
    asymmetric = {k: overrides.pop(k) for k in list(overrides) if k in _ASYMMETRY_FIELDS}
    changed = recipe.with_(**fields) if fields else recipe
    unknown = set(overrides) - prepare_options(changed)
    if unknown:
        options = sorted(_ASYMMETRY_FIELDS | _RECIPE_FIELDS | prepare_options(changed))
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for {recipe.name}; options are lr, predictor_lr, momentum, "
            f"batch_size, head, {', '.join(options)}"
        )
    if asymmetric:
        if changed.asymmetry is None:
            raise TypeError(f"{sorted(asymmetric)} apply to ZeroSiam's predictor; {recipe.name} has none")
        changed = changed.with_(asymmetry=dataclasses.replace(changed.asymmetry, **asymmetric))
    return changed, overrides


def adapt(
    model: nn.Module,
    method: str | Recipe = "zerosiam",
    *,
    lr: float | None = None,
    predictor_lr: float | None = None,
    momentum: float = 0.9,
    batch_size: int = 64,
    head: str | nn.Module | None = None,
    lr_scale: float = 1.0,
    **overrides,
) -> Adapter:
    """Wrap ``model`` for online test-time adaptation by ``method``.

    ``lr`` (η_f) and ``predictor_lr`` (η_h) default to the paper's rates for the model's family at
    ``batch_size``, times ``lr_scale``: it moves both defaults together, e.g. to try the paper's rates ×10
    on a smaller model, and leaves an explicit ``lr`` or ``predictor_lr`` as given. ``head`` names the
    classifier module when it cannot be detected. Any other keyword overrides a recipe field or ZeroSiam's
    asymmetry option (``alpha``, ``predictor``, ``divergence``, ``stop_gradient``), e.g.
    ``adapt(model, "zerosiam", predictor="mlp", divergence="js")``; keywords that a recipe's parts take
    in ``prepare`` go to them, e.g. ``adapt(model, "eata", clean_data=loader)``.
    """
    recipe, extras = _apply_overrides(get_recipe(method), dict(overrides))
    if not (math.isfinite(lr_scale) and lr_scale > 0):
        raise ValueError(f"lr_scale must be a positive number, got {lr_scale}")
    rates = (
        resolve_rates(model, recipe.lr_family, batch_size, recipe.double_lr_at_bs1)
        if recipe.adapts
        else Rates(0.0)
    )
    settings = Settings(
        lr=lr if lr is not None else rates.lr * lr_scale,
        predictor_lr=predictor_lr if predictor_lr is not None else rates.predictor_lr * lr_scale,
        momentum=momentum,
    )
    return Adapter(model, recipe, settings, head=head, extras=extras)


__all__ = [
    "Adapter",
    "Asymmetry",
    "METHODS",
    "NonFiniteInputError",
    "Recipe",
    "adapt",
    "available_methods",
    "get_recipe",
    "register",
]
