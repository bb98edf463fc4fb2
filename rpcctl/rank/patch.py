"""The one place rpcctl patches torch.distributed for its telemetry, once per process, and the
observers it forwards to (every family's, ``families.OBSERVERS``; see ``observer``).

``install()`` runs when torch is imported (``autohook``), before ``init_rpc``: torch's RPC
handler captures ``api.rpc_sync`` / ``rpc_async`` / ``remote`` then, so RRef proxy calls,
``rref.rpc_sync().method()``, go through the hooks too. What it patches::

    torch.distributed                       wrapper                         observers
    rpc.remote / api.remote                 rrefs.hooks.wrap_remote         rrefs; calls times a sample
    rpc.rpc_sync / api.rpc_sync             calls.wrap_rpc_sync             calls
    rpc.rpc_async / api.rpc_async           calls.wrap_rpc_async            calls
      (and rref_proxy.rpc_async: it tells rref.rpc_async() from the blocking proxies by identity)
    rpc.init_rpc                            here (_wrap_init_rpc)           all: rpc_starting, rpc_started
    rpc.shutdown / api.shutdown             here (_wrap_shutdown)           all: shutdown_starting, _done
    api.RRef.__init__                       rrefs.hooks.wrap_rref_init      rrefs
    _InternalRPCPickler._py_rref_receiver   rrefs.hooks.wrap_receiver       rrefs (an RRef received)
    _InternalRPCPickler._py_rref_reducer    rrefs.hooks.wrap_reducer        rrefs (an RRef sent: a use)
    api.PyRRef.to_here, local_value, ...    rrefs.hooks.wrap_use            rrefs (hooks.USES)
    internal._run_function                  calls.wrap_run_function         calls (what this process serves)
    c10d.init_process_group, new_group      collectives.wrap_join           collectives

The hot-path wrappers stay in their family's module (they read its state as globals: cheaper
per call than an object's attributes; ``rpc.remote`` has one wrapper for both families, as a
second one in the chain cost each call ~2 µs). ``init_rpc`` and ``shutdown`` are wrapped once,
here, and call every observer in ``families.OBSERVERS`` order: at ``init_rpc`` the process first joins
telemetry (``set_join``: a spawned child shows up even if the rendezvous then hangs), then
the observers hear ``rpc_starting`` (calls posts ``join``), and once it returned
``rpc_started`` with the "rpc" event, which is then posted.

Besides this module, ``runtime`` wraps torch's rendezvous store and ``rpc.shutdown`` in a
rank started with ``RPCCTL_STORE_BIND`` (where the store listens, how long rank 0 keeps it):
what the job does, not what telemetry sees.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from rpcctl.rank import calls, collectives, families
from rpcctl.rank.observer import Observer, TorchRpc
from rpcctl.rank.rrefs import hooks

_installed = False
_torch_rpc: TorchRpc | None = None  # what the observers were prepared with, for a family registered later
# Called by the init_rpc wrapper before the rendezvous: joins telemetry, returns how to post the
# "rpc" event (or None). Set by the reporter, or by sitecustomize in processes a rank spawns.
_join: Callable[[], Callable[[dict[str, Any]], None] | None] | None = None


def set_join(join: Callable[[], Callable[[dict[str, Any]], None] | None]) -> None:
    """What the ``init_rpc`` wrapper calls to join this process to telemetry."""
    global _join
    _join = join


def activate(queue: Any) -> None:
    for observer in families.OBSERVERS:
        observer.activate(queue)


def deactivate() -> None:
    for observer in families.OBSERVERS:
        observer.deactivate()


def after_fork_in_child() -> None:
    for observer in families.OBSERVERS:
        observer.after_fork_in_child()


def dropped() -> int:
    return sum(observer.dropped() for observer in families.OBSERVERS)


def prepare(observer: Observer) -> None:
    """A family's observer registered after ``install`` patched torch: prepared now, as the
    others were then (nothing, before it)."""
    if _torch_rpc is not None:
        observer.prepare(_torch_rpc)


def install() -> bool:
    """Patch torch.distributed in this process (idempotent). False where RPC is unavailable
    (c10d is patched all the same where torch.distributed is)."""
    global _installed, _torch_rpc
    if _installed:
        return True
    import torch.distributed as dist

    if not dist.is_available():
        return False
    _patch_c10d(dist)
    import torch.distributed.rpc as rpc

    if not hasattr(rpc, "init_rpc"):
        return False
    import torch
    from torch.distributed.rpc import api, internal, rref_proxy
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

    if _installed or getattr(api.remote, "_rpcctl_wrapped", False):  # the imports above may have run autohook
        _installed = True
        return True
    torch_rpc = TorchRpc(torch=torch, rpc=rpc, api=api, internal=internal, rref_proxy=rref_proxy)
    hooks.skip_frames_of(rpc)  # call sites look past torch's rpc and the rank package
    _torch_rpc = torch_rpc
    for observer in families.OBSERVERS:
        observer.prepare(torch_rpc)
    _set(torch_rpc, "remote", hooks.wrap_remote(api.remote, UNSET_RPC_TIMEOUT))
    _set(torch_rpc, "rpc_sync", calls.wrap_rpc_sync(api.rpc_sync, UNSET_RPC_TIMEOUT))
    _set(torch_rpc, "rpc_async", calls.wrap_rpc_async(api.rpc_async, UNSET_RPC_TIMEOUT))
    rref_proxy.rpc_async = api.rpc_async
    internal._run_function = calls.wrap_run_function(internal._run_function)
    _set(torch_rpc, "shutdown", _wrap_shutdown(api.shutdown))
    rpc.init_rpc = _wrap_init_rpc(rpc.init_rpc)
    api.RRef.__init__ = hooks.wrap_rref_init(api.RRef.__init__)
    pickler = internal._InternalRPCPickler
    pickler._py_rref_receiver = classmethod(hooks.wrap_receiver(pickler.__dict__["_py_rref_receiver"].__func__))
    pickler._py_rref_reducer = hooks.wrap_reducer(pickler._py_rref_reducer)
    for name in hooks.USES:  # on torch's PyRRef: rpc.RRef's methods and rpc.remote's handles both end there
        setattr(api.PyRRef, name, hooks.wrap_use(getattr(api.PyRRef, name)))
    _installed = True
    return True


def _set(torch_rpc: TorchRpc, name: str, wrapped: Any) -> None:
    """``rpc.NAME`` and ``rpc.api.NAME``: user code reaches one, torch's handler the other."""
    setattr(torch_rpc.api, name, wrapped)
    setattr(torch_rpc.rpc, name, wrapped)


def _patch_c10d(dist: Any) -> None:
    from torch.distributed import distributed_c10d as c10d

    for name in ("init_process_group", "new_group"):
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_rpcctl_pgjoin", False):
            continue
        wrapped = collectives.wrap_join(original, name, _join_now)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def _join_now() -> Callable[[dict[str, Any]], None] | None:
    """Join this process to telemetry (a spawned child at init_rpc or init_process_group: it
    shows up now, even if the rendezvous then hangs); how to post an event now, or None."""
    join = _join
    return join() if join is not None else None


def _wrap_init_rpc(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_rpc(*args: Any, **kwargs: Any) -> Any:
        post = _join_now()
        for observer in families.OBSERVERS:
            observer.rpc_starting()
        result = orig(*args, **kwargs)
        try:
            info = _rpc_info(kwargs.get("rpc_backend_options", args[4] if len(args) > 4 else None))
            for observer in families.OBSERVERS:
                observer.rpc_started(info)
            if post is not None:
                post(info)
        except Exception:
            pass
        return result

    init_rpc._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return init_rpc


def _wrap_shutdown(orig: Any) -> Any:
    @functools.wraps(orig)
    def shutdown(*args: Any, **kwargs: Any) -> Any:
        for observer in families.OBSERVERS:
            observer.shutdown_starting()
        try:
            return orig(*args, **kwargs)
        finally:
            for observer in families.OBSERVERS:
                observer.shutdown_done()

    shutdown._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return shutdown


def _rpc_info(options: Any) -> dict[str, Any]:
    """The "rpc" event: who this process is in its RPC world, once ``init_rpc`` returned."""
    import torch.distributed.rpc as rpc

    me = rpc.get_worker_info()
    workers = {}
    try:
        workers = {info.id: info.name for info in rpc.api._get_current_rpc_agent().get_worker_infos()}
    except Exception:
        pass
    device_maps = devices = None
    if options is not None:
        device_maps = {
            str(k): {str(a): str(b) for a, b in v.items()}
            for k, v in (getattr(options, "device_maps", None) or {}).items()
        }
        devices = [str(d) for d in (getattr(options, "devices", None) or [])]
    return {
        "e": "rpc",
        "name": me.name,
        "rpc_rank": me.id,
        "world_size": len(workers) or None,
        "workers": workers,
        "device_maps": device_maps,
        "devices": devices,
        "rdv": _rendezvous(options),
        "t": time.time(),
    }


def _rendezvous(options: Any) -> str:
    """Where this process met the others of its RPC world (the store tells worlds apart by it)."""
    return collectives.rendezvous(getattr(options, "init_method", None))
