"""Process groups that are not the same recorder id on every rank (issue 38); argv[1] picks the
shape. 3 ranks, gloo.

rpc_ddp  configs/rpc_ddp.yaml's shape: init_process_group, new_group([1, 2]) (the trainers),
         init_rpc, whose own gloo group shifts the Flight Recorder's ids (on rank 0, the
         parameter server, id 1 is RPC's group; on ranks 1, 2 id 1 is the trainers' and 2 is
         RPC's). The trainers run 4 all_reduce in their group; rank 2 then sleeps in load_batch
         before the 5th; rank 0 waits in rpc.shutdown for the trainers.
first    new_group([1, 2]) after one all_reduce of every rank: rank 1 enters the pair's first
         all_reduce, rank 2 sleeps in load_batch before it, rank 0 waits in a barrier of the
         default group.
"""

import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]


def load_batch():
    time.sleep(600)


dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "rpc_ddp":
    import torch.distributed.rpc as rpc

    trainers = dist.new_group([1, 2])
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank}", rank=rank, world_size=dist.get_world_size())
    if rank != 0:
        t = torch.ones(256)
        for step in range(1, 6):
            if step == 5 and rank == 2:
                load_batch()
            dist.all_reduce(t, group=trainers)
    rpc.shutdown()
elif mode == "first":
    t = torch.ones(256)
    dist.all_reduce(t)
    pair = dist.new_group([1, 2])
    if rank == 0:
        dist.barrier()
    elif rank == 1:
        dist.all_reduce(t, group=pair)
    else:
        load_batch()
dist.destroy_process_group()
