"""A training script of an elastic job that resumes from its own checkpoint (torchrun's
recipe): every rank joins the round's gloo group at WORLD_SIZE, loads the step rank 0 saved last,
and each step all-reduces its count (the sum proves the whole world took part); rank 0 saves the
step after each one, atomically. A round that ends (a node joins or is lost) kills the ranks
mid-step; the next round goes on from the step saved.

    elastic_train.py CHECKPOINT STEPS [SECONDS_PER_STEP [HOLD]]

HOLD: a file; while it exists and holds a number the step has reached, the ranks wait before the
next step (the test paces the job with it: no round ends before the test has seen it).
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
    hold = sys.argv[4] if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
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
        step += 1
        if rank == 0:
            with open(checkpoint + ".tmp", "w") as f:
                json.dump({"step": step, "world": world}, f)
            os.replace(checkpoint + ".tmp", checkpoint)
        print(f"step={step} rank={rank} world={world} restart={restart}", flush=True)
        time.sleep(pause)
    dist.barrier()
    dist.destroy_process_group()
    print(f"done step={step} rank={rank} world={world}", flush=True)


if __name__ == "__main__":
    main()
