"""Selection rules and sample weights: entropy thresholds, EATA's redundancy filter and weight, DeYO's
patch shuffle, PLPD and weight."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.toys import batch_of, tiny
from zerosiam.parts.losses import entropy
from zerosiam.parts.selection import (
    deyo_weight,
    entropy_below,
    exp_margin,
    not_redundant,
    plpd,
    plpd_above,
    redundancy_epsilon,
    shuffle_patches,
)


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
    rule.reset()  # none yet: NaN in the same memory, read as no average
    assert rule.mean.isnan().all() and rule(batch_of(new)).all()
    rule.observe(batch_of(new), torch.tensor([True, False]))  # the first kept mean starts it again
    assert torch.allclose(rule.mean, new[0].softmax(-1))


def test_redundancy_epsilon_depends_on_the_class_count():
    """With ε = 0.05 no 10-class sample could pass once the moving average exists: a confident
    prediction's cosine to a balanced mean is 1/√10 ≈ 0.32. The default takes ε from C."""
    assert redundancy_epsilon(1000) == 0.05
    assert redundancy_epsilon(10) == 0.4
    balanced = torch.zeros(10, 10).fill_diagonal_(20.0)  # one confident sample per class
    by_class_count, imagenet_value = not_redundant(), not_redundant(0.05)
    for rule in (by_class_count, imagenet_value):
        rule.observe(batch_of(balanced), torch.ones(10, dtype=torch.bool))
    assert by_class_count(batch_of(balanced)).all()  # |cos| ≈ 0.32 < 0.4
    assert not imagenet_value(batch_of(balanced)).any()  # 0.32 ≥ 0.05: EATA would never update


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
    batch = batch_of(logits, learner=SimpleNamespace(model=model), kept=kept)
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


def test_patch_orders_are_drawn_from_the_cpu_generator_on_any_device():
    """A GPU's generator draws other numbers from one seed than the CPU's: drawn there, DeYO's patch
    orders (and so a run's number) would depend on the device. Shuffling images on another device (the
    meta device stands in for a GPU here) must draw from the CPU's generator, as a CPU run does."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    shuffle_patches(torch.empty(2, 3, 8, 8, device="meta"))
    assert not torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(0)
    expected = torch.rand(2, 16).argsort(-1)
    torch.manual_seed(0)
    x = torch.arange(2 * 16, dtype=torch.float32).reshape(2, 1, 4, 4)
    assert torch.equal(shuffle_patches(x), shuffle_patches(x, permutation=expected))
