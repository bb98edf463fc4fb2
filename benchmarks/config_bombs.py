"""Time and memory of `rpcctl launch --dry-run` on hostile configs and flags (issue 15 item 9).

    python benchmarks/config_bombs.py [--repeats 3] [--json out.json]

The promise: bad input gets one message and exit 2 in under 2 s and 200 MB, whatever its size
or shape. Each case runs the real CLI as a subprocess (through a one-child wrapper, so that
``RUSAGE_CHILDREN``'s peak RSS is that run's own); the table shows the median wall time, the
peak RSS, the exit code and the message. The first row, a small valid config, is what starting
the CLI costs at all (imports: on a loaded machine most of every row); `load_config` is also
timed in this process, imports excluded. Before the fix: the 497-byte billion laughs grew to 3.1 GB in 45 s, the
recursive alias and the 20 000-deep file ended in RecursionError tracebacks, the 48 MB config
took over 90 s and 1.9 GB, the FIFO blocked for ever and --ranks 0-99999999999 built a 10 GB set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRAPPER = (
    "import json, resource, subprocess, sys\n"
    "run = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,"
    " stdin=subprocess.DEVNULL, text=True)\n"
    "lines = run.stderr.strip().splitlines()\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
    "print(json.dumps([run.returncode, peak, lines[0] if lines else '']))\n"
)


def billion_laughs() -> str:
    lines = ["script: train.py", 'a0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def cases(folder: Path) -> list[tuple[str, list[str]]]:
    (folder / "train.py").write_text("print('hi')\n")
    files = {
        "valid (baseline)": "script: train.py\nnproc_per_node: 2\n",
        "billion laughs (497 B)": billion_laughs(),
        "recursive alias": "script: train.py\nargs: &a [x, *a]\n",
        "20 000-deep nesting": "script: train.py\nargs: " + "[" * 20000 + "]" * 20000 + "\n",
        "349 000 values": "script: train.py\nargs: [" + ",".join(["a"] * 349_000) + "]\n",
        "valid, near the 1 MiB cap": "script: train.py\nenv:\n"
        + "".join(f"  VAR_{i}: {'v' * 100}\n" for i in range(9_000)),
        "48 MB config": "script: train.py\nenv:\n"
        + "".join(f"  VAR_{i}: value-{i}-abcdefghijklmnop\n" for i in range(1_300_000)),
    }
    out = []
    for index, (label, text) in enumerate(files.items()):
        path = folder / ("valid.yaml" if index == 0 else f"case{index}.yaml")
        path.write_text(text)
        # --json for the valid ones: the table of 9,000 variables would time rich, not the loader
        out.append(
            (
                f"{label}, {path.stat().st_size:,} B",
                ["launch", str(path), "--dry-run", *(["--json"] if "valid" in label else [])],
            )
        )
    fifo = folder / "fifo.yaml"
    os.mkfifo(fifo)
    out.append(("a FIFO as the config", ["launch", str(fifo), "--dry-run"]))
    out.append(("/dev/zero as the config", ["launch", "/dev/zero", "--dry-run"]))
    out.append(
        ("--ranks 0-99999999999", ["launch", str(folder / "valid.yaml"), "--dry-run", "--ranks", "0-99999999999"])
    )
    return out


def load_in_process(path: Path) -> float | None:
    """Seconds ``load_config`` itself takes, imports excluded (None when it is not a file case)."""
    from rpcctl.config import load_config
    from rpcctl.base.errors import RpcctlError

    if not path.is_file() or path.suffix != ".yaml":
        return None
    start = time.perf_counter()
    try:
        load_config(path)
    except RpcctlError:
        pass
    return time.perf_counter() - start


def run_once(args: list[str], folder: Path) -> tuple[float, int, int, str]:
    """(wall seconds, exit code, peak RSS bytes, first line of stderr) of one CLI run."""
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "rpcctl", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=folder)
    elapsed = time.perf_counter() - start
    code, peak, message = json.loads(proc.stdout)
    return elapsed, code, peak, message


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for label, cli_args in cases(folder):
            samples = [run_once(cli_args, folder) for _ in range(args.repeats)]
            wall = statistics.median(s[0] for s in samples)
            loads = [load_in_process(Path(cli_args[1])) for _ in range(args.repeats)]
            load_s = statistics.median(loads) if None not in loads else None
            rss = max(s[2] for s in samples)
            code, message = samples[0][1], samples[0][3]
            rows.append(
                {
                    "case": label,
                    "wall_s": wall,
                    "load_config_s": load_s,
                    "peak_rss_bytes": rss,
                    "exit_code": code,
                    "message": message,
                    "samples_s": [s[0] for s in samples],
                }
            )
            load_text = f"{load_s:7.3f} s" if load_s is not None else "      -  "
            print(
                f"{label:44} exit {code}  cli {wall:5.2f} s  load_config {load_text}  {rss / 2**20:4.0f} MB"
                f"  {message[:90]}",
                flush=True,
            )
    worst = max(rows[1:], key=lambda r: r["wall_s"])
    slowest_load = max((r for r in rows if r["load_config_s"] is not None), key=lambda r: r["load_config_s"])
    print(
        f"\nslowest CLI run: {worst['case']}: {worst['wall_s']:.2f} s"
        f" (the CLI's own start, a valid config: {rows[0]['wall_s']:.2f} s); "
        f"slowest load_config: {slowest_load['case']}: {slowest_load['load_config_s']:.3f} s; "
        f"largest peak RSS: {max(r['peak_rss_bytes'] for r in rows[1:]) / 2**20:.0f} MB"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
