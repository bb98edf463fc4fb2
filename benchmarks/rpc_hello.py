"""The benchmark workload: every rank joins RPC, calls its neighbour once, and shuts down.

Runs unchanged under `torchrun --standalone` and `rpcctl launch`."""

import os

import torch
import torch.distributed.rpc as rpc


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    rpc.rpc_sync(f"worker{(rank + 1) % world}", torch.add, args=(torch.ones(2), 1))
    rpc.shutdown()


if __name__ == "__main__":
    main()
