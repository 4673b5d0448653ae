"""One language-model run: (model, dataset, method, rates, seed) → accuracy, timings and curves.

The language harness shares the vision harness's run identity (``run_id_for`` of the spec), its
environment record and its result store; its rows are of kind ``llm``. Every run starts from a copy of
the same pristine model, so runs are independent of their order, and a run that is already stored is
skipped, so an interrupted grid resumes where it stopped. Rows are written with the names the image
runs use (``predictor_lr``, ``predictor_drift``); rows stored before the rename keep theirs, and
``language_table.current_names`` reads both alike.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from zerosiam.bench.device import describe_device
from zerosiam.bench.environment import environment
from zerosiam.bench.language_table import STORED_SPEC_NAMES
from zerosiam.bench.store import Failure, ResultStore, run_id_for, signals_deferred
from zerosiam.llm.adapter import LMAdapter, LMSettings
from zerosiam.llm.deprecated import renamed_fields, warn_renamed
from zerosiam.llm.loop import run_online, summarise
from zerosiam.llm.math_data import get_dataset, load_problems
from zerosiam.llm.model import DEFAULT_LORA_TARGETS, load_causal_lm
from zerosiam.methods import get_recipe

KIND = "llm"
PACKAGES = ("transformers", "peft")  # recorded in the environment of language rows


@renamed_fields(lr_predictor="predictor_lr")
@dataclass(frozen=True)
class LanguageRunSpec:
    """Everything that determines a language run's numbers, and hence its identity in the store.

    ``lr`` defaults to the paper's rate for the dataset (``methods.hparams.LANGUAGE_RATES``);
    ``predictor_lr`` to ``lr``, as in the paper.
    """

    model: str
    dataset: str
    method: str
    limit: int | None = None
    seed: int = 0
    max_new_tokens: int = 256
    lr: float | None = None
    predictor_lr: float | None = None
    k: int = 8
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS

    def __post_init__(self) -> None:
        get_dataset(self.dataset)
        get_recipe(self.method, "text")
        if self.lr is None:
            object.__setattr__(self, "lr", get_dataset(self.dataset).learning_rate)
        self.settings()  # checks k, max_new_tokens and the rates

    def as_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["lora_targets"] = list(self.lora_targets)
        return values

    @property
    def run_id(self) -> str:
        """The sha256 of the spec, with each field under the name it had when the first rows were stored
        (``lr_predictor`` for ``predictor_lr``): a rename keeps every stored run's id, so a store written
        before it resumes instead of running its runs again."""
        identity = {STORED_SPEC_NAMES.get(key, key): value for key, value in self.as_dict().items()}
        return run_id_for(identity)

    def settings(self) -> LMSettings:
        return LMSettings(
            lr=self.lr,
            predictor_lr=self.predictor_lr,
            k=self.k,
            lora_rank=self.lora_rank,
            lora_targets=tuple(self.lora_targets),
            max_new_tokens=self.max_new_tokens,
        )

    def config(self) -> LMSettings:
        """Deprecated: ``settings()``."""
        warn_renamed("LanguageRunSpec.config()", "LanguageRunSpec.settings()")
        return self.settings()


def execute_run(
    spec: LanguageRunSpec, base: torch.nn.Module, tokenizer: Any, mirror: str | None, progress: bool
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """One (dataset, method) run from a copy of the pristine model; returns (metrics, curves)."""
    problems = load_problems(spec.dataset, limit=spec.limit, seed=spec.seed, mirror=mirror)
    torch.manual_seed(spec.seed)
    adapter = LMAdapter(copy.deepcopy(base), spec.method, spec.settings())
    label = f"{spec.method}/{spec.dataset}"
    with tqdm(total=len(problems), desc=label, disable=not progress, file=sys.stderr) as bar:
        records = run_online(adapter, tokenizer, problems, progress=bar)
    return summarise(records)


def execute(
    specs: Sequence[LanguageRunSpec],
    store: ResultStore,
    mirror: str | None = None,
    progress: bool = True,
    device: torch.device | str = "cpu",
) -> list[Failure]:
    """Run the specs not yet in ``store`` (loading each model once), storing each row as it finishes
    and each failure as it happens; returns the failures. A failed run does not stop the others."""
    todo = [spec for spec in specs if not store.has(spec.run_id)]
    failures = []
    for model in dict.fromkeys(spec.model for spec in todo):
        base, tokenizer = load_causal_lm(model)
        base = base.to(device)
        env = {**environment(PACKAGES), **describe_device(torch.device(device))}
        for spec in (s for s in todo if s.model == model):
            try:
                metrics, curves = execute_run(spec, base, tokenizer, mirror, progress)
            except Exception as error:
                failures.append(Failure.of(spec.as_dict(), error))
                with signals_deferred():
                    store.put_failure(spec.run_id, KIND, failures[-1])
                continue
            with signals_deferred():
                store.put(spec.run_id, KIND, spec.as_dict(), metrics, curves, env)
    return failures
