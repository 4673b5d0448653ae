"""The model split: the head found or named, the feature tapped in the model's own pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import TinyBN, needs_assets
from zerosiam.parts.split import FeatureTap, HeadNotFoundError, find_head

TIMM_MODELS = {
    "resnet50_gn": "fc",
    "vit_small_patch16_224": "head",
    "convnext_tiny": "head.fc",
    "swin_tiny_patch4_window7_224": "head.fc",
    "efficientnet_b0": "classifier",
}


def _check_split(model: nn.Module, x: torch.Tensor, head_name: str | None = None) -> FeatureTap:
    """The captured feature through the head reproduces the model's output from a single pass."""
    tap = FeatureTap(model.eval())
    with torch.no_grad():
        output, feature = tap.forward(x)
        assert torch.allclose(tap.head_of(feature), output, atol=1e-5)
    if head_name is not None:
        assert tap.head is model.get_submodule(head_name)
    assert feature.shape[-1] == tap.feature_dim
    return tap


@pytest.mark.parametrize("name", sorted(TIMM_MODELS))
def test_split_on_timm_families(name):
    timm = pytest.importorskip("timm")
    model = timm.create_model(name, pretrained=False, num_classes=10)
    _check_split(model, torch.rand(1, 3, 224, 224), TIMM_MODELS[name])


def test_split_on_torchvision_style_models():
    models = pytest.importorskip("torchvision.models")
    _check_split(models.resnet18(num_classes=7), torch.rand(2, 3, 64, 64), "fc")
    _check_split(models.mobilenet_v3_small(num_classes=7), torch.rand(2, 3, 64, 64), "classifier.3")
    vit = models.VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=16, num_classes=7)
    _check_split(vit, torch.rand(2, 3, 32, 32), "heads.head")


def test_split_finds_an_unnamed_head_from_the_forward(tiny_bn: TinyBN):
    tap = FeatureTap(tiny_bn)
    assert tap.head is None
    _check_split(tiny_bn, torch.rand(2, 3, 8, 8), "scorer")


def test_split_named_explicitly_and_errors_that_say_how_to_name_the_head(tiny_bn: TinyBN):
    assert find_head(tiny_bn, "scorer") is tiny_bn.scorer
    with pytest.raises(HeadNotFoundError, match="head='fc'"):
        find_head(tiny_bn, "nope")
    with pytest.raises(HeadNotFoundError, match="no linear layer"):
        FeatureTap(nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten()))

    class Scaled(nn.Module):  # something runs after the classifier: the split would be wrong
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) / 2.0

    with pytest.raises(HeadNotFoundError, match="not the model's output"):
        FeatureTap(Scaled()).forward(torch.rand(2, 4))


@needs_assets()
def test_split_on_the_real_cifar_resnet_checkpoint():
    import zerosiam

    model = zerosiam.load_model("resnet20")
    tap = _check_split(model, torch.rand(4, 3, 32, 32))
    assert tap.head is model.model.linear and tap.feature_dim == 64
