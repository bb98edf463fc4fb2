"""A torch.distributed program that runs the steps named in argv[1] (comma-separated), in order,
as torchrun would run it: pg = init_process_group("gloo") from env://, rpc = init_rpc from env://,
ng = new_group([0, last rank]) and an all_reduce in it (across nodes, on several), ar = an
all_reduce in the default group, call = an rpc_sync to the next rank, destroy =
destroy_process_group, shut = rpc.shutdown. Prints "ok RANK ORDER" at the end."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

order = sys.argv[1]
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
for step in order.split(","):
    if step == "pg":
        dist.init_process_group("gloo")
    elif step == "rpc":
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    elif step == "ng":
        group = dist.new_group([0, world_size - 1])
        if rank in (0, world_size - 1):
            t = torch.ones(2)
            dist.all_reduce(t, group=group)
            assert t[0] == 2, t
    elif step == "ar":
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t[0] == world_size, t
    elif step == "call":
        assert rpc.rpc_sync(f"w{(rank + 1) % world_size}", torch.add, args=(1, 2)) == 3
    elif step == "destroy":
        dist.destroy_process_group()
    elif step == "shut":
        rpc.shutdown()
    else:
        raise SystemExit(f"unknown step {step!r}")
print("ok", rank, order)
