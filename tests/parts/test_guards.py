"""Guards: each fires when it should, puts back what it says, records it, and stacks as lone streams."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

import zerosiam
from tests.toys import norm_params, tiny
from zerosiam.bench.runner import RunSpec
from zerosiam.methods import Adapter, Frozen
from zerosiam.parts.guards import (
    GUARDS,
    OnRecovery,
    Periodic,
    SourceProbe,
    Watch,
    auto_watched,
    guard_named,
    guard_settings,
    never_acts,
    sar_replayed,
    triggers_by_bar,
)
from zerosiam.parts.layout import layout_for
from zerosiam.parts.recovery import ema_below

FIRST_SETTINGS = {"relative": False, "escalate": False}  # auto as first built: a fixed bar, snapshots only


def _batches(steps: int, n: int = 8, streams: int = 1, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(streams * n, 3, 8, 8, generator=generator) for _ in range(steps)]


def _fired(adapter) -> list[int]:
    return [row["step"] for row in adapter.history if row["guard"]]


def test_rdumb_puts_the_source_back_every_n_steps_and_says_so():
    model = tiny(scale=5.0)
    source = norm_params(model)
    adapter = zerosiam.adapt(model, "tent", lr=0.5, guard=Periodic(every=3))
    for x in _batches(7):
        adapter(x)
        if adapter.steps % 3 == 0:
            assert torch.equal(model.gn.weight, source["gn.weight"])
    assert _fired(adapter) == [2, 5] and not torch.equal(model.gn.weight, source["gn.weight"])


def test_the_sar_guard_resets_any_method_when_its_average_falls():
    model = tiny(scale=20.0)
    source = norm_params(model)
    adapter = zerosiam.adapt(model, "tent", lr=0.5, guard=OnRecovery(ema_below(10.0)))  # always below
    adapter(_batches(1)[0])
    assert adapter.last["guard"] and torch.equal(model.gn.weight, source["gn.weight"])
    quiet = zerosiam.adapt(tiny(), "tent", lr=0.5, guard="sar")  # the paper's floor, 0.2: not reached
    quiet(_batches(1)[0])
    assert quiet.last["guard"] is False


def test_the_probe_guard_rolls_a_collapsing_stream_back_and_leaves_a_healthy_one():
    def probe() -> SourceProbe:
        return SourceProbe(every=2, min_agreement=0.9, ring=2, probe_images=8)  # 8-row batches

    collapsing = zerosiam.adapt(tiny(scale=5.0), "tent", lr=500.0, guard=probe())  # agreement ≈ 0.4
    steady = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.0, guard=probe())
    for x in _batches(12):
        collapsing(x)
        steady(x)
    assert _fired(collapsing) and not _fired(steady)  # lr 0: the adapted model is the source
    counted = triggers_by_bar(collapsing.history)
    assert len(_fired(collapsing)) <= sum(counted.values()) <= 2 * len(_fired(collapsing))
    assert triggers_by_bar(steady.history) == dict.fromkeys(counted, 0)
    step = _fired(collapsing)[0]
    assert step % 2 == 1  # only at probes (every second step)


def test_a_probe_puts_a_warm_up_collapse_back_to_the_source_and_a_later_one_to_its_oldest_snapshot():
    probe = SourceProbe(
        every=2, min_agreement=0.9, ring=2, warmup=8, warmup_every=2, probe_images=8, **FIRST_SETTINGS
    )
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=1.0, guard=probe)  # fires at step 6, 14 and 16
    guard = adapter.recipe.guard  # the adapter's own copy
    source = adapter.snapshot()
    seen = {"warm-up": 0, "later": 0}
    for x in _batches(16):
        oldest = copy.deepcopy(guard.snapshots[0]) if guard.snapshots else None
        adapter(x)
        if not adapter.last["guard"]:
            continue
        expected, when = (source, "warm-up") if adapter.steps <= 8 else (oldest, "later")
        seen[when] += 1
        assert all(torch.equal(v, expected["params"][k]) for k, v in adapter.snapshot()["params"].items())
    assert seen == {"warm-up": 1, "later": 2}
    assert not all(torch.equal(v, source["params"][k]) for k, v in oldest["params"].items())


def test_with_escalate_a_stream_unhealthy_again_right_after_a_roll_back_goes_back_to_the_source():
    probe = SourceProbe(
        every=2, min_agreement=0.9, ring=2, warmup=8, warmup_every=2, probe_images=8, relative=False
    )  # escalate, the default
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=1.0, guard=probe)  # fires at 6, 14 and 16
    guard = adapter.recipe.guard
    source = adapter.snapshot()["params"]
    put_back = {}
    for x in _batches(16):
        oldest = copy.deepcopy(guard.snapshots[0]["params"]) if guard.snapshots else None
        adapter(x)
        if adapter.last["guard"]:
            now = adapter.snapshot()["params"]
            kinds = (("source", source), ("snapshot", oldest))
            put_back[adapter.steps] = [name for name, weights in kinds if weights and _same(weights, now)]
    assert put_back == {6: ["source"], 14: ["snapshot"], 16: ["source"]}


def _same(weights: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, other[name]) for name, value in weights.items())


class _Labelled:
    """A learner whose source calls each image by the class written in its first pixel; it counts what a
    guard asks of it."""

    layout = layout_for(1)

    def __init__(self) -> None:
        self.probed: list[int] = []  # the images of each source prediction
        self.put_back = 0

    def source_prediction(self, x: torch.Tensor) -> torch.Tensor:
        self.probed.append(len(x))
        return _calls(x[:, 0, 0, 0].long())

    def snapshot(self) -> dict:
        return {"params": {}, "predictor": {}}

    def roll_back(self, snapshot: dict, streams: torch.Tensor) -> None:
        self.put_back += 1

    def restore_source(self, streams: torch.Tensor | None = None) -> None:
        self.put_back += 1

    def shrink(self, streams: torch.Tensor, factor: float) -> None:
        pass

    def full_step(self, streams: torch.Tensor) -> None:
        self.given_back = getattr(self, "given_back", 0) + 1


def _calls(classes: torch.Tensor, sureness: float = 1.0) -> torch.Tensor:
    return torch.nn.functional.one_hot(classes, 10).float() * sureness


class _Unsure(_Labelled):
    """A source that calls each image as ``_Labelled``'s does, with a top probability of 0.6."""

    def source_prediction(self, x: torch.Tensor) -> torch.Tensor:
        return _calls(x[:, 0, 0, 0].long(), sureness=math.log(13.5))  # e^s / (e^s + 9) = 0.6


def test_with_relative_the_agreement_bar_scales_with_the_sources_confidence():
    def fired(probe: SourceProbe, agreeing: int) -> int:
        """Put-backs over 64 steps of 16 images that the adapted model calls as the source on the first
        ``agreeing`` rows and as the next class on the others (the spread stays the source's)."""
        learner = _Unsure()
        labels = torch.arange(16) % 10
        called = torch.where(torch.arange(16) < agreeing, labels, (labels + 1) % 10)
        for _ in range(64):
            probe(learner, labels.float().view(16, 1, 1, 1).expand(16, 3, 4, 4), _calls(called), [])
        return learner.put_back

    assert fired(SourceProbe(relative=False), agreeing=11) > 0  # 0.69 of the source's calls: under 0.85
    assert fired(SourceProbe(), agreeing=11) == 0  # relative, the default: over 0.85 × 0.6 = 0.51
    assert fired(SourceProbe(), agreeing=6) > 0  # 0.38: a model leaving the source's calls


def test_with_max_widening_a_parting_toward_more_spread_calls_is_excused_and_a_collapse_is_not():
    def fired(probe: SourceProbe, called: torch.Tensor, labels: torch.Tensor) -> int:
        """Put-backs over 64 steps of 16 images that the source calls as ``labels`` (sure at 0.6, a bar of
        0.51) and the adapted model as ``called``."""
        learner, x = _Unsure(), labels.float().view(16, 1, 1, 1).expand(16, 3, 4, 4)
        for _ in range(64):
            probe(learner, x, _calls(called), [])
        return learner.put_back

    crowded = torch.arange(16) % 3  # a source that calls three classes only
    spread = torch.arange(16) % 10  # an adapted model that takes them apart over ten: 5 of 16 agree
    assert fired(SourceProbe(), spread, crowded) > 0  # auto: under the agreement bar
    assert fired(SourceProbe(max_widening=0.05), spread, crowded) == 0  # 1.0 nats wider: excused
    shifted = (spread + 1) % 10  # 0 of 16 agree, as spread as the source: not excused
    assert fired(SourceProbe(max_widening=0.05), shifted, spread) > 0
    collapsed = torch.full((16,), 4)  # one class: the narrowing bar, whatever the widening
    assert fired(SourceProbe(max_widening=0.05), collapsed, crowded) > 0


def test_a_probe_records_which_bar_each_trigger_crossed():
    def crossed(called: torch.Tensor) -> dict[str, bool]:
        """The first probe's (step 4, a warm-up probe) causes, the adapted model calling 16 images of
        classes 0-9, 0-5 as ``called`` and the source calling them right, sure at 0.6 (a bar of 0.51)."""
        probe, labels = SourceProbe(), torch.arange(16) % 10
        x = labels.float().view(16, 1, 1, 1).expand(16, 3, 4, 4)
        for _ in range(4):
            fired = probe(_Unsure(), x, _calls(called), [])
        causes = {name: bool(probe.signals[name]) for name in ("below_agreement", "narrowed")}
        assert bool(fired) == any(causes.values())
        return causes

    labels = torch.arange(16) % 10
    narrower = torch.where(labels == 9, 8, labels)  # 15 of 16 agree, nine classes called of ten: 0.09 nats
    assert crossed(narrower) == {"below_agreement": False, "narrowed": True}
    shifted = torch.where(torch.arange(16) < 6, labels, (labels + 1) % 10)  # 6 of 16 agree: 0.38
    assert crossed(shifted)["below_agreement"]
    assert crossed(labels) == {"below_agreement": False, "narrowed": False}


def test_at_batch_1_a_probe_judges_16_images_gathered_since_the_last_so_one_disagreement_is_not_a_collapse():
    def run(probe: SourceProbe) -> _Labelled:
        learner = _Labelled()
        for step in range(1, 300):
            label = step % 10
            x = torch.full((1, 3, 4, 4), float(label))
            called = (label + 1) % 10 if step == 16 else label  # one image of 299 called otherwise
            probe(learner, x, _calls(torch.tensor([called])), [])
        return learner

    every_image = run(SourceProbe())
    assert every_image.put_back == 0 and every_image.probed == [16] * 18  # steps 16, 32, …, 288
    sampled = run(SourceProbe(sample=8))  # one step in 8: steps 8, …, 128 make a probe, 136 … 256 the next
    assert sampled.put_back == 0 and sampled.probed == [16, 16]
    alone = run(SourceProbe(probe_images=1, relative=False))  # one image a probe: the old reading of batch 1
    assert alone.put_back == 1 and alone.probed == [1] * 24  # steps 4-32 every 4, then 48-288 every 16


def test_a_probe_of_gathered_images_resumes_from_a_checkpoint_as_it_would_have_gone_on():
    def make() -> Adapter:
        probe = SourceProbe(every=4, min_agreement=0.9, probe_images=4, sample=2)
        return zerosiam.adapt(tiny(scale=5.0), "tent", lr=2.0, guard=probe)

    singles = [x[:1] for x in _batches(40, seed=3)]
    adapter, resumed = make(), make()
    for x in singles[:19]:  # stopped with images gathered
        adapter(x)
    assert adapter.recipe.guard.gathered
    resumed.load_state_dict(copy.deepcopy(adapter.state_dict()))
    for x in singles[19:]:
        torch.testing.assert_close(resumed(x), adapter(x))
    assert _fired(resumed) == _fired(adapter) and _fired(adapter)


def test_a_probe_measures_agreement_with_the_source_on_the_same_images():
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.0)
    x = _batches(1)[0]
    assert torch.equal(adapter.source_prediction(x).argmax(-1), adapter.predict(x).argmax(-1))
    before = norm_params(adapter.model)
    adapter.source_prediction(x)
    assert all(torch.equal(before[k], v) for k, v in norm_params(adapter.model).items())  # put back


def test_a_probe_predicts_with_the_source_weights_and_puts_the_adapted_ones_back_exactly():
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=1.0)
    x = _batches(1, seed=1)[0]
    at_source = adapter.predict(x)
    for batch in _batches(3):
        adapter(batch)
    adapted = norm_params(adapter.model)
    assert not torch.equal(adapter.predict(x), at_source)  # the weights moved
    torch.testing.assert_close(adapter.source_prediction(x), at_source, rtol=0, atol=1e-6)
    assert all(torch.equal(adapted[k], v) for k, v in norm_params(adapter.model).items())


def test_a_roll_back_restores_the_snapshot_of_the_flagged_streams_only():
    adapter = zerosiam.adapt(tiny(scale=5.0), "zerosiam", lr=0.5, predictor_lr=0.5, streams=2)
    batches = _batches(3, streams=2)
    adapter(batches[0])
    kept = adapter.snapshot()
    adapter(batches[1])
    moved = adapter.snapshot()
    adapter.roll_back(kept, torch.tensor([True, False]))
    now = adapter.snapshot()
    for part in ("params", "predictor"):
        for name, value in now[part].items():
            assert torch.equal(value[0], kept[part][name][0]) and torch.equal(value[1], moved[part][name][1])


@pytest.mark.parametrize("guard", ["rdumb", "sar", "auto"])
def test_stacked_streams_are_guarded_as_lone_ones(guard):
    guards = {  # each made to fire within ten steps of this toy
        "rdumb": lambda: Periodic(every=3),
        "sar": lambda: OnRecovery(ema_below(0.9)),
        "auto": lambda: SourceProbe(every=2, min_agreement=0.8),  # 8-row steps: two gathered a probe
    }

    def make(streams: int) -> Adapter:
        return zerosiam.adapt(tiny(scale=5.0), "tent", lr=2.0, streams=streams, guard=guards[guard]())

    batches = _batches(10, streams=3, seed=4)
    alone = [make(1) for _ in range(3)]
    stacked = make(3)
    for x in batches:
        expected = torch.cat([adapter(x[8 * s : 8 * (s + 1)]) for s, adapter in enumerate(alone)])
        torch.testing.assert_close(stacked(x), expected, rtol=1e-4, atol=1e-5)
    for s, adapter in enumerate(alone):
        assert [row["guard"] for row in stacked.stream_history(s)] == [
            row["guard"] for row in adapter.history
        ]
    assert any(_fired(adapter) for adapter in alone)


def test_guards_are_named_in_one_place_and_refused_in_one_line():
    assert set(GUARDS) == {"none", "rdumb", "sar", "auto", "asr"} and guard_named("none") is None
    with pytest.raises(ValueError, match="unknown guard 'oracle'; choose one of none, rdumb, sar, auto, asr"):
        zerosiam.adapt(tiny(), "tent", guard="oracle")
    with pytest.raises(ValueError, match="unknown guard 'oracle'"):
        RunSpec("resnet20", "cifar10c", "fog", 5, "mild", "tent", guard="oracle")


def test_a_guard_leaves_every_stored_run_id_as_it_was():
    plain = RunSpec("resnet20", "cifar10c", "fog", 5, "mild", "tent")
    assert RunSpec("resnet20", "cifar10c", "fog", 5, "mild", "tent", guard="none").run_id == plain.run_id
    assert RunSpec("resnet20", "cifar10c", "fog", 5, "mild", "tent", guard="auto").run_id != plain.run_id


def test_noadapt_has_nothing_to_guard():
    frozen = zerosiam.adapt(tiny(), "noadapt", guard="auto")
    frozen(_batches(1)[0])
    assert isinstance(frozen, Frozen) and "guard" not in frozen.last


def test_a_guards_state_travels_in_the_adapters_checkpoint():
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, guard=Periodic(every=4))
    batches = _batches(6)
    for x in batches[:3]:
        adapter(x)
    resumed = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, guard=Periodic(every=4))
    resumed.load_state_dict(copy.deepcopy(adapter.state_dict()))
    for x in batches[3:]:
        torch.testing.assert_close(resumed(x), adapter(x))
    assert _fired(resumed) == _fired(adapter) == [3]


def test_a_shrunk_stream_steps_smaller_and_reset_gives_the_full_step_back():
    adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, streams=2)
    x = _batches(1, streams=2)[0]
    adapter.shrink(torch.tensor([True, False]), 0.0)  # stream 0 frozen, stream 1 as before
    before = adapter.snapshot()["params"]
    adapter(x)
    after = adapter.snapshot()["params"]
    for name, value in before.items():
        assert torch.equal(value[0], after[name][0]) and not torch.equal(value[1], after[name][1])
    resumed = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, streams=2)
    resumed.load_state_dict(copy.deepcopy(adapter.state_dict()))
    torch.testing.assert_close(resumed(x), adapter(x))  # the scale travels in the checkpoint
    adapter.reset()
    adapter(x)
    assert not torch.equal(adapter.snapshot()["params"]["gn.weight"][0], before["gn.weight"][0])


def test_full_step_gives_a_shrunk_stream_its_step_back_and_leaves_the_other():
    def run(*changes) -> dict[str, torch.Tensor]:
        adapter = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, streams=2)
        for change in changes:
            change(adapter)
        for x in _batches(3, streams=2):
            adapter(x)
        return adapter.snapshot()["params"]

    plain = run()
    back = run(
        lambda a: a.shrink(torch.tensor([True, True]), 0.1),
        lambda a: a.full_step(torch.tensor([True, False])),
    )
    slowed = run(lambda a: a.shrink(torch.tensor([True, True]), 0.1))
    for name, value in plain.items():
        assert torch.equal(back[name][0], value[0])  # the full step, exactly
        assert torch.equal(back[name][1], slowed[name][1]) and not torch.equal(back[name][1], value[1])


def test_with_recover_a_slowed_stream_gets_its_full_step_back_after_that_many_passed_probes():
    def given_back(recover: int) -> list[int]:
        """The steps at which the probe gave the full step back, on a stream whose adapted model calls
        every image wrong at step 1 (a trigger) and right after (every step a probe)."""
        probe, learner, steps = SourceProbe(every=1, warmup=0, recover=recover), _Labelled(), []
        labels = torch.arange(16) % 10
        x = labels.float().view(16, 1, 1, 1).expand(16, 3, 4, 4)
        for step in range(1, 8):
            called = (labels + 1) % 10 if step == 1 else labels
            probe(learner, x, _calls(called), [])
            if getattr(learner, "given_back", 0) > len(steps):
                steps.append(step)
        assert learner.put_back == 1
        return steps

    assert given_back(recover=0) == []  # the default: slowed for good
    assert given_back(recover=3) == [4]  # steps 2, 3 and 4 passed


def test_rdumb_on_a_stream_shorter_than_its_period_is_the_unguarded_run():
    """What lets the guards' goals judge rdumb by the unguarded run on such streams (guard_goals)."""
    plain = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5)
    rdumb = zerosiam.adapt(tiny(scale=5.0), "tent", lr=0.5, guard="rdumb")
    for x in _batches(6):
        assert torch.equal(plain(x), rdumb(x))
    assert not _fired(rdumb) and torch.equal(plain.model.gn.weight, rdumb.model.gn.weight)


def test_with_rows_a_full_step_is_judged_on_that_many_images_spread_over_its_batch():
    learner, labels = _Labelled(), torch.arange(64) % 10
    x = labels.float().view(64, 1, 1, 1).expand(64, 3, 4, 4)
    called = torch.where(torch.arange(64) % 4 == 0, labels, (labels + 1) % 10)  # every 4th call agrees
    whole, spread = SourceProbe(), SourceProbe(rows=16)
    for _ in range(4):  # the warm-up's first probe
        whole(learner, x, _calls(called), [])
        spread(learner, x, _calls(called), [])
    assert learner.probed == [64, 16]
    assert float(whole.signals["agreement"]) == 0.25 and float(spread.signals["agreement"]) == 1.0


def test_sars_rule_replayed_on_an_unguarded_run_says_whether_and_where_the_sar_guard_fires():
    """Until it fires a guard has changed nothing: where the replay never fires, the unguarded run is the
    ``sar`` guard's run (what lets a grid leave that run out: bench.execution, guard_goals)."""

    def both(scale: float, steps: int) -> tuple[dict, list[int], list[bool]]:
        plain = zerosiam.adapt(tiny(scale=scale), "tent", lr=5.0)
        worn = zerosiam.adapt(tiny(scale=scale), "tent", lr=5.0, guard="sar")
        same = [torch.equal(plain(x), worn(x)) for x in _batches(steps)]
        return sar_replayed(plain.history), _fired(worn), same

    replayed, fired, same = both(scale=5.0, steps=12)
    assert replayed == {"sar_guard_fires": False} and fired == [] and all(same)
    assert never_acts("sar", replayed)
    replayed, fired, same = both(scale=8.0, steps=20)
    assert replayed == {"sar_guard_fires": True, "sar_guard_first_step": 14} and fired == [
        13
    ]  # counted from 0
    assert all(same[:14]) and not same[14] and not never_acts("sar", replayed)
    assert sar_replayed(zerosiam.adapt(tiny(), "noadapt").history) == {}  # nothing recorded, nothing said


def test_on_a_sar_run_the_replay_reads_sams_second_objective_and_fires_where_sars_own_reset_did():
    adapter = zerosiam.adapt(tiny(scale=20.0), "sar", lr=0.5)
    for x in _batches(6):
        adapter(x)
    resets = [row["step"] for row in adapter.history if row["recovered"]]
    assert resets and sar_replayed(adapter.history)["sar_guard_first_step"] == resets[0] + 1
    assert all("last_objective" in row for row in adapter.history)


def test_rdumb_never_acts_on_a_run_shorter_than_its_period():
    assert never_acts("rdumb", {"steps": 999}) and not never_acts("rdumb", {"steps": 1000})
    assert not never_acts("auto", {"steps": 10, "sar_guard_fires": False})  # SAR's replay: not auto's


def _watched_worn_plain(
    lr: float, batches: list[torch.Tensor], streams: int = 1
) -> list[tuple[Adapter, list]]:
    """The same stream under ``auto``'s watch, wearing ``auto`` (a probe every 2 steps of 8 rows, made
    to fire on this toy) and plain: each adapter with its outputs."""
    guards = [Watch(SourceProbe(every=2, min_agreement=0.8)), SourceProbe(every=2, min_agreement=0.8), None]
    adapters = [zerosiam.adapt(tiny(scale=5.0), "tent", lr=lr, streams=streams, guard=g) for g in guards]
    return [(adapter, [adapter(x) for x in batches]) for adapter in adapters]


def _equal_steps(outputs: list, others: list) -> list[bool]:
    return [torch.equal(a, b) for a, b in zip(outputs, others, strict=True)]


def test_autos_watch_changes_nothing_and_names_the_step_at_which_auto_would_first_act():
    """Until ``auto`` acts it has changed nothing: where its watch never fires, the unguarded run is the
    ``auto`` run (what lets a grid leave that run out: bench.execution, guard_goals)."""
    (watched, seen), (worn, worn_out), (plain, plain_out) = _watched_worn_plain(2.0, _batches(10, seed=4))
    assert _fired(watched) == [] and all(_equal_steps(seen, plain_out))
    first = _fired(worn)[0]  # counted from 0
    assert auto_watched(watched.history) == {"auto_guard_fires": True, "auto_guard_first_step": first + 1}
    same = _equal_steps(worn_out, plain_out)
    assert all(same[: first + 1]) and not all(same)
    assert not never_acts("auto", auto_watched(watched.history))
    assert triggers_by_bar(watched.history) == {}  # it watched, and triggered nothing

    (watched, _), (worn, worn_out), (plain, plain_out) = _watched_worn_plain(1e-3, _batches(10, seed=4))
    assert auto_watched(watched.history) == {"auto_guard_fires": False} and _fired(worn) == []
    assert never_acts("auto", auto_watched(watched.history)) and all(_equal_steps(worn_out, plain_out))
    assert auto_watched(plain.history) == {}  # not watched, nothing said


def test_stacked_streams_are_watched_as_lone_ones():
    batches = _batches(10, streams=3, seed=4)
    stacked = _watched_worn_plain(2.0, batches, streams=3)[0][0]
    for s in range(3):
        alone = _watched_worn_plain(2.0, [x[8 * s : 8 * (s + 1)] for x in batches])[0][0]
        assert auto_watched(stacked.stream_history(s)) == auto_watched(alone.history)
    assert any(auto_watched(stacked.stream_history(s))["auto_guard_fires"] for s in range(3))


def test_auto_runs_at_the_settings_docs_guard_md_names_frozen():
    """The held-out grid judges `auto` at the settings frozen before its runs: a default changed here
    without a new name would make its runs another guard's."""
    page = (Path(__file__).parents[2] / "docs" / "guard.md").read_text()
    block = page.split("<!-- frozen auto:")[1].split("```json\n")[1].split("```")[0]
    assert json.loads(block) == guard_settings("auto")
