"""Which parameters move: norm selection, BatchNorm on batch statistics, SAR's subset."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import TinyBN
from zerosiam.parts.norms import BatchStatistics, NormSelector, WithoutLastStage, is_norm
from zerosiam.zoo.cifar_resnet import CifarResNet


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


def test_sar_parameter_subset_leaves_out_the_last_stage_and_final_norm():
    timm = pytest.importorskip("timm")
    resnet = [n for n, _ in WithoutLastStage().parameters(timm.create_model("resnet50_gn", pretrained=False))]
    assert resnet and not any(n.startswith("layer4.") for n in resnet)
    assert any(n.startswith("layer3.") for n in resnet) and "bn1.weight" in resnet
    vit_model = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32)
    vit = [n for n, _ in WithoutLastStage().parameters(vit_model)]
    assert not any(n.startswith(("blocks.9.", "blocks.10.", "blocks.11.")) for n in vit)
    assert "norm.weight" not in vit and "blocks.8.norm1.weight" in vit
    cifar = [n for n, _ in WithoutLastStage().parameters(CifarResNet(20))]
    assert (
        cifar
        and not any(n.startswith("layer3.") for n in cifar)
        and any(n.startswith("layer2.") for n in cifar)
    )
