"""The online protocol: questions one at a time, answer with the current weights, score, then adapt.

The answer to question t is produced before the update on question t (as in every TTA method here:
the prediction comes from the weights that have seen questions 1 … t−1 only). Each question's record
holds the extracted answer, correctness, timings and the step's diagnostics; ``summarise`` turns them
into the run's metrics and curves for the result store, named as the image runs name theirs
(``predictor_drift``; ``zerosiam.bench.language_table.current_names`` reads rows stored before).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from zerosiam.llm.adapter import LMAdapter, StepRecord
from zerosiam.llm.answers import score
from zerosiam.llm.math_data import MathProblem

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def prompt_ids(tokenizer: Any, question: str) -> Tensor:
    """Token ids [1, L] of the question as a user turn of the chat template (plain text without one)."""
    text = f"{question.strip()}\n{INSTRUCTION}"
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = encoded if isinstance(encoded, Tensor) else encoded["input_ids"]
    else:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return torch.as_tensor(ids).view(1, -1)


def stop_tokens(tokenizer: Any) -> list[int] | None:
    """End-of-sequence ids: the tokenizer's EOS and, for chat models, the end-of-turn token."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        found = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if isinstance(found, int) and found >= 0:
            ids.add(found)
    return sorted(ids) or None


@dataclass(kw_only=True)
class QuestionRecord(StepRecord):
    """What happened on one question: the answer, its score and timings, and the update's diagnostics
    (the ``StepRecord`` that ``LMAdapter.adapt`` returned)."""

    id: str
    reference: str
    prediction: str | None
    correct: bool
    new_tokens: int
    generate_s: float
    adapt_s: float
    text: str  # the generated answer, kept so that runs can be compared token by token

    @classmethod
    def of(cls, step: StepRecord, **answer: Any) -> QuestionRecord:
        """The record of a question whose update gave ``step``."""
        return cls(**{f.name: getattr(step, f.name) for f in fields(StepRecord)}, **answer)


def answer_and_adapt(adapter: LMAdapter, tokenizer: Any, problem: MathProblem) -> tuple[QuestionRecord, str]:
    """Generate, score and adapt on one question; returns its record and the generated text."""
    ids = prompt_ids(tokenizer, problem.question).to(adapter.device)
    start = time.perf_counter()
    generated = adapter.answer(ids, stop_tokens(tokenizer))
    generate_s = time.perf_counter() - start
    text = tokenizer.decode(generated, skip_special_tokens=True)
    prediction, correct = score(text, problem.reference)
    start = time.perf_counter()
    step = adapter.adapt(ids, generated)
    adapt_s = time.perf_counter() - start
    record = QuestionRecord.of(
        step,
        id=problem.id,
        reference=problem.reference,
        prediction=prediction,
        correct=correct,
        new_tokens=int(generated.numel()),
        generate_s=generate_s,
        adapt_s=adapt_s,
        text=text,
    )
    return record, text


def run_online(
    adapter: LMAdapter, tokenizer: Any, problems: Iterable[MathProblem], progress: Any = None
) -> list[QuestionRecord]:
    """Run the protocol over ``problems`` in order, advancing ``progress`` (a tqdm bar) per question."""
    records = []
    for problem in problems:
        record, _ = answer_and_adapt(adapter, tokenizer, problem)
        records.append(record)
        if progress is not None:
            progress.update(1)
            progress.set_postfix(acc=f"{sum(r.correct for r in records) / len(records):.3f}")
    return records


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summarise(records: Sequence[QuestionRecord]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(metrics, curves) of a run: accuracy, throughput, time per question, mean diagnostics;
    the curves keep every per-question value in order (all but the step's ``stats``, the loss's terms)."""
    if not records:
        raise ValueError("no questions were run")
    tokens = sum(r.new_tokens for r in records)
    generate_s = sum(r.generate_s for r in records)
    total_s = generate_s + sum(r.adapt_s for r in records)
    metrics = {
        "accuracy": sum(r.correct for r in records) / len(records),
        "questions": len(records),
        "tokens_per_s": tokens / generate_s if generate_s > 0 else math.nan,
        "seconds_per_question": total_s / len(records),
        "adapt_seconds_per_question": sum(r.adapt_s for r in records) / len(records),
        "mean_new_tokens": tokens / len(records),
        "updates": sum(r.updated for r in records),
        "mean_entropy": _mean([r.entropy for r in records]),
        "mean_divergence": _mean([r.divergence for r in records]),
        "final_predictor_drift": records[-1].predictor_drift,
    }
    rows = [asdict(r) for r in records]
    curves = {key: [row[key] for row in rows] for key in rows[0] if key != "stats"}
    return metrics, curves
