"""CPU time and memory of the launcher's log pump on output with no newline (a progress bar's
``\\r`` history, or a binary blob printed by mistake).

    python benchmarks/log_pump.py [--mb 50] [--chunk 4096] [--separator cr|none]

A child process writes ``--mb`` MB in ``--chunk``-byte writes to a real pipe, with one ``\\r``
between records (``--separator cr``, what tqdm writes) or nothing at all (``none``), and a single
``\\n`` at the very end. The pump (``rpcctl.processes.procs.LogPump``, the one ``rpcctl launch`` runs) copies
it to a log file and splits it, in this process. Reported: the pump's CPU seconds (this
process's user+system time while it ran), the growth of the peak RSS, and how many pieces the
callback got. The log file is checked to hold every byte.

Run it against another checkout (``PYTHONPATH=/path/to/old/checkout``) to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rpcctl.processes.procs import LogPump

WRITER = r"""
import os, sys
total, chunk, sep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode().decode("unicode_escape").encode()
record = b"Epoch 0:  42%|####2     | 420/1000 [00:01<00:02, 300.00it/s, loss=0.123]"[: chunk - len(sep)] + sep
block = record * max(1, chunk // len(record))
written = 0
while written < total:
    os.write(1, block)
    written += len(block)
os.write(1, b"\n")
"""


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--separator", choices=("cr", "none"), default="cr")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    total = int(args.mb * 1_000_000)
    separator = "\\r" if args.separator == "cr" else ""

    pieces = 0

    def count(*_args) -> None:  # any callback signature: old and new pumps alike
        nonlocal pieces
        pieces += 1

    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "rank-0.log"
        pump = LogPump(count)
        pump.start()
        write_fd = pump.add(0, log_path)
        rss_before = peak_rss_bytes()
        cpu_before = os.times()
        wall_before = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(total), str(args.chunk), separator], stdout=write_fd
        )
        os.close(write_fd)
        child.wait()
        pump.drain(timeout=600)
        wall = time.perf_counter() - wall_before
        cpu_after = os.times()
        logged = log_path.stat().st_size
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    figures = {
        "mb": args.mb,
        "separator": args.separator,
        "chunk": args.chunk,
        "pump_cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "peak_rss_growth_bytes": peak_rss_bytes() - rss_before,
        "pieces": pieces,
        "log_bytes": logged,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"{args.mb:g} MB, separator {args.separator}: pump CPU {cpu:.2f} s, wall {wall:.2f} s, "
            f"peak RSS +{figures['peak_rss_growth_bytes'] / 1e6:.1f} MB, {pieces} callbacks, log file {logged} bytes"
        )
    if logged < total:
        raise SystemExit(f"the log file lost bytes: {logged} < {total}")


if __name__ == "__main__":
    main()
