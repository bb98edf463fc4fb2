"""A program in the shape of PyTorch's RPC examples (tests/workers/spawner.py): one launched rank
that mp.spawns its own workers, each calling init_rpc on localhost with its own port. Every view
must tell its story as the program wrote it: calls made through the examples' ``_call_method``
helper named by the method they run, no false "has not joined RPC" warning for the rank that
waits in mp.spawn, the workers' exit codes, and the worker that raised named as the root cause
with its own exception. One job for all of it (each spawned worker imports torch afresh)."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import WORKERS, assert_no_process_left, only_run, record, rpcctl
from rpcctl import inspect

SPAWNER = WORKERS / "spawner.py"
FORWARDS, GRADS = 7, 3  # tests/workers/spawner.py


def _view(runs_dir: Path, *args: str) -> str:
    result = rpcctl(*args, "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_an_mp_spawn_program_whose_worker_raises_after_running_past_the_join_warning(tmp_path, runs_dir):
    # hang_timeout 8: the "has not joined RPC" warning is due 4 s after the first init_rpc; the
    # workers run ~6 s more, while their parent (the launched rank) waits in mp.spawn. Then
    # worker1 raises, holding an RRef.
    config = tmp_path / "spawner.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "script": str(SPAWNER),
                "nproc_per_node": 1,
                "grace": 2,
                "hang_timeout": 8,
                "env": {"HOLD_S": "4.5", "RAISE": "shard 1 lost its data"},
            }
        )
    )
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=150)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 1, result.stderr
    assert "has not joined RPC" not in result.stderr, result.stderr  # it joined, through its workers

    # The workers' exit codes, as their parent reaped them.
    workers = {w.name: w for w in inspect.workers(run_dir)}
    rank, raised = record(run_dir)["ranks"][0], workers["worker1"]
    assert [(w.kind, w.state, w.exit_code) for w in workers.values()] == [
        # worker0: mp.spawn's SIGTERM
        ("rank", "failed", 1),
        ("child", "killed", None),
        ("child", "failed", 1),
    ], workers

    # The verdict names the worker that raised, with its exception, and its traceback once.
    ours = [line for line in result.stderr.splitlines() if not line.startswith("[rank0]")]  # the rank's own log aside
    cause = f"worker1 (mp.spawn process 1, pid {raised.pid}) raised ValueError: shard 1 lost its data"
    assert f"root cause: rank 0 (pid {rank['pid']}, exit code 1): {cause}" in ours, result.stderr
    assert ours.count("ValueError: shard 1 lost its data") == 1, result.stderr
    assert sum("Traceback (most recent call last)" in line for line in ours) == 1, result.stderr
    assert not [line for line in ours if "ProcessRaisedException" in line], result.stderr
    assert record(run_dir)["root_cause"]["message"] == cause
    # The RRef worker1 still held when it raised: not said to be held "when rpc.shutdown() began".
    assert "when rpc.shutdown() began, which released them" not in result.stderr, result.stderr
    assert "worker0, worker1 never called rpc.shutdown()" in result.stderr, result.stderr
    # ... nor listed so: released at exit, and not judged "held unused" (its last uses were never reported).
    endings = {r.ending for r in inspect.rrefs(run_dir) if r.ending is not None}
    assert endings == {"at exit"}, inspect.rrefs(run_dir)

    # `rpcctl runs`: one line per cell.
    table = _view(runs_dir, "runs").rstrip("\n").splitlines()
    assert len(table) == 2 and "rank 0: worker1 (mp.spawn process 1" in table[1], table

    # Calls through _call_method: one row per method it ran, the helper still named.
    report = inspect.calls(run_dir, history=True)
    summary = {(c.caller, c.callee, c.func, c.kind): c.count for c in report.summary}
    assert summary[("worker0", "worker1", "_call_method → Server.forward", "rpc_sync")] == FORWARDS, summary
    assert summary[("worker0", "worker1", "_call_method → Server.grads", "rpc_sync")] == GRADS, summary
    assert summary[("worker0", "worker1", "_call_method → Server.pause", "rpc_sync")] == 1, summary
    assert not [key for key in summary if key[2] == "_call_method"], summary
    # The callee names the long call as the caller does, so the two are paired.
    (served,) = [s for s in report.serving if s.func.startswith("_call_method")]
    assert (served.func, served.worker, served.caller) == ("_call_method → Server.pause", "worker1", "worker0"), (
        report.serving
    )
    calls = _view(runs_dir, "inspect", "calls")
    assert "_call_method → Server.forward" in calls, calls

    # The run is over: nothing is "yet" to come.
    assert _view(runs_dir, "inspect", "losses").startswith("no losses were recorded")
    assert "no collectives were recorded" in _view(runs_dir, "inspect", "collectives")  # RPC only: no process group
