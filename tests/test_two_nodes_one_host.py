"""A run of two nodes on one host, under one runs directory (``RUN`` and ``RUN.node1``), is one run
to ``rpcctl runs``: listed once, as its node 0, with each node's directory in the JSON (issue 40,
item 7). Two real launches of tests/workers/behave.py, one per node, meeting on loopback."""

from __future__ import annotations

import json
import socket

import pytest
from conftest import assert_no_process_left, kill_if_running, rpcctl, start_rpcctl, write_config

pytestmark = pytest.mark.timeout(90)


def test_a_two_node_run_on_one_host_is_listed_once(tmp_path, runs_dir, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RPCCTL_SECRET", "s" * 32)
    launchers = []
    try:
        for node in (0, 1):
            config = write_config(
                tmp_path,
                name=f"two{node}",
                nnodes=2,
                node_rank=node,
                master_addr="127.0.0.1",
                master_port=port,
                nproc_per_node=1,
                timeout=60,
                rdzv_timeout=60,
            )
            launchers.append(start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live"))
        outputs = [launcher.communicate(timeout=60) for launcher in launchers]
    finally:
        for launcher in launchers:
            kill_if_running(launcher)
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs
    dirs = sorted(runs_dir.iterdir())
    assert [d.name for d in dirs] == [dirs[0].name, f"{dirs[0].name}.node1"], dirs
    for run_dir in dirs:
        assert_no_process_left(run_dir)
    listed = json.loads(rpcctl("runs", "--runs-dir", str(runs_dir), "--json").stdout)
    assert [(r["run_id"], r["node_rank"], r["node_dirs"]) for r in listed] == [
        (dirs[0].name, 0, [str(d) for d in dirs])
    ], listed
    table = rpcctl("runs", "--runs-dir", str(runs_dir)).stdout
    assert table.count(dirs[0].name) == 1, table
