"""``rpcctl inspect ...`` and ``rpcctl stack`` through typer's runner, on a run whose store is
written here event by event (no processes): tables, filters, errors, and JSON documents whose
keys and values are pinned."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from rpcctl import inspect
from rpcctl.cli import app
from rpcctl.console import Console, set_console
from rpcctl.records.runs import RankState, RunRecord, rank_log, save_record
from rpcctl.wire import protocol
from rpcctl.telemetry.store import ProcInfo, StoreWriter

RREF_KEYS = [
    "rref_id",
    "owner",
    "owner_rank",
    "creator",
    "creator_rank",
    "holders",
    "type",
    "shape",
    "dtype",
    "device",
    "nbytes",
    "state",
    "created_at",
    "confirmed_at",
    "deleted_at",
    "call_site",
    "callee",
    "kind",
    "forks",
    "live_at_shutdown",
    "restart",
    "world",
    "ending",
    "last_used_at",
    "unused_s",
    "owner_autograd_contexts",
]
WORKER_KEYS = [
    "rank",
    "name",
    "host",
    "pid",
    "state",
    "exit_code",
    "cpu_percent",
    "rss_bytes",
    "device",
    "gpu_memory_bytes",
    "heartbeat_age_s",
    "stale",
    "kind",
    "rpc_rank",
    "parent_pid",
    "threads",
    "restart",
    "cuda_visible_devices",
    "device_maps",
    "dropped_events",
    "started_at",
    "ended_at",
    "cpu_s",
    "telemetry_cpu_s",
    "straggler",
    "dist_rank",
    "pg_world",
    "world",
    "parents",
]
LOSS_KEYS = ["rank", "step", "loss", "epoch", "metrics", "time", "source", "restart", "seq", "keyed_by", "rule"]
DEVICE_KEYS = ["device", "name", "ranks", "workers", "memory_used_bytes", "memory_total_bytes", "rref_bytes", "rrefs"]


def _record(run_dir: Path, status: str = "succeeded") -> RunRecord:
    record = RunRecord(
        run_id=run_dir.name,
        name="synthetic",
        status=status,
        run_dir=str(run_dir),
        config_path=None,
        script="s.py",
        world_size=2,
        nproc_per_node=2,
        start_method="fork",
        host="h",
        launcher_pid=1,
        launcher_started=0.0,
        master_addr="127.0.0.1",
        master_port=1,
        started_at="2026-01-01T00:00:00+00:00",
        ranks=[
            RankState(rank=0, local_rank=0, pid=1000, state="succeeded", exit_code=0),
            RankState(rank=1, local_rank=1, pid=1001, state="succeeded", exit_code=0),
        ],
    )
    save_record(record)
    return record


@pytest.fixture
def run(runs_dir) -> Path:
    """A finished 2-rank run: worker1 owns a tensor made for worker0, and a second one that was
    freed; worker0 owns a local RRef forked to worker1; a stale child process; losses."""
    run_dir = runs_dir / "synthetic-1"
    run_dir.mkdir(parents=True)
    _record(run_dir)
    w = StoreWriter(protocol.db_path(run_dir))
    t = 1_800_000_000.0
    w.rank_started(0, 0, 1000, 0, "cpu", t)
    w.rank_started(1, 0, 1001, 1, "cpu", t)
    procs = []
    for rank in (0, 1):
        proc = ProcInfo(
            w.proc_connected({"pid": 1000 + rank, "ppid": 1, "host": "h", "rank": rank, "kind": "rank"}, 0, t),
            1000 + rank,
            rank,
            0,
        )
        w.apply(
            proc,
            {
                "e": "rpc",
                "name": f"worker{rank}",
                "rpc_rank": rank,
                "world_size": 2,
                "workers": {"0": "worker0", "1": "worker1"},
                "t": t,
            },
        )
        procs.append(proc)
    p0, p1 = procs
    w.apply(
        p0,
        {
            "e": "rref",
            "id": "0:0",
            "fork": "0:1",
            "owner": "worker1",
            "owner_rank": 1,
            "kind": "remote",
            "callee": "make",
            "site": "train.py:10 in main",
            "confirmed": True,
            "t": t + 1,
        },
    )
    w.apply(
        p1,
        {
            "e": "desc",
            "id": "0:0",
            "value": {"type": "Tensor", "shape": [16, 32], "dtype": "float32", "device": "cpu", "nbytes": 2048},
            "t": t + 1,
        },
    )
    w.apply(
        p0,
        {
            "e": "rref",
            "id": "0:2",
            "fork": "0:3",
            "owner": "worker1",
            "owner_rank": 1,
            "kind": "remote",
            "callee": "make",
            "site": "train.py:11 in main",
            "confirmed": True,
            "t": t + 1,
        },
    )
    w.apply(
        p1,
        {
            "e": "desc",
            "id": "0:2",
            "value": {"type": "Tensor", "shape": [4], "dtype": "float32", "device": "cpu", "nbytes": 16},
            "t": t + 1,
        },
    )
    w.apply(p1, {"e": "vfree", "id": "0:2", "t": t + 2})
    w.apply(
        p0,
        {
            "e": "rref",
            "id": "0:4",
            "fork": "",
            "owner": "worker0",
            "owner_rank": 0,
            "kind": "local",
            "site": "train.py:12 in main",
            "confirmed": True,
            "value": {"type": "KV", "dtype": "int64", "device": "cpu", "nbytes": 80},
            "t": t + 1,
        },
    )
    w.apply(p1, {"e": "fork", "id": "0:4", "fork": "0:5", "owner_rank": 0, "type": "KV", "t": t + 1.5})
    w.apply(
        p0, {"e": "churn", "owner": "worker1", "callee": "make", "site": "train.py:20 in loop", "n": 41, "t": t + 2}
    )
    for proc in procs:
        w.apply(
            proc,
            {
                "e": "probe",
                "cpu_percent": 50.0,
                "rss_bytes": 100 << 20,
                "threads": 9,
                "device": "cpu",
                "t": t + 2,
                "cpu_s": 12.0,
                "telemetry_cpu_s": 0.06,
            },
        )
    w.set_meta(server_cpu_s=0.12)
    for step, loss in enumerate([1.0, 0.5, 0.25]):
        w.loss(0, 0, step, None, loss, None, t + 3 + step, "log")
    w.loss(1, 0, 7, 2, 0.125, {"acc": 0.5}, t + 4, "report")
    w.apply(p0, {"e": "used", "id": "0:0", "fork": "0:1", "t": t + 7.5})  # in use to the end
    w.apply(p0, {"e": "shutdown", "t": t + 8})
    w.rank_exited(0, 1000, "succeeded", 0, t + 9)
    w.rank_exited(1, 1001, "succeeded", 0, t + 9)
    for proc in procs:
        w.proc_ended(proc.proc_id, t + 9)
    w.close()
    return run_dir


@pytest.fixture
def cli():
    set_console(
        Console(
            out=RichConsole(width=250, no_color=True, highlight=False, force_terminal=False, soft_wrap=False),
            err=RichConsole(
                stderr=True, width=250, no_color=True, highlight=False, force_terminal=False, soft_wrap=True
            ),
        )
    )
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    yield invoke
    set_console(None)


def _json(result) -> object:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_rrefs_json_is_one_stable_document(cli, run):
    document = _json(cli("inspect", "rrefs", "--json"))
    assert [list(r) for r in document] == [RREF_KEYS] * 3
    made, freed, kv = document
    assert made | {"created_at": None, "confirmed_at": None, "deleted_at": None} == {
        "rref_id": "0:0",
        "owner": "worker1",
        "owner_rank": 1,
        "creator": "worker0",
        "creator_rank": 0,
        "holders": [],
        "type": "Tensor",
        "shape": [16, 32],
        "dtype": "float32",
        "device": "cpu",
        "nbytes": 2048,
        "state": "deleted",
        "created_at": None,
        "confirmed_at": None,
        "deleted_at": None,
        "call_site": "train.py:10 in main",
        "callee": "make",
        "kind": "remote",
        "forks": 0,
        "live_at_shutdown": True,
        "restart": 0,
        "world": 0,
        "ending": "at shutdown",
        "last_used_at": "2027-01-15T08:00:07.500000+00:00",
        "unused_s": None,
        "owner_autograd_contexts": None,
    }
    assert made["created_at"] == "2027-01-15T08:00:01+00:00" and made["deleted_at"] == "2027-01-15T08:00:09+00:00"
    assert (freed["rref_id"], freed["deleted_at"], freed["live_at_shutdown"]) == (
        "0:2",
        "2027-01-15T08:00:02+00:00",
        False,
    )
    assert (kv["kind"], kv["type"], kv["owner"], kv["forks"], kv["live_at_shutdown"]) == (
        "local",
        "KV",
        "worker0",
        1,
        True,
    )
    assert _json(cli("inspect", "rrefs", "--json")) == document  # stable


def test_rrefs_filters_summary_and_table(cli, run):
    assert [r["rref_id"] for r in _json(cli("inspect", "rrefs", "--owner", "worker0", "--json"))] == ["0:4"]
    assert [r["rref_id"] for r in _json(cli("inspect", "rrefs", "--owner", "1", "--json"))] == ["0:0", "0:2"]
    assert _json(cli("inspect", "rrefs", "--state", "live", "--json")) == []
    summary = _json(cli("inspect", "rrefs", "--summary", "--json"))
    assert summary == [
        {
            "owner": "worker0",
            "owner_rank": 0,
            "live": 0,
            "pending": 0,
            "deleted": 1,
            "live_bytes": 0,
            "short_lived": 0,
            "world": 0,
        },
        {
            "owner": "worker1",
            "owner_rank": 1,
            "live": 0,
            "pending": 0,
            "deleted": 2,
            "live_bytes": 0,
            "short_lived": 41,
            "world": 0,
        },
    ]
    result = cli("inspect", "rrefs", str(run))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RREF", "OWNER", "HOLDERS", "TYPE", "SHAPE", "DEVICE", "BYTES", "STATE", "CALL", "SITE"]
    assert lines[1].split()[:8] == ["0:0", "worker1", "-", "Tensor", "(16,", "32)", "cpu", "2.0"]
    assert "RRefs by owner" in result.stdout and "SHORT-LIVED" in result.stdout
    wide = cli("inspect", "rrefs", "--wide").stdout
    assert "CALLEE" in wide.splitlines()[0] and "float32" in wide


def test_rrefs_usage_errors(cli, run):
    result = cli("inspect", "rrefs", "--state", "gone")
    assert result.exit_code == 2 and "choose from pending, live, deleted" in result.stderr and result.stdout == ""
    result = cli("inspect", "rrefs", "--json", "--watch")
    assert result.exit_code == 2 and "cannot be combined" in result.stderr
    result = cli("inspect", "rrefs", "no-such-run")
    assert result.exit_code == 2 and "no run 'no-such-run'" in result.stderr


def test_workers_json_and_table(cli, run):
    document = _json(cli("inspect", "workers", "--json"))
    assert [list(w) for w in document] == [WORKER_KEYS] * 2
    assert [
        (w["rank"], w["name"], w["pid"], w["state"], w["exit_code"], w["kind"], w["heartbeat_age_s"]) for w in document
    ] == [(0, "worker0", 1000, "succeeded", 0, "rank", None), (1, "worker1", 1001, "succeeded", 0, "rank", None)]
    assert [(w["cpu_s"], w["telemetry_cpu_s"]) for w in document] == [(12.0, 0.06), (12.0, 0.06)]
    table = cli("inspect", "workers").stdout
    assert table.splitlines()[0].split()[:6] == ["RANK", "NAME", "PID", "STATE", "EXIT", "CPU"]
    # 2 × 60 ms of senders + 120 ms of the launcher's server, out of 2 × 12 s.
    assert (
        table.splitlines()[-1] == "telemetry CPU: senders 120.0 ms + launcher 120.0 ms = 1.0% of the processes' 24.0 s"
    )


def test_a_store_from_before_cpu_accounting_still_reads(cli, run):
    db = sqlite3.connect(protocol.db_path(run))
    db.execute("ALTER TABLE procs DROP COLUMN cpu_s")
    db.execute("ALTER TABLE procs DROP COLUMN telemetry_cpu_s")
    db.execute("DELETE FROM meta WHERE key = 'server_cpu_s'")
    db.commit()
    db.close()
    document = _json(cli("inspect", "workers", "--json"))
    assert [(w["rank"], w["cpu_s"], w["telemetry_cpu_s"]) for w in document] == [(0, None, None), (1, None, None)]
    assert inspect.telemetry_cost(run) is None
    assert "telemetry CPU" not in cli("inspect", "workers").stdout


def test_a_silent_running_process_is_flagged_stale(cli, runs_dir):
    run_dir = runs_dir / "live-1"
    run_dir.mkdir(parents=True)
    record = _record(run_dir, status="running")
    # A live run has a live launcher (else it reads as lost): this test's own process stands in.
    record.launcher_pid, record.launcher_started = os.getpid(), psutil.Process().create_time()
    record.world_size = record.nproc_per_node = 1
    record.ranks = [RankState(rank=0, local_rank=0, pid=1000, state="running")]
    save_record(record)
    w = StoreWriter(protocol.db_path(run_dir))
    now = time.time()
    w.rank_started(0, 0, 1000, 0, "cpu", now - 60)
    proc = ProcInfo(w.proc_connected({"pid": 1000, "rank": 0, "kind": "rank"}, 0, now - 60), 1000, 0, 0)
    w.apply(proc, {"e": "probe", "cpu_percent": 0.0, "t": now - 30})
    w.commit()  # left open: the run is live
    try:
        (worker,) = _json(cli("inspect", "workers", "--json", str(run_dir)))
        assert worker["state"] == "running" and worker["stale"] and 25 < worker["heartbeat_age_s"] < 120
        assert "STALE: rank 0 (pid 1000) no heartbeat for" in cli("inspect", "workers", str(run_dir)).stdout
    finally:
        w.close()


def test_a_rank_the_store_has_not_heard_of_yet_is_shown_from_the_run_record(cli, runs_dir):
    """The launcher writes run.json before its telemetry thread stores the rank (~0.2 s later):
    a launcher killed in between must not leave the view without that rank."""
    run_dir = runs_dir / "young-1"
    run_dir.mkdir(parents=True)
    record = _record(run_dir, status="running")
    record.launcher_pid, record.launcher_started = os.getpid(), psutil.Process().create_time()
    record.ranks[1].state, record.ranks[1].exit_code = "running", None
    record.ranks[1].started_at = "2026-01-01T00:00:05+00:00"
    save_record(record)
    w = StoreWriter(protocol.db_path(run_dir))
    w.rank_started(0, 0, 1000, 0, "cpu", time.time())
    w.commit()
    try:
        workers = _json(cli("inspect", "workers", "--json", str(run_dir)))
        assert [(x["rank"], x["pid"], x["state"]) for x in workers] == [(0, 1000, "running"), (1, 1001, "running")], (
            workers
        )
        assert workers[1]["started_at"] == "2026-01-01T00:00:05+00:00"
    finally:
        w.close()


def test_gpus_on_a_cpu_only_run(cli, run):
    document = _json(cli("inspect", "gpus", "--json"))
    assert document == [
        {
            "device": "cpu",
            "name": None,
            "ranks": [0, 1],
            "workers": ["worker0", "worker1"],
            "memory_used_bytes": None,
            "memory_total_bytes": None,
            "rref_bytes": 0,
            "rrefs": 0,
        }
    ]
    assert list(document[0]) == DEVICE_KEYS
    assert "No GPU in this run: every rank ran on the CPU." in cli("inspect", "gpus").stdout


def test_losses_json_table_and_plot(cli, run, tmp_path):
    document = _json(cli("inspect", "losses", "--json"))
    assert [list(r) for r in document] == [LOSS_KEYS] * 4
    assert [(r["rank"], r["step"], r["loss"], r["epoch"], r["metrics"], r["source"]) for r in document] == [
        (0, 0, 1.0, None, {}, "log"),
        (0, 1, 0.5, None, {}, "log"),
        (0, 2, 0.25, None, {}, "log"),
        (1, 7, 0.125, 2, {"acc": 0.5}, "report"),
    ]
    assert _json(cli("inspect", "losses", "--rank", "1", "--json"))[0]["loss"] == 0.125
    text = cli("inspect", "losses", "--last", "2").stdout
    assert "Last 2 steps" in text and "RANK 0" in text and "█▃▁" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "loss.png"
    result = cli("inspect", "losses", "--plot", str(png), "--json")
    assert result.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank_is_repeatable_in_every_command_that_takes_it(cli, run):
    both = _json(cli("inspect", "losses", "-r", "0", "--rank", "1", "--json"))
    assert [r["rank"] for r in both] == [0, 0, 0, 1]
    assert {r["rank"] for r in _json(cli("inspect", "losses", "-r", "0", "--json"))} == {0}
    assert "Per rank (loss)" in cli("inspect", "losses", "-r", "1", "-r", "0").stdout
    for rank in (0, 1):
        rank_log(run, rank).parent.mkdir(exist_ok=True)
        rank_log(run, rank).write_text(f"hello from {rank}\n")
    assert cli("logs", "-r", "1", "-r", "0").stdout == "[rank0]: hello from 0\n[rank1]: hello from 1\n"
    assert cli("logs", "-r", "1").stdout == "[rank1]: hello from 1\n"
    bad = cli("logs", "-r", "0", "-r", "7")
    assert bad.exit_code == 2 and "--rank 7: run synthetic-1 has ranks 0-1" in bad.stderr


def test_a_run_without_telemetry_gives_empty_documents(cli, runs_dir):
    run_dir = runs_dir / "bare-1"
    run_dir.mkdir(parents=True)
    _record(run_dir)
    for view in ("rrefs", "losses"):
        result = cli("inspect", view, "--json")
        assert result.exit_code == 0 and result.stdout.strip() == "[]" and "has no telemetry store" in result.stderr
    assert "no RRefs" in cli("inspect", "rrefs").stdout


def test_stack_refuses_a_finished_run(cli, run):
    result = cli("stack", "--rank", "0")
    assert result.exit_code == 2 and "is not running" in result.stderr
