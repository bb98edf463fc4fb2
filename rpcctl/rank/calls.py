"""RPC call tracking inside a process: who calls whom, for what, since when; and what this
process is running for others right now.

Hooks (``wrap_rpc_sync``, ``wrap_rpc_async``; ``patch`` puts them on torch, and tells
``OBSERVER`` of ``init_rpc``):

=================================  ==========================================================
hook                               hot path
=================================  ==========================================================
``rpc_sync``                       of each function, the first ``SYNC_TIMED_FIRST``, then
                                   one in ``SYNC_SAMPLE``: a ``Call`` in ``_pending``, timed
                                   inline, then queued; the others (``_untimed_sync``): one
                                   tuple in ``_in_flight`` while they run (the sender lists
                                   one that runs long), one in ``_untimed`` when they
                                   return, counted
``rpc_async``                      of each function, the first ``ASYNC_TIMED_FIRST``, then one
                                   in ``ASYNC_SAMPLE``: as rpc_sync, ended by a done-callback on
                                   the call's future; the others: one tuple in ``_watched``
                                   (future, callee, function, site, start), counted with their
                                   outcome once seen done, not timed
``remote``                         the RRef hook (``rrefs.hooks``: one hook for both) lets
                                   ``_time_remote`` time, of each function, the first
                                   ``REMOTE_TIMED_FIRST``, then one in ``REMOTE_SAMPLE`` (ended by the RRef's
                                   creation future, complete once the owner ran the function);
                                   the others only call through: the hook's record of the
                                   handle counts them, on the sender
``init_rpc`` (``OBSERVER``)        a ``join`` event when it starts (a rank stuck before it
                                   is named by the watchdog), the worker list when it ends
=================================  ==========================================================

Why not a done-callback on every rpc_async future: torch runs it on an RPC thread that takes
the GIL a second time for it (after unpickling the result), and that cost rank 0's RPC threads
~15-30 µs of CPU per call at 64 in flight (``benchmarks/telemetry_cost.py --threads``), a tenth
of a loopback call. A watched future is looked at instead, by the sender every cycle (and by the
caller's thread once ``HARVEST_AT`` are waiting: a sender that cannot keep up). The price: a
future the job has dropped stays alive (with its value) until it is seen done, one sender cycle
(0.1 s) later at most while the sender keeps up.

The sender's side (callee view, counting, listing long calls): ``call_summary``.

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
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rpcctl.base.states import CallState
from rpcctl.wire.protocol import MAX_QUEUE
from rpcctl.rank.call_state import HELPED as _HELPED
from rpcctl.rank.call_state import STATE
from rpcctl.rank.observer import Observer, TorchRpc
from rpcctl.rank.rrefs import hooks
from rpcctl.rank.rrefs.hooks import caller as _caller

# The first calls of a function are timed, then one in SAMPLE: a timed
# rpc.remote (its creation future and a done-callback on it) cost the job ~70 µs of CPU here, a
# timed rpc_async ~20 µs, on torch's RPC threads and in the GIL they take for the callback; every
# call is counted either way (benchmarks/telemetry_cost.py --threads, benchmarks/launch_cost.py).
REMOTE_TIMED_FIRST, REMOTE_SAMPLE = 100, 64  # the others are counted from the RRef hook's records
# An untimed rpc_sync costs the caller ~2.2 µs and the sender ~0.4 µs, a timed one ~4.3 and ~2.7
# (micro-benchmarks, warm; the CPU of a loopback call is ~300 µs: benchmarks/launch_cost.py).
SYNC_TIMED_FIRST, SYNC_SAMPLE = 100, 16  # the others are counted (``_untimed``)
MAX_FUNCS_SAMPLED = 10_000  # functions with a schedule of their own (rpc_sync, rpc_async)
ASYNC_TIMED_FIRST, ASYNC_SAMPLE = 100, 64  # the others are watched (``_watched``)
HARVEST_AT = 1024  # watched rpc_async calls waiting: the caller's thread then counts those done itself
LONG_S = 1.0  # calls (and served functions) running this long are listed one by one
MAX_LISTED = 100_000  # per process: beyond this, long calls are only counted
OK, ERROR, TIMEOUT = CallState.OK, CallState.ERROR, CallState.TIMEOUT  # bound once: the hooks are hot
KINDS = ("rpc_sync", "rpc_async", "remote")
MAX_ARGS_LOOKED_AT = 8  # request bytes: the tensors among this many positional arguments
_Tensor: Any = ()  # torch.Tensor once installed (isinstance against () is always False)

_q: Any = None  # the reporter's queue while telemetry is active; None: the hooks only call through
_time = time.time
_get_ident = threading.get_ident
# The tables the hooks keep for the sender: ``STATE``'s (``call_state``), bound here as module
# globals, which the hot path reads for less than an object's attributes.
_pending, _done, _watched, _seen_done = STATE.pending, STATE.done, STATE.watched, STATE.seen_done
_untimed, _in_flight, _listed_sync, _listed_ends = STATE.untimed, STATE.in_flight, STATE.listed_sync, STATE.listed_ends
_getframe = sys._getframe
# torch._C.Future's own done() and value() once prepared: torch.futures.Future wraps each in a
# Python method, a frame more per watched call on the sender.
_future_done: Any = lambda fut: fut.done()  # noqa: E731
_future_value: Any = lambda fut: fut.value()  # noqa: E731
_skip_codes = hooks.skip_codes  # id(code) → (code, in torch's rpc or rpcctl's?), shared with the RRef hooks
_serving_now = STATE.serving_now
_sender_tid = 0  # the telemetry thread: its own calls (RRef descriptions) are not the job's
_local_invokes: tuple[Any, ...] = ()  # rref_proxy's functions behind rref.rpc_sync().method()
_dropped = 0
_remote_schedules: dict[Any, Iterator[bool]] = {}  # rpc.remote: function → whether its next calls are timed
# Functions called with the method they run (``_proxy_method``): their calls are sampled per
# (function, method), as the calls view counts them; one set lookup per call to know it.
_helpers: set[Any] = set()


class Call:
    __slots__ = (
        "kind",
        "to",
        "func",
        "args",
        "code",
        "lasti",
        "tid",
        "t0",
        "t1",
        "status",
        "listed",
        "counted",
        "nbytes",
        "timed",
    )

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


def _end(call: Call) -> None:
    call.t1 = _time()
    _pending.pop(id(call), None)
    if len(_done) < MAX_QUEUE:
        _done.append(call)
    else:
        _drop()


def _drop() -> None:
    global _dropped
    _dropped += 1


def _start(kind: str, to: Any, func: Any, args: Any) -> Call | None:
    tid = _get_ident()
    if tid == _sender_tid:
        return None
    call = Call()
    call.kind, call.to, call.func, call.tid, call.listed, call.counted, call.timed = kind, to, func, tid, 0, True, True
    call.args = _proxy_method(func, args)
    # 3: this function, the hook, the hook's caller (or rpcctl's frames, walked past)
    call.code, call.lasti = _caller(3)
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
        _future_value(fut)
    except BaseException as exc:  # noqa: BLE001 - an RPC error of any type ends the call
        return _failure(exc)
    return OK


def _watch_behind(watched: tuple[Any, ...]) -> None:
    """A call to watch while ``HARVEST_AT`` wait already: those done are counted first."""
    _harvest_done()
    if len(_watched) < MAX_QUEUE:
        _watched.append(watched)
    else:  # the sender is far behind: the call goes unrecorded rather than the list unbounded
        _drop()


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


def _sent(call: Call, orig: Any, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> Any:
    """``orig``'s result for a timed call; one that raised is ended with its failure."""
    try:
        return orig(to, func, args, kwargs, timeout)
    except BaseException as exc:
        call.status = _failure(exc)
        _end(call)
        raise


def wrap_rpc_sync(orig: Any, unset_timeout: float) -> Any:
    """rpc_sync: of each function, the first ``SYNC_TIMED_FIRST`` calls, then one in
    ``SYNC_SAMPLE``, are timed (a ``Call``); the others run in ``_untimed_sync``: counted once
    over, and listed by the sender from ``_in_flight`` if they run long. Per function, so a
    function called now and then keeps its latencies beside a hot one."""
    schedules: dict[Any, Iterator[bool]] = {}  # function → whether its next calls are timed

    @functools.wraps(orig)
    def rpc_sync(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        if _q is None:
            return orig(to, func, args, kwargs, timeout)
        try:  # a helper's schedule is its method's (``_helpers``)
            timed = next(schedules[(func, _proxy_method(func, args)) if func in _helpers else func])
        except KeyError:
            timed = _first_call(schedules, func, args, SYNC_TIMED_FIRST, SYNC_SAMPLE)
        except TypeError:  # an unhashable callable: timed
            timed = True
        if not timed:
            tid = _get_ident()
            if tid != _sender_tid:
                return _untimed_sync(orig, tid, to, func, args, kwargs, timeout)
        call = _start("rpc_sync", to, func, args)
        if call is None:
            return orig(to, func, args, kwargs, timeout)
        try:  # inline, not _sent: a Python call less per call
            result = orig(to, func, args, kwargs, timeout)
        except BaseException as exc:
            call.status = _failure(exc)
            _end(call)
            raise
        call.status = OK
        _end(call)
        return result

    rpc_sync._rpcctl_calls = True  # type: ignore[attr-defined]
    return rpc_sync


def _schedule(first: int, every: int) -> Iterator[bool]:
    """Whether each call of a function is timed, in turn: the first ``first``, then one in
    ``every`` (a C iterator: one ``next`` per call, no arithmetic in Python)."""
    return itertools.chain(itertools.repeat(True, first), itertools.cycle((True,) + (False,) * (every - 1)))


def _first_call(schedules: dict[Any, Iterator[bool]], func: Any, args: Any, first: int, every: int) -> bool:
    """A function's first call (timed): its schedule from the next call on. A helper given the
    method it runs (``_proxy_method``: the examples' ``_call_method(method, rref, ...)``, an RRef
    proxy's ``_local_invoke``) has one schedule per method, as the calls view has one row per
    method: a method called only through the helper after another's hot loop is timed as its own
    first calls, not one in SAMPLE of the helper's. Beyond ``MAX_FUNCS_SAMPLED`` schedules, every
    call of a new one is timed."""
    if len(schedules) < MAX_FUNCS_SAMPLED:
        method = _proxy_method(func, args)
        try:
            if method is not None:
                _helpers.add(func)
            schedules[(func, method) if func in _helpers else func] = _schedule(first - 1, every)
        except TypeError:  # an unhashable method: every call of it timed
            pass
    return True


def _untimed_sync(orig: Any, tid: int, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> Any:
    """An rpc_sync call not timed: in ``_in_flight`` while it runs (the sender lists it there if
    it runs for ``LONG_S``: ``Summariser._calling``, and ``_listed_sync`` then holds it), then
    counted when it returns (``_untimed``), or as a failure. Its call site is looked up here, on
    its own thread: another thread's frames are not walked (CPython 3.11's ``f_back`` of a frame
    of a running thread can crash: a callee's test did once, walking the caller's stacks)."""
    frame = _getframe(2)  # the hook's caller
    code = frame.f_code
    known = _skip_codes.get(id(code))
    lasti = frame.f_lasti if known is not None and known[0] is code and not known[1] else -1
    if lasti < 0:
        code, lasti = hooks.outside(frame)
    call = _in_flight[tid] = (to, func, args, _time(), code, lasti)
    try:
        result = orig(to, func, args, kwargs, timeout)
    except BaseException as exc:
        _in_flight.pop(tid, None)
        if _listed_sync:
            _end_listed(call, _failure(exc))
        _count_failure("rpc_sync", to, func, args, exc)
        raise
    _in_flight.pop(tid, None)
    if _listed_sync:
        _end_listed(call, OK)
    if len(_untimed) < MAX_QUEUE:
        _untimed.append(("rpc_sync", to, func, _proxy_method(func, args) if args else None))
    else:
        _drop()
    return result


def _end_listed(call: tuple[Any, ...], status: str) -> None:
    """The end of an untimed call the sender listed, for the sender."""
    listed = _listed_sync.pop(id(call), None)
    if listed is not None:
        _listed_ends.append((listed, status, _time()))


def wrap_run_function(orig: Any) -> Any:
    """torch's ``internal._run_function``, which its RPC threads call to run a Python function
    for another worker: the call is in ``_serving_now`` while it runs (~0.5 µs of the serving
    thread's CPU; torch's handler takes the function when init_rpc starts, after ``patch``)."""

    def _run_function(python_udf: Any) -> Any:
        if _q is None:
            return orig(python_udf)
        tid = _get_ident()
        outer = _serving_now.get(tid)  # a thread serves one call at a time; an outer one comes back
        _serving_now[tid] = (python_udf, _time())
        try:
            return orig(python_udf)
        finally:
            if outer is None:
                _serving_now.pop(tid, None)
            else:
                _serving_now[tid] = outer

    _run_function._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return _run_function


def wrap_rpc_async(orig: Any, unset_timeout: float) -> Any:
    """rpc_async: of each function, the first ``ASYNC_TIMED_FIRST`` calls, then one in
    ``ASYNC_SAMPLE``, are timed (``_timed_async``); the others' futures are kept in ``_watched``
    until seen done, so they are counted with their outcome, listed if long, but not timed."""
    schedules: dict[Any, Iterator[bool]] = {}  # function → whether its next calls are timed

    @functools.wraps(orig)
    def rpc_async(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        if _q is None:
            return orig(to, func, args, kwargs, timeout)
        try:  # as in rpc_sync, inline: a helper's call would cost each call more than it saves
            timed = next(schedules[(func, _proxy_method(func, args)) if func in _helpers else func])
        except KeyError:
            timed = _first_call(schedules, func, args, ASYNC_TIMED_FIRST, ASYNC_SAMPLE)
        except TypeError:  # an unhashable callable: timed
            timed = True
        if timed:
            return _timed_async("rpc_async", _future, orig, to, func, args, kwargs, timeout)
        tid = _get_ident()
        if tid == _sender_tid:
            return orig(to, func, args, kwargs, timeout)
        # The call site, inline where the hook's caller is known to be the job's (as the RRef hook does)
        frame = _getframe(1)
        code = frame.f_code
        known = _skip_codes.get(id(code))
        if known is not None and known[0] is code and not known[1]:
            lasti = frame.f_lasti
        else:
            code, lasti = hooks.outside(frame)
        t0 = _time()
        try:  # inline, not in a helper: a Python call more per call shows in this loop
            result = orig(to, func, args, kwargs, timeout)
        except BaseException as exc:
            _count_failure("rpc_async", to, func, args, exc)
            raise
        if len(_watched) < HARVEST_AT:
            _watched.append((result, to, func, args, code, lasti, tid, t0))
        else:
            _watch_behind((result, to, func, args, code, lasti, tid, t0))
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


def _time_remote(orig: Any, to: Any, func: Any, args: Any, kwargs: Any, timeout: Any) -> Any:
    """The RRef hook's timer (``hooks.set_remote_timer``): one timed rpc.remote. The others the
    RRef hook's record of their handle counts, on the sender."""
    return _timed_async("remote", _creation_future, orig, to, func, args, kwargs, timeout)


def _remote_timed(func: Any, args: Any) -> bool:
    """The RRef hook's question: is this rpc.remote of ``func`` timed? Its schedule, as the
    rpc_async hook's: of each function (a helper's: of each method), the first
    ``REMOTE_TIMED_FIRST``, then one in ``REMOTE_SAMPLE``."""
    try:
        return next(_remote_schedules[(func, _proxy_method(func, args)) if func in _helpers else func])
    except KeyError:
        return _first_call(_remote_schedules, func, args, REMOTE_TIMED_FIRST, REMOTE_SAMPLE)
    except TypeError:  # an unhashable callable: timed
        return True


def _count_failure(kind: str, to: Any, func: Any, args: Any, exc: BaseException) -> None:
    """An untracked call that failed before it was sent (no future, no handle): counted here."""
    failed = _start(kind, to, func, args)
    if failed is not None:
        failed.status, failed.timed = _failure(exc), False  # its time is not the call's
        _end(failed)


def _future(fut: Any) -> Any:
    return fut


def _creation_future(rref: Any) -> Any:
    return rref._get_future()


def _set_sender(tid: int) -> None:
    global _sender_tid
    _sender_tid = tid


STATE.proxy_method, STATE.sent_bytes, STATE.failure, STATE.set_sender = (
    _proxy_method,
    _sent_bytes,
    _failure,
    _set_sender,
)


class CallsObserver(Observer):
    """The calls family, as ``patch`` and the reporter drive it."""

    name = "calls"

    def prepare(self, torch_rpc: TorchRpc) -> None:
        global _local_invokes, _Tensor, _future_done, _future_value
        _future_done, _future_value = torch_rpc.torch._C.Future.done, torch_rpc.torch._C.Future.value
        _Tensor = torch_rpc.torch.Tensor
        _local_invokes = (torch_rpc.rref_proxy._local_invoke, torch_rpc.rref_proxy._local_invoke_async_execution)
        STATE.future_done, STATE.future_value, STATE.local_invokes = _future_done, _future_value, _local_invokes
        _helpers.update(_local_invokes)  # rref.rpc_sync().method(): sampled per method

    def activate(self, queue: Any) -> None:
        global _q
        _q, STATE.active = queue, True
        # its part of the rpc.remote hook
        hooks.set_remote_timer(_time_remote, functools.partial(_count_failure, "remote"), _remote_timed)

    def deactivate(self) -> None:
        global _q
        _q, STATE.active = None, False
        hooks.set_remote_timer(None, None, None)

    def after_fork_in_child(self) -> None:
        """A forked child starts with nothing in flight and serves nothing."""
        global _q, _dropped, _sender_tid
        _q, STATE.active = None, False
        _dropped = 0
        _remote_schedules.clear()
        hooks.set_remote_timer(None, None, None)
        _sender_tid = 0
        _pending.clear()
        _done.clear()
        _watched.clear()
        _seen_done.clear()
        _untimed.clear()
        _in_flight.clear()
        _serving_now.clear()
        _listed_sync.clear()
        _listed_ends.clear()

    def dropped(self) -> int:
        return _dropped

    def rpc_starting(self) -> None:
        q = _q
        if q is not None:
            q.append({"e": "join", "t": _time()})

    def rpc_started(self, info: dict[str, Any]) -> None:
        STATE.workers = info["workers"]


OBSERVER = CallsObserver()
