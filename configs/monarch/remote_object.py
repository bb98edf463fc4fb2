"""Remote object, in Monarch: create an object in another process and use it by reference.
The torch RPC version is configs/scripts/remote_object.py; docs/monarch.md compares them.

``procs.spawn(name, Class, *args)`` constructs the object (an actor) in every process of the
mesh and returns an ``ActorMesh``, the reference (torch RPC: ``rpc.remote`` returning an
RRef). Methods are endpoints: ``.call_one(...).get()`` (``rref.rpc_sync().m()``), or a Future
(``rref.remote().m()`` then ``.to_here()``; in Monarch the result always comes back: there is
no remote reference to a return value). The actor lives until its mesh stops, not until the
last reference is gone: no reference counting, no graceful-shutdown wait for RRefs.

Run it with:
    rpcctl launch configs/monarch/remote_object.yaml
    python configs/monarch/remote_object.py
"""

import os

import torch
from monarch.actor import Actor, endpoint, this_host


class Accumulator(Actor):
    """A tiny stateful object: sums the tensors it is given."""

    def __init__(self, size: int) -> None:
        self.total = torch.zeros(size)
        self.calls = 0

    @endpoint
    def add(self, x: torch.Tensor) -> int:
        self.total += x
        self.calls += 1
        return self.calls

    @endpoint
    def value(self) -> torch.Tensor:
        return self.total.clone()

    @endpoint
    def where(self) -> int:
        return os.getpid()


def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    acc = procs.spawn("accumulator", Accumulator, 4)  # Accumulator(4), built in the mesh process
    owner = acc.where.call_one().get()
    print(f"owner is another process: {owner != os.getpid()}", flush=True)

    acc.add.call_one(torch.ones(4)).get()
    calls = acc.add.call_one(torch.arange(4.0)).get()
    print(f"acc.add.call_one(...).get() -> calls = {calls}", flush=True)
    future = acc.value.call_one()  # at once; the value is copied back by get()
    value = future.get()
    print(f"acc.value.call_one().get() = {value.tolist()}", flush=True)
    assert calls == 2 and owner != os.getpid()
    assert torch.equal(value, torch.ones(4) + torch.arange(4.0))
    procs.stop().get()  # the object goes with its mesh
    print("remote_object OK", flush=True)


if __name__ == "__main__":
    main()
