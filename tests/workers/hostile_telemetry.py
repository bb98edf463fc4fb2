"""Ranks that feed the launcher's telemetry what no honest rank sends (issue 38).

hostile_telemetry.py odd-lines   2 ranks: rank 0 prints lines with numbers no 64-bit integer
                                 holds, then makes rpc_sync calls without printing for
                                 SILENT_S (longer than the config's hang_timeout), then prints
                                 "step 5 loss 0.25"; rank 1 sends hostile events over its own
                                 connection to the run's socket, then serves
hostile_telemetry.py flood       rank 0 reports a loss every 50 ms for FLOOD_S + 1 s; once it
                                 is connected, rank 1's processes connect to the run's socket
                                 in a loop and hold every connection they get, for FLOOD_S
hostile_telemetry.py memory      rank 0, once $RPCCTL_RUN_DIR/go exists: CONNECTIONS connections,
                                 each sending a hello and then LINE_MIB MiB of one line that
                                 never ends (a MiB to each in turn), held until
                                 $RPCCTL_RUN_DIR/release exists; $RPCCTL_RUN_DIR/held says they were sent
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

MODE = sys.argv[1]
RANK = int(os.environ["RANK"])
SOCKET = os.environ["RPCCTL_TELEMETRY_SOCKET"]
RUN_DIR = Path(os.environ["RPCCTL_RUN_DIR"])
SILENT_S = float(os.environ.get("SILENT_S", "8"))
FLOOD_S = float(os.environ.get("FLOOD_S", "4"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "40"))
LINE_MIB = int(os.environ.get("LINE_MIB", "8"))

BIG = 123456789012345678901234567890
ODD_LINES = [
    f"step {BIG} loss 0.5",
    f"epoch {BIG} step 3 loss 0.5",
    "step " + "9" * 5000 + " loss 0.5",
    '{"loss": ' + "1" * 400 + ', "step": 2}',
    '{"loss": 0.5, "step": 1e300}',
    '{"loss": ' + "[" * 3000 + "]" * 3000 + "}",
    f"Epoch {BIG}",
    "loss=1e999 acc=1e999",
]


def line(message: dict) -> bytes:
    return (json.dumps(message, allow_nan=True) + "\n").encode()


def hostile_events() -> list[bytes]:
    """One batch line per event: every kind with its fields at values the store cannot hold."""
    now = time.time()
    inf, nan, huge = float("inf"), float("nan"), 2**64
    events = [
        {"e": "probe", "t": now, "cpu_s": 1e308, "rss_bytes": huge, "cpu_percent": nan, "threads": -1},
        {"e": "probe", "t": inf, "cpu_s": 1.0},
        {"e": "call", "t": -inf, "id": 1, "kind": "sync", "callee": "worker0", "func": "f", "thread": huge},
        {"e": "coll", "t": now, "pg": "0", "enq": 2**63 - 1, "done": 0, "seq": huge, "since": -inf, "op": "allreduce"},
        {"e": "cent", "t": now, "pg": "0", "seq": 1, "entered": -inf, "completed": 1e308},
        {
            "e": "cstat",
            "t": now,
            "callee": "worker0",
            "func": "f",
            "kind": "sync",
            "n": 2**63 - 1,
            "sum": 1e308,
            "h": {"99999": 1},
        },
        {"e": "cop", "t": now, "pg": "0", "op": "allreduce", "n": 2**63 - 1, "bytes": 2**63 - 1, "sum": inf},
        {"e": "loss", "t": now, "step": BIG, "loss": 0.5},
        {"e": "rref", "t": now, "id": "x" * 100_000, "owner_rank": huge},
        {"e": "desc", "t": now, "id": "1:1", "value": {"shape": [2**40, 2**40], "nbytes": huge}},
        {"e": "rpc", "t": now, "name": "\ud800", "workers": {"9" * 40: "w"}},
        {"e": "churn", "t": now, "n": huge},
        {"e": "cexit", "t": now, "pid": huge, "code": 2**40},
    ]
    return [line({"k": "batch", "ev": [event]}) for event in events]


def echo(x):
    return x


def odd_lines() -> None:
    import torch.distributed.rpc as rpc

    if RANK == 1:  # its own connection, beside its reporter's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(SOCKET)
        sock.sendall(
            line({"k": "hello", "pid": 2**64, "ppid": 1, "host": "h", "rank": 1, "kind": "rank", "t": time.time()})
        )
        sock.sendall(
            line(
                {
                    "k": "hello",
                    "pid": os.getpid(),
                    "ppid": os.getppid(),
                    "host": "h",
                    "rank": 1,
                    "kind": "child",
                    "t": time.time(),
                }
            )
        )
        for message in hostile_events():
            sock.sendall(message)
        sock.sendall(b"NaN\n" + b"[" * 100_000 + b"\n" + b"\xff\xfe\n")
        # only another node's launcher may
        sock.sendall(line({"k": "launcher", "op": "exited", "args": [0, 1, "failed", 9]}))
        sock.close()
    rpc.init_rpc(f"worker{RANK}", rank=RANK, world_size=2)
    if RANK == 0:
        for text in ODD_LINES:
            print(text, flush=True)
        started = time.monotonic()
        while time.monotonic() - started < SILENT_S:
            rpc.rpc_sync("worker1", echo, args=(1,))
        print("step 5 loss 0.25", flush=True)
    rpc.shutdown()


def flood() -> None:
    if RANK == 0:
        import rpcctl

        started, step = time.monotonic(), 0
        while time.monotonic() - started < FLOOD_S + 1.0:
            rpcctl.report(step=step, loss=1.0 / (step + 1))
            if step == 0:  # connected (report joins telemetry before it returns): the flood may begin
                (RUN_DIR / "reporting").write_text("")
            step += 1
            time.sleep(0.05)
        print(f"reported {step} steps", flush=True)
        time.sleep(0.5)  # the last ones go out
        return
    deadline = time.monotonic() + 30
    while not (RUN_DIR / "reporting").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # its connection accepted
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            held: list[socket.socket] = []
            deadline = time.monotonic() + FLOOD_S
            while time.monotonic() < deadline:
                try:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(0.2)
                    sock.connect(SOCKET)
                    held.append(sock)
                except OSError:
                    sock.close()
                    if held:
                        held.pop(0).close()  # room for the next try
                    time.sleep(0.001)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    print("flood over", flush=True)


def memory() -> None:
    if RANK != 0:
        return
    deadline = time.monotonic() + 60
    while not (RUN_DIR / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    chunk = b"x" * (1 << 20)
    held = []
    for _ in range(CONNECTIONS):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(SOCKET)
        sock.sendall(
            line(
                {"k": "hello", "pid": os.getpid(), "ppid": 1, "host": "h", "rank": 0, "kind": "child", "t": time.time()}
            )
        )
        sock.sendall(b'{"k": "batch", "ev": [{"e": "error", "message": "')
        held.append(sock)
    live = list(held)
    for _ in range(LINE_MIB):  # a MiB to each in turn: every connection holds part of a line at once
        for sock in list(live):
            try:
                sock.sendall(chunk)
            except OSError:  # cut off by the launcher: what it should do
                live.remove(sock)
    (RUN_DIR / "held").write_text(f"{len(live)} of {CONNECTIONS} connections still open")
    while not (RUN_DIR / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    for sock in held:
        sock.close()


{"odd-lines": odd_lines, "flood": flood, "memory": memory}[MODE]()
