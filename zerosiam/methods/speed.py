"""Speed options, off by default: of the model's forward (channels-last memory format, ``torch.compile``)
and of the adapting step (``fixed_shape``, ``graph``: ``zerosiam.methods.capture``).

Options and not defaults, because which one pays depends on the device, the model and the batch size,
and compiling costs seconds to minutes before the first step: the eager path stays the default (the
paper's numbers and the goldens come from it) until a measurement on a device says otherwise
(``docs/efficiency.md``). Every option must give the eager path's predictions within float rounding
(``tests/methods/test_speed.py``, ``benchmarks/speed_equivalence.py``).

Both act on the model in place, after the wrapper has set it up, and are undone when the wrapper releases
it: the adapter keeps the same module tree, so its hooks (the head's ``FeatureTap``, the model's
``LogitsOutput``), its parameter names (checkpoints) and the head's detection work unchanged.

* ``channels_last``: the 4-d parameters and buffers (convolution weights) are stored channels-last, and a
  forward pre-hook gives 4-d inputs the same layout, so convolutions run on NHWC tensors without a copy
  per layer (the layout tensor cores prefer).
* ``fixed_shape``: every decision of a step (was a sample kept, is a gradient finite, did a stream
  collapse) is device work on tensors of fixed shapes; the step runs whole and what must not move is put
  back (``Layout.reads_device``). Tent's and ZeroSiam's steps are the eager ones to the bit; a filtered
  loss rounds otherwise (``tests/methods/test_fixed_shape.py``).
* ``graph``: that step captured as a CUDA graph and replayed (``zerosiam.methods.capture``).
* ``attention:BACKEND``: every forward runs scaled-dot-product attention on one backend (``math``: plain
  matrix products, on TF32 tensor cores under ``tf32``; ``efficient``, ``flash``, ``cudnn``), where torch
  would otherwise choose (on an H200 in tf32, the float32 memory-efficient kernel: 40 % of ViT-B/16's
  kernel time, no tensor cores; ``docs/efficiency.md``).
* ``decode_on_device``: a benchmark run's loader workers read image files (an ImageNet-C folder) and the
  device decodes them (``zerosiam.data.tensors.decode_on``: a GPU's JPEG decoder), where decoding on the
  host's cores is the wait; not an option of the model, so not one of ``options``.
* ``frozen_bf16``: under ``precision="bf16"``, the frozen weights of linear and convolution layers stored
  in bfloat16 once, instead of cast by autocast at every forward (the same values: the same predictions).
* ``compile``: the model's ``forward`` is replaced, on the instance, by ``torch.compile(forward)``. Its
  submodules' hooks (the head's ``FeatureTap``) are traced into the graph, and the backward through it is
  compiled too; the model's own hooks (``LogitsOutput``, the input's layout) run eagerly around it. Dynamo
  guards on the hooks, so a hook added or removed later recompiles rather than replays a stale one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from zerosiam.methods.adapter import Adapter
from zerosiam.methods.capture import capture_steps
from zerosiam.methods.online import OnlineModel

ATTENTION_BACKENDS = {
    "math": SDPBackend.MATH,  # matrix products and a softmax: TF32 tensor cores under tf32
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,  # half precision only on a GPU
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# A benchmark worker runs many methods, precisions and batch shapes through one model class's forward;
# each is a compiled entry of that code object. Past torch's default of 8, dynamo would silently fall back
# to the eager forward.
RECOMPILE_LIMIT = 64
# The options named without a value.
FLAGS = ("channels_last", "fixed_shape", "graph", "frozen_bf16", "decode_on_device")
Undo = Callable[[], None]


@dataclass(frozen=True)
class Speed:
    """How the model's forward runs: ``compile`` (False, True for torch's default mode, or a mode name)
    and ``channels_last``; how the step runs: ``fixed_shape`` (no read of the device mid-step) and
    ``graph`` (that step captured as a CUDA graph). ``Speed()`` is the eager path."""

    compile: bool | str = False
    channels_last: bool = False
    fixed_shape: bool = False
    graph: bool = False
    attention: str | None = None  # a backend of scaled-dot-product attention (ATTENTION_BACKENDS)
    frozen_bf16: bool = False  # the frozen weights of linear and convolution layers stored in bfloat16
    decode_on_device: bool = False  # image files read by the loader's workers, decoded on the device

    def __post_init__(self) -> None:
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention backend {self.attention!r}; choose one of {', '.join(ATTENTION_BACKENDS)}"
            )
        if self.graph and self.mode is not None:
            raise ValueError(
                f"graph captures the eager step; it does not take compile ({self.mode}): use one of them"
            )
        if self.graph:  # the captured step is the fixed-shape one: one value for one meaning
            object.__setattr__(self, "fixed_shape", True)
        if not isinstance(self.compile, bool) and self.compile not in COMPILE_MODES:
            modes = ", ".join(COMPILE_MODES)
            raise ValueError(
                f"compile takes True, False or a torch.compile mode ({modes}), not {self.compile!r}"
            )
        if self.compile == "default":  # one value for one meaning: Speed("default") == Speed(True)
            object.__setattr__(self, "compile", True)

    @property
    def mode(self) -> str | None:
        """The ``torch.compile`` mode, or None when the forward is not compiled."""
        if self.compile is True:
            return "default"
        return self.compile or None

    @property
    def eager(self) -> bool:
        """Whether every option is off: the model is left as it is, and the loader decodes."""
        return not self.on_model and not self.fixed_shape and not self.decode_on_device

    @property
    def label(self) -> str:
        """``eager``, ``channels_last``, ``compile``, ``compile:reduce-overhead+channels_last``, ...:
        the options as a table's row and ``parse`` read them."""
        mode = self.mode
        parts = [] if mode is None else ["compile" if mode == "default" else f"compile:{mode}"]
        parts += ["channels_last"] if self.channels_last else []
        parts += [f"attention:{self.attention}"] if self.attention else []
        parts += ["frozen_bf16"] if self.frozen_bf16 else []
        parts += ["decode_on_device"] if self.decode_on_device else []
        parts += ["graph"] if self.graph else ["fixed_shape"] if self.fixed_shape else []
        return "+".join(parts) or "eager"

    @classmethod
    def parse(cls, label: str) -> Speed:
        """The options a ``label`` names; a one-line ``ValueError`` for anything else."""
        compile_: bool | str = False
        attention = None
        flags = dict.fromkeys(FLAGS, False)
        for part in filter(None, label.strip().split("+")):
            name, _, mode = part.partition(":")
            if name in flags and not mode:
                flags[name] = True
            elif name == "compile":
                compile_ = mode or True
            elif name == "attention" and mode:
                attention = mode
            elif name != "eager" or mode:
                raise ValueError(
                    f"unknown speed option {part!r} in {label!r}; use eager, channels_last, compile, "
                    "attention:BACKEND, frozen_bf16, fixed_shape, graph, decode_on_device"
                )
        return cls(compile_, attention=attention, **flags)

    @property
    def options(self) -> dict[str, bool | str | None]:
        """The options as ``zerosiam.adapt``'s keywords."""
        return {
            "compile": self.compile,
            "channels_last": self.channels_last,
            "fixed_shape": self.fixed_shape,
            "graph": self.graph,
            "attention": self.attention,
            "frozen_bf16": self.frozen_bf16,
        }

    @property
    def on_model(self) -> bool:
        """Whether an option acts on the model's forward (``apply``); ``fixed_shape`` and ``graph`` act on
        the adapter's step instead (``with_speed``)."""
        return self.mode is not None or self.channels_last or bool(self.attention) or self.frozen_bf16

    def apply(self, model: nn.Module) -> Undo:
        """Put the options on ``model`` in place; returns what puts it back as it was."""
        if isinstance(model, torch.jit.ScriptModule):
            raise ValueError(f"{self.label} does not apply to a TorchScript model: it takes no hooks")
        undos = [_channels_last(model)] if self.channels_last else []
        if self.frozen_bf16:
            undos.append(_frozen_in_bf16(model))
        if self.attention:  # under compile, so that the compiled forward is the one that chooses
            undos.append(_attention(model, ATTENTION_BACKENDS[self.attention]))
        if self.mode is not None:
            undos.append(_compiled(model, self.mode))

        def undo() -> None:
            for step in reversed(undos):
                step()

        return undo


def with_speed(wrapper: OnlineModel, speed: Speed) -> OnlineModel:
    """``wrapper``'s model with ``speed``'s options on, taken off again by ``wrapper.release()``, which
    hands the model back as it came. Applied after the wrapper is built, so its hooks are in place
    before a compiler traces the forward and its preparation (EATA's Fisher) ran eagerly."""
    if speed.frozen_bf16:
        _check_frozen_bf16(wrapper)
    if speed.on_model:
        try:
            undo = speed.apply(wrapper.model)
        except Exception:
            wrapper.release()  # the model goes back as it came, then the error
            raise
        wrapper.when_released(undo)
    if speed.graph and isinstance(wrapper, Adapter):  # NoAdapt's forward decides nothing: left eager
        capture_steps(wrapper)
    return wrapper


def _channels_last(model: nn.Module) -> Undo:
    """The model's 4-d tensors stored channels-last, and its 4-d inputs given that layout; a model
    without any (no convolution) is left as it is."""
    converted = [
        tensor
        for tensor in (*model.parameters(), *model.buffers())
        if tensor.ndim == 4 and not tensor.is_contiguous(memory_format=torch.channels_last)
    ]
    for tensor in converted:
        tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)
    hook = model.register_forward_pre_hook(_channels_last_input) if converted else None

    def undo() -> None:
        if hook is not None:
            hook.remove()
        for tensor in converted:
            tensor.data = tensor.data.contiguous()

    return undo


def _channels_last_input(module: nn.Module, args: tuple) -> tuple | None:
    """A forward pre-hook: the first argument in channels-last layout when it is a 4-d tensor."""
    if not args or not isinstance(args[0], Tensor) or args[0].ndim != 4:
        return None
    return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])


def _check_frozen_bf16(wrapper: OnlineModel) -> None:
    """Refuse, in one line and with the model handed back, ``frozen_bf16`` without a bf16 forward or with
    a part that runs the model outside it (DeYO's second view: ``selection.SECOND_VIEW``)."""
    second = [key for key, part in wrapper.recipe.parts().items() if getattr(part, "second_view", False)]
    precision = wrapper.settings.precision
    if precision == "bf16" and not second:
        return
    wrapper.release()
    if second:
        raise ValueError(
            f"frozen_bf16 does not take {wrapper.recipe.name}: its {', '.join(second)} runs the model "
            "outside the bf16 forward, on float32 weights"
        )
    raise ValueError(
        f"frozen_bf16 keeps frozen weights in bfloat16 for a bf16 forward; precision is {precision}: "
        "add precision='bf16' or leave frozen_bf16 off"
    )


def _frozen_in_bf16(model: nn.Module) -> Undo:
    """The frozen float32 weights and biases of ``model``'s linear and convolution layers stored in
    bfloat16. Autocast casts them to bfloat16 for every forward anyway (it caches only the casts of
    weights that learn), so the forward computes the same values without the casts; the norms, which
    autocast runs in float32, and every weight that learns stay as they are."""
    layers = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    kept = [
        (param, param.data)
        for module in model.modules()
        if isinstance(module, layers)
        for param in (module.weight, module.bias)
        if param is not None and not param.requires_grad and param.dtype == torch.float32
    ]
    for param, data in kept:
        param.data = data.to(torch.bfloat16)

    def undo() -> None:
        for param, data in kept:
            param.data = data

    return undo


def _attention(model: nn.Module, backend: SDPBackend) -> Undo:
    """Every forward of ``model`` with scaled-dot-product attention on ``backend`` (the backward follows
    the forward's kernel)."""
    forward = model.forward

    def attended(*args: object, **kwargs: object) -> object:
        with sdpa_kernel(backend):
            return forward(*args, **kwargs)

    return _replace_forward(model, attended)


def _compiled(model: nn.Module, mode: str) -> Undo:
    """The model's ``forward`` compiled on the instance; the undo puts back what was there."""
    _allow_recompiles(RECOMPILE_LIMIT)
    return _replace_forward(model, torch.compile(model.forward, mode=mode))


def _replace_forward(model: nn.Module, forward: Callable[..., object]) -> Undo:
    """``forward`` set as ``model``'s forward on the instance; the undo puts back what was there (a
    forward another option set on the instance, or the class's)."""
    own = model.__dict__.get("forward")
    model.forward = forward

    def undo() -> None:
        with contextlib.suppress(AttributeError):
            del model.forward
        if own is not None:
            model.forward = own

    return undo


def _allow_recompiles(limit: int) -> None:
    """Raise dynamo's limit of compiled entries per code object to at least ``limit`` (its name changed
    from ``cache_size_limit`` to ``recompile_limit`` in torch 2.6)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))
