"""The hot path of RRef tracking: wrappers on torch.distributed.rpc that queue what they see.

Each hook appends one object to the reporter's queue (``OBSERVER.activate``) and returns; the
sender thread turns the queue into events (``sender.Tracker``). With no queue active, the
hooks only call through. What each hook records is listed in the package's docstring; ``patch``
puts the hooks on torch, and calls ``OBSERVER`` at ``init_rpc`` and ``shutdown``.

What the hooks queue, besides the handles' records (``Ref``) and events (dicts): tuples whose
first item names the Tracker's handler (``sender.Tracker.handlers``): ``("released", ref,
t)``, ``("uses", last_use)``, ``("vw", weakref, rref id)``, ``("vx", weakref, t)``,
``("unchurn", rref id)``.

Also here, because they run outside the sender thread: ``_describe_on_owner`` (an RPC target,
on the owner), and the identity ``init_rpc`` learns (``identity``; ``agent_identity`` before it
returns), which the sender's Tracker reads.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

from rpcctl.rank.observer import Observer, TorchRpc
from rpcctl.wire.protocol import MAX_QUEUE
from rpcctl.rank.rrefs.values import describe

# An RRef's text names its ids: "...RRefId = GloballyUniqueId(created_on=0, local_id=1)...".
RREF_ID = re.compile(r"GloballyUniqueId\(created_on=(\d+), local_id=(\d+)\)")

# The reporter's queue (a deque), or None: the hooks then only call through.
_q: Any = None
_dropped = 0
_time = time.time
_weakref = weakref.ref
_getframe = sys._getframe
_get_ident = threading.get_ident
_PLAIN = (types.FunctionType, types.MethodType, type)  # callees whose type is hashable and known
_skip_dirs: tuple[str, ...] = ()
# id(code) → (code, in torch's rpc or rpcctl's telemetry?). By id: a code object hashes its
# contents (its constants, names, bytecode) at every lookup; the entry keeps the code alive.
skip_codes: dict[int, tuple[Any, bool]] = {}  # public: the calls hooks look there too
MAX_CODES = 10_000  # code objects remembered (beyond: looked at each time)
_proxy_calls: tuple[Any, ...] = ()  # rref_proxy's _local_invoke functions: rref.remote().method()
_shutting_down = False
# rref id → creation site of the rpc.RRef(value) handles made here that died before the sender
# reported them (written by the sender, read by _describe_on_owner when a holder asks).
local_sites: dict[str, str] = {}
# id(handle) → when this process last used it (to_here, local_value, a proxy call, sent in a
# call): whether a reference held to shutdown was still in use. Entries go when the sender sees
# the handle gone (``Ref.oid``), so an id reused meanwhile loses at most one use.
last_use: dict[int, float] = {}
sender_tid = 0  # the telemetry sender's thread: what it does with an RRef is no use of it


def local_value(rref: Any) -> Any:
    """``rref.local_value()`` for rpcctl's own reads (a description), not noted as a use."""
    return _raw_local_value(rref)


_raw_local_value: Callable[[Any], Any] = lambda rref: rref.local_value()  # noqa: E731 - replaced by prepare()
# (name, rank, {rank: name}) once init_rpc returned here; None before, and in a forked child.
identity: tuple[str, int, dict[int, str]] | None = None


def agent_identity() -> tuple[str, int, dict[int, str]] | None:
    """Who this process is, from torch's RPC agent, or None before it exists. The agent serves
    peers' calls before ``init_rpc`` returns (it still gathers the others' device maps), and
    what those calls make here (an ``rpc.RRef(value)`` in a handler) is this worker's too."""
    rpc = sys.modules.get("torch.distributed.rpc")
    try:
        if rpc is None or not rpc.api._is_current_rpc_agent_set():
            return None
        agent = rpc.api._get_current_rpc_agent()
        me = agent.get_worker_info()
        return me.name, me.id, {info.id: info.name for info in agent.get_worker_infos()}
    except Exception:
        return None  # torch changed or the agent is going away: identity comes at init_rpc's return


def _drop() -> None:
    global _dropped
    _dropped += 1


# ---------------------------------------------------------------------------------------------
# Hot path (the user's threads and torch's RPC threads)


class Ref(weakref.ref):
    """A weak reference to an RRef handle that carries what the hook saw: one object per event
    (a tuple beside it would double the garbage-collected allocations on the hot path, and
    trigger collections a plain torch RPC loop never does). Queued when the handle is made; its
    death is queued as a ("released", ref, when) item if the sender reported it (``_released``,
    by a second weak reference the sender makes then: most handles die before, and a callback
    on every one cost the caller a call from C each)."""

    __slots__ = ("kind", "to", "func", "target", "code", "lasti", "data", "t", "seen", "tid", "oid")


def _released(ref: Ref, _watcher: Any = None) -> None:
    # Only a handle the sender reported (seen == 1) needs its release queued: one it has not
    # reached yet it will find dead (and count as short-lived). Most handles die that young,
    # so the sender watches only those it reported (``Tracker._report``). An item of its own,
    # not the record again: what reads the queue for new handles (the calls summary counts
    # rpc.remote calls from them) then sees each handle once.
    q = _q
    if q is not None and ref.seen == 1:
        q.append(("released", ref, _time()))


def _value_freed(wr: weakref.ref) -> None:
    q = _q
    if q is not None:
        q.append(("vx", wr, _time()))


def caller(depth: int = 2) -> tuple[Any, int]:
    """The call site of a hook: the innermost frame from ``depth`` up (2: the hook's caller)
    outside torch.distributed.rpc and rpcctl's telemetry, as (code, f_lasti); the line is
    resolved later, off the hot path (``f_lineno`` costs twice as much as ``f_lasti`` here)."""
    return outside(_getframe(depth))


def outside(frame: Any) -> tuple[Any, int]:
    """``frame`` or the innermost caller of it outside torch.distributed.rpc and rpcctl's
    telemetry, as (code, f_lasti). Where torch's RPC made the call on its own (its shutdown's
    gather and broadcast, on an RPC thread: no frame of the job's), its innermost frame of
    torch's, which says so; (None, 0) only for a call of rpcctl's own."""
    torch_frame = None
    while frame is not None:
        code = frame.f_code
        known = skip_codes.get(id(code))
        if known is not None and known[0] is code:
            skip = known[1]
        else:
            skip = code.co_filename.startswith(_skip_dirs)
            if len(skip_codes) < MAX_CODES:
                skip_codes[id(code)] = (code, skip)
        if not skip:
            return code, frame.f_lasti
        if torch_frame is None and _skip_dirs and code.co_filename.startswith(_skip_dirs[0]):
            torch_frame = frame
        frame = frame.f_back
    return (torch_frame.f_code, torch_frame.f_lasti) if torch_frame is not None else (None, 0)


_caller = caller


def skip_frames_of(rpc: Any) -> None:
    """Where ``caller`` looks past: torch.distributed.rpc's files and rpcctl's telemetry."""
    global _skip_dirs
    telemetry_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # rpcctl/telemetry/
    _skip_dirs = (os.path.dirname(rpc.__file__) + os.sep, telemetry_dir + os.sep)


def set_remote_timer(
    timer: Callable[..., Any] | None,
    count_failure: Callable[..., None] | None,
    timed: Callable[[Any, Any], bool] | None,
) -> None:
    """The calls family's part of the ``rpc.remote`` hook (``calls.OBSERVER.activate``; None: off).
    ``timed(func, args)`` says whether this call of ``func`` is timed (its per-function schedule, a
    helper's per method, as for rpc_sync and rpc_async); ``timer(orig, to, func, args, kwargs,
    timeout)`` makes one timed call and returns its handle; ``count_failure(to, func, args, exc)``
    counts an untimed one that raised (no handle, so no record of it counts it).

    One hook for both families: a second wrapper in the chain (calls' own, until this) cost
    each call ~2 µs of the caller's time in situ, cold caches and all: a third of what the
    hooks cost a sequential ``rpc.remote`` loop (benchmarks/telemetry_cost.py)."""
    global _time_remote, _count_failed_remote, _remote_timed
    _time_remote, _count_failed_remote, _remote_timed = timer, count_failure, timed


_time_remote: Callable[..., Any] | None = None
_count_failed_remote: Callable[..., None] | None = None
_remote_timed: Callable[[Any, Any], bool] | None = None


def wrap_remote(orig: Any, unset_timeout: float) -> Any:
    @functools.wraps(orig)
    def remote(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        timer, timed, count_failure = _time_remote, _remote_timed, _count_failed_remote  # set together, read together
        if timer is None or timed is None or count_failure is None:
            rref = orig(to, func, args, kwargs, timeout)
        elif timed(func, args):
            rref = timer(orig, to, func, args, kwargs, timeout)
        else:
            try:
                rref = orig(to, func, args, kwargs, timeout)
            except BaseException as exc:
                count_failure(to, func, args, exc)
                raise
        q = _q
        if q is not None:
            if len(q) < MAX_QUEUE:
                ref = Ref(rref)
                ref.kind, ref.to, ref.func, ref.t, ref.seen, ref.tid, ref.oid = (
                    "r",
                    to,
                    func,
                    _time(),
                    0,
                    _get_ident(),
                    id(rref),
                )
                # The call site: inline where the caller's frame is known as the job's (the
                # loop that calls it), as a call to caller() costs more than the look.
                frame = _getframe(1)
                code = frame.f_code
                known = skip_codes.get(id(code))
                if known is not None and known[0] is code and not known[1]:
                    ref.code, ref.lasti = code, frame.f_lasti
                else:  # not seen yet, or torch's or rpcctl's: walk on up
                    ref.code, ref.lasti = _caller()
                # rref.remote().method(): remember the target RRef (weakly) and the method name
                ref.target = (_weakref(args[0]), args[1]) if func in _proxy_calls and args and len(args) > 1 else None
                q.append(ref)
            else:
                _drop()
        return rref

    remote._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return remote


def wrap_rref_init(orig: Any) -> Any:
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        orig(self, *args, **kwargs)
        q = _q
        if q is not None:
            if len(q) < MAX_QUEUE:
                ref = Ref(self)
                ref.kind, ref.t, ref.seen, ref.oid = "l", _time(), 0, id(self)
                ref.code, ref.lasti = _caller()
                # Its id now: an RRef(value) handed out at once (parameter RRefs) is gone by the
                # time the sender looks, and its holders still want to know where it was made.
                ref.data = str(self)
                q.append(ref)
            else:
                _drop()

    __init__._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return __init__


def wrap_receiver(orig: Any) -> Any:
    def _py_rref_receiver(cls: Any, rref_fork_data: Any) -> Any:
        rref = orig(cls, rref_fork_data)
        q = _q
        if q is not None:
            if len(q) < MAX_QUEUE:
                # "o": the owner got its own RRef back (no fork: an rpc_async to itself that
                # returns an RRef(value) it made, DistributedOptimizer's optimizer): it holds it.
                ref = Ref(rref)
                ref.kind, ref.data, ref.t, ref.seen, ref.oid = (
                    "o" if rref.is_owner() else "f",
                    rref_fork_data,
                    _time(),
                    0,
                    id(rref),
                )
                q.append(ref)
            else:
                _drop()
        return rref

    # Pickle sends the receiver by name: ours must answer to the original's.
    _py_rref_receiver.__qualname__ = "_InternalRPCPickler._py_rref_receiver"
    _py_rref_receiver._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return _py_rref_receiver


def wrap_use(orig: Any) -> Any:
    """An RRef method that uses the reference (``to_here``, ``local_value``, the proxies): note when."""

    @functools.wraps(orig)
    def use(self, *args: Any, **kwargs: Any) -> Any:
        if _q is not None:
            last_use[id(self)] = _time()
        return orig(self, *args, **kwargs)

    use._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return use


def wrap_reducer(orig: Any) -> Any:
    """Pickling an RRef into a call's arguments (handing it to another worker) is a use too."""

    def _py_rref_reducer(self: Any, py_rref: Any) -> Any:
        if _q is not None and _get_ident() != sender_tid:  # not the sender's batched describe calls
            last_use[id(py_rref)] = _time()
        return orig(self, py_rref)

    _py_rref_reducer.__qualname__ = "_InternalRPCPickler._py_rref_reducer"
    _py_rref_reducer._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return _py_rref_reducer


USES = ("to_here", "local_value", "rpc_sync", "rpc_async", "remote")  # PyRRef methods that use the reference


def _open_autograd_contexts() -> int | None:
    """Distributed autograd contexts still open in this process (each keeps the tensors its
    calls sent until it is released): what may hold an RRef's value past its references."""
    try:
        import torch.distributed.autograd as dist_autograd

        return int(dist_autograd._get_debug_info().get("num_autograd_contexts", 0))
    except Exception:
        return None


class RRefsObserver(Observer):
    """The RRef family, as ``patch`` and the reporter drive it."""

    name = "rrefs"

    def prepare(self, torch_rpc: TorchRpc) -> None:
        global _proxy_calls, _raw_local_value
        _proxy_calls = (torch_rpc.rref_proxy._local_invoke, torch_rpc.rref_proxy._local_invoke_async_execution)
        _raw_local_value = torch_rpc.api.PyRRef.local_value  # before ``wrap_use`` wraps it

    def activate(self, queue: Any) -> None:
        global _q
        _q = queue

    def deactivate(self) -> None:
        global _q
        _q = None

    def after_fork_in_child(self) -> None:
        """A forked child starts with no queue and no state."""
        global _q, _dropped, _shutting_down, identity
        _q = None
        _dropped = 0
        _shutting_down = False
        identity = None
        local_sites.clear()
        last_use.clear()

    def dropped(self) -> int:
        return _dropped

    def rpc_started(self, info: dict[str, Any]) -> None:
        global identity
        identity = (info["name"], info["rpc_rank"], info["workers"])

    def shutdown_starting(self) -> None:
        global _shutting_down
        _shutting_down = True  # no more describe calls from the sender thread
        q = _q
        if q is not None:
            q.append(("uses", dict(last_use)))  # the last uses now: its locals may be gone by the sender's next cycle
            q.append({"e": "shutdown", "t": _time()})

    def shutdown_done(self) -> None:
        # A worker that serves others calls rpc.shutdown() at once and serves inside it, until
        # every worker is done: what it was handed and used meanwhile ends here.
        q = _q
        if q is not None:
            q.append(("uses", dict(last_use)))
            q.append({"e": "shutdown", "done": True, "autograd_contexts": _open_autograd_contexts(), "t": _time()})


OBSERVER = RRefsObserver()


def _describe_on_owner(rrefs: list[Any]) -> None:
    """Runs on the owner (one batched rpc_async from a creator's sender thread): describe each
    value, and watch it so that its release is seen. Reports through the owner's own channel."""
    q = _q
    if q is None:
        return
    now = _time()
    for rref in rrefs:
        try:
            ids = RREF_ID.findall(str(rref))
            rref_id = f"{ids[0][0]}:{ids[0][1]}"
            value = local_value(rref)
        except Exception:
            continue
        event = {"e": "desc", "id": rref_id, "value": describe(value), "watched": True, "t": now}
        site = local_sites.get(rref_id)
        if site is not None:  # made here by rpc.RRef(value): where, and that it is a local one
            event.update(site=site, kind="local")
            q.append(("unchurn", rref_id))  # its handle here died young, but the RRef lives on in a holder
        try:
            watch = ("vw", _weakref(value, _value_freed), rref_id)
        except TypeError:  # an int, a list: its release cannot be seen
            watch, event["watched"] = None, False
        q.append(event)
        if watch is not None:
            q.append(watch)
        del value
