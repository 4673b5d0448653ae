"""The baselines' parts (selection, weights, SAM, recovery, Fisher, COME) and their recipes end to end."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import zerosiam
from zerosiam.methods.recipe import Batch, Evaluation
from zerosiam.methods.sar import EmaBelow, WithoutLastStage
from zerosiam.methods.tent import tent
from zerosiam.parts.come import come_entropy
from zerosiam.parts.fisher import MissingCleanDataError, estimate_fisher, fisher
from zerosiam.parts.losses import OBJECTIVES, entropy
from zerosiam.parts.sam import sam
from zerosiam.parts.selection import (
    deyo_weight,
    entropy_below,
    exp_margin,
    not_redundant,
    plpd,
    plpd_above,
    shuffle_patches,
)
from zerosiam.zoo.cifar_resnet import CifarResNet

torch.manual_seed(0)


class Tiny(nn.Module):
    """conv → GroupNorm → flatten → linear: position-sensitive (for PLPD) and fast."""

    def __init__(self, classes: int = 5, size: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * size * size, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.gn(self.conv(x))).flatten(1))


def tiny(scale: float = 1.0, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny()
    with torch.no_grad():
        model.fc.weight.mul_(scale)
    return model


def batch_of(logits: torch.Tensor, **fields) -> Batch:
    fields.setdefault("adapter", None)
    return Batch(
        x=torch.zeros(len(logits), 3, 4, 4), logits=logits, target=logits, entropy=entropy(logits), **fields
    )


def norm_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- selection and weights -------------------------------------------------------------------------


def test_entropy_below_keeps_confident_samples_only():
    logits = torch.tensor([[10.0, 0, 0, 0], [0.0, 0, 0, 0], [2.0, 0, 0, 0]])
    # H = 0.0014, ln 4 = 1.386, 0.9 nats; threshold 0.4·ln 4 = 0.5545 keeps only the first
    assert entropy_below(0.4)(batch_of(logits)).tolist() == [True, False, False]
    # 0.7·ln 4 = 0.970 also keeps the third
    assert entropy_below(0.7)(batch_of(logits)).tolist() == [True, False, True]


def test_not_redundant_follows_the_moving_average_of_kept_predictions():
    rule = not_redundant(0.05)
    seen = torch.tensor([[0.0, 0, 0, 20], [0.0, 0, 0, 20]])
    batch = batch_of(seen)
    assert rule(batch).all()  # no average yet: keep all
    rule.observe(batch, torch.tensor([True, False]))
    assert torch.allclose(rule.mean, seen[0].softmax(-1))
    new = torch.tensor([[20.0, 0, 0, 0], [0.0, 0, 0, 20]])  # orthogonal to m, then the same as m
    assert rule(batch_of(new)).tolist() == [True, False]
    rule.observe(batch_of(new), torch.tensor([True, False]))
    expected = 0.9 * seen[0].softmax(-1) + 0.1 * new[0].softmax(-1)
    assert torch.allclose(rule.mean, expected)
    rule.observe(batch_of(new), torch.tensor([False, False]))  # nothing kept: unchanged
    assert torch.allclose(rule.mean, expected)
    rule.reset()
    assert rule.mean is None


def test_eata_weight_is_exp_of_margin_minus_entropy():
    logits = torch.tensor([[0.0, 0, 0, 0], [3.0, 0, 0, 0]])
    weights = exp_margin(0.4)(batch_of(logits))
    h = entropy(logits)
    assert torch.allclose(weights, torch.exp(0.4 * math.log(4) - h))
    assert weights[0] == pytest.approx(4**-0.6, rel=1e-5)  # uniform: exp(0.4 ln 4 − ln 4)


def test_deyo_weight_adds_confidence_and_plpd_terms():
    logits = torch.tensor([[0.0, 0, 0, 0], [3.0, 0, 0, 0]])
    batch = batch_of(logits, cache={"plpd": torch.tensor([0.5, float("nan")])})
    weights = deyo_weight(0.4)(batch)
    h = entropy(logits)
    assert weights[0] == pytest.approx(
        float(torch.exp(-(h[0] - 0.4 * math.log(4))) + math.exp(0.5)), rel=1e-5
    )
    # a sample without PLPD gets a finite weight (the entropy term only)
    assert weights[1] == pytest.approx(float(torch.exp(-(h[1] - 0.4 * math.log(4)))), rel=1e-5)


def test_shuffle_patches_moves_whole_patches_by_the_permutation():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float).view(2, 1, 4, 4)
    permutation = torch.stack([torch.arange(16).flip(0), torch.arange(16)])
    out = shuffle_patches(x, grid=4, permutation=permutation)  # 1-pixel patches: pixel i takes pixel perm[i]
    assert torch.equal(out[0].flatten(), x[0].flatten()[permutation[0]])
    assert torch.equal(out[1], x[1])
    y = torch.arange(8 * 8, dtype=torch.float).view(1, 1, 8, 8)
    swapped = shuffle_patches(y, 4, torch.tensor([[1, 0] + list(range(2, 16))]))
    assert torch.equal(swapped[0, 0, :2, :2], y[0, 0, :2, 2:4]) and torch.equal(
        swapped[0, 0, :2, 2:4], y[0, 0, :2, :2]
    )
    assert shuffle_patches(torch.rand(3, 3, 6, 6)).shape == (3, 3, 6, 6)  # resized to 4×4 and back


def test_plpd_with_a_fixed_permutation_and_only_on_kept_samples():
    model = tiny(scale=5.0)
    x = torch.rand(3, 3, 8, 8)
    permutation = torch.stack([torch.randperm(16) for _ in range(3)])
    sizes = []
    model.register_forward_hook(lambda m, i, o: sizes.append(i[0].shape[0]))
    with torch.no_grad():
        logits = model(x)
    sizes.clear()
    kept = torch.tensor([True, False, True])
    batch = batch_of(logits, adapter=SimpleNamespace(model=model), kept=kept)
    batch.x = x
    values = plpd(batch, permutation=permutation)
    assert sizes == [2]  # the second view was forwarded for the kept samples only
    with torch.no_grad():
        p, p_shuffled = logits.softmax(-1), model(shuffle_patches(x, 4, permutation)).softmax(-1)
    label = p.argmax(-1)
    expected = p[torch.arange(3), label] - p_shuffled[torch.arange(3), label]
    assert torch.allclose(values[kept], expected[kept], atol=1e-6)
    assert torch.isnan(values[1])
    assert plpd_above(0.2)(batch).tolist() == (expected > 0.2).logical_and(kept).tolist()


# --- SAM -------------------------------------------------------------------------------------------


def test_sam_step_equals_a_manual_two_pass_computation():
    model, lr, rho = tiny(scale=3.0), 0.1, 0.05
    reference = copy.deepcopy(model)
    x = torch.rand(6, 3, 8, 8)
    adapter = zerosiam.adapt(model, tent.with_(name="tent-sam", step=sam(rho)), lr=lr)
    adapter(x)

    params = [reference.gn.weight, reference.gn.bias]
    entropy(reference(x)).mean().backward()
    grads = [p.grad.clone() for p in params]
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.add_(rho * g / norm)
            p.grad = None
    entropy(reference(x)).mean().backward()
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(rho * g / norm)
            p.sub_(lr * p.grad)  # SGD's first step with momentum: the buffer is the gradient itself
    assert torch.allclose(model.gn.weight, reference.gn.weight, atol=1e-6)
    assert torch.allclose(model.gn.bias, reference.gn.bias, atol=1e-6)
    assert not torch.allclose(model.gn.weight, tiny(scale=3.0).gn.weight)


def test_sam_second_pass_is_restricted_to_the_first_selection():
    calls = []
    first_mask = torch.tensor([True, False, True])

    def closure(restrict=None):
        calls.append(restrict)
        loss = (adapter.trainable[0] ** 2).sum()
        mask = first_mask if restrict is None else restrict & torch.tensor([True, True, False])
        return Evaluation(loss, mask, None, {})

    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def backward(loss):
        optimizer.zero_grad()
        loss.backward()
        return True

    adapter = SimpleNamespace(trainable=[weight], optimizer=optimizer, _skipped=None, backward=backward)
    evaluations = sam(0.05)(adapter, closure)
    assert calls[0] is None and torch.equal(calls[1], first_mask)
    assert evaluations[1].selected == 1


# --- SAR -------------------------------------------------------------------------------------------


def evaluation(value: float, selected: bool = True) -> Evaluation:
    mask = torch.tensor([selected])
    return Evaluation(torch.tensor(value), mask, None, {"objective": value if selected else math.nan})


def test_ema_recovery_fires_below_the_floor_and_only_then():
    recovery = EmaBelow(0.2)
    assert recovery([evaluation(1.0), evaluation(0.5)]) is False and recovery.ema == 0.5
    fired = []
    for _ in range(20):
        before = recovery.ema
        fired.append(recovery([evaluation(1.0), evaluation(0.0)]))
        if not fired[-1]:
            assert recovery.ema == pytest.approx(0.9 * before)
        else:
            assert 0.9 * before < 0.2 <= before and recovery.ema is None
            break
    assert fired[-1] and not any(fired[:-1])  # 0.5·0.9^k first below 0.2 at k = 9
    assert len(fired) == 9
    recovery.ema = 0.3
    assert recovery([evaluation(1.0), evaluation(0.0, selected=False)]) is False and recovery.ema == 0.3


def test_sar_resets_the_model_when_its_ema_falls_below_the_floor():
    model = tiny(scale=20.0)
    source = norm_params(model)
    adapter = zerosiam.adapt(model, "sar", lr=0.5)
    x = torch.rand(8, 3, 8, 8)
    adapter.recipe.recover.ema = 10.0  # far above the floor: adapts and keeps the adapted weights
    adapter(x)
    assert adapter.last["selected"] > 0 and not adapter.last["recovered"]
    assert not torch.equal(model.gn.weight, source["gn.weight"])
    adapter.recipe.recover.ema = 0.0  # collapsed: 0.9·0 + 0.1·L2 < 0.2 → reset
    adapter(x)
    assert adapter.last["recovered"] and adapter.recipe.recover.ema is None
    assert torch.equal(model.gn.weight, source["gn.weight"]) and torch.equal(model.gn.bias, source["gn.bias"])


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


# --- COME ------------------------------------------------------------------------------------------


def test_come_entropy_is_bounded_by_log_of_classes_plus_one():
    for scale in (0.0, 1.0, 30.0, 1e4):
        logits = torch.randn(64, 10) * scale
        values = come_entropy(logits)
        assert torch.isfinite(values).all()
        assert (values <= math.log(11) + 1e-6).all() and (values >= -1e-6).all()  # 1e-7 in the log: ≈ 0
    # zero logits, K = C = 10: S = 10 + 10, beliefs 1/20 each and uncertainty 1/2
    by_hand = -(10 * 0.05 * math.log(0.05) + 0.5 * math.log(0.5))
    assert come_entropy(torch.zeros(1, 10)).item() == pytest.approx(by_hand, abs=1e-5)
    # K = 1 makes the same opinion uniform over the C + 1 values: the bound itself
    assert come_entropy(torch.zeros(1, 10), uncertainty_mass=1).item() == pytest.approx(
        math.log(11), abs=1e-5
    )
    assert OBJECTIVES["come"] is come_entropy


def test_come_passes_no_gradient_through_the_logit_norm():
    logits = (torch.randn(8, 10) * 3).requires_grad_(True)
    come_entropy(logits).sum().backward()
    radial = (logits.grad * logits.detach()).sum(-1)  # the gradient's component along u changes ‖u‖
    assert torch.allclose(radial, torch.zeros(8), atol=1e-5)
    plain = logits.detach().clone().requires_grad_(True)
    entropy(plain).sum().backward()
    assert (plain.grad * plain.detach()).sum(-1).abs().max() > 1e-3  # softmax entropy does change it


# --- EATA's Fisher ---------------------------------------------------------------------------------


def test_fisher_is_the_mean_squared_gradient_of_self_labelled_cross_entropy():
    model = tiny(scale=3.0)
    params = {"gn.weight": model.gn.weight, "gn.bias": model.gn.bias}
    batches = [torch.rand(4, 3, 8, 8), (torch.rand(4, 3, 8, 8), torch.zeros(4))]
    fisher = estimate_fisher(model, params, batches)
    expected = torch.zeros_like(model.gn.weight)
    for x in (batches[0], batches[1][0]):
        logits = model(x)
        (grad,) = torch.autograd.grad(
            nn.functional.cross_entropy(logits, logits.argmax(-1)), [model.gn.weight]
        )
        expected += grad.pow(2) / 2
    assert torch.allclose(fisher["gn.weight"], expected, atol=1e-8)


def test_fisher_term_is_zero_at_the_source_and_grows_away_from_it():
    model = tiny(scale=3.0)
    adapter = zerosiam.adapt(model, "eata", clean_data=[torch.rand(4, 3, 8, 8) for _ in range(3)], lr=0.1)
    regularizer = adapter.recipe.regularizer
    assert regularizer(adapter).item() == 0.0
    distances = []
    for delta in (0.01, 0.1):
        with torch.no_grad():
            model.gn.weight.copy_(regularizer.anchor["gn.weight"] + delta)
        distances.append(regularizer(adapter).item())
        manual = 2000.0 * (regularizer.fisher["gn.weight"] * delta**2).sum().item()
        assert distances[-1] == pytest.approx(manual, rel=1e-4)
    assert 0 < distances[0] < distances[1]


def test_eata_without_clean_data_is_a_clear_error():
    with pytest.raises(MissingCleanDataError, match="clean_data"):
        zerosiam.adapt(tiny(), "eata", lr=0.1)
    with pytest.raises(TypeError, match="unknown option"):
        zerosiam.adapt(tiny(), "tent", clean_data=[torch.rand(2, 3, 8, 8)], lr=0.1)
    zerosiam.adapt(tiny(), "eta", lr=0.1)  # ETA has no Fisher: no clean data needed
    # a recipe given the regularizer by override also takes the clean data
    adapter = zerosiam.adapt(
        tiny(), "tent", regularizer=fisher(), clean_data=[torch.rand(2, 3, 8, 8)], lr=0.1
    )
    assert adapter.recipe.regularizer.fisher


# --- whole methods ---------------------------------------------------------------------------------

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
    assert rule.mean is None
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


@pytest.mark.parametrize("method", zerosiam.available_methods())
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
