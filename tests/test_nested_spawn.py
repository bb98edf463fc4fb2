"""A nested mp.spawn (issue 38, item 10): the rank mp.spawns a trainer, which mp.spawns two gloo
workers of its own (tests/workers/nested_spawn.py, one rpcctl rank). Each worker is listed under
the trainer that started it, not as a child of rank 0, and one that fails is the root cause, named
with its own pid and its chain (rank 0 › pid TRAINER › pid WORKER), not blamed on the trainer.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import WORKERS, launch_job, rpcctl

pytestmark = pytest.mark.timeout(150)

JOB = str(WORKERS / "nested_spawn.py")


def _launch(tmp_path, runs_dir, mode: str):
    return launch_job(
        tmp_path,
        runs_dir,
        name=f"nested-{mode}",
        script=JOB,
        args=[mode],
        nproc_per_node=1,
        timeout=100,
        preload=["torch"],
    )


def _tree(run_dir) -> list[dict]:
    shown = rpcctl("inspect", "workers", str(run_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_inspect_workers_lists_each_grandchild_under_its_own_parent(tmp_path, runs_dir):
    result, run_dir, _ = _launch(tmp_path, runs_dir, "clean")
    assert result.returncode == 0, result.stdout + result.stderr
    rank, trainer, *workers = _tree(run_dir)
    assert (rank["kind"], trainer["kind"], trainer["parent_pid"], trainer["parents"]) == (
        "rank",
        "child",
        rank["pid"],
        [],
    ), (rank, trainer)
    assert len(workers) == 2, workers
    for dist_rank, worker in enumerate(workers):  # right after their parent, in dist-rank order
        assert (worker["parent_pid"], worker["parents"], worker["dist_rank"]) == (
            trainer["pid"],
            [trainer["pid"]],
            dist_rank,
        ), worker
        assert (worker["state"], worker["exit_code"]) == ("succeeded", 0), worker  # as the trainer reaped them
    table = rpcctl("inspect", "workers", str(run_dir)).stdout
    assert f"- (child of rank 0 › pid {trainer['pid']}, dist rank 1)" in table, table
    assert "- (child of rank 0)" in table, table  # the trainer itself


@pytest.mark.parametrize(
    ("mode", "name", "how"),
    [("raise", "g1", "raised ValueError: the grandchild lost its shard"), ("kill", None, "was killed by SIGKILL")],
)
def test_a_grandchild_that_fails_is_the_root_cause_with_its_own_pid_and_its_chain(tmp_path, runs_dir, mode, name, how):
    """``raise``: the grandchild joined RPC, so the cause says its RPC name (``Supervisor._spawned_message``)."""
    result, run_dir, rec = _launch(tmp_path, runs_dir, mode)
    assert result.returncode == 1, result.stdout + result.stderr
    tree = {w["pid"]: w for w in _tree(run_dir)}
    (trainer,) = [w for w in tree.values() if w["kind"] == "child" and w["parents"] == []]
    cause = rec["root_cause"]["message"]
    found = re.search(r"pid (\d+), rank 0 › ", cause)
    assert found, cause
    pid = int(found.group(1))
    assert tree[pid]["parents"] == [trainer["pid"]], (cause, tree)  # a grandchild, under the trainer
    where = f"pid {pid}, rank 0 › pid {trainer['pid']} › pid {pid}"
    expected = f"{name} (mp.spawn process 1, {where}) {how}" if name else f"mp.spawn process 1 ({where}) {how}"
    assert cause == expected, cause
    assert tree[pid]["name"] == name, tree[pid]
    assert f"root cause: rank 0 (pid {rec['ranks'][0]['pid']}, exit code 1): {cause}" in result.stderr, result.stderr
    assert (trainer["state"], trainer["exit_code"]) == ("failed", 1), trainer
    if mode == "raise":
        assert (tree[pid]["state"], tree[pid]["exit_code"]) == ("failed", 1), tree[pid]
        assert rec["root_cause"]["error_type"] == "ValueError"
        assert "nested_spawn.py" in rec["root_cause"]["traceback"] and "in worker" in rec["root_cause"]["traceback"]
