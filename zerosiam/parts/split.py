"""The model split: the final classifier head g and the pre-logit feature z = f(x) that feeds it.

ZeroSiam needs z to build its online branch g(h(z)) without a second backbone pass. A forward hook on
the head captures z (the head's input) during the model's own forward, so the target branch is simply
the model's output. The head is found, in order: as the user names it; by timm's ``get_classifier()``;
by the usual attribute names (``fc``, ``classifier``, ``head``, ``heads``, ``lm_head``, ...); and, for
any other model, on the first batch, as the linear layer whose output *is* the model's output.

What the model returns is read as its logits by one rule, ``logits_of``: a tensor is the logits; from a
tuple, dict or ``ModelOutput`` (Hugging Face ``transformers``), the field the user names with ``output=``,
else ``logits``, else the one tensor it holds. ``LogitsOutput`` applies it to every forward of a model the
adapter holds, so that every caller of ``model(x)`` (the tap, the adapter, DeYO's second view, EATA's
Fisher) reads one tensor without knowing what the model returns.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

OutputChoice = str | int | None  # a field name or position in the model's output; None: the rule decides

_HEAD_ATTRIBUTES = ("fc", "classifier", "head", "heads", "lm_head", "linear", "last_linear", "output")


class HeadNotFoundError(ValueError):
    """The model's classifier head could not be detected; the message says how to name it."""


class OutputNotLogitsError(ValueError):
    """What the model returns holds no tensor that is clearly its logits; the message names the output's
    type, its fields and the ``output=`` option that picks one."""


def logits_of(output: object, choice: OutputChoice = None) -> Tensor:
    """The logits in ``output``, what a model's forward returned, by one rule.

    A tensor is the logits. A tuple, dict, ``ModelOutput`` or dataclass holds them: in the field
    ``choice`` names (a key, or a position), else in ``logits`` (the name Hugging Face's classifiers
    use), else in the one tensor it holds. When none of these decides, guessing could adapt on a loss or
    on hidden states, so an ``OutputNotLogitsError`` says what the output holds and how to choose.
    """
    if isinstance(output, Tensor):
        return output
    fields = _fields(output)
    if choice is not None:
        return _chosen_field(output, fields, choice)
    if isinstance(fields.get("logits"), Tensor):
        return fields["logits"]
    tensors = [value for value in fields.values() if isinstance(value, Tensor)]
    if len(tensors) == 1:
        return tensors[0]
    raise OutputNotLogitsError(
        f"cannot tell which field of the model's output holds the logits: {_describe(output, fields)}; name "
        f"it with output=<field or position>, e.g. zerosiam.adapt(model, method, output={_example(fields)!r})"
    )


def _example(fields: dict[str | int, object]) -> str | int:
    """A field to show in the error: the first ``(N, classes)``-shaped tensor, else the first field."""
    matrices = [name for name, value in fields.items() if isinstance(value, Tensor) and value.ndim == 2]
    return matrices[0] if matrices else next(iter(fields), 0)


def _fields(output: object) -> dict[str | int, object]:
    """The named (dict, ``ModelOutput``, named tuple, dataclass) or numbered (tuple, list) fields of an
    output; none for anything else."""
    if isinstance(output, Mapping):
        return dict(output)
    if isinstance(output, tuple) and hasattr(output, "_asdict"):
        return dict(output._asdict())
    if isinstance(output, tuple | list):
        return dict(enumerate(output))
    return dict(vars(output)) if hasattr(output, "__dict__") else {}


def _chosen_field(output: object, fields: dict[str | int, object], choice: str | int) -> Tensor:
    """The field ``choice`` names, by key or by position (a ``ModelOutput`` has both)."""
    if choice in fields:
        value = fields[choice]
    elif isinstance(choice, int) and -len(fields) <= choice < len(fields):
        value = list(fields.values())[choice]
    else:
        raise OutputNotLogitsError(
            f"output={choice!r} names no field of the model's output: {_describe(output, fields)}"
        )
    if not isinstance(value, Tensor):
        raise OutputNotLogitsError(f"output={choice!r} is a {type(value).__name__}, not a tensor of logits")
    return value


def _describe(output: object, fields: dict[str | int, object]) -> str:
    """``<type> with fields name (shape), ...``: enough to see which field is ``(N, classes)``."""

    def what(value: object) -> str:
        if isinstance(value, Tensor):
            return "×".join(map(str, value.shape)) or "scalar"
        return type(value).__name__

    listed = ", ".join(f"{name} ({what(value)})" for name, value in fields.items()) or "none"
    return f"{type(output).__name__} with fields {listed}"


class LogitsOutput:
    """Makes ``model(x)`` return its logits, read by ``logits_of``, until ``close``.

    A forward hook on the model itself replaces a non-tensor output by its logits, so the rule is applied
    in one place and every caller of ``model(x)`` gets one tensor. TorchScript modules take no hooks;
    their output is read as it comes.
    """

    def __init__(self, model: nn.Module, choice: OutputChoice = None) -> None:
        self.choice = choice
        scripted = isinstance(model, torch.jit.ScriptModule)
        self._handle = None if scripted else model.register_forward_hook(self._read)

    def _read(self, module: nn.Module, inputs: tuple, output: object) -> Tensor | None:
        return None if isinstance(output, Tensor) else logits_of(output, self.choice)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _how_to_name(model: nn.Module) -> str:
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    hint = f" Its linear layers are: {', '.join(linears[-5:])}." if linears else ""
    return (
        f"Name the head explicitly, e.g. zerosiam.adapt(model, method, head='fc') with the dotted name "
        f"of the final classifier module of {type(model).__name__}.{hint}"
    )


def _last_linear(module: nn.Module) -> nn.Linear | None:
    if isinstance(module, nn.Linear):
        return module
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def check_head(model: nn.Module, head: str | nn.Module | None) -> None:
    """Refuse, before any work, a head the user names that is not in ``model``: whether or not the method
    reads the head, a name that finds nothing is a mistake to say, not to ignore."""
    if head is None:
        return
    if isinstance(head, str):
        find_head(model, head)  # the one-line error naming the model's linear layers
    elif not isinstance(head, nn.Module):
        raise TypeError(f"head must be a submodule's dotted name or the module, got {type(head).__name__}")
    elif not any(module is head for module in model.modules()):
        raise HeadNotFoundError(
            f"head {type(head).__name__} is not a submodule of {type(model).__name__}. {_how_to_name(model)}"
        )


def find_head(model: nn.Module, head: str | nn.Module | None = None) -> nn.Module | None:
    """The classifier head found without running the model, or None when only a forward can tell."""
    if isinstance(head, nn.Module):
        return head
    if isinstance(head, str):
        try:
            return model.get_submodule(head)
        except AttributeError:
            raise HeadNotFoundError(f"model has no submodule named {head!r}. {_how_to_name(model)}") from None
    get_classifier = getattr(model, "get_classifier", None)
    if callable(get_classifier):
        found = get_classifier()
        if isinstance(found, nn.Linear):
            return found
    for attribute in _HEAD_ATTRIBUTES:
        candidate = getattr(model, attribute, None)
        if isinstance(candidate, nn.Module) and (linear := _last_linear(candidate)) is not None:
            return linear
    return None


class FeatureTap:
    """Captures the head's input z and output during the model's forward.

    ``head_of(z)`` reapplies the head to a new feature (the online branch) without being captured.
    When the head is unknown, every linear layer is watched for one forward and the one that produced
    the model's output becomes the head.
    """

    def __init__(self, model: nn.Module, head: str | nn.Module | None = None) -> None:
        self.model = model
        self.head = find_head(model, head)
        self._handles: list = []
        self._calls: dict[nn.Module, tuple[Tensor, Tensor]] = {}
        self._active = True
        self._watch([self.head] if self.head is not None else self._all_linears())

    def _all_linears(self) -> list[nn.Module]:
        linears = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise HeadNotFoundError(
                f"{type(self.model).__name__} has no linear layer. {_how_to_name(self.model)}"
            )
        return linears

    def _watch(self, modules: list[nn.Module]) -> None:
        self.close()
        for module in modules:
            self._handles.append(module.register_forward_hook(self._record))

    def _record(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        if self._active:
            self._calls[module] = (inputs[0], output)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Run the model once; return its output (the target branch) and the captured feature z."""
        self._calls.clear()
        output = self.model(x)
        if self.head is None:
            self._adopt_head_producing(output)
        if self.head not in self._calls:
            hint = _how_to_name(self.model)
            raise HeadNotFoundError(f"the head {type(self.head).__name__} did not run in the forward. {hint}")
        feature, head_output = self._calls.pop(self.head)
        self._calls.clear()
        if head_output.shape != output.shape or not torch.equal(head_output, output):
            raise HeadNotFoundError(
                "the detected head's output is not the model's output (something runs after it). "
                + _how_to_name(self.model)
            )
        return output, feature

    def _adopt_head_producing(self, output: Tensor) -> None:
        producers = [m for m, (_, out) in self._calls.items() if out is output]
        if len(producers) != 1:
            raise HeadNotFoundError(
                f"no linear layer of {type(self.model).__name__} produces its output directly. "
                + _how_to_name(self.model)
            )
        self.head = producers[0]
        self._watch([self.head])

    def head_of(self, feature: Tensor) -> Tensor:
        self._active = False
        try:
            return self.head(feature)
        finally:
            self._active = True

    @property
    def feature_dim(self) -> int:
        if not isinstance(self.head, nn.Linear):
            raise HeadNotFoundError(f"the head must be a linear layer, got {type(self.head).__name__}.")
        return self.head.in_features

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
