"""``zerosiam bench`` and ``select-lr`` on a Hugging Face classifier folder, ``--model hf:<folder>``."""

from __future__ import annotations

import pytest

from tests.conftest import needs_assets
from zerosiam.bench.store import ResultStore
from zerosiam.cli import main

pytest.importorskip("transformers")

from tests.zoo.test_hugging_face import save_classifier  # noqa: E402  (needs transformers)

RUN = ["--corruptions", "fog", "--protocols", "mild", "--methods", "noadapt,zerosiam", "--limit", "128"]


def refused(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """The one line a command refuses ``argv`` with (exit code 2)."""
    capsys.readouterr()  # what came before (save_pretrained's progress bar) is not the command's
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("zerosiam: error: ") and err.count("\n") == 1, err
    return err


@needs_assets()
def test_a_saved_hugging_face_classifier_runs_the_benchmark(tmp_path, capsys):
    folder = save_classifier(tmp_path / "vit")  # 16² input: the 32² CIFAR images are resized inside
    db = tmp_path / "hf.db"
    assert main(["bench", "--model", f"hf:{folder}", *RUN, "--backend", "inline", "--db", str(db)]) == 0
    assert "2 run(s) executed" in capsys.readouterr().out
    rows = ResultStore(db).rows("vision")
    assert {row["spec"]["method"] for row in rows} == {"noadapt", "zerosiam"}
    assert all(row["metrics"]["samples"] == 128 for row in rows)


def test_a_folder_without_a_processor_config_is_refused_before_any_work(tmp_path, capsys):
    folder = save_classifier(tmp_path / "vit", processor=False)
    db = tmp_path / "x.db"
    err = refused(capsys, "bench", "--model", f"hf:{folder}", *RUN, "--db", str(db))
    assert f"model 'hf:{folder}'" in err and "preprocessor_config.json" in err and not db.exists()


def test_a_head_of_another_label_space_is_refused_before_any_work(tmp_path, capsys):
    folder = save_classifier(tmp_path / "vit", num_labels=1000)
    db = tmp_path / "x.db"
    err = refused(capsys, "bench", "--model", f"hf:{folder}", *RUN, "--db", str(db))
    assert "has 1000 classes but dataset 'cifar10c' has 10" in err and not db.exists()
    err = refused(capsys, "select-lr", "--model", f"hf:{folder}", "--lr", "1e-3", "--db", str(db))
    assert "has 1000 classes but dataset 'cifar10c' has 10" in err and not db.exists()


def test_select_lr_refuses_a_folder_without_a_processor_config(tmp_path, capsys):
    folder = save_classifier(tmp_path / "vit", processor=False)
    err = refused(capsys, "select-lr", "--model", f"hf:{folder}", "--data-free", "--predictor-lr", "1e-3",
                  "--db", str(tmp_path / "x.db"))  # fmt: skip
    assert "preprocessor_config.json" in err
