"""Start, poll, signal and reap ranked processes. Policy lives in ``supervisor``; this module
only does what it is told.

``RankProcesses`` is the launcher's handle on the rank server (``rpcctl.processes.rank_server``): it asks the
server to start ranks, receives their exit statuses, signals whole process trees, and closes
with one escalation: SIGTERM every tree, wait ``grace``, SIGKILL what is left.

``LogPump`` is one thread that moves every rank's output from its pipe to its log file and to
a callback (console echo, loss capture), split into lines as a terminal shows them.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from rpcctl.base.errors import RpcctlError
from rpcctl.base.lines import LineSplitter, Piece
from rpcctl.base.log_times import TimeIndexWriter
from rpcctl.planning.plan import RankPlan
from rpcctl.base.private import private_dir, private_open
from rpcctl.base.python_cmd import RANK_SERVER, module_command
from rpcctl.processes.rank_server import MAX_MESSAGE, PR_SET_CHILD_SUBREAPER, prctl
from rpcctl.records.runs import process_in_run


@dataclass(frozen=True)
class ExitStatus:
    rank: int
    pid: int
    exit_code: int | None  # None when killed by a signal
    signal: str | None
    at: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_wait_status(cls, rank: int, pid: int, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(rank, pid, None, signal_name(os.WTERMSIG(status)), time.time())
        return cls(rank, pid, os.waitstatus_to_exitcode(status), None, time.time())

    def describe(self) -> str:
        if self.signal:
            return f"killed by {self.signal}"
        return f"exited with code {self.exit_code}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class RankServerLost(RpcctlError):
    """The rank server died under the launcher (killed, crashed): its ranks were killed with it."""


class RankProcesses:
    """The launcher's side of the rank server protocol (see ``rpcctl.processes.rank_server``).

    The launcher is a child subreaper: if the rank server dies (even by SIGKILL), what its
    ranks started is re-parented to the launcher, not to pid 1, and is killed here with the
    ranks' process groups (``kill_run_processes``), so no tree outlives its run."""

    def __init__(self, run_dir: Path, preload: list[str], env: dict[str, str] | None = None):
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.run_id = (env or {}).get("RPCCTL_RUN_ID")
        self.lost: str | None = None  # how the rank server died, once it has
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_log = private_open(run_dir / "launcher.log", "ab")  # handed to the child
        try:
            self.server = subprocess.Popen(
                [*module_command(RANK_SERVER), str(theirs.fileno()), ",".join(preload)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches the launcher only; it decides
            )
        finally:
            theirs.close()
            server_log.close()
        self.pids: dict[int, int] = {}  # rank → pid of the current attempt
        self.exited: dict[int, ExitStatus] = {}
        self.spawn_errors: dict[int, str] = {}
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def start(self, rank: RankPlan, env: dict[str, str], exec_fresh: bool, output_fd: int, cwd: str) -> None:
        message = {
            "op": "spawn",
            "rank": rank.rank,
            "argv": rank.script_argv,
            "env": env,
            "cwd": cwd,
            "exec": exec_fresh,
        }
        socket.send_fds(self._sock, [json.dumps(message).encode()], [output_fd])

    def poll(self, timeout: float) -> list[ExitStatus]:
        """Wait up to ``timeout`` for news from the server; return the ranks that exited."""
        exits: list[ExitStatus] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            if self.lost is not None:  # nobody left to send news
                time.sleep(remaining)
                return exits
            readable, _, _ = select.select([self._sock], [], [], remaining)
            if not readable:
                return exits
            data = self._sock.recv(MAX_MESSAGE)
            if not data:
                self._server_lost()
            message = json.loads(data)
            op = message["op"]
            # "ready" (preload done) needs no action: the server serves spawns in order anyway.
            if op == "spawned":
                self.pids[message["rank"]] = message["pid"]
            elif op == "spawn_failed":
                self.spawn_errors[message["rank"]] = message["error"]
            elif op == "exited":
                status = ExitStatus.from_wait_status(message["rank"], message["pid"], message["status"])
                if self.pids.get(status.rank) == status.pid:
                    self.exited[status.rank] = status
                    exits.append(status)
            # Return as soon as something happened; the caller loops.
            timeout = 0
            deadline = time.monotonic()

    def terminate(self, grace: float, hurry: Callable[[], bool] = lambda: False) -> list[ExitStatus]:
        """SIGTERM every live rank's process tree, wait up to ``grace`` (cut short when ``hurry()``
        turns true), SIGKILL what is left, and return the exit statuses collected meanwhile."""
        collected: list[ExitStatus] = []
        live = {r: p for r, p in self.pids.items() if r not in self.exited}
        if not live:
            return collected
        victims = {pid: tree(pid) for pid in live.values()}
        for pid, procs in victims.items():
            signal_tree(pid, procs, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not hurry():
            collected += self.poll(0.05)
            if all(not _alive(p) for procs in victims.values() for p in procs):
                break
        for pid, procs in victims.items():
            signal_tree(pid, procs + tree(pid), signal.SIGKILL)
        # Collect the exit statuses of the ranks we killed.
        deadline = time.monotonic() + 5
        while any(r not in self.exited for r in live) and time.monotonic() < deadline and self.lost is None:
            collected += self.poll(0.05)
        return collected

    def _server_lost(self) -> None:
        try:
            status = self.server.wait(timeout=5)
            how = f"killed by {signal_name(-status)}" if status < 0 else f"exited with code {status}"
        except subprocess.TimeoutExpired:
            how = "closed its socket"
        self.lost = how
        self.kill_run_processes()
        raise RankServerLost(
            f"the rank server (pid {self.server.pid}) {how}; every process of the run was killed (see launcher.log)"
        )

    def kill_run_processes(self, timeout: float = 5.0) -> None:
        """SIGKILL every process of the run the rank server can no longer kill: the ranks'
        process groups, and whatever carries the run's id and was re-parented to us."""
        deadline = time.monotonic() + timeout
        adopted: set[int] = set()  # orphans re-parented to us: ours to reap, and only those
        while True:
            for pid in self.pids.values():
                try:
                    os.killpg(pid, signal.SIGKILL)  # each rank leads its own group
                except (ProcessLookupError, PermissionError):
                    pass
            left = [
                p
                for p in _descendants()
                if p.pid != self.server.pid and self.run_id and process_in_run(p.pid, self.run_id)
            ]
            for proc in left:
                try:
                    if proc.ppid() == os.getpid():
                        adopted.add(proc.pid)
                    proc.kill()
                except psutil.Error:
                    pass
            for pid in list(adopted):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        adopted.discard(pid)
                except ChildProcessError:
                    adopted.discard(pid)
            if (not left and not adopted) or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def reset(self) -> None:
        """Forget the finished attempt (before a restart)."""
        self.pids.clear()
        self.exited.clear()
        self.spawn_errors.clear()

    def close(self) -> None:
        """Stop the rank server; it SIGKILLs any descendant still alive."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.send(json.dumps({"op": "shutdown"}).encode())
        except OSError:
            pass
        try:
            status = self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            status = self.server.wait()
        self._sock.close()
        if status != 0 or self.lost is not None:  # it could not have killed what is left
            self.kill_run_processes()


def run_processes(run_ids: set[str]) -> dict[str, list[psutil.Process]]:
    """This user's live processes that carry one of ``run_ids`` in their environment
    (``RPCCTL_RUN_ID``: the rank server, the ranks, what they started), by run id. A process
    only ever carries its own run's random id, so this is what a lost run left behind."""
    found: dict[str, list[psutil.Process]] = {}
    if not run_ids:
        return found
    uid = os.getuid()
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.uids().real != uid:
                continue
            run_id = proc.environ().get("RPCCTL_RUN_ID")
            if run_id in run_ids and proc.status() != psutil.STATUS_ZOMBIE:
                found.setdefault(run_id, []).append(proc)
        except psutil.Error:
            continue
    return found


def kill_processes(victims: list[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    """SIGKILL ``victims`` (psutil checks each pid's start time, so a reused pid is spared)
    and wait until they are gone; return those still alive at ``timeout``."""
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(victims, timeout=timeout)
    return [p for p in alive if _alive(p)]


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (gathered before signalling, as children re-parent)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, procs: list[psutil.Process], sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the rank leads its own session and process group
    except (ProcessLookupError, PermissionError):
        pass
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks the pid was not reused
        except psutil.Error:
            pass


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


LogErrorCallback = Callable[[int, Path, int, OSError], None]  # rank, log path, bytes kept, error


class RankLog:
    """One rank's log file, written by the pump. A write that fails (a full disk, the run
    directory removed) closes the file and is reported once; the bytes written before it stay,
    and ``write`` goes on accepting (and dropping) data, so the pump never stops draining."""

    def __init__(self, rank: int, path: Path, on_error: LogErrorCallback, opener: Callable[..., Any] = private_open):
        self.rank, self.path, self.on_error = rank, path, on_error
        self.written = 0
        self.file: Any = None
        self.times: TimeIndexWriter | None = None
        try:
            private_dir(path.parent)
            self.file = opener(path, "ab", buffering=0)
            self.start = path.stat().st_size  # a restart appends to the same log
            self.times = TimeIndexWriter(path, opener)
        except OSError as exc:
            self._failed(exc)

    def write(self, data: bytes) -> None:
        if self.file is None:
            return
        if self.times is not None:
            self.times.note(self.start + self.written, time.time())
        view = memoryview(data)
        try:
            while view:
                n = self.file.write(view)
                if not n:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.written += n
                view = view[n:]
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.close()
        self.on_error(self.rank, self.path, self.written, exc)

    def close(self) -> None:
        file, self.file = self.file, None
        if self.times is not None:
            self.times.close()
        if file is not None:
            try:
                file.close()
            except OSError:
                pass


def _print_log_error(rank: int, path: Path, written: int, exc: OSError) -> None:
    print(f"rpcctl: rank {rank}'s log truncated after {written} bytes, path {path}: {exc}", file=sys.stderr)


class LogPump(threading.Thread):
    """Copies each rank's output pipe to its log file (every byte) and hands its text, split as a
    terminal shows it (``rpcctl.base.lines``), to ``on_piece(rank, piece)``. Whatever happens to a log
    file, every pipe is drained and every piece handed on."""

    def __init__(
        self,
        on_piece: Callable[[int, Piece], None],
        on_log_error: LogErrorCallback = _print_log_error,
        open_log: Callable[..., Any] = private_open,
    ):
        super().__init__(name="rpcctl-log-pump", daemon=True)
        self.on_piece = on_piece
        self.on_log_error, self._open_log = on_log_error, open_log
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[int, RankLog, LineSplitter]] = {}  # fd → (rank, log file, splitter)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False

    def add(self, rank: int, log_path: Path, header: str | None = None) -> int:
        """Open a pipe for ``rank``; return its write end (for the child). The log is appended to."""
        read_fd, write_fd = os.pipe()
        log = RankLog(rank, log_path, self.on_log_error, self._open_log)  # closed at EOF
        if header:
            log.write(header.encode())
        with self._lock:
            self._streams[read_fd] = (rank, log, LineSplitter())
        os.write(self._wake_w, b"x")
        return write_fd

    def run(self) -> None:
        while True:
            with self._lock:
                fds = list(self._streams)
            if self._stopping and not fds:
                return
            readable, _, _ = select.select([self._wake_r, *fds], [], [], 0.5)
            for fd in readable:
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                self._read(fd)

    def _read(self, fd: int) -> None:
        rank, log, splitter = self._streams[fd]
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if chunk:
            log.write(chunk)
            pieces = splitter.feed(chunk)
            preview = splitter.preview()  # a bar's state drawn now: the live view shows it
            self._emit(rank, pieces if preview is None else [*pieces, preview])
            return
        self._emit(rank, splitter.close())
        log.close()
        os.close(fd)
        with self._lock:
            del self._streams[fd]

    def _emit(self, rank: int, pieces: list[Piece]) -> None:
        for piece in pieces:
            try:
                self.on_piece(rank, piece)
            except Exception as exc:  # noqa: BLE001 - a display problem must never lose output
                print(f"rpcctl: log callback failed: {exc}", file=sys.stderr)

    def idle(self) -> bool:
        with self._lock:
            return not self._streams

    def drain(self, timeout: float) -> None:
        """Wait until every pipe reached EOF (its rank and descendants are gone), then stop."""
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stopping = True
        os.write(self._wake_w, b"x")
        self.join(timeout=2)
