"""``zerosiam llm``: flags are parsed, and unknown names are refused before any model is loaded."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_cli_parses_and_rejects_unknown_names_before_loading_a_model(tmp_path):
    from zerosiam.cli import build_parser

    args = build_parser().parse_args(
        ["llm", "--dataset", "math500,gsm8k", "--methods", "noadapt,zerosiam", "--limit", "3", "--db", "x.db"]
    )
    assert (
        args.datasets == ["math500", "gsm8k"] and args.methods == ["noadapt", "zerosiam"] and args.limit == 3
    )
    for flag, value, message in [
        ("--dataset", "math5000", "unknown math dataset"),
        ("--methods", "tnet", "unknown method 'tnet' for text"),
        ("--methods", "deyo", "supports image only, not text"),
    ]:
        bad = build_parser().parse_args(["llm", flag, value, "--db", str(tmp_path / "r.db")])
        with pytest.raises(ValueError, match=message):
            bad.func(bad)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["llm", "--limit", "0"])
