"""A task's progress on disk, so that a run stopped part-way goes on from its last checkpoint, not from
its first batch.

A mixed-stream run is long on a CPU (one stream over all 15 corruptions) and a stacked batch-size-1 task
longer (a step per image), and a run stores its result only when it ends: a signal, a lost machine or the
end of a working session threw all of it away. The runner now writes what the next step reads (the
adapter's state and record, the scores so far, the random state, the clock) every ``CHECKPOINT_EVERY``
seconds; the same task started again loads it and skips the batches it has seen. The resumed run gives
the numbers of the run that was never stopped.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zerosiam.assets.files import atomic_file

CHECKPOINT_EVERY = 300.0  # seconds between writes: a write costs well under a second, a stop loses less


def task_key(run_ids: tuple[str, ...]) -> str:
    """The file name of a task's checkpoint: its run id, or for stacked runs a digest of all of them."""
    if len(run_ids) == 1:
        return run_ids[0]
    return hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()


@dataclass
class RunCheckpoint:
    """The checkpoint of the task of ``run_ids`` in ``folder``, written at most every ``every`` seconds."""

    folder: Path
    run_ids: tuple[str, ...]
    every: float = CHECKPOINT_EVERY
    _written: float = field(default_factory=time.monotonic, repr=False)  # a start counts as a write

    @property
    def path(self) -> Path:
        return self.folder / f"{task_key(self.run_ids)}.pt"

    def due(self) -> bool:
        return time.monotonic() - self._written >= self.every

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` whole or not at all, through the package's one atomic writer: a stop during the
        write, even ``KeyboardInterrupt``, leaves the previous checkpoint and no temporary file. A write
        that fails (a full disk) is a warning: the run goes on, only its insurance is older."""
        try:
            with atomic_file(self.path) as file:
                torch.save({"run_ids": list(self.run_ids), **state}, file)
        except OSError as error:
            warnings.warn(f"could not write checkpoint {self.path} ({error}); the run goes on", stacklevel=2)
        self._written = time.monotonic()

    def load(self, device: torch.device) -> dict[str, Any] | None:
        """The saved state with its tensors on ``device``, or None when there is none to resume from; one
        that cannot be read, or is of other runs, is a warning and the task starts over."""
        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location=device, weights_only=True)
        except Exception as error:  # a truncated or foreign file: pickle, zip and torch errors alike
            warnings.warn(
                f"checkpoint {self.path} is unreadable ({error}); the task starts over", stacklevel=2
            )
            return None
        if not isinstance(state, dict) or state.get("run_ids") != list(self.run_ids):
            warnings.warn(f"checkpoint {self.path} is of other runs; the task starts over", stacklevel=2)
            return None
        return state

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def random_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The generators a step may draw from (DeYO's patch shuffles): the host's, and the GPU's on one."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_random_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put ``random_state`` back (a checkpoint loaded onto a GPU holds it there: generators want it on
    the host). A checkpoint moved from a GPU to the CPU, or back, resumes with the host's alone."""
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


@dataclass(frozen=True)
class Checkpointing:
    """Where a grid's tasks keep their checkpoints, and how often they write them (picklable: it travels
    to pool workers and Ray tasks; a Ray cluster resumes a task only on a folder its nodes share)."""

    folder: Path
    every: float = CHECKPOINT_EVERY

    @classmethod
    def beside(cls, store: Path, every: float = CHECKPOINT_EVERY) -> Checkpointing:
        """The checkpoints of the runs of the result store ``store``: the folder ``<store>.checkpoints``."""
        return cls(store.with_name(f"{store.name}.checkpoints"), every)

    def of(self, run_ids: tuple[str, ...]) -> RunCheckpoint:
        return RunCheckpoint(self.folder, run_ids, self.every)
