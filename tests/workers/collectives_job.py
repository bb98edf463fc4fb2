"""A gloo job whose collectives are known exactly; argv[1] picks a fault.

clean     5 all_reduce of 4 KiB float32, 3 broadcast, 1 barrier in the default group; a new
          group of ranks 0, 1 runs 2 all_reduce; every rank prints "done RANK"
stall     rank 2 sleeps in load_batch before all_reduce #4 (the others wait in it)
mismatch  rank 1 calls broadcast where the others call all_reduce, at #4
missing   rank 2 sleeps in load_config before init_process_group
slow      rank 1 sleeps 0.2 s before each of the 5 all_reduce (a straggler)

COLL_BACKEND=nccl (scripts/gpu_check.sh): NCCL, tensors on cuda:LOCAL_RANK.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "clean"
rank = int(os.environ["RANK"])


def load_config():
    time.sleep(600)


def load_batch():
    time.sleep(600)


if mode == "missing" and rank == 2:
    load_config()
backend = os.environ.get("COLL_BACKEND", "gloo")
device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if backend == "nccl" else "cpu"
if backend == "nccl":
    torch.cuda.set_device(device)
dist.init_process_group(backend)
t = torch.ones(1024, device=device)
for i in range(1, 6):
    if mode == "slow" and rank == 1:
        time.sleep(0.2)
    if i == 4 and mode == "stall" and rank == 2:
        load_batch()
    if i == 4 and mode == "mismatch" and rank == 1:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
for _ in range(3):
    dist.broadcast(t, src=0)
dist.barrier()
pair = dist.new_group([0, 1]) if dist.get_world_size() >= 2 else None
if pair is not None and rank in (0, 1):
    for _ in range(2):
        dist.all_reduce(t, group=pair)
print("done", rank, flush=True)
dist.destroy_process_group()
