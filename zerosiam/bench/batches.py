"""A run's streams as batches: loaded ahead of the loop, stacked, scored and set aside.

``run_stacked`` steps one adapter over several streams at once (``zerosiam.adapt(..., streams=B)``); this
module is the machinery around that loop, apart from what a run is and measures. ``StreamBatches`` hands a
stream's batches to a ``DataLoader`` (``StackedBatches`` a task's streams', to one); ``check_stackable``
says which runs may share an adapter and ``padded`` brings their streams to one length; ``Score`` keeps
each stream's online accuracy; ``SetAside`` keeps the weights of a stream that ended before the others, so
that it is judged as it stood at its end.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from zerosiam.bench import datasets
from zerosiam.bench.spec import RunSpec
from zerosiam.data.sources import EncodedBatch, EncodedFiles, ImageFiles
from zerosiam.methods.adapter import Adapter
from zerosiam.methods.relay import Relay
from zerosiam.parts.streams import put_rows
from zerosiam.protocols import streams
from zerosiam.protocols.build import SEQUENCES, Stream, gather_batch

STACKED_PROTOCOLS = ("bs1", "label_shift_bs1", "blind_spot")  # one-sample steps
# What stacked runs may differ in: each stream is built from its own run's corruption and seed (the seed
# orders the stream) and rounded as its replica says, while the model, the method and its rates are the
# adapter's and shared.
STACKED_AXES = ("corruption", "seed", "replica")


def unstacked(values: dict[str, object]) -> dict[str, object]:
    """A run's spec (``RunSpec.as_dict``) without the axes stacked runs may differ in: runs that share it
    may share an adapter."""
    return {field: value for field, value in values.items() if field not in STACKED_AXES}


def check_stackable(specs: Sequence[RunSpec]) -> RunSpec:
    """The runs' common spec if they may share one stacked adapter: the same run but for the corruption,
    the seed and the replica (``STACKED_AXES``), no prelude (a relay hands one model over) and not the
    mixed protocol (one stream already); otherwise a one-line error."""
    if not specs:
        raise ValueError("no runs to stack")
    first = specs[0]
    if len(specs) == 1:
        return first
    common = unstacked(first.as_dict())
    for spec in specs[1:]:
        values = spec.as_dict()
        differing = [field for field, value in common.items() if values[field] != value]
        if differing:
            raise ValueError(f"stacked runs may differ in {', '.join(STACKED_AXES)} only, not in {differing}")
    if first.prelude or first.corruption in SEQUENCES:
        raise ValueError(
            f"runs with a prelude or over a sequence of domains do not stack (protocol {first.protocol!r}, "
            f"prelude {first.prelude or 'none'})"
        )
    return first


class StreamBatches(torch.utils.data.Dataset):
    """A stream's batches, in order, as a ``Dataset`` of uint8 images and labels: a ``DataLoader`` then
    gathers (for files: decodes) them in worker processes ahead of the loop, in exactly the stream's
    order, and hands them over in pinned memory for a GPU."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        bounds = streams.batches(stream.rows, stream.batch_size)
        self.bounds = list(zip(bounds[:-1], bounds[1:], strict=True))

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> tuple[torch.Tensor | EncodedBatch, torch.Tensor]:
        a, b = self.bounds[index]
        return gather_batch(self.stream, self.stream.rows[a:b])

    def loader(self, device: torch.device, start: int = 0) -> torch.utils.data.DataLoader:
        """The loader of the batches from ``start`` on."""
        return ordered_loader(self, [self.stream], device, start)


class StackedBatches(torch.utils.data.Dataset):
    """Step ``i`` of every stacked stream (each brought to one length by ``padded``) as one batch, stream
    after stream: one loader, with the machine's decoding workers, serves a task however many streams it
    stacks, where a loader per stream would start a worker or more for each of up to 45 streams."""

    def __init__(self, streams: Sequence[StreamBatches]) -> None:
        self.streams = streams

    def __len__(self) -> int:
        return len(self.streams[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor | EncodedBatch, torch.Tensor]:
        data = [stream[index] for stream in self.streams]
        labels = torch.cat([y for _, y in data])
        if isinstance(data[0][0], EncodedBatch):  # files for the device to decode, stream after stream
            return EncodedBatch.joined(x for x, _ in data), labels
        return torch.cat([x for x, _ in data]), labels

    def loader(self, device: torch.device, start: int = 0) -> torch.utils.data.DataLoader:
        """The loader of the stacked batches from ``start`` on."""
        return ordered_loader(self, [batches.stream for batches in self.streams], device, start)


def ordered_loader(
    dataset: torch.utils.data.Dataset, sources: Sequence[Stream], device: torch.device, start: int = 0
) -> torch.utils.data.DataLoader:
    """A loader of ``dataset``'s batches from ``start`` on, in order, gathered (for files: decoded) ahead
    by as many workers as the domains of ``sources`` call for, in pinned memory for a GPU."""
    domains = [images for source in sources for images, _ in source.domains]
    workers = max((datasets.loader_workers(images) for images in domains), default=0)
    return torch.utils.data.DataLoader(
        torch.utils.data.Subset(dataset, range(start, len(dataset))) if start else dataset,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=4 if workers else None,
    )


def encoded(stream: Stream) -> Stream:
    """``stream`` with its files read, not decoded, by the loader's workers, for the device to decode
    (``Speed(decode_on_device=True)``); a one-line error for a stream whose images are not files."""
    if not all(isinstance(images, ImageFiles) for images, _ in stream.domains):
        raise ValueError(
            "decode_on_device decodes image files (an ImageNet-C folder, imagenet-c:PATH); this dataset's "
            "images are decoded into memory already"
        )
    domains = [(EncodedFiles(images), labels) for images, labels in stream.domains]
    return dataclasses.replace(stream, domains=domains)


def padded(stream: Stream, length: int) -> Stream:
    """``stream`` brought to ``length`` steps by playing its rows again: the stacked streams of one task
    step together, so one that ends first fills the steps after its end with filler. Nothing of those
    steps is scored or kept (``SetAside``). Only one-sample steps are padded: a filler row must not join
    a stream's own last batch."""
    missing = length - len(stream.rows)
    if missing <= 0:
        return stream
    if stream.batch_size != 1:
        raise ValueError(f"stacked streams of batch size {stream.batch_size} must be of one length")
    return dataclasses.replace(
        stream,
        rows=np.concatenate([stream.rows, np.resize(stream.rows, (missing, stream.rows.shape[1]))]),
        evaluated=np.concatenate([stream.evaluated, np.zeros(missing, bool)]),
    )


class Score:
    """One run's online accuracy, per domain, with the prelude's batches scored apart, and its curve."""

    def __init__(self, stream: Stream, prelude_steps: int, device: torch.device) -> None:
        self.stream = stream
        self.prelude_steps = prelude_steps
        self.device = device
        self.counts = torch.zeros(4, len(stream.domains), device=device)  # right, seen; prelude's too
        self._curve: list[torch.Tensor] = []

    def add(self, index: int, a: int, b: int, hits: torch.Tensor) -> None:
        """Score batch ``index``, the stream's rows ``a:b``, whose predictions hit or missed as ``hits``."""
        counted = np.flatnonzero(self.stream.evaluated[a:b])  # known on the host: no question to the device
        if not len(counted):
            self._curve.append(torch.tensor(math.nan, device=self.device))
            return
        where = torch.from_numpy(counted).to(self.device, non_blocking=True)
        domain = torch.from_numpy(self.stream.rows[a:b][counted, 0]).to(self.device, non_blocking=True)
        right, total = self.counts[:2] if index >= self.prelude_steps else self.counts[2:]
        right.index_add_(0, domain, hits[where])
        total.index_add_(0, domain, torch.ones_like(hits[where]))
        self._curve.append(hits[where].mean())

    def state_dict(self) -> dict[str, torch.Tensor]:
        curve = torch.stack(self._curve) if self._curve else torch.empty(0, device=self.device)
        return {"counts": self.counts.clone(), "curve": curve}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.counts.copy_(state["counts"])
        self._curve = list(state["curve"].unbind())

    def frozen(self, hits: np.ndarray) -> None:
        """The blind spot: only the frozen rows, scored by the adapted model after the stream, count."""
        self.counts[:2, 0] = torch.tensor([hits.sum(), len(hits)], device=self.counts.device)

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        counts = self.counts[:2].cpu().double().numpy()  # whole counts: exact
        return counts[0], counts[1]

    @property
    def prelude_accuracy(self) -> float:
        return float(self.counts[2].sum() / self.counts[3].sum().clamp_min(1))

    def curve(self) -> list[float]:
        return torch.stack(self._curve).tolist() if self._curve else []


class SetAside:
    """Each stacked stream's adapted weights as they were after its own last step.

    Stacked streams step together for as long as the longest, so a stream whose stream ended earlier
    (the blind spot's one pass over a corruption with fewer mistakes) keeps adapting on filler. Its
    weights at its own end are set aside here and put back before the frozen scoring, which reads only
    the adapted weights (``Adapter.predict`` forwards the model, not the predictor). Streams of one
    length set nothing aside.
    """

    def __init__(self, adapter: Adapter | Relay, ends: list[int]) -> None:
        self.ends = ends
        self.adapter = adapter
        early = any(end < max(ends) for end in ends) and adapter.recipe.adapts  # NoAdapt keeps no weights
        self.kept = {name: p.detach().clone() for name, p in adapter.params.items()} if early else {}

    def after(self, step: int) -> None:
        """Set aside the weights of the streams whose last step was ``step`` (counted from 1)."""
        if not self.kept or step not in self.ends:
            return
        for name, param in self.adapter.params.items():
            done = torch.tensor([end == step for end in self.ends], device=param.device)
            put_rows(self.kept[name], param.detach(), done)

    def put_back(self) -> None:
        """Every stream's weights as they were at its own end (the longest's are its current ones)."""
        if not self.kept:
            return
        self.after(max(self.ends))
        with torch.no_grad():
            for name, param in self.adapter.params.items():
                param.copy_(self.kept[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.kept.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in state.items():
            self.kept[name].copy_(tensor)
