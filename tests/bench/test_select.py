"""Learning-rate selection on the held-out corruptions, and the data-free choice of the predictor's rate."""

from __future__ import annotations

import pytest

from tests.bench.conftest import TinyLN
from zerosiam import corruptions
from zerosiam.bench.store import ResultStore


def test_learning_rates_are_selected_on_the_extra_corruptions_only(fake_domains, tiny_model, tmp_path):
    from zerosiam.bench.select import SELECTION_KIND, select_on_held_out

    store = ResultStore(tmp_path / "select.db")
    sweep = {"lr": [1e-4, 1e-1], "predictor_lr": [1e-2]}
    choices = select_on_held_out("tiny", ["tent", "zerosiam"], sweep, store, backend="inline", progress=False)
    runs = store.rows("vision")
    assert {row["spec"]["corruption"] for row in runs} == set(corruptions.EXTRA)
    assert len(runs) == 4 * 2 * 2
    for choice in choices:
        assert choice.accuracy == max(choice.table.values())
        assert len(choice.table) == 2
    recorded = store.rows(SELECTION_KIND)
    assert [row["metrics"]["chosen"] for row in recorded] == [c.hparams for c in choices]


def test_data_free_predictor_lr_prefers_the_least_disruptive_rate(tiny_model, monkeypatch):
    from zerosiam.bench import select

    monkeypatch.setattr(select.zerosiam, "load_model", lambda name: TinyLN())
    candidates = [0.0, 1.0, 10.0]  # far enough apart that their effects show in float32 entropies
    chosen, changes = select.data_free_predictor_lr("tiny", candidates, lr=5e-2, images=256, input_size=4)
    assert list(changes) == candidates and chosen == min(changes, key=changes.get)
    assert len({round(v, 9) for v in changes.values()}) == 3  # η_h reaches the model through the norms
    assert all(v > 0 for v in changes.values())


def test_the_data_free_choice_is_recorded_and_reported_beside_each_candidates_accuracy(
    tiny_model, monkeypatch, tmp_path, capsys
):
    from tests.bench.test_report import make_row, report_main
    from zerosiam.bench import select

    monkeypatch.setattr(select.zerosiam, "load_model", lambda name: TinyLN())
    store = ResultStore(tmp_path / "free.db")
    candidates = [0.0, 1.0, 10.0]
    chosen, changes = select.data_free_predictor_lr(
        "tiny", candidates, lr=5e-2, images=128, input_size=4, store=store
    )
    (row,) = store.rows(select.DATA_FREE_KIND)
    assert row["metrics"]["chosen"] == chosen and row["spec"]["lr"] == 5e-2
    runs = [  # accuracies of two candidates; the third never ran, one ran on one corruption of two
        make_row("zerosiam", corruption, accuracy, model="tiny", protocol="label_shift", hparams=rates)
        for corruption, eta_h, accuracy in (("fog", 0.0, 0.40), ("snow", 0.0, 0.50), ("fog", 1.0, 0.70))
        for rates in [{"lr": 5e-2, "predictor_lr": eta_h}]
    ]
    for run in runs:
        store.put(run["run_id"], "vision", run["spec"], run["metrics"], {}, {})
    assert report_main(["--db", str(store.path), "--data-free"]) == 0
    printed = capsys.readouterr().out.splitlines()
    change_line = next(line for line in printed if "ΔH" in line and line.startswith("| "))
    assert change_line.count("**") == 2 and f"**{changes[chosen]:.4f}**" in change_line
    assert "| accuracy (%) | 45.0 | 70.0 (1/2) | – |" in printed
    assert report_main(["--db", str(store.path), "--data-free", "--model", "other"]) == 1


def test_a_grid_takes_each_methods_selected_rates_from_the_store(fake_domains, tiny_model, tmp_path):
    import pytest

    from zerosiam.bench.grid import Grid
    from zerosiam.bench.select import select_on_held_out, with_selected_rates

    store = ResultStore(tmp_path / "select.db")
    grid = Grid(models=["tiny"], methods=["noadapt", "tent", "zerosiam"], corruptions=["fog"])
    with pytest.raises(ValueError, match="no learning rate selected for 'tent'.*select-lr"):
        with_selected_rates(grid.specs(), store)
    sweep = {"lr_scale": [0.1, 10.0]}  # the same candidates for both methods
    choices = select_on_held_out("tiny", ["tent", "zerosiam"], sweep, store, backend="inline", progress=False)
    chosen = {choice.method: choice.hparams for choice in choices}
    specs = with_selected_rates(grid.specs(), store)
    assert [spec.hparams for spec in specs] == [{}, chosen["tent"], chosen["zerosiam"]]
    ablation = Grid(models=["tiny"], methods=["zerosiam"], corruptions=["fog"], hparams={"lr_scale": 1.0})
    assert with_selected_rates(ablation.specs(), store)[0].hparams == {"lr_scale": 1.0}  # its own wins


def test_the_report_lists_every_candidate_and_marks_the_choice(fake_domains, tiny_model, tmp_path, capsys):
    from tests.bench.test_report import report_main
    from zerosiam.bench.select import select_on_held_out

    db = tmp_path / "select.db"
    sweep = {"lr_scale": [1.0, 0.1, 10.0]}
    (choice,) = select_on_held_out("tiny", ["tent"], sweep, ResultStore(db), backend="inline", progress=False)
    assert report_main(["--db", str(db), "--selections"]) == 0
    printed = capsys.readouterr().out
    assert "| Model | Method | lr_scale=0.1 | lr_scale=1 | lr_scale=10 |" in printed  # numeric order
    line = next(text for text in printed.splitlines() if text.startswith("| tiny | Tent |"))
    assert line.count("**") == 2 and f"**{100 * choice.accuracy:.1f}**" in line
    assert report_main(["--db", str(db), "--selections", "--model", "other"]) == 1


def test_the_report_of_a_grid_shows_its_runs_only(fake_domains, tiny_model, tmp_path, capsys):
    from tests.bench.test_report import report_main
    from zerosiam.bench.execution import Execution, execute
    from zerosiam.bench.select import grid_specs, select_on_held_out

    db = tmp_path / "study.db"
    store = ResultStore(db)
    select_on_held_out("tiny", ["tent"], {"lr_scale": [1.0, 10.0]}, store, backend="inline", progress=False)
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text("models: [tiny]\nmethods: [noadapt, tent]\ncorruptions: [fog]\nrates: selected\n")
    from zerosiam.bench.grid import Grid

    execute(grid_specs(Grid.from_yaml(grid_file), store), store, Execution(backend="inline", progress=False))
    other = Grid(models=["tiny"], methods=["tent"], corruptions=["fog"], hparams={"lr_scale": 0.5})
    execute(other.specs(), store, Execution(backend="inline", progress=False))  # same table, not the grid's
    assert report_main(["--db", str(db), "--grid", str(grid_file)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| NoAdapt", "| Tent"]  # no "Tent (lr_scale=…)"
    assert report_main(["--db", str(db), "--grid", str(tmp_path / "missing.yaml")]) == 2


def test_two_selections_that_disagree_stop_a_grid(tmp_path):
    import pytest

    from zerosiam.bench.select import SELECTION_KIND, selected_hparams

    store = ResultStore(tmp_path / "select.db")
    for protocol, scale in (("mild", 1.0), ("label_shift", 3.0)):
        spec = {"model": "m", "dataset": "cifar10c", "method": "tent", "protocol": protocol}
        store.put(protocol, SELECTION_KIND, spec, {"chosen": {"lr_scale": scale}}, {}, {})
    with pytest.raises(ValueError, match="2 different selections for 'tent'"):
        selected_hparams(store, "m", "cifar10c", "tent")


def test_a_selection_over_more_candidates_supersedes_the_one_it_extends(tmp_path):
    from zerosiam.bench.select import SELECTION_KIND, selected_hparams

    store = ResultStore(tmp_path / "select.db")
    edge = {"lr_scale=1": 0.5, "lr_scale=30": 0.7}
    extended = {**edge, "lr_scale=100": 0.8}
    for name, table, scale in (("edge", edge, 30.0), ("extended", extended, 100.0)):
        spec = {"model": "m", "dataset": "cifar10c", "method": "sar", "candidates": sorted(table)}
        store.put(name, SELECTION_KIND, spec, {"chosen": {"lr_scale": scale}, "candidates": table}, {}, {})
    assert selected_hparams(store, "m", "cifar10c", "sar") == {"lr_scale": 100.0}


def test_a_selection_wearing_a_guard_is_recorded_apart_and_never_feeds_a_grid(
    fake_domains, tiny_model, tmp_path, capsys
):
    from tests.bench.test_report import report_main
    from zerosiam.bench.grid import Grid
    from zerosiam.bench.select import SELECTION_KIND, select_on_held_out, with_selected_rates

    store = ResultStore(tmp_path / "select.db")
    options = {"backend": "inline", "progress": False}
    select_on_held_out("tiny", ["tent"], {"lr_scale": [1.0, 10.0]}, store, guard="auto", **options)
    (guarded,) = store.rows(SELECTION_KIND)
    assert guarded["spec"]["guard"] == "auto"
    assert {row["spec"]["guard"] for row in store.rows("vision")} == {"auto"}  # every candidate wore it
    grid = Grid(models=["tiny"], methods=["tent"], corruptions=["fog"], rates="selected")
    with pytest.raises(ValueError, match="no learning rate selected for 'tent'"):
        with_selected_rates(grid.specs(), store)
    (plain,) = select_on_held_out("tiny", ["tent"], {"lr_scale": [1.0, 10.0]}, store, **options)
    assert "guard" not in store.rows(SELECTION_KIND)[-1]["spec"]  # the id an unguarded one always had
    assert with_selected_rates(grid.specs(), store)[0].hparams == plain.hparams
    assert report_main(["--db", str(store.path), "--selections"]) == 0
    printed = capsys.readouterr().out
    assert "| tiny | Tent (guard=auto) |" in printed and "| tiny | Tent |" in printed


def test_select_lr_refuses_an_unknown_guard_before_any_work(tmp_path, capsys):
    from zerosiam.cli import main

    db = tmp_path / "select.db"
    with pytest.raises(SystemExit) as stop:
        main(["select-lr", "--model", "resnet20", "--lr-scale", "1,3", "--guard", "always", "--db", str(db)])
    assert stop.value.code == 2
    assert "unknown guard 'always'; choose one of none, rdumb, sar, auto" in capsys.readouterr().err
    assert not db.exists()
