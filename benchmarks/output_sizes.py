"""How big rpcctl's outputs get when a rank is hostile (issue 28, item 4).

    python benchmarks/output_sizes.py [--message-mb 20] [--metrics 200] [--steps 2500] [--json out.json]

Two real runs through the real CLI (one rank each, no torch): one raises an exception whose
message is ``--message-mb`` MB; the other reports ``--metrics`` metrics (and a loss) for
``--steps`` steps through ``rpcctl.report``. The table gives the bytes of what rpcctl writes of
them: run.json, the rank's error file, what `rpcctl launch` printed, the report, the trace and
one response of the live page (``/api/view``: the view as JSON), each with the default caps and,
where a flag lifts them, uncapped (``report --all``, ``trace --max-events 0``).

Run it on an older checkout (PYTHONPATH=that checkout, from another directory) for the "before"
figures: flags it does not know give no row. The report holds plotly.js (about 4.6 MB) whatever
the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

METRICS = textwrap.dedent(
    """
    import os, time
    import rpcctl
    names = [f"metric_{i:03d}" for i in range(int(os.environ["METRICS"]))]
    for step in range(int(os.environ["STEPS"])):
        rpcctl.report(step=step, loss=1.0 / (step + 1), **{name: step * 0.001 * i for i, name in enumerate(names)})
        if step % 50 == 0:
            time.sleep(0.05)  # the sender drops (and counts) what a full queue cannot take
    """
)
BIG = "import os\nraise RuntimeError('x' * int(float(os.environ['MESSAGE_MB']) * 1_000_000))\n"


def rpcctl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rpcctl", *args], capture_output=True, text=True, cwd=cwd, timeout=1800
    )


def launch(folder: Path, name: str, script: str, env: dict[str, str]) -> tuple[Path, int]:
    """Run the job to its end; return its run directory and the bytes `rpcctl launch` printed."""
    (folder / f"{name}.py").write_text(script)
    config = folder / f"{name}.yaml"
    config.write_text(
        json.dumps({"script": f"{name}.py", "nproc_per_node": 1, "preload": [], "env": env, "timeout": 1200})
    )
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(folder / "runs"), cwd=folder)
    [run_dir] = [p for p in (folder / "runs").iterdir() if p.name.startswith(name)]
    return run_dir, len(result.stdout.encode()) + len(result.stderr.encode())


def output_size(folder: Path, command: list[str], out: Path) -> int | None:
    """Bytes of the file a command writes; None when this rpcctl does not know its flags."""
    result = rpcctl(*command, "-o", str(out), cwd=folder)
    if result.returncode != 0:
        return None
    return out.stat().st_size


def live_view_size(run_dir: Path) -> int:
    code = (
        "from pathlib import Path; from rpcctl.web import page;"
        f" print(len(page.view_json(page.run_view(Path({str(run_dir)!r})))))"
    )
    return int(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=run_dir.parent
        ).stdout
    )


def measure(folder: Path, message_mb: float, metrics: int, steps: int) -> list[tuple[str, str, int | None]]:
    rows: list[tuple[str, str, int | None]] = []
    run_dir, printed = launch(folder, "big", BIG, {"MESSAGE_MB": str(message_mb)})
    what = f"{message_mb:g} MB exception"
    error_file = run_dir / "errors" / "rank-0.json"
    rows += [
        (what, "run.json", (run_dir / "run.json").stat().st_size),
        (what, "errors/rank-0.json", error_file.stat().st_size if error_file.exists() else None),
        (what, "printed by rpcctl launch", printed),
        (what, "report", output_size(folder, ["report", str(run_dir)], folder / "big.html")),
        (what, "live page /api/view", live_view_size(run_dir)),
    ]
    run_dir, _ = launch(folder, "metrics", METRICS, {"METRICS": str(metrics), "STEPS": str(steps)})
    what = f"{metrics} metrics x {steps} steps"
    rows += [
        (what, "report", output_size(folder, ["report", str(run_dir)], folder / "m.html")),
        (what, "report --all", output_size(folder, ["report", str(run_dir), "--all"], folder / "m-all.html")),
        (what, "trace", output_size(folder, ["trace", str(run_dir)], folder / "m.json")),
        (
            what,
            "trace --max-events 0",
            output_size(folder, ["trace", str(run_dir), "--max-events", "0"], folder / "m-all.json"),
        ),
        (what, "live page /api/view", live_view_size(run_dir)),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-mb", type=float, default=20)
    parser.add_argument("--metrics", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rpcctl-output-sizes-") as tmp:
        rows = measure(Path(tmp), args.message_mb, args.metrics, args.steps)
    print(f"{'run':<28} {'output':<26} {'bytes':>14}")
    for what, output, size in rows:
        print(f"{what:<28} {output:<26} {'-' if size is None else f'{size:,}':>14}")
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps([{"run": w, "output": o, "bytes": s} for w, o, s in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
