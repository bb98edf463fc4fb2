"""What the hang watchdog sees of the processes themselves, before it believes a silence.

The store's silence (no call ended, no collective completed, no loss, no line) says only that
telemetry saw nothing move: a job that computes without printing is silent too, and so is a
healthy job whose telemetry stopped. So before the watchdog calls a silence a hang, it looks at
the processes twice, some seconds apart (``Look``): their Python stacks (``base.stacks``:
written under the GIL, faulthandler's SIGUSR1 dump where that brings nothing; every thread,
through ``rpcctl.inspect.dump_stacks``) and their main thread's CPU time
(``/proc/PID/task/PID/stat``). Between two looks, a process *moved* (``motion``) when

- a thread's Python frames changed, or a thread began or ended (rpcctl's own threads, which
  never run the user's code, are left out: the telemetry sender cycles on its own), or
- with no RPC call or collective of its own in flight, its main thread ran for at least
  ``BUSY_SHARE`` of the time between the looks (a twentieth: a loaded machine shares its cores,
  and a thread that waits on a lock, a condition or a socket uses next to none): a long
  computation in one C call keeps its Python stack the same. A process waiting in a call or a
  collective may spin in C while it waits (TensorPipe's busy-polling, a CUDA synchronize): its CPU
  then says nothing.

A process that moved is not hung, whatever the store says. What the watchdog needs to stop a
job is positive evidence that nothing moves: processes looked at twice with nothing moved, or
stopped (SIGSTOP), or (for a process this node cannot look at: another node's) a call or
collective of its own in flight for the whole hang timeout.

Also here: faulthandler's text parsed into threads and frames (``parse_stacks``), and where a
thread is in the user's code (``where``). At the verdict only (never in the looks: they run on
a healthy silent job and stay cheap), ``Look.read_native`` reads each rank and every process
under it from outside (py-spy, ``rpcctl.base.native_stacks``, bounded per process): the evidence
gets their native frames, and ``where`` quotes, beside the Python line, the innermost native
frame that explains the wait (``…, in c10d::Work::wait (libtorch_cpu.so)``).
"""

from __future__ import annotations

import linecache
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl import inspect

from rpcctl.base import native_stacks, stacks
from rpcctl.base.errors import RpcctlError
from rpcctl.base.frames import is_own, is_user_file, short_path
from rpcctl.base.procstat import cpu_seconds

BUSY_SHARE = 0.05  # a main thread on CPU this share of the time between two looks is computing (0.2 missed a
# product that got under a fifth of a core at a load average of 10 on 2 cores)
DUMP_TIMEOUT_S = 2.0
# each process's py-spy at a verdict (all at once): libtorch's symbols take ~2 s, more on a loaded machine
NATIVE_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------
# Stacks: faulthandler's text, parsed


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    @property
    def site(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.func}"

    @property
    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()


@dataclass
class ThreadStack:
    ident: int
    current: bool  # the thread that took the signal (the main thread, for a process signal)
    frames: list[Frame]  # innermost first
    native: str | None = None  # the native frame that explains its wait, at a verdict (``Look.read_native``)

    def user_frame(self) -> Frame | None:
        return next((f for f in self.frames if is_user_file(f.file)), None)

    @property
    def is_main(self) -> bool:
        return any(f.func == "_run_script" and f.file.endswith(os.path.join("rank", "runtime.py")) for f in self.frames)

    @property
    def is_rpcctls(self) -> bool:
        """One of rpcctl's own threads (the telemetry sender, a Monarch join): rpcctl's frames and
        the standard library's, none of the user's."""
        return any(is_own(f.file) for f in self.frames) and self.user_frame() is None and not self.is_main


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_stacks(text: str) -> list[ThreadStack]:
    """Threads of one faulthandler dump (``Thread 0x… (most recent call first):`` blocks)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            threads.append(ThreadStack(int(header.group(2), 16), header.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


def where(thread: ThreadStack | None) -> str | None:
    """``train.py:12 in load_data (`time.sleep(600)`)``: the innermost frame of the user's code."""
    frame = thread.user_frame() if thread is not None else None
    if frame is None:
        return None
    source = frame.source
    native = f", in {thread.native}" if thread.native else ""
    return (f"{frame.site} (`{source}`)" if source else frame.site) + native


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    return next((t for t in threads if t.is_main), None) or next((t for t in threads if t.current), None)


# ---------------------------------------------------------------------------------------------
# Looks


@dataclass
class Seen:
    """One process as one look saw it."""

    pid: int
    rank: int
    kind: str  # rank | child
    cmdline: list[str]
    text: str | None  # faulthandler's dump; None: it wrote none in time
    threads: list[ThreadStack]
    cpu_s: float | None  # its main thread's CPU time, when read
    stopped: bool = False

    @property
    def signature(self) -> tuple[Any, ...] | None:
        """What must stay the same for the process to have stayed still (None: no stack came)."""
        if self.text is None:
            return None
        return tuple(sorted((t.ident, tuple(t.frames)) for t in self.threads if not t.is_rpcctls))


@dataclass
class Look:
    """The processes of this node's ranks at one moment (``take``)."""

    at: float  # monotonic
    seen: dict[int, Seen] = field(default_factory=dict)  # pid → what was seen
    missed: list[str] = field(default_factory=list)  # ranks that could not be dumped, and why
    # pid → (rank, kind, cmdline, dump)
    native: dict[int, tuple[int, str, list[str], native_stacks.NativeDump]] = field(default_factory=dict)

    @classmethod
    def take(cls, run_dir: Path, ranks: list[tuple[int, int]]) -> Look:
        """Dump every live rank in ``ranks`` ((rank, pid) of this node) and the processes it started."""
        look = cls(time.monotonic())
        for rank, pid in ranks:
            if stacks.stopped(pid):
                look.seen[pid] = Seen(pid, rank, "rank", [], None, [], None, stopped=True)
                continue
            try:
                dumps = inspect.dump_stacks(run_dir, rank, timeout=DUMP_TIMEOUT_S)
            except RpcctlError as exc:  # it ended meanwhile, or wrote no stack in time
                look.missed.append(f"rank {rank}: {exc}")
                continue
            for dump in dumps:
                stopped = dump.kind == "child" and stacks.stopped(dump.pid)
                text = None if stopped else dump.text
                look.seen[dump.pid] = Seen(
                    dump.pid,
                    dump.rank,
                    dump.kind,
                    dump.cmdline,
                    text,
                    parse_stacks(text or ""),
                    cpu_seconds(dump.pid, dump.pid),
                    stopped=stopped,
                )
        return look

    def read_native(self, timeout: float = NATIVE_TIMEOUT_S) -> bool:
        """Read every rank seen and every process under it from outside (py-spy, all at once, each
        within ``timeout``) and mark each thread with the native frame that explains its wait.
        False when not one could be read because ptrace is refused here (``refused_hint``)."""
        trees = [
            (seen.rank, seen.pid, native_stacks.tree(seen.pid)) for seen in self.seen.values() if seen.kind == "rank"
        ]
        read = native_stacks.read([pid for _, _, tree in trees for pid, _ in tree], timeout)
        for rank, rank_pid, tree in trees:
            for pid, cmdline in tree:
                dump = read[pid]
                self.native[pid] = (rank, "rank" if pid == rank_pid else "child", cmdline, dump)
                for thread in self.seen[pid].threads if pid in self.seen else []:
                    frame = native_stacks.explaining_frame(dump.thread(thread.ident))
                    thread.native = frame.label if frame is not None else None
        return not (read and all(d.refused for d in read.values()))

    def texts(self, describe: Any) -> list[str]:
        """The evidence file's sections: each process's dump under a header (``describe(seen)``),
        its native stacks after it when read, then the processes only py-spy could read."""
        out = []
        for seen in self.seen.values():
            if seen.stopped and seen.kind == "rank":
                out.append(f"── {describe(seen)} ──\n(stopped: no stack until SIGCONT)\n{self._native_text(seen.pid)}")
                continue
            header = (
                f"── rank {seen.rank} (pid {seen.pid}) ──"
                if seen.kind == "rank"
                else f"── rank {seen.rank} › pid {seen.pid}: {' '.join(seen.cmdline)} ──"
            )
            out.append(f"{header}\n{seen.text or '(wrote no stack in time)'}\n{self._native_text(seen.pid)}")
        for pid, (rank, _, cmdline, _) in self.native.items():
            if pid not in self.seen:
                out.append(f"── rank {rank} › pid {pid}: {' '.join(cmdline)} ──\n{self._native_text(pid)}")
        return out

    def _native_text(self, pid: int) -> str:
        if pid not in self.native:
            return ""
        return f"native (py-spy, most recent call first):\n{self.native[pid][3].text()}"


def motion(before: Look, after: Look, waiting: set[int]) -> list[str]:
    """How the processes moved between two looks, one line each ([]: none moved). ``waiting``:
    pids with an RPC call or a collective of their own in flight (their CPU says nothing)."""
    moved = []
    elapsed = max(after.at - before.at, 1e-3)
    for pid, now in after.seen.items():
        then = before.seen.get(pid)
        if then is None or now.stopped or then.stopped:
            continue
        who = f"rank {now.rank} (pid {pid})" if now.kind == "rank" else f"pid {pid} (started by rank {now.rank})"
        if now.signature is not None and then.signature is not None and now.signature != then.signature:
            was, is_now = where(main_thread(then.threads)), where(main_thread(now.threads))
            change = f": {was} → {is_now}" if was and is_now and was != is_now else ""
            moved.append(f"{who}: its Python stack changed{change}")
        elif (
            pid not in waiting
            and now.cpu_s is not None
            and then.cpu_s is not None
            and now.cpu_s - then.cpu_s >= BUSY_SHARE * elapsed
        ):
            moved.append(
                f"{who}: its main thread ran {now.cpu_s - then.cpu_s:.1f} s of CPU in {elapsed:.1f} s"
                + (f" at {where(main_thread(now.threads))}" if where(main_thread(now.threads)) else "")
            )
    return moved


def still(before: Look, after: Look) -> list[int]:
    """Pids seen twice and the same both times (or stopped both times): evidence that nothing moves."""
    out = []
    for pid, now in after.seen.items():
        then = before.seen.get(pid)
        if then is None:
            continue
        if (now.stopped and then.stopped) or (now.signature is not None and now.signature == then.signature):
            out.append(pid)
    return out
