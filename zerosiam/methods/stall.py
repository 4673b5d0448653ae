"""A warning for an adapter that has stopped adapting.

A selective method (SAR, EATA, DeYO, COME) learns only from the samples its rules keep. On a model that is
not confident on the data (inputs normalized wrongly, a shift too strong for the entropy threshold) no
sample passes, and the adapter runs on as the source model, step after step: its record says
``updated: False`` each time, but nothing is said while it runs. ``StallWatch`` reads the record and warns
once, naming the method, how many steps in a row moved nothing, and the likely cause. Any adapter wears
it; one whose steps are skipped for another reason (a non-finite loss) is told that reason instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from zerosiam.methods.online import StepLog

__all__ = ["STALLED_STEPS", "NoUpdateWarning", "StallWatch"]

STALLED_STEPS = 100
"""How many consecutive steps without an update make an adapter warn, and how often it reads its record
to tell. A selective method on data it suits keeps samples in nearly every batch; a batch or a run of a
few with none is ordinary (a hard stretch of the stream, EATA's redundancy filter), so a short count
would cry wolf. 100 batches (6,400 images at batch size 64, a tenth of an ImageNet-C corruption) with
not one kept sample is no longer chance. Reading the record from the device once per 100 steps costs
nothing a step would notice."""


class NoUpdateWarning(UserWarning):
    """An adapter has made no update for ``STALLED_STEPS`` consecutive steps: it runs as the source model."""


class StallWatch:
    """Counts, per stream, the consecutive steps that moved nothing, from the adapter's record, and warns
    once the longest run reaches ``STALLED_STEPS``."""

    def __init__(self, method: str, selective: bool) -> None:
        self.method = method
        self.selective = selective
        self.warned = False
        self.restart()

    def restart(self, seen: int = 0) -> None:
        """Count from row ``seen`` of the record on (0 after a reset; a loaded checkpoint's length)."""
        self._seen = seen
        self._idle: list[int] = []  # per stream, the current run of steps without an update
        self._reason: list[str | None] = []  # per stream, why its latest idle step was skipped, if it was

    def after_step(self, log: StepLog) -> None:
        """Every ``STALLED_STEPS`` steps, read the new rows of ``log`` and warn if a stream has gone that
        many steps in a row without an update (once per adapter)."""
        if self.warned or log.steps % STALLED_STEPS:
            return
        rows = log.rows
        for row in rows[self._seen :]:
            self._count(row)
            if max(self._idle) >= STALLED_STEPS:
                self._warn()
                return
        self._seen = len(rows)

    def _count(self, row: dict[str, Any]) -> None:
        updated = _per_stream(row["updated"])
        skipped = _per_stream(row.get("skipped"), len(updated))
        if not self._idle:
            self._idle, self._reason = [0] * len(updated), [None] * len(updated)
        for stream, (moved, reason) in enumerate(zip(updated, skipped, strict=True)):
            self._idle[stream] = 0 if moved else self._idle[stream] + 1
            self._reason[stream] = reason

    def _warn(self) -> None:
        self.warned = True
        stream = max(range(len(self._idle)), key=self._idle.__getitem__)
        where = f" (stream {stream})" if len(self._idle) > 1 else ""
        warnings.warn(
            f"{self.method}{where} made no update in {self._idle[stream]} consecutive steps: "
            f"{self._cause(self._reason[stream])}; it predicts as the source model meanwhile",
            NoUpdateWarning,
            stacklevel=5,  # the user's call of the adapter
        )

    def _cause(self, reason: str | None) -> str:
        if reason is not None and not (self.selective and reason.startswith("no sample")):
            return f"every step was skipped ({reason})"
        return (
            "no sample passed its selection, so the model is likely not confident on this data for its "
            "threshold (check the inputs' normalization and size, or pass a looser select=)"
        )


def _per_stream(value: Any, streams: int = 1) -> list[Any]:
    """A record's value as a list of one per stream (a lone stream's value is not a list)."""
    return list(value) if isinstance(value, list) else [value] * streams
