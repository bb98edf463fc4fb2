"""The rank of tests/test_families.py's toy family: registers it once the sender runs, imports ``wave`` (its
after-import hook), lets the sender cycle, then forks a child that joins telemetry (its first
``rpcctl.report``) and ends with ``os._exit``, as a fork worker does."""

import os
import time

import rpcctl
import toy_family

time.sleep(0.3)  # the sender has cycled without the toy: it is picked up where it runs
toy_family.rank_side()
import wave  # noqa: E402,F401 - the toy family's after-import hook

time.sleep(0.35)  # a few sender cycles (0.1 s each)
pid = os.fork()
if pid == 0:
    rpcctl.report(step=1, loss=1.0)
    time.sleep(0.25)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", pid, "status", status)
