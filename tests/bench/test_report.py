"""Tables, writers, figures and the ``report`` command, on hand-made result rows."""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zerosiam.bench import report
from zerosiam.corruptions import BENCHMARK, EXTRA, GROUPS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_row(
    method: str,
    corruption: str,
    accuracy: float | None,
    *,
    seed: int = 0,
    model: str = "resnet20",
    protocol: str = "mild",
    severity: int = 5,
    hparams: dict | None = None,
    per_domain: dict | None = None,
    curves: dict | None = None,
) -> dict[str, Any]:
    """One result row as ``ResultStore.rows()`` returns it."""
    spec = {
        "model": model,
        "dataset": "cifar10c",
        "corruption": corruption,
        "severity": severity,
        "protocol": protocol,
        "method": method,
        "hparams": hparams or {},
        "seed": seed,
        "batch_size": 64,
        "limit": None,
    }
    metrics: dict[str, Any] = {"accuracy": accuracy, "samples": 10000, "steps": 157}
    if per_domain is not None:
        metrics["per_domain"] = per_domain
    run_id = f"{method}-{corruption}-{model}-{protocol}-{severity}-{seed}-{sorted((hparams or {}).items())}"
    return {
        "run_id": run_id,
        "kind": "vision",
        "spec": spec,
        "metrics": metrics,
        "curves": curves or {},
        "env": {},
        "created": "2026-01-01T00:00:00",
    }


def full_line(method: str, accuracies: dict[str, float], **kwargs: Any) -> list[dict[str, Any]]:
    """One run per corruption given in ``accuracies`` (fractions)."""
    return [make_row(method, name, value, **kwargs) for name, value in accuracies.items()]


# distinct values per corruption so that any mix-up of columns changes a mean
NOADAPT = {name: 0.30 + 0.01 * i for i, name in enumerate(BENCHMARK)}
TENT = {name: 0.50 + 0.02 * i for i, name in enumerate(BENCHMARK)}


@pytest.fixture
def rows() -> list[dict[str, Any]]:
    """NoAdapt and Tent on all 15 corruptions, with Tent below NoAdapt on Gaussian noise only."""
    tent = dict(TENT, gaussian_noise=0.20)
    return full_line("tent", tent) + full_line("noadapt", NOADAPT)


def only_table(rows: list[dict[str, Any]], **kwargs: Any) -> report.Table:
    tables = report.build_tables(rows, **kwargs)
    assert len(tables) == 1
    return tables[0]


# ------------------------------------------------------------------------------------------------ tables


def test_columns_follow_the_paper_order_and_methods_start_with_noadapt(rows):
    table = only_table(rows)
    assert table.columns == list(BENCHMARK) + ["avg"]
    assert table.columns[:3] == ["gaussian_noise", "shot_noise", "impulse_noise"]
    assert table.columns[-2] == "jpeg_compression"
    assert table.methods == ["NoAdapt", "Tent"]
    header = report.to_markdown([table]).splitlines()[2]
    assert header.split(" | ")[1:4] == ["Gauss.", "Shot", "Impul."]
    assert header.rstrip(" |").endswith("JPEG | Avg.")


def test_method_order_puts_zerosiam_and_its_compositions_last():
    methods = ["deyo+zerosiam", "zerosiam", "mystery", "tent", "noadapt", "sar"]
    rows = [make_row(m, "fog", 0.5) for m in methods]
    table = only_table(rows)
    assert table.methods == ["NoAdapt", "Tent", "SAR", "mystery", "ZeroSiam", "DeYO+ZeroSiam"]


def test_group_means_and_average_are_the_arithmetic_means(rows):
    table = only_table(rows, groups=True)
    assert table.columns == ["noise", "blur", "weather", "digital", "avg"]
    for group, members in GROUPS.items():
        expected = 100 * statistics.fmean(NOADAPT[name] for name in members)
        assert table.cell("NoAdapt", group).mean == pytest.approx(expected)
    # the average is over the 15 corruptions, not over the 4 group means (groups have 3 to 5 members)
    assert table.cell("NoAdapt", "avg").mean == pytest.approx(100 * statistics.fmean(NOADAPT.values()))
    group_mean = statistics.fmean(table.cell("NoAdapt", g).mean for g in GROUPS)
    assert table.cell("NoAdapt", "avg").mean != pytest.approx(group_mean)
    full = only_table(rows)
    assert full.cell("NoAdapt", "avg").mean == table.cell("NoAdapt", "avg").mean
    assert full.cell("NoAdapt", "fog").mean == pytest.approx(100 * NOADAPT["fog"])


def test_a_cell_below_noadapt_is_marked_and_one_above_is_not(rows):
    table = only_table(rows)
    assert table.cell("Tent", "gaussian_noise").worse
    assert not table.cell("Tent", "shot_noise").worse
    assert not any(table.cell("NoAdapt", c).worse for c in table.columns)
    tent_line = next(line for line in report.to_markdown([table]).splitlines() if line.startswith("| Tent"))
    cells = [cell.strip() for cell in tent_line.strip("|").split("|")]
    assert cells[1] == "20.0 ↓"
    assert cells[2] == f"{100 * TENT['shot_noise']:.1f}"


def test_marking_uses_unrounded_values_and_ties_are_not_marked():
    rows = [make_row("noadapt", "fog", 0.5), make_row("tent", "fog", 0.5), make_row("sar", "fog", 0.49996)]
    table = only_table(rows)
    assert not table.cell("Tent", "fog").worse
    assert table.cell("SAR", "fog").worse
    assert report.format_cell(table.cell("SAR", "fog"), mark=" ↓") == "50.0 ↓"


def test_a_missing_cell_is_a_dash_and_blanks_only_the_means_that_need_it(rows):
    rows = [r for r in rows if not (r["spec"]["method"] == "tent" and r["spec"]["corruption"] == "fog")]
    table = only_table(rows)
    assert table.cell("Tent", "fog").mean is None
    assert table.cell("Tent", "avg").mean is None
    assert report.format_cell(table.cell("Tent", "fog")) == "–"
    assert any("Tent" in note and "Fog" in note for note in table.notes)
    grouped = only_table(rows, groups=True)
    assert grouped.cell("Tent", "weather").mean is None
    assert grouped.cell("Tent", "noise").mean == pytest.approx(
        100 * statistics.fmean([0.20, TENT["shot_noise"], TENT["impulse_noise"]])
    )
    assert grouped.cell("NoAdapt", "weather").mean is not None
    markdown = report.to_markdown([grouped])
    tent_line = next(line for line in markdown.splitlines() if line.startswith("| Tent"))
    assert tent_line.count("–") == 2  # Weather and Avg.


def test_seeds_give_mean_and_sample_std():
    rows = [make_row("tent", name, 0.70, seed=0) for name in BENCHMARK]
    rows += [make_row("tent", name, 0.80, seed=1) for name in BENCHMARK]
    table = only_table(rows)
    cell = table.cell("Tent", "fog")
    assert cell.mean == pytest.approx(75.0)
    assert cell.std == pytest.approx(statistics.stdev([70.0, 80.0]))
    assert cell.seeds == 2
    assert report.format_cell(cell) == "75.0 ± 7.1"
    single = only_table([make_row("tent", "fog", 0.7)])
    assert single.cell("Tent", "fog").std is None
    assert report.format_cell(single.cell("Tent", "fog")) == "70.0"


def test_by_seed_shows_each_seeds_average_marked_against_noadapt_of_that_seed():
    """A method may beat NoAdapt on the mean over seeds and still lose in one seed: the by-seed table
    shows it. A seed that lacks a corruption has no average, and the mean over seeds leaves it out."""
    rows = full_line("noadapt", NOADAPT, seed=0) + full_line("noadapt", NOADAPT, seed=1)
    rows += full_line("tent", TENT, seed=0) + full_line("tent", dict.fromkeys(BENCHMARK, 0.20), seed=1)
    table = only_table(rows, by_seed=True)
    assert table.columns == ["Seed 0", "Seed 1", "avg"]
    noadapt, tent = 100 * statistics.fmean(NOADAPT.values()), 100 * statistics.fmean(TENT.values())
    assert table.cell("Tent", "Seed 0").mean == pytest.approx(tent)
    assert not table.cell("Tent", "Seed 0").worse
    assert table.cell("Tent", "Seed 1").mean == pytest.approx(20.0)
    assert table.cell("Tent", "Seed 1").worse  # 20 < NoAdapt's seed-1 average
    average = table.cell("Tent", "avg")
    assert average.mean == pytest.approx((tent + 20.0) / 2)
    assert average.std == pytest.approx(statistics.stdev([tent, 20.0]))
    assert table.cell("NoAdapt", "Seed 1").mean == pytest.approx(noadapt)
    assert "| Seed 0 | Seed 1 | Avg. |" in report.to_markdown([table])

    gap = [row for row in rows if not (row["spec"]["method"] == "tent" and row["spec"]["seed"] == 1
                                        and row["spec"]["corruption"] == "fog")]  # fmt: skip
    table = only_table(gap, by_seed=True)
    assert table.cell("Tent", "Seed 0").mean == pytest.approx(tent)
    assert table.cell("Tent", "Seed 1").mean is None
    # The last column is the mean of the seed columns shown: seed 1, still under way, counts in none.
    assert table.cell("Tent", "avg").mean == pytest.approx(tent)
    assert table.cell("Tent", "avg").std is None  # one complete seed: no spread to show
    assert only_table(gap).cell("Tent", "avg").mean != pytest.approx(tent)  # the plain table keeps seed 1


def test_a_line_with_fewer_seeds_is_marked_against_noadapt_on_the_seeds_it_has():
    """Under label shift a seed redraws the stream, so NoAdapt moves between seeds: a line run on seed 0
    only is compared with NoAdapt's seed 0, not with its mean over seeds it has not met."""
    rows = full_line("noadapt", dict.fromkeys(BENCHMARK, 0.50), seed=0)
    rows += full_line("noadapt", dict.fromkeys(BENCHMARK, 0.60), seed=1)
    rows += full_line("tent", dict.fromkeys(BENCHMARK, 0.52), seed=0)  # above seed 0, below the mean 55
    for by_seed in (False, True):
        table = only_table(rows, by_seed=by_seed)
        assert table.cell("Tent", "avg").mean == pytest.approx(52.0)
        assert table.cell("NoAdapt", "avg").mean == pytest.approx(55.0)
        assert not table.cell("Tent", "avg").worse
        assert any("Tent" in note and "seeds both have" in note for note in table.notes)
    assert not only_table(rows).cell("Tent", "fog").worse
    below = rows + full_line("sar", dict.fromkeys(BENCHMARK, 0.58), seed=1)  # above the mean, below seed 1
    table = only_table(below, by_seed=True)
    assert table.cell("SAR", "Seed 1").worse and table.cell("SAR", "avg").worse
    assert only_table(below).cell("SAR", "fog").worse
    same = full_line("noadapt", NOADAPT, seed=0) + full_line("tent", TENT, seed=0)
    assert not any("seeds both have" in note for note in only_table(same).notes)


def test_one_seed_shows_the_streams_behind_its_by_seed_column():
    """``seed=1`` keeps seed 1 alone: each corruption is that seed's stream, marked against NoAdapt's
    stream of the same seed, where the mean over seeds would hide which streams lost."""
    rows = full_line("noadapt", NOADAPT, seed=0) + full_line("noadapt", NOADAPT, seed=1)
    rows += full_line("tent", TENT, seed=0) + full_line("tent", dict.fromkeys(BENCHMARK, 0.20), seed=1)
    table = only_table(rows, seed=1)
    assert table.cell("Tent", "fog").mean == pytest.approx(20.0)
    assert table.cell("Tent", "fog").std is None and table.cell("Tent", "fog").seeds == 1
    assert table.cell("Tent", "fog").worse
    assert table.cell("NoAdapt", "fog").mean == pytest.approx(100 * NOADAPT["fog"])
    assert only_table(rows, seed=0).cell("Tent", "fog").mean == pytest.approx(100 * TENT["fog"])
    assert report.build_tables(rows, seed=2) == []


def test_by_seed_of_some_corruptions_averages_those_shown():
    rows = [make_row("noadapt", name, 0.5, seed=seed) for name in ("fog", "snow") for seed in (0, 1)]
    table = only_table(rows, by_seed=True)
    assert table.columns == ["Seed 0", "Seed 1", "mean"]
    assert table.cell("NoAdapt", "Seed 1").mean == pytest.approx(50.0)
    assert table.notes == []  # the 13 corruptions not shown are not missing


def test_filters_and_one_table_per_setting(rows):
    other = [make_row("tent", "fog", 0.9, model="resnet50_gn"), make_row("tent", "fog", 0.1, severity=3)]
    other += [make_row("tent", "fog", 0.8, protocol="label_shift")]
    everything = rows + other
    assert len(report.build_tables(everything)) == 4
    table = only_table(everything, model="resnet20", severity=5, protocol="mild", dataset="cifar10c")
    assert table.cell("Tent", "fog").mean == pytest.approx(100 * TENT["fog"])
    assert report.build_tables(everything, dataset="imagenetc") == []
    shifted = only_table(everything, protocol="label_shift")
    assert shifted.cell("Tent", "fog").mean == pytest.approx(80.0)
    mild = only_table(everything, model="resnet20", severity=5, protocol="mild", methods=["noadapt", "tent"])
    assert [method for method in mild.methods] == ["NoAdapt", "Tent"]


def test_a_rerun_replaces_the_older_row():
    old, new = make_row("tent", "fog", 0.2), make_row("tent", "fog", 0.6)
    old["created"], new["created"] = 9.5, 10.0  # numbers, as the store writes them; "10.0" < "9.5" as text
    new["run_id"] = "rerun"
    assert only_table([new, old]).cell("Tent", "fog").mean == pytest.approx(60.0)


def test_a_sweep_is_not_averaged_into_one_line():
    rows = [make_row("zerosiam", "fog", 0.6, hparams={"lr": 0.001, "predictor_lr": 0.01})]
    rows += [make_row("zerosiam", "fog", 0.8, hparams={"lr": 0.01, "predictor_lr": 0.01})]
    table = only_table(rows)
    assert table.methods == ["ZeroSiam (lr=0.001)", "ZeroSiam (lr=0.01)"]
    assert table.cell("ZeroSiam (lr=0.01)", "fog").mean == pytest.approx(80.0)


def test_mixed_protocol_reads_per_domain_and_adds_overall():
    per_domain = {name: 0.4 + 0.01 * i for i, name in enumerate(BENCHMARK)}
    per_domain[EXTRA[0]] = 0.99  # not a benchmark column: ignored
    rows = [make_row("tent", "mixed", 0.47, protocol="mixed", per_domain=per_domain)]
    table = only_table(rows)
    assert table.columns == list(BENCHMARK) + ["avg", "overall"]
    assert table.cell("Tent", "fog").mean == pytest.approx(100 * per_domain["fog"])
    assert table.cell("Tent", "overall").mean == pytest.approx(47.0)
    assert table.cell("Tent", "avg").mean == pytest.approx(
        100 * statistics.fmean(per_domain[n] for n in BENCHMARK)
    )
    assert only_table(rows, groups=True).columns == ["noise", "blur", "weather", "digital", "avg", "overall"]


def test_runs_on_extra_corruptions_are_left_out_with_a_note(rows):
    held_out = [make_row("tent", EXTRA[0], 0.9, hparams={"lr": lr}) for lr in (0.1, 0.01)]
    table = only_table(rows + held_out)
    assert EXTRA[0] not in table.columns
    assert table.methods == ["NoAdapt", "Tent"]  # the held-out sweep neither adds lines nor renames Tent
    assert any(note.startswith("2 run(s)") and "outside the 15" in note for note in table.notes)
    assert report.build_tables(held_out) == []


def test_without_noadapt_nothing_is_marked():
    table = only_table([make_row("tent", "fog", 0.1), make_row("sar", "fog", 0.9)])
    assert not any(cell.worse for cell in table.cells.values())
    assert any("No NoAdapt" in note for note in table.notes)


# ------------------------------------------------------------------------------------------------ writers


def parse_csv(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (r["method"], r["column"]): (r["accuracy"], r["worse_than_noadapt"])
        for r in csv.DictReader(io.StringIO(text))
    }


def parse_latex(text: str, columns: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(method, column) -> (number or '', '1' if red) from the tabular's body lines."""
    body = text.split(r"\midrule")[1].split(r"\bottomrule")[0]
    found = {}
    for line in body.strip().splitlines():
        method, *cells = [cell.strip() for cell in line.removesuffix(r"\\").split("&")]
        for column, cell in zip(columns, cells, strict=True):
            number = re.match(r"(?:\\textcolor\{red\}\{)?(\d+\.\d)", cell)
            found[method, column] = (
                number.group(1) if number else "",
                str(int(cell.startswith(r"\textcolor"))),
            )
    return found


def parse_markdown(text: str, columns: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    found = {}
    for line in text.splitlines()[4:]:
        if not line.startswith("| "):
            break
        method, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        for column, cell in zip(columns, cells, strict=True):
            number = re.match(r"\d+\.\d", cell)
            found[method, column] = (number.group(0) if number else "", str(int(cell.endswith("↓"))))
    return found


def test_csv_latex_and_markdown_carry_the_same_numbers_and_marks(rows):
    rows = [r for r in rows if not (r["spec"]["method"] == "tent" and r["spec"]["corruption"] == "fog")]
    rows += [make_row("tent", "snow", 0.05, seed=1)]  # gives Snow a std, which must not be read as the value
    rows += [make_row("noadapt", "snow", NOADAPT["snow"], seed=1)]  # so that seed 1 has a NoAdapt to be below
    table = only_table(rows)
    from_csv = parse_csv(report.to_csv([table]))
    from_latex = parse_latex(report.to_latex([table]), table.columns)
    from_markdown = parse_markdown(report.to_markdown([table]), table.columns)
    assert from_csv == from_latex == from_markdown
    assert len(from_csv) == 2 * len(table.columns)
    assert from_csv["Tent", "gaussian_noise"] == ("20.0", "1")
    assert from_csv["Tent", "fog"] == ("", "0")
    snow = statistics.fmean([100 * TENT["snow"], 5.0])
    assert from_csv["Tent", "snow"] == (f"{snow:.1f}", "1")
    for (method, column), (value, _) in from_csv.items():
        cell = table.cell(method, column)
        assert value == ("" if cell.mean is None else f"{cell.mean:.1f}")


def test_csv_has_one_line_per_cell_with_setting_columns(rows):
    lines = list(csv.DictReader(io.StringIO(report.to_csv(report.build_tables(rows)))))
    assert len(lines) == 2 * 16
    assert tuple(lines[0]) == report.CSV_FIELDS
    assert {(r["dataset"], r["model"], r["protocol"], r["severity"]) for r in lines} == {
        ("cifar10c", "resnet20", "mild", "5")
    }


def test_latex_escapes_names_and_groups_the_header(rows):
    renamed = [dict(r, spec=dict(r["spec"], model="resnet50_gn")) for r in rows]
    latex = report.to_latex(report.build_tables(renamed))
    assert r"resnet50\_gn" in latex
    assert "resnet50_gn" not in latex
    assert r"\multicolumn{3}{c}{Noise} & \multicolumn{4}{c}{Blur}" in latex
    assert latex.count(r"\begin{tabular}") == latex.count(r"\end{tabular}") == 1
    grouped = report.to_latex(report.build_tables(renamed, groups=True))
    assert r"\multicolumn" not in grouped


# ------------------------------------------------------------------------------------------------ figures


@pytest.fixture
def plots():
    """The figures module; its tests are skipped, not failed, where matplotlib is not installed."""
    pytest.importorskip("matplotlib")
    from zerosiam.bench import plots

    return plots


def test_running_mean_skips_nan(plots):
    np.testing.assert_allclose(plots.running_mean([1.0, 0.0, math.nan, 1.0]), [1.0, 0.5, 0.5, 2 / 3])
    assert np.isnan(plots.running_mean([math.nan, 1.0])[0])


def curves(steps: int, slope: float, with_predictor: bool) -> dict[str, list[float]]:
    t = np.arange(steps, dtype=float)
    nan = [math.nan] * steps
    return {
        "accuracy": list(np.clip(0.7 + slope * t, 0, 1)),
        "logit_norm": list(5 + 0.01 * t),
        "centre_dominance": list(0.3 + 0.001 * t),
        "predictor_drift": list(0.01 * np.sqrt(t)) if with_predictor else nan,
        "entropy": list(1 - 0.003 * t),
        "divergence": list(0.05 + 0 * t) if with_predictor else nan,
    }


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000


def test_diagnostics_figure_is_a_png(plots, tmp_path):
    rows = [
        make_row("zerosiam", "fog", 0.8, curves=curves(50, 0.0, True)),
        make_row("tent", "fog", 0.6, curves=curves(50, -0.005, False)),
        make_row("noadapt", "fog", 0.5),  # no curves at all
    ]
    path = plots.plot_diagnostics(rows, tmp_path / "sub" / "diag.png", title="test")
    assert path == tmp_path / "sub" / "diag.png"
    assert_png(path)
    with pytest.raises(ValueError):
        plots.plot_diagnostics([], tmp_path / "none.png")


def test_the_accuracy_panel_marks_where_a_guard_fired(plots):
    from matplotlib.figure import Figure

    fired = [0.0] * 10
    fired[3] = fired[7] = 1.0
    row = make_row("tent", "fog", 0.6, curves={"accuracy": [0.5] * 10, "guard": fired})
    ax = Figure().subplots()
    plots._draw_panel(
        ax, [row, make_row("noadapt", "fog", 0.6, curves={"accuracy": [0.5] * 10})], ["a", "b"], "accuracy"
    )
    marks = [line for line in ax.get_lines() if line.get_marker() == "v"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [4, 8]  # steps count from 1


def sweep_rows() -> list[dict[str, Any]]:
    """η_f in {1e-4, 1e-3}, η_h in {1e-3, 1e-2, 1e-1}, two seeds, one pair never run."""
    found = []
    for i, lr in enumerate([1e-3, 1e-4]):
        for j, predictor_lr in enumerate([1e-2, 1e-1, 1e-3]):
            if (lr, predictor_lr) == (1e-4, 1e-1):
                continue
            for seed in (0, 1):
                accuracy = 0.5 + 0.1 * i + 0.01 * j + 0.02 * seed
                hparams = {"lr": lr, "predictor_lr": predictor_lr}
                found.append(make_row("zerosiam", "speckle_noise", accuracy, seed=seed, hparams=hparams))
    return found


def test_heatmap_grid_matches_the_sweep(plots, tmp_path):
    row_values, col_values, grid = plots.lr_grid(sweep_rows())
    assert row_values == [1e-4, 1e-3]
    assert col_values == [1e-3, 1e-2, 1e-1]
    assert grid.shape == (2, 3)
    # lr=1e-3 is i=0, predictor_lr=1e-2 is j=0; the seeds add 0 and 2 points, so their mean adds 1
    assert grid[1, 1] == pytest.approx(51.0)
    assert grid[0, 0] == pytest.approx(100 * (0.5 + 0.1 + 0.02) + 1)
    assert np.isnan(grid[0, 2])
    assert np.isfinite(grid).sum() == 5
    path = plots.plot_lr_heatmap(sweep_rows(), tmp_path / "heat.png")
    assert_png(path)


def summary_rows() -> list[dict[str, Any]]:
    """The mild scenario on two models: ``resnet20`` with all six adapting methods and one seed, ZeroSiam
    25 points above NoAdapt (past the colour scale); ``vit`` with Tent and ZeroSiam only, three seeds."""
    found = []
    six = {"tent": 0.60, "sar": 0.61, "eata": 0.62, "deyo": 0.63, "come": 0.64, "zerosiam": 0.65}
    for method, value in {"noadapt": 0.40, **six}.items():
        found += full_line(method, dict.fromkeys(BENCHMARK, value))
    for seed in (0, 1, 2):
        for method, value in {"noadapt": 0.60, "tent": 0.60, "zerosiam": 0.62}.items():
            found += full_line(method, dict.fromkeys(BENCHMARK, value + 0.001 * seed), model="vit", seed=seed)
    return found


def test_summary_figure_marks_one_seed_clipped_and_unranked_cells(plots, tmp_path):
    from zerosiam.bench import summary

    rows = summary_rows()
    found = summary.build_summary(rows)
    assert (found.cell("mild", "resnet20").seeds, found.cell("mild", "vit").seeds) == (1, 3)
    assert plots.summary_text(found, "mild", "resnet20") == "+25.0†\n(1/6)"
    # the table ranks ZeroSiam first of the two that ran; the figure says that four of six did not
    assert found.cell("mild", "vit").text == "+2.0 (1/2)"
    assert plots.summary_text(found, "mild", "vit") == "+2.0\n(2 of 6 ran)"
    grid = plots.summary_grid(found)
    limit = plots.summary_limit(grid)
    assert limit == plots.SUMMARY_SATURATION  # the 25-point cell does not set the scale
    assert plots.summary_clipped(grid, limit).tolist() == [[True, False]]
    assert_png(plots.plot_summary(found, tmp_path / "summary.png"))


# ------------------------------------------------------------------------------------------------ command


def report_main(argv: list[str]) -> int:
    """Run ``zerosiam report`` through a parser holding only this command, so that a sibling command
    that fails to import cannot fail these tests."""
    from zerosiam.cli import report as command

    parser = argparse.ArgumentParser(prog="zerosiam")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return int(args.func(args) or 0)


def run_cli(monkeypatch, rows, argv: list[str]) -> int:
    from zerosiam.cli import report as command

    monkeypatch.setattr(command, "_load_rows", lambda db: rows)
    return report_main(argv)


def test_cli_prints_the_table_and_writes_every_file(plots, monkeypatch, tmp_path, capsys, rows):
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    everything = rows + sweep_rows() + [make_row("tent", "fog", 0.1, model="other")]
    everything[0]["curves"] = curves(20, 0.0, False)
    out = tmp_path / "out"
    code = run_cli(
        monkeypatch,
        everything,
        ["--db", str(db), "--model", "resnet20", "--out", str(out)] + ["--plot", "--heatmap"],
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| NoAdapt |" in printed
    assert "| Gauss. |" in printed
    assert "other" not in printed
    names = sorted(p.name for p in out.iterdir())
    assert {"table.md", "table.csv", "table.tex"} <= set(names)
    assert len([n for n in names if n.startswith("diagnostics_")]) == 1
    assert len([n for n in names if n.startswith("heatmap_")]) == 1
    for png in out.glob("*.png"):
        assert_png(png)
    assert (out / "table.md").read_text(encoding="utf-8") in printed


def test_cli_groups_and_refuses_figures_without_out(monkeypatch, tmp_path, capsys, rows):
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--groups"]) == 0
    assert "| Noise | Blur | Weather | Digital | Avg. |" in capsys.readouterr().out
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--plot"]) == 2
    assert run_cli(monkeypatch, rows, ["--db", str(tmp_path / "absent.db")]) == 2
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--severity", "1"]) == 1
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--by-seed"]) == 0
    assert "| Method | Seed 0 | Avg. |" in capsys.readouterr().out
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--seed", "0"]) == 0
    assert "| Gauss. |" in capsys.readouterr().out
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--seed", "1"]) == 1


def test_cli_reads_a_real_result_store(tmp_path, capsys, rows):
    store_module = pytest.importorskip("zerosiam.bench.store")

    db = tmp_path / "results.db"
    store = store_module.ResultStore(str(db))
    for row in rows:
        store.put(row["run_id"], row["kind"], row["spec"], row["metrics"], row["curves"], row["env"])
    assert report_main(["--db", str(db), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "| Tent | 20.0 ↓ |" in printed
    lines = list(csv.DictReader(io.StringIO((tmp_path / "out" / "table.csv").read_text(encoding="utf-8"))))
    assert len(lines) == 2 * 16


def test_a_table_of_some_corruptions_shows_only_those_and_orders_sweeps_by_value():
    rows = [make_row("noadapt", "fog", 0.5), make_row("noadapt", "snow", 0.6)]
    rows += [make_row("tent", "fog", 0.3, hparams={"lr_scale": scale}) for scale in (10.0, 3.0)]
    table = only_table(rows)
    assert table.columns == ["snow", "fog", "mean"]  # the paper's order; no group means, no average
    assert table.cell("NoAdapt", "mean").mean == pytest.approx(55.0)  # the mean of the two shown
    assert table.cell("Tent (lr_scale=3)", "mean").mean is None  # it lacks snow
    assert only_table(rows[:1]).columns == ["fog"]  # the mean of one corruption would repeat it
    assert table.methods == ["NoAdapt", "Tent (lr_scale=3)", "Tent (lr_scale=10)"]
    assert table.notes == [
        "Tent (lr_scale=3): no result for Snow; the means that need them are left blank.",
        "Tent (lr_scale=10): no result for Snow; the means that need them are left blank.",
    ]


def test_a_stream_sweep_compares_each_line_with_the_noadapt_of_its_stream():
    """Streams of another imbalance ratio hold other samples, so NoAdapt differs between them: Tent at
    ratio 10 is compared with NoAdapt at 10, not with the first NoAdapt line. A field a row lacks and
    one it holds empty (rows stored before and after the field existed) are the same setting."""
    rows = []
    for ratio, noadapt, tent in ((1, 0.70, 0.65), (10, 0.60, 0.62)):
        rows += [make_row("noadapt", "fog", noadapt), make_row("tent", "fog", tent)]
        for row in rows[-2:]:
            row["spec"]["imbalance_ratio"] = ratio
            row["run_id"] += f"-{ratio}"
    rows[0]["spec"]["prelude"] = {}  # stored after the field existed; the others before
    table = only_table(rows)
    assert table.methods == [
        "NoAdapt (imbalance_ratio=1)", "NoAdapt (imbalance_ratio=10)",
        "Tent (imbalance_ratio=1)", "Tent (imbalance_ratio=10)",
    ]  # fmt: skip
    assert table.cell("Tent (imbalance_ratio=1)", "fog").worse  # 65 < 70
    assert not table.cell("Tent (imbalance_ratio=10)", "fog").worse  # 62 > 60, though < 70
    assert table.notes == ["Several NoAdapt lines; each line is compared with the one of its settings."]


def test_a_line_that_leaves_a_setting_to_the_method_says_default():
    runs = [make_row("tent", "fog", 0.5), make_row("tent", "fog", 0.4, hparams={"lr_scale": 3.0})]
    assert only_table(runs).methods == ["Tent (lr_scale=3)", "Tent (lr_scale=default)"]


def test_a_note_counts_each_lines_resets_and_guard_triggers():
    runs = [
        make_row("noadapt", "fog", 0.5),
        make_row("noadapt", "fog", 0.5, seed=1),
        make_row("sar", "fog", 0.6),
        make_row("sar", "fog", 0.6, seed=1),
        make_row("tent", "fog", 0.4, hparams={"lr_scale": 10.0}),
        make_row("tent", "fog", 0.4, seed=1, hparams={"lr_scale": 10.0}),
        make_row("tent", "fog", 0.5),
        make_row("tent", "fog", 0.5, seed=1),
    ]  # every line on both seeds, so that only the events are noted
    runs[2]["metrics"]["recoveries"] = 2
    runs[3]["metrics"]["recoveries"] = 3
    runs[4]["metrics"].update(recoveries=0, guard_triggers=4)
    assert only_table(runs).notes == [
        "Put back, summed over each line's runs: Tent (lr_scale=10) 4 guard triggers; SAR 5 resets."
    ]
    for run in runs:
        run["metrics"].pop("recoveries", None), run["metrics"].pop("guard_triggers", None)
    assert only_table(runs).notes == []  # nothing put back, nothing said


def test_a_cell_below_noadapt_within_the_noise_is_not_marked():
    from zerosiam.bench.noise import Noise

    rows = [make_row("noadapt", "fog", 0.50), make_row("tent", "fog", 0.49), make_row("sar", "fog", 0.40)]
    noise = Noise(sigma={("resnet20", "mild"): 2.0})  # a band of 2·2 = 4 points against a frozen NoAdapt
    table = only_table(rows, noise=noise)
    assert not table.cell("Tent", "fog").worse and table.cell("SAR", "fog").worse
    assert any("1 cell(s) below NoAdapt by no more than the noise" in note for note in table.notes)
    assert only_table(rows).cell("Tent", "fog").worse  # without the rule, any amount below


def test_the_average_is_held_to_the_noise_of_a_mean_over_its_runs(rows):
    from zerosiam.bench.noise import Noise

    tent = dict(TENT, **{name: NOADAPT[name] - 0.01 for name in BENCHMARK})  # 1 point below everywhere
    rows = full_line("tent", tent) + full_line("noadapt", NOADAPT)
    table = only_table(rows, noise=Noise(sigma={("resnet20", "mild"): 1.0}))
    assert not table.cell("Tent", "fog").worse  # one run: a band of 2 points
    assert table.cell("Tent", "avg").worse  # a mean over 15: a band of 2/√15 ≈ 0.52 points


def test_a_table_of_runs_from_two_devices_says_which_line_ran_where():
    rows = [make_row("noadapt", "fog", 0.5), make_row("tent", "fog", 0.6), make_row("sar", "fog", 0.6)]
    rows[1]["env"] = {"gpu": "NVIDIA H100"}
    rows[2]["env"] = {"cpu_model": "AMD EPYC"}
    notes = only_table(rows).notes
    assert any(note.startswith("Runs from 3 devices") and "NVIDIA H100: Tent" in note for note in notes)
    same = [make_row("noadapt", "fog", 0.5), make_row("tent", "fog", 0.6)]
    assert not any("devices" in note for note in only_table(same).notes)
