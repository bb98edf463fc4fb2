"""Collectives recorded from torch's Flight Recorder (issue 27, items 3 and 5): real gloo jobs
through ``rpcctl launch``, read back with ``rpcctl inspect collectives``."""

from __future__ import annotations

import json
import os

import pytest
from conftest import WORKERS, launch_job, rpcctl

from rpcctl.telemetry import collectives

pytestmark = pytest.mark.timeout(120)


def test_a_clean_run_counts_every_collective_exactly(tmp_path, runs_dir):
    result, run_dir, rec = launch_job(tmp_path, runs_dir, name="coll", script=str(WORKERS / "collectives_job.py"), args=["clean"],
                                      nproc_per_node=3, timeout=60, preload=["torch"])
    assert result.returncode == 0, result.stdout + result.stderr
    shown = rpcctl("inspect", "collectives", str(run_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    counts = {(s["pg"], s["op"]): (s["count"], s["ranks"], s["bytes"]) for s in report["summary"]}
    assert len(report["ranks"]) == 5, shown.stdout  # 3 ranks in the default group, 2 in the pair
    default = next(r["pg"] for r in report["ranks"] if r["group"] == "default_pg")
    pair = next(r["pg"] for r in report["ranks"] if r["pg"] != default)
    assert counts[(default, "all_reduce")] == (15, [0, 1, 2], 15 * 4096)  # 5 per rank, 4 KiB float32
    assert counts[(default, "broadcast")] == (9, [0, 1, 2], 9 * 4096)
    assert counts[(default, "barrier")][:2] == (3, [0, 1, 2])
    assert counts[(pair, "all_reduce")] == (4, [0, 1], 4 * 4096)
    assert not any(op == "?" for _, op in counts)
    ranks = {(r["rank"], r["pg"]): r for r in report["ranks"]}
    assert all(ranks[(rank, default)]["completed"] == 9 for rank in range(3))  # 5 + 3 + 1
    assert ranks[(0, pair)]["completed"] == 2 and (2, pair) not in ranks
    assert all(r["inside"] is None for r in report["ranks"])
    table = rpcctl("inspect", "collectives", str(run_dir))
    assert "all_reduce" in table.stdout and "LAST COMPLETED" in table.stdout


def test_the_users_own_recorder_settings_are_left_alone():
    env = {"PATH": "/bin"}
    assert collectives.configure_env(env) and env[collectives.ENV_BUFFER] == str(collectives.BUFFER)
    for theirs in ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, {"TORCH_FR_DUMP_TEMP_FILE": "/x"}):
        env = dict(theirs)
        assert not collectives.configure_env(env) and env == theirs


def _hung(tmp_path, runs_dir, mode: str) -> str:
    result, run_dir, rec = launch_job(tmp_path, runs_dir, name=f"coll-{mode}", script=str(WORKERS / "collectives_job.py"), args=[mode],
                                      nproc_per_node=3, timeout=60, hang_timeout=6, preload=["torch"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert rec["root_cause"]["reason"] == "hang"
    assert (run_dir / "hang" / "diagnosis.txt").is_file()
    return rec["root_cause"]["message"]


def test_a_rank_that_has_not_entered_a_collective_is_named_with_its_stack(tmp_path, runs_dir):
    message = _hung(tmp_path, runs_dir, "stall")
    assert "ranks 0, 1 wait in all_reduce #4 (pg 0, 4.0 KiB float32)" in message, message
    assert "rank 2 has not entered it (last entered #3): it is at " in message, message
    assert "collectives_job.py:" in message and "in load_batch (`time.sleep(600)`)" in message, message


def test_a_collective_mismatch_is_named(tmp_path, runs_dir):
    message = _hung(tmp_path, runs_dir, "mismatch")
    assert "collective mismatch in pg 0: rank 1 called broadcast #4 where ranks 0, 2 called all_reduce #4" in message, message


def test_a_rank_missing_at_init_process_group_is_named_with_its_stack(tmp_path, runs_dir):
    message = _hung(tmp_path, runs_dir, "missing")
    assert message.startswith("hang: rank 2 (pid "), message
    assert "has not entered init_process_group; it is at " in message and "in load_config (`time.sleep(600)`)" in message, message
    assert "rank 0 (pid" in message and "rank 1 (pid" in message and "wait in it" in message, message


def test_the_rank_that_arrives_last_is_named_with_its_skew(tmp_path, runs_dir):
    result, run_dir, _ = launch_job(tmp_path, runs_dir, name="coll-slow", script=str(WORKERS / "collectives_job.py"), args=["slow"],
                                    nproc_per_node=3, timeout=60, preload=["torch"])
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(rpcctl("inspect", "collectives", str(run_dir), "--json").stdout)
    default = next(s for s in report["stragglers"] if s["pg"] == "0")
    assert default["rank"] == 1 and default["last"] >= 5, default  # late into each of the 5 all_reduce
    assert default["compared"] == 9  # 5 all_reduce, 3 broadcast, 1 barrier: every rank listed each
    assert 0.15 < default["skew_p50_s"] < 1.0, default
    assert "Stragglers (arrival skew)" in rpcctl("inspect", "collectives", str(run_dir)).stdout


def test_a_cycle_through_rpc_and_a_collective_is_named(tmp_path, runs_dir):
    result, run_dir, rec = launch_job(tmp_path, runs_dir, name="coll-cycle", script=str(WORKERS / "rpc_collective_cycle.py"),
                                      nproc_per_node=3, timeout=60, hang_timeout=6, preload=["torch"])
    assert result.returncode == 1, result.stdout + result.stderr
    message = rec["root_cause"]["message"]
    assert "rank 1 (worker1, pid " in message and "on rpc_sync → worker0 (reduce_on_worker0" in message, message
    assert "blocked at " in message and "in reduce_on_worker0 (`dist.all_reduce(t)`)" in message, message
    assert "ranks 0, 2 wait in all_reduce #1 (pg 0, 1.0 KiB float32)" in message, message
    assert "rank 1 has not entered it: it is at " in message, message
    assert "a deadlock across RPC and a collective" in message, message


RPC_ONLY_THEN_A_GROUP = """
import json, sys, time
import torch
import torch.distributed as dist
from rpcctl.telemetry import collectives

reads = []
read = collectives._dump
collectives._dump = lambda entries: reads.append(entries) or read(entries)  # counts the recorder's reads
collectives.install()
collectives.activate([])
poller = collectives.poller()
idle = [poller.process(time.time()) for _ in range(3)]  # torch.distributed imported, no group yet
before = len(reads)
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()  # gone before the sender's next cycle: still counted
events = poller.process(time.time(), final=True)
print(json.dumps({"idle": idle, "before": before, "after": len(reads), "events": events}))
"""


def test_the_sender_reads_no_recorder_before_a_process_group_exists(tmp_path):
    """An RPC-only job imports torch.distributed but has no process group: the sender does not
    read the Flight Recorder every cycle for nothing (~0.14 ms a cycle here, half of an idle
    cycle: benchmarks/launch_cost.py), and a group made and destroyed between two cycles is
    still counted."""
    import subprocess
    import sys

    env = {**os.environ, collectives.ENV_BUFFER: "16", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RPC_ONLY_THEN_A_GROUP, str(tmp_path / "pg")], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["idle"] == [[], [], []]
    assert result["before"] == 0, "the recorder was read with no process group"
    assert result["after"] > 0
    ops = {(e["op"], e["n"]) for e in result["events"] if e["e"] == "cop"}
    assert ("all_reduce", 1) in ops, result["events"]
