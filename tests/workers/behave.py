"""A rank that does what its arguments say, for supervision tests.

    behave.py [RANK=ACTION ...]     ranks not named do `ok`

Actions: ok | exit:N | raise | sigkill | sigsegv | hang | ignore-term | child (start a
grandchild that sleeps, then hang) | survive (undo PR_SET_PDEATHSIG, then hang: a rank that
outlives its rank server) | nap (hang in ``deep_in_named_function``, for stack dumps) |
flaky (fail on the first attempt only) | slow:SECONDS | fail-after:SECONDS (then exit 2) |
rpc (init_rpc, rpc_sync to the next rank, shutdown) | flaky-rpc (exit 7 on the first attempt,
`rpc` on the others).
Every rank prints "rank R started pid P"; `child` writes the grandchild's pid to
$RPCCTL_RUN_DIR/grandchild-R.pid.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

rank = int(os.environ["RANK"])
actions = dict(arg.split("=", 1) for arg in sys.argv[1:])
action = actions.get(str(rank), "ok")
print(f"rank {rank} started pid {os.getpid()} action {action}", flush=True)


def hang():
    while True:
        time.sleep(0.1)


def deep_in_named_function():
    hang()


if action == "ok":
    print(f"rank {rank} done", flush=True)
elif action.startswith("exit:"):
    sys.exit(int(action.split(":")[1]))
elif action == "raise":
    raise ValueError(f"bad value in rank {rank}")
elif action == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
elif action == "sigsegv":
    ctypes.string_at(0)  # a real segmentation fault, not a signal sent by hand
elif action == "hang":
    hang()
elif action == "survive":
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0: no death with the rank server
    print(f"rank {rank} will survive its rank server", flush=True)
    hang()
elif action == "nap":
    deep_in_named_function()
elif action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring SIGTERM", flush=True)
    hang()
elif action == "child":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    # Written whole, then renamed: the tests wait for the file to exist and read it at once (CI
    # read an empty one, made by open() and not yet written).
    pid_file = os.path.join(os.environ["RPCCTL_RUN_DIR"], f"grandchild-{rank}.pid")
    with open(pid_file + ".part", "w") as f:
        f.write(str(child.pid))
    os.replace(pid_file + ".part", pid_file)
    hang()
elif action == "flaky":
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"attempt {attempt}", flush=True)
    if attempt == 0:
        sys.exit(7)
elif action.startswith("slow:"):
    time.sleep(float(action.split(":")[1]))
elif action.startswith("fail-after:"):
    time.sleep(float(action.split(":")[1]))
    sys.exit(2)
elif action == "flaky-rpc" and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0:
    print("attempt 0", flush=True)
    sys.exit(7)
elif action in ("rpc", "flaky-rpc"):
    import torch
    import torch.distributed.rpc as rpc

    world = int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    result = rpc.rpc_sync(f"worker{(rank + 1) % world}", torch.add, args=(torch.ones(2), rank))
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"rank {rank} rpc result {result.tolist()} attempt {attempt} port {os.environ['MASTER_PORT']}", flush=True)
    rpc.shutdown()
else:
    raise SystemExit(f"unknown action {action}")
