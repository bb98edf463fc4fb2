"""The report's pictures from 2 to 1,000 owners and processes (issue 40, item 5), read in
headless Chromium: no two labels of a picture overlap (each SVG text element's box, as the
browser laid it out), every process has its row on the timeline, and Placement's RANKS names
the ranks.

Two built runs here (the real one, a `rpcctl launch` of tests/workers/spawned_rrefs.py with 4
rounds of 3 mp.spawn workers that make RRefs, is tests/test_spawned_rrefs.py's own run: its
report test is there, with these helpers):

- 1,000 spawned processes and 1,000 RRef owners: 5 ranks, each spawning 50 rounds of 4 workers
  (250 RPC worlds), 3 of the workers failing;
- 1,000 launched ranks in one RPC world, worker0 making an RRef on each of the others.

The two large runs are built with the telemetry store's own writer (``StoreWriter``: the code a
real run's launcher writes with, fed the events a real rank sends) and the run record's own
``save_record``, rather than by starting 1,000 processes on a 2-core machine. Screenshots are
saved in the test's tmp dir, and in ``RPCCTL_SCREENS`` (a directory) when it is set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import browser  # noqa: F401 - the fixture
from report_page import (
    TIMELINE_ROWS,
    assert_no_label_overlaps,
    make_report,
    open_report,
    placement_ranks,
    screens,
)
from rpcctl import inspect

pytestmark = pytest.mark.timeout(240)


# -- the large runs, written with the store's own writer ------------------------------------------


def _synthetic_run(
    root: Path, name: str, ranks: int, rounds: int, per_round: int, failing: tuple[int, ...] = ()
) -> Path:
    """A finished run of ``ranks`` launched ranks. With ``rounds``, each rank spawns ``rounds``
    rounds of ``per_round`` workers (w0..), each round an RPC world where w0 makes an RRef on
    every worker (one of its own); without, the ranks themselves are one RPC world (worker0..),
    worker0 making an RRef on each. ``failing``: indexes of spawned workers that exit 1."""
    from rpcctl.base.states import RankStatus, RunStatus
    from rpcctl.console import iso_time
    from rpcctl.records.runs import RankState, RunRecord, save_record
    from rpcctl.telemetry.store import ProcInfo, StoreWriter
    from rpcctl.wire import protocol

    run_dir = root / name
    run_dir.mkdir(parents=True)
    t0 = 1_800_000_000.0
    writer = StoreWriter(protocol.db_path(run_dir))
    pid = iter(range(10_000, 100_000))
    end = t0 + 10 + rounds * 0.5 + 5
    states = []

    def world(procs: list[tuple[ProcInfo, str]], rdv: str, t: float) -> None:
        names = {str(i): n for i, (_, n) in enumerate(procs)}
        for i, (proc, worker) in enumerate(procs):
            writer.apply(proc, {"e": "join", "t": t})
            writer.apply(
                proc,
                {
                    "e": "rpc",
                    "name": worker,
                    "rpc_rank": i,
                    "rdv": rdv,
                    "world_size": len(procs),
                    "workers": names,
                    "t": t,
                },
            )
        creator = procs[0][0]
        writer.apply(
            creator,
            {
                "e": "rref",
                "id": "0:0",
                "kind": "local",
                "owner": procs[0][1],
                "owner_rank": 0,
                "site": "train.py:11",
                "value": {"type": "Tensor", "shape": [64], "dtype": "float32", "nbytes": 256},
                "t": t + 0.1,
            },
        )
        writer.apply(creator, {"e": "rel", "id": "0:0", "fork": "", "t": t + 0.3})
        for i, (_, owner) in enumerate(procs[1:], 1):
            writer.apply(
                creator,
                {
                    "e": "rref",
                    "id": f"0:{i}",
                    "kind": "remote",
                    "owner": owner,
                    "owner_rank": i,
                    "callee": "torch.ones",
                    "site": "train.py:12",
                    "value": {"type": "Tensor", "shape": [64], "dtype": "float32", "nbytes": 256},
                    "t": t + 0.1,
                },
            )
            writer.apply(creator, {"e": "rel", "id": f"0:{i}", "fork": "", "t": t + 0.3})

    rank_procs = []
    for rank in range(ranks):
        rank_pid = next(pid)
        writer.rank_started(rank, 0, rank_pid, rank, "cpu", t0 + 1)
        proc_id = writer.proc_connected(
            {"host": "h", "pid": rank_pid, "ppid": 1, "rank": rank, "kind": "rank"}, 0, t0 + 1
        )
        rank_procs.append((ProcInfo(proc_id, rank_pid, rank, 0), f"worker{rank}"))
    if not rounds:
        world(rank_procs, "127.0.0.1:29500", t0 + 2)
    spawned = 0
    for rank, (parent, _) in enumerate(rank_procs):
        for round_ in range(rounds):
            t = t0 + 2 + round_ * 0.5
            procs = []
            for i in range(per_round):
                child_pid = next(pid)
                proc_id = writer.proc_connected(
                    {"host": "h", "pid": child_pid, "ppid": parent.pid, "rank": rank, "kind": "child"}, 0, t
                )
                procs.append((ProcInfo(proc_id, child_pid, rank, 0), f"w{i}"))
            world(procs, f"127.0.0.1:{30000 + rank * rounds + round_}", t)
            for proc, _ in procs:
                code = 1 if spawned in failing else 0
                spawned += 1
                writer.apply(parent, {"e": "cexit", "pid": proc.pid, "code": code, "t": t + 0.4})
                writer.proc_ended(proc.proc_id, t + 0.4)
    for rank, (proc, _) in enumerate(rank_procs):
        writer.proc_ended(proc.proc_id, end - 1)
        writer.rank_exited(rank, proc.pid, RankStatus.SUCCEEDED, 0, end - 1)
        states.append(
            RankState(
                rank=rank,
                local_rank=rank,
                pid=proc.pid,
                state=RankStatus.SUCCEEDED,
                exit_code=0,
                started_at=iso_time(t0 + 1),
                ended_at=iso_time(end - 1),
            )
        )
    writer.close()
    save_record(
        RunRecord(
            run_id=name,
            name=name,
            status=RunStatus.SUCCEEDED,
            run_dir=str(run_dir),
            config_path=None,
            script="train.py",
            world_size=ranks,
            nproc_per_node=ranks,
            start_method="spawn",
            host="h",
            launcher_pid=1,
            launcher_started=0.0,
            master_addr="127.0.0.1",
            master_port=29500,
            started_at=iso_time(t0),
            ended_at=iso_time(end),
            exit_code=0,
            ranks=states,
        )
    )
    return run_dir


@pytest.fixture(scope="module")
def thousand_spawned(tmp_path_factory) -> Path:
    """5 ranks × 50 rounds × 4 spawned workers: 1,000 processes, 250 worlds, 1,000 owners."""
    return _synthetic_run(
        tmp_path_factory.mktemp("big"), "spawned-1000", ranks=5, rounds=50, per_round=4, failing=(5, 406, 999)
    )


@pytest.fixture(scope="module")
def thousand_ranks(tmp_path_factory) -> Path:
    """1,000 launched ranks in one RPC world; worker0 makes an RRef on each of the 999 others."""
    return _synthetic_run(tmp_path_factory.mktemp("ranks"), "ranks-1000", ranks=1000, rounds=0, per_round=0)


# -- 1,000 spawned processes, 250 worlds, 1,000 owners ----------------------------------------------------


@pytest.mark.browser
def test_a_thousand_spawned_processes_and_owners_stay_readable_and_say_what_shares_a_row(
    browser, thousand_spawned, tmp_path
):
    owners = inspect.rref_owners(thousand_spawned)
    assert len(owners) == 1000 and len({o.world for o in owners}) == 250  # w0-w3 of each world own one RRef each
    workers = inspect.workers(thousand_spawned)
    assert len([w for w in workers if w.kind == "child"]) == 1000
    open_report(browser, make_report(thousand_spawned, tmp_path / "report.html"))
    try:
        assert_no_label_overlaps(browser, "fig-rref-graph", "fig-rref-time", "fig-timeline", "fig-placement")
        graph = browser.js(
            "var gd = document.getElementById('fig-rref-graph');"
            " return [gd._fullLayout.meta, gd._fullData.map(t => t.meta), gd._fullLayout.height];"
        )
        assert graph[0]["worlds"] == [None], graph[0]  # 250 worlds merged by worker name
        edges = {tuple(m["edge"]): m["deleted"] for m in graph[1] if "edge" in m}
        assert edges == {("w0", "w1"): 250, ("w0", "w2"): 250, ("w0", "w3"): 250}, edges
        assert graph[2] < 600
        notes = browser.js("return document.querySelector('#rrefs .graph-folded').innerText")
        assert "the 250 RPC worlds are drawn as one" in notes, notes
        # The timeline: at most 60 rows, holding all 1,000 spawned processes and the 5 ranks;
        # the 3 that failed keep their own rows; a line says what shares a row.
        drawn = browser.js(TIMELINE_ROWS)
        assert len(drawn["rows"]) <= 60 and sorted(drawn["ticks"]) == sorted(drawn["rows"]), drawn["rows"]
        held = 0
        for row in drawn["rows"]:
            if row.startswith("└"):
                words = row.split(": ", 1)[1]
                held += sum(int(part.split(" ")[0]) for part in words.split(", ")) if "spawned" in row else 1
        assert held == 1000, drawn["rows"]
        failed = [row for row in drawn["rows"] if row.endswith(": exit code 1")]
        assert len(failed) == 3 and all(drawn["bars"][row][0]["state"] == "failed" for row in failed), failed
        assert [row for row in drawn["rows"] if not row.startswith("└")] == [f"rank {r}: exit code 0" for r in range(5)]
        note = browser.js("return document.querySelector('#timeline .timeline-grouped').innerText")
        assert (
            note.startswith(f"1005 processes in {len(drawn['rows'])} rows: ")
            and "rpcctl inspect workers lists every one" in note
        ), note
        assert "3 that failed or were killed keep their own row" in note
        series = browser.js(
            "return document.getElementById('fig-rref-time')._fullData.filter(t => t.showlegend).map(t => t.name)"
        )
        assert series == [f"w{i} (all 250 worlds)" for i in range(4)], series
        head, rows = placement_ranks(browser)
        assert rows[0][2] == "ranks 0-4" and "w0-w3" in rows[0][3].split(", "), rows
    finally:
        screens(browser, tmp_path, "spawned1000")


# -- 1,000 launched ranks in one world ----------------------------------------------------------------------


@pytest.mark.browser
def test_a_thousand_ranks_in_one_world_fold_past_the_bound_and_say_so(browser, thousand_ranks, tmp_path):
    open_report(browser, make_report(thousand_ranks, tmp_path / "report.html"))
    try:
        assert_no_label_overlaps(browser, "fig-rref-graph", "fig-rref-time", "fig-timeline", "fig-placement")
        meta = browser.js(
            "var gd = document.getElementById('fig-rref-graph');"
            " return [gd._fullLayout.meta, gd._fullData.map(t => t.meta)];"
        )
        owners = next(m for m in meta[1] if m.get("side") == "owner")["nodes"]
        assert owners == [f"worker{i}" for i in range(7)] + [None], owners  # 7 owners drawn, then "+993 more"
        assert meta[0]["folded"] == "993 more owners (993 RRefs) share one row", meta[0]
        labels = browser.js(
            "return Array.from(document.querySelectorAll('#fig-rref-graph .textpoint')).map(e => e.textContent)"
        )
        assert any(text.startswith("+993 more  ·  993 RRefs") for text in labels), labels
        drawn = browser.js(TIMELINE_ROWS)
        assert len(drawn["rows"]) <= 60 and drawn["rows"][0].startswith("ranks 0-"), drawn["rows"]
        assert drawn["rows"][-1].startswith("ranks ") and drawn["rows"][-1].split(":")[0].endswith("-999"), drawn[
            "rows"
        ]
        held = sum(int(row.split(": ")[1].split(" ")[0]) for row in drawn["rows"])
        assert held == 1000, drawn["rows"]
        head, rows = placement_ranks(browser)
        assert rows[0][2] == "ranks 0-999" and rows[0][3] == "worker0-worker999", rows
    finally:
        screens(browser, tmp_path, "ranks1000")
