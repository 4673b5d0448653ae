"""The GPU check: the benchmark's own code on a GPU, over an ImageNet-C folder, beside a peer's plain loop.

Needs only the repository and what a standard CUDA PyTorch image has (torch, timm, torchvision, numpy,
pillow):

    PYTHONPATH=. python benchmarks/gpu_check.py                   # one GPU, about 5,000 images per run
    PYTHONPATH=. python benchmarks/gpu_check.py --options channels_last,compile --profile --out /tmp/gpu
    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --images 128 --models test_efficientnet_gn

It writes a synthetic ImageNet-C-layout folder (``gaussian_noise/5/<wnid>/*.JPEG``, 224², random pixels)
to a temporary folder (or ``--folder``), then, for each timm model (random weights, 1,000 classes, the
head scaled ×50 so that predictions are confident and SAR's and DeYO's filters keep samples) and each
precision, one row per measurement:

* **the harness**: each method through ``zerosiam.bench.runner.run`` (the code ``zerosiam bench
  --dataset imagenet-c:<root>`` runs), eager, then with each speed option of ``--options``
  (``zerosiam.methods.speed``: ``channels_last``, ``compile``, ``compile:reduce-overhead``, joined by
  ``+``) for the methods of ``--option-methods``;
* **a plain Tent loop**, written here the way public TTA code bases write it (a torchvision
  ``ImageFolder`` with ``ToTensor``/``Normalize`` in ``DataLoader`` workers, the model in train mode,
  only the norm layers' affine parameters trainable, SGD with momentum 0.9, ``loss.backward();
  opt.step(); opt.zero_grad()``), on the same images, the same number of decoding workers and the same
  precision: the anchor of "faster than the loop everyone runs".

Per row: images/s, peak memory (GPU, or resident on the CPU), the share of the loop's wall time spent
waiting for data, time and memory ÷ the harness's Tent (with the same options when there is such a
row), speed ÷ the plain loop, and the model FLOP utilisation: the FLOPs of one step of that method
(counted once per model and method with ``torch.utils.flop_counter.FlopCounterMode`` over one step, its
forward and backward passes, on random images) per image × images/s ÷ the precision's peak. The peaks
(``--peak-tflops``) default to the dense (not 2:4-sparse) figures of NVIDIA's H100 SXM5 and H200 SXM
datasheets, which give the same compute: fp32 67 TFLOP/s (no tensor cores), tf32 494.5 (the sheets'
989 "with sparsity", halved), bf16 and fp16 989.5 (1,979 with sparsity). An H100 PCIe has less (tf32
378, bf16 756): pass its figures there. On a CPU the column says only how far from an H100 it is.

Every timing leaves one-time costs out: the images a run uses are whole batches (a compiled forward
recompiles for a smaller last batch); an untimed Tent run per model and precision pays cuBLAS's and
cuDNN's set-up; every row with a speed option follows an untimed run of the same method and options
(the compilation); the plain loop follows an untimed run of its own. A row's time runs, like the
harness's, from the loader's start to its last step.

``--profile`` writes, per model and precision, a ``torch.profiler`` summary of the eager harness's steps
(``--profile-method``): where a step's time goes (forward, loss, backward, optimizer step, the reads of
the device by the input's and the update's finiteness checks, data wait, every host sync counted), to
``profile_<model>_<precision>.md`` under ``--out`` (default ``$OUT`` when set). With ``--out``, every
table also goes to ``gpu_check.md`` there and every row, as it is measured, to ``rows.jsonl`` (what a
run stopped by a deadline leaves).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

import zerosiam
from zerosiam.bench.device import describe_device, resolve_device
from zerosiam.bench.memory import peak_gpu_mb, peak_mb, reset_peak
from zerosiam.bench.runner import RunSpec, StreamBatches, run, stream_for
from zerosiam.data.sources import imagenet_wnids
from zerosiam.methods.speed import Speed
from zerosiam.parts.precision import forward_precision, tensor_cores
from zerosiam.protocols.build import to_device

CORRUPTION, SEVERITY = "gaussian_noise", 5
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BUILDER = "builder:benchmarks.gpu_check:confident_timm"  # random weights: speed and memory only
PEAK_TFLOPS = "fp32=67,tf32=494.5,bf16=989.5,fp16=989.5"  # H100 SXM5 / H200 SXM, dense
PLAIN = "tent (plain loop)"
WARM_BATCHES = 4  # the untimed runs' length, in batches
TENT_LR = 0.00025  # Tent's SGD rate for ImageNet at batch 64 (its published configuration)


def confident_timm(name: str) -> nn.Module:
    """A timm model with random weights and its head scaled ×50. Random weights alone predict almost
    uniformly (entropy near ln 1000, above SAR's and DeYO's thresholds), so those methods would keep no
    sample and never run their backward; a confident head makes them do the work they do on a trained
    model, as ``benchmarks/efficiency.py`` does on the CPU."""
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=1000)
    with torch.no_grad():
        model.get_classifier().weight.mul_(50)
    return model


def write_folder(root: Path, images: int, seed: int = 0) -> None:
    """``images`` random 224² JPEGs (quality 85, as ImageNet-C) spread over the 1,000 class folders."""
    rng = np.random.default_rng(seed)
    wnids = imagenet_wnids()
    for index in range(images):
        folder = root / CORRUPTION / str(SEVERITY) / wnids[index % len(wnids)]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:06d}.JPEG", quality=85)


def folder_images(root: Path) -> int:
    """How many JPEGs a folder written by ``write_folder`` holds (0 when there is none)."""
    return sum(1 for _ in (root / CORRUPTION / str(SEVERITY)).glob("*/*.JPEG"))


# --- the harness ------------------------------------------------------------------------------------
def spec_for(
    root: Path, model: str, method: str, precision: str, batch_size: int, limit: int | None
) -> RunSpec:
    """The benchmark's run of ``method`` on the folder: protocol mild, the model behind its normalization."""
    return RunSpec(
        model=BUILDER,
        model_options={
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
            "dataset": "imagenet",
            "builder_kwargs": {"name": model},
        },
        dataset=f"imagenet-c:{root}",
        corruption=CORRUPTION,
        severity=SEVERITY,
        protocol="mild",
        method=method,
        precision=precision,
        batch_size=batch_size,
        limit=limit,
    )


def measure(
    root: Path,
    model: str,
    method: str,
    precision: str,
    device: torch.device,
    batch_size: int,
    limit: int | None = None,
    speed: Speed | None = None,
) -> dict:
    """One harness run: images/s, peak memory, data wait and seconds."""
    metrics = run(
        spec_for(root, model, method, precision, batch_size, limit), device=device, speed=speed
    ).metrics
    return {
        "images_per_s": metrics["samples"] / metrics["seconds"],
        "memory_mb": metrics.get("peak_gpu_mb", metrics["peak_rss_mb"]),
        "data_wait": metrics["data_wait_fraction"],
        "seconds": metrics["seconds"],
    }


def harness_model(name: str, device: torch.device) -> nn.Module:
    """The model a harness run builds (``spec_for``), on ``device``."""
    options = spec_for(Path("."), name, "tent", "fp32", 1, None).model_options
    return zerosiam.load_model(BUILDER, **options).to(device)


# --- the peer's plain loop ---------------------------------------------------------------------------
NORM_LAYERS = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Tent's loss: the Shannon entropy of each prediction."""
    return -(logits.softmax(1) * logits.log_softmax(1)).sum(1)


def configure_tent(model: nn.Module, batch_size: int) -> torch.optim.Optimizer:
    """Tent's ``configure_model`` and ``collect_params``: train mode, batch statistics in BatchNorm, only
    the norm layers' affine parameters trainable; SGD with momentum 0.9 on them."""
    model.train()
    model.requires_grad_(False)
    params = []
    for module in model.modules():
        if isinstance(module, NORM_LAYERS) and module.weight is not None:
            if isinstance(module, nn.BatchNorm2d):
                module.track_running_stats, module.running_mean, module.running_var = False, None, None
            module.requires_grad_(True)
            params += [p for p in (module.weight, module.bias) if p is not None]
    return torch.optim.SGD(params, lr=TENT_LR * batch_size / 64, momentum=0.9)


def decoding_workers() -> int:
    """The harness's decoding workers for image files (``zerosiam.bench.datasets.loader_workers``)."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def plain_loader(
    root: Path, batch_size: int, images: int, device: torch.device
) -> torch.utils.data.DataLoader:
    """A torchvision ``ImageFolder`` of the folder, ``images`` of its files in a seeded random order."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    folder = datasets.ImageFolder(str(root / CORRUPTION / str(SEVERITY)), transform=transform)
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(0))[:images]
    workers = decoding_workers()
    return torch.utils.data.DataLoader(
        torch.utils.data.Subset(folder, order.tolist()),
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=4 if workers else None,
    )


def plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, precision: str
) -> torch.Tensor:
    """One step of the plain loop; the logits, taken before the update."""
    with forward_precision(precision, x.device):
        outputs = model(x)
    loss = entropy(outputs.float()).mean(0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return outputs


def plain_loop(
    root: Path, model: str, precision: str, device: torch.device, batch_size: int, images: int
) -> dict:
    """The plain loop over ``images`` of the folder, timed as the harness times a run: from the loader's
    start to the last step's end."""
    torch.manual_seed(0)
    net = confident_timm(model).to(device)
    optimizer = configure_tent(net, batch_size)
    own_peak = reset_peak(device)
    correct = torch.zeros((), device=device)
    waited = 0.0
    start = time.perf_counter()
    with tensor_cores(precision):
        batches = iter(plain_loader(root, batch_size, images, device))
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - asked
            if batch is None:
                break
            x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
            correct += (plain_step(net, optimizer, x, precision).argmax(1) == y).sum()
    correct.item()  # the last step's end
    seconds = time.perf_counter() - start
    memory = peak_gpu_mb(device) if device.type == "cuda" else peak_mb()
    return {"images_per_s": images / seconds, "memory_mb": memory, "data_wait": waited / seconds,
            "seconds": seconds, "peak_scope": "run" if own_peak else "process"}  # fmt: skip


# --- FLOPs ------------------------------------------------------------------------------------------
def flops_per_image(
    model: str, methods: list[str], device: torch.device, batch_size: int
) -> dict[str, float]:
    """Each method's FLOPs per image in one step (its forward and backward passes), and the plain
    loop's, counted once on random images: they depend on the model and the method, not the precision."""
    x = torch.rand(batch_size, 3, 224, 224, device=device)
    net = harness_model(model, device)
    flops = {}
    for method in methods:
        adapter = zerosiam.adapt(net, method, batch_size=batch_size)
        flops[method] = _counted(lambda adapter=adapter: adapter(x)) / batch_size
        adapter.release()
    plain = confident_timm(model).to(device)
    optimizer = configure_tent(plain, batch_size)
    flops[PLAIN] = _counted(lambda: plain_step(plain, optimizer, x, "fp32")) / batch_size
    return flops


def _counted(step: Callable[[], object]) -> float:
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


# --- the profile ------------------------------------------------------------------------------------
def labelled(name: str, function: Callable) -> Callable:
    """``function`` inside a profiler range named ``name``."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return function(*args, **kwargs)

    return call


def label_forward(model: nn.Module) -> None:
    """A profiler range ``forward`` around every forward of ``model`` (hooks: the adapter calls it)."""
    ranges: list[record_function] = []

    def enter(module: nn.Module, args: tuple) -> None:
        ranges.append(record_function("forward").__enter__())

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        ranges.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)


def profiled_steps(
    args: argparse.Namespace, root: Path, model: str, precision: str, device: torch.device
) -> tuple[Any, float]:
    """``torch.profiler`` over ``--profile-steps`` eager harness steps after ``WARM_BATCHES`` untimed
    ones: the profiler's averages by name, and the wall time per step."""
    spec = spec_for(root, model, args.profile_method, precision, args.batch_size, None)
    net = harness_model(model, device)
    adapter = zerosiam.adapt(net, spec.method, batch_size=args.batch_size, precision=precision)
    label_forward(net)
    adapter._evaluate = labelled("forward + loss", adapter._evaluate)  # what a step calls to score
    adapter.backward = labelled("backward", adapter.backward)  # with zero_grad and the finiteness check
    adapter.finite = labelled("finiteness check", adapter.finite)  # its one read of the device
    adapter._check_input = labelled("input check", adapter._check_input)  # NaN/Inf: a read of the device
    batches = endless(StreamBatches(stream_for(spec, device=device)).loader(device))

    def step() -> None:
        with record_function("data wait"):
            pixels, labels = next(batches)
            x, y = to_device(pixels, labels, device)
        with record_function("step"):
            (adapter(x).argmax(1) == y).sum()

    for _ in range(WARM_BATCHES):
        step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    with torch.profiler.profile(activities=activities) as profile:
        start = time.perf_counter()
        for _ in range(args.profile_steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    return profile.key_averages(), wall / args.profile_steps


def endless(loader: torch.utils.data.DataLoader) -> Iterator:
    """The loader's batches, over again when a folder holds fewer than the profile takes."""
    while True:
        yield from loader


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)))


def _self_device_us(event: Any) -> float:
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))


def host_events(averages: Any) -> list:
    """The events the host recorded. On a GPU the profiler lists each labelled range a second time under
    the same name, as the span of its kernels on the device's timeline (device type CUDA, no host time):
    read as the range, that copy gave every part 0 ms of host time, and spans that overlap (a "loss" of
    -14 ms, kernels busy 212 % of the wall time, on an H200 on 2026-11-29). A host event's device time
    is the kernels it and what it called launched; summed over host events, every kernel counts once."""
    return [event for event in averages if event.device_type == DeviceType.CPU]


def profile_summary(averages: Any, steps: int, wall: float) -> str:
    """Where a step's time goes, in ms per step: wall time on the host (inclusive of what the range
    calls) and the device's kernel time launched in it."""
    averages = host_events(averages)
    by_key = {event.key: event for event in averages}

    def host(key: str) -> float:
        return by_key[key].cpu_time_total / 1000 / steps if key in by_key else 0.0

    def device(key: str) -> float:
        return _device_us(by_key[key]) / 1000 / steps if key in by_key else 0.0

    def total(prefix: str, read: Callable[[Any], float]) -> float:
        return sum(read(e) for e in averages if e.key.startswith(prefix)) / 1000 / steps

    backward_device = total("autograd::engine::evaluate_function", _device_us)  # the backward's thread
    syncs = by_key.get("aten::_local_scalar_dense")
    parts = [
        ("data wait (next batch, to the device)", host("data wait"), device("data wait")),
        ("forward", host("forward"), device("forward")),
        ("loss (and the recipe's rules)", host("forward + loss") - host("forward"),
         device("forward + loss") - device("forward")),
        ("backward (and zero_grad)", host("backward") - host("finiteness check"), backward_device),
        ("finiteness check (one read of the device)", host("finiteness check"), device("finiteness check")),
        ("input check (NaN/Inf: one read of the device)", host("input check"), device("input check")),
        ("optimizer step", total("Optimizer.step#", lambda e: e.cpu_time_total),
         total("Optimizer.step#", _device_us)),
        ("the whole step (adapter call, scoring)", host("step"), device("step") + backward_device),
    ]  # fmt: skip
    busy = sum(_self_device_us(e) for e in averages) / 1000 / steps
    lines = [
        f"{wall * 1000:.2f} ms wall per step (data wait included); device kernels busy {busy:.2f} ms "
        f"per step ({100 * busy / (wall * 1000):.0f} % of the wall time)",
        f"host syncs: {syncs.count / steps if syncs else 0:.1f} reads of a device value per step "
        f"(aten::_local_scalar_dense), {host('aten::_local_scalar_dense'):.2f} ms per step waiting in them",
        "",
        "| part | host ms/step | device ms/step |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {cpu:.2f} | {gpu:.2f} |" for name, cpu, gpu in parts]
    return "\n".join(lines)


def write_profile(
    args: argparse.Namespace, root: Path, model: str, precision: str, device: torch.device
) -> str:
    """Profile the harness's steps; the summary, also written under ``--out`` with torch's own table."""
    averages, wall = profiled_steps(args, root, model, precision, device)
    summary = profile_summary(averages, args.profile_steps, wall)
    title = f"Profile: {model}, {precision}, {args.profile_method}, batch {args.batch_size}, eager"
    text = f"## {title}\n\n{summary}\n"
    if args.out is not None:
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        table = averages.table(sort_by=sort, row_limit=40)
        (args.out / f"profile_{model}_{precision}.md").write_text(f"{text}\n```\n{table}\n```\n")
    return text


# --- the rows and their tables -------------------------------------------------------------------------
def full_batches(images: int, batch_size: int) -> int:
    """The images a timed run uses: whole batches only."""
    if images < batch_size:
        raise SystemExit(f"--images {images} is less than one batch of {batch_size}")
    return images // batch_size * batch_size


def rows_of(
    args: argparse.Namespace, root: Path, model: str, precision: str, device: torch.device
) -> Iterator[dict]:
    """Every row of one model and precision, each as it is measured."""
    images = full_batches(args.images, args.batch_size)

    def harness(method: str, speed: Speed) -> dict:
        measured = measure(root, model, method, precision, device, args.batch_size, images, speed)
        return {"method": method, "speed": speed.label, **measured}

    warm = WARM_BATCHES * args.batch_size
    measure(root, model, "tent", precision, device, args.batch_size, warm)  # cuBLAS/cuDNN set-up
    for method in args.methods:
        yield harness(method, Speed())
    plain_loop(root, model, precision, device, args.batch_size, warm)  # untimed
    yield {
        "method": PLAIN,
        "speed": "eager",
        **plain_loop(root, model, precision, device, args.batch_size, images),
    }
    for speed in args.options:
        for method in args.option_methods:
            try:
                measure(root, model, method, precision, device, args.batch_size, warm, speed)  # compiles
                yield harness(method, speed)
            except Exception:  # an option that fails (a capture on a new torch) costs its row, not the rest
                print(f"{method} {speed.label} failed:\n{traceback.format_exc()}", file=sys.stderr)


def table(rows: list[dict], memory: str, peak_tflops: float, flops: dict[str, float]) -> str:
    """The rows as Markdown, with the ratios to the harness's Tent and to the plain loop, and MFU."""
    plain = next((row for row in rows if row["method"] == PLAIN), None)
    tents = {row["speed"]: row for row in rows if row["method"] == "tent"}
    lines = [
        f"| method | speed | images/s | peak {memory} (MB) | data wait | time ÷ Tent | memory ÷ Tent "
        "| speed ÷ plain loop | GFLOP/image | TFLOP/s | MFU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        tent = tents.get(row["speed"], tents.get("eager"))
        speed, memory_mb = row["images_per_s"], row["memory_mb"]
        tflops = flops.get(row["method"], float("nan")) * speed / 1e12
        cells = [
            row["method"],
            row["speed"],
            f"{speed:,.0f}",
            f"{memory_mb:,.0f}",
            f"{100 * row['data_wait']:.1f} %",
            f"{tent['images_per_s'] / speed:.3f}" if tent else "–",
            f"{memory_mb / tent['memory_mb']:.3f}" if tent else "–",
            f"{speed / plain['images_per_s']:.2f}" if plain else "–",
            f"{flops.get(row['method'], float('nan')) / 1e9:.1f}",
            f"{tflops:.3g}",
            f"{100 * tflops / peak_tflops:.3g} %",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def emit(args: argparse.Namespace, text: str) -> None:
    """Print ``text``, and append it to ``gpu_check.md`` under ``--out``."""
    print(text, flush=True)
    if args.out is not None:
        with (args.out / "gpu_check.md").open("a") as file:
            file.write(text + "\n")


def record(args: argparse.Namespace, row: dict) -> None:
    """A measured row, at once: to stderr, and to ``rows.jsonl`` under ``--out``."""
    print("measured: " + json.dumps(row), file=sys.stderr, flush=True)
    if args.out is not None:
        with (args.out / "rows.jsonl").open("a") as file:
            file.write(json.dumps(row) + "\n")


def check_model(args: argparse.Namespace, root: Path, model: str, device: torch.device) -> None:
    """Every precision's rows and tables of ``model``, and its profiles."""
    flops = flops_per_image(
        model, list(dict.fromkeys(args.methods + args.option_methods)), device, args.batch_size
    )
    memory = "GPU memory" if device.type == "cuda" else "resident memory"
    for precision in args.precisions:
        rows = []
        for row in rows_of(args, root, model, precision, device):
            record(args, {"model": model, "precision": precision, "batch_size": args.batch_size, **row})
            rows.append(row)
        emit(args, f"\n{model}, {precision}, {args.images} images, batch {args.batch_size}\n")
        emit(args, table(rows, memory, args.peak_tflops[precision], flops))
        if args.profile:
            emit(args, "\n" + write_profile(args, root, model, precision, device))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--images", type=int, default=5000, help="images in the synthetic folder")
    parser.add_argument(
        "--folder", type=Path, help="the synthetic folder: used if it holds --images, else written"
    )
    parser.add_argument("--models", default="vit_base_patch16_224,resnet50_gn", help="timm architectures")
    parser.add_argument("--methods", default="noadapt,tent,zerosiam,sar,deyo")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--options", default="", help="speed options beside eager, e.g. channels_last,compile"
    )
    parser.add_argument("--option-methods", default="tent,zerosiam", help="the methods run with --options")
    parser.add_argument("--peak-tflops", default=PEAK_TFLOPS, help="precision=TFLOP/s, the MFU's peaks")
    parser.add_argument("--profile", action="store_true", help="profile the eager harness's steps")
    parser.add_argument("--profile-method", default="zerosiam")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, default=os.environ.get("OUT"), help="where files go (default $OUT)"
    )
    args = parser.parse_args()
    args.methods, args.precisions = args.methods.split(","), args.precisions.split(",")
    if "tent" not in args.methods:
        parser.error("--methods must include tent: the ratios are to Tent")
    speeds = [Speed.parse(label) for label in filter(None, args.options.split(","))]
    args.options = [speed for speed in speeds if not speed.eager]
    args.option_methods = args.option_methods.split(",") if args.options else []
    args.peak_tflops = {k: float(v) for k, _, v in (p.partition("=") for p in args.peak_tflops.split(","))}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = parse_args()
    device = resolve_device(args.device)
    print(f"device: {describe_device(device)}")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        root = args.folder or Path(folder)
        if folder_images(root) < args.images:
            start = time.perf_counter()
            write_folder(root, args.images)
            print(f"wrote {args.images} JPEGs in {time.perf_counter() - start:.1f} s")
        for model in args.models.split(","):
            check_model(args, root, model, device)


if __name__ == "__main__":
    main()
