"""What connections holding unfinished lines cost the launcher's telemetry server, before and after
issue 38's bounds, side by side in one run.

A real ``TelemetryServer`` runs in its own process, once from an older revision of rpcctl (``git
archive REV``: by default the one before the bounds) and once from this tree. This script, another
process, opens N connections to its socket, sends each a hello, then the start of a line that never
ends: a MiB to each connection in turn, M MiB each. The figures are the server process's resident
memory before and at its peak (sampled every 10 ms); and how long each revision's ``LineBuffer``
takes to join a 3 MiB line fed in 4 KiB chunks (the old one copied the whole line at every chunk).

    python benchmarks/telemetry_memory.py [--before d4c3efb] [--connections 40] [--mib 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SERVER = """
import json, sys
from pathlib import Path
from rpcctl.telemetry.server import TelemetryServer
server = TelemetryServer(Path(sys.argv[1]), None, world_size=1)
print(json.dumps({"socket": server.start()["RPCCTL_TELEMETRY_SOCKET"]}), flush=True)
sys.stdin.readline()
server.close()
"""


def _hello() -> bytes:
    return (
        json.dumps(
            {"k": "hello", "pid": os.getpid(), "ppid": 1, "host": "h", "rank": 0, "kind": "child", "t": time.time()}
        ).encode()
        + b"\n"
    )


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    sock.sendall(_hello())
    return sock


def measure(tree: Path, connections: int, mib: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="rpcctl-memory-") as run_dir:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, run_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tree,
            env=env,
        )
        try:
            path = json.loads(server.stdout.readline())["socket"]
            process = psutil.Process(server.pid)
            time.sleep(0.3)
            base = peak = process.memory_info().rss
            sampling = True

            def sample() -> None:
                nonlocal peak
                while sampling:
                    peak = max(peak, process.memory_info().rss)
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            held = [_connect(path) for _ in range(connections)]
            for sock in held:
                sock.sendall(b'{"k": "batch", "ev": [{"e": "error", "message": "')
            live, chunk, cut = list(held), b"x" * (1 << 20), 0
            for _ in range(mib):
                for sock in list(live):
                    try:
                        sock.sendall(chunk)
                    except OSError:  # the server cut it off
                        live.remove(sock)
                        cut += 1
            time.sleep(0.5)
            sampling = False
            sampler.join()
            for sock in held:
                sock.close()
        finally:
            _, said = server.communicate("\n", timeout=60)
    return {"base": base / 2**20, "peak": peak / 2**20, "cut": cut, "line_s": _line_buffer_s(tree), "said": said}


def _line_buffer_s(tree: Path) -> float:
    """Seconds the tree's ``LineBuffer`` takes to join one 3 MiB line fed in 4 KiB chunks (what a
    server that keeps up with a slow writer reads), best of 3."""
    spec = importlib.util.spec_from_file_location(
        f"channel_{abs(hash(str(tree)))}", tree / "rpcctl" / "telemetry" / "channel.py"
    )
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    piece, best = b"y" * 4096, float("inf")
    for _ in range(3):
        buffer, began = module.LineBuffer(), time.perf_counter()
        for _ in range(3 * 256):
            buffer.feed(piece)
        assert buffer.feed(b"\n") == [piece * 768]
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", default="d4c3efb", help="the revision to compare with (default: the one before the bounds)"
    )
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--mib", type=int, default=8, help="MiB each connection sends of its unfinished line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rpcctl-before-") as before:
        archive = subprocess.run(
            ["git", "archive", args.before, "rpcctl"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        rows = [
            (f"before ({args.before})", measure(Path(before), args.connections, args.mib)),
            ("this tree", measure(ROOT, args.connections, args.mib)),
        ]
    print(
        f"{args.connections} connections, each sending {args.mib} MiB of a line that never ends"
        " (a MiB to each in turn)\n"
    )
    print(f"{'server':<22}{'RSS before':>12}{'peak':>10}{'grew':>10}{'cut off':>9}{'LineBuffer: 3 MiB in 4 KiB':>28}")
    for name, row in rows:
        print(
            f"{name:<22}{row['base']:>9.0f} MB{row['peak']:>7.0f} MB{row['peak'] - row['base']:>7.0f} MB"
            f"{row['cut']:>9}{row['line_s']:>26.3f} s"
        )
    (_, old), (_, new) = rows
    print(
        f"\ngrowth: {(old['peak'] - old['base']) / max(1.0, new['peak'] - new['base']):.1f}x less;"
        f" the 3 MiB line: {old['line_s'] / max(1e-6, new['line_s']):.1f}x faster"
    )
    for name, row in rows:
        if row["said"].strip():
            print(f"\n{name}, on its stderr:\n{row['said'].rstrip()}")


if __name__ == "__main__":
    main()
