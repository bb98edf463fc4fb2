"""Elastic membership (issue 43): rpcctl's ElasticRendezvous over torch's own dynamic rendezvous
handler and c10d backend, for real: launchers-to-be (tests/workers/elastic_node.py, plain Python
processes on loopback) meet, grow from one node to two, see a killed member as lost and go on
alone (MIN 1), and refuse a rendezvous state forged into the store without the run's secret."""

from __future__ import annotations

import base64
import json
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import threading

import pytest
from conftest import ROOT, WORKERS, pids_gone, wait_until

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One elastic_node.py process and the JSON lines it printed."""

    def __init__(self, port: int, nproc: int, env: dict[str, str]):
        argv = [sys.executable, str(WORKERS / "elastic_node.py"), "127.0.0.1", str(port), "1", "2", str(nproc), "1", "3"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        self.lines: list[dict] = []
        self.text: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.text.append(line)
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def seen(self, key: str) -> list[dict]:
        return [line for line in self.lines if key in line]

    def wait(self, key: str, count: int = 1, timeout: float = 20) -> list[dict]:
        return wait_until(lambda: len(self.seen(key)) >= count and self.seen(key), timeout, f"{count} '{key}' line(s): {''.join(self.text)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


class Forgery:
    """What a forged state would do once unpickled: make a directory (it must never appear)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """One elastic job told once: A alone, B joins, B is killed, a state is forged, A refuses it."""
    tmp = tmp_path_factory.mktemp("elastic")
    env = {**os.environ, "RPCCTL_SECRET": secrets.token_hex(16), "PYTHONPATH": str(ROOT)}
    port = free_port()
    a = Node(port, 2, env)
    b = None
    try:
        a.wait("round")
        b = Node(port, 3, env)
        a.wait("round", 2)
        b.wait("round")
        b_pid = b.proc.pid
        b.proc.send_signal(signal.SIGKILL)  # a node lost: its launcher killed, by its pid
        b.proc.wait(10)
        a.wait("round", 3)
        marker = tmp / "unpickled"
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", port, None, False)  # anyone who reaches the port, without the secret
        store.set("torch.rendezvous.test-job", base64.b64encode(pickle.dumps(Forgery(str(marker)))))
        a.wait("error")
        a.proc.wait(20)
        yield {"a": a, "b": b, "b_pid": b_pid, "marker": marker}
    finally:
        for node in (a, b):
            if node is not None:
                node.stop()
        assert pids_gone([n.proc.pid for n in (a, b) if n is not None])


def test_the_first_node_starts_alone_and_hosts_the_store(story):
    a = story["a"]
    assert a.seen("opened")[0]["host"] is True
    first = a.seen("round")[0]
    assert (first["nnodes"], first["world_size"], first["group_rank"]) == (1, 2, 0)


def test_a_second_node_on_the_same_machine_joins_as_a_client_and_the_world_grows(story):
    a, b = story["a"], story["b"]
    assert b.seen("opened")[0]["host"] is False  # the endpoint is local to both: the first to bind hosts
    assert b.seen("opened")[0]["run_id"] == a.seen("opened")[0]["run_id"]  # the host's run document
    assert a.seen("waiting"), "A never saw B waiting to join"
    grown_a, grown_b = a.seen("round")[1], b.seen("round")[0]
    assert grown_a["round"] == grown_b["round"] > a.seen("round")[0]["round"]
    assert (grown_a["nnodes"], grown_a["world_size"]) == (grown_b["nnodes"], grown_b["world_size"]) == (2, 5)
    assert (grown_a["group_rank"], grown_a["first_rank"]) == (0, 0)
    assert (grown_b["group_rank"], grown_b["first_rank"]) == (1, 2)  # after A's two ranks
    assert grown_a["master"] == grown_b["master"]  # where the round's ranks meet, agreed


def test_a_killed_member_is_lost_and_the_survivor_goes_on_alone(story):
    a = story["a"]
    assert a.seen("lost") == [{"lost": story["b_pid"]}]
    alone = a.seen("round")[2]
    assert (alone["nnodes"], alone["world_size"], alone["pids"]) == (1, 2, [a.proc.pid])
    assert alone["round"] > a.seen("round")[1]["round"]


def test_a_state_forged_without_the_secret_is_refused_and_never_unpickled(story):
    a = story["a"]
    error = a.seen("error")[0]["error"]
    assert "not sealed with this run's secret" in error and "refused" in error
    assert a.proc.returncode == 3
    assert not story["marker"].exists()
