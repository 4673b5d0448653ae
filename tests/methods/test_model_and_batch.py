"""What ``zerosiam.adapt`` needs of a model and of a batch, said in one line instead of a torch error deep in
the first step: an adapting method needs norm layers it can move (a TorchScript model hides them), and a
floating-point batch of another precision is cast to the model's, as the model would need."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import zerosiam
from tests.conftest import TinyGN
from zerosiam.methods import available_methods, get_recipe

ADAPTING = [
    name for name, kinds in available_methods().items() if "image" in kinds and get_recipe(name).adapts
]


def linear_only() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))


def traced(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript is deprecated, and tracing warns about a constant
        return torch.jit.trace(model.eval(), torch.rand(1, 3, 8, 8))


@pytest.mark.parametrize("method", ADAPTING)
def test_a_model_without_norm_layers_is_refused_saying_what_the_method_adapts(method):
    model = linear_only()
    with pytest.raises(ValueError) as refused:
        zerosiam.adapt(model, method, lr=1e-3)
    message = str(refused.value)
    assert (
        f"{method} adapts the weight and bias of norm layers" in message and "Sequential has none" in message
    )
    assert "\n" not in message and all(p.requires_grad for p in model.parameters())  # the model as it came


@pytest.mark.parametrize("method", ADAPTING)
def test_a_torchscript_model_is_refused_for_every_adapting_method(method):
    with pytest.raises(TypeError, match="a TorchScript model hides its layers") as refused:
        zerosiam.adapt(traced(TinyGN()), method, lr=1e-3)
    assert f"{method} adapts the weight and bias of norm layers" in str(refused.value)


def test_noadapt_takes_a_model_without_norm_layers_and_a_torchscript_model(images):
    for model in (linear_only(), traced(TinyGN())):
        assert zerosiam.adapt(model, "noadapt")(images).shape == (6, 5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["noadapt", "tent", "zerosiam"])
def test_a_batch_of_another_float_dtype_is_cast_to_the_models(tiny_gn, images, dtype, method):
    reference = zerosiam.adapt(TinyGN().eval(), method, lr=1e-3)
    reference.model.load_state_dict(tiny_gn.state_dict())
    batch = images.to(dtype)
    expected = reference(batch.float())
    adapter = zerosiam.adapt(tiny_gn, method, lr=1e-3)
    assert adapter.predict(batch).dtype == torch.float32
    assert torch.equal(adapter(batch), expected)  # the same prediction as the float32 batch


def test_a_float64_model_takes_a_float32_batch(tiny_gn, images):
    adapter = zerosiam.adapt(tiny_gn.to(torch.float64), "tent", lr=1e-3)
    assert adapter(images).shape == (6, 5)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_a_batch_that_is_not_floating_point_is_refused_in_one_line(tiny_gn, images, dtype):
    adapter = zerosiam.adapt(tiny_gn, "tent", lr=1e-3)
    with pytest.raises(TypeError, match=f"expected a floating-point batch, got dtype {dtype}") as refused:
        adapter((images * 255).to(dtype))
    assert "\n" not in str(refused.value)


def test_none_as_the_model_is_refused_in_one_line():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got NoneType"):
        zerosiam.adapt(None, "tent")
