"""The adapting step captured as a CUDA graph and replayed: the ``graph`` speed option.

A step of a small model, or of a large one at a small batch, is bound by the host: the GPU waits while
Python and the dispatcher queue a few thousand kernels (forward, loss, backward, optimizer). Captured
once, the step's kernels are replayed with one launch: each batch is copied into the captured input, the
graph replayed, and the prediction and the step's record copied out of the graph's memory.

A step can be captured when three things hold:

1. No decision reads the device: the fixed-shape path (``Layout.reads_device`` False), checked on any
   device by ``zerosiam.parts.hostsync.no_host_sync``.
2. Every tensor a step reads and writes between steps (weights, momentum, a rule's running values) is
   updated in place, never replaced: a replay reads and writes the memory the capture saw.
3. The optimizer's state exists before the capture: SGD's momentum buffers are made at zero, which is what
   its first step (a copy of the gradient) gives, to the bit.

torch runs a few steps before capturing (lazy set-ups: cuBLAS workspaces, the autograd engine's stream, the
momentum buffers). Those would adapt the model, so the adapter's weights, predictor and momentum are saved
before them and put back after, in place, and they are not recorded.

What runs outside the graph, eagerly: the input check (a non-finite batch is refused before any work,
as on every path), the record's log, the stall watch, and what a step draws at random on the host (DeYO's
and COME's patch orders): those are inputs of the graph, drawn by the same call before each replay
(``GradientLearner.drawn``), so a captured run sees the fixed-shape run's draws. Captured: Tent, ZeroSiam,
SAR, EATA, DeYO, COME and their variants (SAR's recovery average and EATA's redundancy mean are written in
place: ``state_in_place``, ``zerosiam.parts.hostsync.kept_in_place``). A guard runs after each replay,
outside the graph, on the step's evaluations: its roll-backs and resets write the weights and momentum in
place, and the per-stream scale ``auto`` slows a stream by is in the graph from the start, at one
(``Guardable.keep_scale``). ASR hooks the optimizer's step itself and is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from zerosiam.methods.adapter import Adapter

WARM_UP = 3  # steps before a capture, as torch's documentation runs them (on a side stream)
StepOutput = tuple[Tensor, list[Any], dict[str, Any]]  # prediction, evaluations, record


def check_capturable(adapter: Adapter) -> None:
    """Refuse, in one line naming what stands in the way, an adapter whose step cannot be captured yet."""
    device = _device_of(adapter)
    if device.type != "cuda":
        raise ValueError(f"graph captures CUDA graphs; the model is on {device}: use fixed_shape off a GPU")
    guard = adapter.recipe.guard
    if guard is not None and getattr(guard, "hooks_the_step", False):
        raise ValueError(
            f"graph does not take the {type(guard).__name__} guard yet: it hooks the optimizer's step, which "
            "the graph replays without Python; rdumb, sar and auto act between steps and are taken"
        )
    replaced = [key for key, part in _in_step(adapter).items() if not getattr(part, "state_in_place", False)]
    if replaced:
        raise ValueError(
            f"graph does not capture {adapter.recipe.name}: its {', '.join(replaced)} replaces its state "
            "between steps (a captured step needs it written in place: hostsync.kept_in_place)"
        )


def _in_step(adapter: Adapter) -> dict[str, Any]:
    """The recipe's parts that keep state and run inside the step (the guard runs after it, eagerly)."""
    return {key: part for key, part in adapter.stateful_parts().items() if part is not adapter.recipe.guard}


def _device_of(adapter: Adapter) -> torch.device:
    return next((p.device for p in adapter.trainable), torch.device("cpu"))


class CapturedStep:
    """``step`` (the adapter's ``_step``) captured once per input shape and replayed for each batch."""

    def __init__(self, adapter: Adapter, step: Callable[[Tensor], StepOutput]) -> None:
        self.adapter = adapter
        self.step = step
        self.pool: Any = None  # the graphs' memory pool, shared by the graphs of every shape
        self.graphs: dict[tuple, tuple[Callable[[], None], Tensor, StepOutput]] = {}
        self.inputs: dict[tuple, dict[str, tuple[Tensor, Callable[[], Tensor]]]] = {}  # drawn, per graph
        self._key: tuple = ()  # the graph being captured
        adapter.drawn = self.drawn  # what a step draws on the host becomes an input of its graph

    def drawn(self, name: str, draw: Callable[[], Tensor]) -> Tensor:
        """The graph's input ``name``: made (on the model's device) when a warm-up step first asks, then
        drawn afresh by ``draw`` before each replay (``__call__``), as an eager step would draw it."""
        inputs = self.inputs.setdefault(self._key, {})
        if name not in inputs:
            inputs[name] = (draw().to(self._key[2]), draw)  # the device of the graph's input
        return inputs[name][0]

    def __call__(self, x: Tensor) -> StepOutput:
        key = (tuple(x.shape), x.dtype, x.device, x.stride())
        if key not in self.graphs:
            self._key = key
            self.graphs[key] = self._capture(x)
        replay, captured_x, (prediction, evaluations, record) = self.graphs[key]
        captured_x.copy_(x)
        for value, draw in self.inputs.get(key, {}).values():
            value.copy_(draw())  # on the host, as the eager step draws; copied in before the replay
        replay()
        copied = {name: v.clone() if isinstance(v, Tensor) else v for name, v in record.items()}
        return prediction.clone(), evaluations, copied

    def _capture(self, x: Tensor) -> tuple[Callable[[], None], Tensor, StepOutput]:
        """Warm up, put the adapter back where it was, then record one step (which a capture does not
        run: the first replay takes it)."""
        captured_x = x.clone()
        saved = _save(self.adapter)
        self._warm_up(captured_x)
        _put_back(self.adapter, saved)
        replay, outputs = self._record(captured_x)
        return replay, captured_x, outputs

    def _warm_up(self, x: Tensor) -> None:
        """``WARM_UP`` steps on a side stream, as torch's documentation runs them before a capture."""
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(WARM_UP):
                self.step(x)
        torch.cuda.current_stream(x.device).wait_stream(side)

    def _record(self, x: Tensor) -> tuple[Callable[[], None], StepOutput]:
        """One step captured as a CUDA graph: its replay, and its outputs (rewritten by each replay)."""
        self.pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.step(x)
        return graph.replay, outputs


def _save(adapter: Adapter) -> dict[str, Any]:
    """What a warm-up step changes: the weights and predictor (a snapshot), the momentum buffers and the
    rules' running state."""
    momentum = {
        param: state["momentum_buffer"].clone()
        for param, state in adapter.optimizer.state.items()
        if state.get("momentum_buffer") is not None
    }
    parts = {key: part.state_dict() for key, part in _in_step(adapter).items()}
    return {
        "weights": adapter.snapshot(),
        "predictor": adapter.predictor is not None,
        "momentum": momentum,
        "parts": parts,
        "random": torch.get_rng_state(),  # the host's draws (patch orders): the warm-up's are not the run's
    }


def _put_back(adapter: Adapter, saved: dict[str, Any]) -> None:
    """The adapter as ``_save`` found it, in place; a predictor the warm-up built goes back to its source
    and a momentum buffer it made to zero (what no momentum is, for SGD)."""
    weights = saved["weights"]
    if not saved["predictor"] and adapter.predictor is not None:
        weights = {**weights, "predictor": adapter._predictor_source}
    adapter._put_weights(weights, adapter.layout.all_streams(adapter.trainable[0].device))
    with torch.no_grad():
        for group in adapter.optimizer.param_groups:
            for param in group["params"]:
                buffer = adapter.optimizer.state[param].get("momentum_buffer")
                if buffer is None:
                    adapter.optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
                elif param in saved["momentum"]:
                    buffer.copy_(saved["momentum"][param])
                else:
                    buffer.zero_()
    for key, part in _in_step(adapter).items():  # in place (``state_in_place``): NaN for none yet
        part.load_state_dict(saved["parts"][key])
    torch.set_rng_state(saved["random"])
    adapter.optimizer.zero_grad(set_to_none=True)


def capture_steps(adapter: Adapter) -> None:
    """Have ``adapter`` replay its step as a CUDA graph from its next batch on (refused in one line where
    it cannot, before any step; ``check_capturable``); ``release()`` puts the eager step back."""
    try:
        check_capturable(adapter)
    except ValueError:
        adapter.release()  # the model goes back as it came, then the error
        raise
    if adapter.recipe.guard is not None:  # a guard may slow streams: the scale goes into the graph now
        adapter.keep_scale()
    adapter._step = CapturedStep(adapter, adapter._step)
    adapter.when_released(lambda: [adapter.__dict__.pop(name, None) for name in ("_step", "drawn")])
