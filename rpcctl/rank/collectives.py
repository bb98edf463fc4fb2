"""The collectives a rank's process groups run, read from torch's Flight Recorder (rank side).

torch (2.5 on; checked on 2.13) keeps a ring of the last ``TORCH_FR_BUFFER_SIZE`` collectives
of every process group of the process, gloo and NCCL alike: sequence number, op, input sizes
and dtypes, when it was created, and whether it is retired (completed), plus, per group, the
last sequence number enqueued and completed. ``_dump_fr_trace`` reads it from any thread, also
while the main thread is blocked in a collective, so the telemetry sender thread reads it; no
call of the user's is wrapped.

What a read costs decides how it is read (measured, 2 ranks, gloo, torch 2.13 CPU): the
per-group status alone is ~0.05 ms; the entries ~0.03 ms each (pickle, no stack traces; 2,000
entries: 250 ms). So the sender reads the status every cycle (``SEND_INTERVAL_S``), and the
entries only every ``SAMPLE_EVERY_S`` (and then only if a collective completed since the last
read), or as soon as a collective has been in flight for a cycle (what the watchdog needs: its
op and sizes). The buffer is ``BUFFER`` entries; beyond ``BUFFER`` collectives per
``SAMPLE_EVERY_S`` the counts stay exact (sequence numbers) and the ones the ring overwrote are
counted as op ``?``. A read of a full ring costs the same (~4-7 ms: the dump, unpickling, the
new entries decoded) whatever the rate, so ``SAMPLE_EVERY_S`` sets what the recorder costs a
busy rank: at 2 s, ~2-3 ms a second (a DDP loop of ~300 steps a second: ~10 us a step, 1% of
its CPU, benchmarks/launch_cost.py); up to 128 collectives a second none is lost to the ring.

Set up: ``configure_env`` sets ``TORCH_FR_BUFFER_SIZE`` for the rank (and what it spawns) unless
the user set any ``TORCH_FR_*`` or ``TORCH_NCCL_*`` variable: theirs are left alone (a buffer of
0 then means nothing is recorded). Where the recorder is absent (torch before 2.5, a backend
that does not record: MPI, a custom one), nothing is sent and the views show no collectives; the
rest of telemetry is unchanged.

Times: ``entered`` is the entry's creation time (torch's clock, epoch ns). gloo records no
completion time, so ``completed`` is an upper bound: the earlier of the next collective of the
same group entered (a collective loop on one thread) and the sender cycle that saw it retired.
NCCL with ``TORCH_NCCL_ENABLE_TIMING`` has its own; the same bound is used for both.

A process a rank spawned (``mp.spawn`` of a DDP job) joins telemetry at ``init_process_group``,
as at ``init_rpc``; every process then says who it is in the c10d world it joined (``pgw``:
``dist.get_rank()``, the world size, where it met the others), before any of its groups, so its
collectives are keyed by that rank, not by the launched rank all of a script's workers share.

A group is reported under what names it on every rank, never the recorder's id (issue 38): the
recorder numbers a process's groups in the order their backends were made, so RPC's own gloo
group (made by ``init_rpc``, not through c10d's API) shifts them: in a DDP + RPC job id 1 is
RPC's group on the parameter server and the trainers' group on the trainers. What is the same on
every rank is the group's c10d name (an entry's ``process_group``: ``("1", "undefined")``; the
default group's is ``"0"``), so the sender learns id → name from the entries (a group the status
shows with no name known yet makes the sender read them at once, and is reported from then on);
RPC's own group has no name (``("", "")``) and is ``rpc`` (``rpc2``… for a later ``init_rpc`` of the
process): the groups that appeared in the status while ``init_rpc`` ran (``rpc_starting`` /
``rpc_started``). A group made outside c10d's API that is not RPC's reads ``unnamed:ID`` (its local
id: it may differ across ranks). A torch whose entries have no ``process_group`` is reported by id,
as before. A group's members are the global ranks c10d gives it (``_world.pg_group_ranks``, from
the moment ``new_group`` returns; else the recorder's ``pg_config``), sent with its first state
(``ranks``), so the watchdog knows a member that never reported the group.

Events (``protocol``): ``pgw`` (above), ``coll`` (a group's state: last entered and completed sequence number,
the one in flight with its op and sizes; ``ranks`` once), ``cop`` (per group and op: count, bytes, durations
as ``calls``' histogram), ``cent`` (a sampled collective: the first ``LIST_FIRST`` of a group and
every ``LIST_EVERY``-th after, at most ``MAX_LISTED_PER_READ`` per read). Its hook (``wrap_join``) ``patch``
puts on torch; ``OBSERVER`` is what ``patch`` and the reporter drive (``observer.Observer``).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import MutableMapping
from typing import Any

from rpcctl.rank.observer import Observer
from rpcctl.wire.histogram import bucket

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"
BUFFER = 256
SAMPLE_EVERY_S = 2.0
MAX_LISTED_PER_READ = 16
SETTLE_S = 0.5
# Which collectives are listed one by one (``cent``): the first LIST_FIRST of each group, then
# every LIST_EVERY-th. Chosen by sequence number, so every rank lists the same ones and their
# arrival times can be compared (stragglers), whenever each rank happens to read.
LIST_FIRST = 64
LIST_EVERY = 16
MAX_NAME_CHARS = 256  # of a group's name (new_group's hashed names are 40)
MAX_MEMBERS = 100_000  # ranks of a group sent
USER_PREFIXES = ("TORCH_FR_", "TORCH_NCCL_")

_DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
}

_active = False
_queue: Any = None
_joined = False  # init_process_group or new_group began in this process (the hook saw it)
# Who this process is in its c10d world, once init_process_group returned (``identity``); while
# init_process_group runs, ``_pending``: the sender reports no group until it knows.
_identity: dict[str, Any] | None = None
_pending = False
# RPC's own gloo groups: recorder id → ``rpc`` (``rpc2``… for a later init_rpc of the process), the ids
# that appeared in the status while init_rpc ran; ``_before_rpc``: the ids there when it began.
_rpc_groups: dict[str, str] = {}
_before_rpc: set[str] | None = None
RPC_GROUP = "rpc"


def configure_env(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Turn the Flight Recorder on for this process and what it starts, unless the user set any
    of torch's own recorder settings; True if it was set here."""
    if any(key.startswith(USER_PREFIXES) for key in environ):
        return False
    environ[ENV_BUFFER] = str(BUFFER)
    return True


def wrap_join(original: Any, name: str, join: Any = None) -> Any:
    """``init_process_group`` or ``new_group`` (``patch`` puts it on torch) posting that it was
    entered (``pgjoin``): the watchdog names a rank that never reaches it, as it does for
    init_rpc. ``join()`` first joins a process a rank spawned to telemetry (as init_rpc does).
    Once init_process_group returned, the sender reports who the process is in that world
    (``pgw``: ``identity``) before any of its groups. The collectives themselves are not
    wrapped: the recorder is torch's."""
    import functools

    @functools.wraps(original)
    def joining(*args: Any, **kwargs: Any) -> Any:
        global _joined, _pending, _identity
        if join is not None:
            join()
        _joined = True
        queue = _queue
        if _active and queue is not None:
            queue.append({"e": "pgjoin", "call": name, "t": time.time()})
        if name != "init_process_group":
            return original(*args, **kwargs)
        _pending = True
        try:
            result = original(*args, **kwargs)
            _identity = identity(args, kwargs)
            return result
        finally:
            _pending = False

    joining._rpcctl_pgjoin = True  # type: ignore[attr-defined]
    return joining


def rendezvous(init_method: Any) -> str:
    """Where a process met the others of its world (RPC's or c10d's): the store tells worlds
    apart by it (``StoreWriter._world_of``)."""
    method = str(init_method or "env://")
    if method.startswith("env://"):
        return f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return method


def identity(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The ``pgw`` event: this process's rank in the c10d world init_process_group(*args,
    **kwargs) made, its size, and where it met the others (a store passed in: its address)."""
    try:
        import torch.distributed as dist

        store = kwargs.get("store")
        method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
        if method is None and store is not None:
            store = getattr(store, "underlying_store", store)  # a PrefixStore: where it keeps its keys
            host, port, path = (getattr(store, key, None) for key in ("host", "port", "path"))
            rdv = f"{host}:{port}" if host else f"file://{path}" if path else "store"
        else:
            rdv = rendezvous(method)
        return {
            "e": "pgw",
            "rank": int(dist.get_rank()),
            "world_size": int(dist.get_world_size()),
            "rdv": rdv,
            "t": time.time(),
        }
    except Exception:  # noqa: BLE001 - never fail the user's init_process_group for telemetry
        return None


class CollectivesObserver(Observer):
    """The collectives family, as ``patch`` and the reporter drive it."""

    name = "collectives"

    def activate(self, queue: Any) -> None:
        global _active, _queue
        _active, _queue = True, queue

    def deactivate(self) -> None:
        global _active
        _active = False

    def after_fork_in_child(self) -> None:
        """A forked child starts with no group of its own (the parent's are not usable there)."""
        global _joined, _identity, _pending, _before_rpc
        _joined, _identity, _pending, _before_rpc = False, None, False, None
        _rpc_groups.clear()
        self.deactivate()

    def rpc_starting(self) -> None:
        """The groups the recorder knows before init_rpc makes its own (~0.05 ms, once)."""
        global _before_rpc
        _before_rpc = _status_ids() if _active and _imported() else None

    def rpc_started(self, info: dict[str, Any]) -> None:
        """The groups that appeared while init_rpc ran are RPC's own (its agent's gloo group ran
        its all_gathers and barrier there), but for one whose entries carry a c10d name: the
        recorder lists a group only from its first collective, and a peer's RPC handler may run
        one of the default group on this rank before its init_rpc returned (CI: that all_reduce
        was reported under ``rpc``, and the watchdog said the rank had not entered it). One read
        of the entries (a few ms, once per init_rpc) tells them apart."""
        global _before_rpc
        before, _before_rpc = _before_rpc, None
        full = _dump(entries=True) if before is not None else None
        if full is None:
            return
        after = {str(pg) for pg in full.get("pg_status") or {}}
        named = {
            str(e.get("pg_id"))
            for e in full.get("entries") or []
            if isinstance(e.get("process_group"), (list, tuple)) and e["process_group"] and e["process_group"][0]
        }
        labels = set(_rpc_groups.values())
        label = RPC_GROUP if not labels else f"{RPC_GROUP}{len(labels) + 1}"
        for pg in after - before - named:
            _rpc_groups.setdefault(pg, label)


OBSERVER = CollectivesObserver()


def op_name(profiling_name: str) -> str:
    """``gloo:all_reduce`` → ``all_reduce``."""
    return profiling_name.split(":", 1)[-1] if profiling_name else "?"


def nbytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * _DTYPE_BYTES.get(dtype, 0)
    return total


def _dump(entries: bool) -> dict[str, Any] | None:
    c10d = getattr(getattr(sys.modules.get("torch"), "_C", None), "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    try:
        return pickle.loads(dump(includeCollectives=entries, includeStackTraces=False))
    except Exception:  # noqa: BLE001 - a recorder that cannot answer is a recorder that is absent
        return None


def _status_ids() -> set[str] | None:
    status = _dump(entries=False)
    return None if status is None else {str(pg) for pg in status.get("pg_status") or {}}


def identity_of(pg: str, process_group: Any) -> str | None:
    """What names recorder group ``pg`` on every rank, from an entry's ``process_group`` ((name,
    desc)); None when that does not say (the sender reads the entries again later)."""
    if not (isinstance(process_group, (list, tuple)) and len(process_group) == 2):
        return None
    name = str(process_group[0])[:MAX_NAME_CHARS]
    if name:
        return name
    if _rpc_pending(pg):
        return None  # made while init_rpc runs: RPC's own, once init_rpc returned (``rpc_started``)
    return _rpc_groups.get(pg) or f"unnamed:{pg}"


def _rpc_pending(pg: str) -> bool:
    """Group ``pg`` appeared while init_rpc runs (RPC's own, told once it returned)."""
    before = _before_rpc
    return pg not in _rpc_groups and before is not None and pg not in before


def c10d_members() -> dict[str, list[int]]:
    """Each group this process is a member of, by c10d name: its global ranks (c10d's own
    bookkeeping, there from the moment new_group returns; a group the process is not in is not
    listed)."""
    world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
    names, ranks = getattr(world, "pg_names", None), getattr(world, "pg_group_ranks", None)
    if not names or not ranks:
        return {}
    try:
        return {
            str(name): sorted(int(r) for r in ranks[pg])[:MAX_MEMBERS]
            for pg, name in list(names.items())
            if pg in ranks
        }
    except Exception:  # noqa: BLE001 - torch's private bookkeeping changed shape: members unknown, as before
        return {}


def _config_members(config: Any) -> list[int] | None:
    """The ranks of a group's ``pg_config`` entry (a string: ``"[0, 1]"``; NCCL fills it)."""
    ranks = config.get("ranks") if isinstance(config, dict) else None
    if not isinstance(ranks, str) or not ranks.strip("[] "):
        return None
    try:
        return sorted(int(r) for r in ranks.strip("[] ").split(","))[:MAX_MEMBERS]
    except ValueError:
        return None


def _imported() -> bool:
    """torch.distributed is imported (the recorder keeps its entries after destroy_process_group,
    so the last read, at the end, still counts the last collectives)."""
    return "torch.distributed" in sys.modules


def _groups_exist() -> bool:
    """A process group exists or was begun here: until then the recorder has nothing to say,
    and an RPC-only job's sender does not read it (~0.14 ms a cycle on a loaded machine, half
    of an idle cycle: benchmarks/launch_cost.py)."""
    if _joined:
        return True
    world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
    return bool(getattr(world, "pg_map", None))


def _settled_status() -> dict[str, Any] | None:
    """The status at the end, once the collectives already waited on are marked completed.

    gloo marks a collective completed in the recorder on its own thread, a little after
    ``wait()`` has returned to the user (measured: 1 in 6 reads straight after an all_reduce
    still sees the previous one as the last completed). So the last read, at exit, gives
    the recorder up to ``SETTLE_S`` to catch up; a collective that really never completed
    (an async one never waited on) costs that much once."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        status = _dump(entries=False)
        groups = (status or {}).get("pg_status") or {}
        behind = any(
            int(st.get("last_enqueued_collective", 0)) > int(st.get("last_completed_collective", 0))
            for st in groups.values()
        )
        if not behind or time.monotonic() >= deadline:
            return status
        time.sleep(0.01)


class _Group:
    __slots__ = (
        "entered",
        "completed",
        "sent",
        "flight_seen",
        "described",
        "marks",
        "desc",
        "size",
        "members",
        "members_sent",
    )

    def __init__(self) -> None:
        self.entered = self.completed = 0
        self.sent: tuple[Any, ...] | None = None
        self.flight_seen: int | None = None  # the sequence number the last cycle saw in flight
        self.described: dict[str, Any] | None = None  # the entry in flight, once read
        self.marks: list[tuple[int, float]] = []  # (completed, the cycle that saw it): bounds completion times
        self.desc: str | None = None  # c10d's description of the group (default_pg, undefined, the user's group_desc)
        self.size: int | None = None
        self.members: list[int] | None = None  # its global ranks (``c10d_members``)
        self.members_sent = False

    def saw(self, entered: int, completed: int, now: float) -> None:
        """The group's counters as read now: the status, or an entry retired since it."""
        if entered >= self.entered:
            # Never back: gloo's worker threads (2) each write the status when theirs completes,
            # so #2's late write can follow #3's, and it stays so while the next one waits
            # (a hang read as progress every time an entries read said #3 again).
            completed = max(completed, self.completed)
        if completed > self.completed:
            self.marks.append((completed, now))
        self.entered, self.completed = entered, completed


class Poller:
    """Runs in the sender thread: ``process(now)`` → events."""

    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {}
        self.last_record = -1
        self.counted: dict[str, int] = {}  # pg → the last seq counted into cop
        self.next_sample = 0.0
        self.prev_cycle = 0.0
        self.identity: dict[str, Any] | None = None  # the last ``pgw`` sent
        self.names: dict[str, str] = {}  # recorder id → what names the group on every rank (``identity_of``)
        self.configs: dict[str, Any] = {}  # the recorder's pg_config, by group name
        self.asked: set[str] = set()  # ids an entries read was made for, to learn their names

    def process(self, now: float, final: bool = False) -> list[dict[str, Any]]:
        if not _active or not _imported() or not (self.groups or _groups_exist()) or _pending:
            return []
        status = _settled_status() if final else _dump(entries=False)
        if status is None:
            return []
        out: list[dict[str, Any]] = []
        if _identity is not None and _identity is not self.identity:  # before the groups it names
            self.identity = _identity
            out.append(_identity)
        want_entries = final or now >= self.next_sample
        self.configs = status.get("pg_config") or {}
        unnamed = False  # a group whose name the entries have not told yet: read them now
        for pg, st in (status.get("pg_status") or {}).items():
            group = self.groups.setdefault(str(pg), _Group())
            # -1: none yet (torch's initial value)
            group.saw(
                max(0, int(st.get("last_enqueued_collective", 0))),
                max(0, int(st.get("last_completed_collective", 0))),
                now,
            )
            if group.entered > group.completed:
                # a new one in flight: read it only if it is still there next cycle
                if group.flight_seen != group.completed + 1:
                    group.flight_seen, group.described = group.completed + 1, None
                elif group.described is None:
                    want_entries = True  # the same collective in flight for a cycle: read what it is
            else:
                group.flight_seen, group.described = None, None
            if str(pg) not in self.names:
                if str(pg) in _rpc_groups:
                    self._name(str(pg), _rpc_groups[str(pg)])
                # once: a ring that overwrote its entries names it at its next collective
                elif str(pg) not in self.asked:
                    self.asked.add(str(pg))
                    unnamed = want_entries = True
        if (
            want_entries
            and not final
            and not unnamed
            and not any(
                group.completed > self.counted.get(pg, 0) or group.described is None and group.entered > group.completed
                for pg, group in self.groups.items()
            )
        ):
            want_entries = False  # nothing completed since the last read, nothing in flight to describe: ~3-6 ms saved
        if want_entries:
            self.next_sample = now + SAMPLE_EVERY_S
            full = _dump(entries=True)
            if full is not None:
                out.extend(self._entries(full.get("entries") or [], now, final))
        for pg, group in self.groups.items():
            label = self.names.get(pg)
            if label is None:  # not named yet (its entries were overwritten): reported once a collective of it names it
                continue
            state = (group.entered, group.completed, group.described["seq"] if group.described else None)
            if state == group.sent and not final:
                continue
            group.sent = state
            event: dict[str, Any] = {
                "e": "coll",
                "pg": label,
                "name": group.desc,
                "size": group.size,
                "enq": group.entered,
                "done": group.completed,
                "t": now,
            }
            if group.members is not None and (final or not group.members_sent):
                event["ranks"], group.members_sent = group.members, True
            if group.described is not None:
                event.update({k: group.described[k] for k in ("seq", "op", "sizes", "dtypes", "bytes", "since")})
            out.append(event)
        self.prev_cycle = now
        return out

    def _entries(self, entries: list[dict[str, Any]], now: float, final: bool = False) -> list[dict[str, Any]]:
        stats: dict[tuple[str, str], list[Any]] = {}
        listed: list[dict[str, Any]] = []
        by_pg: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            if entry.get("is_p2p"):
                continue
            by_pg.setdefault(str(entry.get("pg_id")), []).append(entry)
        for pg, rows in by_pg.items():
            rows.sort(key=lambda e: int(e.get("collective_seq_id") or 0))
            group = self.groups.setdefault(pg, _Group())
            process_group = rows[-1].get("process_group")
            if isinstance(process_group, (list, tuple)) and len(process_group) == 2:
                group.desc = str(process_group[1])[:MAX_NAME_CHARS] or None
            if pg not in self.names:
                label = identity_of(pg, process_group)
                if label is None and "process_group" not in rows[-1]:
                    label = pg  # a torch whose entries have no process_group: by id, as before
                elif label is None and not _rpc_pending(pg):
                    label = f"unnamed:{pg}"
                if label is None:  # RPC's own group, while init_rpc runs: counted at the next read
                    continue
                self._name(pg, label)
            label = self.names[pg]
            counted = self.counted.get(pg, 0)
            unretired = False
            for index, entry in enumerate(rows):
                seq = int(entry.get("collective_seq_id") or 0)
                if not entry.get("retired"):
                    unretired = unretired or seq > counted
                    if seq == group.completed + 1 and group.entered > group.completed:
                        created, op, sizes, dtypes, size = _decoded(entry)
                        group.described = {
                            "seq": seq,
                            "op": op,
                            "sizes": sizes,
                            "dtypes": dtypes,
                            "bytes": size,
                            "since": created,
                        }
                    continue
                if unretired and not final:
                    # gloo's worker threads retire out of order: N+1 can retire before N. Counted
                    # past N, N would be skipped for good and counted as overwritten ("?").
                    continue
                if seq > group.completed:  # retired after the status read (gloo retires asynchronously)
                    group.saw(max(group.entered, seq), seq, now)
                if seq <= counted:  # counted at an earlier read: not decoded again
                    continue
                created, op, sizes, dtypes, size = _decoded(entry)
                if seq > counted + 1:  # the ring overwrote these before a read: counted, not described
                    gap = stats.setdefault((label, "?"), [0, 0, 0.0, 0.0, {}])
                    gap[0] += seq - counted - 1
                nxt = rows[index + 1] if index + 1 < len(rows) else None
                seen = next((at for done, at in group.marks if done >= seq), now)
                bound = seen if nxt is None else min(seen, int(nxt.get("time_created_ns") or 0) / 1e9)
                duration = max(0.0, bound - created)
                stat = stats.setdefault((label, op), [0, 0, 0.0, 0.0, {}])
                stat[0] += 1
                stat[1] += size
                stat[2] += duration
                stat[3] = max(stat[3], duration)
                b = str(bucket(duration)) if duration > 0 else "0"
                stat[4][b] = stat[4].get(b, 0) + 1
                if len(listed) < MAX_LISTED_PER_READ and (seq <= LIST_FIRST or seq % LIST_EVERY == 0):
                    listed.append(
                        {
                            "e": "cent",
                            "pg": label,
                            "seq": seq,
                            "op": op,
                            "sizes": sizes,
                            "dtypes": dtypes,
                            "bytes": size,
                            "entered": created,
                            "completed": bound,
                            "t": now,
                        }
                    )
                counted = seq
            self.counted[pg] = counted
            group.marks = [m for m in group.marks if m[0] > counted]
        events = [
            {"e": "cop", "pg": pg, "op": op, "n": s[0], "bytes": s[1], "sum": s[2], "max": s[3], "h": s[4], "t": now}
            for (pg, op), s in stats.items()
        ]
        return events + listed

    def _name(self, pg: str, label: str) -> None:
        """Recorder group ``pg`` is ``label`` on every rank; its members, from c10d's bookkeeping
        (else the recorder's config of the group)."""
        self.names[pg] = label
        group = self.groups.setdefault(pg, _Group())
        members = c10d_members().get(label)
        group.members = members if members is not None else _config_members(self.configs.get(label))
        group.size = len(group.members) if group.members is not None else None


def _decoded(entry: dict[str, Any]) -> tuple[float, str, list[list[int]], list[str], int]:
    """A recorder entry's (created, op, sizes, dtypes, bytes)."""
    sizes = [list(s) for s in entry.get("input_sizes") or []]
    dtypes = [str(d) for d in entry.get("input_dtypes") or []]
    return (
        int(entry.get("time_created_ns") or 0) / 1e9,
        op_name(str(entry.get("profiling_name") or "")),
        sizes,
        dtypes,
        nbytes(sizes, dtypes),
    )


def poller() -> Poller:
    return Poller()
