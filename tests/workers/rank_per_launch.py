"""A job whose ranks are started by separate launches, as pytorch/examples' parameter server runs
it: ``rank_per_launch.py --rank R --world W --port P [--raise-in R]``, one launch per rank, each
setting MASTER_ADDR/MASTER_PORT itself and starting its rank in an ``mp.Process`` that it joins.
Rank 0 (``ps``) owns a parameter; each trainer (``trainer_R``) asks it for an RRef of it 3 times,
holds the 3 for 0.5 s and sums them, then every rank calls ``rpc.shutdown()``. ``--raise-in R``: rank R raises
``RuntimeError`` after its calls instead (its parent still exits 0: mp.Process hides it).
"""

import argparse
import os
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

PARAM = None


def get_param():
    global PARAM
    if PARAM is None:
        PARAM = torch.ones(4, 4)
    return rpc.RRef(PARAM)


def run(rank, world, raise_in):
    name = "ps" if rank == 0 else f"trainer_{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world)
    if rank:
        # held across the steps, as the example's optimizer does
        rrefs = [rpc.rpc_sync("ps", get_param) for _ in range(3)]
        time.sleep(0.5)
        print(f"{name} sum {sum(r.to_here().sum().item() for r in rrefs):g}", flush=True)
    if rank == raise_in:
        raise RuntimeError(f"{name} lost its gradient")
    rpc.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", required=True)
    parser.add_argument("--raise-in", type=int, default=-1)
    args = parser.parse_args()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", args.port
    p = mp.Process(target=run, args=(args.rank, args.world, args.raise_in))
    p.start()
    p.join()
    print(f"rank {args.rank} process exit code {p.exitcode}", flush=True)
