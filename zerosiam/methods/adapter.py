"""The Adapter: wraps a model, predicts each incoming batch and adapts online by a recipe.

Like Tent's wrapper, ``adapter(x)`` forwards once, returns that forward's prediction (taken before the
update) and then updates. Unlike it, what is updated and how comes from a ``Recipe``, so every method
shares this one loop. The model is adapted in place (no copy of a large backbone) and everything the
adapter changes is recorded, so ``reset()`` restores the source weights exactly and ``release()`` hands
the model back as it came. Whatever the model returns (a tensor, a tuple, a dict, a ``transformers``
``ModelOutput``), the adapter reads its logits by one rule (``zerosiam.parts.split.logits_of``) and
returns a logits tensor.

``streams=B`` adapts B independent streams at once (``zerosiam.parts.streams``): each batch holds every
stream's samples, stream-major, each stream has its own norm parameters and predictor, and ``history``
holds one value per stream; ``stream_history(s)`` is stream ``s``'s alone.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.methods.recipe import Recipe
from zerosiam.parts.contract import Batch, Closure, Evaluation, Recovery, Step
from zerosiam.parts.learner import GradientLearner, keyword_options
from zerosiam.parts.losses import entropy
from zerosiam.parts.norms import BatchStatistics
from zerosiam.parts.precision import forward_precision, tensor_cores
from zerosiam.parts.predictor import build_predictor, identity_drift
from zerosiam.parts.split import FeatureTap, LogitsOutput, OutputChoice
from zerosiam.parts.streams import (
    HeldRows,
    StreamNorms,
    by_stream,
    check_streams,
    put_rows,
    stack_predictor,
    zero_momentum_rows,
)


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


class Adapter(GradientLearner):
    """Online test-time adaptation of ``model`` by ``recipe``. Build it with ``zerosiam.adapt``."""

    def __init__(
        self,
        model: nn.Module,
        recipe: Recipe,
        settings: Settings,
        head: str | nn.Module | None = None,
        extras: dict[str, Any] | None = None,
        streams: int = 1,
        output: OutputChoice = None,
    ) -> None:
        self.model = model
        self.streams = check_streams(streams)
        self._logits = LogitsOutput(model, output)  # model(x) is the logits, whatever the model returns
        self.recipe = copy.deepcopy(recipe)  # rules keep state (moving averages, EMA): one copy per adapter
        self.settings = settings
        self._history: list[dict[str, Any]] = []
        self._read = 0  # rows of _history already read back from the device
        self.steps = 0
        self.predictor: nn.Module | None = None
        self._requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        self._training = {name: m.training for name, m in model.named_modules()}
        if not recipe.adapts:
            model.eval()
            return
        self.params = dict(recipe.params.parameters(model))
        model.requires_grad_(False)
        model.eval()
        for param in self.params.values():
            param.requires_grad_(True)
        self._batch_stats = BatchStatistics(model)
        self._tap = FeatureTap(model, head) if recipe.asymmetry else None
        self.prepare_parts(extras or {})  # on the source model as it runs at test time, before any stacking
        self._stream_norms = None
        if streams > 1:
            self._stream_norms = StreamNorms(model, recipe.params.modules(model), streams)
            self.params = self._stream_norms.params
        self._source = {name: p.detach().clone() for name, p in self.params.items()}
        self.optimizer = torch.optim.SGD(
            [{"params": list(self.params.values()), "lr": settings.lr, "name": "norms"}],
            lr=settings.lr,
            momentum=settings.momentum,
        )
        if self._tap is not None and self._tap.head is not None:
            self._add_predictor(self._tap.feature_dim)
        else:
            self._initial_optimizer = copy.deepcopy(self.optimizer.state_dict())

    # --- the online loop -------------------------------------------------------------------------
    def __call__(self, x: Tensor) -> Tensor:
        """The prediction for ``x`` from the current weights; then one adaptation step on ``x``."""
        with tensor_cores(self.settings.precision):
            return self._predict_then_adapt(x)

    def _predict_then_adapt(self, x: Tensor) -> Tensor:
        self._check_input(x)
        if not self.recipe.adapts:
            with torch.no_grad():
                prediction = self._forward(x)
            self._record(prediction, None, updated=False)
            return prediction
        self._batch_stats.check_batch(x.shape[0])
        evaluations, recovered = self.take_step(
            self.recipe.step, self.recipe.recover, functools.partial(self._evaluate, x)
        )
        first = evaluations[0]
        self._record(first.batch.target.detach(), evaluations, recovered=recovered)
        return first.batch.target.detach()

    def take_step(
        self, step: Step, recover: Recovery | None, closure: Closure
    ) -> tuple[list[Evaluation], bool | Tensor]:
        """One step, as ``GradientLearner.take_step``; with stacked streams, each stream as if it ran
        alone: a stream whose last evaluation kept no sample does not move (nor does its momentum), and
        the recovery decides, and restores, stream by stream (``recovered`` is then one flag per stream)."""
        if self.streams == 1:
            return super().take_step(step, recover, closure)
        self._skipped, self._held = None, ()
        held = HeldRows(self.optimizer) if self.recipe.select else None  # unfiltered: every stream moves
        with torch.enable_grad():
            evaluations = step(self, closure)
        if held is not None:
            held.put_back(~self._by_stream(evaluations[-1].mask).any(-1))
        if recover is None:
            return evaluations, False
        collapsed = recover(evaluations)
        if collapsed.any():  # the flags were read on the host already; most steps restore nothing
            self.restore_source(collapsed)
        return evaluations, collapsed

    def predict(self, x: Tensor) -> Tensor:
        """The prediction for ``x`` from the current weights, with no adaptation step and no record: for
        scoring a model frozen after adapting (the blind-spot protocol)."""
        self._check_input(x)
        if self.recipe.adapts:
            self._batch_stats.check_batch(x.shape[0])
        with torch.no_grad():
            return self._forward(x)

    def _check_input(self, x: Tensor) -> None:
        _check_input(x)
        if x.shape[0] % self.streams:
            raise ValueError(f"a batch of {x.shape[0]} samples does not split into {self.streams} streams")

    def _forward(self, x: Tensor) -> Tensor:
        """The model's logits in float32, its forward at the adapter's precision."""
        with forward_precision(self.settings.precision, x.device):
            return self.model(x).float()

    def _evaluate(self, x: Tensor, restrict: Tensor | None = None) -> Evaluation:
        """Forward once and score the recipe's loss: the closure that steps call (SAM calls it twice)."""
        with forward_precision(self.settings.precision, x.device):
            if self._tap is None:
                target = self.model(x)
                online = target
            else:
                target, feature = self._tap.forward(x)
                if self.predictor is None:
                    self._add_predictor(self._tap.feature_dim)
                online = self._tap.head_of(self.predictor(feature))
        target, online = target.float(), online.float()  # losses, rules and weights in float32
        batch = Batch(
            x=x,
            logits=online,
            target=target,
            entropy=entropy(online).detach(),
            learner=self,
            streams=self.streams,
        )
        return self.recipe.evaluate(batch, restrict)

    # --- predictor ---------------------------------------------------------------------------------
    def _add_predictor(self, dim: int) -> None:
        """Build h for feature size ``dim`` and give it its own learning rate; the optimizer's initial
        state, which ``restore_source`` returns to, is taken afresh to include it."""
        head = self._tap.head
        predictor = build_predictor(self.recipe.asymmetry.predictor, dim)
        if self.streams > 1:
            predictor = stack_predictor(predictor, self.streams)
        self.predictor = predictor.to(device=head.weight.device, dtype=head.weight.dtype)
        self._predictor_source = copy.deepcopy(self.predictor.state_dict())
        learned = [p for p in self.predictor.parameters() if p.requires_grad]
        if learned:
            self.optimizer.add_param_group(
                {"params": learned, "lr": self.settings.predictor_lr, "name": "predictor"}
            )
        self._initial_optimizer = copy.deepcopy(self.optimizer.state_dict())

    # --- state -------------------------------------------------------------------------------------
    def restore_source(self, streams: Tensor | None = None) -> None:
        """Source weights, identity predictor and a fresh optimizer; the adapter's own record is kept.
        ``streams`` (one flag per stacked stream) restores only the marked streams."""
        if not self.recipe.adapts:
            return
        if streams is not None:
            self._restore_streams(streams)
            return
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(self._source[name])
        if self.predictor is not None:
            self.predictor.load_state_dict(self._predictor_source)
        self.optimizer.load_state_dict(copy.deepcopy(self._initial_optimizer))

    def _restore_streams(self, streams: Tensor) -> None:
        for name, param in self.params.items():
            put_rows(param, self._source[name], streams)
        if self.predictor is not None:
            for name, param in self.predictor.named_parameters():
                put_rows(param, self._predictor_source[name].to(param.device), streams)
        zero_momentum_rows(self.optimizer, streams)

    def reset(self) -> None:
        """Back to the source model exactly: weights, predictor, optimizer and every rule's state."""
        self.restore_source()
        for part in self.stateful_parts().values():
            part.reset()
        self._history.clear()
        self._read = 0
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of the adapting state: adapted weights, predictor, optimizer and rule states, and
        the record of the steps so far (read back from the device), so that a loaded adapter goes on as
        this one would."""
        state: dict[str, Any] = {
            "method": self.recipe.name,
            "steps": self.steps,
            "history": copy.deepcopy(self.history),
        }
        if self.recipe.adapts:
            state["params"] = {name: p.detach().clone() for name, p in self.params.items()}
            state["predictor"] = (
                None if self.predictor is None else copy.deepcopy(self.predictor.state_dict())
            )
            state["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
            state["parts"] = {
                k: p.state_dict() for k, p in self.stateful_parts().items() if hasattr(p, "state_dict")
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("method") != self.recipe.name:
            raise ValueError(
                f"checkpoint is of method {state.get('method')!r}, this adapter runs {self.recipe.name!r}"
            )
        self.steps = state["steps"]
        self._history = copy.deepcopy(state.get("history", []))  # checkpoints of old had no record
        self._read = len(self._history)
        if not self.recipe.adapts:
            return
        missing = set(self.params) ^ set(state["params"])
        if missing:
            raise ValueError(f"checkpoint parameters do not match this model: {sorted(missing)[:5]}")
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(state["params"][name])
        if state["predictor"] is not None:
            if self.predictor is None:
                self._add_predictor(state["predictor"][next(iter(state["predictor"]))].shape[-1])
            self.predictor.load_state_dict(state["predictor"])
        self.optimizer.load_state_dict(state["optimizer"])
        parts = self.stateful_parts()
        for key, part_state in state["parts"].items():
            parts[key].load_state_dict(part_state)

    def release(self, keep_adapted: bool = False) -> nn.Module:
        """Restore the source weights, modes and flags, remove hooks, and hand the model back.

        ``keep_adapted=True`` keeps the adapted weights instead (modes, flags and hooks are restored all
        the same): the model can then be handed to another adapter, as ``Relay`` does; not from
        stacked streams, whose model holds none of them.
        """
        if keep_adapted and self.streams > 1:
            raise ValueError(f"the model adapted by {self.streams} streams has no one adapted state to keep")
        if not keep_adapted:
            self.restore_source()
        if self.recipe.adapts:
            if self._stream_norms is not None:
                self._stream_norms.restore()
            self._batch_stats.restore()
            if self._tap is not None:
                self._tap.close()
        self._logits.close()
        for name, param in self.model.named_parameters():
            param.requires_grad_(self._requires_grad[name])
        for name, module in self.model.named_modules():
            module.training = self._training[name]
        return self.model

    # --- diagnostics -------------------------------------------------------------------------------
    def _record(
        self,
        prediction: Tensor,
        evaluations: list[Evaluation] | None,
        updated: bool | None = None,
        recovered: bool = False,
    ) -> None:
        """Append this step's diagnostics: the paper's collapse indicators and the loss terms.

        They are computed on the model's device and left there (no wait for the host in the loop);
        ``history`` reads them back in bulk."""
        row: dict[str, Any] = {"step": self.steps}
        if self.settings.diagnostics:
            logits = self._by_stream(prediction.detach().float())
            norms = logits.norm(dim=-1)
            row["entropy"] = self._per_stream(entropy(logits).mean(-1))
            row["logit_norm"] = self._per_stream(norms.mean(-1))
            centre = logits.mean(-2).norm(dim=-1) / norms.mean(-1).clamp_min(1e-12)
            row["centre_dominance"] = self._per_stream(centre)
            row["predictor_drift"] = (
                identity_drift(self.predictor) if self.predictor is not None else math.nan
            )
        if evaluations is not None:
            first = evaluations[0]
            if self.settings.diagnostics:
                row.update(first.terms)
            if self.streams > 1:  # a stream moved if its last evaluation (SAM's second) kept a sample
                row["selected"] = self._by_stream(first.mask).sum(-1)
                row["updated"] = self._by_stream(evaluations[-1].mask).any(-1) & (self.skipped is None)
            else:
                row["selected"] = first.mask.sum() if first.filtered else first.mask.numel()
                row["updated"] = first.mask.any() if self.skipped is None else False
            row["skipped"] = self.skipped if self.streams == 1 else self._skips_by_stream()
            row["recovered"] = recovered
        else:
            row["updated"] = bool(updated)
        self._history.append(row)
        self.steps += 1

    def _by_stream(self, values: Tensor) -> Tensor:
        """``[B·n, ...]`` rows as ``[B, n, ...]``, one block per stream (``[1, N, ...]`` for one stream);
        leading dimensions beyond the batch's are flattened into rows, as the diagnostics always did."""
        return by_stream(values.flatten(0, -2) if values.ndim > 1 else values, self.streams)

    def _per_stream(self, values: Tensor) -> Tensor:
        """One value per stream, or a single one when there is one stream."""
        return values if self.streams > 1 else values.squeeze(0)

    def _skips_by_stream(self) -> list[str | None]:
        """Why each stacked stream did not move in this step: the step's reason, or the reason it held
        the stream back for, or None."""
        if self.skipped is not None:
            return [self.skipped] * self.streams
        reasons: list[str | None] = [None] * self.streams
        for reason, marked in self._held:
            for stream in torch.nonzero(marked).flatten().tolist():
                reasons[stream] = reasons[stream] or reason
        return reasons

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every step's diagnostics as Python numbers (lists of one per stream for stacked streams);
        what is still on the device is read back here, all pending steps in one transfer."""
        rows = self._history[self._read :]
        pending = [(row, key) for row in rows for key, value in row.items() if torch.is_tensor(value)]
        if pending:
            tensors = [row[key].detach() for row, key in pending]
            values = torch.cat([t.float().reshape(-1) for t in tensors]).cpu().tolist()
            start = 0
            for (row, key), tensor in zip(pending, tensors, strict=True):
                convert = _AS_PYTHON.get(key, float)
                read = [convert(v) for v in values[start : start + tensor.numel()]]
                row[key] = read if tensor.ndim else read[0]
                start += tensor.numel()
        self._read = len(self._history)
        return self._history

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
        if not self._history:
            raise RuntimeError("no step has been taken yet")
        return self.history[-1]


def prepare_options(recipe: Recipe) -> set[str]:
    """The extra keywords of ``adapt`` that the recipe's parts accept in ``prepare`` (e.g. ``clean_data``)."""
    options: set[str] = set()
    for part in recipe.parts().values():
        prepare = getattr(part, "prepare", None)
        if callable(prepare):
            options |= keyword_options(prepare)
    return options


_AS_PYTHON = {"selected": int, "updated": bool, "recovered": bool}  # diagnostics that are not real numbers


def _check_input(x: Tensor) -> None:
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
