"""Telemetry without torch: the loss parser, the server and store fed by a scripted worker, the
socket's guards, the sitecustomize chain. Real RPC jobs are in test_telemetry_jobs.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from rpcctl import inspect
from rpcctl.rank import reporter as worker
from rpcctl.wire import protocol
from rpcctl.telemetry.channel import SITE_DIR
from rpcctl.views.dashboard import dashboard_panels
from rpcctl.telemetry.losses import LossParser
from rpcctl.telemetry.server import TelemetryServer

# ---------------------------------------------------------------------------------------------
# Loss parsing


@pytest.mark.parametrize(
    "line, loss, step, epoch, metrics",
    [
        ("step 3 loss 0.52", 0.52, 3, None, {}),
        ("loss=0.52", 0.52, None, None, {}),
        ("Epoch 3: 0.52", 0.52, None, 3, {}),
        ("Epoch [3/10], Step [100/600], Loss: 0.1234", 0.1234, 100, 3, {}),
        ("iter 40 | train_loss 0.31 | lr=1e-3 acc: 0.9", 0.31, 40, None, {"lr": 0.001, "acc": 0.9}),
        ("INFO: step: 10, loss: 2.5e-3", 0.0025, 10, None, {}),
        ("epoch 2 loss 0.5 val_loss=0.6", 0.5, None, 2, {"val_loss": 0.6}),
        ("[rank 1] global_step=7 loss = -1.5", -1.5, 7, None, {}),
    ],
)
def test_default_pattern_parses_common_shapes(line, loss, step, epoch, metrics):
    parsed = LossParser().parse(line)
    assert parsed is not None
    assert (parsed.loss, parsed.step, parsed.epoch, parsed.metrics) == (loss, step, epoch, metrics)


@pytest.mark.parametrize(
    "line",
    [
        "hello",
        "val loss 0.3",
        "val_loss=0.3",
        "test loss: 1.0",
        "loss did not go down: 1 -> 2",
        "closs=3",
        "epoch 3 done",
        "",
    ],
)
def test_default_pattern_ignores_other_lines(line):
    assert LossParser().parse(line) is None


def test_custom_pattern_replaces_the_default():
    parser = LossParser(r"it=(?P<step>\d+) obj=(?P<loss>\S+) gnorm=(?P<gnorm>\S+)")
    parsed = parser.parse("it=12 obj=0.75 gnorm=3.5")
    assert (parsed.loss, parsed.step, parsed.metrics) == (0.75, 12, {"gnorm": 3.5})
    assert parser.parse("step 3 loss 0.52") is None


# ---------------------------------------------------------------------------------------------
# Server and store, fed by a scripted worker


class ScriptedWorker:
    """Speaks the worker's protocol over the run's socket, as a rank would."""

    def __init__(self, path: str, pid: int, rank: int, kind: str = "rank", host: str = "h"):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.send_raw({"k": "hello", "pid": pid, "ppid": 1, "host": host, "rank": rank, "kind": kind, "t": time.time()})

    def send_raw(self, message: dict) -> None:
        self.sock.sendall(protocol.encode(message))

    def send(self, *events: dict) -> None:
        now = time.time()
        self.send_raw({"k": "batch", "ev": [{"t": now, **e} for e in events]})

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path):
    srv = TelemetryServer(tmp_path / "run", None, 2)
    env = srv.start()
    yield srv, env
    srv.close()


def test_start_makes_a_private_socket_and_the_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/elsewhere")
    srv = TelemetryServer(tmp_path / "run", None, 2)
    env = srv.start()
    try:
        path = Path(env[protocol.ENV_SOCKET])
        assert path.parent == tmp_path / "run" and stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        parts = env["PYTHONPATH"].split(os.pathsep)
        assert parts[0] == str(SITE_DIR) and parts[-1] == "/opt/elsewhere"
        assert (tmp_path / "run" / "telemetry.db").is_file()
    finally:
        srv.close()
    assert not path.exists()


def test_a_socket_path_too_long_moves_to_a_private_directory(tmp_path):
    run_dir = tmp_path / ("x" * 120)
    srv = TelemetryServer(run_dir, None, 1)
    env = srv.start()
    try:
        path = Path(env[protocol.ENV_SOCKET])
        assert len(str(path)) < 100 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        ScriptedWorker(str(path), pid=5, rank=0).close()
    finally:
        srv.close()
    assert not path.parent.exists()


def test_each_rank_keeps_the_losses_of_its_most_direct_source(server):
    # rpcctl.report() before a library's trainer callback (rpcctl.rank.steps) before printed
    # lines: a loss is never counted twice, whichever ones a rank has.
    srv, env = server
    path = env[protocol.ENV_SOCKET]
    for rank in (0, 1, 2):
        srv.rank_started(rank, 1000 + rank, rank, "cpu", 0)
    w0, w1 = ScriptedWorker(path, 1000, 0), ScriptedWorker(path, 1001, 1)
    w0.send({"e": "loss", "step": 2, "loss": 0.5, "metrics": {"epoch": 0.5}, "source": "transformers"})
    w1.send(
        {"e": "loss", "step": 2, "loss": 0.4, "metrics": {}, "source": "lightning"},
        {"e": "loss", "step": 2, "loss": 0.3, "metrics": {}},  # the user's rpcctl.report()
        # a process cannot pass as printed lines
        {"e": "loss", "step": 3, "loss": 0.2, "metrics": {}, "source": "log"},
    )
    for rank in (0, 1, 2):
        srv.log_line(rank, f"{{'loss': '0.{rank}5', 'epoch': '0.5'}}")
    expected = [(0, 2, 0.5, "transformers"), (1, 2, 0.3, "report"), (1, 3, 0.2, "report"), (2, None, 0.25, "log")]

    def got():
        return sorted((r.rank, r.step, r.loss, r.source) for r in inspect.losses(srv.run_dir))

    try:  # every printed line stored (the counts follow them), and every event
        wait_until(
            lambda: inspect.line_counts(srv.run_dir) == {0: (1, 1), 1: (1, 1), 2: (1, 1)} and got() == expected,
            5,
            "the losses",
        )
    finally:
        assert got() == expected
    w0.close()
    w1.close()


def _wait_rrefs(run_dir: Path, predicate, what: str):
    return wait_until(lambda: (lambda rs: rs if predicate(rs) else None)(inspect.rrefs(run_dir)), 5, what)


def test_store_follows_rrefs_forks_values_and_losses(server):
    srv, env = server
    run_dir = srv.run_dir
    path = env[protocol.ENV_SOCKET]
    srv.rank_started(0, 1000, 0, "cpu", 0)
    srv.rank_started(1, 1001, 1, "cpu", 0)
    w0, w1 = ScriptedWorker(path, 1000, 0), ScriptedWorker(path, 1001, 1)
    workers_map = {"0": "worker0", "1": "worker1"}
    w0.send({"e": "rpc", "name": "worker0", "rpc_rank": 0, "world_size": 2, "workers": workers_map})
    w1.send(
        {
            "e": "rpc",
            "name": "worker1",
            "rpc_rank": 1,
            "world_size": 2,
            "workers": workers_map,
            "device_maps": {"worker0": {"cpu": "cpu"}},
        }
    )
    w0.send(
        {
            "e": "rref",
            "id": "0:0",
            "fork": "0:1",
            "owner": "worker1",
            "owner_rank": 1,
            "kind": "remote",
            "callee": "make",
            "site": "s.py:3 in main",
            "confirmed": False,
        },
        {
            "e": "rref",
            "id": "0:2",
            "fork": "",
            "owner": "worker0",
            "owner_rank": 0,
            "kind": "local",
            "site": "s.py:4 in main",
            "confirmed": True,
            "value": {"type": "Tensor", "shape": [10], "dtype": "float64", "device": "cpu", "nbytes": 80},
        },
        {
            "e": "rref",
            "id": "0:4",
            "fork": "0:5",
            "owner_rank": 1,
            "kind": "remote",
            "callee": "slow",
            "site": "s.py:5 in main",
            "confirmed": False,
        },
        {"e": "churn", "owner": "worker1", "callee": "make", "site": "s.py:9 in loop", "n": 5},
    )
    w1.send(
        {
            "e": "desc",
            "id": "0:0",
            "value": {"type": "Tensor", "shape": [4, 4], "dtype": "float32", "device": "cpu", "nbytes": 64},
        },
        {"e": "fork", "id": "0:2", "fork": "0:3", "owner_rank": 0, "type": "Tensor"},
        {"e": "probe", "cpu_percent": 12.5, "rss_bytes": 1 << 20, "threads": 3, "device": "cpu"},
        {"e": "loss", "step": 1, "loss": 0.5, "epoch": None, "metrics": {"acc": 0.9}},
    )
    records = _wait_rrefs(
        run_dir, lambda rs: len(rs) == 3 and rs[0].type == "Tensor" and len(rs[1].holders) == 2, "three RRefs"
    )
    by_id = {r.rref_id: r for r in records}
    made, local, slow = by_id["0:0"], by_id["0:2"], by_id["0:4"]
    assert (made.owner, made.owner_rank, made.creator, made.type, made.shape, made.nbytes, made.state) == (
        "worker1",
        1,
        "worker0",
        "Tensor",
        [4, 4],
        64,
        "pending",
    )
    assert (local.kind, local.owner, local.holders, local.forks, local.state, local.nbytes) == (
        "local",
        "worker0",
        ["worker0", "worker1"],
        1,
        "live",
        80,
    )
    assert (slow.owner, slow.state, slow.type) == ("worker1", "pending", None)  # owner name from the worker list

    w0.send({"e": "conf", "id": "0:0"})
    wait_until(
        lambda: inspect.rrefs(run_dir, state="live") and len(inspect.rrefs(run_dir, state="live")) == 2,
        5,
        "0:0 confirmed",
    )
    w0.send({"e": "rel", "id": "0:0", "fork": "0:1"})
    w1.send({"e": "rel", "id": "0:2", "fork": "0:3"})
    _wait_rrefs(
        run_dir,
        lambda rs: rs[0].state == "deleted" and rs[1].holders == ["worker0"],
        "0:0 deleted, 0:2 held by worker0 only",
    )
    owners = {o.owner: o for o in inspect.rref_owners(run_dir)}
    assert (owners["worker1"].pending, owners["worker1"].deleted, owners["worker1"].short_lived) == (1, 1, 5)
    assert (owners["worker0"].live, owners["worker0"].live_bytes) == (1, 80)

    # Losses: rank 1 reports, so its printed losses are not counted twice.
    srv.log_line(0, "step 3 loss 0.52")
    srv.log_line(0, "not a loss")
    srv.log_line(0, "loss=0.25")
    srv.log_line(1, "step 1 loss 0.5")
    wait_until(lambda: len(inspect.losses(run_dir)) == 3, 5, "three losses")
    losses = [(r.rank, r.seq, r.step, r.loss, r.source, r.metrics, r.where) for r in inspect.losses(run_dir)]
    # Rank 0's second loss has no step: its records are keyed by arrival (#1, #2), not step 0.
    assert sorted(losses) == [
        (0, 0, 3, 0.52, "log", {}, "#1"),
        (0, 1, None, 0.25, "log", {}, "#2"),
        (1, 0, 1, 0.5, "report", {"acc": 0.9}, "step 1"),
    ]
    assert inspect.line_counts(run_dir) == {0: (3, 2), 1: (1, 1)}

    workers = {w.rank: w for w in inspect.workers(run_dir)}
    assert (workers[1].name, workers[1].pid, workers[1].state, workers[1].cpu_percent, workers[1].rss_bytes) == (
        "worker1",
        1001,
        "running",
        12.5,
        1 << 20,
    )
    assert (
        workers[1].device_maps == {"worker0": {"cpu": "cpu"}}
        and workers[1].heartbeat_age_s < 5
        and not workers[1].stale
    )

    # Shutdown with 0:2 and the pending 0:4 still referenced: released by shutdown, not leaks.
    w0.send({"e": "shutdown"})
    time.sleep(0.3)
    w0.close()
    w1.close()
    srv.rank_exited(0, 1000, "succeeded", 0)
    srv.rank_exited(1, 1001, "failed", 3)
    srv.close()
    assert [(r.rref_id, r.ending, r.call_site) for r in inspect.ended_rrefs(run_dir)] == [
        ("0:2", "at shutdown", "s.py:4 in main"),
        ("0:4", "at shutdown", "s.py:5 in main"),
    ]
    assert inspect.leaked_rrefs(run_dir) == []
    assert {r.state for r in inspect.rrefs(run_dir)} == {"deleted"}  # nothing outlives its processes
    final = {w.rank: (w.state, w.exit_code, w.heartbeat_age_s) for w in inspect.workers(run_dir)}
    assert final == {0: ("succeeded", 0, None), 1: ("failed", 3, None)}  # the run record's words
    # Closed: a plain SQLite file, nothing else left behind.
    assert sorted(p.name for p in run_dir.iterdir()) == ["telemetry.db"]


def test_bad_messages_are_counted_not_fatal(server):
    srv, env = server
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(env[protocol.ENV_SOCKET])
    sock.sendall(b"not json\n[1,2]\n" + protocol.encode({"k": "batch", "ev": []}))  # a batch before hello
    wait_until(lambda: srv.bad_messages >= 3, 5, "bad messages counted")
    good = ScriptedWorker(env[protocol.ENV_SOCKET], 7, 0)
    good.send({"e": "loss", "step": 0, "loss": 1.0}, {"e": "no-such-event"}, {"e": "rref"})  # last: no id
    wait_until(lambda: inspect.losses(srv.run_dir), 5, "the good worker's loss")
    sock.close()
    good.close()


def test_ranks_on_two_hosts_with_the_same_pid_stay_apart(server):
    srv, env = server
    path = env[protocol.ENV_SOCKET]
    # A multi-node run: node 1's launcher relays its rank's start, and pids repeat across hosts.
    srv.rank_started(0, 4242, 0, "cpu", 0)
    srv.rank_started(1, 4242, 0, "cpu", 0)
    on_a, on_b = ScriptedWorker(path, 4242, 0, host="host-a"), ScriptedWorker(path, 4242, 1, host="host-b")
    on_a.send({"e": "probe", "cpu_percent": 1.0, "rss_bytes": 1 << 20, "threads": 3})
    on_b.send({"e": "probe", "cpu_percent": 2.0, "rss_bytes": 2 << 20, "threads": 4})
    found = wait_until(
        lambda: (lambda ws: ws if len(ws) == 2 and all(w.rss_bytes for w in ws) else None)(
            inspect.workers(srv.run_dir)
        ),
        5,
        "both ranks with their probes",
    )
    assert [(w.rank, w.host, w.rss_bytes) for w in found] == [(0, "host-a", 1 << 20), (1, "host-b", 2 << 20)]
    on_a.close()
    on_b.close()


def test_a_worker_that_cannot_reach_the_server_disables_itself(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(protocol.ENV_SOCKET, str(tmp_path / "nowhere.sock"))
    monkeypatch.setattr(worker, "_reporter", None)
    worker.report(step=1, loss=0.5)  # joins lazily; fails once, quietly, then stays off
    worker.report(step=2, loss=0.4)
    assert "telemetry disabled" in capfd.readouterr().err
    assert worker._reporter is not None and worker._reporter.failed and not worker._reporter.active
    monkeypatch.setattr(worker, "_reporter", None)


def test_the_probe_reads_the_process_figures_psutil_gives():
    """The probe reads /proc/self/stat itself (psutil cost a loaded rank ten times as much): the
    same CPU time, resident memory and thread count as psutil, and cpu_percent as psutil
    computes it (CPU time over wall time since the last read)."""
    import threading

    import psutil

    probe = worker._ProcStat.open()
    assert probe is not None
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        ours, theirs = probe.read(), psutil.Process()
        times = theirs.cpu_times()
        assert ours["threads"] == theirs.num_threads()
        assert ours["cpu_s"] == pytest.approx(times.user + times.system, abs=0.05)
        assert ours["rss_bytes"] == pytest.approx(theirs.memory_info().rss, rel=0.05)

        def used() -> tuple[float, float]:
            now = theirs.cpu_times()
            return now.user + now.system, time.monotonic()

        probe.read()  # the interval starts here, for the probe and for psutil's figures
        cpu0, wall0 = used()
        busy_until = time.monotonic() + 0.3
        while time.monotonic() < busy_until:  # one thread busy: ~100% on a quiet machine, less on a loaded one
            pass
        percent = probe.read()["cpu_percent"]
        cpu1, wall1 = used()
        assert percent > 0 and percent == pytest.approx(100 * (cpu1 - cpu0) / (wall1 - wall0), abs=15)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_a_burst_of_events_arrives_whole_in_slices(server):
    """A cycle with far more events than the sender encodes at once (it pauses between slices
    to let RPC threads have the GIL) still delivers every event, once, in order."""
    srv, env = server
    code = (
        "from rpcctl.rank import reporter as worker, rrefs\n"
        "worker.start()\n"
        "n = 10 * rrefs.GIL_SLICE + 7\n"
        "for step in range(n):\n"
        "    worker.report(step=step, loss=1.0 / (step + 1))\n"
        "worker.stop()\n"
        "print(n)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, RANK="0", **env), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    n = int(result.stdout)
    losses = wait_until(
        lambda: (lambda ls: ls if len(ls) == n else None)(inspect.losses(srv.run_dir)), 10, f"{n} losses"
    )
    assert [(r.step, r.loss) for r in losses] == [(step, 1.0 / (step + 1)) for step in range(n)]
    assert srv.bad_messages == 0


def test_report_outside_rpcctl_is_a_no_op(monkeypatch):
    monkeypatch.delenv(protocol.ENV_SOCKET, raising=False)
    monkeypatch.setattr(worker, "_reporter", None)
    worker.report(step=1, loss=0.5, acc=1)
    worker.start()
    worker.stop()
    assert worker._reporter is None


def test_dashboard_panels(server):
    srv, env = server
    assert dashboard_panels(srv.run_dir / "missing") == []
    w = ScriptedWorker(env[protocol.ENV_SOCKET], 1000, 0)
    w.send(
        {"e": "rpc", "name": "worker0", "rpc_rank": 0, "workers": {"0": "worker0"}},
        {
            "e": "rref",
            "id": "0:0",
            "fork": "",
            "owner": "worker0",
            "owner_rank": 0,
            "kind": "local",
            "confirmed": True,
            "value": {"type": "Tensor", "nbytes": 2048},
        },
    )
    srv.log_line(0, "step 1 loss 0.5")
    srv.log_line(0, "step 2 loss 0.25")
    panels = wait_until(lambda: (lambda p: p if len(p) == 2 else None)(dashboard_panels(srv.run_dir)), 5, "two panels")
    from rich.console import Console

    console = Console(width=100, record=True, no_color=True)
    for panel in panels:
        console.print(panel)
    text = console.export_text()
    assert "worker0" in text and "2.0 KiB" in text and "0.25" in text
    w.close()


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(SITE_DIR), str(Path(__file__).resolve().parents[1]), str(other)])
    )
    env[protocol.ENV_SOCKET] = str(tmp_path / "unused.sock")
    code = (
        "import os, sys; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'), 'torch' in sys.modules,"
        " any(getattr(f, 'module', None) == 'torch' for f in sys.meta_path))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "False", "True"]  # chained; torch not imported; hook waiting


def test_protocol_round_trip():
    message = {"k": "batch", "ev": [{"e": "loss", "loss": float("nan")}]}
    line = protocol.encode(message)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    decoded = protocol.decode(line)
    assert decoded["k"] == "batch" and json.dumps(decoded, allow_nan=True)
    assert protocol.decode(b"\xff") is None and protocol.decode(b"[1]") is None
