"""Collectives of a job whose script mp.spawns its own gloo workers (issue 27: "ranks the script
spawns itself are covered as RPC tracking covers them"), with the real program
tests/workers/spawned_collectives.py as one rpcctl rank (``nproc_per_node: 1``): three spawned
workers, each dist rank 0..2 of its own c10d world, running collectives_job.py's modes.

Every view keys a spawned worker by its dist rank (not the launcher rank 0 all of them share),
two rounds of mp.spawn are two worlds (``w1:``), and the hang diagnosis names the spawned worker
that has not entered the collective, with its pid, its parent and its stack.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from conftest import WORKERS, launch_job, rpcctl
from test_trace import validate

from rpcctl import inspect

pytestmark = pytest.mark.timeout(120)

JOB = str(WORKERS / "spawned_collectives.py")


@pytest.fixture(scope="module")
def twice_run(tmp_path_factory):
    """collectives_job.py slow (rank 1 late into each of the 5 all_reduce), mp.spawned twice: two
    worlds of dist ranks 0, 1, 2."""
    tmp_path = tmp_path_factory.mktemp("spawned-coll")
    result, run_dir, _ = launch_job(
        tmp_path,
        tmp_path / "runs",
        name="spawned-coll",
        script=JOB,
        args=["slow", "2"],
        nproc_per_node=1,
        timeout=90,
        preload=["torch"],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


def test_each_spawned_worker_is_counted_exactly_under_its_dist_rank_and_each_round_apart(twice_run):
    shown = rpcctl("inspect", "collectives", str(twice_run), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    ranks = {(r["pg"], r["rank"]): r for r in report["ranks"]}
    assert len(report["ranks"]) == 10, shown.stdout  # per round: 3 ranks in the default group, 2 in the pair
    defaults = sorted({r["pg"] for r in report["ranks"] if r["group"] == "default_pg"})
    assert defaults == ["0", "w1:0"], defaults
    counts = {(s["pg"], s["op"]): (s["count"], s["ranks"], s["bytes"]) for s in report["summary"]}
    for default in defaults:
        world = default[: -len("0")]
        pair = next(
            pg for pg, _ in ranks if pg.startswith(world) and pg != default and (world or not pg.startswith("w"))
        )
        assert counts[(default, "all_reduce")] == (15, [0, 1, 2], 15 * 4096), counts  # 5 per rank, not 15 on rank 0
        assert counts[(default, "broadcast")] == (9, [0, 1, 2], 9 * 4096)
        assert counts[(default, "barrier")][:2] == (3, [0, 1, 2])
        assert counts[(pair, "all_reduce")] == (4, [0, 1], 4 * 4096)
        assert all(ranks[(default, rank)]["completed"] == 9 for rank in range(3))
        assert ranks[(pair, 0)]["completed"] == 2 and (pair, 2) not in ranks
    assert not any(op == "?" for _, op in counts)


def test_the_spawned_straggler_is_its_dist_rank_and_flagged_on_its_own_process(twice_run):
    slow = {s.pg: s for s in inspect.collectives(twice_run).stragglers}
    assert sorted(slow) == ["0", "w1:0"] and all(s.rank == 1 and s.compared == 9 for s in slow.values()), slow
    flagged = [w for w in inspect.workers(twice_run) if w.straggler]
    # one worker a round, not the rank that spawned them
    assert [w.kind for w in flagged] == ["child", "child"], flagged
    assert all(w.straggler.startswith("rank 1: last into ") for w in flagged), flagged
    assert len({w.pid for w in flagged}) == 2, flagged


def test_inspect_workers_gives_each_spawned_worker_its_dist_rank_and_world(twice_run):
    """What the program calls each worker (its dist rank; mp.spawn's share their parent's launcher
    rank), and which round of mp.spawn made it: in the JSON, and beside the parent in the table."""
    shown = rpcctl("inspect", "workers", str(twice_run), "--json")
    assert shown.returncode == 0, shown.stderr
    workers = json.loads(shown.stdout)
    children = sorted((w["pg_world"], w["dist_rank"]) for w in workers if w["kind"] == "child")
    assert children == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], workers
    # it spawned them, in no group itself
    assert [(w["rank"], w["dist_rank"]) for w in workers if w["kind"] == "rank"] == [(0, None)]
    table = rpcctl("inspect", "workers", str(twice_run)).stdout
    assert "(child of rank 0, dist rank 1)" in table and "(child of rank 0, dist rank 1 of world w1)" in table, table


def test_the_trace_links_each_round_s_collectives_across_its_spawned_workers(twice_run, tmp_path):
    out = tmp_path / "trace.json"
    assert rpcctl("trace", str(twice_run), "-o", str(out)).returncode == 0
    events = validate(json.loads(out.read_text()))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    flows: dict[str, set[int]] = {}
    for e in events:
        if e["ph"] in "stf" and e["cat"] == "collective":
            flows.setdefault(e["id"], set()).add(e["pid"])
    for world in ("0", "w1:0"):
        for seq in range(1, 10):
            tracks = flows[f"coll:0:{world}:{seq}"]
            assert len(tracks) == 3 and not any(names[t].startswith("rank ") for t in tracks), (world, seq, tracks)
    rounds = [flows[f"coll:0:{w}:1"] for w in ("0", "w1:0")]
    assert not rounds[0] & rounds[1], "each round's workers are processes of their own"


def test_a_spawned_worker_that_has_not_entered_a_collective_is_named_with_its_stack(tmp_path, runs_dir):
    result, run_dir, rec = launch_job(
        tmp_path,
        runs_dir,
        name="spawned-stall",
        script=JOB,
        args=["stall"],
        nproc_per_node=1,
        # the job ends before rpcctl()'s 60 s: a missed verdict shows its output
        timeout=40,
        hang_timeout=6,
        preload=["torch"],
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert rec["root_cause"]["reason"] == "hang"
    message = rec["root_cause"]["message"]
    assert "ranks 0, 1 wait in all_reduce #4 (pg 0, 4.0 KiB float32)" in message, message
    found = re.search(
        r"rank 2 \(pid (\d+), spawned by rank 0\) has not entered it \(last entered #3\): it is at ", message
    )
    assert found, message
    assert "collectives_job.py:" in message and "in load_batch (`time.sleep(600)`)" in message, message
    children = Counter(w.kind for w in inspect.workers(run_dir))
    assert children == Counter({"rank": 1, "child": 3}), children
    assert int(found.group(1)) in {w.pid for w in inspect.workers(run_dir) if w.kind == "child"}
