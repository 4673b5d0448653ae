"""The summary grid (ZeroSiam − NoAdapt and ZeroSiam's rank per scenario × model) and ``--caption``, on
hand-made result rows."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.test_report import assert_png, full_line, make_row, report_main, run_cli
from zerosiam.bench import report, summary
from zerosiam.corruptions import BENCHMARK

ADAPTING = ("tent", "sar", "eata", "deyo", "come", "zerosiam")


def flat(value: float) -> dict[str, float]:
    """The same accuracy (a fraction) on all 15 corruptions: the average is ``100 * value``."""
    return dict.fromkeys(BENCHMARK, value)


def cell_rows(averages: dict[str, float], **kwargs: Any) -> list[dict[str, Any]]:
    """A full line per method, every corruption at that method's average (a fraction)."""
    return [row for method, value in averages.items() for row in full_line(method, flat(value), **kwargs)]


SEVEN = {"noadapt": 0.60, "tent": 0.55, "sar": 0.61, "eata": 0.62, "deyo": 0.64, "come": 0.63}


def test_difference_and_rank_among_the_six_adapting_methods():
    rows = cell_rows({**SEVEN, "zerosiam": 0.629})
    found = summary.build_summary(rows)
    cell = found.cell("mild", "resnet20")
    assert cell.difference == pytest.approx(2.9)
    # one seed: a lead counts from 1.0 point. DeYO's 1.1 counts, COME's 0.1 does not; ZeroSiam leads SAR
    # (1.9) and Tent (7.9) by margins that count, EATA by 0.9, which does not
    assert (cell.rank, cell.lowest, cell.ranked) == (2, 4, 6)
    assert cell.text == "+2.9 (2–4/6)"
    last = summary.build_summary(cell_rows({**SEVEN, "zerosiam": 0.5})).cell("mild", "resnet20")
    assert last.text == "-10.0 (6/6)"


def test_the_scores_are_the_tables_averages_over_seeds():
    rows = cell_rows({"noadapt": 0.60, "tent": 0.61, "zerosiam": 0.62})
    rows += cell_rows({"noadapt": 0.70, "tent": 0.61, "zerosiam": 0.64}, seed=1)
    (table,) = report.build_tables(rows)
    cell = summary.build_summary(rows).cell("mild", "resnet20")
    expected = table.cell("ZeroSiam", "avg").mean - table.cell("NoAdapt", "avg").mean
    assert cell.difference == pytest.approx(expected) == pytest.approx(63.0 - 65.0)
    assert cell.text == "≈-2.0 (1/2)"  # NoAdapt's seeds spread by 7 points: level with it


def test_a_cell_compares_methods_on_the_seeds_they_all_have_complete():
    """ZeroSiam's seeds 1 and 2 (a hard stream for it) are left out while SAR has only seed 0 complete
    (its seed 1 lacks fog); they count once SAR's have landed."""
    rows = cell_rows({"noadapt": 0.60, "sar": 0.64, "zerosiam": 0.66})
    for seed in (1, 2):
        rows += cell_rows({"noadapt": 0.60, "zerosiam": 0.58}, seed=seed)
    partial = rows + without(cell_rows({"sar": 0.5}, seed=1), "sar", "fog")
    assert summary.build_summary(partial).cell("mild", "resnet20").text == "+6.0 (1/2)"  # seed 0 alone
    for seed in (1, 2):
        rows += cell_rows({"sar": 0.5}, seed=seed)
    # all three seeds: ZeroSiam 60.7 ± 4.6, SAR 54.7 ± 8.1; a lead of 6.0 inside the spreads is level
    assert summary.build_summary(rows).cell("mild", "resnet20").text == "≈+0.7 (1–2/2)"
    no_shared = cell_rows({"noadapt": 0.60, "zerosiam": 0.66}, seed=1) + cell_rows({"sar": 0.6})
    assert summary.build_summary(no_shared).cell("mild", "resnet20").text == report.MISSING


def test_with_one_seed_a_lead_counts_from_one_point():
    rows = cell_rows({"noadapt": 0.60, "tent": 0.64, "sar": 0.6399, "zerosiam": 0.63})
    assert summary.build_summary(rows).cell("mild", "resnet20").text == "+3.0 (2–3/3)"  # SAR 0.99 ahead
    rows = cell_rows({"noadapt": 0.60, "tent": 0.62, "sar": 0.6201, "zerosiam": 0.63})
    assert summary.build_summary(rows).cell("mild", "resnet20").text == "+3.0 (1–2/3)"  # leads Tent by 1.0


def test_with_seeds_a_lead_counts_from_half_a_point_and_beyond_the_stds_added():
    def seeded(sar: tuple[float, float, float]) -> list[dict[str, Any]]:
        """ZeroSiam at 63 ± 0.1 over three seeds, SAR at ``sar`` (fractions) per seed."""
        rows = []
        for seed, (accuracy, ours) in enumerate(zip(sar, (0.629, 0.630, 0.631), strict=True)):
            rows += cell_rows({"noadapt": 0.60, "sar": accuracy, "zerosiam": ours}, seed=seed)
        return rows

    def text(rows: list[dict[str, Any]]) -> str:
        return summary.build_summary(rows).cell("mild", "resnet20").text

    assert text(seeded((0.635, 0.635, 0.635))) == "+3.0 (2/2)"  # 0.5 ahead, stds 0 + 0.1
    assert text(seeded((0.6349, 0.6349, 0.6349))) == "+3.0 (1–2/2)"  # 0.49 ahead: under half a point
    assert text(seeded((0.628, 0.638, 0.648))) == "+3.0 (1–2/2)"  # 0.8 ahead, stds 1.0 + 0.1
    assert text(seeded((0.615, 0.615, 0.615))) == "+3.0 (1/2)"  # 1.5 behind


def without(rows: list[dict[str, Any]], method: str, corruption: str) -> list[dict[str, Any]]:
    """``rows`` less ``method``'s run on ``corruption``."""
    return [row for row in rows if (row["spec"]["method"], row["spec"]["corruption"]) != (method, corruption)]


def test_a_missing_corruption_or_a_missing_noadapt_gives_a_dash():
    rows = cell_rows({"noadapt": 0.60, "tent": 0.61, "zerosiam": 0.62})
    assert summary.build_summary(without(rows, "zerosiam", "fog")).cell("mild", "resnet20").text == "–"
    tent_lacks_fog = summary.build_summary(without(rows, "tent", "fog"))
    assert tent_lacks_fog.cell("mild", "resnet20").text == "+2.0 (1/1)"  # Tent has no average to rank
    no_noadapt = [row for row in rows if row["spec"]["method"] != "noadapt"]
    assert summary.build_summary(no_noadapt).cell("mild", "resnet20").text == report.MISSING


def test_mixed_reads_the_overall_accuracy_and_rows_follow_the_scenario_order():
    rows = cell_rows({"noadapt": 0.60, "zerosiam": 0.62}, protocol="label_shift_bs1")
    rows += cell_rows({"noadapt": 0.60, "zerosiam": 0.61}, protocol="mild", model="vit")
    for method, overall in (("noadapt", 0.50), ("zerosiam", 0.535)):
        rows.append(make_row(method, "mixed", overall, protocol="mixed", per_domain={"fog": 0.1}))
    found = summary.build_summary(rows)
    assert found.scenarios == ["mild", "label_shift_bs1", "mixed"]
    assert found.models == ["resnet20", "vit"]
    assert found.cell("mixed", "resnet20").text == "+3.5 (1/1)"  # the stream's accuracy, not per_domain
    assert found.cell("mild", "resnet20").text == report.MISSING  # never run
    text = summary.to_markdown(found)
    assert text.splitlines()[0].startswith("ZeroSiam − NoAdapt on CIFAR-10-C, severity 5, in accuracy points")
    assert "| Scenario | resnet20 | vit |" in text
    assert "| mild | – | +1.0 (1/1) |" in text


def test_every_protocol_has_a_place_in_the_scenario_order():
    from zerosiam.protocols import PROTOCOLS

    assert set(summary.SCENARIOS) == set(PROTOCOLS)


def test_an_ambiguous_cell_is_an_error_naming_the_cell_and_the_variants():
    rows = cell_rows({"noadapt": 0.60, "zerosiam": 0.62}, protocol="label_shift")
    rows += full_line("tent", flat(0.6), protocol="label_shift", hparams={"lr": 0.001})
    rows += full_line("tent", flat(0.6), protocol="label_shift", hparams={"lr": 0.01})
    with pytest.raises(
        summary.AmbiguousCell, match=r"label_shift × resnet20 .*Tent \(lr=0.001\), Tent \(lr=0.01\)"
    ):
        summary.build_summary(rows)
    rows = cell_rows({"noadapt": 0.60, "zerosiam": 0.62}) + cell_rows({"noadapt": 0.6}, severity=3)
    with pytest.raises(summary.AmbiguousCell, match="cifar10c severity 3, cifar10c severity 5"):
        summary.build_summary(rows)


# ------------------------------------------------------------------------------------------------ command


def test_cli_prints_the_summary_and_writes_its_markdown_and_heat_map(monkeypatch, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    rows = cell_rows({**SEVEN, "zerosiam": 0.629}) + cell_rows(
        {"noadapt": 0.6, "zerosiam": 0.58}, model="vit"
    )
    rows += cell_rows({"noadapt": 0.6, "zerosiam": 0.7}, protocol="label_shift")
    out = tmp_path / "out"
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--summary", "--out", str(out), "--plot"]) == 0
    printed = capsys.readouterr().out
    assert "| label_shift | +10.0 (1/1) | – |" in printed
    assert "| mild | +2.9 (2–4/6) | -2.0 (1/1) |" in printed
    assert (out / "summary.md").read_text(encoding="utf-8") in printed
    assert sorted(path.name for path in out.iterdir()) == ["summary.md", "summary.png"]
    assert_png(out / "summary.png")


def test_cli_reports_an_ambiguous_cell_in_one_line_and_exits_2(monkeypatch, tmp_path, capsys):
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    rows = cell_rows({"noadapt": 0.6}) + full_line("zerosiam", flat(0.6), hparams={"alpha": 0.5})
    rows += full_line("zerosiam", flat(0.6), hparams={"alpha": 1.0})
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--summary"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "mild × resnet20" in error and "ZeroSiam (alpha=0.5), ZeroSiam (alpha=1)" in error
    assert "--grid" in error and "--methods" in error
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--summary", "--groups"]) == 2
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--summary", "--severity", "1"]) == 1


def test_caption_turns_every_heading_into_a_bold_line(monkeypatch, tmp_path, capsys):
    db = tmp_path / "results.db"
    db.write_bytes(b"")
    rows = cell_rows({"noadapt": 0.6, "tent": 0.55}) + cell_rows({"noadapt": 0.6}, protocol="label_shift")
    assert run_cli(monkeypatch, rows, ["--db", str(db)]) == 0
    headed = capsys.readouterr().out
    assert run_cli(monkeypatch, rows, ["--db", str(db), "--caption", "--out", str(tmp_path / "out")]) == 0
    captioned = capsys.readouterr().out
    titles = [table.title for table in report.build_tables(rows)]
    assert [line for line in headed.splitlines() if line.startswith("#")] == [f"### {t}" for t in titles]
    assert "#" not in captioned
    assert [line for line in captioned.splitlines() if line.startswith("**")] == [f"**{t}**" for t in titles]
    assert headed.replace("### ", "") == captioned.replace("**", "").split("wrote ")[0]
    assert (tmp_path / "out" / "table.md").read_text(encoding="utf-8").startswith(f"**{titles[0]}**\n")


def test_several_grids_keep_the_union_of_their_runs(fake_domains, tiny_model, tmp_path, capsys):
    from zerosiam.bench.grid import Execution, Grid, execute
    from zerosiam.bench.store import ResultStore

    db = tmp_path / "study.db"
    store = ResultStore(db)
    files = []
    for protocol in ("mild", "label_shift"):
        text = f"models: [tiny]\nmethods: [noadapt, zerosiam]\ncorruptions: [fog]\nprotocols: [{protocol}]\n"
        files.append(tmp_path / f"{protocol}.yaml")
        files[-1].write_text(text)
        execute(Grid.from_yaml(files[-1]).specs(), store, Execution(backend="inline", progress=False))
    other = Grid(models=["tiny"], methods=["zerosiam"], corruptions=["fog"], hparams={"alpha": 0.5})
    execute(other.specs(), store, Execution(backend="inline", progress=False))  # same table, not a grid's
    grids = [flag for path in files for flag in ("--grid", str(path))]
    assert report_main(["--db", str(db), *grids]) == 0
    titles = [line for line in capsys.readouterr().out.splitlines() if line.startswith("### ")]
    assert [title.split(", ")[2] for title in titles] == ["protocol label_shift", "protocol mild"]
    assert report_main(["--db", str(db), *grids, "--summary"]) == 0
    printed = capsys.readouterr().out
    assert "| Scenario | tiny |" in printed
    assert [line.split(" | ")[0] for line in printed.splitlines()[4:]] == ["| mild", "| label_shift"]
    assert report_main(["--db", str(db), "--summary"]) == 2  # without the grids, the alpha run is a variant
    assert report_main(["--db", str(db), "--grid", str(files[0]), "--grid", str(tmp_path / "no.yaml")]) == 2
