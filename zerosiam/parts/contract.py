"""The plug-in contract: what a part sees and what it may ask of the learner it serves.

Parts (selection rules, weights, regularizers, optimizer steps, recovery rules) are shared by every
learner: the image ``Adapter`` and the language-model adapter run the very same recipe objects. So a part
never knows which adapter it serves. It sees a ``Batch`` (one forward's logits and what rules need
besides) and, where it must move weights (SAM) or read them (EATA's Fisher), a ``Learner``: the few
members a step uses, nothing more. Both adapters implement ``Learner``; parts depend on this module and
on the layout it names (``zerosiam.parts.layout``: one stream or B stacked), nothing else of a learner.
A guard (``zerosiam.parts.guards``) may use a little more: the ``GuardedLearner``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor, nn

from zerosiam.parts.layout import ONE_STREAM, Layout

Modality = Literal["image", "text"]
MODALITIES: tuple[Modality, ...] = ("image", "text")


class ModalityError(ValueError):
    """A part was asked to work on data it has no meaning for (DeYO's patch shuffle on text)."""


class Learner(Protocol):
    """What a step, a regularizer or a rule may use of the adapter it serves.

    ``params`` are the adapted weights by name (norm affine parameters of an image model, LoRA weights of
    a language model); ``trainable`` is everything the optimizer moves (``params`` and ZeroSiam's
    predictor). ``backward`` leaves finite gradients or none; ``skip`` records why a step did not move,
    ``hold`` why some streams did not; ``drawn`` gives what a step draws at random on the host.
    ``layout`` says how many independent streams each batch stacks (each weight then has one row per
    stream, stream first) and makes every per-stream reduction (``zerosiam.parts.layout``), so that no
    part branches on the number of streams.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    params: dict[str, nn.Parameter]
    layout: Layout

    @property
    def trainable(self) -> list[nn.Parameter]: ...

    def backward(self, loss: Tensor) -> bool: ...

    def descend(self, loss: Tensor) -> bool: ...

    def skip(self, reason: str) -> None: ...

    def hold(self, reason: str, streams: Tensor) -> None: ...

    def drawn(self, name: str, draw: Callable[[], Tensor]) -> Tensor: ...

    @property
    def skipped(self) -> str | None: ...


class GuardedLearner(Protocol):
    """What a guard may use of the learner it watches, stream by stream: restores, snapshots of the
    adapted weights, a smaller step and the full one back, and the source model's prediction
    (``zerosiam.parts.guards``)."""

    layout: Layout

    def restore_source(self, streams: Tensor | None = None) -> None: ...

    def snapshot(self) -> dict[str, dict[str, Tensor]]: ...

    def roll_back(self, snapshot: dict[str, dict[str, Tensor]], streams: Tensor) -> None: ...

    def source_prediction(self, x: Tensor) -> Tensor: ...

    def shrink(self, streams: Tensor, factor: float) -> None: ...

    def full_step(self, streams: Tensor) -> None: ...


@dataclass
class Batch:
    """What selection rules, weights and objectives see of one forward.

    ``logits`` is the branch the objective acts on (the online branch under ZeroSiam, otherwise the
    model's output), one row per sample: an image, or one generated position of a language model;
    ``target`` is the model's own output; ``entropy`` is the detached entropy of ``logits``. ``x`` is the
    input the model saw and ``tokens`` the token each row predicts, where there is one (TLM's prompt).
    ``learner`` gives rules that need it (DeYO's second view, EATA's Fisher) the model.
    ``kept`` is what the rules before the current one kept, so a costly rule (DeYO's second forward)
    can work on those samples only, as its authors' code does; ``cache`` holds per-forward values that
    a rule and a weight share (DeYO's PLPD) so they are computed once. ``layout`` says how the rows
    belong to independent streams, stream-major, and reduces per stream (``zerosiam.parts.layout``).
    """

    x: Tensor
    logits: Tensor
    target: Tensor
    entropy: Tensor
    learner: Learner
    modality: Modality = "image"
    tokens: Tensor | None = None
    kept: Tensor | None = None
    cache: dict[str, Tensor] = field(default_factory=dict)
    layout: Layout = ONE_STREAM

    @property
    def streams(self) -> int:
        """How many independent streams the rows stack."""
        return self.layout.count

    def require(self, modality: Modality, part: str) -> None:
        """Refuse, in one line, a part that has no meaning for this batch's modality."""
        if self.modality != modality:
            raise ModalityError(f"{part} works on {modality} batches only; this batch is {self.modality}")


@dataclass
class Evaluation:
    """One loss evaluation: the scalar to minimize, the selected samples and what to report.

    ``terms`` are per-stream values on the model's device (0-d for one stream, ``[B]`` for B), read back
    with the step's diagnostics in bulk.
    ``filtered`` says whether any rule (or a restriction) could have dropped a sample; when none could,
    every sample is selected and a step need not ask the device how many.
    """

    loss: Tensor
    mask: Tensor
    batch: Batch
    terms: dict[str, Tensor] = field(default_factory=dict)
    filtered: bool = True

    @property
    def selected(self) -> int:
        """How many samples count (a read from the device when a rule could have dropped some)."""
        return int(self.mask.sum()) if self.filtered else int(self.mask.numel())


class Rule(Protocol):
    """A sample-selection rule: a boolean mask over the batch. May keep state (``reset``/``observe``)."""

    def __call__(self, batch: Batch) -> Tensor: ...


class BatchObjective(Protocol):
    """A per-sample objective that needs more of the batch than its logits (TLM's prompt perplexity
    needs the prompt's tokens). ``positions`` says which rows a language model feeds it."""

    positions: Literal["generated", "prompt"]

    def per_sample(self, batch: Batch) -> Tensor: ...


Weighting = Callable[[Batch], Tensor]
Regularizer = Callable[[Learner], Tensor]  # a per-stream value (``learner.layout.weight_sum``)
Closure = Callable[..., Evaluation]


class Step(Protocol):
    """How the optimizer moves given a loss closure; returns every evaluation it made."""

    def __call__(self, learner: Learner, closure: Closure) -> list[Evaluation]: ...


class Recovery(Protocol):
    """Decides from a step's evaluations which streams must be reset to their source state: per-stream
    flags (a 0-d boolean tensor for one stream, ``[B]`` for B)."""

    def __call__(self, evaluations: list[Evaluation]) -> Tensor: ...


def plain_step(learner: Learner, closure: Closure) -> list[Evaluation]:
    """One gradient step on one evaluation; skipped when no sample is selected (on the fixed-shape path
    taken all the same, and put back by the learner)."""
    evaluation = closure()
    if not learner.layout.reads_device or evaluation.selected:
        learner.descend(evaluation.loss)
    return [evaluation]
