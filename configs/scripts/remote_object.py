"""Remote object: create an object on another worker and use it through an RRef.

Pattern shown: ``rpc.remote(owner, Class, args)`` builds the object *on the owner* and
returns an RRef (a remote reference) at once. Its methods are then called through helpers:
``rref.rpc_sync().method(...)`` (blocking) and ``rref.remote().method(...)`` (returns
another RRef; ``.to_here()`` fetches the value). ``rref.owner()`` says where it lives.

Run it with either:
    rpcctl launch configs/remote_object.yaml
    torchrun --standalone --nproc-per-node 2 configs/scripts/remote_object.py
"""

import os

import torch
import torch.distributed.rpc as rpc


# Module-level class: RPC pickles it by reference (``__main__.Accumulator``), so the
# owner can construct it from its own copy of this script.
class Accumulator:
    """A tiny stateful object: sums the tensors it is given."""

    def __init__(self, size: int) -> None:
        self.total = torch.zeros(size)
        self.calls = 0

    def add(self, x: torch.Tensor) -> int:
        self.total += x
        self.calls += 1
        return self.calls

    def value(self) -> torch.Tensor:
        return self.total.clone()

    def where(self) -> str:
        return rpc.get_worker_info().name


def main() -> None:
    # The torchrun environment contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)

    if rank == 0:
        owner = f"worker{world_size - 1}"
        # Construct Accumulator(4) on the owner; we only hold a reference to it.
        acc = rpc.remote(owner, Accumulator, args=(4,))
        print(f"rref.owner() = {acc.owner().name}", flush=True)
        assert acc.owner().name == owner

        # rpc_sync() proxy: each call blocks and returns the method's result.
        acc.rpc_sync().add(torch.ones(4))
        calls = acc.rpc_sync().add(torch.arange(4.0))
        print(f"rref.rpc_sync().add(...) -> calls = {calls}", flush=True)

        # remote() proxy: returns an RRef to the result, which stays on the owner
        # until to_here() copies it over.
        value = acc.remote().value().to_here()
        where = acc.remote().where().to_here()
        print(f"rref.remote().value().to_here() = {value.tolist()} (computed on {where})", flush=True)

        assert calls == 2
        assert where == owner
        assert torch.equal(value, torch.ones(4) + torch.arange(4.0))
        print("remote_object OK", flush=True)

    # Graceful shutdown also waits until every RRef is released, so the owner keeps
    # the Accumulator alive while rank 0 still uses it.
    rpc.shutdown()


if __name__ == "__main__":
    main()
