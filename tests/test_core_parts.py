"""Losses, predictors, norm selection and the model split."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.conftest import TinyBN, needs_assets
from zerosiam.parts import losses
from zerosiam.parts.norms import BatchStatistics, NormSelector, is_norm
from zerosiam.parts.predictor import (
    FixedRandomLinear,
    IdentityLinear,
    MLPPredictor,
    build_predictor,
    distance_from_identity,
)
from zerosiam.parts.split import FeatureTap, HeadNotFoundError, find_head

# --- losses ---------------------------------------------------------------------------------------


def test_entropy_of_uniform_is_log_c_and_of_one_hot_is_zero():
    assert losses.entropy(torch.zeros(2, 7)).tolist() == pytest.approx([math.log(7)] * 2)
    assert losses.entropy(torch.tensor([[1e4, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_matches_hand_computation():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    expected = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert losses.entropy(logits).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", sorted(losses.DIVERGENCES))
def test_divergences_vanish_at_equality_and_are_positive_otherwise(name):
    divergence = losses.DIVERGENCES[name]
    a, b = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).unbind(0)[:2]
    a, b = a[None], b[None]
    assert divergence(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert divergence(a, b).item() > 1e-4


def test_symmetric_kl_is_the_sum_of_both_kls_and_js_is_bounded():
    a, b = torch.randn(2, 3, 10).unbind(0)
    assert torch.allclose(losses.symmetric_kl(a, b), losses.kl(a, b) + losses.reverse_kl(a, b), atol=1e-6)
    assert torch.allclose(losses.symmetric_kl(a, b), losses.symmetric_kl(b, a), atol=1e-6)
    far = torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 50.0]])
    assert losses.jensen_shannon(*far).item() == pytest.approx(math.log(2), rel=1e-4)


def test_kl_matches_hand_computation():
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    expected = float((p * (p / q).log()).sum())
    assert losses.kl(p.log()[None], q.log()[None]).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", sorted(losses.OBJECTIVES))
def test_objectives_prefer_confident_predictions(name):
    objective = losses.OBJECTIVES[name]
    confident, unsure = torch.tensor([[6.0, 0.0, 0.0]]), torch.tensor([[0.3, 0.0, 0.0]])
    assert objective(confident).item() < objective(unsure).item()


def test_unknown_loss_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown divergence 'l3'.*skl"):
        losses.resolve(losses.DIVERGENCES, "l3", "divergence")


# --- predictors -----------------------------------------------------------------------------------


def test_identity_predictor_starts_as_identity_and_learns():
    h = IdentityLinear(5)
    z = torch.randn(3, 5)
    assert torch.equal(h(z), z)
    assert h.bias is None and h.weight.requires_grad
    assert distance_from_identity(h) == 0.0


def test_fixed_random_predictor_is_i_plus_small_noise_and_frozen():
    h = FixedRandomLinear(16, scale=0.1, seed=3)
    assert not h.weight.requires_grad
    noise = h.weight - torch.eye(16)
    assert 0.05 < noise.std().item() < 0.15
    assert torch.equal(FixedRandomLinear(16, seed=3).weight, h.weight)


def test_mlp_predictor_is_identity_on_nonnegative_features():
    h = MLPPredictor(6)
    z = torch.rand(4, 6)
    assert torch.allclose(h(z), z)
    assert math.isnan(distance_from_identity(h))
    with pytest.raises(ValueError, match="unknown predictor"):
        build_predictor("transformer", 4)


# --- norms ----------------------------------------------------------------------------------------


def test_norm_selection_finds_every_norm_kind_and_honours_patterns():
    timm_layers = pytest.importorskip("timm.layers")
    model = nn.Sequential(
        nn.BatchNorm2d(3), nn.GroupNorm(1, 3), nn.LayerNorm(3), timm_layers.LayerNorm2d(3),
        nn.RMSNorm(3), timm_layers.RmsNorm(3), nn.BatchNorm1d(3), nn.Linear(3, 3),
    )  # fmt: skip
    assert [n for n, m in model.named_modules() if is_norm(m)] == ["0", "1", "2", "3", "4", "5", "6"]
    names = [n for n, _ in NormSelector().parameters(model)]
    assert "7.weight" not in names and "0.weight" in names and "4.weight" in names and "5.weight" in names
    subset = [n for n, _ in NormSelector(include=[r"^[0-3]$"], exclude=[r"^2$"]).parameters(model)]
    assert subset == ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]


def test_batch_statistics_never_touch_running_stats_and_refuse_one_sample(tiny_bn: TinyBN):
    before = {k: v.clone() for k, v in tiny_bn.state_dict().items()}
    stats = BatchStatistics(tiny_bn)
    out = tiny_bn(torch.rand(4, 3, 8, 8) * 3)
    assert out.shape == (4, 5)
    for key, value in tiny_bn.state_dict().items():
        assert torch.equal(value, before[key]), key
    with pytest.raises(ValueError, match="batch size 1 with BatchNorm"):
        stats.check_batch(1)
    stats.restore()
    assert not tiny_bn.bn.training and tiny_bn.bn.track_running_stats


# --- the split ------------------------------------------------------------------------------------

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
