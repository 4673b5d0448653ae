"""The Adapter: wraps a model, predicts each incoming batch and adapts online by a recipe.

Like Tent's wrapper, ``adapter(x)`` forwards once, returns that forward's prediction (taken before the
update) and then updates. Unlike it, what is updated and how comes from a ``Recipe``, so every method
shares this one loop. The model is adapted in place (no copy of a large backbone) and everything the
adapter changes is recorded, so ``reset()`` restores the source weights exactly and ``release()`` hands
the model back as it came. The face it shares with NoAdapt's ``Frozen`` (predict, record, release) is
``OnlineModel``'s (``methods/online.py``).

``streams=B`` adapts B independent streams at once: each batch holds every stream's samples,
stream-major, each stream has its own norm parameters and predictor, and ``history`` holds one value per
stream. Everything that differs between one stream and B is the layout's (``zerosiam.parts.layout``).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import Tensor, nn

from zerosiam.methods.guardable import Guardable
from zerosiam.methods.online import NonFiniteInputError, OnlineModel, Settings, reason_code
from zerosiam.methods.recipe import Recipe
from zerosiam.methods.stall import StallWatch
from zerosiam.parts.contract import Batch, Evaluation, plain_step
from zerosiam.parts.learner import GradientLearner, keyword_options
from zerosiam.parts.losses import entropy
from zerosiam.parts.norms import BatchStatistics
from zerosiam.parts.precision import forward_precision
from zerosiam.parts.predictor import build_predictor
from zerosiam.parts.split import FeatureTap, OutputChoice
from zerosiam.parts.streams import StreamNorms

__all__ = ["Adapter", "NonFiniteInputError", "Settings", "prepare_options"]


class Adapter(Guardable, OnlineModel, GradientLearner):
    """Online test-time adaptation of ``model`` by ``recipe``. Build it with ``zerosiam.adapt``."""

    # What the adapter puts on the model, None until it is put there: a build that fails half-way
    # releases what it had put on so far.
    _batch_stats: BatchStatistics | None = None
    _tap: FeatureTap | None = None
    _stream_norms: StreamNorms | None = None
    _ready = False  # built whole: the source weights are recorded and the optimizer exists

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
        if not recipe.adapts:
            raise ValueError(f"{recipe.name} does not adapt; zerosiam.adapt wraps it in a Frozen model")
        super().__init__(model, recipe, settings, streams, output)
        self._stall = StallWatch(recipe.name, selective=bool(recipe.select))
        try:
            self._take_hold(head, extras or {})
        except Exception:
            self.release()  # the model as it was given (no weight has moved yet), then the error
            raise

    def _take_hold(self, head: str | nn.Module | None, extras: dict[str, Any]) -> None:
        """Put the adapter on the model: which parameters learn, BatchNorm on batch statistics, the tap
        on the head, the parts prepared, each stream its own norms, the optimizer and the predictor."""
        model, recipe, settings = self.model, self.recipe, self.settings
        self.params = dict(recipe.params.parameters(model))
        model.requires_grad_(False)
        model.eval()
        for param in self.params.values():
            param.requires_grad_(True)
        self._batch_stats = BatchStatistics(model)
        self._tap = FeatureTap(model, head) if recipe.asymmetry else None
        self.prepare_parts(extras)  # on the source model as it runs at test time, before any stacking
        self._stream_norms = self.layout.own_norms(model, recipe.params.modules(model))
        if self._stream_norms is not None:
            self.params = self._stream_norms.params
        self._source = {name: p.detach().clone() for name, p in self.params.items()}
        self.optimizer = torch.optim.SGD(
            [{"params": list(self.params.values()), "lr": settings.lr, "name": "norms"}],
            lr=settings.lr,
            momentum=settings.momentum,
        )
        self.predictor: nn.Module | None = None
        self._predictor_source: dict[str, Tensor] = {}
        self._ready = True
        if self._tap is not None and self._tap.head is not None:
            self._add_predictor(self._tap.feature_dim)

    # --- the online loop -------------------------------------------------------------------------
    def _take(self, x: Tensor) -> Tensor:
        """Predict ``x`` and take one adaptation step on the same forward; guard it and record it."""
        prediction, evaluations, record = self._step(x)
        guard = self.recipe.guard
        if guard is not None:
            record["guard"] = guard(self, x, prediction, evaluations)
            signals = getattr(guard, "signals", {}) if self.settings.diagnostics else {}
            record.update({f"guard_{name}": value for name, value in signals.items()})
        self.log.add(prediction, self.predictor, record)
        self._stall.after_step(self.log)
        return prediction

    def _step(self, x: Tensor) -> tuple[Tensor, list[Evaluation], dict[str, Any]]:
        """The step itself, what the ``graph`` option captures (``zerosiam.methods.capture``): the
        prediction for ``x``, the step's evaluations and its record."""
        evaluations, recovered = self.take_step(
            self.recipe.step, self.recipe.recover, functools.partial(self._evaluate, x)
        )
        prediction = evaluations[0].batch.target.detach()
        return prediction, evaluations, self._step_record(evaluations, recovered)

    def _check_input(self, x: Tensor) -> None:
        super()._check_input(x)
        self._batch_stats.check_batch(x.shape[0])  # BatchNorm on batch statistics needs two samples

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
            layout=self.layout,
        )
        return self.recipe.evaluate(batch, restrict)

    def _step_record(self, evaluations: list[Evaluation], recovered: Tensor | None) -> dict[str, Any]:
        """What the step did: its loss terms, how many samples each stream kept, whether each stream
        moved (its last evaluation, SAM's second, kept a sample and the step was not skipped), why not,
        and whether it was reset. A step of more than one evaluation (SAM) also keeps its last objective
        (``last_objective``), the value a recovery rule reads, so that one can be replayed on the record."""
        first, last = evaluations[0], evaluations[-1]
        record: dict[str, Any] = dict(first.terms) if self.settings.diagnostics else {}
        if record and self.recipe.step is not plain_step and "objective" in last.terms:
            record["last_objective"] = last.terms["objective"]  # the first's where the second did not run
        layout = self.layout
        if first.filtered:
            record["selected"] = layout.value(layout.rows(first.mask).sum(-1))
        else:  # every sample counts: no need to ask the device how many
            record["selected"] = layout.pick([first.mask.numel() // layout.count] * layout.count)
        moved = layout.kept(last.mask) & (self.skipped is None)
        # eager, a stream held back has kept no sample already; fixed-shape, it may have (NON_FINITE)
        record["updated"] = moved & ~self.held_back(last.mask.device) if self._held else moved
        record["skipped"] = self._reasons_by_stream()
        record["recovered"] = recovered if recovered is not None else False
        return record

    def _reasons_by_stream(self) -> Any:
        """Why each stream did not move in this step: the step's reason, or the first it was held for,
        as the layout's per-stream value; the held ones as codes on the device (``reason_code``), read
        back as their reasons with the rest of the record, so that no step waits for the device."""
        if self.skipped is not None or not self._held:
            return self.layout.pick([self.skipped] * self.streams)
        code = torch.zeros(self.streams, dtype=torch.int32, device=self._held[0][1].device)
        for reason, marked in reversed(self._held):  # the first reason given stands
            code = torch.where(marked.reshape(-1), reason_code(reason), code)
        return self.layout.value(code)

    # --- predictor ---------------------------------------------------------------------------------
    def _add_predictor(self, dim: int) -> None:
        """Build h for feature size ``dim`` (one per stream) with its own learning rate."""
        head = self._tap.head
        predictor = self.layout.predictor(build_predictor(self.recipe.asymmetry.predictor, dim))
        self.predictor = predictor.to(device=head.weight.device, dtype=head.weight.dtype)
        self._predictor_source = {n: p.detach().clone() for n, p in self.predictor.named_parameters()}
        learned = [p for p in self.predictor.parameters() if p.requires_grad]
        if learned:
            self.optimizer.add_param_group(
                {"params": learned, "lr": self.settings.predictor_lr, "name": "predictor"}
            )

    # --- state -------------------------------------------------------------------------------------
    def restore_source(self, streams: Tensor | None = None) -> None:
        """Source weights, identity predictor and no momentum, for every stream or for those flagged in
        ``streams``; the adapter's own record is kept."""
        source = {"params": self._source, "predictor": self._predictor_source}
        self.roll_back(source, streams if streams is not None else self.layout.all_streams())

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint of the adapting state: adapted weights, predictor, optimizer and rule states, and
        the record of the steps so far, so that a loaded adapter goes on as this one would."""
        return {
            **super().state_dict(),
            "params": {name: p.detach().clone() for name, p in self.params.items()},
            "predictor": None if self.predictor is None else copy.deepcopy(self.predictor.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "parts": {
                k: p.state_dict() for k, p in self.stateful_parts().items() if hasattr(p, "state_dict")
            },
        }

    def forget(self) -> None:
        """The record cleared (``reset``): the count of steps without an update starts again too."""
        super().forget()
        self._stall.restart()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._stall.restart(seen=len(self.log.rows))
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
        stacked streams, whose model holds none of them. Releasing again does nothing: the model may be
        another adapter's by then.
        """
        if self.released:
            return self.model
        if keep_adapted and self.streams > 1:
            raise ValueError(f"the model adapted by {self.streams} streams has no one adapted state to keep")
        if not keep_adapted and self._ready:
            self.restore_source()
        if self._stream_norms is not None:
            self._stream_norms.restore()
        if self._batch_stats is not None:
            self._batch_stats.restore()
        if self._tap is not None:
            self._tap.close()
        return super().release()


def prepare_options(recipe: Recipe) -> set[str]:
    """The extra keywords of ``adapt`` that the recipe's parts accept in ``prepare`` (e.g. ``clean_data``)."""
    options: set[str] = set()
    for part in recipe.parts().values():
        prepare = getattr(part, "prepare", None)
        if callable(prepare):
            options |= keyword_options(prepare)
    return options
