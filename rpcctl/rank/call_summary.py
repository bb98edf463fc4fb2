"""RPC call tracking, the sender thread's side: ended calls become counts, long ones are listed,
and what this process runs for others is looked at (the hooks' side, the hot path: ``calls``).

The callee's side: the hook on torch's ``internal._run_function`` (what runs a Python function
for an incoming call) keeps each call in ``serving_now`` while it runs, and the sender
lists one running for ``LONG_S`` with its function, from when it started. The caller's untimed
rpc_sync calls in flight likewise (``in_flight``). All the sender reads of the hooks' is one
object, ``call_state.STATE``, handed to the ``Summariser``. No thread's stack is walked from
another: CPython 3.11's ``f_back`` on a frame of a running thread can crash the process (a
sampling thread's known hazard; it crashed a callee here once, in a CI run).

Everything else happens on the telemetry sender thread (``Summariser.process``, every 0.1 s):
ended calls, and the ``rpc.remote`` handles the RRef hook queued, are counted per (callee,
function, kind) into a log-scale histogram (``cstat`` events: count, errors, timeouts, durations),
so a fast call costs one small object and no event of its own. Only calls running for at least
``LONG_S`` are listed one by one (``call`` when seen, ``cend`` when over), and only functions
served for that long (``srv`` / ``send``), with the caller's thread, so the watchdog can tie a
waiting thread to what it waits on.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from rpcctl.rank import calls
from rpcctl.rank.call_state import STATE, CallsState
from rpcctl.rank.rrefs import hooks
from rpcctl.rank.rrefs.hooks import Ref
from rpcctl.rank.rrefs.sender import Tracker, qualname
from rpcctl.wire.histogram import bucket
from rpcctl.wire.protocol import MAX_QUEUE

MAX_KEYS = 10_000  # (kind, callee, function) resolved to a stats key, remembered
_UNKNOWN = object()
OK = calls.OK


class Summariser:
    """Per-process state of the call reports. Used only by the sender thread."""

    def __init__(self, state: CallsState = STATE) -> None:
        self.state = state  # what the hooks keep for the sender: all this reads of theirs
        self.names: dict[Any, str] = {}
        self.sites: dict[tuple[Any, int], str] = {}
        self.stats: dict[tuple[str, str, str], list[Any]] = {}  # (callee, func, kind) → [n, err, tmo, sum, max, hist]
        self.listed = 0
        # thread → [what it serves (self.state.serving_now), start, id or 0] (``_carried``)
        self.running: dict[int, list[Any]] = {}
        self.watching: list[Ref] = []  # rpc.remote handles alive when first seen
        self.remote_listed: dict[int, int] = {}  # id(handle record) → call id, for those listed
        self.watched_listed: dict[int, int] = {}  # id(watched rpc_async) → call id, for those listed
        # thread → [its untimed rpc_sync (self.state.in_flight), start, id or 0]
        self.calling: dict[int, list[Any]] = {}
        self.untimed_listed: dict[int, tuple[Any, float]] = {}  # call id → (stats key, start) of a listed untimed call
        self.next_id = 1
        # (kind, to, func, method or None) → its stats key, None for torch's own calls: a call's
        # names resolved once, not per call (the sender's cost per call, benchmarks/launch_cost.py).
        # Only where ``method`` is None or a str: a function there would be kept alive here.
        self.keys: dict[tuple[Any, ...], tuple[str, str, str] | None] = {}
        self.keys_workers: dict[int, str] = self.state.workers  # the worker names the keys were resolved with

    def process(self, now: float, final: bool = False, items: list[Any] = ()) -> list[dict[str, Any]]:
        """This cycle's reports; ``items``: what the hooks queued this cycle (the RRef
        tracker's), whose ``rpc.remote`` handles count those calls."""
        self.state.sender_is(threading.get_ident())
        out: list[dict[str, Any]] = []
        if self.state.active:
            self.remotes(items)
        if self.state.watched or self.state.seen_done:
            self._harvest(now, out)
        if self.state.untimed:
            self._count_untimed()
        for _ in range(len(self.state.done)):
            call = self.state.done.popleft()
            self._ended(call, out)
        for call in list(self.state.pending.values()):
            if not call.listed and now - call.t0 >= calls.LONG_S and id(call) in self.state.pending:
                self._list(call, out)
        self._watch_remotes(now, out)
        self._calling(now, out)  # before the counts go out: a long call's end sets their longest
        for (callee, func, kind), (n, err, tmo, total, longest, hist, sent) in self.stats.items():
            out.append(
                {
                    "e": "cstat",
                    "callee": callee,
                    "func": func,
                    "kind": kind,
                    "n": n,
                    "err": err,
                    "tmo": tmo,
                    "sum": total,
                    "max": longest,
                    "h": {str(k): v for k, v in hist.items()},
                    "bytes": sent,
                    "t": now,
                }
            )
        self.stats.clear()
        self._serving(now, out)
        return out

    def remotes(self, items: list[Any]) -> None:
        """Count every ``rpc.remote`` call from its handle's record (``hooks.Ref``, kind "r"),
        and watch the handles still alive: one whose creation is still pending after LONG_S is
        listed like a long call (``_watch_remotes``). Plain calls are tallied by (callee,
        function) and resolved once per cycle (most handles: the sender's cost per call)."""
        tally: dict[tuple[Any, Any], int] = {}
        alive: list[tuple[tuple[str, str, str] | None, Ref]] = []
        for item in items:
            if type(item) is not Ref or item.kind != "r":
                continue
            key: Any = _UNKNOWN
            if item.target is None:
                raw = (item.to, item.func)
                try:
                    tally[raw] = tally.get(raw, 0) + 1
                except TypeError:  # an unhashable callee or function
                    key = self._key("remote", item.to, item.func, None)
                    if key is not None:
                        self._entry(key)[0] += 1
            else:  # rref.remote().method()
                key = self._resolve_name("remote", item.to, self._ref_name(item))
                if key is not None:
                    self._entry(key)[0] += 1
            if item() is not None:
                alive.append((key, item))
        self._add_tally("remote", tally)
        watching = self.watching
        for key, item in alive:
            if key is _UNKNOWN:
                key = self._key("remote", item.to, item.func, None)
            if key is not None and len(watching) < MAX_QUEUE:
                watching.append(item)

    def _count_untimed(self) -> None:
        """The untimed calls that returned: each (kind, to, func, method) is its own raw key."""
        untimed, keys, stats = self.state.untimed, self._keys(), self.stats
        for _ in range(len(untimed)):
            item = untimed.popleft()
            try:
                key = keys.get(item, _UNKNOWN)
            except TypeError:  # an unhashable callee or function
                key = _UNKNOWN
            if key is _UNKNOWN:
                key = self._key(*item)
            if key is None:  # torch's own
                continue
            entry = stats.get(key)
            if entry is None:
                entry = self._entry(key)
            entry[0] += 1

    def _watch_remotes(self, now: float, out: list[dict[str, Any]]) -> None:
        """The watched handles: over once gone, or (looked at once a second old: the future
        costs) once the owner created the value; listed while still pending."""
        still = []
        for ref in self.watching:
            rref = ref()
            if rref is not None and now - ref.t >= calls.LONG_S and rref._get_future().done():
                rref = None
            if rref is None:
                listed = self.remote_listed.pop(id(ref), None)
                if listed is not None:
                    out.append({"e": "cend", "id": listed, "status": calls.OK, "t": now})
                continue
            del rref
            still.append(ref)
            if now - ref.t >= calls.LONG_S and id(ref) not in self.remote_listed and self.listed < calls.MAX_LISTED:
                self.remote_listed[id(ref)] = self._listed(
                    out,
                    "call",
                    kind="remote",
                    callee=self._callee(ref.to),
                    func=self._ref_name(ref),
                    site=self._site(ref.code, ref.lasti),
                    thread=ref.tid,
                    t=ref.t,
                )
        self.watching = still

    def _entry(self, key: tuple[str, str, str]) -> list[Any]:
        """This cycle's counts of (callee, func, kind): [n, err, tmo, sum, max, hist, bytes]."""
        entry = self.stats.get(key)
        if entry is None:
            entry = self.stats[key] = [0, 0, 0, 0.0, 0.0, {}, 0]
        return entry

    def _harvest(self, now: float, out: list[dict[str, Any]]) -> None:
        """The watched rpc_async calls: counted with their outcome once done, listed once running
        for LONG_S (ended when seen done, so their end is known within a cycle). A plain call
        that ended well (no method in its arguments, not listed, short) is tallied by (callee,
        function) and resolved once per cycle: the sender's cost per call (launch_cost.py async)."""
        watched_q, done, value, helped_types, invokes = (
            self.state.watched,
            self.state.future_done,
            self.state.future_value,
            self.state.HELPED,
            self.state.local_invokes,
        )
        tally: dict[tuple[Any, Any], int] = {}
        long_s = calls.LONG_S
        for _ in range(len(watched_q)):
            try:
                watched = watched_q.popleft()
            except IndexError:  # the caller's thread took the last one
                break
            fut, to, func, args, _, _, _, t0 = watched
            if not done(fut):
                watched_q.append(watched)
                if now - t0 >= long_s and id(watched) not in self.watched_listed and self.listed < calls.MAX_LISTED:
                    self._list_watched(watched, out)
                continue
            try:  # calls._outcome, inline: a call less per watched call
                value(fut)
            except BaseException as exc:  # noqa: BLE001 - an RPC error of any type ends the call
                self._count_watched(watched, self.state.failure(exc), now, out)
                continue
            plain = not self.watched_listed and now - t0 < long_s
            if plain and args:
                try:
                    plain = func not in invokes and type(args[0]) not in helped_types
                except Exception:  # odd args (torch sends them as they are): the slow way
                    plain = False
            if plain:
                try:
                    tally[to, func] = tally.get((to, func), 0) + 1
                    continue
                except TypeError:  # an unhashable callee or function
                    pass
            self._count_watched(watched, OK, now, out)
        self._add_tally("rpc_async", tally)
        for _ in range(len(self.state.seen_done)):
            watched, status, seen = self.state.seen_done.popleft()
            self._count_watched(watched, status, seen, out)

    def _add_tally(self, kind: str, tally: dict[tuple[Any, Any], int]) -> None:
        """Calls of ``kind`` counted by (callee, function) this cycle: each pair named once."""
        for (to, func), n in tally.items():
            key = self._key(kind, to, func, None)
            if key is not None:
                self._entry(key)[0] += n

    def _list_watched(self, watched: tuple[Any, ...], out: list[dict[str, Any]]) -> None:
        _, to, func, args, code, lasti, tid, t0 = watched
        method = self.state.proxy_method(func, args)
        self.watched_listed[id(watched)] = self._listed(
            out,
            "call",
            kind="rpc_async",
            callee=self._callee(to),
            func=self._func_or_method(func, method),
            site=self._site(code, lasti),
            thread=tid,
            nbytes=self.state.sent_bytes(args, method),
            t=t0,
        )

    def _count_watched(self, watched: tuple[Any, ...], status: str, seen: float, out: list[dict[str, Any]]) -> None:
        if self.watched_listed:
            listed = self.watched_listed.pop(id(watched), None)
            if listed is not None:
                out.append({"e": "cend", "id": listed, "status": status, "t": seen})
        _, to, func, args, _, _, _, t0 = watched
        key = self._key("rpc_async", to, func, self.state.proxy_method(func, args) if args else None)
        if key is None:
            return
        entry = self.stats.get(key) or self._entry(key)
        entry[0] += 1
        if status is not OK:
            if status == calls.ERROR:
                entry[1] += 1
            elif status == calls.TIMEOUT:
                entry[2] += 1
        if seen - t0 >= calls.LONG_S:  # untimed, but the longest call is known within a cycle
            entry[4] = max(entry[4], seen - t0)

    def _ref_name(self, ref: Ref) -> str:
        target = ref.target
        if target is not None:  # rref.remote().method(): the caller knows the method, not the type
            return f"rref.{target[1]}"
        return self._func_name(ref.func)

    def _ended(self, call: calls.Call, out: list[dict[str, Any]]) -> None:
        if not call.timed:  # an untimed call that failed (``calls._count_failure``): counted, not timed
            self._count(call, None)
            return
        duration = max(0.0, call.t1 - call.t0)
        if not call.listed and duration >= calls.LONG_S:
            self._list(call, out)
        if call.listed:
            out.append({"e": "cend", "id": call.listed, "status": call.status, "t": call.t1})
        self._count(call, duration)

    def _count(self, call: calls.Call, duration: float | None) -> None:
        key = self._key(call.kind, call.to, call.func, call.args)
        if key is None:
            return
        entry = self._entry(key)
        if call.counted:
            entry[0] += 1
        if call.status == calls.ERROR:
            entry[1] += 1
        elif call.status == calls.TIMEOUT:
            entry[2] += 1
        if duration is None:
            return
        entry[3] += duration
        entry[4] = max(entry[4], duration)
        entry[6] += call.nbytes or 0  # over the timed calls, as the durations
        b = bucket(duration)
        entry[5][b] = entry[5].get(b, 0) + 1

    def _list(self, call: calls.Call, out: list[dict[str, Any]]) -> None:
        if self.listed >= calls.MAX_LISTED or not call.counted:  # a sampled remote: its handle is listed
            return
        call.listed = self._listed(
            out,
            "call",
            kind=call.kind,
            callee=self._callee(call.to),
            func=self._name(call),
            site=self._site(call.code, call.lasti),
            thread=call.tid,
            nbytes=call.nbytes,
            t=call.t0,
        )

    def _listed(self, out: list[dict[str, Any]], event: str, **fields: Any) -> int:
        """One call (or served call) listed: its event, under the next id, which it returns."""
        self.listed += 1
        listed, self.next_id = self.next_id, self.next_id + 1
        out.append({"e": event, "id": listed, **fields})
        return listed

    def _calling(self, now: float, out: list[dict[str, Any]]) -> None:
        """The untimed rpc_sync calls in flight (``self.state.in_flight``): one running for LONG_S is
        listed, from when it started, and handed to the hook (``self.state.listed_sync``), which tells
        its end; one gone before the hook saw it listed is ended here, as ok (a failure is counted
        all the same)."""
        self.calling, gone = _carried(self.calling, self.state.in_flight, 3)
        for tid, entry in self.calling.items():
            if not entry[2] and now - entry[1] >= calls.LONG_S and self.listed < calls.MAX_LISTED:
                self._list_untimed(tid, entry, out)
        for entry in gone:
            if self.state.listed_sync.pop(id(entry[0]), None) is not None:
                self.state.listed_ends.append((entry[2], calls.OK, now))
        for _ in range(len(self.state.listed_ends)):
            listed, status, ended = self.state.listed_ends.popleft()
            self._end_untimed(self.untimed_listed.pop(listed, None), listed, status, ended, out)

    def _list_untimed(self, tid: int, entry: list[Any], out: list[dict[str, Any]]) -> None:
        to, func, args, t0, code, lasti = entry[0]
        method = self.state.proxy_method(func, args)
        key = self._key("rpc_sync", to, func, method)
        if key is None:  # torch's own
            entry[2] = -1
            return
        entry[2] = self._listed(
            out,
            "call",
            kind="rpc_sync",
            callee=key[0],
            func=key[1],
            site=self._site(code, lasti),
            thread=tid,
            nbytes=self.state.sent_bytes(args, method),
            t=t0,
        )
        self.untimed_listed[entry[2]] = (key, t0)
        self.state.listed_sync[id(entry[0])] = entry[2]

    def _end_untimed(
        self, listed: tuple[Any, float] | None, call_id: int, status: str, ended: float, out: list[dict[str, Any]]
    ) -> None:
        out.append({"e": "cend", "id": call_id, "status": status, "t": ended})
        if listed is not None:  # untimed, but the longest call is known
            key, t0 = listed
            entry = self._entry(key)
            entry[4] = max(entry[4], ended - t0)

    def _serving(self, now: float, out: list[dict[str, Any]]) -> None:
        """What this process runs for others (``self.state.serving_now``, kept by the hook on torch's
        ``_run_function``): one served for LONG_S is listed (``srv``) until it is over (``send``:
        once it is no longer there)."""
        self.running, gone = _carried(self.running, self.state.serving_now, 1)
        for tid, entry in self.running.items():
            if not entry[2] and now - entry[1] >= calls.LONG_S and self.listed < calls.MAX_LISTED:
                udf = entry[0][0]
                name = _udf_name(udf)
                entry[2] = (
                    -1
                    if name is None
                    else self._listed(out, "srv", thread=tid, func=name, nbytes=_tensor_bytes(udf), t=entry[1])
                )
        for entry in gone:
            out.append({"e": "send", "id": entry[2], "t": now})

    def _key(self, kind: str, to: Any, func: Any, method: Any) -> tuple[str, str, str] | None:
        """The stats key of a call: (callee, function, kind); None for torch's own protocol
        (shutdown's barrier, proxies' type lookups), which is not counted."""
        if method is not None and type(method) is not str:
            return self._resolve(kind, to, func, method)
        keys = self._keys()
        raw = (kind, to, func, method)
        try:
            key = keys.get(raw, _UNKNOWN)
        except TypeError:  # an unhashable callee or function
            return self._resolve(kind, to, func, method)
        if key is _UNKNOWN:
            key = self._resolve(kind, to, func, method)
            if len(keys) < MAX_KEYS:
                keys[raw] = key
        return key

    def _keys(self) -> dict[tuple[Any, ...], tuple[str, str, str] | None]:
        """The stats keys resolved so far, forgotten once init_rpc named the workers (an int
        callee's name changed)."""
        if self.keys_workers is not self.state.workers:
            self.keys, self.keys_workers = {}, self.state.workers
        return self.keys

    def _resolve(self, kind: str, to: Any, func: Any, method: Any) -> tuple[str, str, str] | None:
        return self._resolve_name(kind, to, self._func_or_method(func, method))

    def _resolve_name(self, kind: str, to: Any, name: str) -> tuple[str, str, str] | None:
        if name.startswith(self.state.TORCH_INTERNAL):
            return None
        return (self._callee(to), name, kind)

    def _callee(self, to: Any) -> str:
        if type(to) is str:
            return to
        if isinstance(to, int):
            return self.state.workers.get(to, str(to))
        return str(getattr(to, "name", to))

    def _name(self, call: calls.Call) -> str:
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


def _carried(
    previous: dict[int, list[Any]], table: dict[int, tuple[Any, ...]], start: int
) -> tuple[dict[int, list[Any]], list[list[Any]]]:
    """A hook's table of what each thread runs now (``state.in_flight``, ``state.serving_now``),
    carried from the last cycle: thread → [the entry, its start (the entry's item ``start``),
    its id once listed, -1 if it is not to be], each kept while the same entry is there (its
    identity is its own; the last cycle's is let go then); and the listed ones gone since."""
    current: dict[int, list[Any]] = {}
    for tid, item in list(table.items()):  # a copy: the hooks change it meanwhile
        entry = previous.get(tid)
        current[tid] = entry if entry is not None and entry[0] is item else [item, item[start], 0]
    gone = [entry for tid, entry in previous.items() if current.get(tid) is not entry and entry[2] > 0]
    return current, gone


def summariser() -> Summariser:
    return _summariser


def after_fork_in_child() -> None:
    """A forked child starts with nothing reported."""
    global _summariser
    _summariser = Summariser()


def helped(helper: str, method: str) -> str:
    """A helper that runs a method it is given: ``_call_method → ParameterServer.forward``."""
    return f"{helper} → {method}"


def _udf_name(udf: Any) -> str | None:
    """What a served request runs: ``Class.method`` for RRef proxy calls (the owner knows the type)."""
    try:
        func = udf.func
        if func in STATE.local_invokes:
            rref, method = udf.args[0], udf.args[1]
            return f"{type(hooks.local_value(rref)).__qualname__}.{method}"
        name = qualname(func)
        method = STATE.proxy_method(func, udf.args)
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
