"""Methods: the registry of recipes and ``adapt``, the one-line entry point.

One registry serves both modalities: a method has a recipe per modality it supports. Most recipes are
the same object on images and on text; where the paper runs a method differently on language models
(SAR and EATA with E0 = 0.4 nats, EATA without its Fisher term, COME on Tent) the text recipe is its own,
defined in the method's file; DeYO is image-only (its second view shuffles image patches) and TLM is
text-only (it reads the prompt).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from zerosiam.methods.adapter import Adapter, prepare_options
from zerosiam.methods.come import come, come_text
from zerosiam.methods.deyo import deyo
from zerosiam.methods.eata import eata, eata_text, eta
from zerosiam.methods.hparams import Rates, resolve_rates
from zerosiam.methods.limits import check_numbers
from zerosiam.methods.noadapt import noadapt
from zerosiam.methods.online import Frozen, NonFiniteInputError, OnlineModel, Settings, refuse_held
from zerosiam.methods.recipe import Asymmetry, Recipe
from zerosiam.methods.sar import sar, sar_text
from zerosiam.methods.speed import Speed, with_speed
from zerosiam.methods.tent import tent
from zerosiam.methods.tlm import tlm
from zerosiam.methods.zerosiam import with_zerosiam, zerosiam
from zerosiam.parts.contract import MODALITIES, Modality
from zerosiam.parts.guards import Guard, guard_named
from zerosiam.parts.learner import keyword_options
from zerosiam.parts.norms import NormSelector
from zerosiam.parts.precision import check_precision
from zerosiam.parts.split import check_head

METHODS: dict[str, dict[Modality, Recipe]] = {}
COMPOSABLE_SUFFIX = "+zerosiam"


def register(recipe: Recipe, modality: Modality = "image") -> Recipe:
    """Make ``recipe`` available by its name, for ``modality``, to ``adapt`` and the benchmarks."""
    if modality not in recipe.modalities:
        raise ValueError(f"recipe {recipe.name!r} has parts that do not work on {modality}")
    METHODS.setdefault(recipe.name, {})[modality] = recipe
    return recipe


for _recipe in (noadapt, tent, zerosiam, sar, eata, eta, deyo, come):
    register(_recipe)
# The paper's compositions (§ integration with EATA and DeYO), listed so that benchmarks see them.
for _recipe in (eata, deyo):
    register(with_zerosiam(_recipe))
# The paper's language-model methods (§4.2).
for _recipe in (noadapt, tent, zerosiam, sar_text, eata_text, come_text, tlm):
    register(_recipe, "text")


def available_methods() -> dict[str, tuple[Modality, ...]]:
    """Every registered method and the modalities it supports, e.g. ``{"deyo": ("image",), ...}``."""
    return {name: tuple(m for m in MODALITIES if m in recipes) for name, recipes in METHODS.items()}


def get_recipe(method: str | Recipe, modality: Modality = "image") -> Recipe:
    """A recipe by name for ``modality``; ``<name>+zerosiam`` composes ZeroSiam's asymmetry onto any
    adapting recipe. A method or recipe that does not support ``modality`` is refused in one line."""
    if modality not in MODALITIES:
        raise ValueError(f"unknown modality {modality!r}; choose one of {', '.join(MODALITIES)}")
    if isinstance(method, Recipe):
        if modality not in method.modalities:
            raise ValueError(f"recipe {method.name!r} has parts that do not work on {modality}")
        return method
    if method in METHODS:
        recipes = METHODS[method]
        if modality not in recipes:
            raise ValueError(f"method {method!r} supports {', '.join(recipes)} only, not {modality}")
        return recipes[modality]
    if method.endswith(COMPOSABLE_SUFFIX):
        base = get_recipe(method.removesuffix(COMPOSABLE_SUFFIX), modality)
        if base.adapts and base.asymmetry is None:
            return with_zerosiam(base)
    choices = ", ".join(name for name, supported in available_methods().items() if modality in supported)
    raise ValueError(f"unknown method {method!r} for {modality}; available: {choices} (or <method>+zerosiam)")


_ASYMMETRY_FIELDS = {f.name for f in dataclasses.fields(Asymmetry)}
_RECIPE_FIELDS = {f.name for f in dataclasses.fields(Recipe)} - {"name"}
# How the caller lays out its batches, not an option of the method: a benchmark stacks streams itself.
_LAYOUT = {"streams"}


def _takes(recipe: Recipe) -> set[str]:
    """Every keyword ``adapt`` takes with ``recipe``: its own (read from its signature), the recipe's
    fields, ZeroSiam's asymmetry options when the recipe has a predictor, and what its parts prepare on."""
    options = keyword_options(adapt) | _RECIPE_FIELDS | prepare_options(recipe)
    return options | _ASYMMETRY_FIELDS if recipe.asymmetry is not None else options


def options_of(method: str | Recipe) -> set[str]:
    """Every keyword ``adapt`` takes with ``method`` but ``streams`` (the batches' layout, which a
    benchmark sets with ``--stack``): its own (rates, batch size, head, precision, ...), the recipe's
    fields, ZeroSiam's asymmetry options when the recipe has a predictor, and what its parts prepare on."""
    return _takes(get_recipe(method)) - _LAYOUT


def _apply_overrides(recipe: Recipe, overrides: dict) -> tuple[Recipe, dict]:
    """Recipe fields and ZeroSiam's asymmetry options (alpha, predictor, divergence, stop_gradient);
    returns the recipe and the extras its parts take in ``prepare`` (e.g. EATA's ``clean_data``)."""
    fields = {k: overrides.pop(k) for k in list(overrides) if k in _RECIPE_FIELDS}
    asymmetric = {k: overrides.pop(k) for k in list(overrides) if k in _ASYMMETRY_FIELDS}
    changed = recipe.with_(**fields) if fields else recipe
    unknown = set(overrides) - prepare_options(changed)
    if unknown:
        options = ", ".join(sorted(_takes(changed)))
        raise TypeError(f"unknown option(s) {sorted(unknown)} for {recipe.name}; options are {options}")
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
    precision: str = "fp32",
    diagnostics: bool = True,
    streams: int = 1,
    output: str | int | None = None,
    guard: str | Guard | None = None,
    compile: bool | str = False,
    channels_last: bool = False,
    fixed_shape: bool = False,
    graph: bool = False,
    attention: str | None = None,
    frozen_bf16: bool = False,
    **overrides,
) -> OnlineModel:
    """Wrap ``model`` for online test-time adaptation by ``method`` (an ``Adapter``; for ``noadapt``,
    which adapts nothing, the ``Frozen`` model with the same face).

    ``lr`` (η_f) and ``predictor_lr`` (η_h) default to the paper's rates for the model's family at
    ``batch_size``, times ``lr_scale``: it moves both defaults together, e.g. to try the paper's rates ×10
    on a smaller model, and leaves an explicit ``lr`` or ``predictor_lr`` as given. ``head`` names the
    classifier module when it cannot be detected. ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``) is
    the forward's: ``tf32`` lets matrix products and convolutions run on TF32 tensor cores (an Ampere or
    newer GPU; elsewhere it is ``fp32``), ``bf16`` and ``fp16`` autocast; losses and updates stay in
    float32 (``zerosiam.parts.precision``). Any other keyword overrides a recipe field or ZeroSiam's
    asymmetry option (``alpha``, ``predictor``, ``divergence``, ``stop_gradient``), e.g.
    ``adapt(model, "zerosiam", predictor="mlp")``; keywords that a recipe's parts take in ``prepare`` go to
    them, e.g. ``adapt(model, "eata", clean_data=loader)``.
    ``diagnostics=False`` records only the step counts, not the per-step collapse indicators.
    ``guard`` (``none``, ``rdumb``, ``sar``, ``auto``, or a guard object; ``zerosiam.parts.guards``)
    watches after each step and puts back a stream that it finds collapsing; each step's ``guard``
    diagnostic says whether it fired. NoAdapt has nothing to guard.
    ``streams=B`` adapts B independent streams in one forward, each batch holding ``batch_size`` samples
    of every stream, stream-major, each stream as if it ran alone (GroupNorm/LayerNorm models, linear
    predictors; ``zerosiam.parts.streams``).
    ``compile`` (True, or a ``torch.compile`` mode such as ``"reduce-overhead"``) compiles the model's
    forward, and the backward through it; ``channels_last`` stores convolution weights and inputs
    channels-last. Both are off by default, give the eager path's predictions within float rounding, and
    are taken off the model by ``release()`` (``zerosiam.methods.speed``); which pays depends on the device
    and model (``docs/efficiency.md``). Compiling costs seconds to minutes before the first step.
    ``fixed_shape`` takes every decision of a step on the device (no read of it mid-step: the streams that
    must not move are put back after a whole step); ``graph`` captures that step as a CUDA graph and
    replays it (a GPU; every method, guarded by none, ``rdumb``, ``sar`` or ``auto``;
    ``zerosiam.methods.capture``).
    ``attention`` (``math``, ``efficient``, ``flash``, ``cudnn``) runs scaled-dot-product attention on one
    backend; ``frozen_bf16`` stores frozen linear and convolution weights in bfloat16 under
    ``precision="bf16"`` (``zerosiam.methods.speed``).

    ``model`` may be any classifier: timm, torchvision, the zoo, a Hugging Face ``transformers`` image
    classifier (``AutoModelForImageClassification``: its ``pixel_values`` is the first positional
    argument, so ``model(x)`` works) or your own. Whatever it returns, the adapter returns a logits tensor,
    read by one rule (``zerosiam.parts.split.logits_of``): a tensor is the logits; from a tuple, dict or
    ``ModelOutput``, the field ``output`` names (a key or a position), else ``logits``, else the one tensor
    it holds; an output the rule cannot decide is a one-line error naming its fields.

    Every argument is checked before the model is touched, each refusal one line: numbers by
    ``zerosiam.methods.limits.NUMBERS``, a named ``head`` that must be in the model (for every method), and
    a model another live wrapper holds (``release()`` that one first). An error while the adapter is
    built, or in its first forward, hands the model back as it came before it goes on (``docs/methods.md``,
    "What adapt refuses").
    """
    speed = Speed(compile, channels_last, fixed_shape, graph, attention, frozen_bf16)
    recipe, extras = _apply_overrides(get_recipe(method), dict(overrides))
    if guard is not None:
        recipe = recipe.with_(guard=guard_named(guard) if isinstance(guard, str) else guard)
    check_numbers(
        {"lr": lr, "predictor_lr": predictor_lr, "momentum": momentum, "batch_size": batch_size,
         "lr_scale": lr_scale, "streams": streams, **overrides}
    )  # fmt: skip
    _check_model(model)
    check_adaptable(model, recipe)
    check_head(model, head)
    refuse_held(model)
    defaulted = _defaulted_rates(recipe, lr, predictor_lr)
    rates = (
        resolve_rates(model, recipe.lr_family, batch_size, recipe.double_lr_at_bs1, defaulted=defaulted)
        if recipe.adapts
        else Rates(0.0)
    )
    settings = Settings(
        lr=lr if lr is not None else rates.lr * lr_scale,
        predictor_lr=predictor_lr if predictor_lr is not None else rates.predictor_lr * lr_scale,
        momentum=momentum,
        precision=check_precision(precision),
        diagnostics=diagnostics,
        fixed_shape=speed.fixed_shape,
    )
    if not recipe.adapts:
        return with_speed(Frozen(model, recipe, settings, streams=streams, output=output), speed)
    adapter = Adapter(model, recipe, settings, head=head, extras=extras, streams=streams, output=output)
    return with_speed(adapter, speed)


def _check_model(model: object) -> None:
    """A ``torch.nn.Module``; a wrapper passed instead (an adapter of it) is told how to get the model."""
    if isinstance(model, nn.Module):
        return
    hint = "; release() it and adapt the model it returns" if hasattr(model, "release") else ""
    raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}{hint}")


def check_adaptable(model: nn.Module, method: str | Recipe) -> None:
    """Refuse, in one line saying what the method needs, a model without norm layers with parameters for
    an adapting method: every recipe adapts the weight and bias of norm layers, and without any the first
    step would stop on ``element 0 of tensors does not require grad``. A TorchScript model hides its
    layers' classes, so no norm layer of it can be found. NoAdapt takes any model. (A model whose norms
    all lie where a recipe leaves them, SAR's last stage, is taken: that recipe adapts nothing there.)"""
    recipe = get_recipe(method)
    if not recipe.adapts or NormSelector().parameters(model):
        return
    needs = f"{recipe.name} adapts the weight and bias of norm layers (BatchNorm, GroupNorm, LayerNorm, ...)"
    if any(isinstance(module, torch.jit.ScriptModule) for module in model.modules()):
        raise TypeError(
            f"{needs}, and a TorchScript model hides its layers: adapt the nn.Module it was scripted from "
            "(a builder: in a benchmark), or score it with noadapt"
        )
    network = type(getattr(model, "wrapped_model", model)).__name__
    raise ValueError(f"{needs}, and {network} has none with parameters: use a model with them, or noadapt")


def _defaulted_rates(recipe: Recipe, lr: float | None, predictor_lr: float | None) -> tuple[str, ...]:
    """The rates the adapter takes from the paper's table because the caller gave none: ``lr``, and
    ``predictor_lr`` where the recipe has a predictor to learn."""
    if not recipe.adapts:
        return ()
    defaulted = ["lr"] if lr is None else []
    if predictor_lr is None and recipe.asymmetry is not None:
        defaulted.append("predictor_lr")
    return tuple(defaulted)


__all__ = [
    "Adapter",
    "Asymmetry",
    "Frozen",
    "OnlineModel",
    "METHODS",
    "NonFiniteInputError",
    "Recipe",
    "adapt",
    "available_methods",
    "check_adaptable",
    "get_recipe",
    "options_of",
    "register",
]
