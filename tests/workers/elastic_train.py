"""A training script of an elastic job that resumes from its own checkpoint (torchrun's
recipe): every rank joins the round's gloo group at WORLD_SIZE, loads the step rank 0 saved last,
and each step all-reduces its count (the sum proves the whole world took part); rank 0 saves the
step after each one, atomically. A round that ends (a node joins or is lost) kills the ranks
mid-step; the next round goes on from the step saved.

    elastic_train.py CHECKPOINT STEPS [SECONDS_PER_STEP [HOLD [rpc]]]

HOLD: a file; while it exists and holds a number the step has reached, the ranks wait before the
next step (the test paces the job with it: no round ends before the test has seen it).
rpc: each rank also joins the round's RPC world (a static one: ``init_rpc`` at WORLD_SIZE) and
each step calls the next rank (``rpc=workerN`` on its step line): in a grown world some of those
calls cross to the other node.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def held_at(hold: str) -> float:
    try:
        with open(hold) as f:
            return int(f.read().strip() or "0")
    except (OSError, ValueError):  # no file (or one being written): no hold
        return float("inf")


def main() -> None:
    checkpoint, steps = sys.argv[1], int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    hold = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
    use_rpc = len(sys.argv) > 5 and sys.argv[5] == "rpc"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = f"worker{(rank + 1) % world}"
    if use_rpc:
        import torch.distributed.rpc as rpc

        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    try:
        with open(checkpoint) as f:
            step = json.load(f)["step"]
    except FileNotFoundError:
        step = 0
    print(f"resume step={step} rank={rank} world={world} restart={restart}", flush=True)
    while step < steps:
        while hold and step >= held_at(hold):
            time.sleep(0.05)
        count = torch.ones(1)
        dist.all_reduce(count)
        assert int(count.item()) == world, (count, world)
        if use_rpc:
            answered = rpc.rpc_sync(peer, torch.add, args=(torch.tensor([step]), 1))
            assert int(answered.item()) == step + 1, answered
        step += 1
        if rank == 0:
            with open(checkpoint + ".tmp", "w") as f:
                json.dump({"step": step, "world": world}, f)
            os.replace(checkpoint + ".tmp", checkpoint)
        called = f" rpc={peer}" if use_rpc else ""
        print(f"step={step} rank={rank} world={world} restart={restart}{called}", flush=True)
        time.sleep(pause)
    dist.barrier()
    if use_rpc:
        rpc.shutdown()
    dist.destroy_process_group()
    print(f"done step={step} rank={rank} world={world}", flush=True)


if __name__ == "__main__":
    main()
