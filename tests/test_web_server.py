"""The live page's server against neighbours without the token, over real sockets to
127.0.0.1: a connection reset mid-request prints nothing on the console; slow clients hold at
most ``MAX_CONNECTIONS`` threads and never keep the page from being served; idle ones hold no
thread, a bounded head each and a bounded count; a request head that dribbles in is cut at its
deadline; ``rpcctl web --port`` in use or out of range is one
message (exit 2)."""

from __future__ import annotations

import http.client
import re
import socket
import struct
import time
from pathlib import Path

import psutil
import pytest

from conftest import launch_job, rpcctl
from test_report import _start_web, _stop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    pytest.importorskip("plotly", reason="needs plotly: pip install -c constraints.txt -e '.[test]'")
    tmp_path = tmp_path_factory.mktemp("web")
    result, run_dir, _ = launch_job(tmp_path, tmp_path / "runs", nproc_per_node=1)
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.fixture
def web(a_run):
    proc, url = _start_web(str(a_run))
    try:
        yield proc, int(re.search(r":(\d+)/", url).group(1)), url.split("token=", 1)[1]
    finally:
        _stop(proc)


def _get(port: int, token: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/api/view?token={token}")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"GET /?token=x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())  # the head is never finished
    return sock


def test_a_connection_reset_mid_request_prints_no_traceback(web):
    proc, port, token = web
    for _ in range(5):
        sock = _connect(port)
        time.sleep(0.05)  # the server is reading the head
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST, not FIN
    time.sleep(0.3)
    assert _get(port, token) == 200  # still serving
    _stop(proc)
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "ConnectionResetError" not in stderr and "Exception occurred" not in stderr, (
        stderr
    )


def test_slow_clients_hold_at_most_the_cap_of_threads_and_the_page_is_still_served(web):
    from rpcctl.web.server import MAX_CONNECTIONS

    proc, port, token = web
    server = psutil.Process(proc.pid)
    before = server.num_threads()
    slow: list[socket.socket] = []
    most = before
    try:
        for _ in range(3 * MAX_CONNECTIONS):
            slow.append(_connect(port))
            most = max(most, server.num_threads())
        for _ in range(10):  # they dribble a header line each, for a second
            for sock in slow:
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass  # closed by the server: that is allowed
            most = max(most, server.num_threads())
            time.sleep(0.1)
        started = time.monotonic()
        assert _get(port, token) == 200  # with the slow clients still connected
        assert time.monotonic() - started < 5
        most = max(most, server.num_threads())
    finally:
        for sock in slow:
            sock.close()
    assert most <= before + MAX_CONNECTIONS, (before, most)


def test_a_request_head_that_dribbles_in_is_cut_at_its_deadline(a_run, monkeypatch):
    from rpcctl.web import server as web_server

    monkeypatch.setattr(web_server, "REQUEST_HEAD_S", 1.0)
    live = web_server.LiveServer(a_run).start()
    try:
        sock = _connect(live.port)
        started = time.monotonic()
        closed = None
        while time.monotonic() - started < 5:  # a byte every 0.2 s: each read is quick, the head never ends
            try:
                sock.sendall(b"X")
                sock.settimeout(0.2)
                if sock.recv(4096) == b"":
                    closed = time.monotonic() - started
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = time.monotonic() - started
                break
        sock.close()
        assert closed is not None and closed < 2.5, closed
        assert live.dropped["timed out"] == 1
        assert _get(live.port, live.token) == 200
    finally:
        live.stop()


def test_web_port_in_use_or_out_of_range_is_one_message_and_exit_2(a_run):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = rpcctl("web", str(a_run), "--port", str(port), timeout=30)
    assert in_use.returncode == 2, in_use.stderr
    assert (
        in_use.stderr.startswith(f"error: --port {port}: ")
        and "in use" in in_use.stderr
        and "Traceback" not in in_use.stderr
    )
    for bad in ("70000", "-1"):
        out_of_range = rpcctl("web", str(a_run), "--port", bad, timeout=30)
        assert out_of_range.returncode == 2, out_of_range.stderr
        assert "--port" in out_of_range.stderr and "Traceback" not in out_of_range.stderr, out_of_range.stderr


def _idle(port: int, count: int, sent: bytes = b"") -> list[socket.socket]:
    """``count`` connections that send ``sent`` (nothing by default) and never finish a head."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if sent:
            sock.sendall(sent)
        socks.append(sock)
    return socks


def _closed_by_server(sock: socket.socket) -> bool:
    """The server closed ``sock`` (a FIN, or a reset: it left bytes unread), within 5 s."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_hold_no_thread_and_the_token_request_is_answered_at_once(web):
    """200 connections opened and silent (a neighbour's cheap flood): the request with the
    token is answered within the promise (5 s; it took 7 s when a thread read each head in
    turn), no idle one holds a thread, and each holds at most MAX_HEAD_BYTES of what it sent."""
    from rpcctl.web.server import MAX_CONNECTIONS

    proc, port, token = web
    server = psutil.Process(proc.pid)
    before_threads, before_rss = server.num_threads(), server.memory_info().rss
    idle = _idle(port, 150) + _idle(
        port, 50, f"GET /?token=x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Pad: ".encode() + b"p" * 30_000
    )
    try:
        time.sleep(1.0)  # every one of them accepted and read, none finished
        started = time.monotonic()
        assert _get(port, token) == 200
        took = time.monotonic() - started
        threads, rss = server.num_threads(), server.memory_info().rss
        assert all(sock.fileno() >= 0 for sock in idle)
    finally:
        for sock in idle:
            sock.close()
    assert took < 5, took
    assert threads <= before_threads + MAX_CONNECTIONS, (before_threads, threads)
    assert rss - before_rss < 32 * 2**20, (before_rss, rss)  # 50 x 30 KB of heads, and the page's work


def test_a_head_over_the_cap_or_past_the_waiting_limit_is_closed_and_the_page_still_served(a_run, monkeypatch):
    """A head longer than MAX_HEAD_BYTES is cut; beyond MAX_WAITING waiting connections, a new
    one closes the one that has waited longest: memory and descriptors stay bounded, and the
    request with the token still gets in."""
    from rpcctl.web import server as web_server

    monkeypatch.setattr(web_server, "MAX_WAITING", 40)
    live = web_server.LiveServer(a_run).start()
    idle: list[socket.socket] = []
    try:
        [big] = _idle(live.port, 1, b"GET / HTTP/1.1\r\nX-Big: " + b"b" * (web_server.MAX_HEAD_BYTES + 10))
        assert _closed_by_server(big)
        big.close()
        idle = _idle(live.port, 60)
        deadline = time.monotonic() + 10
        while (
            live.dropped["closed: too many connections waiting, a newer one took its place"] < 20
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert live.dropped["closed: too many connections waiting, a newer one took its place"] == 20, dict(
            live.dropped
        )
        assert live.dropped["closed: request head over 32 KiB"] == 1, dict(live.dropped)
        started = time.monotonic()
        assert _get(live.port, live.token) == 200
        assert time.monotonic() - started < 5
        assert _closed_by_server(idle[0])  # the first of them made room
    finally:
        for sock in idle:
            sock.close()
        live.stop()
