"""What a user may try that goes wrong: it must never leave their model broken, adapt in silence, or end
in a traceback from deep inside (issue 84). Each error is one line, raised before any work, and the model
comes back exactly as it was given."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch
from torch import nn

import zerosiam
from tests.conftest import TinyBN, TinyGN
from tests.toys import Tiny, tiny
from zerosiam.methods import available_methods, options_of
from zerosiam.methods.limits import NUMBERS
from zerosiam.methods.stall import STALLED_STEPS, NoUpdateWarning
from zerosiam.parts.fisher import MissingCleanDataError
from zerosiam.parts.split import HeadNotFoundError, OutputNotLogitsError
from zerosiam.zoo.base import Normalized

IMAGE_METHODS = [name for name, modalities in available_methods().items() if "image" in modalities]


def _extras(method: str) -> dict:
    return {"clean_data": [torch.rand(4, 3, 8, 8)]} if method.startswith("eata") else {}


class ScoresAndFeatures(nn.Module):
    """A user's model that returns a dict: its logits under ``scores`` beside ``features``, which no rule
    can tell apart (docs/zoo.md's example). A BatchNorm and a GroupNorm, so that an adapter has modes,
    flags and norm parameters to change; one parameter frozen by the user."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 10)
        self.proj = nn.Linear(8, 16)
        self.conv.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = torch.relu(self.gn(self.bn(self.conv(x)))).mean((2, 3))
        return {"scores": self.fc(z), "features": self.proj(z)}


def _as_given(model: nn.Module) -> dict:
    """Everything an adapter puts on a model or changes in it, but the weights' values: hooks on every
    module and parameter, flags, modes, BatchNorm's tracking and which parameter objects it holds."""
    return {
        "module_hooks": {
            name: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for name, m in model.named_modules()
        },
        "param_hooks": {name: len(p._backward_hooks or {}) for name, p in model.named_parameters()},
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
        "training": {name: m.training for name, m in model.named_modules()},
        "tracking": {
            name: m.track_running_stats
            for name, m in model.named_modules()
            if hasattr(m, "track_running_stats")
        },
        "objects": {name: id(p) for name, p in model.named_parameters()},
        "forward": "forward" in vars(model),
    }


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _assert_left_as_given(model: nn.Module, shape: dict, weights: dict[str, torch.Tensor]) -> None:
    assert _as_given(model) == shape
    now = model.state_dict()
    assert all(torch.equal(now[name], value) for name, value in weights.items())


def _images(n: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(3))


# --- 1. a model left broken ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["tent", "zerosiam", "sar", "noadapt"])
@pytest.mark.parametrize("call", ["step", "predict"])
def test_a_model_whose_output_is_not_logits_comes_back_as_it_was_given(method, call):
    torch.manual_seed(0)
    model = ScoresAndFeatures().eval()
    shape, weights, x = _as_given(model), _weights(model), _images()
    adapter = zerosiam.adapt(model, method, lr=1e-2, predictor_lr=1e-2)
    with pytest.raises(OutputNotLogitsError, match="output='scores'") as error:
        adapter(x) if call == "step" else adapter.predict(x)
    assert "release()" not in str(error.value)  # nothing is left to release
    _assert_left_as_given(model, shape, weights)
    with torch.no_grad():
        assert set(model(x)) == {"scores", "features"}  # plain model(x) works again
    fixed = zerosiam.adapt(model, "tent", output="scores", lr=1e-2)  # the fix the message suggests
    assert fixed(x).shape == (4, 10)
    fixed.release()
    _assert_left_as_given(model, shape, weights)


def test_a_released_adapter_refuses_to_run_instead_of_running_a_model_it_no_longer_holds():
    model = ScoresAndFeatures().eval()
    adapter = zerosiam.adapt(model, "tent", lr=1e-2)
    with pytest.raises(OutputNotLogitsError):
        adapter(_images())
    for use in (adapter, adapter.predict):
        with pytest.raises(RuntimeError, match=r"released .*zerosiam.adapt\(model"):
            use(_images())


def test_an_error_on_a_later_step_leaves_the_adapter_holding_the_model(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-2)
    adapter(images)
    with pytest.raises(RuntimeError):
        adapter(images[:, :2])  # a wrong input after steps that worked: the adapter stays usable
    assert adapter(images).shape == (6, 5)


def test_an_error_while_adapt_builds_the_adapter_leaves_the_model_as_it_was_given(tiny_bn: TinyBN):
    tiny_bn.conv.bias.requires_grad_(False)
    shape, weights = _as_given(tiny_bn), _weights(tiny_bn)
    with pytest.raises(MissingCleanDataError):
        zerosiam.adapt(tiny_bn, "eata", lr=1e-2)
    _assert_left_as_given(tiny_bn, shape, weights)
    with pytest.raises(HeadNotFoundError, match="linear layer"):
        zerosiam.adapt(tiny_bn, "zerosiam", lr=1e-2, head=tiny_bn.bn)  # a head that is no linear layer
    _assert_left_as_given(tiny_bn, shape, weights)
    zerosiam.adapt(tiny_bn, "eta", lr=1e-2).release()  # nothing holds the model: it adapts again


def test_release_after_a_release_changes_nothing(tiny_gn: TinyGN, images):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-1)
    adapter(images)
    adapted = _weights(tiny_gn)
    adapter.release(keep_adapted=True)
    assert adapter.release() is tiny_gn
    assert all(torch.equal(tiny_gn.state_dict()[name], value) for name, value in adapted.items())


# --- 2. a model another adapter holds -------------------------------------------------------------


@pytest.mark.parametrize("first", ["tent", "noadapt"])
def test_adapting_a_model_another_wrapper_holds_is_refused_in_one_line(tiny_gn: TinyGN, images, first):
    holder = zerosiam.adapt(tiny_gn, first, lr=1e-1)
    holder(images)
    shape = _as_given(tiny_gn)
    with pytest.raises(ValueError, match=r"already .*release\(\).* copy") as error:
        zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-2, predictor_lr=1e-2)
    assert "\n" not in str(error.value) and "TinyGN" in str(error.value) and first in str(error.value)
    assert _as_given(tiny_gn) == shape  # refused before anything was put on the model
    holder.release()
    zerosiam.adapt(tiny_gn, "zerosiam", lr=1e-2, predictor_lr=1e-2)(images)


def test_a_wrapper_passed_as_the_model_is_refused(tiny_gn: TinyGN):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-2)
    with pytest.raises(TypeError, match=r"torch.nn.Module.*Adapter.*release\(\)"):
        zerosiam.adapt(adapter, "tent")


# --- 3. numeric options ----------------------------------------------------------------------------


BAD_NUMBERS = [
    ("lr", float("nan"), ValueError),
    ("lr", float("inf"), ValueError),
    ("lr", -1e-3, ValueError),
    ("lr", "1e-3", TypeError),
    ("lr", True, TypeError),
    ("predictor_lr", -1, ValueError),
    ("predictor_lr", float("nan"), ValueError),
    ("batch_size", 0, ValueError),
    ("batch_size", 64.0, TypeError),
    ("momentum", 1.5, ValueError),
    ("streams", 0, ValueError),
    ("lr_scale", 0, ValueError),
    ("alpha", float("nan"), ValueError),
]


@pytest.mark.parametrize(
    "method, option, value, error",
    [
        (method, *case)
        for method in ("tent", "zerosiam", "sar", "noadapt")
        for case in BAD_NUMBERS
        if case[0] != "alpha" or method == "zerosiam"  # only ZeroSiam's predictor takes alpha
    ],
)
def test_a_bad_number_is_refused_in_one_line_naming_the_option_value_and_what_is_allowed(
    tiny_gn: TinyGN, method, option, value, error
):
    shape = _as_given(tiny_gn)
    with pytest.raises(error, match=f"^{re.escape(f'{option}={value!r}')}.*{option} must be") as raised:
        zerosiam.adapt(tiny_gn, method, **{option: value})
    assert "\n" not in str(raised.value)
    assert _as_given(tiny_gn) == shape


def test_a_zero_learning_rate_stays_allowed_the_batchnorm_control(tiny_bn: TinyBN, images):
    weights = _weights(tiny_bn)
    adapter = zerosiam.adapt(tiny_bn, "tent", lr=0)
    adapter(images)
    assert adapter.settings.lr == 0 and adapter.last["updated"]
    assert all(torch.equal(tiny_bn.state_dict()[name], value) for name, value in weights.items())


def test_every_numeric_option_of_every_method_has_a_rule():
    """The rules are by option name, for every method: a numeric option a recipe gains must get one."""
    import typing

    from zerosiam.methods import adapt
    from zerosiam.methods.recipe import Asymmetry, Recipe

    hints = {
        **typing.get_type_hints(Recipe),
        **typing.get_type_hints(Asymmetry),
        **typing.get_type_hints(adapt),
    }

    def numeric(hint: object) -> bool:  # a number, not a choice that may be a position (``output``)
        kinds = typing.get_args(hint) or (hint,)
        return any(kind in (int, float) for kind in kinds) and str not in kinds

    options = set().union(*(options_of(method) for method in IMAGE_METHODS)) | {"streams"}
    assert {name for name in options if numeric(hints.get(name))} <= set(NUMBERS)


# --- 4. a head that does not exist ------------------------------------------------------------------


@pytest.mark.parametrize("method", IMAGE_METHODS)
def test_a_named_head_that_does_not_exist_is_an_error_for_every_method(method):
    model = tiny()
    shape = _as_given(model)
    with pytest.raises(HeadNotFoundError, match="'nope'"):
        zerosiam.adapt(model, method, lr=1e-2, predictor_lr=1e-2, head="nope", **_extras(method))
    assert _as_given(model) == shape


def test_a_head_that_is_not_part_of_the_model_is_an_error(tiny_gn: TinyGN):
    with pytest.raises(HeadNotFoundError, match="not a submodule of TinyGN"):
        zerosiam.adapt(tiny_gn, "tent", lr=1e-2, head=nn.Linear(8, 5))


# --- 5. the notices about rates and stages ----------------------------------------------------------


def test_the_fallback_rate_notice_is_silent_with_an_explicit_lr_and_said_once_per_model_class(caplog):
    class Unpublished(TinyGN):  # a family the paper publishes no rate for; a class of its own per test run
        pass

    caplog.set_level(logging.WARNING, logger="zerosiam.methods.hparams")
    zerosiam.adapt(Unpublished(), "tent", lr=1e-3)
    assert caplog.text == ""  # the rate was chosen: nothing to say
    zerosiam.adapt(Unpublished(), "zerosiam", lr=1e-3)
    assert "no published learning rate" not in caplog.text
    assert caplog.text.count("no predictor_lr") == 1  # η_h still comes from the fallback's table
    zerosiam.adapt(Unpublished(), "tent")
    zerosiam.adapt(Unpublished(), "zerosiam")
    zerosiam.adapt(Unpublished(), "zerosiam", lr=1e-3)
    assert caplog.text.count("no published learning rate for Unpublished") == 1
    assert caplog.text.count("no predictor_lr") == 1


def test_no_last_stage_names_the_users_model_not_the_zoos_wrapper(caplog):
    class Stageless(TinyGN):
        pass

    caplog.set_level(logging.WARNING, logger="zerosiam.parts.norms")
    zerosiam.adapt(Normalized(Stageless(), (0.5,) * 3, (0.25,) * 3), "sar", lr=1e-3)
    assert "no last stage found in Stageless" in caplog.text and "Normalized" not in caplog.text
    assert caplog.text.count("no last stage") == 1


# --- 6. a selective method that never updates -------------------------------------------------------


@pytest.mark.parametrize("method", ["sar", "eata", "deyo"])
def test_a_selective_method_that_never_updates_warns_once(method):
    model = tiny()
    with torch.no_grad():
        model.fc.weight.zero_()  # uniform predictions: H = ln C, above every threshold
    adapter = zerosiam.adapt(model, method, lr=1e-2, **_extras(method))
    x = _images()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(STALLED_STEPS - 1):
            adapter(x)
        assert not [w for w in caught if issubclass(w.category, NoUpdateWarning)]
        for _ in range(STALLED_STEPS + 1):
            adapter(x)
    said = [str(w.message) for w in caught if issubclass(w.category, NoUpdateWarning)]
    assert len(said) == 1, said
    assert method in said[0] and str(STALLED_STEPS) in said[0]
    assert "confident" in said[0] and "threshold" in said[0] and "\n" not in said[0]


class Gated(Tiny):
    """Tiny whose logits are scaled by the first pixel of each image: 0 gives a uniform prediction that no
    threshold keeps, a large value a confident one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * x[:, :1, 0, 0]


def test_a_selective_method_that_updates_now_and_then_does_not_warn():
    torch.manual_seed(0)
    adapter = zerosiam.adapt(Gated(), "sar", lr=1e-3)
    unsure, sure = _images(), _images()
    unsure[:, :, 0, 0], sure[:, :, 0, 0] = 0.0, 1000.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3 * STALLED_STEPS):
            adapter(sure if step % (STALLED_STEPS - 10) == 0 else unsure)
    assert sum(row["updated"] for row in adapter.history) == 4
    assert not [w for w in caught if issubclass(w.category, NoUpdateWarning)]
