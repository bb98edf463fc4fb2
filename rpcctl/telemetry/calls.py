"""RPC call tracking inside a process: who calls whom, for what, since when; and what this
process is running for others right now.

Hooks (installed when torch is imported, before ``init_rpc``: torch's RPC handler captures
``api.rpc_sync`` / ``rpc_async`` / ``remote`` then, so RRef proxy calls,
``rref.rpc_sync().method()``, go through them too):

=================================  ==========================================================
hook                               hot path
=================================  ==========================================================
``rpc_sync``                       a ``_Call`` in ``_pending``; timed inline, then queued
``rpc_async``                      the first ``ASYNC_TIMED_FIRST`` calls, then one in
                                   ``ASYNC_SAMPLE``: as rpc_sync, ended by a done-callback on
                                   the call's future; the others: one tuple in ``_watched``
                                   (future, callee, function, site, start), counted with their
                                   outcome once seen done, not timed
``remote``                         the RRef hook (``rrefs.hooks``: one hook for both) lets
                                   ``_time_remote`` time the first ``REMOTE_TIMED_FIRST``,
                                   then one in ``REMOTE_SAMPLE``, the same (ended by the RRef's
                                   creation future, complete once the owner ran the function);
                                   the others only call through: the hook's record of the
                                   handle counts them, on the sender
``init_rpc``                       a ``join`` event when it starts (a rank stuck before it
                                   is named by the watchdog), the worker list when it ends
=================================  ==========================================================

Why not a done-callback on every rpc_async future: torch runs it on an RPC thread that takes
the GIL a second time for it (after unpickling the result), and that cost rank 0's RPC threads
~15-30 µs of CPU per call at 64 in flight (``benchmarks/telemetry_cost.py --threads``), a tenth
of a loopback call. A watched future is looked at instead, by the sender every cycle (and by the
caller's thread once ``HARVEST_AT`` are waiting: a sender that cannot keep up). The price: a
future the job has dropped stays alive (with its value) until it is seen done, one sender cycle
(0.1 s) later at most while the sender keeps up.

The callee's side has no hook: the sender looks at every thread's stack each cycle
(``sys._current_frames``) for a frame of torch's ``internal._run_function`` (what runs a Python
function for an incoming call), and lists one running for ``LONG_S`` with its function, from
when it was first seen (up to a cycle late). A hook there cost the callee's RPC threads 3-12 µs
of CPU per call (``benchmarks/telemetry_cost.py --threads``); the look costs the sender a few µs
per thread per cycle, whatever the call rate.

Everything else happens on the telemetry sender thread (``Summariser.process``, every 0.1 s):
ended calls, and the ``rpc.remote`` handles the RRef hook queued, are counted per (callee, function, kind) into a log-scale histogram (``cstat``
events: count, errors, timeouts, durations), so a fast call costs one small object and no
event of its own. Only calls running for at least ``LONG_S`` are listed one by one (``call``
when seen, ``cend`` when over), and only functions served for that long (``srv`` / ``send``),
with the caller's thread, so the watchdog can tie a waiting thread to what it waits on.

Names: a call is named by its function (``module.qualname``, ``__main__`` left out); an RRef
proxy call, ``rref.rpc_sync().method()``, by ``rref.method`` (the caller does not know the
type); a helper whose first argument is a function (the examples' ``_call_method(method, rref,
*args)``, run by ``rpc_sync(rref.owner(), _call_method, args=[method, rref, ...])``) by both:
``_call_method → ParameterServer.forward``, the same on the callee's side (the hang diagnosis
pairs the two by name). The hot path pays one type check of the first argument for it.

Request bytes: the caller adds up the bytes of the tensors among a call's first
``MAX_ARGS_LOOKED_AT`` positional arguments (what is cheap to see: no walk into lists, dicts or
objects; pickled non-tensor data is not counted); summarised per (callee, function, kind) over
the calls timed here, and listed with a long call. The callee reports the same of the
functions it lists (``srv``).
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
import threading
import time
import types
from collections import deque
from typing import Any

from rpcctl.states import CallState
from rpcctl.telemetry.protocol import MAX_QUEUE
from rpcctl.telemetry.rrefs import hooks
from rpcctl.telemetry.rrefs.hooks import Ref as _Ref
from rpcctl.telemetry.rrefs.hooks import caller as _caller
from rpcctl.telemetry.rrefs.sender import Tracker, qualname

# The first calls of a kind in a process are timed, then one in SAMPLE: a timed rpc.remote
# (its creation future and a done-callback on it) cost the job ~70 µs of CPU here, a timed
# rpc_async ~20 µs; every call is counted either way (benchmarks/telemetry_cost.py --threads).
REMOTE_TIMED_FIRST, REMOTE_SAMPLE = 100, 64  # the others are counted from the RRef hook's records
ASYNC_TIMED_FIRST, ASYNC_SAMPLE = 100, 16  # the others are watched (``_watched``)
HARVEST_AT = 1024  # watched rpc_async calls waiting: the caller's thread then counts those done itself
LONG_S = 1.0  # calls (and served functions) running this long are listed one by one
MAX_LISTED = 100_000  # per process: beyond this, long calls are only counted
HIST_BUCKETS_PER_OCTAVE = 4  # duration histogram: bucket b covers 2**(b/4) µs onwards
OK, ERROR, TIMEOUT = CallState.OK, CallState.ERROR, CallState.TIMEOUT  # bound once: the hooks are hot
KINDS = ("rpc_sync", "rpc_async", "remote")
MAX_ARGS_LOOKED_AT = 8  # request bytes: the tensors among this many positional arguments
_Tensor: Any = ()  # torch.Tensor once installed (isinstance against () is always False)
_TORCH_INTERNAL = "torch.distributed.rpc."
# A call's first argument of these types is the method a helper runs (``_call_method``).
_HELPED = frozenset((types.FunctionType, types.MethodType, types.BuiltinFunctionType))

_q: Any = None  # the worker's queue while telemetry is active; None: the hooks only call through
_time = time.time
_get_ident = threading.get_ident
_pending: dict[int, _Call] = {}  # id(call) → call, for calls in flight
_done: deque[_Call] = deque()  # ended calls, for the sender
_watched: deque[tuple[Any, ...]] = deque()  # untimed rpc_async calls: (future, to, func, args, code, lasti, tid, t0)
_seen_done: deque[tuple[tuple[Any, ...], str, float]] = deque()  # (watched, status, when seen) for the sender
_run_function_code: Any = None  # torch's internal._run_function: a thread in it serves a call
MAX_FRAMES_LOOKED_AT = 256  # per thread and cycle, looking for _run_function
_sender_tid = 0  # the telemetry thread: its own calls (RRef descriptions) are not the job's
_installed = False
_local_invokes: tuple[Any, ...] = ()  # rref_proxy's functions behind rref.rpc_sync().method()
_me: str | None = None
_workers: dict[int, str] = {}
_dropped = 0
_remotes_timed = 0  # rpc.remote calls timed in this process


class _Call:
    __slots__ = ("kind", "to", "func", "args", "code", "lasti", "tid", "t0", "t1", "status", "listed", "counted", "nbytes")

    def finish(self, fut: Any) -> None:
        """Done-callback of an async call's future (a torch thread)."""
        try:
            fut.value()
            self.status = OK
        except BaseException as exc:  # noqa: BLE001 - an RPC error of any type ends the call
            self.status = _failure(exc)
        _end(self)


def _failure(exc: BaseException) -> str:
    text = str(exc)
    return TIMEOUT if "timeout" in text.lower() or "timed out" in text else ERROR


def _end(call: _Call) -> None:
    call.t1 = _time()
    _pending.pop(id(call), None)
    if len(_done) < MAX_QUEUE:
        _done.append(call)
    else:
        _drop()


def _drop() -> None:
    global _dropped
    _dropped += 1


def dropped() -> int:
    return _dropped


def _start(kind: str, to: Any, func: Any, args: Any) -> _Call | None:
    tid = _get_ident()
    if tid == _sender_tid:
        return None
    call = _Call()
    call.kind, call.to, call.func, call.tid, call.listed, call.counted = kind, to, func, tid, 0, True
    call.args = _proxy_method(func, args)
    call.code, call.lasti = _caller(3)  # 3: this function, the hook, the hook's caller (or rpcctl's frames, walked past)
    call.nbytes = _sent_bytes(args, call.args)
    call.t0 = _time()
    _pending[id(call)] = call
    return call


def _proxy_method(func: Any, args: Any) -> Any:
    """The method a call runs, where ``func`` only carries it: rref.rpc_sync().method() (args =
    (rref, method name, its args, its kwargs)): the name; a helper called with a function first
    (the examples' ``_call_method(method, rref, *args)``): that function. Else None. Hot: one
    type check of the first argument."""
    if not args:
        return None
    if func in _local_invokes:
        return args[1] if len(args) > 1 else None
    try:
        first = args[0]
    except Exception:  # odd args (torch refuses them): no method
        return None
    return first if type(first) in _HELPED else None


def _sent_bytes(args: Any, method: Any) -> int | None:
    sent = (args[2] if len(args) > 2 else None) if type(method) is str else args
    return _request_bytes(sent) if sent else None


def _outcome(fut: Any) -> str:
    try:
        fut.value()
    except BaseException as exc:  # noqa: BLE001 - an RPC error of any type ends the call
        return _failure(exc)
    return OK


def _harvest_done() -> None:
    """The caller's thread, when HARVEST_AT calls are watched: those done, from the oldest up to
    the first still running, go to the sender, so the futures the job dropped are let go."""
    while _watched:
        try:
            watched = _watched.popleft()
        except IndexError:  # the sender took the last one
            return
        if not watched[0].done():
            _watched.appendleft(watched)
            return
        _seen_done.append((watched, _outcome(watched[0]), _time()))


def _request_bytes(args: Any) -> int | None:
    """Bytes of the tensors among the first arguments; None where there is none."""
    total = None
    try:
        for arg in args[:MAX_ARGS_LOOKED_AT]:
            if isinstance(arg, _Tensor):
                total = (total or 0) + arg.nbytes
    except Exception:  # odd args (not a sequence): no figure
        return None
    return total


def _sent(call: _Call, orig: Any, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> Any:
    """``orig``'s result for a timed call; one that raised is ended with its failure."""
    try:
        return orig(to, func, args, kwargs, timeout)
    except BaseException as exc:
        call.status = _failure(exc)
        _end(call)
        raise


def _wrap_rpc_sync(orig: Any, unset_timeout: float) -> Any:
    @functools.wraps(orig)
    def rpc_sync(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        call = _start("rpc_sync", to, func, args) if _q is not None else None
        if call is None:
            return orig(to, func, args, kwargs, timeout)
        result = _sent(call, orig, to, func, args, kwargs, timeout)
        call.status = OK
        _end(call)
        return result

    rpc_sync._rpcctl_calls = True  # type: ignore[attr-defined]
    return rpc_sync


def _wrap_rpc_async(orig: Any, unset_timeout: float) -> Any:
    """rpc_async: the first ``ASYNC_TIMED_FIRST`` calls, then one in ``ASYNC_SAMPLE``, are timed
    (``_timed_async``); the others' futures are kept in ``_watched`` until seen done, so they
    are counted with their outcome, listed if long, but not timed."""
    seen = itertools.count()

    @functools.wraps(orig)
    def rpc_async(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        if _q is None:
            return orig(to, func, args, kwargs, timeout)
        n = next(seen)
        if n < ASYNC_TIMED_FIRST or not (n - ASYNC_TIMED_FIRST) % ASYNC_SAMPLE:
            return _timed_async("rpc_async", _future, orig, to, func, args, kwargs, timeout)
        tid = _get_ident()
        if tid == _sender_tid:
            return orig(to, func, args, kwargs, timeout)
        code, lasti = _caller(2)  # 2: the hook's caller
        t0 = _time()
        try:  # inline, not in a helper: a Python call more per call shows in this loop
            result = orig(to, func, args, kwargs, timeout)
        except BaseException as exc:
            _count_failure("rpc_async", to, func, args, exc)
            raise
        if len(_watched) >= HARVEST_AT:
            _harvest_done()
        if len(_watched) < MAX_QUEUE:
            _watched.append((result, to, func, args, code, lasti, tid, t0))
        else:  # the sender is far behind: the call goes unrecorded rather than the list unbounded
            _drop()
        return result

    rpc_async._rpcctl_calls = True  # type: ignore[attr-defined]
    return rpc_async


def _timed_async(kind: str, future_of: Any, orig: Any, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> Any:
    """One timed call of ``kind``, ended by a done-callback on ``future_of(result)`` (remote: the
    RRef's creation future, complete once the owner ran the function)."""
    call = _start(kind, to, func, args)
    if call is None:
        return orig(to, func, args, kwargs, timeout)
    result = _sent(call, orig, to, func, args, kwargs, timeout)
    if kind == "remote":
        call.counted = False  # its handle's record counts it
    try:
        future_of(result).add_done_callback(call.finish)
    except Exception:  # no future to watch: count the call as sent
        call.status = OK
        _end(call)
    return result


def _time_remote(orig: Any, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> tuple[Any, int]:
    """The RRef hook's timer (``hooks.set_remote_timer``): one timed rpc.remote, and how many
    to let by untimed before the next (none among a process's first ``REMOTE_TIMED_FIRST``).
    The schedule of the rpc_async hook: the calls numbered REMOTE_TIMED_FIRST + k * REMOTE_SAMPLE.
    The others the RRef hook's record of their handle counts, on the sender."""
    global _remotes_timed
    rref = _timed_async("remote", _creation_future, orig, to, func, args, kwargs, timeout)
    _remotes_timed += 1
    # Calls 0 to REMOTE_TIMED_FIRST - 1 are timed, then REMOTE_TIMED_FIRST, and one in REMOTE_SAMPLE on
    return rref, 0 if _remotes_timed <= REMOTE_TIMED_FIRST else REMOTE_SAMPLE - 1


def _count_failure(kind: str, to: Any, func: Any, args: Any, exc: BaseException) -> None:
    """An untracked call that failed before it was sent (no future, no handle): counted here."""
    failed = _start(kind, to, func, args)
    if failed is not None:
        failed.status = _failure(exc)
        _end(failed)


def _future(fut: Any) -> Any:
    return fut


def _creation_future(rref: Any) -> Any:
    return rref._get_future()


def _wrap_init_rpc(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_rpc(*args: Any, **kwargs: Any) -> Any:
        global _me, _workers
        q = _q
        if q is not None:
            q.append({"e": "join", "t": _time()})
        result = orig(*args, **kwargs)
        try:
            import torch.distributed.rpc as rpc

            _me = rpc.get_worker_info().name
            _workers = {info.id: info.name for info in rpc.api._get_current_rpc_agent().get_worker_infos()}
        except Exception:
            pass
        return result

    init_rpc._rpcctl_calls = True  # type: ignore[attr-defined]
    return init_rpc


def install() -> bool:
    """Wrap torch.distributed.rpc's call paths (idempotent), but for ``rpc.remote``: the RRef
    hook there (``rrefs.install()``) times the calls of it that ``activate`` asks for."""
    global _installed, _local_invokes, _Tensor, _run_function_code
    if _installed:
        return True
    import torch.distributed as dist

    if not dist.is_available():
        return False
    import torch.distributed.rpc as rpc

    if not hasattr(rpc, "init_rpc"):
        return False
    from torch.distributed.rpc import api, internal, rref_proxy
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

    _run_function_code = getattr(internal._run_function, "__code__", None)
    if getattr(api.rpc_sync, "_rpcctl_calls", False):
        _installed = True
        return True
    hooks.skip_frames_of(rpc)
    import torch

    _Tensor = torch.Tensor
    _local_invokes = (rref_proxy._local_invoke, rref_proxy._local_invoke_async_execution)
    wrappers = {"rpc_sync": _wrap_rpc_sync(api.rpc_sync, UNSET_RPC_TIMEOUT),
                "rpc_async": _wrap_rpc_async(api.rpc_async, UNSET_RPC_TIMEOUT)}
    for name, wrapped in wrappers.items():
        setattr(api, name, wrapped)
        setattr(rpc, name, wrapped)
    # rref_proxy tells rref.rpc_async() from the blocking proxies by identity with this name.
    rref_proxy.rpc_async = api.rpc_async
    rpc.init_rpc = _wrap_init_rpc(rpc.init_rpc)
    _installed = True
    return True


def activate(queue: Any) -> None:
    global _q
    _q = queue
    hooks.set_remote_timer(_time_remote, functools.partial(_count_failure, "remote"))


def deactivate() -> None:
    global _q
    _q = None
    hooks.set_remote_timer(None, None)


def after_fork_in_child() -> None:
    """A forked child starts with nothing in flight and serves nothing."""
    global _q, _dropped, _summariser, _sender_tid, _remotes_timed
    _q = None
    _dropped = 0
    _remotes_timed = 0
    hooks.set_remote_timer(None, None)
    _sender_tid = 0
    _pending.clear()
    _done.clear()
    _watched.clear()
    _seen_done.clear()
    _summariser = Summariser()


# ---------------------------------------------------------------------------------------------
# Off the hot path: the sender thread turns ended calls into counts, and lists the long ones


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration: 4 per octave from 1 µs (b = 4·log2(µs))."""
    micros = seconds * 1e6
    return 0 if micros <= 1.0 else min(159, int(math.log2(micros) * HIST_BUCKETS_PER_OCTAVE))


def bucket_seconds(index: int) -> float:
    """A duration that stands for bucket ``index``: its geometric middle."""
    return 2 ** ((index + 0.5) / HIST_BUCKETS_PER_OCTAVE) / 1e6


def quantile(hist: dict[int, int], q: float) -> float | None:
    """The nearest-rank quantile: the ceil(q·n)-th duration's bucket, so the p99 of a few calls
    is the slowest one's (rounding the rank down showed the p99 of 3 calls as the second)."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(q * total)), 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            break
    return bucket_seconds(index)


class Summariser:
    """Per-process state of the call reports. Used only by the sender thread."""

    def __init__(self) -> None:
        self.names: dict[Any, str] = {}
        self.sites: dict[tuple[Any, int], str] = {}
        self.stats: dict[tuple[str, str, str], list[Any]] = {}  # (callee, func, kind) → [n, err, tmo, sum, max, hist]
        self.listed = 0
        self.running: dict[int, list[Any]] = {}  # thread → [its _run_function frame, first seen, serve id or 0]
        self.watching: list[_Ref] = []  # rpc.remote handles alive when first seen
        self.remote_listed: dict[int, int] = {}  # id(handle record) → call id, for those listed
        self.watched_listed: dict[int, int] = {}  # id(watched rpc_async) → call id, for those listed
        self.next_id = 1

    def process(self, now: float, final: bool = False, items: list[Any] = ()) -> list[dict[str, Any]]:
        """This cycle's reports; ``items``: what the hooks queued this cycle (the RRef
        tracker's), whose ``rpc.remote`` handles count those calls."""
        global _sender_tid
        _sender_tid = _get_ident()
        out: list[dict[str, Any]] = []
        if _q is not None:
            self.remotes(items)
        if _watched or _seen_done:
            self._harvest(now, out)
        for _ in range(len(_done)):
            call = _done.popleft()
            self._ended(call, out)
        for call in list(_pending.values()):
            if not call.listed and now - call.t0 >= LONG_S and id(call) in _pending:
                self._list(call, out)
        self._watch_remotes(now, out)
        for (callee, func, kind), (n, err, tmo, total, longest, hist, sent) in self.stats.items():
            out.append({"e": "cstat", "callee": callee, "func": func, "kind": kind, "n": n, "err": err, "tmo": tmo,
                        "sum": total, "max": longest, "h": {str(k): v for k, v in hist.items()}, "bytes": sent, "t": now})
        self.stats.clear()
        self._serving(now, out)
        return out

    def remotes(self, items: list[Any]) -> None:
        """Count every ``rpc.remote`` call from its handle's record (``hooks._Ref``, kind "r"),
        and watch the handles still alive: one whose creation is still pending after LONG_S is
        listed like a long call (``_watch_remotes``)."""
        watching, name_of, callee_of = self.watching, self._ref_name, self._callee
        for item in items:
            if type(item) is not _Ref or item.kind != "r":
                continue
            name = name_of(item)
            if name.startswith(_TORCH_INTERNAL):
                continue
            key = (callee_of(item.to), name, "remote")
            entry = self._entry(key)
            entry[0] += 1
            if item() is not None and len(watching) < MAX_QUEUE:
                watching.append(item)

    def _watch_remotes(self, now: float, out: list[dict[str, Any]]) -> None:
        """The watched handles: over once gone, or (looked at once a second old: the future
        costs) once the owner created the value; listed while still pending."""
        still = []
        for ref in self.watching:
            rref = ref()
            if rref is not None and now - ref.t >= LONG_S and rref._get_future().done():
                rref = None
            if rref is None:
                listed = self.remote_listed.pop(id(ref), None)
                if listed is not None:
                    out.append({"e": "cend", "id": listed, "status": OK, "t": now})
                continue
            del rref
            still.append(ref)
            if now - ref.t >= LONG_S and id(ref) not in self.remote_listed and self.listed < MAX_LISTED:
                self.listed += 1
                self.remote_listed[id(ref)] = listed = self.next_id
                self.next_id += 1
                out.append({"e": "call", "id": listed, "kind": "remote", "callee": self._callee(ref.to), "func": self._ref_name(ref),
                            "site": self._site(ref.code, ref.lasti), "thread": ref.tid, "t": ref.t})
        self.watching = still

    def _entry(self, key: tuple[str, str, str]) -> list[Any]:
        """This cycle's counts of (callee, func, kind): [n, err, tmo, sum, max, hist, bytes]."""
        entry = self.stats.get(key)
        if entry is None:
            entry = self.stats[key] = [0, 0, 0, 0.0, 0.0, {}, 0]
        return entry

    def _harvest(self, now: float, out: list[dict[str, Any]]) -> None:
        """The watched rpc_async calls: counted with their outcome once done, listed once running
        for LONG_S (ended when seen done, so their end is known within a cycle)."""
        for _ in range(len(_watched)):
            try:
                watched = _watched.popleft()
            except IndexError:  # the caller's thread took the last one
                break
            if watched[0].done():
                self._count_watched(watched, _outcome(watched[0]), now, out)
                continue
            _watched.append(watched)
            if now - watched[7] >= LONG_S and id(watched) not in self.watched_listed and self.listed < MAX_LISTED:
                _, to, func, args, code, lasti, tid, t0 = watched
                method = _proxy_method(func, args)
                self.listed += 1
                self.watched_listed[id(watched)] = self.next_id
                out.append({"e": "call", "id": self.next_id, "kind": "rpc_async", "callee": self._callee(to),
                            "func": self._func_or_method(func, method), "site": self._site(code, lasti), "thread": tid,
                            "nbytes": _sent_bytes(args, method), "t": t0})
                self.next_id += 1
        for _ in range(len(_seen_done)):
            watched, status, seen = _seen_done.popleft()
            self._count_watched(watched, status, seen, out)

    def _count_watched(self, watched: tuple[Any, ...], status: str, seen: float, out: list[dict[str, Any]]) -> None:
        listed = self.watched_listed.pop(id(watched), None)
        if listed is not None:
            out.append({"e": "cend", "id": listed, "status": status, "t": seen})
        _, to, func, args = watched[:4]
        name = self._func_or_method(func, _proxy_method(func, args))
        if name.startswith(_TORCH_INTERNAL):
            return
        key = (self._callee(to), name, "rpc_async")
        entry = self._entry(key)
        entry[0] += 1
        if status == ERROR:
            entry[1] += 1
        elif status == TIMEOUT:
            entry[2] += 1
        if seen - watched[7] >= LONG_S:  # untimed, but the longest call is known within a cycle
            entry[4] = max(entry[4], seen - watched[7])

    def _ref_name(self, ref: _Ref) -> str:
        target = ref.target
        if target is not None:  # rref.remote().method(): the caller knows the method, not the type
            return f"rref.{target[1]}"
        return self._func_name(ref.func)

    def _ended(self, call: _Call, out: list[dict[str, Any]]) -> None:
        if call.t1 is None:  # an untimed remote call: counted, not timed
            self._count(call, None)
            return
        duration = max(0.0, call.t1 - call.t0)
        if not call.listed and duration >= LONG_S:
            self._list(call, out)
        if call.listed:
            out.append({"e": "cend", "id": call.listed, "status": call.status, "t": call.t1})
        self._count(call, duration)

    def _count(self, call: _Call, duration: float | None) -> None:
        name = self._name(call)
        if name.startswith(_TORCH_INTERNAL):  # torch's own protocol (shutdown's barrier, proxies' type lookups)
            return
        key = (self._callee(call.to), name, call.kind)
        entry = self._entry(key)
        if call.counted:
            entry[0] += 1
        if call.status == ERROR:
            entry[1] += 1
        elif call.status == TIMEOUT:
            entry[2] += 1
        if duration is None:
            return
        entry[3] += duration
        entry[4] = max(entry[4], duration)
        entry[6] += call.nbytes or 0  # over the timed calls, as the durations
        b = bucket(duration)
        entry[5][b] = entry[5].get(b, 0) + 1

    def _list(self, call: _Call, out: list[dict[str, Any]]) -> None:
        if self.listed >= MAX_LISTED or not call.counted:  # a sampled remote: its handle is listed
            return
        self.listed += 1
        call.listed = self.next_id
        self.next_id += 1
        out.append({"e": "call", "id": call.listed, "kind": call.kind, "callee": self._callee(call.to), "func": self._name(call),
                    "site": self._site(call.code, call.lasti), "thread": call.tid, "nbytes": call.nbytes, "t": call.t0})

    def _serving(self, now: float, out: list[dict[str, Any]]) -> None:
        """What this process runs for others: a thread whose stack holds a frame of torch's
        ``_run_function`` serves a call; one served for LONG_S is listed (``srv``) until it is
        over (``send``: when this frame is no longer on that thread's stack). The frame is held
        from one cycle to the next (so its identity is its own; a call that ended is let go then)."""
        code = _run_function_code
        if code is None:
            return
        me, main = _get_ident(), threading.main_thread().ident
        running: dict[int, list[Any]] = {}
        for tid, frame in sys._current_frames().items():
            if tid == me or tid == main:  # the sender; the main thread serves no call
                continue
            for _ in range(MAX_FRAMES_LOOKED_AT):
                if frame is None or frame.f_code is code:
                    break
                frame = frame.f_back
            if frame is None or frame.f_code is not code:
                continue
            entry = self.running.get(tid)
            if entry is None or entry[0] is not frame:
                entry = [frame, now, 0]
            running[tid] = entry
            if not entry[2] and now - entry[1] >= LONG_S and self.listed < MAX_LISTED:
                udf = frame.f_locals.get("python_udf")  # read once, as it is listed
                name = _udf_name(udf)
                entry[2] = -1 if name is None else self.next_id  # -1: not the job's (rpcctl's own describe)
                if name is not None:
                    self.listed += 1
                    self.next_id += 1
                    out.append({"e": "srv", "id": entry[2], "thread": tid, "func": name, "nbytes": _tensor_bytes(udf), "t": entry[1]})
            del frame
        for tid, entry in self.running.items():
            if running.get(tid) is not entry and entry[2] > 0:
                out.append({"e": "send", "id": entry[2], "t": now})
        self.running = running

    def _callee(self, to: Any) -> str:
        if type(to) is str:
            return to
        if isinstance(to, int):
            return _workers.get(to, str(to))
        return str(getattr(to, "name", to))

    def _name(self, call: _Call) -> str:
        return self._func_or_method(call.func, call.args)

    def _func_or_method(self, func: Any, method: Any) -> str:
        if method is None:
            return self._func_name(func)
        if type(method) is str:  # an RRef proxy: the caller knows the method, not the type
            return f"rref.{method}"
        return helped(self._func_name(func), self._func_name(method))

    def _func_name(self, func: Any) -> str:
        try:
            name = self.names.get(func)
        except TypeError:  # unhashable callable
            return qualname(func)
        if name is None:
            name = qualname(func)
            if len(self.names) < 10_000:
                self.names[func] = name
        return name

    _site = Tracker._site  # call sites resolved (and cached) as RRef creation sites are


_summariser = Summariser()


def summariser() -> Summariser:
    return _summariser


def helped(helper: str, method: str) -> str:
    """A helper that runs a method it is given: ``_call_method → ParameterServer.forward``."""
    return f"{helper} → {method}"


def _udf_name(udf: Any) -> str | None:
    """What a served request runs: ``Class.method`` for RRef proxy calls (the owner knows the type)."""
    try:
        func = udf.func
        if func in _local_invokes:
            rref, method = udf.args[0], udf.args[1]
            return f"{type(hooks.local_value(rref)).__qualname__}.{method}"
        name = qualname(func)
        method = _proxy_method(func, udf.args)
        if method is not None:  # as the caller names it
            return helped(name, qualname(method))
    except Exception:
        return None
    return None if name.endswith("_describe_on_owner") else name  # rpcctl's own RRef descriptions


def _tensor_bytes(udf: Any) -> int | None:
    torch = sys.modules.get("torch")
    try:
        args = list(udf.args or ()) + list((udf.kwargs or {}).values())
        tensors = [a for a in args[:64] if isinstance(a, torch.Tensor)]
        return sum(int(t.nbytes) for t in tensors) if tensors else None
    except Exception:
        return None
