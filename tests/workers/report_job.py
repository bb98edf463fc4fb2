"""A small RPC job for the report tests: rank 0 makes RRefs owned by the other ranks, every
rank reports known losses and a second metric; with GATE set, rank 0 reports one more loss
only once that file exists (the live page test); with FAIL set, the last rank raises FAIL
(the others wait to be torn down); with FAIL_ONCE set, the last rank fails its first attempt only
(the restart test); with HANG set, rank 0 waits on a call worker1 never ends."""

import os
import time

import torch
import torch.distributed.rpc as rpc

import rpcctl


def sleep_long():
    time.sleep(600)


rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
steps = int(os.environ.get("STEPS", "6"))
metric = os.environ.get("METRIC", "accuracy")
held = []
if os.environ.get("FAIL_ONCE") and rank == world - 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    raise RuntimeError("the first attempt fails")
if rank == 0:
    for owner in range(1, world):
        held.append(rpc.remote(f"worker{owner}", torch.ones, args=([256 * owner],)))  # 1 KiB per owner rank
for step in range(steps):
    rpcctl.report(step=step, loss=(rank + 1) * 10.0 / (step + 1), **{metric: step / 10})
    time.sleep(0.1)
if os.environ.get("HANG") and rank == 0:
    rpc.rpc_sync("worker1", sleep_long)  # the hang watchdog's case: a callee asleep
if os.environ.get("FAIL"):
    if rank == world - 1:
        raise RuntimeError(os.environ["FAIL"])
    time.sleep(60)  # out of RPC until torn down: the failing rank is the root cause, never a peer's eof
gate = os.environ.get("GATE")
if gate and rank == 0:
    while not os.path.exists(gate):
        time.sleep(0.05)
    rpcctl.report(step=steps, loss=0.125, **{metric: 0.9})
    time.sleep(1.0)
if rank == 0:
    print("sum", sum(r.to_here().sum().item() for r in held), flush=True)
