"""Reads the Flight Recorder as the rank's sender does (2 ranks, gloo), and prints two counts:

behind     of 100 last reads at exit (a fresh Poller, final=True), each straight after an
           all_reduce, how many still saw one in flight;
backwards  in 40 rounds of 3 all_reduce, then one where rank 0 waits 0.1 s for rank 1, how often the
           "completed" its sender thread's cycles report (every other cycle reading the
           entries) went down.

gloo marks a collective completed on its own thread after wait() returns, and while that thread
is blocked in the next collective, the group status can lag the entry it already retired."""

import os
import threading
import time

import torch
import torch.distributed as dist

from rpcctl.rank import collectives

dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
t = torch.ones(1024)
behind = 0
for _ in range(100):
    dist.all_reduce(t)
    state = next(e for e in collectives.Poller().process(time.time(), final=True) if e["e"] == "coll")
    behind += state["done"] != state["enq"]

cycles = collectives.Poller()
reported: list[int] = []


def sender(stop: threading.Event) -> None:
    sample = False
    while not stop.is_set():
        sample = not sample
        cycles.next_sample = 0.0 if sample else time.time() + 60
        reported.extend(e["done"] for e in cycles.process(time.time()) if e["e"] == "coll" and e["pg"] == "0")
        time.sleep(0.005)


for _ in range(40):
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.1)
        dist.all_reduce(t)
        continue
    stop = threading.Event()
    thread = threading.Thread(target=sender, args=(stop,))
    thread.start()
    dist.all_reduce(t)  # waits for rank 1
    stop.set()
    thread.join()
backwards = sum(b < a for a, b in zip(reported, reported[1:]))
print("behind", behind, "backwards", backwards if rank == 0 else 0, flush=True)
dist.destroy_process_group()
