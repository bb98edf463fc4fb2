"""RPC and a collective waiting on each other: rank 1 calls worker0 over RPC; worker0's handler
runs an all_reduce in the default group, which rank 2 enters and rank 1 never will (it waits on
that very call)."""

import os

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc


def reduce_on_worker0():
    t = torch.ones(256)
    dist.all_reduce(t)
    return t


rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
if rank == 1:
    rpc.rpc_sync("worker0", reduce_on_worker0)
elif rank == 2:
    dist.all_reduce(torch.ones(256))
rpc.shutdown()
