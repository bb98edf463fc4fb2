"""The rank server: the one process that starts, reaps and (at the end) kills every rank.

Process tree of a job::

    rpcctl launch (launcher: supervisor, log pump, telemetry; never imports torch)
    └── python -P -m rpcctl.processes.rank_server (rank server: subreaper, single-threaded)
        ├── rank 0  (own session; PR_SET_PDEATHSIG=SIGKILL on the rank server)
        │   └── ...  anything the script starts; orphans are re-parented to the rank server
        └── rank 1

Start methods:

- ``fork``: the server imports ``preload`` (torch, torch.distributed.rpc) once, then forks each
  rank. No thread, RPC agent or CUDA context exists in the server, so the fork is safe, and N
  ranks cost one ``import torch`` instead of N.
- ``spawn``: the server preloads nothing and each forked child ``exec``\\s a fresh interpreter
  (``python -P -m rpcctl.rank.runtime SCRIPT ARGS``), for scripts that must run before torch is imported.

Protocol: JSON messages over a ``SOCK_SEQPACKET`` socket pair; a spawn request carries the
write end of the rank's output pipe as SCM_RIGHTS. Launcher → server: ``spawn``, ``shutdown``.
Server → launcher: ``ready``, ``spawned``, ``spawn_failed``, ``exited`` (raw wait status).

If the launcher dies, even by SIGKILL, its end of the socket closes; the server then SIGKILLs
every descendant and exits. Ranks die with the server through PR_SET_PDEATHSIG. So no path
leaves a rank behind.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass

from rpcctl.base.python_cmd import RUNTIME, module_command, working_dir_on_path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_MESSAGE = 1 << 20


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(1)


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


@dataclass
class ChildTask:
    """What a freshly forked child does once it has left the server loop."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    output_fd: int
    exec_fresh: bool


class RankServer:
    def __init__(self, sock: socket.socket, preload: list[str]):
        self.sock = sock
        self.preload = preload
        self.ranks: dict[int, int] = {}  # pid → rank, for the ranks we forked
        self.wake_r, self.wake_w = os.pipe()

    def serve(self) -> ChildTask | None:
        """Run until shutdown (returns None) or, in a forked child, return the child's task."""
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
        signal.signal(signal.SIGTERM, lambda *_: self._shutdown_and_exit(143))
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

        started = time.monotonic()
        failed: dict[str, str] = {}
        for module in self.preload:
            try:
                importlib.import_module(module)
            except Exception as exc:  # the ranks will hit the same error and report it properly
                failed[module] = f"{type(exc).__name__}: {exc}"
        # Objects that exist now are shared with every rank; freezing them keeps the garbage
        # collector from touching (and so copying) those pages in each forked child.
        gc.freeze()
        send(self.sock, {"op": "ready", "preload_s": time.monotonic() - started, "failed": failed})

        while True:
            readable, _, _ = select.select([self.sock, self.wake_r], [], [], 0.5)
            if self.wake_r in readable:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            self._reap()
            if self.sock in readable:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                if not data:  # the launcher is gone: take everything down with us
                    self._kill_all()
                    return None
                message = json.loads(data)
                if message["op"] == "shutdown":
                    self._kill_all()
                    send(self.sock, {"op": "bye"})
                    return None
                if message["op"] == "spawn":
                    task = self._spawn(message, fds)
                    if task is not None:
                        return task

    def _spawn(self, message: dict, fds: list[int]) -> ChildTask | None:
        output_fd = fds[0]
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(output_fd)
            send(self.sock, {"op": "spawn_failed", "rank": message["rank"], "error": str(exc)})
            return None
        if pid == 0:
            # In the child: leave the server's world behind, then return up and out of serve().
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            die_with_parent(server_pid)
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            return ChildTask(message["argv"], message["env"], message["cwd"], output_fd, message["exec"])
        os.close(output_fd)
        self.ranks[pid] = message["rank"]
        send(self.sock, {"op": "spawned", "rank": message["rank"], "pid": pid})
        return None

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = self.ranks.pop(pid, None)
            if rank is not None:  # orphans re-parented to us are reaped silently
                send(self.sock, {"op": "exited", "rank": rank, "pid": pid, "status": status})

    def _kill_all(self) -> None:
        """SIGKILL every descendant (ranks, and orphans re-parented to us), then reap them."""
        import psutil

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                children = psutil.Process().children(recursive=True)
            except psutil.Error:
                children = []
            if not children:
                break
            for child in children:
                try:
                    child.kill()
                except psutil.Error:
                    pass
            time.sleep(0.02)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass

    def _shutdown_and_exit(self, code: int) -> None:
        self._kill_all()
        os._exit(code)


def run_child(task: ChildTask) -> int:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(task.output_fd, 1)
    os.dup2(task.output_fd, 2)
    os.close(task.output_fd)
    os.chdir(task.cwd)
    os.environ.clear()
    os.environ.update(task.env)
    if task.exec_fresh:
        os.execve(sys.executable, [*module_command(RUNTIME), *task.argv], task.env)
    # Named, not imported at the top: the launcher side never imports the rank package; this
    # forked child becomes the rank here.
    return importlib.import_module(RUNTIME).run_rank(task.argv)


def main() -> None:
    working_dir_on_path()  # for preload: started with -P (rpcctl.base.python_cmd)
    sock = socket.socket(fileno=int(sys.argv[1]))
    preload = [m for m in sys.argv[2].split(",") if m] if len(sys.argv) > 2 else []
    task = RankServer(sock, preload).serve()
    if task is None:
        # The server holds no user state: skip tearing down torch's module graph.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    exit_forked_rank(run_child(task))


def exit_forked_rank(code: int) -> None:
    """End a forked rank as multiprocessing ends its fork children: join non-daemon threads,
    run atexit handlers, flush every open file, then exit without tearing the interpreter down.

    The teardown would walk torch's whole module graph in every rank (~0.3 s of CPU each, and
    copying the pages shared with the server); what users rely on at exit happens here. Scripts
    that need ``__del__`` finalizers to run at exit should use ``start_method: spawn``.
    """
    import atexit
    import io
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined] - what the interpreter itself calls
        atexit._run_exitfuncs()
    except BaseException as exc:  # noqa: BLE001 - an atexit handler failing must still exit
        print(f"rpcctl: error at exit: {exc!r}", file=sys.stderr)
        code = code or 1
    # Objects made before the fork are frozen (gc.freeze in the server), so this lists only the
    # rank's own objects: cheap, and it finds the files the script left open.
    file_types = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects (torch's deprecated reduce_op) warn on __class__.
        if type(obj) in file_types:
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:  # noqa: BLE001 - a broken stream must not block the exit
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code & 0xFF if code >= 0 else 1)


if __name__ == "__main__":
    main()
