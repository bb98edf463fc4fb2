"""Process groups have one identity on every rank (issue 38, items 5, 6): real gloo jobs through
``rpcctl launch``.

The Flight Recorder numbers a process's groups in the order it made their backends, so RPC's own
gloo group (made by init_rpc, not through c10d's API) shifts the ids: in a DDP + RPC job, id 1
is RPC's group on the parameter server and the trainers' group on the trainers. Groups are
matched across ranks by their c10d name (RPC's own: ``rpc``), and their members come from c10d's
own list of the group's ranks, not from the ranks that happened to report the group."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import ROOT, WORKERS, assert_no_process_left, launch_job, only_run, rpcctl
from test_trace import validate

from rpcctl.wire import protocol

pytestmark = pytest.mark.timeout(120)


def _hung(tmp_path, runs_dir, mode: str) -> str:
    result, run_dir, rec = launch_job(
        tmp_path,
        runs_dir,
        name=f"groups-{mode}",
        script=str(WORKERS / "subgroups_job.py"),
        args=[mode],
        nproc_per_node=3,
        timeout=40,
        hang_timeout=6,
        preload=["torch"],
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert rec["root_cause"]["reason"] == "hang", rec["root_cause"]
    return rec["root_cause"]["message"]


def test_a_ddp_rpc_hang_names_the_trainer_not_the_parameter_server(tmp_path, runs_dir):
    """The trainers' group and RPC's are id 1 on different ranks: before, the parameter server
    (RPC's group, 3 collectives) was said not to have entered the trainers' all_reduce #5."""
    message = _hung(tmp_path, runs_dir, "rpc_ddp")
    assert "rank 1 waits in all_reduce #5 (pg 1, 1.0 KiB float32)" in message, message
    assert "rank 2 has not entered it (last entered #4): it is at " in message, message
    assert "subgroups_job.py:" in message and "in load_batch (`time.sleep(600)`)" in message, message
    assert "ranks 0, 2" not in message and "rank 0 has not entered" not in message, message


def test_a_member_that_never_enters_a_subgroups_first_collective_is_named(tmp_path, runs_dir):
    """Rank 2 reported no collective of the pair yet, so the pair's members were only rank 1;
    rank 0, in the default group's barrier, is no member of the pair and is not blamed."""
    message = _hung(tmp_path, runs_dir, "first")
    assert "rank 1 waits in all_reduce #1 (pg 1, 1.0 KiB float32)" in message, message
    assert "rank 2 has not entered it: it is at " in message and "in load_batch (`time.sleep(600)`)" in message, message


@pytest.fixture(scope="module")
def rpc_ddp_run(tmp_path_factory):
    """configs/rpc_ddp.yaml, as a user runs it."""
    runs_dir = tmp_path_factory.mktemp("rpc-ddp") / "runs"
    result = rpcctl(
        "launch", str(ROOT / "configs" / "rpc_ddp.yaml"), "--runs-dir", str(runs_dir), "--no-live", timeout=110
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    return run_dir


def test_inspect_collectives_shows_each_group_of_a_ddp_rpc_job_apart(rpc_ddp_run):
    report = json.loads(rpcctl("inspect", "collectives", str(rpc_ddp_run), "--json").stdout)
    ops = {}
    for s in report["summary"]:
        ops.setdefault(s["pg"], {})[s["op"]] = s["ranks"]
    # The trainers' group (c10d's name 1): DDP's all_reduce and broadcasts, the final all_gather; trainers only.
    assert set(ops) == {"1", "rpc"}, ops
    assert ops["1"]["all_reduce"] == [1, 2] and ops["1"]["broadcast"] == [1, 2] and ops["1"]["all_gather"] == [1, 2], (
        ops
    )
    # RPC's own group: the all_gathers and the barrier of init_rpc, on every rank.
    assert ops["rpc"]["all_gather"] == [0, 1, 2] and ops["rpc"]["barrier"] == [0, 1, 2], ops
    groups = {(r["rank"], r["pg"]): r for r in report["ranks"]}
    assert sorted(groups) == [(0, "rpc"), (1, "1"), (1, "rpc"), (2, "1"), (2, "rpc")], sorted(groups)
    assert groups[(1, "1")]["members"] == [1, 2] and groups[(2, "1")]["members"] == [1, 2]
    assert groups[(1, "1")]["completed"] == groups[(2, "1")]["completed"] > 30  # 30 steps of DDP
    assert groups[(0, "rpc")]["completed"] == groups[(1, "rpc")]["completed"] == 3
    table = rpcctl("inspect", "collectives", str(rpc_ddp_run), "--wide").stdout
    assert "rpc" in table and "MEMBERS" in table, table


def test_the_trace_puts_each_group_of_a_ddp_rpc_job_on_its_own_lane(rpc_ddp_run):
    events = validate(json.loads(rpcctl("trace", str(rpc_ddp_run), "-o", "-").stdout))
    rank_of = {
        e["pid"]: e["args"]["name"].split(" ")[1] for e in events if e["ph"] == "M" and e["name"] == "process_name"
    }
    spans = [(e["args"]["pg"], rank_of[e["pid"]]) for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    assert {pg: {rank for p, rank in spans if p == pg} for pg, _ in spans} == {
        "1": {"1", "2"},
        "rpc": {"0", "1", "2"},
    }, spans


def test_a_store_written_before_groups_had_members_still_reads(rpc_ddp_run, tmp_path):
    """A store of schema 8 (no members column): the views read it as before."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(rpc_ddp_run, old)
    db = sqlite3.connect(old / "telemetry.db")
    db.execute("ALTER TABLE coll_groups DROP COLUMN ranks")
    db.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    report = json.loads(rpcctl("inspect", "collectives", str(old), "--json").stdout)
    assert report["ranks"] and all(r["members"] is None for r in report["ranks"]), report["ranks"]
    assert rpcctl("trace", str(old), "-o", str(tmp_path / "t.json")).returncode == 0


def test_a_groups_members_are_checked_at_the_protocol_edge():
    """``ranks`` reaches SQLite as JSON and the verdict as ranks: a forged one is refused whole."""
    event = {"e": "coll", "pg": "1", "enq": 1, "done": 0, "t": 1.7e9}
    assert protocol.valid_event({**event, "ranks": [1, 2]})
    for forged in ([2**70], ["1"], [None], [1.5], "0-3", list(range(2**20 + 1))):
        assert not protocol.valid_event({**event, "ranks": forged}), forged
