"""Remote call, in Monarch: run a function in another process and get its result back.
The torch RPC version is configs/scripts/remote_call.py; docs/monarch.md compares them.

Monarch has no free functions to call remotely: the function is an ``@endpoint`` of an actor
that lives in a process of a mesh this controller spawns. ``call_one(...).get()`` blocks (torch
RPC's ``rpc_sync``); ``call_one(...)`` alone returns a Future at once (``rpc_async``). An
exception in the endpoint comes back as ``ActorError`` and the actor keeps serving.

Run it with:
    rpcctl launch configs/monarch/remote_call.yaml      (one controller rank; the mesh is its)
    python configs/monarch/remote_call.py
"""

import os

import torch
from monarch.actor import Actor, ActorError, endpoint, this_host


class Callee(Actor):
    """Where torch RPC has module-level functions, Monarch has an actor's endpoints."""

    @endpoint
    def add_and_scale(self, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
        return (a + b) * scale

    @endpoint
    def whoami(self) -> str:
        return f"pid {os.getpid()}"

    @endpoint
    def fail(self) -> None:
        raise ValueError("the callee refused")


def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})  # a mesh of one process on this host
    callee = procs.spawn("callee", Callee)
    a, b = torch.ones(3), torch.arange(3.0)

    # call_one(...).get(): blocks until the callee returns (torch RPC: rpc_sync).
    where = callee.whoami.call_one().get()
    result = callee.add_and_scale.call_one(a, b, 2.0).get()
    print(f"call_one  -> {where}: add_and_scale = {result.tolist()}", flush=True)
    assert where != f"pid {os.getpid()}" and torch.equal(result, (a + b) * 2.0)

    # call_one(...): a Future at once (torch RPC: rpc_async); overlap several, then get().
    futures = [callee.add_and_scale.call_one(a, b, float(s)) for s in (1, 2, 3)]
    results = [f.get() for f in futures]
    print(f"futures   -> {[r.tolist() for r in results]}", flush=True)
    for s, r in zip((1, 2, 3), results):
        assert torch.equal(r, (a + b) * s)

    # A remote exception is raised here, as with rpc_sync; the actor is still there after it.
    try:
        callee.fail.call_one().get()
    except ActorError as exc:
        print(f"failure   -> ActorError: {'the callee refused' in str(exc)}", flush=True)
    assert callee.whoami.call_one().get() == where
    procs.stop().get()  # torch RPC: rpc.shutdown()
    print("remote_call OK", flush=True)


if __name__ == "__main__":
    main()
