"""RRef tracking inside a process: hooks on torch.distributed.rpc, and their off-path processing.

Torch keeps no list of RRefs (only counters), so rpcctl wraps what creates and moves them:

===========================================  =================================================
hook                                         what it records (hot path: one tuple appended)
===========================================  =================================================
``rpc.remote`` / ``rpc.api.remote``          a weakref to the new UserRRef, ``to``, ``func``
                                             and the call site (the call itself is untouched)
``rpc.RRef.__init__``                        a weakref to a local OwnerRRef (value on hand)
``_InternalRPCPickler._py_rref_receiver``    a weakref to a fork this process received
``rpc.init_rpc``                             who we are (name, rank, worker list, device
                                             maps); a spawned child joins telemetry here
``rpc.shutdown``                             when shutdown began (RRefs live then: leaks)
===========================================  =================================================

Deleting a handle fires its weakref callback (one more tuple). Everything else runs on the
worker's sender thread (``Tracker.process``), after ``MIN_AGE_S``: RRefs gone by then are only
counted per call site (``churn``); the others get their ids (``str(rref)``), owner and call
site resolved, and — once the owner confirmed them — a batched ``rpc_async`` per owner asks
the owner to describe the values (``_describe_on_owner``: type, shape, dtype, device, bytes;
it also watches each value, to see it freed). At most ``DESCRIBE_PER_CYCLE`` RRefs per owner
per cycle: a burst of long-lived RRefs is described over the following cycles. So a
short-lived RRef costs its creator a tuple and a dictionary lookup, and its owner nothing.

The wrappers must be installed before ``init_rpc``: torch's RPC handler captures
``api.remote`` then, for ``rref.remote()`` proxies. Never called here: ``rref._get_type()``
(caches a Future and breaks later proxy calls) and ``rref._serialize()`` (registers a fork).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import sys
import time
import types
import weakref
import collections
from collections import Counter
from typing import Any

from rpcctl.telemetry.protocol import MAX_QUEUE, MIN_AGE_S

# The sender thread lets go of the GIL after every GIL_SLICE items (~0.15 ms of work). Without
# it, a cycle with thousands of events (a round of RRefs released at once) holds the GIL for
# 10+ ms, and every RPC thread that needs it waits a full switch interval (5 ms) or more:
# benchmarks/tracking_overhead.py --gil measures those stalls (64/50 µs: waits p50 ~0.13 ms;
# 128/100 µs: ~0.25 ms for the same CPU; 32: more CPU for little gain).
GIL_SLICE = 64
PAUSE_S = 0.00005  # a real sleep: time.sleep(0) may take the GIL straight back


def pause() -> None:
    time.sleep(PAUSE_S)


def in_slices(items: Any, every: int | None = None) -> Any:
    """``items``, one by one, letting go of the GIL after every ``every`` (GIL_SLICE) of them."""
    every = every or GIL_SLICE
    for index, item in enumerate(items):
        if index and not index % every:
            pause()
        yield item


DESCRIBE_PER_CYCLE = 16  # RRefs per owner per sender cycle (0.1 s): at most 160/s per owner
DESCRIBE_BACKLOG = 10_000  # beyond this, RRefs stay undescribed

# The active worker's queue (a deque), or None: the hooks then only call through.
_q: Any = None
_dropped = 0
_installed = False
_time = time.time
_weakref = weakref.ref
_getframe = sys._getframe
_PLAIN = (types.FunctionType, types.MethodType, type)  # callees whose type is hashable and known
_skip_dirs: tuple[str, ...] = ()
_skip_codes: dict[Any, bool] = {}
_proxy_calls: tuple[Any, ...] = ()  # rref_proxy's _local_invoke functions: rref.remote().method()
_shutting_down = False


def dropped() -> int:
    return _dropped


def _drop() -> None:
    global _dropped
    _dropped += 1


# ---------------------------------------------------------------------------------------------
# Hot path (the user's threads and torch's RPC threads)


class _Ref(weakref.ref):
    """A weak reference to an RRef handle that carries what the hook saw: one object per event
    (a tuple beside it would double the garbage-collected allocations on the hot path, and
    trigger collections a plain torch RPC loop never does). Queued when the handle is made, and
    queued again, by its callback, when the handle dies."""

    __slots__ = ("kind", "to", "func", "target", "code", "lasti", "data", "t", "released", "seen")


def _released(ref: _Ref) -> None:
    q = _q
    if q is not None:
        ref.released = _time()
        q.append(ref)


def _value_freed(wr: weakref.ref) -> None:
    q = _q
    if q is not None:
        q.append(("vx", wr, _time()))


def _caller() -> tuple[Any, int]:
    """The user's frame that called the hook: (code, f_lasti); the line is resolved later
    (``f_lineno`` costs twice as much as ``f_lasti`` here)."""
    frame = _getframe(2)
    while frame is not None:
        code = frame.f_code
        skip = _skip_codes.get(code)
        if skip is None:
            skip = _skip_codes[code] = code.co_filename.startswith(_skip_dirs)
        if not skip:
            return code, frame.f_lasti
        frame = frame.f_back
    return None, 0


def _wrap_remote(orig: Any, unset_timeout: float) -> Any:
    @functools.wraps(orig)
    def remote(to, func, args=None, kwargs=None, timeout=unset_timeout):  # noqa: ANN001 - torch's signature
        rref = orig(to, func, args, kwargs, timeout)
        q = _q
        if q is not None:
            if len(q) < MAX_QUEUE:
                ref = _Ref(rref, _released)
                ref.kind, ref.to, ref.func, ref.t, ref.seen = "r", to, func, _time(), 0
                ref.code, ref.lasti = _caller()
                # rref.remote().method(): remember the target RRef (weakly) and the method name
                ref.target = (_weakref(args[0]), args[1]) if func in _proxy_calls and args and len(args) > 1 else None
                q.append(ref)
            else:
                _drop()
        return rref

    remote._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return remote


def _wrap_rref_init(orig: Any) -> Any:
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        orig(self, *args, **kwargs)
        q = _q
        if q is not None:
            if len(q) < MAX_QUEUE:
                ref = _Ref(self, _released)
                ref.kind, ref.t, ref.seen = "l", _time(), 0
                ref.code, ref.lasti = _caller()
                q.append(ref)
            else:
                _drop()

    __init__._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return __init__


def _wrap_receiver(orig: Any) -> Any:
    def _py_rref_receiver(cls: Any, rref_fork_data: Any) -> Any:
        rref = orig(cls, rref_fork_data)
        q = _q
        if q is not None and not rref.is_owner():  # the owner getting its own RRef back is no fork
            if len(q) < MAX_QUEUE:
                ref = _Ref(rref, _released)
                ref.kind, ref.data, ref.t, ref.seen = "f", rref_fork_data, _time(), 0
                q.append(ref)
            else:
                _drop()
        return rref

    # Pickle sends the receiver by name: ours must answer to the original's.
    _py_rref_receiver.__qualname__ = "_InternalRPCPickler._py_rref_receiver"
    _py_rref_receiver._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return _py_rref_receiver


def _wrap_init_rpc(orig: Any) -> Any:
    @functools.wraps(orig)
    def init_rpc(*args: Any, **kwargs: Any) -> Any:
        from rpcctl.telemetry import worker

        worker.joining()  # a spawned child shows up now, even if rendezvous then hangs
        result = orig(*args, **kwargs)
        try:
            options = kwargs.get("rpc_backend_options", args[4] if len(args) > 4 else None)
            worker.post(_rpc_info(options))
        except Exception:
            pass
        return result

    init_rpc._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return init_rpc


def _wrap_shutdown(orig: Any) -> Any:
    @functools.wraps(orig)
    def shutdown(*args: Any, **kwargs: Any) -> Any:
        global _shutting_down
        _shutting_down = True  # no more describe calls from the sender thread
        q = _q
        if q is not None:
            q.append({"e": "shutdown", "t": _time()})
        return orig(*args, **kwargs)

    shutdown._rpcctl_wrapped = True  # type: ignore[attr-defined]
    return shutdown


def install() -> bool:
    """Wrap torch.distributed.rpc in this process (idempotent). False where RPC is unavailable."""
    global _installed, _skip_dirs, _proxy_calls
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

    # `import torch` above may have run the sitecustomize import hook, which installs too.
    if _installed or getattr(api.remote, "_rpcctl_wrapped", False):
        _installed = True
        return True

    _skip_dirs = (os.path.dirname(rpc.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep)
    _proxy_calls = (rref_proxy._local_invoke, rref_proxy._local_invoke_async_execution)

    remote = _wrap_remote(api.remote, UNSET_RPC_TIMEOUT)
    api.remote = remote
    rpc.remote = remote
    shutdown = _wrap_shutdown(api.shutdown)
    api.shutdown = shutdown
    rpc.shutdown = shutdown
    rpc.init_rpc = _wrap_init_rpc(rpc.init_rpc)
    api.RRef.__init__ = _wrap_rref_init(api.RRef.__init__)
    pickler = internal._InternalRPCPickler
    pickler._py_rref_receiver = classmethod(_wrap_receiver(pickler.__dict__["_py_rref_receiver"].__func__))
    _installed = True
    return True


def _rpc_info(options: Any) -> dict[str, Any]:
    import torch.distributed.rpc as rpc

    me = rpc.get_worker_info()
    workers = {}
    try:
        workers = {info.id: info.name for info in rpc.api._get_current_rpc_agent().get_worker_infos()}
    except Exception:
        pass
    device_maps = devices = None
    if options is not None:
        device_maps = {str(k): {str(a): str(b) for a, b in v.items()} for k, v in (getattr(options, "device_maps", None) or {}).items()}
        devices = [str(d) for d in (getattr(options, "devices", None) or [])]
    world_size = len(workers) or None
    _tracker.set_identity(me.name, me.id, workers)
    return {"e": "rpc", "name": me.name, "rpc_rank": me.id, "world_size": world_size, "workers": workers,
            "device_maps": device_maps, "devices": devices, "t": _time()}


def activate(queue: Any) -> None:
    global _q
    _q = queue


def deactivate() -> None:
    global _q
    _q = None


def after_fork_in_child() -> None:
    """A forked child starts with no queue and no state."""
    global _q, _dropped, _tracker, _shutting_down
    _q = None
    _dropped = 0
    _shutting_down = False
    _tracker = Tracker()


def _describe_on_owner(rrefs: list[Any]) -> None:
    """Runs on the owner (one batched rpc_async from a creator's sender thread): describe each
    value, and watch it so that its release is seen. Reports through the owner's own channel."""
    q = _q
    if q is None:
        return
    now = _time()
    for rref in rrefs:
        try:
            ids = _ID.findall(str(rref))
            rref_id = f"{ids[0][0]}:{ids[0][1]}"
            value = rref.local_value()
        except Exception:
            continue
        q.append({"e": "desc", "id": rref_id, "value": describe(value), "t": now})
        try:
            q.append(("vw", _weakref(value, _value_freed), rref_id))
        except TypeError:
            pass
        del value


# ---------------------------------------------------------------------------------------------
# Describing values (sender thread; or inline for values that cannot be weak-referenced)

_SCAN_LIMIT = 256


def describe(value: Any) -> dict[str, Any]:
    """type, shape, dtype, device and nbytes of a value: exact for a tensor, summed over the
    tensors found one level deep otherwise (modules: parameters and buffers)."""
    out: dict[str, Any] = {"type": type(value).__name__}
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    try:
        if isinstance(value, torch.Tensor):
            out.update(shape=list(value.shape), dtype=_dtype(value.dtype), device=str(value.device), nbytes=_nbytes(value))
            return out
        tensors = list(itertools.islice(_tensors_in(value, torch), 10_000))
    except Exception:
        return out
    if tensors:
        out["nbytes"] = sum(_nbytes(t) for t in tensors)
        devices = {str(t.device) for t in tensors}
        dtypes = {_dtype(t.dtype) for t in tensors}
        out["device"] = devices.pop() if len(devices) == 1 else "mixed"
        out["dtype"] = dtypes.pop() if len(dtypes) == 1 else "mixed"
    return out


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


# ---------------------------------------------------------------------------------------------
# Off the hot path: the sender thread turns the hooks' tuples into protocol events

_ID = re.compile(r"GloballyUniqueId\(created_on=(\d+), local_id=(\d+)\)")


class Tracker:
    """Per-process state of what was reported. Used only by the sender thread."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.rank: int | None = None
        self.workers: dict[int, str] = {}
        self.ranks_by_name: dict[str, int] = {}
        self.sent: dict[int, tuple[weakref.ref, str, str]] = {}  # id(weakref) → (weakref, rref id, fork id)
        self.unconfirmed: dict[int, tuple[weakref.ref, str, str | None]] = {}  # … (weakref, rref id, owner)
        self.values: dict[int, tuple[weakref.ref, str]] = {}  # id(weakref of a value we own) → (weakref, rref id)
        self.to_describe: dict[str, collections.deque[weakref.ref]] = {}  # owner → confirmed RRefs to describe
        self.deferred: list[tuple[Any, ...]] = []
        self.churn: Counter[tuple[str, str, str]] = Counter()
        self.sites: dict[tuple[Any, int], str] = {}
        self.meta: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.pending_events: list[dict[str, Any]] = []  # made while handling another event
        self.described: set[str] = set()  # forks whose description this process asked for

    def set_identity(self, name: str, rank: int, workers: dict[int, str]) -> None:
        self.name, self.rank = name, rank
        self.workers = dict(workers)
        self.ranks_by_name = {v: k for k, v in workers.items()}

    def live_handles(self) -> int:
        return len(self.sent)

    def process(self, items: list[Any], now: float, final: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        todo, self.deferred = self.deferred + items, []
        for item in in_slices(todo):
            kind = type(item)
            try:
                if kind is _Ref:
                    seen = item.seen
                    if seen == 0:  # a new handle: report it if it outlived MIN_AGE_S
                        if not final and now - item.t < MIN_AGE_S and item() is not None:
                            self.deferred.append(item)
                            continue
                        event = self._created(item)
                    elif seen == 1 and item() is None:  # a reported handle died
                        event = self._dropped(item, now)
                    else:
                        continue
                elif kind is dict:
                    event = item
                else:
                    event = getattr(self, "_" + item[0])(*item[1:])
            except Exception:
                event = None  # a torch object that misbehaves must not stop the sender
            if event is not None:
                out.append(event)
            if self.pending_events:
                out.extend(self.pending_events)
                self.pending_events.clear()
        for key, (wr, rref_id, owner) in in_slices(list(self.unconfirmed.items())):
            rref = wr()
            if rref is None:
                del self.unconfirmed[key]
            elif rref.confirmed_by_owner():
                del self.unconfirmed[key]
                out.append({"e": "conf", "id": rref_id, "t": now})
                self._describe(rref, owner, rref_id, out, now)
            del rref
        self._send_describes(final)
        if self.churn:
            for (owner, callee, site), n in self.churn.items():
                out.append({"e": "churn", "owner": owner, "callee": callee, "site": site, "n": n, "t": now})
            self.churn.clear()
        return out

    # -- handles (``_Ref``) and tuples (``vw``, ``vx``) --------------------------------------------
    def _created(self, ref: _Ref) -> dict | None:
        event = {"r": self._r, "l": self._l, "f": self._f}[ref.kind](ref)
        ref.seen = 1 if event is not None else 2
        return event

    def _dropped(self, ref: _Ref, now: float) -> dict | None:
        ref.seen = 3
        entry = self.sent.pop(id(ref), None)
        self.unconfirmed.pop(id(ref), None)
        if entry is None:
            return None
        return {"e": "rel", "id": entry[1], "fork": entry[2], "t": getattr(ref, "released", now)}

    def _r(self, ref: _Ref) -> dict | None:
        to, func, target, t = ref.to, ref.func, ref.target, ref.t
        method = target[1] if target else None
        key = (to, func, method, ref.code, ref.lasti) if type(to) is str and type(func) in _PLAIN else None
        meta = self.meta.get(key) if key is not None else None
        if meta is None:
            owner_rank, owner = self._owner(to)
            meta = (owner_rank, owner, f"?.{method}" if method else _qualname(func), self._site(ref.code, ref.lasti))
            if key is not None and len(self.meta) < 10_000:
                self.meta[key] = meta
        owner_rank, owner, callee, site = meta
        rref = ref()
        if rref is None:
            self.churn[(owner or "?", callee, site)] += 1
            return None
        if target is not None:  # name the method after the RRef it was called on: "rref(0:3).value"
            on = target[0]()
            if on is not None:
                ids = _ID.findall(str(on))
                callee = f"rref({ids[0][0]}:{ids[0][1]}).{method}" if ids else callee
            del on
        ids = _ID.findall(str(rref))
        confirmed = rref.confirmed_by_owner()
        rref_id = f"{ids[0][0]}:{ids[0][1]}"
        fork_id = f"{ids[1][0]}:{ids[1][1]}" if len(ids) > 1 else ""
        self.sent[id(ref)] = (ref, rref_id, fork_id)
        event = {"e": "rref", "id": rref_id, "fork": fork_id, "owner": owner, "owner_rank": owner_rank, "kind": "remote",
                 "callee": callee, "site": site, "confirmed": confirmed, "t": t}
        if confirmed:
            self._describe(rref, owner, rref_id, None, t)
        else:
            self.unconfirmed[id(ref)] = (ref, rref_id, owner)
        del rref
        return event

    def _describe(self, rref: Any, owner: str | None, rref_id: str, out: list | None, t: float) -> None:
        """Describe a confirmed RRef's value: here if we own it, else batched to its owner."""
        if rref.is_owner():
            value = rref.local_value()
            self._watch_value(value, rref_id)
            event = {"e": "desc", "id": rref_id, "value": describe(value), "t": t}
            if out is not None:
                out.append(event)
            else:
                self.pending_events.append(event)
        elif owner is not None and not _shutting_down:
            backlog = self.to_describe.setdefault(owner, collections.deque())
            if len(backlog) < DESCRIBE_BACKLOG:
                backlog.append(_weakref(rref))

    def _send_describes(self, final: bool) -> None:
        """At most DESCRIBE_PER_CYCLE RRefs per owner per cycle, oldest first: passing an RRef
        to its owner costs torch a few messages, so a burst of long-lived RRefs is described
        over the next cycles instead of doubling the job's RPC traffic."""
        if final or _shutting_down or not self.to_describe:
            return
        import torch.distributed.rpc as rpc

        for owner, backlog in list(self.to_describe.items()):
            batch = []
            while backlog and len(batch) < DESCRIBE_PER_CYCLE:
                rref = backlog.popleft()()
                if rref is not None:
                    batch.append(rref)
            if not backlog:
                del self.to_describe[owner]
            if not batch:
                continue
            try:
                future = rpc.rpc_async(owner, _describe_on_owner, args=(batch,))
                future.add_done_callback(_ignore_result)
            except Exception:
                continue  # the agent is going away: these stay undescribed
            del batch

    def _watch_value(self, value: Any, rref_id: str) -> None:
        try:
            vwr = _weakref(value, _value_freed)
        except TypeError:
            return
        self.values[id(vwr)] = (vwr, rref_id)

    def _l(self, ref: _Ref) -> dict | None:
        t = ref.t
        site = self._site(ref.code, ref.lasti)
        rref = ref()
        if rref is None:
            self.churn[(self.name or "?", "RRef", site)] += 1
            return None
        ids = _ID.findall(str(rref))
        rref_id = f"{ids[0][0]}:{ids[0][1]}"
        value = rref.local_value()
        description = describe(value)
        self.sent[id(ref)] = (ref, rref_id, "")
        self._watch_value(value, rref_id)
        del rref, value
        return {"e": "rref", "id": rref_id, "fork": "", "owner": self.name, "owner_rank": self.rank, "kind": "local",
                "callee": None, "site": site, "confirmed": True, "value": description, "t": t}

    def _f(self, ref: _Ref) -> dict | None:
        data, t = ref.data, ref.t
        rref = ref()
        if rref is None:
            return None
        owner_rank, rref_on, rref_local, fork_on, fork_local = (int(x) for x in data[:5])
        rref_id, fork_id = f"{rref_on}:{rref_local}", f"{fork_on}:{fork_local}"
        self.sent[id(ref)] = (ref, rref_id, fork_id)
        type_name = data[6] if len(data) > 6 and isinstance(data[6], str) else None
        if type_name and "." in type_name:
            type_name = type_name.rsplit(".", 1)[1]
        # An RRef its owner made (rpc.RRef(value) there) and handed out: its creator never
        # reports it, so the first holder asks for the description. Its value exists already;
        # an RRef rpc.remote() made is described by its creator, once the owner confirmed it.
        if rref_on == owner_rank and rref_id not in self.described and len(self.described) < 100_000:
            self.described.add(rref_id)
            self._describe(rref, self.workers.get(owner_rank), rref_id, None, t)
        del rref
        return {"e": "fork", "id": rref_id, "fork": fork_id, "owner_rank": owner_rank,
                "type": None if type_name == "PyObject" else type_name, "t": t}

    def _vw(self, wr: weakref.ref, rref_id: str) -> None:
        if wr() is not None:
            self.values[id(wr)] = (wr, rref_id)

    def _vx(self, wr: weakref.ref, t: float) -> dict | None:
        entry = self.values.pop(id(wr), None)
        if entry is None or entry[0] is not wr:
            return None
        return {"e": "vfree", "id": entry[1], "t": t}

    # -- helpers ---------------------------------------------------------------------------------
    def _owner(self, to: Any) -> tuple[int | None, str | None]:
        if isinstance(to, str):
            return self.ranks_by_name.get(to), to
        if isinstance(to, int):
            return to, self.workers.get(to)
        rank, name = getattr(to, "id", None), getattr(to, "name", None)
        return rank, name

    def _site(self, code: Any, lasti: int) -> str:
        if code is None:
            return "?"
        key = (code, lasti)
        site = self.sites.get(key)
        if site is None:
            line = next((ln for start, end, ln in code.co_lines() if start <= lasti < end and ln is not None), code.co_firstlineno)
            site = f"{_short_path(code.co_filename)}:{line} in {code.co_name}"
            if len(self.sites) < 10_000:
                self.sites[key] = site
        return site


_tracker = Tracker()


def tracker() -> Tracker:
    return _tracker


def _ignore_result(future: Any) -> None:
    try:
        future.wait()
    except Exception:
        pass  # the owner went away, or shut down: nothing to describe


def _qualname(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if name is None:
        return type(func).__name__
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module and module not in ("__main__", "__mp_main__", "builtins") else name


def _short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path
