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


def test_predictor_lr_option_and_its_old_spelling(capsys):
    from zerosiam.cli import build_parser
    from zerosiam.cli.llm import _spec_values

    new = build_parser().parse_args(["llm", "--predictor-lr", "0.25", "--db", "x.db"])
    assert new.predictor_lr == 0.25 and capsys.readouterr().err == ""
    assert _spec_values(new)[0]["predictor_lr"] == 0.25
    old = build_parser().parse_args(["llm", "--lr-predictor", "0.5", "--db", "x.db"])
    assert old.predictor_lr == 0.5 and _spec_values(old)[0]["predictor_lr"] == 0.5
    assert capsys.readouterr().err == "zerosiam: warning: --lr-predictor is deprecated; use --predictor-lr\n"
    assert build_parser().parse_args(["llm", "--db", "x.db"]).predictor_lr is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["llm", "--lr-predictor", "fast"])
    assert "invalid float value" in capsys.readouterr().err


def test_help_shows_only_the_new_option(capsys):
    from zerosiam.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["llm", "--help"])
    shown = capsys.readouterr().out
    assert "--predictor-lr" in shown and "--lr-predictor" not in shown.split("options:")[-1]
