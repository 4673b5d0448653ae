"""ASR as a guard (``zerosiam/parts/asr.py``): when it fires, what it resets, how it pulls, per stream."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import zerosiam
from tests.toys import DEVICES, tiny
from zerosiam.methods import Adapter, available_methods
from zerosiam.parts.asr import A0, M0, P0, R0, R1, WINDOW, AdaptiveSelectiveReset
from zerosiam.parts.guards import guard_named
from zerosiam.parts.losses import entropy


def _batches(steps: int, n: int = 8, streams: int = 1, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(streams * n, 3, 8, 8, generator=generator) for _ in range(steps)]


def _fired(adapter: Adapter) -> list[int]:
    return [row["step"] for row in adapter.history if row["guard"]]


def _asr(lr: float, window: int = 8, streams: int = 1, model: nn.Module | None = None) -> Adapter:
    """Tent wearing ASR, every step of 8 images judged (``window=8``) unless told otherwise."""
    model = model if model is not None else tiny(scale=5.0)
    return zerosiam.adapt(model, "tent", lr=lr, streams=streams, guard=AdaptiveSelectiveReset(window=window))


class Deep(nn.Module):
    """Three conv → GroupNorm stages: six adapted parameters in the model's order (gn1.weight, gn1.bias,
    gn2.weight, ...), so that a reset has room to keep some and put back others."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, 4, 3, padding=1) for c in (3, 4, 4))
        self.norms = nn.ModuleList(nn.GroupNorm(2, 4) for _ in range(3))
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = torch.relu(norm(conv(x)))
        return self.fc(x.flatten(1))


def _deep() -> Deep:
    torch.manual_seed(0)
    return Deep()


def test_asr_is_a_guard_by_name_with_the_papers_constants():
    guard = guard_named("asr")
    assert isinstance(guard, AdaptiveSelectiveReset)
    assert (guard.m0, guard.p0, guard.a0, guard.r0, guard.r1) == (0.15, 5.0, 0.5, 0.5, 20.0)  # conf.py
    assert (M0, P0, A0, R0, R1, WINDOW) == (0.15, 5.0, 0.5, 0.5, 20.0, 64)
    adapter = zerosiam.adapt(tiny(), "tent", lr=0.1, guard="asr")
    assert isinstance(adapter.recipe.guard, AdaptiveSelectiveReset)


def test_it_fires_on_a_collapse_puts_the_source_back_and_records_it():
    adapter = _asr(lr=50.0)  # one step drives the toy to one class: its batches' mean entropy falls to 0
    source = adapter.snapshot()["params"]
    for x in _batches(6):
        adapter(x)
        if adapter.last["guard"]:
            assert all(
                torch.equal(value, source[name]) for name, value in adapter.snapshot()["params"].items()
            )
    fired = [row for row in adapter.history if row["guard"]]
    assert [row["step"] for row in fired] == [1, 3, 5]  # each collapse, put back at once
    for row in fired:
        assert row["guard_entropy"] < 0.01 < row["guard_running"] and row["guard_flips"] > 0.4
        assert row["guard_scope"] == 0.0  # far below the running value: everything back to the source
    quiet = [row for row in adapter.history if not row["guard"]]
    assert all(math.isnan(row["guard_scope"]) for row in quiet)
    assert quiet[0]["guard_running"] == pytest.approx(math.log(A0 * 5))  # the start, log(A0·C)


def test_it_stays_quiet_on_a_calm_stream():
    """At the source weights, on batches that look alike, the running entropy climbs to theirs and never
    passes it (on a noisy stream it does pass some batch now and then: ASR resets often, by design)."""
    adapter = _asr(lr=0.0, window=64)
    x = _batches(1, n=64)[0]
    for _ in range(200):
        adapter(x)
    assert _fired(adapter) == []
    first, last = adapter.history[0], adapter.history[-1]
    assert (
        first["guard_running"] < last["guard_running"] <= last["guard_entropy"] and last["guard_flips"] == 0
    )


@pytest.mark.parametrize(("gap", "kept"), [(0.001, 3), (0.01, 2), (0.02, 1), (0.05, 0)])
def test_a_reset_keeps_the_input_side_share_that_the_entropy_gap_leaves(gap: float, kept: int):
    """scope = R0 − R1·gap = 0.48, 0.3, 0.1, 0: the first 3, 2, 1, 0 of six parameters (i < scope·6) keep
    their adapted values, the output side goes back to the source, and every momentum is cleared."""
    adapter = zerosiam.adapt(_deep(), "tent", lr=1.0)
    source = adapter.snapshot()["params"]
    for x in _batches(2):
        adapter(x)
    adapted = adapter.snapshot()["params"]
    assert not any(torch.equal(adapted[name], value) for name, value in source.items())
    guard = AdaptiveSelectiveReset(window=8)
    calls = torch.tensor([2.0, 0.0, 0.0, 0.0, 0.0]).expand(8, 5)  # its mean's entropy, exactly
    guard.running = entropy(calls[0]).double().view(1) + gap
    assert guard(adapter, _batches(1)[0], calls, [])
    assert float(guard.signals["scope"]) == pytest.approx(max(R0 - R1 * gap, 0.0))
    now = adapter.snapshot()["params"]
    names = list(now)
    assert names == [
        "norms.0.weight",
        "norms.0.bias",
        "norms.1.weight",
        "norms.1.bias",
        "norms.2.weight",
        "norms.2.bias",
    ]
    for i, name in enumerate(names):
        assert torch.equal(now[name], adapted[name] if i < kept else source[name]), name
    momenta = [adapter.optimizer.state[p]["momentum_buffer"] for p in adapter.params.values()]
    assert all(not buffer.any() for buffer in momenta)
    assert float(guard.running) == pytest.approx(math.log(A0 * 5))  # restarted


def test_the_estimates_average_the_steps_since_the_last_reset_and_the_pull_moves_toward_them():
    """At a reset F is the mean squared gradient of the method's loss and θ̄ the mean weights before each
    step since the last reset (the first reset: the estimates themselves); the next step's gradient then
    carries 2·P0·flips²·F·(θ − θ̄), which an SGD step from a fresh momentum turns into that much times
    the learning rate."""
    lr = 5.0  # large enough that one of the 8 calls has left the source's by the fourth step
    adapter = zerosiam.adapt(_deep(), "tent", lr=lr, guard=AdaptiveSelectiveReset(window=8))
    guard = adapter.recipe.guard
    seen: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def record(optimizer, args, kwargs):  # hooked before the guard's own: the loss's gradient alone
        params = list(adapter.params.values())
        seen.append(([p.detach().clone() for p in params], [p.grad.clone() for p in params]))

    adapter.optimizer.register_step_pre_hook(record)
    for step, x in enumerate(_batches(4, seed=2)):
        guard.running = torch.tensor([10.0 if step == 3 else -1.0], dtype=torch.float64)  # fire at the 4th
        adapter(x)
    assert _fired(adapter) == [3] and len(seen) == 4
    for i in range(len(adapter.params)):
        torch.testing.assert_close(guard.fisher[i], torch.stack([g[i] ** 2 for _, g in seen]).mean(0))
        torch.testing.assert_close(guard.anchor[i], torch.stack([w[i] for w, _ in seen]).mean(0))
    flips = adapter.last["guard_flips"]
    assert flips > 0 and float(guard.strength) == pytest.approx(P0 * flips**2)
    before = [p.detach().clone() for p in adapter.params.values()]  # the source: the gap reset them all
    for p in adapter.params.values():
        p.grad = torch.zeros_like(p)  # a loss without gradient: only the pull moves
    adapter.optimizer.step()
    for i, p in enumerate(adapter.params.values()):
        pull = 2 * P0 * flips**2 * guard.fisher[i] * (before[i] - guard.anchor[i])
        torch.testing.assert_close(p.detach(), before[i] - lr * pull)
        assert ((p.detach() - guard.anchor[i]).abs() <= (before[i] - guard.anchor[i]).abs()).all()
    assert any(not torch.equal(p.detach(), b) for p, b in zip(adapter.params.values(), before, strict=True))


def test_reset_puts_the_source_back_exactly_and_runs_the_stream_again_as_a_fresh_adapter():
    adapter, fresh = _asr(lr=2.0), _asr(lr=2.0)
    source = adapter.snapshot()["params"]
    batches = _batches(10, seed=1)
    for x in batches:
        adapter(x)
    assert _fired(adapter) and bool(adapter.recipe.guard.anchored.any())  # it fired and pulled
    adapter.reset()
    assert all(torch.equal(value, source[name]) for name, value in adapter.snapshot()["params"].items())
    assert adapter.recipe.guard.running is None and not adapter.recipe.guard.squares
    again = [adapter(x) for x in batches]
    assert all(torch.equal(a, b) for a, b in zip(again, [fresh(x) for x in batches], strict=True))
    assert _fired(adapter) == _fired(fresh)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [8, 16])  # every step judged; two steps' images gathered
def test_stacked_streams_are_judged_reset_and_pulled_as_lone_ones(window: int, device: str):
    batches = [x.to(device) for x in _batches(16, streams=2, seed=4)]
    alone = [_asr(lr=2.0, window=window, model=tiny(scale=5.0).to(device)) for _ in range(2)]
    stacked = _asr(lr=2.0, window=window, streams=2, model=tiny(scale=5.0).to(device))
    for x in batches:
        expected = torch.cat([adapter(x[8 * s : 8 * (s + 1)]) for s, adapter in enumerate(alone)])
        torch.testing.assert_close(stacked(x), expected, rtol=1e-4, atol=1e-5)
    for s, adapter in enumerate(alone):
        assert [row["guard"] for row in stacked.stream_history(s)] == [
            row["guard"] for row in adapter.history
        ]
        assert _fired(adapter)
    assert bool(stacked.recipe.guard.anchored.all())  # both streams pulled since their first reset


def test_asr_resumes_from_a_checkpoint_as_it_would_have_gone_on():
    adapter, resumed = _asr(lr=2.0, window=16), _asr(lr=2.0, window=16)
    batches = _batches(16, seed=3)
    for x in batches[:7]:  # stopped with a step's images gathered, after a reset
        adapter(x)
    assert adapter.recipe.guard.gathered and bool(adapter.recipe.guard.anchored.any())
    resumed.load_state_dict(copy.deepcopy(adapter.state_dict()))
    for x in batches[7:]:
        assert torch.equal(resumed(x), adapter(x))
    assert _fired(resumed) == _fired(adapter)


def test_a_batch_1_stream_is_judged_on_the_last_64_images():
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.1, guard="asr")
    for x in _batches(130, n=1):
        adapter(x)
    judged = [row["step"] for row in adapter.history if "guard_entropy" in row]
    assert judged == [63, 127]


@pytest.mark.parametrize(
    "method", [m for m, modalities in available_methods().items() if "image" in modalities and m != "noadapt"]
)
def test_every_image_method_wears_it(method: str):
    clean = {"clean_data": _batches(1)} if method.startswith("eata") else {}
    adapter = zerosiam.adapt(tiny(scale=5.0), method, lr=50.0, predictor_lr=0.5, guard="asr", **clean)
    guard = adapter.recipe.guard
    guard.window = 8
    for step, x in enumerate(_batches(4)):
        if step == 1:
            guard.running = torch.tensor([10.0], dtype=torch.float64)  # a reset at the second step
        adapter(x)
    assert 1 in _fired(adapter) and bool(guard.anchored.all())  # then two steps pulled
    assert all(torch.isfinite(p).all() for p in adapter.params.values())
