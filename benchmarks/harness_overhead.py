"""How much the benchmark harness adds to the model's own cost.

For the same model, method and batches, it times (a) a whole ``zerosiam.bench.runner.run`` (stream
building, gathering and converting batches, the adapter's bookkeeping, diagnostics, accuracy) and (b)
the bare minimum a hand-written loop needs: forward, entropy, backward and an SGD step on pre-built
tensors. The ratio (a)/(b) is the harness overhead; the aim is ≤ 1.10. Runs alternate and the median
of several repeats is reported, so a busy machine slows both sides alike.

    python benchmarks/harness_overhead.py [--model resnet20] [--method tent] [--limit 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import zerosiam
from zerosiam.bench.runner import RunSpec, run, stream_for
from zerosiam.parts.losses import entropy
from zerosiam.protocols.build import gather_batch


def bare_loop(spec: RunSpec) -> float:
    """Forward + entropy + backward + step on tensors prepared beforehand: the model's own cost."""
    stream = stream_for(spec)
    steps = range(0, len(stream.rows), spec.batch_size)
    batches = [gather_batch(stream, stream.rows[i : i + spec.batch_size])[0] for i in steps]
    model = zerosiam.load_model(spec.model)
    adapter = zerosiam.adapt(model, "tent", batch_size=spec.batch_size)  # configures norms and BatchNorm
    optimizer = torch.optim.SGD(adapter.trainable, lr=adapter.settings.lr, momentum=0.9)
    start = time.perf_counter()
    for x in batches:
        loss = entropy(model(x)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def harness(spec: RunSpec) -> float:
    start = time.perf_counter()
    run(spec)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--method", default="tent")
    parser.add_argument("--corruption", default="gaussian_noise")
    parser.add_argument("--limit", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = RunSpec(model=args.model, dataset="cifar10c", corruption=args.corruption, severity=5,
                   protocol="mild", method=args.method, limit=args.limit)  # fmt: skip
    harness(spec)  # warm-up: builds the cached data and imports everything once
    whole, bare = [], []
    for _ in range(args.repeats):
        whole.append(harness(spec))
        bare.append(bare_loop(spec))
    ratio = statistics.median(whole) / statistics.median(bare)
    threads = torch.get_num_threads()
    print(f"machine: {platform.machine()}, {threads} torch threads, torch {torch.__version__}")
    print(f"{args.model} {args.method}, {args.limit} images, batch size 64, {args.repeats} repeats (median)")
    print("| measurement | seconds |\n|---|---|")
    print(f"| whole run (harness) | {statistics.median(whole):.2f} |")
    print(f"| forward+backward+step only | {statistics.median(bare):.2f} |")
    print(f"| overhead ratio | {ratio:.3f} |")


if __name__ == "__main__":
    main()
