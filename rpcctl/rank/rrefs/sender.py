"""The sender thread's side of RRef tracking: the hooks' queue → protocol events (``Tracker``).

RRefs gone before ``MIN_AGE_S`` are only counted per call site (``churn``); the others get
their ids, owner and call site resolved, and once the owner confirmed them a batched
``rpc_async`` per owner asks it to describe the values (``hooks._describe_on_owner``).
Also here: the slicing that lets go of the GIL during long cycles (``in_slices``), which the
reporter's sends use too.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from rpcctl.base.frames import short_path
from rpcctl.wire.protocol import MIN_AGE_S
from rpcctl.rank.rrefs import hooks
from rpcctl.rank.rrefs.hooks import _PLAIN, RREF_ID, _describe_on_owner, Ref, _value_freed, _weakref
from rpcctl.rank.rrefs.values import describe

# The sender thread lets go of the GIL after every GIL_SLICE items. Without it, a cycle with
# thousands of events (a round of RRefs released at once) holds the GIL for many switch
# intervals, and every RPC thread that needs it waits. benchmarks/tracking_overhead.py --gil
# measures those stalls; the figures behind 64 and PAUSE_S are in docs/bench.md ("The telemetry
# sender's GIL slice"), not here, where they would go stale.
GIL_SLICE = 64
PAUSE_S = 0.00005  # a real sleep: time.sleep(0) may take the GIL straight back


def pause() -> None:
    time.sleep(PAUSE_S)


def in_slices(items: Any, every: int | None = None) -> Any:
    """``items``, one by one, letting go of the GIL after every ``every`` (GIL_SLICE) of them."""
    for chunk in slices(list(items), every):
        yield from chunk


def slices(items: list[Any], every: int | None = None) -> Any:
    """``items`` in lists of ``every`` (GIL_SLICE), letting go of the GIL between them: a loop
    over each list costs less per item than a generator that counts (the sender's hot loop)."""
    every = every or GIL_SLICE
    for start in range(0, len(items), every):
        if start:
            pause()
        yield items[start : start + every]


MAX_USES = 200_000  # hooks.last_use entries: beyond, it is cleared (the uses of handles never seen to end)
DESCRIBE_PER_CYCLE = 16  # RRefs per owner per sender cycle (0.1 s): at most 160/s per owner
DESCRIBE_BACKLOG = 10_000  # beyond this, RRefs stay undescribed


class Tracker:
    """Per-process state of what was reported. Used only by the sender thread."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.rank: int | None = None
        self.workers: dict[int, str] = {}
        self.ranks_by_name: dict[str, int] = {}
        # id(Ref) → (it, rref id, fork id, its release watcher)
        self.sent: dict[int, tuple[Ref, str, str, weakref.ref]] = {}
        self.unconfirmed: dict[int, tuple[weakref.ref, str, str | None]] = {}  # … (weakref, rref id, owner)
        self.values: dict[int, tuple[weakref.ref, str]] = {}  # id(weakref of a value we own) → (weakref, rref id)
        self.to_describe: dict[str, collections.deque[weakref.ref]] = {}  # owner → confirmed RRefs to describe
        self.deferred: list[tuple[Any, ...]] = []
        self.churn: Counter[tuple[str, str, str]] = Counter()
        self.sites: dict[tuple[Any, int], str] = {}
        self.meta: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.pending_events: list[dict[str, Any]] = []  # made while handling another event
        self.described: set[str] = set()  # forks whose description this process asked for
        # RRef(value) handles gone unseen: id → churn key (``_o``)
        self.churned_local: dict[str, tuple[str, str, str]] = {}
        self._identity: tuple[str, int, dict[int, str]] | None = None  # the hooks' identity, as last seen

    def set_identity(self, name: str, rank: int, workers: dict[int, str]) -> None:
        self.name, self.rank = name, rank
        self.workers = dict(workers)
        self.ranks_by_name = {v: k for k, v in workers.items()}

    def process(self, items: list[Any], now: float, final: bool = False) -> list[dict[str, Any]]:
        identity = hooks.identity
        if identity is None and self.name is None and items:
            # A peer's call can make RRefs here before init_rpc returns: named by the agent, they
            # are this worker's ("?" was an owner of its own in the report; CI, test_spawned_rrefs).
            identity = hooks.agent_identity()
        # init_rpc returned (or the agent started) since the last cycle
        if identity is not self._identity and identity is not None:
            self._identity = identity
            self.set_identity(*identity)
        hooks.sender_tid = threading.get_ident()
        if len(hooks.last_use) > MAX_USES:  # handles whose end was never queued (a full queue)
            hooks.last_use.clear()
        out: list[dict[str, Any]] = []
        todo, self.deferred = self.deferred + items, []
        deferred, churn, young, last_use, handlers, meta = (
            self.deferred,
            self.churn,
            now - MIN_AGE_S,
            hooks.last_use,
            self.HANDLERS,
            self.meta,
        )
        for chunk in slices(todo):
            for item in chunk:
                kind = type(item)
                try:
                    if kind is Ref:
                        if item.seen == 0:  # a new handle: report it if it outlived MIN_AGE_S
                            if item() is None:
                                last_use.pop(item.oid, None)
                                # Gone already (most are): counted per call site, nothing sent, by
                                # the site's cached churn key where it is known (``_r``: inline, the
                                # sender's cost per rpc.remote call); else ``_r`` resolves it.
                                if (
                                    item.kind == "r"
                                    and item.target is None
                                    and type(item.to) is str
                                    and type(item.func) in _PLAIN
                                ):
                                    known = meta.get((item.to, item.func, None, id(item.code), item.lasti))
                                    if known is not None:
                                        churn[known[5]] += 1
                                        item.seen = 2
                                        continue
                            elif not final and item.t > young:
                                deferred.append(item)
                                continue
                            event = self._created(item)
                        else:
                            continue
                    elif kind is dict:
                        event = item
                    else:
                        event = handlers[item[0]](self, *item[1:])
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
                if n == 0:
                    continue
                out.append({"e": "churn", "owner": owner, "callee": callee, "site": site, "n": n, "t": now})
            self.churn.clear()
        return out

    # -- handles (``Ref``) and tuples (``vw``, ``vx``) --------------------------------------------
    def _created(self, ref: Ref) -> dict | None:
        # _r, _l and _f set seen = 1 while they hold the handle: from then on its death is
        # queued (``hooks._released``), and it cannot die unseen in between.
        kind = ref.kind
        event = (
            self._r(ref)
            if kind == "r"
            else self._l(ref)
            if kind == "l"
            else self._o(ref)
            if kind == "o"
            else self._f(ref)
        )
        if event is None:
            ref.seen = 2
        return event

    def _uses(self, uses: dict[int, float]) -> None:
        """rpc.shutdown() began (``uses``: ``hooks.last_use`` then): when this process last used
        each reference it still held (``used``), so one kept to the end unused can be told from
        one in use. The handles still in ``sent`` are those alive then: a release queued before
        shutdown was taken before this item; one after it (the script's end frees its locals
        before the sender's next cycle) is taken after."""
        for ref, rref_id, fork_id, _ in self.sent.values():
            used = uses.get(ref.oid)
            if used is not None:
                self.pending_events.append({"e": "used", "id": rref_id, "fork": fork_id, "t": used})

    def _released(self, ref: Ref, t: float) -> dict | None:
        """A reported handle died (``hooks._released``)."""
        ref.seen = 3
        used = hooks.last_use.pop(ref.oid, None)
        entry = self.sent.pop(id(ref), None)
        self.unconfirmed.pop(id(ref), None)
        if entry is None:
            return None
        if used is not None:  # its last use, for LAST USED of an RRef deleted before the end
            self.pending_events.append({"e": "used", "id": entry[1], "fork": entry[2], "t": used})
        return {"e": "rel", "id": entry[1], "fork": entry[2], "t": t}

    def _r(self, ref: Ref) -> dict | None:
        to, func, target, t = ref.to, ref.func, ref.target, ref.t
        method = target[1] if target else None
        # Keyed by the code object's id, not the code object: a code object hashes its contents
        # (half the cost of a churned RRef here); the entry keeps the code alive, so the id stays its.
        key = (to, func, method, id(ref.code), ref.lasti) if type(to) is str and type(func) in _PLAIN else None
        meta = self.meta.get(key) if key is not None else None
        if meta is None:
            owner_rank, owner = self._owner(to)
            callee, site = f"?.{method}" if method else qualname(func), self._site(ref.code, ref.lasti)
            meta = (owner_rank, owner, callee, site, ref.code, (owner or "?", callee, site))  # the last: its churn key
            if key is not None and len(self.meta) < 10_000:
                self.meta[key] = meta
        owner_rank, owner, callee, site, _, _ = meta
        rref = ref()
        if rref is None:
            self.churn[(owner or "?", callee, site)] += 1
            return None
        if target is not None:  # name the method after the RRef it was called on: "rref(0:3).value"
            on = target[0]()
            if on is not None:
                ids = RREF_ID.findall(str(on))
                callee = f"rref({ids[0][0]}:{ids[0][1]}).{method}" if ids else callee
            del on
        ids = RREF_ID.findall(str(rref))
        confirmed = rref.confirmed_by_owner()
        rref_id = f"{ids[0][0]}:{ids[0][1]}"
        fork_id = f"{ids[1][0]}:{ids[1][1]}" if len(ids) > 1 else ""
        self._report(ref, rref, rref_id, fork_id)
        event = {
            "e": "rref",
            "id": rref_id,
            "fork": fork_id,
            "owner": owner,
            "owner_rank": owner_rank,
            "kind": "remote",
            "callee": callee,
            "site": site,
            "confirmed": confirmed,
            "t": t,
        }
        if confirmed:
            self._describe(rref, owner, rref_id, None, t)
        else:
            self.unconfirmed[id(ref)] = (ref, rref_id, owner)
        del rref
        return event

    def _report(self, ref: Ref, rref: Any, rref_id: str, fork_id: str) -> None:
        """A handle reported (``rref``: held by the caller, so it cannot die in between): from
        now on its death is queued (``hooks._released``, by a weak reference with a callback)."""
        self.sent[id(ref)] = (ref, rref_id, fork_id, weakref.ref(rref, functools.partial(hooks._released, ref)))
        ref.seen = 1

    def _describe(self, rref: Any, owner: str | None, rref_id: str, out: list | None, t: float) -> None:
        """Describe a confirmed RRef's value: here if we own it, else batched to its owner."""
        if rref.is_owner():
            value = hooks.local_value(rref)
            event = {
                "e": "desc",
                "id": rref_id,
                "value": describe(value),
                "watched": self._watch_value(value, rref_id),
                "t": t,
            }
            if out is not None:
                out.append(event)
            else:
                self.pending_events.append(event)
        elif owner is not None and not hooks._shutting_down:
            backlog = self.to_describe.setdefault(owner, collections.deque())
            if len(backlog) < DESCRIBE_BACKLOG:
                backlog.append(_weakref(rref))

    def _send_describes(self, final: bool) -> None:
        """At most DESCRIBE_PER_CYCLE RRefs per owner per cycle, oldest first: passing an RRef
        to its owner costs torch a few messages, so a burst of long-lived RRefs is described
        over the next cycles instead of doubling the job's RPC traffic."""
        if final or hooks._shutting_down or not self.to_describe:
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

    def _watch_value(self, value: Any, rref_id: str) -> bool:
        """Watch ``value`` to see it freed; False where it cannot be weakly referenced, or where the
        Python object is a wrapper made afresh for each look (a TorchScript module or object:
        DistributedOptimizer's optimizers), whose death says nothing of the value's."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, (torch.jit.ScriptModule, torch._C.ScriptObject)):
            return False
        try:
            vwr = _weakref(value, _value_freed)
        except TypeError:
            return False
        self.values[id(vwr)] = (vwr, rref_id)
        return True

    def _l(self, ref: Ref) -> dict | None:
        t = ref.t
        site = self._site(ref.code, ref.lasti)
        ids = RREF_ID.findall(ref.data or "")
        rref_id = f"{ids[0][0]}:{ids[0][1]}" if ids else None
        rref = ref()
        if rref is None:
            self.churn[(self.name or "?", "RRef", site)] += 1
            if rref_id is not None and len(hooks.local_sites) < 100_000:
                hooks.local_sites[rref_id] = site  # for the holders it was handed to
                self.churned_local[rref_id] = (self.name or "?", "RRef", site)
            return None
        if rref_id is None:
            ids = RREF_ID.findall(str(rref))
            rref_id = f"{ids[0][0]}:{ids[0][1]}"
        value = hooks.local_value(rref)
        description = describe(value)
        self._report(ref, rref, rref_id, "")
        watched = self._watch_value(value, rref_id)
        del rref, value
        return {
            "e": "rref",
            "id": rref_id,
            "fork": "",
            "owner": self.name,
            "owner_rank": self.rank,
            "kind": "local",
            "callee": None,
            "site": site,
            "confirmed": True,
            "value": description,
            "watched": watched,
            "t": t,
        }

    def _unchurn(self, rref_id: str) -> None:
        """An RRef(value) made here, whose handle died unseen (counted short-lived), was handed out
        and lives on in a holder, which lists it: it is not short-lived after all."""
        churned = self.churned_local.pop(rref_id, None)
        if churned is not None:
            self.churn[churned] -= 1  # a negative count is sent if the +1 went out last cycle

    def _o(self, ref: Ref) -> dict | None:
        """The owner got back an RRef(value) it made (an ``rpc_async`` to itself returned it): the
        handle it made died at once (counted short-lived, if the sender saw it dead) and this one
        holds the RRef from now on, so it is listed, as a local RRef, and not counted short-lived.
        An RRef another worker made by ``rpc.remote`` and handed back to its owner is a holder like a fork."""
        rref = ref()
        if rref is None:  # most: the owner's RPC thread held it for one call (``_call_method(rref)``)
            return None
        owner_rank, rref_on, rref_local, fork_on, fork_local = (int(x) for x in ref.data[:5])
        if rref_on != owner_rank:
            del rref
            return self._f(ref)
        rref_id, fork_id = f"{rref_on}:{rref_local}", f"{fork_on}:{fork_local}"  # each hand-over has its own fork id
        self._unchurn(rref_id)
        value = hooks.local_value(rref)
        self._report(ref, rref, rref_id, fork_id)
        watched = self._watch_value(value, rref_id)
        event = {
            "e": "rref",
            "id": rref_id,
            "fork": fork_id,
            "owner": self.name,
            "owner_rank": self.rank,
            "kind": "local",
            "callee": None,
            "site": hooks.local_sites.get(rref_id),
            "confirmed": True,
            "value": describe(value),
            "watched": watched,
            "t": ref.t,
        }
        del rref, value
        return event

    def _f(self, ref: Ref) -> dict | None:
        data, t = ref.data, ref.t
        rref = ref()
        if rref is None:
            return None
        owner_rank, rref_on, rref_local, fork_on, fork_local = (int(x) for x in data[:5])
        rref_id, fork_id = f"{rref_on}:{rref_local}", f"{fork_on}:{fork_local}"
        self._report(ref, rref, rref_id, fork_id)
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
        return {
            "e": "fork",
            "id": rref_id,
            "fork": fork_id,
            "owner_rank": owner_rank,
            "type": None if type_name == "PyObject" else type_name,
            "t": t,
        }

    def _vw(self, wr: weakref.ref, rref_id: str) -> None:
        """The owner described a value on an RPC thread (``hooks._describe_on_owner``) and watches
        it from now on. Kept even where the value is gone already (its holders let go in the 0.1 s
        since): its ``vx`` item, queued behind this one when it died, then finds it and says when.
        Skipping it as dead made the value read as never freed (``leaked``: 4 and 19 of 40 RRefs of
        a program that keeps none, dropped 0.25-0.65 s old; tests/test_pipeline_rrefs.py)."""
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
            line = next(
                (ln for start, end, ln in code.co_lines() if start <= lasti < end and ln is not None),
                code.co_firstlineno,
            )
            site = f"{short_path(code.co_filename)}:{line} in {code.co_name}"
            if len(self.sites) < 10_000:
                self.sites[key] = site
        return site

    # What the hooks queue besides handle records and events: (kind, *args) → its handler (see
    # hooks' docstring). On the class, of plain functions: bound methods in an instance's table
    # would make every Tracker a reference cycle, freed only by the garbage collector.
    HANDLERS: dict[str, Callable[..., dict[str, Any] | None]] = {
        "released": _released,
        "uses": _uses,
        "vw": _vw,
        "vx": _vx,
        "unchurn": _unchurn,
    }


_tracker = Tracker()


def tracker() -> Tracker:
    return _tracker


def after_fork_in_child() -> None:
    """A forked child starts with nothing reported."""
    global _tracker
    _tracker = Tracker()


def _ignore_result(future: Any) -> None:
    try:
        future.wait()
    except Exception:
        pass  # the owner went away, or shut down: nothing to describe


def qualname(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if name is not None and name == getattr(type(func), "__qualname__", None):  # its type's, not its own
        # A TorchScript function answers with its class ("torch.jit.ScriptFunction"); its own
        # name is "__torch__.<module>.<name>".
        qualified = getattr(func, "qualified_name", None)
        if isinstance(qualified, str) and qualified:
            return qualified.removeprefix("__torch__.").removeprefix("__main__.")
        name = None
    if name is None:
        return type(func).__name__
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module and module not in ("__main__", "__mp_main__", "builtins") else name
