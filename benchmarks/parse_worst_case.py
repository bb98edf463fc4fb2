"""The worst lines a rank can print, at the 8 KiB line cap, through every parser of rank text.

    python benchmarks/parse_worst_case.py                    # this checkout's parsers
    python benchmarks/parse_worst_case.py --against 157eaa6  # and a revision's loss parser beside them
    python benchmarks/parse_worst_case.py --json

Each shape is built to hit a backtracking regex where it hurts: a keyword followed by thousands of
spaces (adjacent optional ``\\s*`` classes: cubic in Python's ``re``), thousands of short
``name@``-like pairs (a lazy name per start: quadratic), counters, bars, dicts. A line is timed
through ``LossParser.explain`` (the parser the launcher runs on every line), the stack-dump parser
and the terminal line splitter, as the best of 3. With ``--against REV`` the loss parser of that
revision (``git show REV:rpcctl/telemetry/losses.py``) parses the same lines in a child process,
one line at a time with a time limit (``--limit``, 20 s by default: the old parser takes minutes on
some), so the two columns come from one run. The figures for the record are in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rpcctl.base.lines import MAX_LINE_BYTES, LineSplitter  # noqa: E402
from rpcctl.telemetry.losses import LossParser  # noqa: E402

CAP = MAX_LINE_BYTES


def _fill(head: str, unit: str, tail: str = "") -> str:
    """head + unit repeated + tail, cut to the line cap (in bytes: what the splitter keeps)."""
    room = CAP - len((head + tail).encode())
    count = max(room // len(unit.encode()), 0)
    return head + unit * count + tail


SHAPES: dict[str, str] = {
    "loss+spaces": _fill("loss", " "),
    "loss+spaces+x": _fill("loss", " ", "x"),
    "loss(+spaces": _fill("loss (", " "),
    "epoch+spaces": _fill("epoch", " "),
    "step+spaces": _fill("loss=1 step", " "),
    "name@ pairs": _fill("loss=1 ", "a@"),
    "name= pairs": _fill("loss=1 ", "a.b "),
    "metrics": _fill("loss=1 ", "m=1 "),
    "meters": _fill("loss=1 ", "Acc@1 1 ( "),
    "counters": _fill("loss=1 ", "1 / "),
    "bars": _fill("loss=1 |", "|1/|"),
    "header-like": _fill("=== epoch 4", " "),
    "epoch-value": _fill("epoch 1:", " ", "x"),
    "dict": _fill("{'loss': 1, ", "'a': [", "}"),
    "json": _fill('{"loss": 1, "x": "', "\\u00e9", '"}'),
    "unicode": _fill("loss ", "λé ", "1"),
    "val losses": _fill("", "val loss=1 "),
    "stack frame": _fill('  File "', '", line 1 in ', "x"),
}


def _best_of(function, line: str, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function(line)
        best = min(best, time.perf_counter() - start)
    return best


def _ours() -> dict[str, dict[str, float]]:
    from rpcctl.supervise import watchdog
    from rpcctl.base import frames

    results = {}
    for name, line in SHAPES.items():
        results[name] = {
            "bytes": len(line.encode()),
            "loss_parser_s": _best_of(LossParser().explain, line),
            "stack_parser_s": _best_of(
                lambda text: (
                    watchdog.parse_stacks("Thread 0x1 (most recent call first):\n" + text),
                    frames.hide_own_frames("Thread 0x1 (most recent call first):\n" + text),
                ),
                line,
            ),
            "splitter_s": _best_of(lambda text: LineSplitter().feed(text.encode()), line),
        }
    return results


_CHILD = """
import importlib.util, sys, time, json
spec = importlib.util.spec_from_file_location("then", sys.argv[1])
module = importlib.util.module_from_spec(spec); sys.modules["then"] = module; spec.loader.exec_module(module)
line = sys.stdin.read()
start = time.perf_counter(); module.LossParser().explain(line)
print(json.dumps(time.perf_counter() - start))
"""


def _theirs(revision: str, limit: float) -> dict[str, float | None]:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:rpcctl/telemetry/losses.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    results: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "then_losses.py"
        path.write_text(source)
        for name, line in SHAPES.items():
            try:
                done = subprocess.run(
                    [sys.executable, "-W", "ignore", "-c", _CHILD, str(path)],
                    input=line,
                    capture_output=True,
                    text=True,
                    timeout=limit,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
                results[name] = json.loads(done.stdout)
            except subprocess.TimeoutExpired:
                results[name] = None  # past the limit
            print(f"  {revision}: {name} done", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="also time this git revision's loss parser on the same lines")
    parser.add_argument("--limit", type=float, default=20.0, help="seconds one line may take in --against (default 20)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ours = _ours()
    theirs = _theirs(args.against, args.limit) if args.against else {}
    if args.json:
        print(json.dumps({"ours": ours, "against": args.against, "theirs": theirs}, indent=2))
        return
    head = f"{'shape':<16}{'bytes':>7}{'loss parser':>14}{'stack parser':>14}{'splitter':>11}"
    print(head + (f"{args.against + ' loss parser':>26}{'ratio':>9}" if theirs else ""))
    for name, row in ours.items():
        text = (
            f"{name:<16}{row['bytes']:>7}{row['loss_parser_s'] * 1e3:>11.3f} ms"
            f"{row['stack_parser_s'] * 1e3:>11.3f} ms{row['splitter_s'] * 1e3:>8.3f} ms"
        )
        if theirs:
            then = theirs.get(name)
            text += f"{'> %.0f s' % args.limit if then is None else '%.3f ms' % (then * 1e3):>26}"
            text += f"{'-' if then is None else '%.0fx' % (then / row['loss_parser_s']):>9}"
        print(text)
    worst = max(ours.values(), key=lambda row: row["loss_parser_s"])
    print(f"worst line through the loss parser: {worst['loss_parser_s'] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
