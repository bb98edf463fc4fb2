"""The hang watchdog: notice that a job stopped moving, keep the evidence, name the suspect.

Progress, precisely: a line of output from any rank, a loss or metrics record (printed or
``rpcctl.report``), the end (ok, error or timeout) of any RPC call in any rank or process a
rank spawned, or a process that starts (connects to telemetry) or enters ``init_rpc``. Not
progress: heartbeats and probes (a hung process still sends them), RRef bookkeeping, torch's own
calls (shutdown's barrier), a call that is still running.

The supervisor calls ``check()`` from its loop (at most once a second does work). A silence is
only a suspicion: telemetry's silence is not the job's. So, in a job that uses RPC or a process
group (a process entered ``init_rpc`` or ``init_process_group``):

- While telemetry is impaired (``TelemetryServer.health()``: the store cannot be written, the
  server stopped or stopped reading, a fault of its own), the watchdog says so once, declares
  nothing, and counts silence only from when it is healthy again.
- When no progress was seen for ``hang_timeout`` (less ``confirm_s``), it looks at the processes
  (``hang_evidence.Look``: their stacks and main threads' CPU), and again ``confirm_s`` later. A
  process that moved in between (its stack changed, or it computed with nothing in flight) is
  progress: no verdict, said once. Only with evidence that nothing moves (processes seen still
  twice, stopped ones, or another node's with a call or collective in flight for the whole
  timeout) does it:

1. keep the second look's stacks (the ranks and the processes they spawned; a stopped process
   cannot answer and is said to be stopped) and, read from outside by py-spy, every process's
   native stacks (``Look.read_native``: each process within ``NATIVE_TIMEOUT_S``; where ptrace is
   refused, one line says how to allow it), and with NVIDIA GPUs each one's memory and use and
   the processes on it (``nvidia-smi``: no CUDA in the launcher) as detail lines and ``gpus.json``,
2. snapshot the calls in flight and the callees' view (``rpcctl.inspect.calls``),
3. write ``stacks.txt``, ``calls.json`` and ``diagnosis.txt`` into ``<run_dir>/hang/``
   (``hang-2/``… for later reports), owner-only, as far as the disk lets it (the verdict does not
   wait on the evidence: a full disk costs one warning),
4. make the diagnosis: the wait chain from the oldest call in flight to the process at its
   end, what that process is running and where (file, line, the source line: the lock it
   waits on), a cycle of workers if the chain comes back (a deadlock); else the rank that
   never joined RPC (or ended without), else where the ranks' main threads are,
5. return the failure (root cause: hang, the diagnosis its message and details; the job is
   torn down, exit 1, and the verdict prints it) or, with ``on_hang: keep``, print the
   diagnosis, keep the job and report again only after progress resumed and stopped.

Earlier, within ``JOIN_WARN_S`` (or half ``hang_timeout`` if shorter) of the first process
entering ``init_rpc``, a rank that has not entered it yet is named with where it is, once. A
rank whose spawned processes entered it (an ``mp.spawn`` program) has joined, through them.

In any job (RPC or not), a rank whose telemetry heartbeat is older than ``STALE_AFTER_S`` has a
sender thread that cannot run (a long C call holding the GIL, a starved or stopped process): its
stack is dumped into ``stacks/rank-N.txt`` at once and the rank named with where it is, once per
silence (again only after it beat again). Nothing ends on that alone: the hang timeout decides.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcctl import inspect

from rpcctl.base import gpu_now, native_stacks, stacks
from rpcctl.console import epoch_of, human_seconds, to_jsonable
from rpcctl.supervise.hang_diagnosis import Diagnosis, Proc, diagnose  # noqa: F401 - diagnose: the diagnosis, in hang_diagnosis
from rpcctl.supervise.hang_evidence import Look, motion, parse_stacks, still, where
from rpcctl.supervise.hang_evidence import ThreadStack as ThreadStack  # noqa: F401 - the parsed stacks, where tests and benchmarks read them
from rpcctl.inspect.calls import CallsReport
from rpcctl.records.runs import Failure, RunRecord, now_iso, write_json_atomic
from rpcctl.base.states import CallState, RankStatus
from rpcctl.wire.protocol import STALE_AFTER_S

JOIN_WARN_S = 20.0
CHECK_EVERY_S = 1.0
DUMP_TIMEOUT_S = 2.0
RELAY_QUIET_S = 3.0  # every process of another node unheard for this long (3 probes): its relay is suspect
CONFIRM_MAX_S = 15.0  # the two looks before a verdict are a quarter of hang_timeout apart, 1 s to this


# ---------------------------------------------------------------------------------------------
# The watchdog the supervisor runs


class HangWatchdog:
    """The supervisor's hang watchdog. On a multi-node run it runs on node 0, whose store has
    every node's telemetry: it detects and diagnoses the hang for the whole job, and dumps the
    stacks of this node's processes only (a pid of another node means nothing here; those are
    named with their host, and a failure it declares tears every node down as any failure does).
    ``health``: the telemetry server's ``health`` (None: trusted as is)."""

    def __init__(
        self, run_dir: Path, timeout: float, keep: bool, console: Any, health: Callable[[], Any] | None = None
    ):
        self.run_dir = Path(run_dir)
        self.timeout = timeout
        self.keep = keep
        self.console = console
        self.health = health
        self.join_warn_s = min(JOIN_WARN_S, timeout / 2)  # named before the hang is declared
        self.confirm_s = min(max(timeout / 4, 1.0), CONFIRM_MAX_S)  # the time between the two looks
        self._output_at = time.time()
        self._next_check = 0.0
        self._restart = 0
        self._warned_join: set[int] = set()
        self._warned_pg: set[int] = set()
        self._groups: list[inspect.StoredGroup] = []  # the process groups of the live processes, as of the last check
        self._ended: list[Proc] = []  # the attempt's ranks that have ended, as of the last check
        self._pg_through: dict[int, float] = {}  # rank → when a process it spawned entered init_process_group
        self._silent: set[int] = set()  # proc ids whose stale heartbeat was reported (until it beats again)
        self._reported_at: float | None = None
        self._impaired: str | None = None  # why telemetry cannot be trusted, as last said
        self._back_at = 0.0  # when telemetry was last trusted again after an impairment
        self._first: tuple[float, Look] | None = None  # (the progress it saw, the first look) of a silence
        self._moved_at = 0.0  # when a look last saw a process move (progress the store did not see)
        self._said: set[str] = set()  # notes said once a run
        self._unwritten = False  # the evidence could not be written (said once)
        self.reports = 0
        self._gpus: list[Any] | None = None  # nvidia-smi's answer at the last verdict (None: no NVIDIA GPU)

    def output_line(self) -> None:
        """A rank printed a line (the log pump's thread: one assignment, no lock needed)."""
        self._output_at = time.time()

    def attempt_started(self, restart: int) -> None:
        self._restart = restart
        self._output_at = time.time()
        self._warned_join.clear()
        self._warned_pg.clear()
        self._silent.clear()
        self._reported_at = None
        self._first = None

    def check(self, record: RunRecord) -> Failure | None:
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_EVERY_S
        healthy_since, why = self._server_health()
        seen = None
        if why is None:
            try:
                # one read a check; the dumps wait until it is closed
                seen = inspect.progress(self.run_dir, self._restart)
            except Exception as exc:  # noqa: BLE001 - a store that cannot be read is telemetry impaired, not a hang
                why = f"the telemetry store cannot be read ({exc})"
        if why is None:
            why = _relay_silent(seen.running, record, max(healthy_since, self._back_at))
        if why is not None:
            self._impair(why)
            return None
        if self._impaired is not None:  # back: a silence counts from now, whatever the store last saw
            self.console.info("rpcctl: telemetry is back: the hang watchdog watches again, counting silence from now")
            self._impaired, self._back_at = None, time.time()
        healthy_since = max(healthy_since, self._back_at)
        facts = self._facts(seen, record)
        self._dump_silent_ranks(seen.running, record, healthy_since)
        if facts is None:
            self._say_unwatched(record)
            return None
        procs, progress_at, first_join, first_pg_join = facts
        wall = time.time()
        if first_join is not None:
            self._warn_absent(procs, record, first_join, wall)
        if first_pg_join is not None:
            self._warn_absent(procs, record, first_pg_join, wall, group=True)
        progress_at = max(progress_at, self._output_at, healthy_since, self._moved_at)
        if self._reported_at is not None:
            if progress_at <= self._reported_at:
                return None
            self._reported_at = None  # it moved again: a new stall will be reported
        stalled = wall - progress_at
        if stalled < self.timeout - self.confirm_s:
            self._first = None
            return None
        if self._first is None or self._first[0] != progress_at:
            self._first = (progress_at, self._look(procs, record))
            return None
        first = self._first[1]
        if stalled < self.timeout or time.monotonic() - first.at < self.confirm_s:
            return None
        self._first = None
        second = self._look(procs, record)
        calls = inspect.calls(self.run_dir, restart=self._restart)
        if not self._nothing_moves(procs, first, second, calls, stalled):
            return None
        diagnosis, folder = self.report(procs, record, stalled, second, calls)
        self._reported_at = wall
        evidence = f"{folder}" if folder is not None else "not written (see the warning above)"
        if self.keep:
            self.console.warn(f"hang: {diagnosis.headline}")
            for line in diagnosis.details:
                self.console.info(f"  {line}")
            self.console.info(f"  stacks, calls and this diagnosis: {evidence}")
            self.console.info("  on_hang: keep — the job keeps running")
            return None
        # The verdict, once the job is down, gives the diagnosis (its root cause): said once.
        self.console.warn(f"hang: no progress for {human_seconds(stalled)}; stopping the job (the diagnosis follows)")
        suspect = diagnosis.suspect
        details = "".join(f"  {line}\n" for line in diagnosis.details)  # the message is the headline
        return Failure(
            rank=-1,
            pid=suspect.pid if suspect is not None else None,
            exit_code=None,
            signal=None,
            reason="hang",
            message=f"hang: {diagnosis.headline}",
            timestamp=now_iso(),
            traceback=f"{details}evidence: {evidence}\n",
        )

    # -- is the silence the job's? ----------------------------------------------------------------
    def _server_health(self) -> tuple[float, str | None]:
        """Since when the telemetry server has been trustworthy without a break, and why it is not
        now (None: it is)."""
        if self.health is None:
            return 0.0, None
        try:
            health = self.health()
        except Exception as exc:  # noqa: BLE001 - a health check that fails says telemetry is not known good
            return 0.0, f"its health could not be read ({exc!r})"
        return health.healthy_since, health.impaired

    def _impair(self, why: str) -> None:
        """Telemetry cannot be trusted now: no verdict, no look, said once an episode."""
        self._first = None
        if self._impaired is None:
            self.console.warn(f"{why}: the hang watchdog declares no hang while telemetry is impaired; the job goes on")
        self._impaired = why

    def _look(self, procs: list[Proc], record: RunRecord) -> Look:
        """This node's running ranks and their processes, now (stacks and CPU)."""
        ranks = [(p.rank, p.pid) for p in procs if p.kind == "rank" and p.local and p.rank is not None]
        running = {s.rank for s in record.ranks if s.state == RankStatus.RUNNING}
        return Look.take(self.run_dir, [(rank, pid) for rank, pid in ranks if rank in running])

    def _nothing_moves(self, procs: list[Proc], first: Look, second: Look, calls: CallsReport, stalled: float) -> bool:
        """Whether the two looks (and, for processes no look reaches, the store) show that nothing
        moves. If a process moved, that is progress: said once a run, and the silence starts again."""
        by_id = {p.proc_id: p for p in procs}
        in_flight = {c.caller_proc for c in calls.pending if c.state == CallState.PENDING}
        in_flight |= {g.proc_id for g in self._groups if g.inside}
        waiting = {by_id[i].pid for i in in_flight if i in by_id}
        moved = motion(first, second, waiting)
        if moved:
            self._moved_at = time.time()
            self._say_once(
                "moved",
                f"rpcctl: no progress reached telemetry for {human_seconds(stalled)}, but the job moves "
                f"({'; '.join(moved[:3])}): no hang",
            )
            return False
        # another node's, waiting the whole time
        elsewhere = [p for p in procs if not p.local and p.proc_id in in_flight]
        if still(first, second) or elsewhere or any(p.stopped for p in procs):
            return True
        self._moved_at = time.time()  # nothing to show either way: look again after another timeout
        missed = "; ".join(second.missed[:3]) or "no process of this node could be looked at"
        self._say_once(
            "blind",
            f"rpcctl: no progress reached telemetry for {human_seconds(stalled)}, and nothing shows the job "
            f"is stuck ({missed}): no hang declared",
        )
        return False

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.console.info(message)

    def _say_unwatched(self, record: RunRecord) -> None:
        """A job in which no process entered init_rpc or init_process_group once the timeout is up:
        said once, so that a hang_timeout set for it (a Monarch job, a plain script) is not
        thought to watch it."""
        started = epoch_of(record.started_at)
        if started is not None and time.time() - started >= self.timeout and "unwatched" not in self._said:
            self._say_once(
                "unwatched",
                f"rpcctl: hang_timeout ({human_seconds(self.timeout)}): no process of this job has entered "
                "init_rpc or init_process_group yet, so the hang watchdog has nothing to judge it by (it reads torch "
                "RPC calls and collectives, from the first process that enters one; a Monarch job's actors are not "
                "watched)",
            )

    # -- evidence ------------------------------------------------------------------------------
    def _facts(
        self, seen: inspect.Progress, record: RunRecord
    ) -> tuple[list[Proc], float, float | None, float | None] | None:
        """Processes of this attempt, the last progress the store saw, the first init_rpc and the
        first init_process_group; None while no process of the job entered either (the job
        uses no torch.distributed, or not yet)."""
        rows = seen.running
        joins = [r.rpc_join_at for r in rows if r.rpc_join_at is not None]
        pg_joins = [r.pg_join_at for r in rows if r.pg_join_at is not None]
        if not joins and not pg_joins:
            return None
        # A collective completing is progress (rank.collectives: the cycle that saw it).
        self._groups = seen.groups
        completed = [g.completed_at for g in self._groups if g.completed_at is not None]
        # A process that connects or enters init_rpc moves the job on too (the fork server may
        # take seconds to start the ranks).
        starts = [r.connected_at for r in rows] + joins + pg_joins + completed
        progress = max([m for m in (*seen.marks, *starts) if m is not None] or [0.0])
        procs = [_proc(r, record) for r in rows]
        self._ended = _ended(seen.ended, record)
        # A rank whose spawned processes joined RPC (an mp.spawn program: the rank waits in
        # mp.spawn, its children are the workers) has joined, through them; those may have ended.
        # So for init_process_group, but the rank is not in their groups (``_warn_absent`` only).
        self._pg_through = seen.pg_joined_through
        through = seen.joined_through
        for proc in procs:
            if proc.kind == "rank" and proc.joined_at is None and proc.rank in through:
                proc.joined_at = through[proc.rank]
        return procs, progress, min(joins) if joins else None, min(pg_joins) if pg_joins else None

    def _dump_silent_ranks(self, rows: list[inspect.StoredProcess], record: RunRecord, healthy_since: float) -> None:
        """A rank whose telemetry heartbeat went stale: its sender thread cannot run (the GIL held
        by a long C call, a starved or stopped process). Dump its stack then, once per silence,
        while the evidence is live: the hang timeout may be minutes away, or never come. A beat
        the server could not have read (it was impaired) is not missed."""
        wall = time.time()
        for row in rows:
            beating = row.stopped_at is None and row.last_seen is not None  # stopped_at: it said goodbye
            silent = beating and wall - max(row.last_seen, healthy_since) > STALE_AFTER_S
            if not silent:
                self._silent.discard(row.proc_id)
                continue
            if row.proc_id in self._silent or (row.kind or "rank") != "rank":
                continue
            self._silent.add(row.proc_id)
            proc = _proc(row, record)
            self._dump(proc, record)
            quiet = f"{proc.describe()} has sent no telemetry heartbeat for {human_seconds(wall - row.last_seen)}"
            if not proc.local:
                self.console.warn(f"{quiet}{proc.elsewhere}")
                continue
            if proc.stopped:
                self.console.warn(f"{quiet}: it is stopped (SIGSTOP); `kill -CONT {proc.pid}` resumes it")
                continue
            at = where(proc.main_thread())
            self.console.warn(
                f"{quiet} (its telemetry thread cannot run: a long call holding the GIL?)"
                + (f"; it is at {at}" if at else "")
                + f"; stacks in stacks/rank-{proc.rank}.txt"
            )

    def _warn_absent(
        self, procs: list[Proc], record: RunRecord, first_join: float, wall: float, group: bool = False
    ) -> None:
        """Name, once, a rank that has not entered init_rpc (``group``: init_process_group) while
        another did ``join_warn_s`` ago."""
        if wall - first_join < self.join_warn_s:
            return
        warned, what = (self._warned_pg, "entered init_process_group") if group else (self._warned_join, "joined RPC")
        connected = {p.rank for p in procs if p.kind == "rank"}
        for proc in procs:
            if (
                proc.kind != "rank"
                or (proc.pg_joined_at if group else proc.joined_at) is not None
                or proc.rank in warned
            ):
                continue
            if group and proc.rank in self._pg_through:
                continue
            warned.add(proc.rank)
            self._dump(proc, record)
            at = where(proc.main_thread())
            state = (
                "it is stopped (SIGSTOP)" if proc.stopped else (f"it is at {at}" if at else "its stack did not come")
            )
            if not proc.local:
                state = proc.elsewhere.lstrip("; ")
            self.console.warn(f"{proc.describe()} has not {what} after {human_seconds(wall - first_join)}; {state}")
        for state in record.ranks:  # a rank whose telemetry never connected is absent too
            if state.state == RankStatus.RUNNING and state.rank not in connected and state.rank not in warned:
                warned.add(state.rank)
                self.console.warn(
                    f"rank {state.rank} (pid {state.pid}) has not {what} after {human_seconds(wall - first_join)}"
                    " and never reported: see `rpcctl stack`"
                )

    def _dump(self, proc: Proc, record: RunRecord) -> list[Any]:
        """Dump a rank (and its children) unless it is stopped; fill in the threads."""
        from rpcctl.base.errors import RpcctlError

        if not proc.local:
            return []
        proc.stopped = stacks.stopped(proc.pid)
        if proc.stopped or proc.kind != "rank" or proc.rank is None:
            return []
        try:
            dumps = inspect.dump_stacks(self.run_dir, proc.rank, timeout=DUMP_TIMEOUT_S)
        except RpcctlError:
            return []
        proc.dumped = True
        proc.threads = parse_stacks(dumps[0].text or "")
        return dumps

    def report(
        self, procs: list[Proc], record: RunRecord, stalled: float, look: Look, calls: CallsReport
    ) -> tuple[Diagnosis, Path | None]:
        """The diagnosis from ``look`` (the processes' stacks) and ``calls``, and the evidence written
        as far as the disk lets it (the folder, or None if none of it could be written)."""
        if not look.read_native():  # the verdict's own evidence: native frames, each process bounded
            self._say_once("ptrace", f"rpcctl: {native_stacks.refused_hint()}")
        for proc in procs:
            seen = look.seen.get(proc.pid) if proc.local else None
            if seen is not None:
                proc.threads, proc.stopped, proc.dumped = seen.threads, seen.stopped, seen.text is not None
        texts = [
            f"── {p.describe()} ──\n(not dumped from this node{p.elsewhere})\n"
            for p in procs
            if p.kind == "rank" and not p.local
        ]
        by_pid = {p.pid: p for p in procs}
        texts += look.texts(
            lambda seen: by_pid[seen.pid].describe() if seen.pid in by_pid else f"rank {seen.rank} (pid {seen.pid})"
        )
        try:  # who a shutdown waits for, in this run or the runs it is one job with
            shutdown = inspect.shutdown_waits(self.run_dir)
        except Exception:  # noqa: BLE001 - a courtesy: the diagnosis stands without it
            shutdown = None
        diagnosis = diagnose(procs, calls, stalled, self._groups, self._ended, shutdown)
        self._gpus = gpu_now.snapshot()  # each GPU's memory and use at the verdict (nvidia-smi: no CUDA here)
        diagnosis.details.extend(g.describe({p.pid: p.describe() for p in procs}) for g in self._gpus or [])
        self.reports += 1
        return diagnosis, self._write_evidence(texts, calls, diagnosis)

    def _write_evidence(self, texts: list[str], calls: CallsReport, diagnosis: Diagnosis) -> Path | None:
        """Best effort: a full disk or a removed run directory costs one warning, never the verdict."""
        name = "hang" if self.reports <= 1 else f"hang-{self.reports}"
        folder = self.run_dir / name
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            _write_private(folder / "diagnosis.txt", diagnosis.text())  # the smallest and most wanted first
            _write_private(folder / "stacks.txt", "\n".join(texts))
            write_json_atomic(folder / "calls.json", to_jsonable(calls))
            if self._gpus:
                write_json_atomic(folder / "gpus.json", to_jsonable(self._gpus))
        except OSError as exc:
            if not self._unwritten:
                self._unwritten = True
                self.console.warn(
                    f"could not write the hang evidence into {folder}: {exc.strerror or exc} (the verdict stands)"
                )
            return folder if (folder / "diagnosis.txt").is_file() else None
        return folder


def _proc(row: inspect.StoredProcess, record: RunRecord) -> Proc:
    """A process as the watchdog sees it; local: a process of one of this node's ranks."""
    local = row.rank in {r.rank for r in record.ranks}
    return Proc(
        row.proc_id,
        row.pid,
        row.rank,
        row.kind or "rank",
        row.name,
        row.rpc_join_at,
        host=row.host,
        local=local,
        pg_joined_at=row.pg_join_at,
        dist_rank=row.dist_rank,
        pg_world=row.pg_world or 0,
    )


def _relay_silent(rows: list[inspect.StoredProcess], record: RunRecord, since: float) -> str | None:
    """Another node whose every process went quiet at once: what stopped is more likely its
    launcher's relay (or the way to node 0) than all of its ranks together; its silence is not
    the job's. None when every other node is heard from."""
    here = {s.rank for s in record.ranks}
    hosts: dict[str, list[inspect.StoredProcess]] = {}
    for row in rows:
        if row.rank not in here and row.stopped_at is None and row.last_seen is not None:
            hosts.setdefault(row.host or "another node", []).append(row)
    wall = time.time()
    for host, beating in sorted(hosts.items()):
        quiet = min(wall - max(r.last_seen, since) for r in beating)
        if quiet > RELAY_QUIET_S:
            return (
                f"telemetry from {host} has stopped (none of its {len(beating)} processes heard from for "
                f"{human_seconds(quiet)}: its launcher's relay?)"
            )
    return None


def _ended(rows: list[inspect.StoredProcess], record: RunRecord) -> list[Proc]:
    """The attempt's ranks that ended (the record says how), as the diagnosis names them."""
    states = {s.rank: s for s in record.ranks if s.state.is_terminal}
    ended = []
    for row in rows:
        state = states.get(row.rank)
        if state is None or state.pid != row.pid:
            continue
        proc = _proc(row, record)
        proc.ended = f"exited with code {state.exit_code}" if state.signal is None else f"was killed by {state.signal}"
        ended.append(proc)
    return ended


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
