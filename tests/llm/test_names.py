"""The language learner speaks the image learner's vocabulary (issue 37), and its old names still work.

New names: ``LMSettings`` (as ``Settings``), ``predictor_lr`` (η_h), ``predictor_drift`` (‖θ_h − I‖_F),
``LMAdapter(settings=…)``. Each old one (``LMConfig``, ``lr_predictor``, ``predictor_distance``,
``config``) works for one release with a ``DeprecationWarning`` that points at the caller's line. Rows
stored under the old names keep their run ids and are read under the new ones; the paper's language
rates live in ``methods.hparams`` beside the image rates.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import pytest
import torch

from zerosiam.bench.language import LanguageRunSpec
from zerosiam.bench.language_table import current_names, markdown_table
from zerosiam.bench.store import run_id_for
from zerosiam.llm import adapter as adapter_module
from zerosiam.llm.adapter import LMAdapter, LMSettings, StepRecord
from zerosiam.llm.loop import QuestionRecord, summarise
from zerosiam.llm.math_data import DATASETS, get_dataset
from zerosiam.methods.hparams import LANGUAGE_RATES


def deprecated(match: str):
    """``pytest.warns`` for one DeprecationWarning whose message names the new spelling."""
    return pytest.warns(DeprecationWarning, match=match)


def assert_no_warning(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return make()


# ------------------------------------------------------------------------------------------ settings
def test_new_names_work_without_a_warning():
    settings = assert_no_warning(lambda: LMSettings(lr=1e-3, predictor_lr=2e-3))
    assert (settings.lr, settings.predictor_lr) == (1e-3, 2e-3)
    assert LMSettings(1e-3, 2e-3).predictor_lr == 2e-3  # the positional order is as before
    assert [f.name for f in dataclasses.fields(LMSettings)][:2] == ["lr", "predictor_lr"]
    record = assert_no_warning(lambda: StepRecord(predictor_drift=0.5))
    assert record.predictor_drift == 0.5
    spec = assert_no_warning(lambda: LanguageRunSpec("m", "math500", "zerosiam", predictor_lr=1e-4))
    assert spec.predictor_lr == 1e-4 and spec.settings().predictor_lr == 1e-4


def test_old_keyword_still_works_and_warns_at_the_callers_line():
    with deprecated("predictor_lr=") as caught:
        settings = LMSettings(lr_predictor=2e-3)
    assert settings.predictor_lr == 2e-3 and settings == LMSettings(predictor_lr=2e-3)
    assert caught[0].filename == __file__  # the warning points at the line that used the old name
    with deprecated("LMSettings.predictor_lr"):
        assert settings.lr_predictor == 2e-3
    with pytest.raises(TypeError, match="both lr_predictor= and its new name predictor_lr="), deprecated("="):
        LMSettings(lr_predictor=1.0, predictor_lr=2.0)
    with deprecated("predictor_lr="):
        spec = LanguageRunSpec("m", "math500", "zerosiam", lr_predictor=1e-4)
    assert spec == LanguageRunSpec("m", "math500", "zerosiam", predictor_lr=1e-4)
    with deprecated("LanguageRunSpec.predictor_lr"):
        assert spec.lr_predictor == 1e-4
    with deprecated(r"LanguageRunSpec.settings\(\)"):
        assert spec.config() == spec.settings()
    with deprecated("predictor_drift="):
        record = StepRecord(predictor_distance=0.25)
    with deprecated("StepRecord.predictor_drift"):
        assert record.predictor_distance == record.predictor_drift == 0.25


def test_lmconfig_is_a_deprecated_alias_of_lmsettings():
    with deprecated("use LMSettings") as caught:
        from zerosiam.llm.adapter import LMConfig
    assert LMConfig is LMSettings and caught[0].filename == __file__
    with deprecated("use LMSettings"):
        assert adapter_module.LMConfig(lr=1e-3) == LMSettings(lr=1e-3)
    with pytest.raises(AttributeError, match="no attribute 'LMConfg'"):
        adapter_module.LMConfg  # noqa: B018


# ------------------------------------------------------------------------------------------- adapter
@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.llm.goldens import tiny_llama

    return tiny_llama(initializer_range=0.02)


def test_adapter_takes_settings_and_still_takes_config(base):
    settings = LMSettings(lr=1e-2, predictor_lr=0.5, max_new_tokens=4)
    adapter = assert_no_warning(lambda: LMAdapter(copy.deepcopy(base), "zerosiam", settings=settings))
    assert adapter.settings is settings
    assert [group["lr"] for group in adapter.optimizer.param_groups] == [1e-2, 0.5]
    with deprecated("settings="):
        old = LMAdapter(copy.deepcopy(base), "zerosiam", config=settings)
    assert old.settings is settings
    with deprecated("LMAdapter.settings"):
        assert old.config is settings
    with pytest.raises(TypeError, match="both config= and its new name settings="), deprecated("settings="):
        LMAdapter(copy.deepcopy(base), "zerosiam", settings, config=settings)


def test_predictor_drift_is_recorded_and_the_old_method_still_answers(base):
    torch.manual_seed(0)
    settings = LMSettings(lr=0.0, predictor_lr=0.5, max_new_tokens=4)
    adapter = LMAdapter(copy.deepcopy(base), "zerosiam", settings)
    assert adapter.predictor_drift() == 0.0
    ids = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(1))
    record = adapter.adapt(ids, adapter.answer(ids))
    assert record.predictor_drift == adapter.predictor_drift() > 0
    with deprecated(r"LMAdapter.predictor_drift\(\)"):
        assert adapter.predictor_distance() == adapter.predictor_drift()
    tent = LMAdapter(copy.deepcopy(base), "tent", LMSettings(max_new_tokens=4))
    assert math.isnan(tent.predictor_drift())


# --------------------------------------------------------------------------------- records and rows
def test_question_record_declares_only_what_a_step_record_does_not():
    own = QuestionRecord.__annotations__  # the fields this class declares itself
    assert issubclass(QuestionRecord, StepRecord)
    assert not set(own) & {f.name for f in dataclasses.fields(StepRecord)}
    diagnostics = dict(loss=1.0, entropy=2.0, divergence=0.5, predictor_drift=0.1, updated=True)
    step = StepRecord(**diagnostics, stats={"selected": 3.0})
    answer = dict(id="q", reference="2", prediction="2", correct=True, new_tokens=3)
    record = QuestionRecord.of(step, **answer, generate_s=1.0, adapt_s=0.5, text="2")
    assert (record.loss, record.predictor_drift, record.updated, record.correct) == (1.0, 0.1, True, True)
    metrics, curves = summarise([record])
    assert metrics["final_predictor_drift"] == 0.1 and curves["predictor_drift"] == [0.1]
    assert "stats" not in curves and "final_predictor_distance" not in metrics
    names = {"id", "reference", "prediction", "correct", "new_tokens", "generate_s", "adapt_s", "loss"}
    assert set(curves) == names | {"entropy", "divergence", "predictor_drift", "updated", "text"}


def test_language_run_ids_are_those_of_the_rows_stored_before_the_rename():
    # Computed before the rename, when the field was lr_predictor: a store written then still resumes.
    assert LanguageRunSpec("smollm2-135m", "math500", "zerosiam").run_id == (
        "9cedad1dd3e9741b6271afab15b7771038a906e8878f825436a498f597b9be04"
    )
    spec = LanguageRunSpec("smollm2-135m", "gsm8k", "zerosiam", limit=5, lr=1e-5, predictor_lr=2e-5)
    assert spec.run_id == "3ba163ba730e6a22e71b32851f1f73c4fb72acb11d9fc6e6ff51206ec0d40f84"
    values = spec.as_dict()
    assert values["predictor_lr"] == 2e-5 and "lr_predictor" not in values  # rows are written anew
    old = {("lr_predictor" if key == "predictor_lr" else key): value for key, value in values.items()}
    assert spec.run_id == run_id_for(old)


def test_rows_stored_under_the_old_names_are_read_under_the_new_ones():
    old = {
        "run_id": "a",
        "spec": {"method": "zerosiam", "dataset": "math500", "lr_predictor": 1e-4},
        "metrics": {"accuracy": 0.5, "final_predictor_distance": 0.25},
        "curves": {"predictor_distance": [0.1, 0.25], "loss": [1.0, 2.0]},
    }
    new = {
        "run_id": "b",
        "spec": {"method": "zerosiam", "dataset": "math500", "predictor_lr": 1e-4},
        "metrics": {"accuracy": 0.7, "final_predictor_drift": 0.75},
    }
    read = current_names(old)
    assert read["spec"]["predictor_lr"] == 1e-4 and read["metrics"]["final_predictor_drift"] == 0.25
    assert read["curves"] == {"predictor_drift": [0.1, 0.25], "loss": [1.0, 2.0]} and read["run_id"] == "a"
    assert old["metrics"] == {"accuracy": 0.5, "final_predictor_distance": 0.25}  # the row is not changed
    assert current_names(new) == new
    table = markdown_table([old, new], metric="final_predictor_drift", scale=1.0, digits=2)
    assert table.splitlines()[2] == "| ZeroSiam | 0.50 (n=2) |"


# --------------------------------------------------------------------------------------------- rates
def test_the_paper_language_rates_live_in_the_one_table():
    paper = {"math500": 7.5e-6, "collegemath": 5e-6, "aime24": 1.25e-5, "minerva": 5e-6, "gsm8k": 7.5e-6}
    assert set(LANGUAGE_RATES) == set(DATASETS) == set(paper)
    for name, rate in paper.items():
        assert LANGUAGE_RATES[name].lr == rate == get_dataset(name).learning_rate
        assert LANGUAGE_RATES[name].predictor_lr == rate  # η_h = η_f: what predictor_lr=None gives
    assert LMSettings().lr == LANGUAGE_RATES["math500"].lr and LMSettings().predictor_lr is None
    assert LanguageRunSpec("m", "aime24", "tent").lr == 1.25e-5
