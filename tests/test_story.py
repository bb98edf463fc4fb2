"""One story after every kind of end (issue 13): whatever ended a run (its launcher killed with
``kill -9``, a timeout, a stale rank, a stop), every view says the same thing about it.
Real launches, real ranks, real signals sent by pid to processes the test started."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from conftest import assert_no_process_left, launch_job, launch_until_running, pids_gone, record, rpcctl, wait_until

pytestmark = pytest.mark.timeout(120)


def _views(run_dir, runs_dir):
    """What `runs --json`, `inspect workers --json` and `stack` say of the run."""
    runs = json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir)).stdout)
    listed = next(r for r in runs if r["run_id"] == run_dir.name)
    workers = json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
    table = rpcctl("inspect", "workers", str(run_dir)).stdout
    stack = rpcctl("stack", str(run_dir), timeout=30)
    return listed, workers, table, stack


def _launcher_and_server(launcher):
    server = next(
        p for p in psutil.Process(launcher.pid).children() if "rpcctl.processes.rank_server" in " ".join(p.cmdline())
    )
    return launcher.pid, server


def test_kill_9_of_the_launcher_one_story_and_stop_tidies(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=hang", "1=hang"])
    ranks = [r["pid"] for r in record(run_dir)["ranks"]]
    launcher_pid, server = _launcher_and_server(launcher)
    assert record(run_dir)["launcher_pid"] == launcher_pid
    wait_until(
        lambda: all(
            w["cpu_percent"] is not None
            for w in json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
        ),
        30,
        "a probe of every rank",
    )
    launcher.send_signal(signal.SIGKILL)
    launcher.communicate(timeout=30)
    # The rank server sees its socket close and kills the ranks: nothing is orphaned.
    wait_until(lambda: pids_gone([*ranks, server.pid]), 10, "the ranks and the rank server to die with the launcher")

    listed, workers, table, stack = _views(run_dir, runs_dir)
    gone = f"its launcher (pid {launcher_pid}) is gone, and its ranks with it"
    assert listed["status"] == "lost" and listed["orphaned_pids"] == [], listed
    assert [w["state"] for w in workers] == ["lost", "lost"], workers
    assert all(w["cpu_percent"] is None and w["heartbeat_age_s"] is None and not w["stale"] for w in workers), workers
    assert "running" not in table and gone in table, table
    assert stack.returncode == 2 and gone in stack.stderr, stack.stderr
    table_runs = rpcctl("runs", "--runs-dir", str(runs_dir)).stdout
    assert f"launcher (pid {launcher_pid}) gone" in table_runs, table_runs

    stop = rpcctl("stop", str(run_dir), timeout=30)
    assert stop.returncode == 0, stop.stderr
    assert (
        f"was lost: its launcher (pid {launcher_pid}) is gone; nothing was left to kill; record closed (status lost)"
        in stop.stderr
    )
    rec = record(run_dir)
    assert rec["status"] == "lost" and rec["ended_at"], rec
    assert {r["state"] for r in rec["ranks"]} == {"lost"}
    assert rec["root_cause"]["reason"] == "launcher" and str(launcher_pid) in rec["root_cause"]["message"]
    # Once tidied, the story holds: lost everywhere, and a second stop has nothing to do.
    listed, workers, _, stack = _views(run_dir, runs_dir)
    assert listed["status"] == "lost" and [w["state"] for w in workers] == ["lost", "lost"]
    assert stack.returncode == 2 and "is lost" in stack.stderr
    again = rpcctl("stop", str(run_dir))
    assert again.returncode == 2 and "not running (status: lost)" in again.stderr
    assert_no_process_left(run_dir)


def test_orphans_of_a_lost_run_are_named_everywhere_and_stop_kills_them(tmp_path, runs_dir):
    """Launcher and rank server both killed before the server could act: a rank that undid its
    death signal and another rank's grandchild outlive them. Every view calls them orphaned and
    `stop` kills exactly them."""
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=survive", "1=child"])
    wait_until(lambda: (run_dir / "grandchild-1.pid").exists(), 30, "rank 1's grandchild", run_dir / "logs")
    wait_until(
        lambda: "will survive" in (run_dir / "logs" / "rank-0.log").read_text(), 30, "rank 0 to undo its death signal"
    )
    grandchild = int((run_dir / "grandchild-1.pid").read_text())
    ranks = [r["pid"] for r in record(run_dir)["ranks"]]
    launcher_pid, server = _launcher_and_server(launcher)
    server.suspend()  # so it cannot clean up when the launcher's socket closes
    launcher.send_signal(signal.SIGKILL)
    launcher.communicate(timeout=30)
    server.kill()
    wait_until(lambda: pids_gone([ranks[1], server.pid]), 10, "rank 1 to die with its rank server")
    assert not pids_gone([ranks[0]]) and not pids_gone([grandchild])
    try:
        listed, workers, table, stack = _views(run_dir, runs_dir)
        assert listed["status"] == "lost" and sorted(listed["orphaned_pids"]) == sorted([ranks[0], grandchild]), listed
        assert [w["state"] for w in workers] == ["orphaned", "lost"], workers
        assert all(w["cpu_percent"] is None for w in workers)
        assert "2 processes orphaned" in table and f"rpcctl stop {run_dir.name}" in table, table
        assert stack.returncode == 2 and "2 processes orphaned" in stack.stderr, stack.stderr
        assert "launcher gone; 2 processes orphaned" in rpcctl("runs", "--runs-dir", str(runs_dir)).stdout

        stop = rpcctl("stop", str(run_dir), timeout=30)
        assert stop.returncode == 0, stop.stderr
        assert "killed 2 orphaned processes" in stop.stderr and str(grandchild) in stop.stderr, stop.stderr
        wait_until(lambda: pids_gone([ranks[0], grandchild]), 10, "the orphans to be gone")
        rec = record(run_dir)
        assert rec["status"] == "lost" and "killed 2 orphaned processes" in rec["root_cause"]["message"], rec
        assert [w["state"] for w in json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)] == [
            "lost",
            "lost",
        ]
    finally:
        assert_no_process_left(run_dir)


def test_a_timeout_keeps_every_ranks_stack_before_the_teardown(tmp_path, runs_dir):
    result, run_dir, rec = launch_job(tmp_path, runs_dir, nproc_per_node=2, timeout=4, args=["0=nap", "1=hang"])
    assert result.returncode == 1 and rec["root_cause"]["reason"] == "timeout", result.stderr
    rank0 = (run_dir / "stacks" / "rank-0.txt").read_text()
    assert "--- rpcctl: stacks at the timeout" in rank0 and "deep_in_named_function" in rank0, rank0
    assert "in hang" in (run_dir / "stacks" / "rank-1.txt").read_text()
    assert f"stacks of ranks 0, 1 at the timeout: {run_dir / 'stacks'}" in result.stderr
    assert {r["state"] for r in rec["ranks"]} == {"killed"}  # the dump killed nobody


def test_a_cancel_keeps_the_stacks_before_the_teardown(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=nap", "1=child"])
    wait_until(lambda: (run_dir / "grandchild-1.pid").exists(), 30, "rank 1's grandchild", run_dir / "logs")
    # Rank 0 in its nap too (it prints this line just before): "running" is from its start, and its
    # bootstrap may still be importing (CI, a fresh clone compiling rpcctl: its stack was there).
    log0 = run_dir / "logs" / "rank-0.log"
    wait_until(lambda: log0.exists() and "action nap" in log0.read_text(), 30, "rank 0's nap", run_dir / "logs")
    started = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    assert time.monotonic() - started < 2.0 + 2 + 5, "the dump is bounded"
    assert "deep_in_named_function" in (run_dir / "stacks" / "rank-0.txt").read_text()
    assert "stacks of ranks 0, 1 when the job was cancelled" in err, err
    assert record(run_dir)["status"] == "cancelled"
    assert_no_process_left(run_dir)


def test_a_stopped_rank_is_shown_stopped_and_stack_says_how_to_resume_it(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=nap", "1=hang"])
    rank1 = record(run_dir)["ranks"][1]["pid"]
    try:
        wait_until(
            lambda: all(
                w["cpu_percent"] is not None
                for w in json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
            ),
            30,
            "a probe of every rank",
        )
        os.kill(rank1, signal.SIGSTOP)
        wait_until(lambda: psutil.Process(rank1).status() == psutil.STATUS_STOPPED, 10, "rank 1 stopped")
        workers = json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
        assert [w["state"] for w in workers] == ["running", "stopped"], workers
        assert workers[1]["cpu_percent"] is None and workers[0]["cpu_percent"] is not None
        table = rpcctl("inspect", "workers", str(run_dir)).stdout
        hint = f"rank 1 (pid {rank1}) is stopped (SIGSTOP): `kill -CONT {rank1}` to resume it, then retry"
        assert hint in table, table
        started = time.monotonic()
        stack = rpcctl("stack", str(run_dir), "--runs-dir", str(runs_dir), timeout=30)
        assert stack.returncode == 1 and hint in stack.stderr, stack.stderr
        assert time.monotonic() - started < 5 + 3, "no wait on a rank that cannot answer"
        assert "deep_in_named_function" in stack.stdout  # rank 0 was still dumped
        os.kill(rank1, signal.SIGCONT)
        wait_until(
            lambda: (
                [w["state"] for w in json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)]
                == ["running", "running"]
            ),
            10,
            "rank 1 running again",
        )
        stack = rpcctl("stack", str(run_dir), "--rank", "1", timeout=30)
        assert stack.returncode == 0 and "in hang" in stack.stdout, stack.stderr
    finally:
        os.kill(rank1, signal.SIGCONT)
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)
    assert_no_process_left(run_dir)
