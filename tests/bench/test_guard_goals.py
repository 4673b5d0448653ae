"""The guards' goals computed from a grid's rows (docs/guard.md)."""

from __future__ import annotations

from tests.bench.test_report import make_row, report_main
from zerosiam.bench.guard_goals import guard_scores, to_markdown


def guarded(method: str, corruption: str, accuracy: float, guard: str, **kwargs) -> dict:
    row = make_row(method, corruption, accuracy, **kwargs)
    row["spec"]["guard"] = guard
    row["run_id"] += f"-{guard}"
    return row


def test_each_guard_counts_its_losses_gain_kept_and_false_alarms():
    rows = [
        make_row("noadapt", "fog", 0.60),
        make_row("noadapt", "snow", 0.50),
        make_row("noadapt", "fog", 0.70, protocol="label_shift"),
        make_row("tent", "fog", 0.20, protocol="label_shift"),  # unguarded: a collapse, no "guard" key
        guarded("tent", "fog", 0.695, "auto", protocol="label_shift"),  # within a point: not lost
        guarded("tent", "fog", 0.40, "sar", protocol="label_shift"),
        make_row("zerosiam", "fog", 0.64),  # gains 4 points
        make_row("zerosiam", "snow", 0.52),  # and 2
        guarded("zerosiam", "fog", 0.63, "auto"),  # keeps 3
        guarded("zerosiam", "snow", 0.52, "auto"),  # and 2: 5 of 6
        guarded("zerosiam", "fog", 0.58, "sar"),  # loses 2
        guarded("zerosiam", "snow", 0.51, "sar"),  # keeps 1: −1 of 6
        guarded("tent", "fog", 0.6, "auto", model="other", protocol="label_shift"),  # no NoAdapt: not judged
    ]
    rows[8]["metrics"].update(steps=100, guard_triggers=1)
    rows[9]["metrics"].update(steps=100, guard_triggers=0)
    none, auto, rdumb, sar = guard_scores(rows)  # rdumb: the unguarded runs (157 steps each)
    assert (none.guard, none.cells, len(none.lost), none.gain_kept) == ("none", 3, 1, 1.0)
    assert (rdumb.cells, rdumb.lost, rdumb.gain_kept, rdumb.stand_ins) == (3, none.lost, 1.0, 3)
    assert (auto.guard, auto.cells, auto.lost) == ("auto", 3, ())
    assert round(auto.gain_kept, 6) == round(5 / 6, 6) and auto.alarms_per_100 == 0.5
    assert (round(auto.kept, 6), round(auto.gained, 6)) == (5.0, 6.0)  # the sums, in points
    assert sar.guard == "sar" and len(sar.lost) == 2 and round(sar.gain_kept, 6) == round(-1 / 6, 6)
    assert sar.lost[0] == "resnet20 Tent, label_shift, Fog: 40.0 (NoAdapt 70.0)"
    # NoAdapt less the guard, averaged: (50 − 4 − 2) / 3 unguarded, (0.5 − 3 − 2) / 3 with auto (above)
    assert [round(score.mean_below, 6) for score in (none, auto, sar)] == [
        round(44 / 3, 6),
        -1.5,
        round(31 / 3, 6),
    ]
    text = to_markdown([none, auto, sar])
    assert "| auto | 3 | 0 | -1.50 | 83 % (5.0 of 6.0) | 0.50 (1 in 200) |" in text
    assert "| none | 3 | 1 | 14.67 | 100 % (6.0 of 6.0) | – |" in text
    assert "Lost with `sar`:" in text and "Lost with `none`" not in text


def test_report_prints_the_goals_and_says_when_nothing_adapts(tmp_path, capsys):
    from zerosiam.bench.store import ResultStore

    store = ResultStore(tmp_path / "guards.db")
    for row in (make_row("noadapt", "fog", 0.6), guarded("tent", "fog", 0.5, "auto")):
        store.put(row["run_id"], "vision", row["spec"], row["metrics"], {}, {})
    assert report_main(["--db", str(store.path), "--guards"]) == 0
    assert "| auto | 1 | 1 |" in capsys.readouterr().out
    assert report_main(["--db", str(store.path), "--guards", "--methods", "noadapt"]) == 1


def test_rdumb_is_judged_on_every_cell_its_reset_cannot_reach_by_the_unguarded_run():
    rows = [
        make_row("noadapt", "fog", 0.70, protocol="label_shift"),
        make_row("noadapt", "snow", 0.70, protocol="label_shift"),
        make_row("noadapt", "fog", 0.60, protocol="blind_spot"),
        make_row("tent", "fog", 0.20, protocol="label_shift"),  # 157 steps: rdumb is this run
        guarded("tent", "snow", 0.72, "rdumb", protocol="label_shift"),  # run: kept as it is
        make_row("tent", "snow", 0.74, protocol="label_shift"),
        make_row("tent", "fog", 0.30, protocol="blind_spot"),  # 2,000 steps: rdumb would reset
        guarded("tent", "fog", 0.69, "auto", protocol="label_shift"),
    ]
    for row, steps in zip(rows[3:7], (157, 157, 157, 2000), strict=True):
        row["metrics"]["steps"] = steps
    none, auto, rdumb = guard_scores(rows)
    assert (rdumb.guard, rdumb.cells, rdumb.stand_ins) == ("rdumb", 2, 1)
    assert rdumb.lost == ("resnet20 Tent, label_shift, Fog: 20.0 (NoAdapt 70.0)",)
    assert round(rdumb.gain_kept, 6) == 0.5  # 2 of the unguarded 4 points on snow, from its own run
    assert none.cells == 3 and auto.cells == 1
    text = to_markdown([none, auto, rdumb])
    assert "`rdumb`: 1 of its 2 cells are the unguarded runs" in text and "Lost with `rdumb`" not in text
    assert [score.guard for score in guard_scores(rows[:4])] == ["none"]  # no guard ran: none compared


def test_a_run_stored_before_a_field_existed_is_the_same_cell_as_one_with_it_at_its_default():
    """The study's first unguarded runs have no ``prelude``; its guarded runs have ``prelude: {}``. Their
    gain is the guard's to keep: a cell that matched only its NoAdapt would leave it out of the sum."""
    rows = [
        make_row("noadapt", "fog", 0.60),
        make_row("tent", "fog", 0.64),  # stored before prelude existed: gains 4 points
        guarded("tent", "fog", 0.62, "auto"),  # keeps 2 of them
    ]
    rows[2]["spec"]["prelude"] = {}
    none, auto, _ = guard_scores(rows)
    assert (none.cells, auto.cells) == (1, 1)
    assert round(auto.gain_kept, 6) == 0.5


def test_a_grid_whose_guarded_runs_were_all_spared_is_judged_all_the_same():
    """``auto`` watched the unguarded run and never fired, so its run was not made: a grid that wears it
    (``zerosiam report --grid ... --guards``) is judged on the unguarded run, counted apart."""
    rows = [
        make_row("noadapt", "fog", 0.70, protocol="label_shift"),
        make_row("tent", "fog", 0.72, protocol="label_shift"),
    ]
    rows[1]["metrics"].update(steps=157, auto_guard_fires=False)
    assert [score.guard for score in guard_scores(rows)] == ["none"]  # the store alone: no guard ran
    none, auto, rdumb = guard_scores(rows, {"none", "auto"})
    assert (auto.guard, auto.cells, auto.stand_ins, auto.lost, auto.gain_kept) == ("auto", 1, 1, (), 1.0)
    assert (
        "`auto`: 1 of its 1 cells are the unguarded runs (runs it watched and never fired on"
        in to_markdown([none, auto, rdumb])
    )


def test_the_cells_view_shows_each_guards_run_what_it_did_and_which_cells_are_stand_ins(tmp_path, capsys):
    """``zerosiam report --guards --cells``: the cells behind the counts, the bar each trigger crossed."""
    from zerosiam.bench.guard_goals import cells_markdown
    from zerosiam.bench.store import ResultStore

    rows = [
        make_row("noadapt", "fog", 0.70, protocol="label_shift"),
        make_row("tent", "fog", 0.20, protocol="label_shift"),
        guarded("tent", "fog", 0.695, "auto", protocol="label_shift"),
        guarded("tent", "fog", 0.40, "sar", protocol="label_shift"),
    ]
    rows[1]["metrics"].update(steps=157, sar_guard_fires=True, sar_guard_first_step=40, auto_guard_fires=True,
                              auto_guard_first_step=8)  # fmt: skip
    rows[2]["metrics"].update(guard_triggers=2, guard_triggers_on_agreement=1, guard_triggers_on_narrowing=2)
    rows[3]["metrics"].update(guard_triggers=1)
    text = cells_markdown(rows)
    assert text.splitlines()[0] == "| Cell | NoAdapt | none | auto | rdumb | sar |"
    assert (
        "| resnet20 Tent, label_shift, Fog | 70.0 | **20.0** (sar at step 40, auto at step 8) "
        "| 69.5 (2 triggers: 1 agreement, 2 narrowing) | **20.0** (= none) | **40.0** (1 trigger) |"
    ) in text
    store = ResultStore(tmp_path / "guards.db")
    for row in rows:
        store.put(row["run_id"], "vision", row["spec"], row["metrics"], {}, {})
    assert report_main(["--db", str(store.path), "--guards", "--cells"]) == 0
    assert "| resnet20 Tent, label_shift, Fog | 70.0 |" in capsys.readouterr().out
    assert report_main(["--db", str(store.path), "--cells"]) == 2  # the cells of what? said, not guessed
    assert "give --guards too" in capsys.readouterr().err


def test_a_guards_run_made_at_other_settings_than_its_present_ones_is_left_out_and_said():
    from zerosiam.parts.guards import guard_settings

    rows = [
        make_row("noadapt", "fog", 0.60),
        make_row("noadapt", "snow", 0.50),
        make_row("tent", "fog", 0.62),
        make_row("tent", "snow", 0.52),
        guarded("tent", "fog", 0.61, "auto"),  # recorded nothing: made before runs recorded settings
        guarded("tent", "snow", 0.40, "auto"),  # made at another min_agreement: another guard
    ]
    rows[4]["env"] = {"device": "cpu"}
    rows[5]["env"] = {"device": "cpu", "guard_settings": guard_settings("auto") | {"min_agreement": 0.9}}
    _, auto, *_ = guard_scores(rows)
    assert (auto.cells, auto.lost, auto.other_settings) == (1, (), 1)
    assert "`auto`: 1 of its runs left out, made at settings other than its present ones" in to_markdown(
        [auto]
    )
    rows[5]["env"]["guard_settings"] = guard_settings("auto")  # at the present settings: judged, and lost
    _, auto, *_ = guard_scores(rows)
    assert (auto.cells, len(auto.lost), auto.other_settings) == (2, 1, 0)
