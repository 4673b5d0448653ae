"""Goldens of the language-model path: per-step losses and generated token ids of every method.

Written before the language path moved onto the shared recipes, so that the move can be shown to
change nothing: ``tests/llm/test_goldens.py`` recomputes these numbers and compares them with
``tests/llm/goldens_tiny_llama.json``. The model is the tests' tiny random Llama (hidden 32, vocab 97),
with a wide initialisation so that its predictions are peaked; rates are large enough that every update
changes what the model generates next. The JSON was written by this script at commit ee6972c, before
the move (where each case's thresholds were ``LMConfig`` fields, ``LMSettings`` now; its cases' records
still spell η_h ``lr_predictor``, ``predictor_lr`` now); regenerate it only on purpose:

    python -m tests.llm.goldens --out tests/llm/goldens_tiny_llama.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path

import torch

GOLDENS = Path(__file__).with_name("goldens_tiny_llama.json")
VOCAB = 97
QUESTIONS = 5
# (label, method, config): thresholds inside the range of this model's entropies (about 1.8–3.8 nats)
# and prompt perplexities (log 5.2–6.9), so that every filter keeps some tokens and drops others
CASES = [
    ("noadapt", "noadapt", {}),
    ("tent", "tent", {}),
    ("zerosiam", "zerosiam", {}),
    ("zerosiam_lr_h", "zerosiam", {"predictor_lr": 2e-2}),
    ("sar", "sar", {"e0": 3.4}),
    ("sar_recovery", "sar", {"e0": 5.0, "sar_reset_below": 3.3}),
    ("eata", "eata", {"e0": 3.4}),
    ("come", "come", {}),
    ("tlm", "tlm", {"tlm_log_p0": 5.6}),
]
BASE_CONFIG = {"lr": 3e-2, "k": 4, "max_new_tokens": 8}


def tiny_llama(seed: int = 0, initializer_range: float = 0.3) -> torch.nn.Module:
    """The tiny random Llama; the goldens' wide initialisation (0.3) makes its predictions peaked, so
    that filters and updates have something to act on (0.02, transformers' default, makes them uniform)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    return LlamaForCausalLM(config).eval()


def prompts() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (1, 10 + i), generator=generator) for i in range(QUESTIONS)]


def recipe_for(method: str, e0: float | None = None, sar_reset_below: float | None = None, tlm_log_p0=None):
    """The method's language recipe with a case's thresholds (E0 in nats, SAR's recovery floor, ln P0)."""
    from zerosiam.methods import get_recipe
    from zerosiam.methods.tlm import tlm_with
    from zerosiam.parts.recovery import ema_below
    from zerosiam.parts.selection import entropy_below, exp_margin

    recipe = get_recipe(method, "text")
    if e0 is not None:
        weight = exp_margin(nats=e0) if recipe.weight is not None else None
        recipe = recipe.with_(select=[entropy_below(nats=e0)], weight=weight)
    if sar_reset_below is not None:
        recipe = recipe.with_(recover=ema_below(sar_reset_below))
    return tlm_with(log_p0=tlm_log_p0) if tlm_log_p0 is not None else recipe


def make_adapter(model: torch.nn.Module, method: str, config: dict):
    from zerosiam.llm.adapter import LMAdapter, LMSettings

    thresholds = {key: config.pop(key) for key in ("e0", "sar_reset_below", "tlm_log_p0") if key in config}
    return LMAdapter(model, recipe_for(method, **thresholds), LMSettings(**config))


def run_case(base: torch.nn.Module, method: str, config: dict) -> dict:
    """Answer and adapt on each prompt in turn; the generated ids and the step's loss per question."""
    torch.manual_seed(0)
    adapter = make_adapter(copy.deepcopy(base), method, {**BASE_CONFIG, **config})
    steps = []
    for ids in prompts():
        generated = adapter.answer(ids, eos_token_id=None)
        record = adapter.adapt(ids, generated)
        steps.append(
            {
                "tokens": [int(t) for t in generated],
                "loss": None if math.isnan(record.loss) else record.loss,
                "updated": bool(record.updated),
            }
        )
    return {"method": method, "config": config, "steps": steps}


def compute() -> dict:
    base = tiny_llama()
    return {label: run_case(base, method, config) for label, method, config in CASES}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    goldens = compute()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(goldens, indent=1) + "\n")
    for label, case in goldens.items():
        losses = [s["loss"] for s in case["steps"]]
        print(
            label, [None if v is None else round(v, 5) for v in losses], [s["updated"] for s in case["steps"]]
        )


if __name__ == "__main__":
    main()
