"""What an RRef holds, as a record: type, shape, dtype, device and bytes (``describe``).

Runs on the owner of the value: on the sender thread, or inline for values that cannot be
weak-referenced. Never imports torch: a process without it gets the type name alone.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

_SCAN_LIMIT = 256


MAX_STORAGES = 1_000  # storages named per value: enough to tell a module's parameters from it


def describe(value: Any) -> dict[str, Any]:
    """type, shape, dtype, device and nbytes of a value: exact for a tensor, summed over the
    tensors found one level deep otherwise (modules: parameters and buffers). ``storages``: where
    its tensors' memory starts (up to MAX_STORAGES), so bytes two RRefs share (a module's and its
    parameters') are counted once (``inspect.rref_owners``)."""
    out: dict[str, Any] = {"type": type(value).__name__}
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    out["type"] = _script_name(value, torch) or out["type"]
    try:
        if isinstance(value, torch.Tensor):
            out.update(
                shape=list(value.shape),
                dtype=_dtype(value.dtype),
                device=str(value.device),
                nbytes=_nbytes(value),
                storages=_storages([value]),
            )
            return out
        tensors = list(itertools.islice(_tensors_in(value, torch), 10_000))
    except Exception:
        return out
    if tensors:
        out["storages"] = _storages(tensors)
        out["nbytes"] = sum(_nbytes(t) for t in tensors)
        devices = {str(t.device) for t in tensors}
        dtypes = {_dtype(t.dtype) for t in tensors}
        out["device"] = devices.pop() if len(devices) == 1 else "mixed"
        out["dtype"] = dtypes.pop() if len(dtypes) == 1 else "mixed"
    return out


def _script_name(value: Any, torch: Any) -> str | None:
    """A TorchScript value's own class: the Python class a module was scripted from
    (DistributedOptimizer's ``_ScriptLocalOptimizer``), a scripted class's name, not the wrapper
    (``RecursiveScriptModule``, ``ScriptObject``) every such value shares."""
    try:
        if isinstance(value, torch.jit.ScriptModule):
            return getattr(value, "original_name", None) or None
        if isinstance(value, torch._C.ScriptObject):
            return value._type().name().rsplit(".", 1)[-1] or None
    except Exception:
        return None
    return None


def _tensors_in(value: Any, torch: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()
    elif depth > 0:
        return
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in itertools.islice(value, _SCAN_LIMIT):
            yield from _tensors_in(item, torch, depth + 1)
    elif isinstance(value, dict):
        for item in itertools.islice(list(value.values()), _SCAN_LIMIT):
            yield from _tensors_in(item, torch, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for item in itertools.islice(list(vars(value).values()), _SCAN_LIMIT):
            yield from _tensors_in(item, torch, depth + 1)


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(tensor: Any) -> int:
    try:
        return int(tensor.nbytes)
    except Exception:
        return int(tensor.numel() * tensor.element_size())


def _storages(tensors: list[Any]) -> list[int]:
    found = []
    for tensor in itertools.islice(tensors, MAX_STORAGES):
        try:
            found.append(int(tensor.untyped_storage().data_ptr()))
        except Exception:
            continue
    return found
