"""The RRefs of pytorch/examples' pipeline shape (issue 40, item 2): ``RRef(x)`` made at one site
and handed at once to a remote forward, and the list RRef that ``rref.remote().parameter_rrefs()``
returns. (Listing each ``RRef(x)`` as its owner's local Tensor was tried and taken back: under
load it listed DistributedOptimizer's own parameter RRefs as held unused; issue 40, open.)
One real run, shared."""

from __future__ import annotations

import textwrap

import pytest
from conftest import assert_no_process_left, only_run, rpcctl

from rpcctl import inspect

pytestmark = pytest.mark.timeout(120)

SPLITS = 6
SCRIPT = textwrap.dedent(
    f'''
    import os, time
    import torch
    import torch.nn as nn
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import RRef


    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 4)

        def forward(self, x_rref):
            x = x_rref.to_here()
            time.sleep(0.3)  # a forward that takes a while: the fork outlives the owner's handle
            return self.net(x)

        def parameter_rrefs(self):
            # The list RRef lives while to_here waits for this: 0.3 s was once too short for the
            # creator's telemetry to look (every 0.1 s) on a loaded CI machine, and it was counted
            # as short-lived instead (documented: docs/inspect.md, rrefs).
            time.sleep(1.5)
            return [RRef(p) for p in self.parameters()]


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{{rank}}", rank=rank, world_size=2)
        if rank == 0:
            stage = rpc.remote("worker1", Stage)
            params = stage.remote().parameter_rrefs().to_here()
            outs = []
            for _ in range({SPLITS}):
                x_rref = RRef(torch.randn(2, 4))
                outs.append(stage.rpc_async().forward(x_rref))
            torch.futures.wait_all(outs)
            time.sleep(0.3)
            print("params", len(params), flush=True)
        rpc.shutdown()


    main()
    '''
)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    (tmp / "pipeline.py").write_text(SCRIPT)
    (tmp / "pipeline.yaml").write_text("name: pipeline\nscript: pipeline.py\nnproc_per_node: 2\ntimeout: 90\n")
    result = rpcctl("launch", str(tmp / "pipeline.yaml"), "--no-live", "--runs-dir", str(tmp / "runs"), timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    found = only_run(tmp / "runs")
    assert_no_process_left(found)
    return found


def test_the_parameter_rrefs_list_and_its_parameters_are_listed(run_dir):
    """A guard (this shape already listed them): the list RRef on the stage, and each parameter's RRef."""
    records = inspect.rrefs(run_dir)
    (listed,) = [r for r in records if r.callee == "Stage.parameter_rrefs"]
    assert (listed.owner, listed.kind, listed.creator) == ("worker1", "remote", "worker0"), listed
    params = sorted((r.type, tuple(r.shape), r.kind) for r in records if r.call_site and "in <listcomp>" in r.call_site)
    assert params == [("Parameter", (4,), "local"), ("Parameter", (4, 4), "local")], records


def test_a_run_without_collectives_says_so_once(run_dir):
    """RPC only, no process group: the collectives view's empty line, once (it was printed for each of its two tables)."""
    shown = rpcctl("inspect", "collectives", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("no collectives were recorded") == 1, shown.stdout
