"""What stacking streams buys at batch size 1: B corruption streams in one adapter against B adapters.

    PYTHONPATH=. python benchmarks/streams.py --model resnet26_gn --steps 100

Each of the 15 benchmark corruptions (project CIFAR-10-C, severity 5) is one stream of single images.
"one by one" adapts every stream with its own adapter, a step at a time; "stacked" adapts all of them
with ``zerosiam.adapt(..., streams=15)``, one forward per step. The table gives the time per image
(median of interleaved repeats, so a busy machine slows both alike) and the ratio, and what a stack of
the 15 corruptions under ``--seeds`` seeds costs per image (``bench --stack`` stacks the runs of a
corruption's seeds too; each "seed" here streams the next ``--steps`` images). Then both ways run
the benchmark's own runs (``runner.run`` and ``runner.run_stacked``, label shift at batch size 1 on the
first ``--limit`` images of three corruptions) and the accuracies are printed side by side: they must
agree up to float rounding, except DeYO's and COME's, whose random patch orders are drawn differently.
EATA is timed as ETA (EATA without its Fisher term, which needs clean data; the step is the same).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import zerosiam
from zerosiam import corruptions
from zerosiam.bench import runner
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.corruptions.datasets import load_corrupted
from zerosiam.data.tensors import to_input


def streams_of_images(steps: int, device: torch.device, seeds: int = 1) -> torch.Tensor:
    """``[steps, B, 1, 3, 32, 32]``, B = 15 × ``seeds``: for each of ``seeds`` stand-in seeds, the next
    ``steps`` images of each benchmark corruption."""
    loaded = [load_corrupted("cifar10c", name, 5)[0] for name in corruptions.BENCHMARK]
    streams = [to_input(images[s * steps : (s + 1) * steps]) for s in range(seeds) for images in loaded]
    return torch.stack(streams, 1).unsqueeze(2).to(device)


def seconds_per_image(model_name: str, method: str, stacked: bool, data: torch.Tensor, device) -> float:
    """Wall time per image of adapting every stream of ``data`` for all its steps (after one warm-up)."""
    steps, count = data.shape[:2]

    def adapter(streams: int):
        model = zerosiam.load_model(model_name).to(device)
        return zerosiam.adapt(model, method, batch_size=1, streams=streams)

    if stacked:
        adapters, feeds = [adapter(count)], [data.flatten(1, 2)]
    else:
        adapters, feeds = [adapter(1) for _ in range(count)], [data[:, s] for s in range(count)]
    for one, feed in zip(adapters, feeds, strict=True):
        one(feed[0])  # warm-up
    start = time.perf_counter()
    for one, feed in zip(adapters, feeds, strict=True):
        for x in feed[1:]:
            one(x)
        len(one.history)  # the bulk read belongs to the cost
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / ((steps - 1) * count)


def agreement(model_name: str, method: str, limit: int, device) -> list[tuple[str, float, float]]:
    """Accuracy of three real label-shift runs at batch size 1, stacked and one by one."""
    specs = [
        runner.RunSpec(model_name, "cifar10c", name, 5, "label_shift_bs1", method, batch_size=1, limit=limit)
        for name in corruptions.BENCHMARK[:3]
    ]
    stacked = runner.run_stacked(specs, device=device)
    alone = [runner.run(spec, device=device) for spec in specs]
    return [
        (spec.corruption, s.metrics["accuracy"], a.metrics["accuracy"])
        for spec, s, a in zip(specs, stacked, alone, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="resnet26_gn")
    parser.add_argument("--methods", default="noadapt,tent,zerosiam,sar,eta,deyo,come")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=300, help="images per corruption in the agreement runs")
    parser.add_argument("--seeds", type=int, default=3, help="seeds stacked with the 15 corruptions")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    everything = streams_of_images(args.steps, device, args.seeds)
    data = everything[:, : len(corruptions.BENCHMARK)]
    threads = torch.get_num_threads()
    where = describe_device(device)
    print(f"{args.model}, batch size 1, {data.shape[1]} streams × {args.steps} steps, "
          f"{where.get('gpu', where['device'])}, {threads} threads")  # fmt: skip
    wide = everything.shape[1]
    print(f"\n| method | ms/image one by one | ms/image stacked | one by one ÷ stacked "
          f"| ms/image {wide} stacked | stacked ÷ {wide} stacked |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    methods = args.methods.split(",")
    ways = {"alone": (False, data), "stacked": (True, data), "wide": (True, everything)}
    for method in methods:
        timings: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, (stacked, feed) in ways.items():
                timings[way].append(seconds_per_image(args.model, method, stacked, feed, device))
        alone, stacked, wide_ms = (statistics.median(timings[way]) * 1000 for way in ways)
        print(f"| {method} | {alone:.2f} | {stacked:.2f} | {alone / stacked:.2f} | {wide_ms:.2f} "
              f"| {stacked / wide_ms:.2f} |")  # fmt: skip
    print(f"\nlabel shift at batch size 1, first {args.limit} images, accuracy stacked / one by one:")
    for method in methods:
        for corruption, stacked, alone in agreement(args.model, method, args.limit, device):
            print(f"  {method:9s} {corruption:15s} {stacked:.4f} / {alone:.4f}  (Δ {stacked - alone:+.4f})")


if __name__ == "__main__":
    main()
