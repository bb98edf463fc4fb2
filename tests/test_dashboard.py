"""The live panel of ``rpcctl launch`` says what ``rpcctl inspect rrefs`` says: both read the
store through the inspect SDK. A real job holds one RRef pending (its function still runs on
the owner) next to a live one; the panel must count one of each, as the CLI's JSON does.
(An earlier panel had its own SQL and counted the pending RRef as live.)"""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import pytest
from rich.console import Console

from conftest import assert_no_process_left, kill_if_running, only_run, rpcctl, start_rpcctl, wait_until
from rpcctl import inspect
from rpcctl.views.dashboard import dashboard_panels

pytestmark = pytest.mark.timeout(150)

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed.rpc as rpc

    SYNC = Path(sys.argv[1])


    def wait_for(name):
        deadline = time.time() + 90
        while not (SYNC / name).exists():
            if time.time() > deadline:
                raise SystemExit(f"timed out waiting for {name}")
            time.sleep(0.02)


    def make():
        return torch.ones(8, 8)


    def held():  # runs on worker1 until the test has looked: its RRef stays unconfirmed
        wait_for("release")
        return torch.ones(4)


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
        if rank == 0:
            ready = rpc.remote("worker1", make)
            ready.to_here()
            pending = rpc.remote("worker1", held)
            (SYNC / "created").touch()
            pending.to_here()
        rpc.shutdown()


    main()
    """
)


def _panel_rows(run_dir) -> dict[str, list[str]]:
    """The 'RRefs by owner' panel as a person sees it: owner → the row's cells."""
    panels = dashboard_panels(run_dir)
    console = Console(width=160, record=True, no_color=True)
    for panel in panels:
        console.print(panel)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    start = lines.index("RRefs by owner")
    header = lines[start + 1].split()
    assert header[:4] == ["OWNER", "LIVE", "PENDING", "DELETED"], lines
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip() or line.strip() == "Losses":
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def test_the_live_panel_counts_rref_states_as_inspect_rrefs_does(tmp_path, runs_dir):
    sync = tmp_path / "sync"
    sync.mkdir()
    (tmp_path / "pending.py").write_text(SCRIPT)
    config = tmp_path / "pending.yaml"
    config.write_text(
        f"name: pending\nscript: pending.py\nargs: [{json.dumps(str(sync))}]\nnproc_per_node: 2\ntimeout: 120\n"
    )
    launcher = start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir))
    try:
        run_dir = only_run(runs_dir)
        wait_until(
            lambda: (sync / "created").exists() or launcher.poll() is not None, 90, "the RRefs", logs=run_dir / "logs"
        )
        assert launcher.poll() is None, launcher.communicate()
        wait_until(
            lambda: sorted(r.state for r in inspect.rrefs(run_dir)) == ["live", "pending"],
            30,
            "one live and one pending RRef",
            logs=run_dir / "logs",
        )

        result = rpcctl("inspect", "rrefs", "--json", "--runs-dir", str(runs_dir))
        assert result.returncode == 0, result.stderr
        by_cli = Counter((r["owner"], r["state"]) for r in json.loads(result.stdout))
        assert by_cli == {("worker1", "live"): 1, ("worker1", "pending"): 1}

        rows = _panel_rows(run_dir)
        live, pending, deleted = (int(cell) for cell in rows["worker1"][:3])
        assert (live, pending, deleted) == (by_cli["worker1", "live"], by_cli["worker1", "pending"], 0)
        assert " ".join(rows["worker1"][3:5]) == "256 B"  # the live 8x8 float32; the pending value is not there yet

        (sync / "release").touch()
        out, err = launcher.communicate(timeout=90)
        assert launcher.returncode == 0, (out, err)
    finally:
        kill_if_running(launcher)
    assert_no_process_left(run_dir)
