"""Supervised training of the CIFAR-10 source models, resumable bit for bit.

Why it is built this way:

* Everything random about epoch ``e`` — the data order, the crop offsets, the flips — is drawn up front
  from a generator seeded by ``(seed, e)`` (``epoch_plan``). Step ``s`` of epoch ``e`` therefore sees the
  same batch whether or not the run was interrupted, and resuming needs no replay of the data pipeline.
* The learning rate is a pure function of the global step (``lr_at``: linear warm-up, cosine to zero), so
  the schedule's whole state is the step counter. The checkpoint also keeps the model, the optimizer
  (momentum / Adam moments), the running sums of the epoch's metrics, the number of log lines written, and
  torch's global RNG state (for any dropout a model may add), so a resumed run reproduces the uninterrupted
  one exactly — weights and log.
* Checkpoints are written through ``zerosiam.assets.files.atomic_write`` (a temporary file, fsync,
  ``os.replace``): a run killed while saving leaves the previous checkpoint intact. Log lines written
  after the last checkpoint are dropped on resume, so the log never holds a step twice.
* Augmentation (random crop with 4-pixel zero padding, horizontal flip) runs on whole uint8 batches with
  tensor indexing — no per-image Python loop and no worker processes to keep in step.

``train`` is the library entry; ``zerosiam train-source`` (zerosiam/cli/train_source.py) is the command.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zerosiam.assets.files import atomic_write
from zerosiam.data.tensors import to_input
from zerosiam.zoo.trained import build, save_trained

CHECKPOINT_NAME = "checkpoint.pt"
LOG_NAME = "log.jsonl"
PAD = 4
PLACEMENT_FIELDS = ("threads", "device")
"""Config fields that say where a run computes, not what it computes: a resume may change them."""
WALL_CLOCK_KEYS = ("time",)
"""Log fields that measure wall-clock time: the only ones a resumed run may not reproduce."""

Data = tuple[Tensor, Tensor]  # uint8 (N, H, W, 3) images, int64 (N,) labels


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained weights (and nothing that does not, except ``threads`` and
    ``device``, which only say where the arithmetic runs: a run may resume on another device)."""

    arch: str
    epochs: int
    batch_size: int = 128
    optimizer: str = "sgd"  # "sgd" (momentum 0.9, Nesterov) or "adamw"
    lr: float = 0.1  # peak learning rate
    weight_decay: float = 5e-4  # on weights only, never on norms, biases or position embeddings
    warmup: float = 0.05  # fraction of all steps spent warming up linearly
    label_smoothing: float = 0.0
    grad_clip: float = 0.0  # max global gradient norm; 0 = off
    seed: int = 0
    checkpoint_every: int = 0  # steps between mid-epoch checkpoints; 0 = at epoch ends only
    log_every: int = 50  # steps between step records in the log; 0 = epoch records only
    eval_every: int = 1  # epochs between test evaluations; 0 = after the last epoch only
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    device: str = "cpu"  # where the model, the data and the augmentation live: "cpu", "cuda", "cuda:N"


RECIPES: dict[str, dict[str, Any]] = {
    "resnet26_gn": {"optimizer": "sgd", "lr": 0.1, "weight_decay": 5e-4, "warmup": 0.05, "epochs": 50},
    "vit_tiny_ln": {
        "optimizer": "adamw",
        "lr": 1e-3,
        "weight_decay": 0.05,
        "warmup": 0.1,
        "epochs": 51,
        "grad_clip": 1.0,
        "label_smoothing": 0.1,
    },
    "convnext_nano_ln": {
        "optimizer": "adamw",
        "lr": 2e-3,
        "weight_decay": 0.05,
        "warmup": 0.1,
        "epochs": 61,
        "grad_clip": 1.0,
        "label_smoothing": 0.1,
    },
    "tiny_gn": {"optimizer": "sgd", "lr": 0.05, "weight_decay": 5e-4, "warmup": 0.1, "epochs": 2},
}
"""Per-architecture defaults, those of the shipped weights (docs/source_models.md): SGD + Nesterov for
the ResNet (the classic CIFAR recipe), AdamW with label smoothing 0.1 for the transformer and the
ConvNeXt, which train poorly with plain SGD from scratch and over-fit the 50,000 images without it."""


def recipe_config(arch: str, **overrides: Any) -> TrainConfig:
    """The architecture's recipe with ``overrides`` (``None`` values mean "keep the recipe's")."""
    if arch not in RECIPES:
        raise ValueError(f"no training recipe for {arch!r}; available: {', '.join(RECIPES)}")
    values = {**RECIPES[arch], **{k: v for k, v in overrides.items() if v is not None}}
    return TrainConfig(arch=arch, **values)


# ---------------------------------------------------------------------------------------------- data order
@dataclass(frozen=True)
class EpochPlan:
    """An epoch's randomness: sample order, crop offsets and flips, indexed by position in the epoch."""

    order: Tensor  # int64 (N,)
    offsets: Tensor  # int64 (N, 2): top-left corner (row, column) of the crop in the padded image
    flips: Tensor  # bool (N,)


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for ``(seed, epoch)``: neighbouring epochs get unrelated streams."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def epoch_plan(seed: int, epoch: int, n: int, pad: int = PAD) -> EpochPlan:
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    order = torch.randperm(n, generator=generator)
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    flips = torch.randint(0, 2, (n,), generator=generator).bool()
    return EpochPlan(order, offsets, flips)


def plan_on(plan: EpochPlan, device: torch.device) -> EpochPlan:
    """The plan's tensors on ``device``: drawn on the CPU (so every device sees the same epoch), then moved
    once per epoch, so that indexing the images there needs no copy per step."""
    return EpochPlan(plan.order.to(device), plan.offsets.to(device), plan.flips.to(device))


def augment(images: Tensor, offsets: Tensor, flips: Tensor, pad: int = PAD) -> Tensor:
    """Random-crop-with-padding and horizontal flip of a uint8 ``(B, H, W, C)`` batch, vectorised.

    Image ``i`` is zero-padded by ``pad`` on each side and cropped back to ``H × W`` at
    ``offsets[i] = (row, column)`` of the padded image (``(pad, pad)`` is the identity), then mirrored
    left-right where ``flips[i]``.
    """
    batch, height, width, _ = images.shape
    padded = F.pad(images, (0, 0, pad, pad, pad, pad))
    device = images.device
    rows = offsets[:, :1] + torch.arange(height, device=device)  # (B, H)
    cols = offsets[:, 1:] + torch.arange(width, device=device)  # (B, W)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    index = torch.arange(batch, device=device)[:, None, None]
    return padded[index, rows[:, :, None], cols[:, None, :]]


# ---------------------------------------------------------------------------------------------- optimisation
def lr_at(step: int, total: int, peak: float, warmup: float) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total``: linear warm-up over the first
    ``warmup`` fraction, then a half cosine down to zero at the last step."""
    warm = max(1, round(warmup * total)) if warmup > 0 else 0
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay weight matrices and kernels only: decaying norm gains, biases or position embeddings only
    fights the normalization (the usual practice for GN/LN networks and ViTs)."""
    decay, keep = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (keep if parameter.ndim <= 1 or name.endswith("pos_embed") else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, config.weight_decay)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=0.9, nesterov=True)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999))
    raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {config.optimizer!r}")


# ---------------------------------------------------------------------------------------------- state
@dataclass
class Progress:
    """Where the run is, and the running sums it reports: all of it goes into the checkpoint."""

    epoch: int = 0  # the epoch being run (0-based); == epochs when training is over
    step: int = 0  # optimizer steps done in this epoch
    global_step: int = 0
    log_lines: int = 0
    wall_time: float = 0.0  # seconds spent training, summed over every (resumed) session
    epoch_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss·n, correct, n
    window_sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    test_accuracy: float | None = None


@dataclass(frozen=True)
class TrainResult:
    model: nn.Module
    progress: Progress
    test_accuracy: float | None
    weights: Path


StepCallback = Callable[[Progress], None]


def data_fingerprint(data: Data) -> str:
    """sha256 of the training images and labels: a resume on other data (say another ``--limit-train``)
    would silently give a model that no single run produces, so it is refused."""
    digest = hashlib.sha256()
    for tensor in data:
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(np.ascontiguousarray(tensor.numpy()).data)
    return digest.hexdigest()


def _save_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    progress: Progress,
    data: str,
) -> None:
    buffer = io.BytesIO()
    torch.save(
        {
            "config": asdict(config),
            "data_sha256": data,
            "progress": asdict(progress),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        buffer,
    )
    atomic_write(path, buffer.getvalue())


def _config_mismatch(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    """Fields that differ between a checkpoint's config and this run's (threads and device may change)."""
    current = asdict(config)
    return [
        f"{k}: {saved.get(k)!r} → {current[k]!r}"
        for k in current
        if k not in PLACEMENT_FIELDS and saved.get(k) != current[k]
    ]


def _resume(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, data: str
) -> Progress:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    differences = _config_mismatch(checkpoint["config"], config)
    if checkpoint.get("data_sha256") != data:
        differences.append("training data (images or labels) differ")
    if differences:
        raise ValueError(
            f"{path} is a checkpoint of another configuration ({'; '.join(differences)}); "
            "resume with the same settings or use another output folder"
        )
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    return Progress(**checkpoint["progress"])


def load_checkpoint_model(path: str | Path) -> tuple[nn.Module, TrainConfig]:
    """The model saved in a training checkpoint (in eval mode) and the config it was trained with."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    config = TrainConfig(**checkpoint["config"])
    model = build(config.arch)
    model.load_state_dict(checkpoint["model"])
    return model.eval(), config


class JsonLog:
    """An append-only JSON-lines log that can be cut back to the lines the last checkpoint knew of."""

    def __init__(self, path: Path, keep_lines: int) -> None:
        self.path = path
        lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
        if len(lines) < keep_lines:
            raise ValueError(f"{path} has {len(lines)} lines but the checkpoint expects {keep_lines}")
        if len(lines) != keep_lines:
            atomic_write(path, "".join(lines[:keep_lines]).encode())
        self.lines = keep_lines

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        self.lines += 1


def read_log(path: str | Path, *, drop_wall_clock: bool = False) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if drop_wall_clock:
        records = [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]
    return records


# ---------------------------------------------------------------------------------------------- evaluation
@torch.inference_mode()
def evaluate(model: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 500) -> float:
    """Top-1 accuracy on uint8 ``(N, H, W, 3)`` images; the model's train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(to_input(images[start : start + batch_size]))
        correct += int((logits.argmax(1) == labels[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / max(1, len(images))


# ---------------------------------------------------------------------------------------------- training
@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _mean(sums: list[float]) -> tuple[float, float]:
    return sums[0] / max(1.0, sums[2]), sums[1] / max(1.0, sums[2])


class _Run:
    """One training session: the objects that ``train`` threads through its epochs."""

    def __init__(
        self,
        config: TrainConfig,
        train_set: Data,
        test_set: Data | None,
        out: Path,
        progress_bar: bool,
        callback: StepCallback | None,
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.steps_per_epoch = len(train_set[0]) // config.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(train_set[0])} training images make no batch of {config.batch_size}")
        self.total_steps = self.steps_per_epoch * config.epochs
        self.data_sha256 = data_fingerprint(train_set)
        self.train_set = _on(train_set, self.device)  # the whole set: 150 MB for CIFAR-10's 50,000 images
        self.test_set = None if test_set is None else _on(test_set, self.device)
        self.checkpoint = out / CHECKPOINT_NAME
        self.progress_bar, self.callback = progress_bar, callback
        torch.manual_seed(config.seed)
        self.model = build(config.arch).to(self.device).train()
        self.optimizer = make_optimizer(self.model, config)
        self.state = Progress()
        if self.checkpoint.is_file():
            self.state = _resume(self.checkpoint, self.model, self.optimizer, config, self.data_sha256)
        self.log = JsonLog(out / LOG_NAME, self.state.log_lines)
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return round(self.state.wall_time + time.perf_counter() - self.started, 3)

    def save(self) -> None:
        self.state.log_lines = self.log.lines
        wall = self.elapsed()
        self.state.wall_time, self.started = wall, time.perf_counter()
        _save_checkpoint(
            self.checkpoint, self.model, self.optimizer, self.config, self.state, self.data_sha256
        )

    def step(self, images: Tensor, labels: Tensor) -> tuple[float, int]:
        """One optimizer step; returns the batch's summed loss and number of correct predictions."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.state.global_step, self.total_steps, self.config.lr, self.config.warmup)
        logits = self.model(to_input(images))
        loss = F.cross_entropy(logits, labels, label_smoothing=self.config.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return float(loss.detach()) * len(labels), int((logits.argmax(1) == labels).sum())

    def run_epoch(self) -> None:
        config, state = self.config, self.state
        images, labels = self.train_set
        plan = plan_on(epoch_plan(config.seed, state.epoch, len(images)), self.device)
        bar = _bar(
            self.steps_per_epoch, state.step, f"epoch {state.epoch + 1}/{config.epochs}", self.progress_bar
        )
        with bar:
            for step in range(state.step, self.steps_per_epoch):
                part = slice(step * config.batch_size, (step + 1) * config.batch_size)
                index = plan.order[part]
                batch = augment(images[index], plan.offsets[part], plan.flips[part])
                loss_sum, correct = self.step(batch, labels[index])
                for sums in (state.epoch_sums, state.window_sums):
                    sums[0], sums[1], sums[2] = sums[0] + loss_sum, sums[1] + correct, sums[2] + len(index)
                state.step, state.global_step = step + 1, state.global_step + 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum / len(index):.3f}", acc=f"{correct / len(index):.3f}")
                self.after_step(last=step + 1 == self.steps_per_epoch)
        self.end_epoch()

    def after_step(self, last: bool) -> None:
        config, state = self.config, self.state
        if config.log_every and state.global_step % config.log_every == 0:
            loss, accuracy = _mean(state.window_sums)
            lr = lr_at(state.global_step - 1, self.total_steps, config.lr, config.warmup)
            self.log.write(
                {
                    "kind": "step",
                    "epoch": state.epoch,
                    "step": state.step,
                    "global_step": state.global_step,
                    "lr": lr,
                    "loss": loss,
                    "acc": accuracy,
                    "time": self.elapsed(),
                }
            )
            state.window_sums = [0.0, 0.0, 0.0]
        if config.checkpoint_every and state.global_step % config.checkpoint_every == 0 and not last:
            self.save()
        if self.callback is not None:
            self.callback(state)

    def end_epoch(self) -> None:
        config, state = self.config, self.state
        final = state.epoch + 1 == config.epochs
        due = config.eval_every > 0 and (state.epoch + 1) % config.eval_every == 0
        loss, accuracy = _mean(state.epoch_sums)
        record: dict[str, Any] = {
            "kind": "epoch",
            "epoch": state.epoch,
            "global_step": state.global_step,
            "train_loss": loss,
            "train_acc": accuracy,
        }
        if self.test_set is not None and (due or final):
            state.test_accuracy = evaluate(self.model, *self.test_set)
            record["test_acc"] = state.test_accuracy
        self.log.write({**record, "time": self.elapsed()})
        state.epoch, state.step, state.epoch_sums = state.epoch + 1, 0, [0.0, 0.0, 0.0]
        self.save()


def _bar(total: int, initial: int, description: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=description, unit="step", disable=not enabled, leave=True)


def train(
    config: TrainConfig,
    train_set: Data,
    out_dir: str | Path,
    *,
    test_set: Data | None = None,
    export_dir: str | Path | None = None,
    command: str = "",
    progress_bar: bool = True,
    callback: StepCallback | None = None,
) -> TrainResult:
    """Train ``config.arch`` on ``train_set``, resuming from ``out_dir/checkpoint.pt`` when it exists.

    ``out_dir`` receives ``checkpoint.pt`` (the full training state) and ``log.jsonl``; when training is
    over, the weights are exported to ``export_dir`` (default ``out_dir``) as ``<arch>.safetensors`` with
    its JSON sidecar. ``callback(progress)`` runs after every step, after any checkpoint of that step (the
    tests use it to interrupt a run). Calling ``train`` again on a finished run only re-exports.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _threads(config.threads):
        run = _Run(config, train_set, test_set, out, progress_bar, callback)
        while run.state.epoch < config.epochs:
            run.run_epoch()
        weights = Path(export_dir or out) / f"{config.arch}.safetensors"
        meta = {**_export_meta(config, run.state, command), "train_data_sha256": run.data_sha256}
        model = run.model.cpu().eval()
        save_trained(model, config.arch, weights, meta)
    return TrainResult(model, run.state, run.state.test_accuracy, weights)


def _export_meta(config: TrainConfig, state: Progress, command: str) -> dict[str, Any]:
    return {
        "command": command,
        "seed": config.seed,
        "epochs": config.epochs,
        "steps": state.global_step,
        "wall_time_s": state.wall_time,
        "test_accuracy": state.test_accuracy,
        "config": asdict(config),
        "torch": torch.__version__,
        "threads": config.threads or torch.get_num_threads(),
        "device": _device_label(torch.device(config.device)),
    }


def _device_label(device: torch.device) -> str:
    """The processor a sidecar names: the GPU's model, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _on(data: Data, device: torch.device) -> Data:
    return data[0].to(device), data[1].to(device)


# ---------------------------------------------------------------------------------------------- timing
def time_steps(
    arch: str, batch_size: int = 128, steps: int = 3, threads: int = 0, device: torch.device | str = "cpu"
) -> dict[str, float]:
    """Seconds per training step of ``arch`` on random data after one warm-up step: wall-clock and the
    process's CPU time (on a shared machine the CPU time, divided by the threads, is the better guide to
    what an unshared machine would take)."""
    config = recipe_config(arch)
    with _threads(threads):
        torch.manual_seed(0)
        model = build(arch).to(device).train()
        optimizer = make_optimizer(model, config)
        images = torch.randint(0, 256, (batch_size, 32, 32, 3), dtype=torch.uint8, device=device)
        labels = torch.randint(0, 10, (batch_size,), device=device)

        def one() -> None:
            loss = F.cross_entropy(model(to_input(images)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            float(loss.detach())  # waits for the device, as a training step does when it reads its loss

        one()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            one()
        return {
            "wall_s": (time.perf_counter() - wall) / steps,
            "cpu_s": (time.process_time() - cpu) / steps,
            "threads": float(torch.get_num_threads()),
            "parameters": float(sum(p.numel() for p in model.parameters())),
        }


def config_fields() -> list[str]:
    return [f.name for f in fields(TrainConfig)]
