"""docs/RESULTS.md's tables are what their commands print from the committed store."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # the report commands over the whole committed store


def _results_doc():
    spec = importlib.util.spec_from_file_location("results_doc", ROOT / "benchmarks" / "results_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STORE = "docs/results/study"  # the committed store, as text (zerosiam.bench.textstore)


def test_every_table_of_the_results_pages_is_regenerated_from_the_committed_store():
    results_doc = _results_doc()
    for document, least in zip(results_doc.DOCUMENTS, (3, 1), strict=True):
        text = document.read_text(encoding="utf-8")
        assert text.count(f"<!-- zerosiam report --db {STORE} ") >= least, document.name
        fresh, changed = results_doc.regenerate(text)
        assert changed == [] and fresh == text, document.name


def test_a_table_edited_by_hand_is_caught():
    results_doc = _results_doc()
    text = results_doc.DOCUMENT.read_text(encoding="utf-8")
    command = f"zerosiam report --db {STORE} --grid docs/results/grids/label_shift.yaml --caption"
    opening = f"<!-- {command} -->\n"
    start = text.index(opening) + len(opening)
    edited = text[:start] + "| Tent | 99.9 |\n" + text[start:]
    fresh, changed = results_doc.regenerate(edited)
    assert changed == [command] and fresh == text


def test_the_summary_figure_was_drawn_from_the_summary_table_on_the_page():
    """``--summary --out DIR --plot`` writes ``summary.md`` beside ``summary.png``, from the same numbers: a
    page whose summary block changed while the figure was not redrawn is caught here."""
    results_doc = _results_doc()
    text = results_doc.DOCUMENT.read_text(encoding="utf-8")
    (body,) = [body for _, command, body, _ in results_doc.BLOCK.findall(text) if "--summary" in command]
    drawn_from = ROOT / "docs" / "results" / "summary" / "summary.md"
    assert drawn_from.read_text(encoding="utf-8") == body
