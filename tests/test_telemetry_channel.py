"""The telemetry channel's local door: only the run's owner may feed the store, on node 0's
server and on another node's relay alike.

The socket is 0600 in a 0700 directory, so another user cannot normally reach it at all. Here
the test loosens both on purpose (the case of a looser run directory) and a forked child that
became another user (uid 65534) connects for real: the same-user check (SO_PEERCRED) must
still refuse it, count it, log it, and store nothing; the owner's connection still works.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from conftest import wait_until
from rpcctl import inspect
from rpcctl.wire import protocol
from rpcctl.telemetry.forward import TelemetryForwarder
from rpcctl.telemetry.server import TelemetryServer

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not hasattr(os, "setuid") or os.getuid() != 0, reason="needs root, to become another user"),
]
SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_UID = 65534  # nobody


@pytest.fixture
def reachable_dirs():
    """Run directories another user can traverse (the pytest tmp root is 0700 and shared with
    other sessions, so these live in /tmp, and are removed afterwards)."""
    made: list[Path] = []

    def make(name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"rpcctl-{name}-", dir="/tmp"))
        path.chmod(0o711)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _open_to_everyone(socket_path: str) -> None:
    os.chmod(socket_path, 0o666)
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o666


def _hello(pid: int, rank: int) -> list[bytes]:
    return [
        protocol.encode(
            {"k": "hello", "pid": pid, "ppid": 1, "host": "intruder", "rank": rank, "kind": "rank", "t": time.time()}
        ),
        protocol.encode(
            {"k": "batch", "ev": [{"e": "probe", "t": time.time(), "cpu_percent": 1.0, "rss_bytes": 1, "threads": 1}]}
        ),
    ]


def _connect_as_other_user(socket_path: str, rank: int) -> tuple[int, int]:
    """Fork a child that becomes OTHER_UID, connects to ``socket_path`` and sends a hello and a
    batch. Returns (its pid, its exit code): 0 the other end hung up on it, 2 it could not even
    connect (then the test proves nothing), 3 anything else (it was kept connected)."""
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (never back into pytest)
        code = 3
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            try:
                sock.connect(socket_path)
            except OSError:
                os._exit(2)
            try:
                for line in _hello(os.getpid(), rank):
                    sock.sendall(line)
                code = 0 if sock.recv(1) == b"" else 3
            except (BrokenPipeError, ConnectionResetError):
                code = 0
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return pid, os.waitstatus_to_exitcode(status)


def _pids_in_store(run_dir: Path) -> set[int]:
    return {w.pid for w in inspect.workers(run_dir)}


def _assert_other_user_refused(socket_path: str, refused, store_dir: Path, rank: int, capfd) -> int:
    """Another user connects to ``socket_path``: refused (counted in ``refused``, logged), and
    nothing of it reaches the store in ``store_dir``. Returns the intruder's pid."""
    intruder, code = _connect_as_other_user(socket_path, rank)
    # Either the door refuses it, or (the bug) it gets in and its hello is stored.
    wait_until(
        lambda: refused.count >= 1 or intruder in _pids_in_store(store_dir), 10, "a refusal (or the intruder stored)"
    )
    assert intruder not in _pids_in_store(store_dir), "another user's telemetry reached the store"
    assert code == 0, "the other user's connection was not hung up on"
    assert refused.count == 1 and refused.uids == {OTHER_UID}
    assert f"{refused.where} refused a connection from uid {OTHER_UID}" in capfd.readouterr().err
    return intruder


def _assert_owner_gets_through(socket_path: str, store_dir: Path, pid: int, rank: int) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    for line in _hello(pid, rank):
        sock.sendall(line)
    wait_until(lambda: pid in _pids_in_store(store_dir), 10, "the owner's process in the store")
    sock.close()


def test_the_server_refuses_another_user_and_still_serves_the_owner(reachable_dirs, capfd):
    server = TelemetryServer(reachable_dirs("node0"), None, world_size=1)
    socket_path = server.start()[protocol.ENV_SOCKET]
    try:
        _open_to_everyone(socket_path)
        intruder = _assert_other_user_refused(socket_path, server.refused, server.run_dir, 0, capfd)
        _assert_owner_gets_through(socket_path, server.run_dir, pid=4343, rank=0)
        assert intruder not in _pids_in_store(server.run_dir)
    finally:
        server.close()


def test_another_nodes_relay_refuses_another_user_and_still_relays_the_owner(reachable_dirs, capfd):
    server = TelemetryServer(reachable_dirs("node0"), None, world_size=2)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server.listen_tcp(listener, SECRET)
    server.start()
    forwarder = TelemetryForwarder(reachable_dirs("node1"), listener.getsockname(), SECRET)
    socket_path = forwarder.start()[protocol.ENV_SOCKET]
    try:
        _open_to_everyone(socket_path)
        intruder = _assert_other_user_refused(socket_path, forwarder.refused, server.run_dir, 1, capfd)
        _assert_owner_gets_through(socket_path, server.run_dir, pid=5252, rank=1)  # relayed to node 0
        assert intruder not in _pids_in_store(server.run_dir)
        assert forwarder.errors == []
    finally:
        forwarder.close()
        server.close()
