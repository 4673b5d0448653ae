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
as on every path), the record's log and the stall watch. Captured so far: Tent, ZeroSiam, SAR, EATA and
their variants, unguarded (SAR's recovery average and EATA's redundancy mean are written in place:
``state_in_place``, ``zerosiam.parts.hostsync.kept_in_place``). DeYO's and COME's patch orders are drawn
on the host each step (they would be inputs of the graph, drawn before each replay), and a guard acts
between steps, rolling back and slowing streams: each is refused in one line until it is built.
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
    if adapter.recipe.guard is not None:
        raise ValueError(f"graph does not capture a guarded step yet ({type(adapter.recipe.guard).__name__})")
    stateful = adapter.stateful_parts().items()
    replaced = [key for key, part in stateful if not getattr(part, "state_in_place", False)]
    drawn = [key for key, part in adapter.recipe.parts().items() if getattr(part, "second_view", False)]
    if replaced or drawn:
        raise ValueError(
            f"graph does not capture {adapter.recipe.name} yet: its {', '.join(replaced + drawn)} "
            + ("draws patch orders on the host" if drawn else "replaces its state between steps")
            + "; capturable: tent, zerosiam, sar, eata and their variants"
        )


def _device_of(adapter: Adapter) -> torch.device:
    return next((p.device for p in adapter.trainable), torch.device("cpu"))


class CapturedStep:
    """``step`` (the adapter's ``_step``) captured once per input shape and replayed for each batch."""

    def __init__(self, adapter: Adapter, step: Callable[[Tensor], StepOutput]) -> None:
        self.adapter = adapter
        self.step = step
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor, StepOutput]] = {}

    def __call__(self, x: Tensor) -> StepOutput:
        key = (tuple(x.shape), x.dtype, x.device, x.stride())
        if key not in self.graphs:
            self.graphs[key] = self._capture(x)
        graph, captured_x, (prediction, evaluations, record) = self.graphs[key]
        captured_x.copy_(x)
        graph.replay()
        copied = {name: v.clone() if isinstance(v, Tensor) else v for name, v in record.items()}
        return prediction.clone(), evaluations, copied

    def _capture(self, x: Tensor) -> tuple[torch.cuda.CUDAGraph, Tensor, StepOutput]:
        """Warm up on a side stream, put the adapter back where it was, then capture one step."""
        captured_x = x.clone()
        saved = _save(self.adapter)
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(WARM_UP):
                self.step(captured_x)
        torch.cuda.current_stream(x.device).wait_stream(side)
        _put_back(self.adapter, saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.step(captured_x)
        return graph, captured_x, outputs


def _save(adapter: Adapter) -> dict[str, Any]:
    """What a warm-up step changes: the weights and predictor (a snapshot), the momentum buffers and the
    rules' running state."""
    momentum = {
        param: state["momentum_buffer"].clone()
        for param, state in adapter.optimizer.state.items()
        if state.get("momentum_buffer") is not None
    }
    parts = {key: part.state_dict() for key, part in adapter.stateful_parts().items()}
    return {
        "weights": adapter.snapshot(),
        "predictor": adapter.predictor is not None,
        "momentum": momentum,
        "parts": parts,
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
    for key, part in adapter.stateful_parts().items():  # in place (``state_in_place``): NaN for none yet
        part.load_state_dict(saved["parts"][key])
    adapter.optimizer.zero_grad(set_to_none=True)


def capture_steps(adapter: Adapter) -> None:
    """Have ``adapter`` replay its step as a CUDA graph from its next batch on (refused in one line where
    it cannot, before any step; ``check_capturable``); ``release()`` puts the eager step back."""
    try:
        check_capturable(adapter)
    except ValueError:
        adapter.release()  # the model goes back as it came, then the error
        raise
    adapter._step = CapturedStep(adapter, adapter._step)
    adapter.when_released(lambda: adapter.__dict__.pop("_step", None))
