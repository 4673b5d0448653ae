"""``zerosiam.adapt`` on Hugging Face image classifiers and on models that return tuples or dicts.

The models are tiny random configurations of the real ``transformers`` classes (ViT, ConvNeXt, Swin, and
DeiT, BEiT, DINOv2): the same module layout, head and output type as the published ones, in milliseconds.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerosiam
from zerosiam.methods.hparams import model_family
from zerosiam.parts.losses import entropy
from zerosiam.parts.norms import WithoutLastStage
from zerosiam.parts.split import OutputNotLogitsError, find_head, logits_of

transformers = pytest.importorskip("transformers")

CLASSES = 5
VIT_SHAPE = {"hidden_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2, "intermediate_size": 32}
TINY = {
    "vit": lambda: transformers.ViTForImageClassification(
        transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
            image_size=16, patch_size=4, num_labels=CLASSES,
        )
    ),
    "convnext": lambda: transformers.ConvNextForImageClassification(
        transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=CLASSES)
    ),
    "swin": lambda: transformers.SwinForImageClassification(
        transformers.SwinConfig(
            image_size=16, patch_size=2, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4,
            num_labels=CLASSES,
        )
    ),
    "deit": lambda: transformers.DeiTForImageClassification(
        transformers.DeiTConfig(**VIT_SHAPE, image_size=16, patch_size=4, num_labels=CLASSES)
    ),
    "beit": lambda: transformers.BeitForImageClassification(
        transformers.BeitConfig(
            **VIT_SHAPE, image_size=16, patch_size=4, use_mean_pooling=True, num_labels=CLASSES
        )
    ),
    "dinov2": lambda: transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(
            hidden_size=16, num_hidden_layers=4, num_attention_heads=2, mlp_ratio=2,
            image_size=16, patch_size=4, num_labels=CLASSES,
        )
    ),
}  # fmt: skip


def tiny(name: str) -> nn.Module:
    """A tiny random ``name`` whose head is scaled until its mean prediction entropy on the test stream is
    about 0.45 nats: SAR then keeps samples (entropy below 0.4·ln 5 = 0.64) and its loss stays above the
    0.2 at which it would reset the model, so every method moves the weights."""
    torch.manual_seed(0)
    model = TINY[name]().eval()
    weight, x = model.classifier.weight.detach().clone(), _stream()[0]
    low, high = 1.0, 1000.0
    with torch.no_grad():
        for _ in range(20):  # bisection on a log scale: the entropy falls as the head grows
            scale = (low * high) ** 0.5
            model.classifier.weight.copy_(weight * scale)
            low, high = (scale, high) if entropy(model(x).logits).mean() > 0.45 else (low, scale)
    return model


def _stream(batches: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.rand(8, 3, 16, 16, generator=generator) for _ in range(batches)]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("method", ["tent", "zerosiam", "sar"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_adapts_a_hugging_face_classifier_and_resets_it_bit_for_bit(name, method):
    model = tiny(name)
    stream = _stream()
    with torch.no_grad():
        expected = model(stream[0]).logits
    source = _state(model)
    adapter = zerosiam.adapt(model, method, lr=1e-2, predictor_lr=1e-2, batch_size=8)
    predictions = [adapter(stream[0])]
    assert adapter.last["updated"], "the method did not step"
    assert any(not torch.equal(value, source[key]) for key, value in model.state_dict().items())
    predictions += [adapter(x) for x in stream[1:]]
    assert all(isinstance(p, torch.Tensor) and p.shape == (8, CLASSES) for p in predictions)
    assert torch.allclose(predictions[0], expected, atol=1e-5)  # the first prediction is the source model's
    adapter.reset()
    assert all(torch.equal(value, source[key]) for key, value in model.state_dict().items())
    assert torch.equal(adapter(stream[0]), predictions[0])  # and it predicts as it did from the start


def test_the_head_is_the_final_linear_even_when_wrapped():
    vit = tiny("vit")
    assert find_head(vit) is vit.classifier
    resnet = transformers.ResNetForImageClassification(
        transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=CLASSES)
    )
    assert isinstance(resnet.classifier, nn.Sequential)  # Flatten, then the Linear
    assert find_head(resnet) is resnet.classifier[1]
    adapter = zerosiam.adapt(resnet.eval(), "zerosiam", lr=1e-3, predictor_lr=1e-2)
    assert adapter(torch.rand(4, 3, 32, 32)).shape == (4, CLASSES)
    assert adapter.predictor.weight.shape == (16, 16)  # the predictor sits before that Linear


def test_sar_leaves_out_the_last_quarter_of_the_blocks_and_the_final_norm_as_for_timm():
    vit = tiny("vit")
    adapted = {name for name, _ in WithoutLastStage().modules(vit)}
    assert adapted and all(not name.startswith(("vit.layers.3.", "vit.layernorm")) for name in adapted)
    assert "vit.layers.2.layernorm_before" in adapted


def test_hugging_face_families_get_the_papers_rates():
    assert model_family(tiny("convnext")) == "convnext_tiny"
    assert model_family(tiny("swin")) == "swin_tiny"
    small = transformers.ViTConfig(
        hidden_size=384, num_hidden_layers=1, num_attention_heads=6, intermediate_size=8
    )
    assert model_family(transformers.ViTForImageClassification(small)) == "vit_small"


def test_release_hands_back_the_model_returning_what_it_returned():
    model = tiny("vit")
    adapter = zerosiam.adapt(model, "tent", lr=1e-3)
    assert isinstance(adapter.model(torch.rand(2, 3, 16, 16)), torch.Tensor)
    adapter.release()
    assert type(model(torch.rand(2, 3, 16, 16))).__name__ == "ImageClassifierOutput"


class Returns(nn.Module):
    """A GroupNorm classifier whose forward returns ``shape(logits, features)``: a tuple, a dict, ..."""

    def __init__(self, shape) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, CLASSES)
        self.shape = shape

    def forward(self, x: torch.Tensor):
        features = torch.relu(self.norm(self.conv(x))).mean((2, 3))
        return self.shape(self.fc(features), features)


@pytest.mark.parametrize(
    ("shape", "option"),
    [
        (lambda logits, features: (logits, None), None),  # a tuple holding one tensor
        (lambda logits, features: {"logits": logits, "features": features}, None),  # a dict with logits
        (lambda logits, features: {"scores": logits, "aux": [features]}, None),  # one tensor in a dict
        (lambda logits, features: (logits, features), 0),  # two tensors: the user names one
        (lambda logits, features: {"scores": logits, "features": features}, "scores"),
    ],
    ids=["tuple", "dict-logits", "dict-one-tensor", "tuple-named", "dict-named"],
)
@pytest.mark.parametrize("method", ["tent", "zerosiam"])
def test_tuple_and_dict_outputs_are_read_by_the_rule(shape, option, method):
    model = Returns(shape)
    x = torch.rand(6, 3, 8, 8)
    with torch.no_grad():
        expected = model.fc(torch.relu(model.norm(model.conv(x))).mean((2, 3)))
    source = _state(model)
    adapter = zerosiam.adapt(model, method, lr=1e-2, predictor_lr=1e-2, output=option)
    assert torch.allclose(adapter(x), expected, atol=1e-6)
    adapter(x)
    adapter.reset()
    assert all(torch.equal(value, source[key]) for key, value in model.state_dict().items())


def test_an_output_the_rule_cannot_decide_is_one_line_naming_its_type_fields_and_the_option():
    model = Returns(lambda logits, features: {"scores": logits, "features": features})
    adapter = zerosiam.adapt(model, "zerosiam", lr=1e-2, predictor_lr=1e-2)
    with pytest.raises(OutputNotLogitsError) as refused:
        adapter(torch.rand(6, 3, 8, 8))
    message = str(refused.value)
    assert "\n" not in message
    assert "dict with fields scores (6×5), features (6×8)" in message
    assert "output='scores'" in message


@pytest.mark.parametrize(
    ("output", "choice", "says"),
    [
        ({"a": torch.zeros(2, 3)}, "b", "output='b' names no field"),
        ((torch.zeros(2, 3), torch.zeros(2)), 5, "output=5 names no field"),
        ({"logits": None, "aux": [1]}, None, "cannot tell which field"),
        ("text", None, "str with fields none"),
    ],
)
def test_a_bad_choice_or_an_output_without_logits_says_why(output, choice, says):
    with pytest.raises(OutputNotLogitsError, match=says):
        logits_of(output, choice)


def test_a_model_output_is_read_by_key_or_position():
    output = transformers.modeling_outputs.ImageClassifierOutput(
        loss=torch.tensor(1.0), logits=torch.ones(2, 3)
    )
    assert logits_of(output) is output.logits  # ``logits`` wins over the loss
    assert logits_of(output, 0) is output.loss and logits_of(output, "logits") is output.logits
