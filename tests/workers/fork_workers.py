"""A rank that starts its own workers with the fork start method, which end in ``os._exit``
(multiprocessing's popen_fork, forkserver too: no atexit runs in them). argv[1] picks what they do:

collectives  two rounds of 2 workers, each ``init_process_group`` on gloo (its own free port)
             and ALL_REDUCES all_reduce of 4 KiB: first as ``mp.get_context("fork").Process``,
             then as ``mp.spawn(..., start_method="fork")``; two c10d worlds, w0 and w1
rpc-raise    RAISERS fork workers at once, each ``init_rpc("forkedI")`` (a world of its own) and
             raises ``ValueError`` right after it returned (no rpc.shutdown, no atexit)
exits        one worker after the other, each reports a loss (``LOSSES``: step → loss) and ends:
             fork + ``os._exit(0)`` (step 7), fork + ``sys.exit(3)`` (step 8), forkserver +
             return (step 9), a fork Pool's worker, closed and joined (step 10)
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rpcctl

ALL_REDUCES = 300
RAISERS = 4
LOSSES = {7: 0.25, 8: 0.5, 9: 0.75, 10: 1.0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reduce(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.ones(1024)
    for _ in range(ALL_REDUCES):
        dist.all_reduce(t)
    dist.destroy_process_group()


def rpc_then_raise(index, port):
    import torch.distributed.rpc as rpc

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    rpc.init_rpc(f"forked{index}", rank=0, world_size=1)
    raise ValueError(f"forked{index} fails right after init_rpc")


def loss_then_os_exit():
    rpcctl.report(step=7, loss=LOSSES[7])
    os._exit(0)


def loss_then_sys_exit():
    rpcctl.report(step=8, loss=LOSSES[8])
    sys.exit(3)


def loss_then_return(step):
    rpcctl.report(step=step, loss=LOSSES[step])


def run(method, target, args=()):
    worker = mp.get_context(method).Process(target=target, args=args)
    worker.start()
    worker.join()
    print(f"{target.__name__} ({method}): exit code {worker.exitcode}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "collectives":
        port = free_port()
        workers = [mp.get_context("fork").Process(target=reduce, args=(r, port)) for r in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert [w.exitcode for w in workers] == [0, 0], [w.exitcode for w in workers]
        mp.spawn(reduce, args=(free_port(),), nprocs=2, join=True, start_method="fork")
        print("both rounds done", flush=True)
    elif mode == "rpc-raise":
        workers = [mp.get_context("fork").Process(target=rpc_then_raise, args=(i, free_port())) for i in range(RAISERS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print("exit codes", [w.exitcode for w in workers], flush=True)
    elif mode == "exits":
        run("fork", loss_then_os_exit)
        run("fork", loss_then_sys_exit)
        run("forkserver", loss_then_return, (9,))
        pool = mp.get_context("fork").Pool(1)
        pool.apply(loss_then_return, (10,))
        pool.close()
        pool.join()
        print("all exits done", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")
