"""Reads of the device inside a step, found on any device: what keeps a step from being captured.

A step captured as a CUDA graph is replayed without Python. A decision taken on the host from a device
value (``bool(t)``, ``t.item()``, ``t.tolist()``) is then taken once, at capture, and baked in; an
operation whose output's shape depends on the values (``x[mask]``, ``nonzero``, ``masked_select``) cannot
be captured at all. On a GPU each of them also stops the host until the device has caught up, so the next
step's kernels are not queued while this one runs. torch reports them on a GPU only
(``torch.cuda.set_sync_debug_mode``); on a CPU nothing waits, so nothing reports them. ``no_host_sync``
refuses them on any device, naming the operation, so that the fixed-shape step (``Layout.reads_device``
False) is checked on a CPU, in CI. ``kept_in_place`` and ``none_yet`` are how a rule's running state stays
in the memory a captured step reads.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2"}
"""aten operations that read a value back to the host, or whose output's size the values decide."""
_MASK_INDEXED = {"index", "index_put", "index_put_", "_index_put_impl_"}
"""aten indexing operations, which read the device when an index is a boolean mask."""
_HOST_COPIES = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
"""Tensor methods that bring values to the host (``tolist`` bypasses the dispatcher, so it is caught as
a torch function)."""


class HostSyncError(RuntimeError):
    """A step read the device (a value to the host, or a shape its values decide) where it must not."""


class _RefuseReads(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if name in _READS or (name in _MASK_INDEXED and _has_mask(args)):
            raise HostSyncError(f"{name} reads the device inside a step that must not ({func})")
        return func(*args, **(kwargs or {}))


class _RefuseHostCopies(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in _HOST_COPIES:
            raise HostSyncError(f"Tensor.{func.__name__} reads the device inside a step that must not")
        return func(*args, **(kwargs or {}))


def _has_mask(args: tuple) -> bool:
    """Whether an indexing call's indices (its second argument, a list) hold a boolean mask."""
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Inside the block, any read of the device to the host raises ``HostSyncError`` naming it."""
    with _RefuseHostCopies(), _RefuseReads():
        yield


def kept_in_place(current: Any, new: Any) -> Any:
    """A rule's running state ``new`` written into ``current`` when both are tensors of one shape, else
    ``new``: a captured step reads and writes the memory it saw at capture, so state that a step replaces
    with a new tensor would go stale on the next replay. The values are ``new``'s either way."""
    tensors = isinstance(current, torch.Tensor) and isinstance(new, torch.Tensor) and current is not new
    if tensors and (current.shape, current.dtype, current.device) == (new.shape, new.dtype, new.device):
        with torch.no_grad():
            return current.copy_(new)
    return new


def none_yet(current: Any) -> Any:
    """A rule's running state back to "none yet": a tensor is filled with NaN in place (what both paths
    read as no value, and what a captured step still reads), anything else is None."""
    if isinstance(current, torch.Tensor):
        return current.fill_(math.nan)
    return None
