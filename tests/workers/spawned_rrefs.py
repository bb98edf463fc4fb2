"""A program shaped like PyTorch's RPC examples: it mp.spawns its workers (twice), and each
worker calls init_rpc on localhost with a port of its own (issue 32). Per round (an RPC world of
three workers, w0, w1, w2), the RRefs it makes, alive to the end of the round:

======  ======  ==============================  ==============================================
owner   kind    type                            what
======  ======  ==============================  ==============================================
w1      remote  Net                             ``rpc.remote("w1", Net)``, held by w0
w1      local   Parameter (x2)                  ``[RRef(p) for p in net.parameters()]`` on w1,
                                                handed to w0
w1      local   _ScriptLocalOptimizer           DistributedOptimizer's, made on w1 for w0 (the
                                                fork's type: its interface, the owner's wins)
w1      remote  Tensor (64,)                    ``rpc.remote("w1", torch.ones)``: w0 makes it and
                                                never uses it again; w2, handed it, uses it to
                                                the end of the round
w0      local   _ScriptLocalOptimizer           DistributedOptimizer's on w0's own parameters:
                                                made by an rpc_async to itself
======  ======  ==============================  ==============================================

6 RRefs a round listed, 12 in all. w0's own parameters' RRefs live only through
DistributedOptimizer's constructor: 2 short-lived a round. Live bytes: w1 holds Net (its
parameters' RRefs are inside it) and the table.
"""

import os
import socket
import sys
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

ROUNDS = int(os.environ.get("ROUNDS", "2"))  # rounds of mp.spawn (the report's scale test runs 4)
HOLD_S = float(os.environ.get("HOLD_S", "3"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)

    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


def _call_method(method, rref, *args):
    return method(rref.local_value(), *args)


_kept = {}


def keep_and_use(table):
    """On w2: keep the table's RRef and use it until told to stop (its last use is near the end)."""
    _kept["table"] = table

    def use():
        while not _kept.get("stop"):
            table.to_here()
            time.sleep(0.05)

    _kept["thread"] = threading.Thread(target=use)
    _kept["thread"].start()


def stop_using():
    _kept["stop"] = True
    _kept["thread"].join()


def worker(rank, world, port, round_):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world)
    if rank == 0:
        net = rpc.remote("w1", Net)
        remote_params = rpc.rpc_sync("w1", _call_method, args=(Net.param_rrefs, net))
        remote_opt = DistributedOptimizer(torch.optim.SGD, remote_params, lr=0.01)
        mine = torch.nn.Linear(8, 4)
        own_opt = DistributedOptimizer(torch.optim.SGD, [rpc.RRef(p) for p in mine.parameters()], lr=0.01)
        table = rpc.remote("w1", torch.ones, args=((64,),))
        rpc.rpc_sync("w2", keep_and_use, args=(table,))
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:
            with dist_autograd.context() as ctx:
                x = torch.ones(2, 8)
                loss = rpc.rpc_sync("w1", _call_method, args=(Net.forward, net, x)).sum() + mine(x).sum()
                dist_autograd.backward(ctx, [loss])
                remote_opt.step(ctx)
                own_opt.step(ctx)
            time.sleep(0.05)
        rpc.rpc_sync("w2", stop_using)
        print(f"round {round_} done", flush=True)
    rpc.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    for round_ in range(ROUNDS):
        mp.spawn(worker, args=(3, free_port(), round_), nprocs=3, join=True)
    print("all rounds done", file=sys.stderr)
