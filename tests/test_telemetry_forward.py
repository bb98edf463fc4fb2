"""The cross-node telemetry channel: only a peer holding the run's secret gets in."""

from __future__ import annotations

import socket
import time

import pytest

from rpcctl import inspect
from rpcctl.wire import protocol
from rpcctl.telemetry.channel import connect_authenticated
from rpcctl.telemetry.forward import TelemetryForwarder
from rpcctl.telemetry.server import TelemetryServer

pytestmark = pytest.mark.timeout(60)
SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def node0(tmp_path):
    server = TelemetryServer(tmp_path / "node0", None, world_size=2)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server.listen_tcp(listener, SECRET)
    server.start()
    yield server, listener.getsockname()
    server.close()


def _wait_for_workers(run_dir, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = inspect.workers(run_dir)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    return inspect.workers(run_dir)


def test_a_peer_without_the_secret_is_cut_off_and_nothing_is_stored(node0):
    server, address = node0
    intruder = socket.create_connection(address, timeout=5)
    assert protocol.decode(intruder.makefile("rb").readline())["k"] == "challenge"
    intruder.sendall(protocol.encode({"k": "auth", "mac": "0" * 64}))
    intruder.sendall(protocol.encode({"k": "launcher", "op": "started", "args": [1, 4242, 1, "cpu", 0]}))
    assert intruder.recv(1) == b""  # the server hung up
    intruder.close()
    time.sleep(0.3)
    assert inspect.workers(server.run_dir) == [] or all(w.pid != 4242 for w in inspect.workers(server.run_dir))
    assert server.bad_messages >= 1


def test_wrong_secret_fails_the_handshake_check(node0):
    _, address = node0
    sock = connect_authenticated(address, b"not the secret at all, no no no")
    assert sock.recv(1) == b""  # authenticated with the wrong key: closed at once
    sock.close()


def test_another_nodes_launcher_and_ranks_reach_node_0s_store(node0, tmp_path):
    server, address = node0
    forwarder = TelemetryForwarder(tmp_path / "node1", address, SECRET)
    env = forwarder.start()
    forwarder.rank_started(1, 5151, 0, "cpu", 0)
    # A rank of node 1 speaks to its local socket exactly as on one node.
    rank = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    rank.connect(env[protocol.ENV_SOCKET])
    rank.sendall(
        protocol.encode(
            {"k": "hello", "pid": 5151, "ppid": 1, "host": "node-one", "rank": 1, "kind": "rank", "t": time.time()}
        )
    )
    rank.sendall(
        protocol.encode(
            {
                "k": "batch",
                "ev": [{"e": "probe", "t": time.time(), "cpu_percent": 1.0, "rss_bytes": 1 << 20, "threads": 3}],
            }
        )
    )
    forwarder.log_line(1, "step 3 loss 0.52")
    workers = _wait_for_workers(server.run_dir, 1)
    rank.close()
    forwarder.close()
    assert [(w.rank, w.pid, w.host) for w in workers] == [(1, 5151, "node-one")]
    deadline = time.monotonic() + 5
    while not inspect.losses(server.run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r.rank, r.step, r.loss) for r in inspect.losses(server.run_dir)] == [(1, 3, 0.52)]
    assert forwarder.errors == []
