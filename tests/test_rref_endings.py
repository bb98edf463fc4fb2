"""How a real job's RRefs ended, told apart: held, in use, until rpc.shutdown() (normal), held
unused long before it (the reference kept its value alive for nothing), leaked (the value
outlived every reference), and RRefs made with rpc.RRef(value) and handed out at once."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from conftest import assert_no_process_left, only_run, rpcctl

from rpcctl import inspect
from rpcctl.console import epoch_of

pytestmark = pytest.mark.timeout(150)

SCRIPT = textwrap.dedent(
    """
    import os, time

    import torch
    import torch.distributed.rpc as rpc
    from rpcctl.rank import reporter as telemetry

    _cache = []


    def make(n):
        return torch.ones(n)


    class Counter:
        def __init__(self):
            self.n = 0

        def bump(self):
            self.n += 1
            return self.n


    def cached(n):
        value = torch.ones(n)
        _cache.append(value)  # the owner keeps it: a leak once every RRef to it is gone
        return value


    def _call_method(method, rref, *args):  # the PyTorch examples' helpers (rnn: EmbeddingTable, Decoder)
        return method(rref.local_value(), *args)


    def _remote_method(method, rref, *args):
        return rpc.rpc_sync(rref.owner(), _call_method, args=(method, rref) + args)


    def parameters():
        return [rpc.RRef(torch.zeros(4))]  # the parameter-server idiom: made here, handed out at once


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
        if rank == 0:
            kept = rpc.remote("worker1", make, args=(3,))
            leaky = rpc.remote("worker1", cached, args=(5,))
            busy = rpc.remote("worker1", Counter)
            params = rpc.rpc_sync("worker1", parameters)
            telemetry.set_hooks(False)
            hidden = rpc.remote("worker1", make, args=(7,))
            telemetry.set_hooks(True)
            for rref in (kept, leaky, hidden):
                rref.to_here()
            helped = rpc.remote("worker1", Counter)
            for _ in range(5):  # used only through the helper, then deleted long before the end
                _remote_method(Counter.bump, helped)
            helped_at = time.time()
            time.sleep(1.0)  # each RRef older than 0.2 s: listed and described
            del leaky, helped
            print(f"helped last used at {helped_at!r}", flush=True)
            for _ in range(25):  # its release reaches the owner well before the end; busy is used to it
                busy.rpc_sync().bump()
                time.sleep(0.1)
            print(f"holding {len(params)} parameter RRef(s) and {hidden.owner().name}'s", flush=True)
        rpc.shutdown()


    main()
    """
)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


def _launch_two_workers(script: str, name: str, tmp_path, runs_dir):
    """``script`` as the script of a 2-rank job, launched to its end: (its result, its run)."""
    (tmp_path / f"{name}.py").write_text(script)
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"name: {name}\nscript: {name}.py\nnproc_per_node: 2\ntimeout: 120\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=140)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, only_run(runs_dir)


def test_held_until_shutdown_leaked_and_handed_out_rrefs_are_told_apart(tmp_path, runs_dir):
    result, run_dir = _launch_two_workers(SCRIPT, "endings", tmp_path, runs_dir)

    records = {r.call_site.rsplit("/", 1)[-1]: r for r in inspect.rrefs(run_dir)}
    kept, leaky = records[f"endings.py:{_line('kept = ')} in main"], records[f"endings.py:{_line('leaky = ')} in main"]
    busy = records[f"endings.py:{_line('busy = ')} in main"]
    # rpc.RRef(value) on worker1, whose own handle died at once: its holder's fork names where it was made.
    param = records[f"endings.py:{_line('return [rpc.RRef')} in parameters"]
    assert len(records) == 5  # the RRef made while the hooks were off is not there
    # Deleted before the end, used only through _remote_method: LAST USED is its last call (issue 40, item 4).
    helped = records[f"endings.py:{_line('helped = ')} in main"]
    helped_at = float((run_dir / "logs" / "rank-0.log").read_text().split("helped last used at ", 1)[1].split()[0])
    assert (helped.state, helped.ending, helped.type) == ("deleted", None, "Counter"), helped
    assert helped.last_used_at is not None and -1.0 <= helped_at - epoch_of(helped.last_used_at) <= 0.5, (
        helped,
        helped_at,
    )
    # kept: last used (to_here) some 3.5 s before rpc.shutdown(), held all the same; busy: in use to the end.
    assert (kept.ending, kept.state) == ("held unused", "deleted")
    assert 3.0 <= kept.unused_s <= 6.0 and kept.shown_state.startswith("held unused "), kept
    assert (busy.ending, busy.unused_s, busy.type) == ("at shutdown", None, "Counter")
    assert (leaky.ending, leaky.type, leaky.shape) == ("leaked", "Tensor", [5])
    assert (param.ending, param.kind, param.owner, param.creator, param.type) == (
        "at shutdown",
        "local",
        "worker1",
        "worker1",
        "Tensor",
    )
    assert [r.rref_id for r in inspect.leaked_rrefs(run_dir)] == [leaky.rref_id]

    # The end-of-run report: a warning for the leak and one for the unused reference (with where
    # each was made), one calm line for the rest.
    assert "warning: 1 RRef value(s) leaked" in result.stderr
    assert f"{leaky.rref_id} owned by worker1: Tensor (20 B), created at " in result.stderr
    assert f"endings.py:{_line('leaky = ')} in main" in result.stderr
    assert "warning: 1 RRef(s) were held unused until rpc.shutdown()" in result.stderr
    assert f"{kept.rref_id} owned by worker1: Tensor (12 B), unused for " in result.stderr
    assert f"endings.py:{_line('kept = ')} in main" in result.stderr
    assert (
        "2 RRef(s) were still referenced, and in use, when rpc.shutdown() began, which released them: normal"
        in result.stderr
    )
    assert "still live at shutdown" not in result.stderr

    # inspect rrefs marks them as the report speaks of them.
    table = rpcctl("inspect", "rrefs", "--runs-dir", str(runs_dir), env={**os.environ, "COLUMNS": "200"})
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line[:1].isdigit()}
    assert "leaked" in rows[leaky.rref_id] and "held unused" in rows[kept.rref_id], table.stdout
    assert "released at shutdown" in rows[busy.rref_id], table.stdout
    leaked = json.loads(rpcctl("inspect", "rrefs", "--state", "leaked", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert [(r["rref_id"], r["state"], r["ending"]) for r in leaked] == [(leaky.rref_id, "deleted", "leaked")]
    assert_no_process_left(run_dir)
    unused = json.loads(
        rpcctl("inspect", "rrefs", "--state", "held-unused", "--json", "--runs-dir", str(runs_dir)).stdout
    )
    assert [(r["rref_id"], r["ending"]) for r in unused] == [(kept.rref_id, "held unused")] and unused[0][
        "last_used_at"
    ], unused
    # The filter takes the ending as the data spells it too.
    assert [r.rref_id for r in inspect.rrefs(run_dir, state="held unused")] == [kept.rref_id]


LATE_INIT = textwrap.dedent(
    """
    import os, time

    import torch
    import torch.distributed.rpc as rpc

    _kept = []


    def made_here(n):
        _kept.append(rpc.RRef(torch.ones(n)))  # kept by its owner
        rpc.RRef(torch.zeros(n))  # dropped at once: short-lived
        return rpc.RRef(torch.ones(n + 1))  # handed out


    def main():
        rank = int(os.environ["RANK"])
        if rank == 1:
            agent_started = rpc._init_rpc_backend

            def late(*args, **kwargs):  # the agent serves from its start; init_rpc returns 2 s later
                agent_started(*args, **kwargs)
                time.sleep(2.0)

            rpc._init_rpc_backend = late
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
        if rank == 0:
            handed = rpc.rpc_sync("worker1", made_here, args=(3,))
            print(f"handed {handed.owner().name}'s", flush=True)
            time.sleep(2.5)
        rpc.shutdown()


    main()
    """
)


def test_rrefs_a_peers_call_makes_before_init_rpc_returns_are_their_owners(tmp_path, runs_dir):
    """A worker's agent serves its peers before its init_rpc returns (it still gathers device
    maps): RRefs a handler makes then are that worker's, not an owner "?" of their own (CI: the
    report drew a "?" owner in round 0 of test_spawned_rrefs)."""
    _, run_dir = _launch_two_workers(LATE_INIT, "late", tmp_path, runs_dir)
    assert_no_process_left(run_dir)
    records = inspect.rrefs(run_dir)
    assert sorted((r.owner, r.shape) for r in records) == [("worker1", [3]), ("worker1", [4])], records
    owners = inspect.rref_owners(run_dir)
    assert [(o.owner, o.owner_rank, o.short_lived) for o in owners] == [("worker1", 1, 1)], owners


OWN_OBJECTS = textwrap.dedent(
    """
    import os, time

    import torch
    import torch.distributed.rpc as rpc


    def main():
        rank = int(os.environ["RANK"])
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
        if rank == 0:
            model = torch.nn.Linear(4, 2)
            handles = [rpc.RRef(p) for p in model.parameters()]  # as DistributedOptimizer takes them
            time.sleep(0.6)  # listed: older than the sender's 0.2 s
            del handles
            time.sleep(1.6)  # released well before the end, while the model (and its parameters) lives on
            print(f"model of {sum(p.numel() for p in model.parameters())} parameters", flush=True)
        rpc.shutdown()


    main()
    """
)


def test_rref_of_the_owners_own_object_released_while_the_object_lives_is_not_leaked(tmp_path, runs_dir):
    """``rpc.RRef(p)`` of a live module's parameters, released long before the end: the parameters
    outlive their RRefs by design, so no leak is claimed, whenever the owner's end comes."""
    result, run_dir = _launch_two_workers(OWN_OBJECTS, "own", tmp_path, runs_dir)
    assert_no_process_left(run_dir)
    records = inspect.rrefs(run_dir)
    assert sorted((r.kind, r.type, tuple(r.shape)) for r in records) == [
        ("local", "Parameter", (2,)),
        ("local", "Parameter", (2, 4)),
    ], records
    assert all((r.state, r.ending) == ("deleted", None) for r in records), records
    assert inspect.leaked_rrefs(run_dir) == [] and "leaked" not in result.stderr, result.stderr
