"""Stragglers on a real job: the rank that steps ten times slower than the others, and the
worker whose calls take ten times longer, are flagged in ``inspect workers`` with the figures."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from conftest import assert_no_process_left, only_run, rpcctl
from rpcctl import inspect

pytestmark = pytest.mark.timeout(150)

SCRIPT = textwrap.dedent(
    """
    import os, time

    import torch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    SLOW = rank == 2


    def work():
        time.sleep(0.1 if SLOW else 0.005)
        return rank


    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=3)
    step, deadline = 0, time.time() + 6
    while time.time() < deadline:
        if rank == 0:
            rpc.rpc_sync("worker1", work)
            rpc.rpc_sync("worker2", work)
        time.sleep(0.5 if SLOW else 0.05)
        print(f"step {step} loss {1.0 / (step + 1)}", flush=True)
        step += 1
    rpc.shutdown()
    """
)


def test_the_slow_rank_is_flagged_with_its_step_rate_and_call_latency(tmp_path, runs_dir):
    (tmp_path / "uneven.py").write_text(SCRIPT)
    config = tmp_path / "uneven.yaml"
    config.write_text("script: uneven.py\nnproc_per_node: 3\ntimeout: 120\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=120)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)

    slow = inspect.stragglers(run_dir)
    assert {(s.rank, s.metric) for s in slow} == {(2, "step_rate"), (2, "call_latency")}
    steps = next(s for s in slow if s.metric == "step_rate")
    assert steps.value < steps.others / 4  # ~2/s against ~15/s on an idle machine
    latency = next(s for s in slow if s.metric == "call_latency")
    assert (latency.worker, latency.func) == ("worker2", "work") and latency.value > 0.09

    result = rpcctl("inspect", "workers", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    flagged = [line for line in result.stdout.splitlines() if line.startswith("STRAGGLER:")]
    assert len(flagged) == 1 and flagged[0].startswith("STRAGGLER: rank 2: ") and "steps/s" in flagged[0], result.stdout
    assert "calls to worker2 (work) take" in flagged[0]
    document = json.loads(rpcctl("inspect", "workers", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert [w["rank"] for w in document if w["straggler"]] == [2]


def test_call_latency_is_the_mean_of_the_timed_calls_not_of_all_counted():
    """rpc.remote: every call is counted, one in REMOTE_SAMPLE timed (total_s sums those, the
    histogram counts them): the figure is total / timed, as `inspect calls` computes its mean."""
    from rpcctl.inspect.stragglers import _slow_callees
    from rpcctl.wire import histogram

    def row(callee, seconds, timed=10, counted=160):
        return {
            "callee": callee,
            "func": "make",
            "count": counted,
            "total_s": seconds * timed,
            "hist": json.dumps({str(histogram.bucket(seconds)): timed}),
        }

    stats = [row("worker1", 0.002), row("worker2", 0.002), row("worker3", 0.05)]
    [slow] = _slow_callees(stats, {"worker1": 1, "worker2": 2, "worker3": 3})
    assert (slow.rank, slow.worker, slow.func) == (3, "worker3", "make")
    assert slow.value == pytest.approx(0.05) and slow.others == pytest.approx(0.002)


def test_a_step_the_trainer_reported_and_printed_counts_once_in_the_step_rate(runs_dir):
    # Lightning with accumulate_grad_batches=4 under rpcctl: every rank's callback reports each
    # optimizer step (source lightning); rank 0 alone also prints a bar frame per batch (log).
    # Rank 1 steps as fast as rank 0: no straggler.
    from rpcctl.wire import protocol
    from rpcctl.telemetry.store import StoreWriter

    run_dir = runs_dir / "trainer-1"
    run_dir.mkdir(parents=True)
    w = StoreWriter(protocol.db_path(run_dir))
    t = time.time() - 10
    for step in range(1, 11):
        for rank in (0, 1):
            w.loss(rank, 0, step, None, 1.0 / step, {"epoch": 0.0}, t + step * 0.5, "lightning")
        for batch in range(4):
            w.loss(0, 0, (step - 1) * 4 + batch + 1, 0, 1.0 / step, None, t + step * 0.5 - batch * 0.1, "log")
    w.close()
    assert inspect.stragglers(run_dir) == []
    assert {r.source for r in inspect.losses(run_dir)} == {"lightning"}
