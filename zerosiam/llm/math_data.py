"""The five math benchmarks as lists of (id, question, reference answer), from the verified mirror.

Each dataset ships its answer differently, and getting that wrong silently scores every model zero:
MATH-500, AIME24 and CollegeMath have an ``answer`` field (CollegeMath's wrapped in ``$``), GSM8K puts
it after ``####`` at the end of the worked answer, and Minerva has only a worked solution whose last
``\\boxed{}`` is the answer. CollegeMath is sub-sampled to 1,200 questions with a fixed seed, as in
the paper. ``limit``/``seed`` then take a seeded random subset, so small runs are still unbiased.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosiam.llm.answers import reference_from_solution
from zerosiam.methods.hparams import LANGUAGE_RATES

COLLEGE_MATH_SAMPLE = 1200  # paper: CollegeMath sampled to 1,200 questions
COLLEGE_MATH_SEED = 0


@dataclass(frozen=True)
class MathProblem:
    """One question with its reference answer, as the online loop consumes it."""

    id: str
    question: str
    reference: str


@dataclass(frozen=True)
class MathDataset:
    """Where a dataset lives (asset name in ``zerosiam.assets``) and how to read one row."""

    name: str
    asset: str
    question_key: str
    reference: Callable[[dict[str, Any]], str]

    @property
    def learning_rate(self) -> float:
        """The paper's η_f (and η_h) for this dataset, from ``zerosiam.methods.hparams.LANGUAGE_RATES``."""
        return LANGUAGE_RATES[self.name].lr


def _field(key: str) -> Callable[[dict[str, Any]], str]:
    def read(row: dict[str, Any]) -> str:
        return str(row[key]).strip()

    return read


def _college_answer(row: dict[str, Any]) -> str:
    answer = str(row["answer"]).strip()
    if len(answer) >= 2 and answer.startswith("$") and answer.endswith("$") and answer.count("$") == 2:
        answer = answer[1:-1].strip()
    return answer


def _gsm8k_answer(row: dict[str, Any]) -> str:
    worked = str(row["answer"])
    if "####" not in worked:
        raise ValueError(f"GSM8K row without '####' answer marker: {worked[-80:]!r}")
    return worked.rsplit("####", 1)[1].strip().replace(",", "")


def _minerva_answer(row: dict[str, Any]) -> str:
    return reference_from_solution(str(row["solution"]))


DATASETS: dict[str, MathDataset] = {
    "math500": MathDataset("math500", "math-math500", "problem", _field("answer")),
    "collegemath": MathDataset("collegemath", "math-college", "question", _college_answer),
    "aime24": MathDataset("aime24", "math-aime24", "problem", _field("answer")),
    "minerva": MathDataset("minerva", "math-minerva", "problem", _minerva_answer),
    "gsm8k": MathDataset("gsm8k", "math-gsm8k", "question", _gsm8k_answer),  # not in the paper
}


def get_dataset(name: str) -> MathDataset:
    try:
        return DATASETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown math dataset {name!r}; choose one of {sorted(DATASETS)}") from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file; a malformed line is reported with its number."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not JSON ({error})") from None
    return rows


def dataset_path(name: str, mirror: str | Path | None = None) -> Path:
    """Checksum-verified local path of a dataset's file (mirror first; see zerosiam.assets)."""
    from zerosiam.assets import fetch

    return fetch(get_dataset(name).asset, mirror=mirror, download=False)


def problems_from_rows(name: str, rows: list[dict[str, Any]]) -> list[MathProblem]:
    """Turn raw rows into problems, applying the dataset's answer format (and CollegeMath's sample)."""
    dataset = get_dataset(name)
    indexed = list(enumerate(rows))
    if dataset.name == "collegemath" and len(indexed) > COLLEGE_MATH_SAMPLE:
        indexed = random.Random(COLLEGE_MATH_SEED).sample(indexed, COLLEGE_MATH_SAMPLE)
    return [
        MathProblem(f"{dataset.name}-{index}", str(row[dataset.question_key]).strip(), dataset.reference(row))
        for index, row in indexed
    ]


def load_problems(
    name: str, limit: int | None = None, seed: int = 0, mirror: str | Path | None = None
) -> list[MathProblem]:
    """The dataset's problems; with ``limit``, a random subset of that size drawn with ``seed``."""
    problems = problems_from_rows(name, read_jsonl(dataset_path(name, mirror)))
    if limit is not None:
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        problems = random.Random(seed).sample(problems, min(limit, len(problems)))
    return problems
