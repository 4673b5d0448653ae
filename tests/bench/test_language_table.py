"""The language table: methods in the one display order of every report, datasets as given, averages."""

from __future__ import annotations

from zerosiam.bench.language_table import markdown_table


def test_markdown_table_orders_methods_and_averages():
    rows = [
        {"spec": {"method": m, "dataset": d}, "metrics": {"accuracy": a}}
        for m, d, a in [
            ("zerosiam", "gsm8k", 0.2),
            ("noadapt", "gsm8k", 0.1),
            ("noadapt", "math500", 0.0),
            ("zerosiam", "math500", 0.1),
            ("zerosiam", "math500", 0.3),
        ]
    ]
    table = markdown_table(rows, datasets=["math500", "gsm8k"]).splitlines()
    assert table[0] == "| Method | Math-500 | GSM8K | Average |"
    assert table[2] == "| NoAdapt | 0.0 | 10.0 | 5.0 |"
    assert table[3] == "| ZeroSiam | 20.0 (n=2) | 20.0 | 20.0 |"
    assert markdown_table([]) == "(no results)"
