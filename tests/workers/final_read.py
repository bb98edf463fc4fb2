"""Reads the Flight Recorder the way the sender's last read at exit does, straight after each of
200 all_reduce (2 ranks, gloo), and prints how many reads still had one in flight."""

import time

import torch
import torch.distributed as dist

from rpcctl.rank import collectives

dist.init_process_group("gloo")
t = torch.ones(1024)
behind = 0
for _ in range(200):
    dist.all_reduce(t)
    state = next(e for e in collectives.Poller().process(time.time(), final=True) if e["e"] == "coll")
    behind += state["done"] != state["enq"]
print("behind", behind, flush=True)
dist.destroy_process_group()
