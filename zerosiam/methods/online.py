"""What every wrapper ``zerosiam.adapt`` returns does, whether it adapts or not.

``wrapper(x)`` returns the prediction for ``x`` and records the step's diagnostics; ``predict(x)``
predicts without a step or a record (scoring a frozen model); ``history`` is every step's record,
``reset()`` goes back to the start, ``release()`` hands the model back as it came. ``Adapter``
(``methods/adapter.py``) adds the adaptation; ``Frozen`` is NoAdapt: the source model as it is, a whole
object with nothing left undefined. Both read a model's logits by one rule, whatever it returns
(``zerosiam.parts.split.logits_of``), and keep their record on the device (``StepLog``).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.methods.recipe import Recipe
from zerosiam.parts.layout import Layout, layout_for
from zerosiam.parts.losses import entropy
from zerosiam.parts.precision import forward_precision, tensor_cores
from zerosiam.parts.predictor import identity_drift
from zerosiam.parts.split import LogitsOutput, OutputChoice


class NonFiniteInputError(ValueError):
    """The batch holds NaN or Inf: adapting on it would poison the weights, so it is refused."""


@dataclass(frozen=True)
class Settings:
    """Optimizer settings resolved for this adapter (learning rates depend on model and batch size)."""

    lr: float
    predictor_lr: float
    momentum: float = 0.9  # SGD momentum 0.9 for every image method (methods.md)
    precision: str = "fp32"  # the forward's precision (parts.precision); losses and updates stay float32
    diagnostics: bool = True  # the per-step collapse indicators (entropy, logit norm, ...); off: counts only
    fixed_shape: bool = False  # every decision of a step on the device (``Layout.reads_device``)


class StepLog:
    """Every step's diagnostics, one row a step: the paper's collapse indicators of the prediction and
    what the step did. Values are left on the model's device (no wait for the host in the loop) and
    read back in bulk by ``rows``; a per-stream value becomes a list of one per stacked stream."""

    def __init__(self, layout: Layout, diagnostics: bool) -> None:
        self.layout = layout
        self.diagnostics = diagnostics
        self._rows: list[dict[str, Any]] = []
        self._read = 0  # rows already read back from the device
        self.steps = 0

    def add(self, prediction: Tensor, predictor: nn.Module | None, step: dict[str, Any]) -> None:
        """Append a step: the indicators of ``prediction`` (and of the predictor), then ``step``."""
        row: dict[str, Any] = {"step": self.steps}
        if self.diagnostics:
            logits = self.layout.rows(prediction.detach().float().flatten(0, -2))
            norms = logits.norm(dim=-1)
            row["entropy"] = self.layout.value(entropy(logits).mean(-1))
            row["logit_norm"] = self.layout.value(norms.mean(-1))
            centre = logits.mean(-2).norm(dim=-1) / norms.mean(-1).clamp_min(1e-12)
            row["centre_dominance"] = self.layout.value(centre)
            row["predictor_drift"] = identity_drift(predictor) if predictor is not None else math.nan
        row.update(step)
        self._rows.append(row)
        self.steps += 1

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every step's diagnostics as Python numbers; what is still on the device is read back here,
        all pending steps in one transfer."""
        pending = [
            (row, key) for row in self._rows[self._read :] for key, v in row.items() if torch.is_tensor(v)
        ]
        if pending:
            tensors = [row[key].detach() for row, key in pending]
            values = torch.cat([t.float().reshape(-1) for t in tensors]).cpu().tolist()
            start = 0
            for (row, key), tensor in zip(pending, tensors, strict=True):
                convert = _AS_PYTHON.get(key, float)
                read = [convert(v) for v in values[start : start + tensor.numel()]]
                row[key] = read if tensor.ndim else read[0]
                start += tensor.numel()
        self._read = len(self._rows)
        return self._rows

    def clear(self) -> None:
        self._rows.clear()
        self._read = 0
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "history": copy.deepcopy(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
        self._rows = copy.deepcopy(state.get("history", []))  # checkpoints of old had no record
        self._read = len(self._rows)


_REASONS: list[str] = []
"""Every reason a stream was held back for, in the order first given: ``reason_code`` 1, 2, ..."""


def reason_code(reason: str) -> int:
    """The code a held stream's reason is recorded by on the device (0: not held); read back as the
    reason (``reason_of``). The reasons are a handful of fixed sentences of the parts that hold streams."""
    if reason not in _REASONS:
        _REASONS.append(reason)
    return _REASONS.index(reason) + 1


def reason_of(code: float) -> str | None:
    """The reason a code of ``reason_code`` stands for; None for 0."""
    return _REASONS[int(code) - 1] if code else None


_AS_PYTHON = {
    "selected": int,
    "updated": bool,
    "recovered": bool,
    "guard": bool,
    "skipped": reason_of,
}  # diagnostics that are not real numbers


class OnlineModel:
    """The face every wrapper shows: predict, record, reset, give the model back.

    A wrapper holds its model from the moment it is built until ``release()``: no other wrapper may take
    it meanwhile (``refuse_held``). If its first forward fails (the model's output is not logits, its head
    cannot be found, ...), it releases the model before the error goes on, so that the model comes back
    as it was given and the fix the error suggests can be tried on the same object.
    """

    predictor: nn.Module | None = None  # ZeroSiam's h, where the method has one
    _released: str | None = None  # why the wrapper no longer holds its model; None while it does
    _proven = False  # whether a forward has gone through: before one, a failure releases the model

    def __init__(
        self, model: nn.Module, recipe: Recipe, settings: Settings, streams: int, output: OutputChoice
    ) -> None:
        refuse_held(model)
        self.model = model
        self.layout = layout_for(streams, reads_device=not settings.fixed_shape)
        self.recipe = copy.deepcopy(recipe)  # rules keep state (moving averages, EMA): one copy per adapter
        self.settings = settings
        self.log = StepLog(self.layout, settings.diagnostics)
        self._logits = LogitsOutput(model, output)  # model(x) is the logits, whatever the model returns
        self._requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        self._training = {name: m.training for name, m in model.named_modules()}
        self._on_release: list[Callable[[], None]] = []  # what others put on the model (speed options)
        _HOLDERS[model] = weakref.ref(self)

    @property
    def streams(self) -> int:
        """How many independent streams each batch stacks."""
        return self.layout.count

    @property
    def steps(self) -> int:
        """How many batches this wrapper has taken since it was built or reset."""
        return self.log.steps

    @property
    def released(self) -> bool:
        """Whether the model has been handed back (by ``release()``, or after a failed first forward)."""
        return self._released is not None

    def __call__(self, x: Tensor) -> Tensor:
        """The prediction for ``x`` from the current weights; then, for an adapter, one step on ``x``."""
        self._check_holding()
        with tensor_cores(self.settings.precision):
            x = in_dtype_of(self.model, x)
            self._check_input(x)
            with self._released_if_first_fails():
                return self._take(x)

    def _take(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def predict(self, x: Tensor) -> Tensor:
        """The prediction for ``x`` from the current weights, with no adaptation step and no record: for
        scoring a model frozen after adapting (the blind-spot protocol)."""
        self._check_holding()
        x = in_dtype_of(self.model, x)
        self._check_input(x)
        with torch.no_grad(), self._released_if_first_fails():
            return self._forward(x)

    def _check_holding(self) -> None:
        """Refuse to run a model this wrapper has handed back: its modes, flags and hooks are the user's
        again, and a step on it would adapt a model nobody asked to adapt."""
        if self._released is not None:
            raise RuntimeError(
                f"this {self.recipe.name} wrapper released its model ({self._released}); wrap it again with "
                "zerosiam.adapt(model, ...)"
            )

    @contextlib.contextmanager
    def _released_if_first_fails(self) -> Iterator[None]:
        """Until a forward has gone through, an error releases the model before it goes on: a model the
        adapter cannot read (its output is not logits, its head cannot be found) is given back as it came,
        not left with the adapter's hooks, flags and modes on it."""
        try:
            yield
        except Exception as error:
            if not self._proven:
                self.release()
                self._released = f"its first forward failed with {type(error).__name__}"
            raise
        self._proven = True

    def _check_input(self, x: Tensor) -> None:
        check_input(x)
        if x.shape[0] % self.streams:
            raise ValueError(f"a batch of {x.shape[0]} samples does not split into {self.streams} streams")

    def _forward(self, x: Tensor) -> Tensor:
        """The model's logits in float32, its forward at the wrapper's precision."""
        with forward_precision(self.settings.precision, x.device):
            return self.model(x).float()

    def forget(self) -> None:
        """Clear the record of the steps taken."""
        self.log.clear()

    def when_released(self, undo: Callable[[], None]) -> None:
        """Have ``release`` call ``undo`` once the model is handed back (last added, first undone)."""
        self._on_release.append(undo)

    def release(self, keep_adapted: bool = False) -> nn.Module:
        """Hand the model back with its modes, flags and output as they came (an adapter also restores
        its weights first, unless ``keep_adapted``), then undo what was put on it after it was built.
        Releasing again does nothing: the model may be another wrapper's by then."""
        if self._released is not None:
            return self.model
        self._released = "release() was called"
        self._logits.close()
        for name, param in self.model.named_parameters():
            param.requires_grad_(self._requires_grad[name])
        for name, module in self.model.named_modules():
            module.training = self._training[name]
        while self._on_release:
            self._on_release.pop()()
        _HOLDERS.pop(self.model, None)
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint: the method, and the record of the steps so far (read back from the device)."""
        return {"method": self.recipe.name, **self.log.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("method") != self.recipe.name:
            raise ValueError(
                f"checkpoint is of method {state.get('method')!r}, this adapter runs {self.recipe.name!r}"
            )
        self.log.load_state_dict(state)

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every step's diagnostics as Python numbers (lists of one per stream for stacked streams)."""
        return self.log.rows

    def stream_history(self, stream: int) -> list[dict[str, Any]]:
        """``history`` as seen by stream ``stream`` alone: every per-stream list replaced by its value."""
        if not 0 <= stream < self.streams:
            raise ValueError(f"stream {stream} out of range: this adapter runs {self.streams}")
        return [
            {key: value[stream] if isinstance(value, list) else value for key, value in row.items()}
            for row in self.history
        ]

    @property
    def last(self) -> dict[str, Any]:
        """The most recent step's diagnostics."""
        history = self.history
        if not history:
            raise RuntimeError("no step has been taken yet")
        return history[-1]


class Frozen(OnlineModel):
    """NoAdapt: the source model in eval mode, predicting each batch as it comes; nothing adapts, so
    there are no parameters to move (``params`` is empty), no optimizer and nothing to restore."""

    def __init__(
        self,
        model: nn.Module,
        recipe: Recipe,
        settings: Settings,
        streams: int = 1,
        output: OutputChoice = None,
    ) -> None:
        super().__init__(model, recipe, settings, streams, output)
        self.params: dict[str, nn.Parameter] = {}
        model.eval()

    def _take(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            prediction = self._forward(x)
        self.log.add(prediction, None, {"updated": False})
        return prediction

    def reset(self) -> None:
        """Back to the start: the record cleared (the model never moved)."""
        self.forget()


_HOLDERS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[OnlineModel]] = weakref.WeakKeyDictionary()
"""Which wrapper holds each model, weakly both ways: a model or a wrapper nobody keeps is not kept here."""


def holder_of(model: nn.Module) -> OnlineModel | None:
    """The live wrapper that holds ``model`` (built on it and not released), or None."""
    holder = _HOLDERS.get(model)
    wrapper = holder() if holder is not None else None
    return wrapper if wrapper is not None and not wrapper.released else None


def refuse_held(model: nn.Module) -> None:
    """Refuse, in one line, a model that another wrapper holds: a second adapter would take the first
    one's adapted weights as its source, so its ``reset()`` could not give back the model's own."""
    holder = holder_of(model)
    if holder is not None:
        raise ValueError(
            f"this {type(model).__name__} is already held by a live {type(holder).__name__} "
            f"({holder.recipe.name}): a second adapter's reset() and release() would not give back the "
            "original; call release() on the first, or adapt a copy of the model made before it"
        )


def in_dtype_of(model: nn.Module, x: Tensor) -> Tensor:
    """A floating-point batch of another precision (float64 from numpy, a half batch) in the floating
    dtype of ``model``'s weights, which its first layer would otherwise refuse with a dtype mismatch; any
    other input is left as it is, for ``check_input`` to refuse in one line."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        return x
    tensors = itertools.chain(
        (p for p in model.parameters() if p.requires_grad),  # the weights that learn, first: frozen
        model.parameters(),  # ones may be stored in bfloat16 for speed (``frozen_bf16``)
        model.buffers(),
    )
    dtype = next((t for t in tensors if t.is_floating_point()), x).dtype
    return x if x.dtype == dtype else x.to(dtype)


def check_input(x: Tensor) -> None:
    """A floating-point, non-empty, finite batch; otherwise a one-line error, before any work."""
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a torch.Tensor batch, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point batch, got dtype {x.dtype}; convert images with x.float() / 255"
        )
    if x.ndim < 2 or x.shape[0] == 0:
        raise ValueError(
            f"expected a non-empty batch with a leading batch dimension, got shape {tuple(x.shape)}"
        )
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).flatten(1).any(1).sum())
        raise NonFiniteInputError(f"{bad} of {x.shape[0]} samples contain NaN or Inf; nothing was adapted")
