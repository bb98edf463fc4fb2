"""Every process a script starts sends its last telemetry however it exits (issue 38, item 8).

multiprocessing's fork and forkserver workers end in ``os._exit`` (no atexit runs), so their last
sender cycle, the final collectives read and whatever was queued since the previous cycle were
lost: 2 fork workers of 300 all_reduce each were counted ~50, a worker that raised right after
init_rpc lost its RPC name, a loss reported just before the end was never recorded. The real jobs
here are tests/workers/fork_workers.py as one rpcctl rank; the last tests drive the reporter in a
real process against a socket the test holds, to show that the flush never holds an exit longer
than its bound (``reporter.EXIT_FLUSH_S``) when the launcher stops reading or is gone.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import WORKERS, launch_job, rpcctl

from rpcctl import inspect
from rpcctl.rank import reporter
from rpcctl.wire import protocol

pytestmark = pytest.mark.timeout(150)

JOB = str(WORKERS / "fork_workers.py")
ALL_REDUCES, RAISERS = 300, 4  # tests/workers/fork_workers.py
LOSSES = {7: 0.25, 8: 0.5, 9: 0.75, 10: 1.0}


def _launch(tmp_path, runs_dir, mode: str, code: int = 0, **keys):
    result, run_dir, _ = launch_job(
        tmp_path,
        runs_dir,
        name=f"fork-{mode}",
        script=JOB,
        args=[mode],
        nproc_per_node=1,
        timeout=100,
        preload=["torch"],
        **keys,
    )
    assert result.returncode == code, result.stdout + result.stderr
    return run_dir


def test_fork_workers_of_both_kinds_are_counted_exactly(tmp_path, runs_dir):
    # A ring of 1024 (the user's own knob, left alone by rpcctl): 300 collectives between two of
    # the sender's reads of the entries (every 2 s) must not overflow the default 256, which would
    # count the overwritten ones as op "?" (documented, and not what this test is about).
    run_dir = _launch(tmp_path, runs_dir, "collectives", env={"TORCH_FR_BUFFER_SIZE": "1024"})
    shown = rpcctl("inspect", "collectives", str(run_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    counts = {(s["pg"], s["op"]): (s["count"], s["ranks"]) for s in report["summary"]}
    # mp.Process with the fork context (world 0), then mp.spawn(start_method="fork") (world 1):
    # 300 all_reduce on each of the two workers of each, no fewer (each counts at most its own 300).
    assert counts == {
        ("0", "all_reduce"): (2 * ALL_REDUCES, [0, 1]),
        ("w1:0", "all_reduce"): (2 * ALL_REDUCES, [0, 1]),
    }, counts
    done = sorted((r["pg"], r["rank"], r["entered"], r["completed"]) for r in report["ranks"])
    assert done == [(pg, rank, ALL_REDUCES, ALL_REDUCES) for pg in ("0", "w1:0") for rank in (0, 1)], done


def test_a_fork_worker_that_raises_right_after_init_rpc_keeps_its_rpc_name(tmp_path, runs_dir):
    # its processes raised: the job failed (issue 40, item 1)
    run_dir = _launch(tmp_path, runs_dir, "rpc-raise", code=1)
    # The four raise at once: the root cause is whichever raised first, and counts the others.
    message = json.loads((run_dir / "run.json").read_text())["root_cause"]["message"]
    assert re.match(rf"forked[0-{RAISERS - 1}] \(pid \d+, ForkProcess-\d+, rank 0 ", message), message
    assert f"(and {RAISERS - 1} more of its processes raised)" in message, message
    children = [w for w in inspect.workers(run_dir) if w.kind == "child"]
    assert sorted((str(w.name), w.state, w.exit_code) for w in children) == [
        (f"forked{i}", "failed", 1) for i in range(RAISERS)
    ], children


def test_a_loss_reported_just_before_the_end_is_kept_however_the_worker_ends(tmp_path, runs_dir):
    """fork + os._exit(0) (the user's own), fork + sys.exit(3), forkserver + return, a fork Pool's
    worker closed and joined: each reports one loss and ends at once."""
    run_dir = _launch(tmp_path, runs_dir, "exits")
    losses = {loss.step: loss.loss for loss in inspect.losses(run_dir)}
    assert losses == LOSSES, losses
    states = [(w.state, w.exit_code) for w in inspect.workers(run_dir) if w.kind == "child"]
    assert states[:2] == [("succeeded", 0), ("failed", 3)], states  # fork workers: reaped by the rank


# -- the flush's bound, against a socket the test holds ---------------------------------------------

CHILD = """
import os, sys, time
import rpcctl
for step in range(int(sys.argv[1])):
    rpcctl.report(step=step, loss=1.0)
print(time.monotonic(), flush=True)
os._exit(0)
"""


def _reporting_process(path, losses: int) -> subprocess.Popen:
    env = {**os.environ, protocol.ENV_SOCKET: str(path)}
    env.pop(protocol.ENV_DISABLE, None)
    return subprocess.Popen([sys.executable, "-c", CHILD, str(losses)], env=env, stdout=subprocess.PIPE, text=True)


def _exit_delay(child: subprocess.Popen) -> float:
    """Seconds from just before the child's os._exit to its end (CLOCK_MONOTONIC: one clock for both)."""
    before = float(child.stdout.readline())
    child.wait(30)
    return time.monotonic() - before


def _events(data: bytes) -> list[dict]:
    out = []
    for line in data.splitlines():
        message = protocol.decode(line)
        if message is not None and message.get("k") == "batch":
            out.extend(message["ev"])
    return out


@pytest.fixture
def listener(tmp_path):
    path = tmp_path / "t.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(20)
    yield path, server
    server.close()


def test_os_exit_sends_the_last_cycle_when_the_launcher_reads(listener):
    path, server = listener
    child = _reporting_process(path, 50)
    try:
        conn, _ = server.accept()
        received = bytearray()

        def read() -> None:
            while chunk := conn.recv(65536):
                received.extend(chunk)

        reading = threading.Thread(target=read, daemon=True)
        reading.start()
        delay = _exit_delay(child)
        reading.join(10)
        conn.close()
    finally:
        child.kill()
        child.wait()
    events = _events(bytes(received))
    assert sorted(e["step"] for e in events if e["e"] == "loss") == list(range(50)), events
    assert [e["e"] for e in events][-1] == "bye", events
    assert delay < reporter.EXIT_FLUSH_S, delay


def test_os_exit_waits_at_most_its_bound_for_a_launcher_that_stopped_reading_or_is_gone(listener):
    path, server = listener
    stalled = _reporting_process(path, 30_000)  # megabytes of events: the socket's buffer fills, the sender blocks
    try:
        conn, _ = server.accept()  # and never read while the child runs
        stalled_delay = _exit_delay(stalled)
        conn.settimeout(5)
        received = bytearray()
        while chunk := conn.recv(1 << 20):
            received.extend(chunk)
        conn.close()
    finally:
        stalled.kill()
        stalled.wait()
    assert stalled_delay < reporter.EXIT_FLUSH_S + 1.0, stalled_delay  # the bound, and room for a loaded machine
    events = _events(bytes(received))
    assert events and not [e for e in events if e["e"] == "bye"], len(events)  # it tried, and was cut short

    gone = _reporting_process(path, 50)
    try:
        conn, _ = server.accept()
        conn.recv(65536)  # the hello
        conn.close()  # the launcher is gone
        server.close()
        gone_delay = _exit_delay(gone)
    finally:
        gone.kill()
        gone.wait()
    assert gone_delay < 1.0, gone_delay
