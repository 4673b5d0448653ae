"""Every method's recipe end to end: filtering, stateful parts, compositions, the registry, timm models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import zerosiam
from tests.toys import Tiny, batch_of, norm_params, tiny
from zerosiam.parts.selection import (
    entropy_below,
)

FILTERING = ["sar", "eata", "eta", "deyo", "come", "eata+zerosiam", "deyo+zerosiam"]


def extras(method: str, size: int = 8) -> dict:
    return {"clean_data": [torch.rand(4, 3, size, size)]} if method.startswith("eata") else {}


@pytest.mark.parametrize("method", FILTERING)
def test_no_update_when_every_sample_is_filtered_out(method):
    model = tiny()
    with torch.no_grad():
        model.fc.weight.zero_()  # uniform predictions: H = ln C, above every threshold
    before = norm_params(model)
    adapter = zerosiam.adapt(model, method, lr=1.0, predictor_lr=1.0, **extras(method))
    for _ in range(2):
        adapter(torch.rand(6, 3, 8, 8))
    assert adapter.last["selected"] == 0 and adapter.last["updated"] is False
    after = norm_params(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    if adapter.predictor is not None:
        assert adapter.predictor.weight.equal(torch.eye(adapter.predictor.weight.shape[0]))


def test_deyo_learns_nothing_from_a_model_blind_to_the_layout():
    class PoolThenLinear(nn.Module):  # sees only the mean colour: shuffling patches changes nothing
        def __init__(self) -> None:
            super().__init__()
            self.gn = nn.GroupNorm(1, 3)
            self.fc = nn.Linear(3, 5)
            with torch.no_grad():
                self.fc.weight.mul_(50)

        def forward(self, x):
            return self.fc(self.gn(x).mean((-2, -1)) + x.mean((-2, -1)))

    model = PoolThenLinear()
    before = norm_params(model)
    x = torch.rand(6, 3, 8, 8)
    with torch.no_grad():
        assert entropy_below(0.5)(batch_of(model(x))).any()  # confident: only the PLPD filter drops them
    adapter = zerosiam.adapt(model, "deyo", lr=1.0)
    adapter(x)
    assert adapter.last["selected"] == 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_stateful_parts_reset_and_checkpoint():
    model = tiny(scale=20.0)
    adapter = zerosiam.adapt(model, "eta", lr=0.1)
    adapter(torch.rand(6, 3, 8, 8))
    rule = adapter.recipe.select[1]
    assert rule.mean is not None
    state = adapter.state_dict()
    adapter.reset()
    assert rule.mean.isnan().all()  # none yet, kept in the same memory (``hostsync.none_yet``)
    adapter.load_state_dict(state)
    assert torch.equal(rule.mean, state["parts"]["select1"]["mean"])


def test_compositions_keep_selection_and_add_the_predictor():
    for name in ("eata+zerosiam", "deyo+zerosiam"):
        recipe = zerosiam.get_recipe(name)
        base = zerosiam.get_recipe(name.removesuffix("+zerosiam"))
        assert recipe.asymmetry is not None and recipe.select == base.select and recipe.weight == base.weight
    adapter = zerosiam.adapt(tiny(scale=20.0), "sar+zerosiam", lr=0.1, predictor_lr=0.1)
    adapter(torch.rand(6, 3, 8, 8))
    assert adapter.predictor is not None and adapter.last["selected"] > 0


def test_available_methods_include_the_baselines():
    assert {
        "noadapt",
        "tent",
        "zerosiam",
        "sar",
        "eata",
        "eta",
        "deyo",
        "come",
        "eata+zerosiam",
        "deyo+zerosiam",
    } <= set(zerosiam.available_methods())


def test_the_registry_says_which_modalities_each_method_supports():
    methods = zerosiam.available_methods()
    assert methods["tent"] == methods["zerosiam"] == methods["sar"] == ("image", "text")
    assert methods["deyo"] == methods["eta"] == methods["deyo+zerosiam"] == ("image",)
    assert methods["tlm"] == ("text",)
    assert zerosiam.get_recipe("tent", "text") is zerosiam.get_recipe("tent", "image")  # one recipe, two uses
    with pytest.raises(ValueError, match="'tlm' supports text only, not image"):
        zerosiam.adapt(Tiny(), "tlm")
    with pytest.raises(ValueError, match="unknown modality 'audio'"):
        zerosiam.get_recipe("tent", "audio")


@pytest.fixture(scope="module")
def timm_models():
    """The two timm families of the paper, random weights, built once; the head is scaled up so that
    predictions are confident enough for the entropy filters to keep samples and updates happen."""
    timm = pytest.importorskip("timm")
    models = {
        "resnet50_gn": timm.create_model("resnet50_gn", pretrained=False, num_classes=100),
        "vit_small": timm.create_model(
            "vit_small_patch16_224", pretrained=False, img_size=32, num_classes=100
        ),
    }
    with torch.no_grad():
        for model in models.values():
            model.get_classifier().weight.mul_(200)
    return models


@pytest.mark.parametrize(
    "method", [m for m, supported in zerosiam.available_methods().items() if "image" in supported]
)
@pytest.mark.parametrize("arch", ["resnet50_gn", "vit_small"])
def test_every_method_runs_on_timm_models(timm_models, arch, method):
    """One step of batch 2 at 32×32, then a prediction from the adapted weights: the real architectures
    at a small input keep this fast on a CPU (neither family has BatchNorm, so a batch of 2 exercises the
    same code paths as 64). Multi-step behaviour (moving averages, EMA, resets) is tested above."""
    model = copy.deepcopy(timm_models[arch])
    x = torch.rand(2, 3, 32, 32)
    adapter = zerosiam.adapt(model, method, batch_size=2, **extras(method, 32))
    out = adapter(x)
    assert out.shape == (2, 100) and torch.isfinite(out).all()
    assert len(adapter.history) == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    if method in ("tent", "zerosiam"):  # no filter: every step updates
        assert all(row["updated"] for row in adapter.history)
