"""How a real job's RRefs ended, told apart: held until rpc.shutdown() (normal), leaked (the
value outlived every reference), and RRefs made with rpc.RRef(value) and handed out at once."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from conftest import assert_no_process_left, only_run, rpcctl

from rpcctl import inspect

pytestmark = pytest.mark.timeout(150)

SCRIPT = textwrap.dedent(
    '''
    import os, time

    import torch
    import torch.distributed.rpc as rpc
    from rpcctl.telemetry import worker as telemetry

    _cache = []


    def make(n):
        return torch.ones(n)


    def cached(n):
        value = torch.ones(n)
        _cache.append(value)  # the owner keeps it: a leak once every RRef to it is gone
        return value


    def parameters():
        return [rpc.RRef(torch.zeros(4))]  # the parameter-server idiom: made here, handed out at once


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
        if rank == 0:
            kept = rpc.remote("worker1", make, args=(3,))
            leaky = rpc.remote("worker1", cached, args=(5,))
            params = rpc.rpc_sync("worker1", parameters)
            telemetry.set_hooks(False)
            hidden = rpc.remote("worker1", make, args=(7,))
            telemetry.set_hooks(True)
            for rref in (kept, leaky, hidden):
                rref.to_here()
            time.sleep(1.0)  # each RRef older than 0.2 s: listed and described
            del leaky
            time.sleep(2.5)  # its release reaches the owner well before the end
            print(f"holding {len(params)} parameter RRef(s) and {hidden.owner().name}'s", flush=True)
        rpc.shutdown()


    main()
    '''
)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


def test_held_until_shutdown_leaked_and_handed_out_rrefs_are_told_apart(tmp_path, runs_dir):
    (tmp_path / "endings.py").write_text(SCRIPT)
    config = tmp_path / "endings.yaml"
    config.write_text("name: endings\nscript: endings.py\nnproc_per_node: 2\ntimeout: 120\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=140)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(runs_dir)

    records = {r.call_site.rsplit("/", 1)[-1]: r for r in inspect.rrefs(run_dir)}
    kept, leaky = records[f"endings.py:{_line('kept = ')} in main"], records[f"endings.py:{_line('leaky = ')} in main"]
    # rpc.RRef(value) on worker1, whose own handle died at once: its holder's fork names where it was made.
    param = records[f"endings.py:{_line('return [rpc.RRef')} in parameters"]
    assert len(records) == 3  # the RRef made while the hooks were off is not there
    assert (kept.ending, kept.state) == ("at shutdown", "deleted")
    assert (leaky.ending, leaky.type, leaky.shape) == ("leaked", "Tensor", [5])
    assert (param.ending, param.kind, param.owner, param.creator, param.type) == ("at shutdown", "local", "worker1", "worker1", "Tensor")
    assert [r.rref_id for r in inspect.leaked_rrefs(run_dir)] == [leaky.rref_id]

    # The end-of-run report: a warning for the leak (with where it was made), one calm line for the rest.
    assert "warning: 1 RRef value(s) leaked" in result.stderr
    assert f"{leaky.rref_id} owned by worker1: Tensor, created at " in result.stderr
    assert f"endings.py:{_line('leaky = ')} in main" in result.stderr
    assert "2 RRef(s) were still referenced when rpc.shutdown() began, which released them: normal" in result.stderr
    assert "still live at shutdown" not in result.stderr

    # inspect rrefs marks them as the report speaks of them.
    table = rpcctl("inspect", "rrefs", "--runs-dir", str(runs_dir), env={**os.environ, "COLUMNS": "200"})
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line[:1].isdigit()}
    assert "leaked" in rows[leaky.rref_id] and "released at shutdown" in rows[kept.rref_id], table.stdout
    leaked = json.loads(rpcctl("inspect", "rrefs", "--state", "leaked", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert [(r["rref_id"], r["state"], r["ending"]) for r in leaked] == [(leaky.rref_id, "deleted", "leaked")]
    assert_no_process_left(run_dir)
