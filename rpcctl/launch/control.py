"""A run from outside its launcher: follow it, stop it, end it when its launcher died.

What the CLI's ``logs -f``, ``--watch`` views and ``stop`` call (the facade, beside
``rpcctl.launch.launcher``): the CLI never signals, kills or polls a run's processes itself.

    follow(run_dir) ──▶ False, False, ..., True   (its status is terminal, or its launcher is gone)
    stop(run_dir)   ──▶ SIGTERM to the verified launcher, which tears the ranks down; wait for the record
                    └─▶ a lost run: kill what it left alive (``end_lost_run``), close its record
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rpcctl.base.errors import RpcctlError, RunNotFoundError, UsageError
from rpcctl.processes.procs import kill_processes, run_processes
from rpcctl.records.runs import Failure, RunRecord, launcher_alive, launcher_of_run, load_record, now_iso, save_record
from rpcctl.base.states import RankStatus, RunStatus


def ended(run_dir: Path) -> bool:
    """Whether nothing more will happen to the run: its status is terminal, its launcher is
    gone (a lost run), or the run is gone."""
    try:
        return load_record(run_dir).effective_status.is_terminal
    except RunNotFoundError:
        return True


def follow(run_dir: Path, every: float) -> Iterator[bool]:
    """Follow a run: yield now, then every ``every`` seconds, whether it has ended; the last
    value yielded is True. A reader does its round after each (a run that ended has written
    all it will)."""
    while True:
        done = ended(run_dir)
        yield done
        if done:
            return
        time.sleep(every)


@dataclass
class Stopped:
    """What ``stop`` did: the run's record as it ended; for a lost run, what was found of it
    (``lost.orphans``: the processes it killed)."""

    record: RunRecord
    lost: LostRun | None = None


def stop(run_dir: Path, wait: float) -> Stopped:
    """Cancel a live run cleanly: SIGTERM to its launcher (verified to be the run's: a record is
    only a file), which tears the ranks down; wait up to ``wait`` seconds for its record to end.
    A run whose launcher died: kill what it left alive and close its record."""
    record = load_record(run_dir)
    if record.status != RunStatus.RUNNING:
        raise UsageError(f"run {record.run_id} is not running (status: {record.status})")
    if not launcher_alive(record):
        lost, left = end_lost_run(record)
        if left:
            pids = ", ".join(str(p.pid) for p in left)
            raise RpcctlError(f"run {record.run_id}: {lost.story()}; pid {pids} would not die (SIGKILL sent)")
        return Stopped(record, lost)
    launcher = _wait_for_launcher(record)
    if launcher is None:
        raise RpcctlError(
            f"refusing to signal pid {record.launcher_pid}: it is not run {record.run_id}'s launcher "
            f"(not yours, or no rank server of the run under it); {run_dir / 'run.json'} is stale or forged"
        )
    try:
        launcher.send_signal(signal.SIGTERM)  # psutil checks the pid was not reused meanwhile
    except psutil.NoSuchProcess:
        pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        record = load_record(run_dir)
        if record.status.is_terminal:
            return Stopped(record)
        if not launcher_alive(record):
            break
        time.sleep(0.1)
    raise RpcctlError(f"run {record.run_id} did not stop within {wait:g}s (status: {record.effective_status})")


def _wait_for_launcher(record: RunRecord, timeout: float = 5.0) -> psutil.Process | None:
    """The run's verified launcher; a run that just started may not have its rank server yet."""
    deadline = time.monotonic() + timeout
    while True:
        launcher = launcher_of_run(record)
        if launcher is not None or time.monotonic() >= deadline or not launcher_alive(record):
            return launcher
        time.sleep(0.1)


# -- runs whose launcher died -----------------------------------------------------------------


@dataclass
class LostRun:
    """A run whose launcher died without ending it (``kill -9``, a crash, the OOM killer), and
    what of it still lives. Normally nothing: the rank server kills every rank when the launcher
    goes, and the ranks die with the rank server. Processes survive only if the rank server
    died too before it could (or a rank undid its death signal): they are *orphaned*, and
    ``rpcctl stop`` kills them. Every view tells this one story (``story``)."""

    record: RunRecord
    orphans: list[psutil.Process] = field(default_factory=list)

    def story(self) -> str:
        gone = f"its launcher (pid {self.record.launcher_pid}) is gone"
        if not self.orphans:
            return f"{gone}, and its ranks with it"
        pids = ", ".join(str(p.pid) for p in self.orphans[:8]) + (", ..." if len(self.orphans) > 8 else "")
        return (
            f"{gone}; {_processes(len(self.orphans))} orphaned (pid {pids}): "
            f"`rpcctl stop {self.record.run_id}` kills {'it' if len(self.orphans) == 1 else 'them'}"
        )

    def short(self) -> str:
        """The ROOT CAUSE cell of ``rpcctl runs``."""
        if not self.orphans:
            return f"launcher (pid {self.record.launcher_pid}) gone"
        return f"launcher gone; {_processes(len(self.orphans))} orphaned"


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def lost_runs(records: list[RunRecord]) -> dict[str, LostRun]:
    """The lost runs among ``records`` (status ``lost``, stored or because their launcher is
    gone), by run id, each with its orphaned processes (one scan of the process table)."""
    lost = [r for r in records if r.effective_status == RunStatus.LOST]
    found = run_processes({r.run_id for r in lost}) if lost else {}
    return {r.run_id: LostRun(r, found.get(r.run_id, [])) for r in lost}


def end_lost_run(record: RunRecord) -> tuple[LostRun, list[psutil.Process]]:
    """Kill what a lost run left alive and close its record (status ``lost``, ``ended_at``,
    its unfinished ranks ``lost``, the launcher's death as root cause). Returns the run as it
    was found and the processes that would not die."""
    lost = lost_runs([record]).get(record.run_id) or LostRun(record)
    left = kill_processes(lost.orphans) if lost.orphans else []
    ended = now_iso()
    if record.status == RunStatus.RUNNING:
        n = len(lost.orphans)
        killed = f"; `rpcctl stop` killed {n} orphaned process{'' if n == 1 else 'es'}" if n else ""
        message = f"the launcher (pid {record.launcher_pid}) died without ending the run{killed}"
        if record.root_cause is None:
            record.root_cause = Failure(-1, record.launcher_pid, None, None, "launcher", message, ended)
        record.reason = record.reason or message
        record.status, record.ended_at = RunStatus.LOST, ended
        for rank in record.ranks:
            if not rank.state.is_terminal:
                rank.state, rank.ended_at = RankStatus.LOST, ended
        save_record(record)
    return lost, left
