"""A Monarch controller rank for the launcher tests: spawns a proc mesh of 2 on this host with
one actor each, and then does what its argument says.

    monarch_mesh.py hold | raise | actor-raise

Every actor prints "actor on pid P" (to the rank's log: the mesh inherits the rank's output);
the controller writes the mesh's pids, one a line, to $RPCCTL_RUN_DIR/mesh.pids, prints
"mesh up", then: ``hold`` sleeps (until a signal or the job's timeout), ``raise`` raises in the
controller, ``actor-raise`` calls an endpoint that raises in the actors.
"""

import os
import sys
import time

import torch  # noqa: F401  (as most Monarch programs do: the mesh processes import it too)
from monarch.actor import Actor, endpoint, this_host


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        print(f"actor on pid {os.getpid()}", flush=True)
        return os.getpid()

    @endpoint
    def fail(self) -> None:
        raise ValueError(f"actor on pid {os.getpid()} failed on purpose")


action = sys.argv[1]
procs = this_host().spawn_procs(per_host={"procs": 2})
workers = procs.spawn("worker", Worker)
pids = sorted(pid for _, pid in workers.pid.call().get().items())
path = os.path.join(os.environ["RPCCTL_RUN_DIR"], "mesh.pids")
with open(path + ".tmp", "w") as f:
    f.write("".join(f"{pid}\n" for pid in pids))
os.replace(path + ".tmp", path)
print("mesh up", flush=True)
if action == "hold":
    while True:
        time.sleep(0.1)
if action == "raise":
    raise RuntimeError("the controller failed with its mesh up")
if action == "actor-raise":
    workers.fail.call().get()
