"""Process groups and RPC in one job, in every order torchrun runs them (issue 27).

A script that calls ``init_process_group`` and ``init_rpc``, both from env://, rendezvouses
twice on MASTER_PORT; under torchrun the agent hosts that store, under rpcctl rank 0 does
(``runtime.bind_rendezvous_store_to_master_addr``) and must serve the second rendezvous from the
server it started for the first. Each order is a real 2-rank job."""

from __future__ import annotations

import pytest
from conftest import WORKERS, launch_job

pytestmark = pytest.mark.timeout(90)

ORDERS = [
    "pg,ng,ar,rpc,call,shut,destroy",  # the hybrid pattern (DDP + RPC tutorial), with a new_group
    "rpc,pg,ar,call,destroy,shut",
    "pg,ar,destroy,rpc,call,shut",
    "rpc,call,shut,pg,ar,destroy",
]


@pytest.mark.parametrize("order", ORDERS)
def test_process_groups_and_rpc_in_any_order(order, tmp_path, runs_dir):
    result, run_dir, rec = launch_job(
        tmp_path,
        runs_dir,
        name="orders",
        script=str(WORKERS / "dist_orders.py"),
        args=[order],
        nproc_per_node=2,
        timeout=60,
        preload=["torch"],
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Address already in use" not in out
    for rank in (0, 1):
        assert f"ok {rank} {order}" in out, out
    assert rec["status"] == "succeeded"
