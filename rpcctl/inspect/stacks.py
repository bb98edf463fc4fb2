"""The stacks view: the Python stacks of a live rank and of the processes it started
(``dump_stacks``), through ``rpcctl.base.stacks``; their native stacks, read from outside by
py-spy (``native_stacks``, through ``rpcctl.base.native_stacks``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.base import native_stacks, stacks
from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.records.runs import load_record, rank_stack_file
from rpcctl.base.states import RankStatus


class StoppedRankError(RpcctlError):
    """The rank is stopped (SIGSTOP): no stack until it is resumed (exit 1)."""


@dataclass
class StackDump:
    """The Python stacks of one live process of a rank: the rank itself, or a process it
    started (``mp.spawn``, ``subprocess``) that registered for dumps (``rpcctl.base.stacks``)."""

    rank: int
    pid: int
    kind: str  # rank | child
    cmdline: list[str]
    text: str | None  # None: the child wrote nothing in time


def dump_stacks(run_dir: Path, rank: int, timeout: float = 5.0) -> list[StackDump]:
    """Ask a live rank to dump its Python stacks (``rpcctl.base.stacks``: its FIFO, then SIGUSR1), then every live
    process it started that can dump them; return the dumps in that order."""
    state = live_rank(run_dir, rank)
    if stacks.stopped(state.pid):  # it would never answer: say so at once
        raise StoppedRankError(stacks.stopped_message(f"rank {rank}", state.pid))
    descendants = stacks.registered_descendants(run_dir, state.pid)
    try:
        text = stacks.dump(state.pid, rank_stack_file(run_dir, rank), timeout)
    except ProcessLookupError:
        raise UsageError(f"rank {rank} (pid {state.pid}) exited before its stack could be dumped") from None
    except PermissionError:
        raise UsageError(f"not allowed to signal pid {state.pid} of rank {rank}") from None
    if text is None:
        raise UsageError(
            f"rank {rank} (pid {state.pid}) wrote no stack within {timeout:.0f} s: "
            "is faulthandler registered (rpcctl runtime)?"
        )
    dumps = [StackDump(rank, state.pid, "rank", [], text)]
    for pid, cmdline, path in descendants:
        if stacks.stopped(pid):
            dumps.append(StackDump(rank, pid, "child", cmdline, f"({stacks.stopped_message('it', pid)})\n"))
            continue
        try:
            child_text = stacks.dump(pid, path, timeout)
        except (ProcessLookupError, PermissionError):
            continue  # it exited meanwhile
        dumps.append(StackDump(rank, pid, "child", cmdline, child_text))
    return dumps


@dataclass
class NativeStackDump:
    """The native stacks of one live process of a rank (the rank, then each process under it, by
    pid: ``kind`` child), as py-spy read them from outside: ``dump.error`` says why not."""

    rank: int
    pid: int
    kind: str  # rank | child
    cmdline: list[str]
    dump: native_stacks.NativeDump


def native_stacks_of(
    run_dir: Path, ranks: list[int], timeout: float = native_stacks.TIMEOUT_S
) -> dict[int, list[NativeStackDump]]:
    """``rpcctl stack --native``: each live rank of ``ranks`` and every process under it, all read
    at once by one py-spy each, each within ``timeout`` (64 ranks cost one timeout, not 64). A
    stopped process is read as any other: ptrace needs nothing of it."""
    trees = {
        rank: (state.pid, native_stacks.tree(state.pid)) for rank, state in ((r, live_rank(run_dir, r)) for r in ranks)
    }
    read = native_stacks.read([p for _, tree in trees.values() for p, _ in tree], timeout)
    return {
        rank: [NativeStackDump(rank, p, "rank" if p == pid else "child", cmdline, read[p]) for p, cmdline in tree]
        for rank, (pid, tree) in trees.items()
    }


def native_text(dumps: dict[int, list[NativeStackDump]], all_frames: bool = False) -> str:
    """What ``stack --native`` prints of the ranks py-spy could read: each process under a
    ``── rank R (pid P) · native ──`` header (a child: ``── rank R › pid P: COMMAND · native ──``).
    The text is the rank's (names, paths): the caller escapes it for where it goes."""
    import shlex

    out = []
    for rank, procs in dumps.items():
        for d in procs:
            head = (
                f"── rank {rank} (pid {d.pid}) · native ──"
                if d.kind == "rank"
                else f"── rank {rank} › pid {d.pid}: {shlex.join(d.cmdline)} · native ──"
            )
            out.append(f"{head}\n{d.dump.text(all_frames)}\n")
    return "".join(out)


def live_rank(run_dir: Path, rank: int):
    """The RankState of a rank of the run that is running now, as its own pid (else a usage error)."""
    record = load_record(run_dir)
    state = next((r for r in record.ranks if r.rank == rank), None)
    if state is None:
        raise UsageError(f"--rank {rank}: run {record.run_id} has ranks 0-{len(record.ranks) - 1}")
    if state.state != RankStatus.RUNNING or state.pid is None:
        raise UsageError(f"rank {rank} is not running (state: {state.state}): no stack to dump")
    if not _belongs_to_run(state.pid, record.run_id):
        raise UsageError(f"pid {state.pid} of rank {rank} is gone or no longer part of run {record.run_id}")
    return state


def _belongs_to_run(pid: int, run_id: str) -> bool:
    import psutil

    try:
        return psutil.Process(pid).environ().get("RPCCTL_RUN_ID") == run_id
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return False
