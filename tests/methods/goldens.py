"""Goldens of the image Adapter: what every method predicts and reports, step by step, on real streams.

Written before the Adapter's modes were taken apart (NoAdapt its own type, stacked streams behind one
seam), so that the change can be shown to alter nothing: ``tests/methods/test_goldens.py`` recomputes
these numbers and compares them with ``tests/methods/goldens_images.json``. The streams are real: the
project's ResNet-26-GN and ViT-Tiny-LN source models (the zoo's shipped weights) on CIFAR-10 test images
corrupted by the project's engine at severity 5, 16 images a step; stacked, three corruptions at once
(16 images of each a step). Rates are 10× the paper's, so that every update changes what comes next.

Each step keeps the predicted classes, the logits' sum and the step's diagnostics; each case ends with
the frozen model's prediction on a held-out batch (``predict``) and the prediction after ``reset()``.
``digest`` is the SHA-256 of every logit's bytes: the same machine reproduces it exactly
(``--compare``); another CPU may differ by float32 rounding, which the test's tolerance allows.
Regenerate only on purpose:

    python -m tests.methods.goldens --out tests/methods/goldens_images.json
    python -m tests.methods.goldens --compare tests/methods/goldens_images.json   # bit for bit
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

GOLDENS = Path(__file__).with_name("goldens_images.json")
MODELS = ("resnet26_gn", "vit_tiny_ln")
CORRUPTIONS = ("gaussian_noise", "fog", "contrast")  # the first is the single stream; all three stack
STEPS, PER_STEP = 4, 16
CASES = [
    ("noadapt", "noadapt", {}),
    ("tent", "tent", {}),
    ("zerosiam", "zerosiam", {}),
    ("sar", "sar", {}),
    ("sar_recovery", "sar", {"floor": 1.5}),  # a floor this high resets: recovery is exercised
    ("eata", "eata", {"clean": True}),
    ("deyo", "deyo", {}),
    ("come", "come", {}),
    ("eata+zerosiam", "eata+zerosiam", {"clean": True}),
]


@functools.cache
def _test_split() -> np.ndarray:
    from zerosiam.data.sources import read_cifar10_jpeg

    images = read_cifar10_jpeg("test")[0]
    return images[np.random.default_rng(7).permutation(len(images))]  # the split is ordered by class


@functools.cache
def stream(corruption: str) -> torch.Tensor:
    """``[STEPS + 1, PER_STEP, 3, 32, 32]``: the stream's batches, then a held-out batch, corrupted at
    severity 5 by the project's engine."""
    from zerosiam.corruptions import apply
    from zerosiam.data.tensors import to_input

    count = (STEPS + 1) * PER_STEP
    return to_input(apply(_test_split()[:count], corruption, 5)).view(STEPS + 1, PER_STEP, 3, 32, 32)


def clean_data() -> list[torch.Tensor]:
    """EATA's clean samples for its Fisher: two batches of clean test images outside the streams."""
    from zerosiam.data.tensors import to_input

    return [to_input(_test_split()[1000 + i * PER_STEP : 1000 + (i + 1) * PER_STEP]) for i in range(2)]


def adapter_for(model: torch.nn.Module, method: str, options: dict[str, Any], streams: int):
    import zerosiam
    from zerosiam.parts.recovery import ema_below

    extras: dict[str, Any] = {}
    if options.get("clean"):
        extras["clean_data"] = clean_data()
    if "floor" in options:
        extras["recover"] = ema_below(options["floor"])
    return zerosiam.adapt(model, method, lr_scale=10.0, batch_size=PER_STEP, streams=streams, **extras)


def _plain(value: Any) -> Any:
    """A diagnostic as JSON: NaN as None."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def run_case(base: torch.nn.Module, method: str, options: dict[str, Any], streams: int) -> dict:
    """Adapt on the stream (or three stacked), then predict a held-out batch frozen, then after reset."""
    torch.manual_seed(0)
    adapter = adapter_for(copy.deepcopy(base), method, options, streams)
    data = [stream(c) for c in CORRUPTIONS[:streams]]
    digest = hashlib.sha256()
    steps = []
    for step in range(STEPS):
        logits = adapter(torch.cat([batch[step] for batch in data]))
        digest.update(logits.detach().numpy().tobytes())
        steps.append({"classes": logits.argmax(-1).tolist(), "logits_sum": float(logits.sum())})
    for step, row in zip(steps, adapter.history, strict=True):
        step["history"] = {key: _plain(value) for key, value in row.items()}
    held_out = torch.cat([batch[STEPS] for batch in data])
    frozen = adapter.predict(held_out)
    adapter.reset()
    after_reset = adapter.predict(held_out)
    for logits in (frozen, after_reset):
        digest.update(logits.numpy().tobytes())
    return {
        "method": method,
        "options": options,
        "streams": streams,
        "steps": steps,
        "frozen": {"classes": frozen.argmax(-1).tolist(), "logits_sum": float(frozen.sum())},
        "after_reset": {"classes": after_reset.argmax(-1).tolist(), "logits_sum": float(after_reset.sum())},
        "digest": digest.hexdigest(),
    }


def compute() -> dict[str, dict]:
    from zerosiam.zoo import load_model

    torch.set_num_threads(1)  # one thread: the same reduction order on every run of a machine
    goldens = {}
    for name in MODELS:
        base = load_model(name)
        for label, method, options in CASES:
            for streams in (1, len(CORRUPTIONS)):
                goldens[f"{name}/{label}/{streams}"] = run_case(base, method, options, streams)
    return goldens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the goldens here")
    group.add_argument("--compare", type=Path, help="say which cases differ from these, bit for bit")
    args = parser.parse_args()
    goldens = compute()
    if args.out:
        args.out.write_text(json.dumps(goldens, indent=1) + "\n")
        print(f"{len(goldens)} cases written to {args.out}")
        return
    stored = json.loads(args.compare.read_text())
    differ = [key for key in stored if stored[key]["digest"] != goldens[key]["digest"]]
    print(f"{len(stored) - len(differ)} of {len(stored)} cases bit-identical; differing: {differ or 'none'}")


if __name__ == "__main__":
    main()
