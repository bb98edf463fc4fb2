"""The workers view: every rank of the latest restart (the launcher's view, with its probes),
each followed by the processes it spawned itself (mp.spawn trainers: ``kind`` "child", ``rank``
the rank that spawned them; the table shows them as that rank's children, with their RPC names
and pids). They come as a tree: each process right under its own parent (``parent_pid``, the
ppid its hello gave), so a worker that a rank's trainer mp.spawned is listed under that trainer,
named with the chain above it (``(child of rank 0 › pid A)``; ``parents``: those pids). A parent
that never joined telemetry is not listed: the chain says what is not known (``rank 0 › … ›
pid X``).

A rank's state is the run record's word for it (``RankStatus``: pending, running, succeeded,
failed, killed), as ``rpcctl runs`` says it. A spawned child is running, then, by the exit status
its parent reaped (``rank.children``: mp.spawn's workers), ``succeeded`` (exit 0),
``failed`` (EXIT its code) or ``killed`` (by a signal: mp.spawn ends the others when one fails),
or ``exited`` where its parent did not tell (a process started with ``subprocess``)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl.console import HIGH, KEY, LOW, Column, epoch_of, human_bytes, human_seconds, iso_time
from rpcctl.telemetry.reader import StoreReader, column, loads
from rpcctl.base import stacks
from rpcctl.records.runs import hostname, process_in_run
from rpcctl.base.states import RankStatus
from rpcctl.wire import protocol


def _percent(value: float) -> str:
    return f"{value:.0f}%"


def _age(value: float) -> str:
    return human_seconds(value)


@dataclass
class WorkerRecord:
    rank: int | None  # the launcher's rank (a spawned child: the rank that spawned it)
    name: str | None  # RPC worker name, once init_rpc ran
    host: str | None
    pid: int | None
    # pending | running | stopped (SIGSTOP) | succeeded | failed | killed | lost | orphaned; a child: those or exited
    state: RankStatus
    exit_code: int | None
    cpu_percent: float | None
    rss_bytes: int | None
    device: str | None
    gpu_memory_bytes: int | None
    heartbeat_age_s: float | None
    stale: bool  # running, but no heartbeat for STALE_AFTER_S
    kind: str  # rank | child (a process the rank spawned itself)
    rpc_rank: int | None
    parent_pid: int | None
    threads: int | None
    restart: int
    cuda_visible_devices: str | None
    device_maps: dict[str, dict[str, str]] | None
    dropped_events: int
    started_at: str | None
    ended_at: str | None
    cpu_s: float | None  # CPU time the process used, all threads (at its last probe)
    telemetry_cpu_s: float | None  # of which rpcctl's telemetry sender thread
    straggler: str | None = None  # far slower than the others, with the figure (``stragglers``)
    # its rank in its c10d world (a spawned child's is not the launcher rank), once init_process_group returned
    dist_rank: int | None = None
    pg_world: int | None = None  # which c10d world (0, then 1, 2... for each new one: a round of mp.spawn)
    world: int | None = None  # which RPC world, as the RRefs view's WORLD (a round of mp.spawn); None: never joined RPC
    # pids between its rank and it, its parent last ([]: a rank, or a rank's own child)
    parents: list[int] = field(default_factory=list)
    lineage: str | None = field(default=None, metadata={"json": False})  # whose child it is: "rank 0", "rank 0 › pid A"

    @property
    def rank_shown(self) -> str:
        """RANK in the table: a process a rank spawned itself is that rank's child, not the rank."""
        if self.rank is None:
            return "-"
        return str(self.rank) if self.kind == "rank" else "└"

    @property
    def name_shown(self) -> str | None:
        """NAME in the table: a child's RPC name, whose child it is, and its dist rank (what
        its program calls it: mp.spawn's workers share their parent's launcher rank)."""
        if self.kind == "child" and self.rank is not None:
            world = f" of world w{self.pg_world}" if self.pg_world else ""
            dist = f", dist rank {self.dist_rank}{world}" if self.dist_rank is not None else ""
            return f"{self.name or '-'} (child of {self.lineage or f'rank {self.rank}'}{dist})"
        return self.name

    COLUMNS = (
        Column("world", justify="right", priority=KEY, varies=True),
        Column("rank_shown", "RANK", justify="right", priority=KEY, shows="rank"),
        Column("name_shown", "NAME", priority=KEY, shows="name"),
        Column("kind", detail=True, priority=LOW),
        Column("dist_rank", "DIST RANK", detail=True, justify="right", priority=LOW),
        Column("pg_world", "DIST WORLD", detail=True, justify="right", priority=LOW),
        Column("host", detail=True, priority=LOW),
        Column("pid", justify="right", priority=HIGH),
        Column("state", priority=KEY),
        Column("exit_code", "EXIT", justify="right", priority=HIGH),
        Column("cpu_percent", "CPU", fmt=_percent, justify="right"),
        Column("rss_bytes", "RSS", fmt=human_bytes, justify="right"),
        Column("threads", detail=True, justify="right", priority=LOW),
        Column("device"),
        Column("gpu_memory_bytes", "GPU MEM", fmt=human_bytes, justify="right"),
        Column("heartbeat_age_s", "HEARTBEAT", fmt=_age, justify="right", priority=HIGH),
        Column("cuda_visible_devices", "CUDA VISIBLE", detail=True, priority=LOW),
        Column("dropped_events", "DROPPED", detail=True, justify="right"),
        Column("cpu_s", "CPU TIME", fmt=human_seconds, detail=True, justify="right"),
        Column("telemetry_cpu_s", "TELEMETRY CPU", fmt=human_seconds, detail=True, justify="right"),
    )


_HOST = hostname()


def workers(run_dir: Path) -> list[WorkerRecord]:
    """Every rank of the latest restart (the launcher's view, with its probes), then the
    processes those ranks spawned that joined RPC or reported metrics."""
    with StoreReader(run_dir) as s:
        restart = max(s.latest_restart(), s.record.restarts if s.record is not None else 0)
        ranks = _with_recorded_ranks(s, s.ranks(restart), restart)
        procs = s.procs(restart, ordered=True)
        records: list[WorkerRecord] = []
        of_proc: dict[int, WorkerRecord] = {}
        for rank in ranks:
            # pid and rank together: on a multi-node run pids repeat across hosts.
            proc = next((p for p in reversed(procs) if (p["rank"], p["pid"]) == (rank["rank"], rank["pid"])), None)
            records.append(_worker(s, proc, rank, restart))
            if proc is not None:
                of_proc[proc["proc_id"]] = records[-1]
        for proc in procs:
            if proc["proc_id"] not in of_proc:
                records.append(_worker(s, proc, None, restart))
                of_proc[proc["proc_id"]] = records[-1]
    records.sort(
        key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.kind != "rank", w.rpc_rank or 0, w.pid or 0)
    )
    records = _as_tree(records)
    from rpcctl.inspect.stragglers import stragglers

    for slow in stragglers(run_dir):
        # A collective straggler is the process that is that rank of its group: a rank, or in an
        # mp.spawn job the rank's child whose dist rank it is.
        flagged = (
            [of_proc[slow.proc_id]]
            if slow.proc_id in of_proc
            else [
                r
                for r in records
                if r.kind == "rank" and (r.rank == slow.rank or (slow.worker and r.name == slow.worker))
            ]
        )
        for record in flagged:
            record.straggler = "; ".join(filter(None, [record.straggler, slow.describe()]))
    return records


def _as_tree(records: list[WorkerRecord]) -> list[WorkerRecord]:
    """``records`` (ranks, then their children, sorted) as a tree, depth first: each process right
    under its own parent, with the chain above it (``parents``, ``lineage``). A child whose parent
    is not listed (it never joined telemetry) goes under its rank; one that no listed rank has,
    and any loop that reused pids could make, keep their place at the end."""
    ranks = {r.rank: r for r in reversed(records) if r.kind == "rank" and r.rank is not None}
    by_pid: dict[int, list[WorkerRecord]] = {}
    for r in records:
        if r.pid is not None:
            by_pid.setdefault(r.pid, []).append(r)
    below: dict[int, list[WorkerRecord]] = {}
    tops: list[WorkerRecord] = []
    for r in records:
        parent = None
        if r.kind != "rank":  # pid and host together: on a multi-node run pids repeat across hosts
            same_host = [
                p for p in by_pid.get(r.parent_pid, []) if p is not r and (None in (p.host, r.host) or p.host == r.host)
            ]
            parent = same_host[0] if same_host else ranks.get(r.rank)
        if parent is None:
            tops.append(r)
        else:
            below.setdefault(id(parent), []).append(r)
    out: list[WorkerRecord] = []
    seen: set[int] = set()

    def visit(node: WorkerRecord) -> None:
        seen.add(id(node))
        out.append(node)
        for child in below.get(id(node), []):
            if id(child) in seen:
                continue
            if node.kind != "rank":
                child.parents, child.lineage = (
                    [*node.parents, node.pid],
                    f"{node.lineage or f'rank {node.rank}'} › pid {node.pid}",
                )
            elif child.parent_pid is not None and node.pid is not None and child.parent_pid != node.pid:
                child.parents, child.lineage = [child.parent_pid], f"rank {node.rank} › … › pid {child.parent_pid}"
            visit(child)

    for top in tops:
        visit(top)
    return out + [r for r in records if id(r) not in seen]


def spawned_name(run_dir: Path, rank: int, pid: int) -> str | None:
    """The RPC name of process ``pid`` that ``rank`` started itself, if it joined RPC."""
    with StoreReader(run_dir) as s:
        return s.spawned_name(rank, pid)


def ended_without_shutdown(run_dir: Path) -> list[str]:
    """Processes of the latest restart that joined RPC and ended without beginning
    ``rpc.shutdown()`` (they failed, were killed, or exited first): their RPC names."""
    with StoreReader(run_dir) as s:
        return s.ended_without_shutdown(s.latest_restart())


def _with_recorded_ranks(s: StoreReader, rows: list[sqlite3.Row], restart: int) -> list[Any]:
    """The store's ranks, and any rank the run record has that the store does not yet: the
    store lags run.json by up to a commit (~0.2 s), and a launcher killed in that window never
    writes it; the record, written first, still names the rank and its pid."""
    if s.record is None or s.record.restarts != restart:
        return list(rows)
    stored = {row["rank"] for row in rows}
    recorded = [
        {
            "rank": r.rank,
            "restart": restart,
            "pid": r.pid,
            "local_rank": r.local_rank,
            "device": r.device,
            "state": r.state,
            "exit_code": r.exit_code,
            "started_at": epoch_of(r.started_at),
            "ended_at": epoch_of(r.ended_at),
        }
        for r in s.record.ranks
        if r.rank not in stored and r.pid is not None
    ]
    return sorted([*rows, *recorded], key=lambda row: row["rank"])


def _without_launcher(s: StoreReader, pid: int | None) -> RankStatus:
    """A process the record left running when its launcher died (``kill -9``): ``orphaned``
    if it still lives (as one of the run's: ``rpcctl stop`` kills it), else ``lost`` (the
    rank server killed it with the launcher; its exit status was never recorded)."""
    alive = pid is not None and s.record is not None and process_in_run(pid, s.record.run_id)
    return RankStatus.ORPHANED if alive else RankStatus.LOST


def _here(proc: sqlite3.Row | None) -> bool:
    """The process runs on this host (a multi-node run's store names ranks on every node)."""
    return proc is None or proc["host"] in (None, _HOST)


def _worker(s: StoreReader, proc: sqlite3.Row | None, rank: sqlite3.Row | None, restart: int) -> WorkerRecord:
    ended = proc["ended_at"] if proc is not None else None
    code = column(proc, "exit_code") if rank is None else rank["exit_code"]
    reaped = rank is None and code is not None
    if rank is not None:
        state = RankStatus(rank["state"])
    elif reaped:  # a spawned child, whose exit status its parent told
        state = RankStatus.SUCCEEDED if code == 0 else RankStatus.FAILED if code > 0 else RankStatus.KILLED
        code = code if code >= 0 else None  # a signal: no exit code, as for a rank
    else:
        state = RankStatus.RUNNING if ended is None and s.live else RankStatus.EXITED
    if s.launcher_gone and ended is None and (not state.is_terminal or (rank is None and not reaped)):
        state = _without_launcher(s, rank["pid"] if rank is not None else proc["pid"])
    pid = rank["pid"] if rank is not None else (proc["pid"] if proc is not None else None)
    if state == RankStatus.RUNNING and s.live and pid is not None and _here(proc) and stacks.stopped(pid):
        state = RankStatus.STOPPED  # SIGSTOP, Ctrl-Z: it runs nothing until SIGCONT, whatever its last probe said
    running = state == RankStatus.RUNNING and proc is not None and ended is None and s.live
    age = max(0.0, s.now - proc["last_seen"]) if running and proc["last_seen"] is not None else None
    placed = rank["device"] if rank is not None else None
    probed = proc["device"] if proc is not None else None
    device = probed if probed and probed != "cpu" else (placed or probed)
    started = rank["started_at"] if rank is not None else (proc["connected_at"] if proc is not None else None)
    finished = rank["ended_at"] if rank is not None and rank["ended_at"] is not None else ended
    return WorkerRecord(
        rank=rank["rank"] if rank is not None else (proc["rank"] if proc is not None else None),
        name=proc["name"] if proc is not None else None,
        host=proc["host"] if proc is not None else None,
        pid=rank["pid"] if rank is not None else proc["pid"],
        state=state,
        exit_code=code,
        cpu_percent=proc["cpu_percent"] if proc is not None and running else None,
        rss_bytes=proc["rss_bytes"] if proc is not None and running else None,
        device=device,
        gpu_memory_bytes=proc["gpu_memory_bytes"] if proc is not None and running else None,
        heartbeat_age_s=age,
        stale=age is not None and age > protocol.STALE_AFTER_S,
        kind=proc["kind"] if proc is not None and proc["kind"] else "rank",
        rpc_rank=proc["rpc_rank"] if proc is not None else None,
        parent_pid=proc["ppid"] if proc is not None else None,
        threads=proc["threads"] if proc is not None and running else None,
        restart=restart,
        cuda_visible_devices=proc["cuda_visible_devices"] if proc is not None else None,
        device_maps=loads(proc["device_maps"]) if proc is not None else None,
        dropped_events=int(proc["dropped"] or 0) if proc is not None else 0,
        started_at=iso_time(started),
        ended_at=iso_time(finished),
        cpu_s=column(proc, "cpu_s"),
        telemetry_cpu_s=column(proc, "telemetry_cpu_s"),
        dist_rank=column(proc, "dist_rank"),
        pg_world=column(proc, "pg_world"),
        world=(column(proc, "world") or 0) if proc is not None and proc["rpc_join_at"] is not None else None,
    )


# -- a job of several launches --------------------------------------------------------------------

SHARED_WINDOW_S = 5.0  # two stores of one job were open at once; this much slack for the clocks of their openings


@dataclass
class SharedWorld:
    """An RPC world this run's processes met in with processes of other launches: a job whose
    ranks are started one launch each (pytorch/examples' parameter server: ``--rank 0``, ``--rank
    1``, ...). Found by where the world met (its rendezvous address and size, which each store
    keeps) among the runs of the same runs directory whose stores were open at the same time.
    ``missing``: the world's workers that no run found there has (another host, another runs
    directory, telemetry off)."""

    world: int  # this run's number for it
    rendezvous: str
    world_size: int | None
    ours: list[str]
    others: list[tuple[str, Path, int, list[str]]]  # (run id, run directory, its world number, its workers)
    missing: list[str]

    def describe(self) -> str:
        runs = ", ".join(f"{run_id} ({', '.join(names) or '?'})" for run_id, _, _, names in self.others)
        where = f" in {self.others[0][1].parent}" if self.others else ""
        text = (
            f"RPC world {self.world} ({self.rendezvous}, {self.world_size} workers) is one job with "
            f"{len(self.others)} other run{'s' if len(self.others) != 1 else ''}{where}: {runs or 'none found'}"
        )
        if self.missing:
            text += (
                f"; {', '.join(self.missing)} {'is' if len(self.missing) == 1 else 'are'} "
                "in no run of this runs directory"
                " (another host or runs directory): not shown"
            )
        return text


def _rpc_worlds(s: StoreReader, restart: int) -> dict[int, tuple[str, int | None]]:
    prefix = f"rpc_world.{restart}."
    found = {}
    for key, value in s.meta.items():
        if key.startswith(prefix) and key[len(prefix) :].isdigit() and isinstance(value, dict) and value.get("rdv"):
            found[int(key[len(prefix) :])] = (str(value["rdv"]), value.get("world_size"))
    return found


def _world_names(s: StoreReader, restart: int) -> tuple[dict[int, dict[int, str]], dict[int, set[str]]]:
    """Each world's workers as its processes were told them (rank → name), and the names of the
    processes of this run in it."""
    told: dict[int, dict[int, str]] = {}
    for row in s.rpc_workers(restart):
        told.setdefault(column(row, "world") or 0, {})[row["rpc_rank"]] = row["name"]
    ours: dict[int, set[str]] = {}
    for row in s.procs(restart):
        if row["name"]:
            ours.setdefault(column(row, "world") or 0, set()).add(row["name"])
    return told, ours


def _open_span(s: StoreReader) -> tuple[float, float]:
    opened = s.meta.get("opened_at")
    closed = s.closed_at
    return (
        float(opened) if isinstance(opened, (int, float)) else 0.0,
        float(closed) if isinstance(closed, (int, float)) else float("inf"),
    )


def shared_worlds(run_dir: Path, restart: int | None = None) -> list[SharedWorld]:
    """The RPC worlds of this run (its latest restart) whose workers this run does not all have,
    each with the runs beside it that have the others (``SharedWorld``)."""
    run_dir = Path(run_dir)
    with StoreReader(run_dir) as s:
        restart = s.latest_restart() if restart is None else restart
        worlds, (told, ours), span = _rpc_worlds(s, restart), _world_names(s, restart), _open_span(s)
    partial = {w: where for w, where in worlds.items() if (where[1] or 0) > len(ours.get(w, ()))}
    if not partial:
        return []
    found: dict[int, list[tuple[str, Path, int, list[str]]]] = {w: [] for w in partial}
    for other in sorted(run_dir.parent.iterdir()) if run_dir.parent.is_dir() else ():
        if other.resolve() == run_dir.resolve() or not protocol.db_path(other).is_file():
            continue
        try:
            with StoreReader(other) as o:
                theirs = _rpc_worlds(o, o.latest_restart())
                start, end = _open_span(o)
                if start > span[1] + SHARED_WINDOW_S or end < span[0] - SHARED_WINDOW_S:
                    continue
                matches = [(w, ow) for w, where in partial.items() for ow, there in theirs.items() if there == where]
                names = _world_names(o, o.latest_restart())[1] if matches else {}
        except Exception:  # noqa: BLE001 - a damaged or foreign store beside this one: not part of the answer
            continue
        for w, ow in matches:
            found[w].append((other.name, other, ow, sorted(names.get(ow, ()))))
    shared = []
    for w, (rdv, size) in sorted(partial.items()):
        seen = set(ours.get(w, ())) | {n for *_, names in found[w] for n in names}
        missing = [name for _, name in sorted(told.get(w, {}).items()) if name and name not in seen]
        shared.append(SharedWorld(w, rdv, size, sorted(ours.get(w, ())), found[w], missing))
    return shared


def shutdown_waits(run_dir: Path) -> str | None:
    """Who this run's processes wait for in ``rpc.shutdown()``: torch's shutdown ends only when
    every worker of the world has called it, so those still in it (begun, not returned, alive)
    wait for the workers that have not, found in this run and in the runs it is one job with
    (``shared_worlds``). One line, e.g. ``ps (pid 7) waits in rpc.shutdown for trainer_2, which
    ended without calling it (run R, exit code 1)``; None where no one waits there."""
    run_dir = Path(run_dir)
    with StoreReader(run_dir) as s:
        restart = s.latest_restart()
        rows = s.procs(restart)
        told, _ = _world_names(s, restart)
    inside = [
        r
        for r in rows
        if r["rpc_shutdown_at"] is not None and column(r, "rpc_shutdown_done_at") is None and r["ended_at"] is None
    ]
    if not inside:
        return None
    # name -> (its row, the run it is in: None for this one)
    known: dict[tuple[int, str], tuple[Any, str | None]] = {
        ((column(r, "world") or 0), r["name"]): (r, None) for r in rows if r["name"]
    }
    for world in shared_worlds(run_dir, restart):
        for run_id, other_dir, their_world, _ in world.others:
            try:
                with StoreReader(other_dir) as o:
                    for row in o.procs(o.latest_restart()):
                        if row["name"] and (column(row, "world") or 0) == their_world:
                            known[(world.world, row["name"])] = (row, run_id)
            except Exception:  # noqa: BLE001 - a damaged store beside this one
                continue
    parts = []
    for world in sorted({column(r, "world") or 0 for r in inside}):
        waiting = [r for r in inside if (column(r, "world") or 0) == world]
        late = []
        for _, name in sorted(told.get(world, {}).items()):
            row, run_id = known.get((world, name), (None, None))
            there = f"run {run_id}, " if run_id else ""
            if row is None:
                late.append(f"{name}, which no run here has (another host or runs directory?)")
            elif row["rpc_shutdown_at"] is None and row["ended_at"] is not None:
                code = f"exit code {row['exit_code']}" if column(row, "exit_code") is not None else "ended"
                late.append(f"{name}, which ended without calling it ({there}{code})")
            elif row["rpc_shutdown_at"] is None:
                late.append(f"{name}, which has not called it" + (f" ({run_id})" if run_id else ""))
        if late:
            who = ", ".join(f"{r['name'] or 'process'} (pid {r['pid']})" for r in waiting)
            parts.append(f"{who} {'waits' if len(waiting) == 1 else 'wait'} in rpc.shutdown for {'; '.join(late)}")
    return "; ".join(parts) or None
