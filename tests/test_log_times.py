"""`rpcctl logs --merge / --timestamps`: real jobs whose ranks take turns, read back in the order
their lines arrived, with the time each came; the index beside each log is bounded, and a damaged
one costs only the times, never a line."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from conftest import launch_job as launch
from conftest import rpcctl

from rpcctl.base.log_times import RESOLUTION, TimeIndexWriter, times_path

# Three ranks print in turns (0, 1, 2, 0, 1, 2, ...), each waiting for the previous rank's file:
# the true order is known, and rank by rank it is not the order they arrived in.
TURNS_JOB = """
import os, pathlib, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
turns = pathlib.Path(os.environ["RPCCTL_RUN_DIR"]) / "turns"
turns.mkdir(exist_ok=True)
for turn in range(rank, 4 * world, world):
    while turn and not (turns / str(turn - 1)).exists():
        time.sleep(0.01)
    time.sleep(0.2)  # well apart from the previous line: the index has a 10 ms resolution
    print(f"turn {turn} by rank {rank}", flush=True)
    (turns / str(turn)).touch()
sys.stdout.write("no newline at the end")
"""


def _turns_job(tmp_path: Path, runs_dir: Path) -> Path:
    script = tmp_path / "turns.py"
    script.write_text(TURNS_JOB)
    result, run_dir, _ = launch(tmp_path, runs_dir, script=str(script), nproc_per_node=3)
    assert result.returncode == 0, result.stderr
    return run_dir


def test_merge_interleaves_the_ranks_in_the_order_their_lines_arrived(tmp_path, runs_dir):
    run_dir = _turns_job(tmp_path, runs_dir)
    merged = rpcctl("logs", "--merge", "--runs-dir", str(runs_dir))
    assert merged.returncode == 0, merged.stderr
    turns = [line for line in merged.stdout.splitlines() if "turn " in line]
    assert turns == [f"[rank{t % 3}]: turn {t} by rank {t % 3}" for t in range(12)], merged.stdout
    # Every rank's unfinished last line is there too, after that rank's last turn.
    assert merged.stdout.count("no newline at the end") == 3
    by_rank = rpcctl("logs", "--runs-dir", str(runs_dir)).stdout.splitlines()
    assert by_rank[:5] == [f"[rank0]: turn {t} by rank 0" for t in (0, 3, 6, 9)] + ["[rank0]: no newline at the end"]
    assert (run_dir / "logs" / "rank-0.times").stat().st_mode & 0o777 == 0o600


def test_timestamps_are_utc_times_within_the_run_and_in_order(tmp_path, runs_dir):
    _turns_job(tmp_path, runs_dir)
    result = rpcctl("logs", "--merge", "--timestamps", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    run = json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir)).stdout)[0]
    started, ended = (datetime.fromisoformat(run[key]).timestamp() for key in ("started_at", "ended_at"))
    stamps = []
    for line in result.stdout.splitlines():
        stamp, rest = line.split(" ", 1)
        assert stamp.endswith("Z") and rest.startswith("[rank"), line
        stamps.append(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    assert stamps == sorted(stamps)
    assert started - 1 <= stamps[0] and stamps[-1] <= ended + 1, (started, stamps, ended)
    # Lines printed 0.2 s apart are stamped about that far apart (not all at the end of the run).
    turns = [s for s, line in zip(stamps, result.stdout.splitlines()) if "turn " in line]
    assert turns[-1] - turns[0] >= 11 * 0.2 * 0.9, turns
    # The same with one rank alone: its stamps, not the merge, decide.
    alone = rpcctl("logs", "-r", "1", "--timestamps", "--runs-dir", str(runs_dir)).stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in alone][:4] == [f"[rank1]: turn {t} by rank 1" for t in (1, 4, 7, 10)]


def test_a_damaged_index_costs_the_times_never_a_line(tmp_path, runs_dir):
    run_dir = _turns_job(tmp_path, runs_dir)
    index = times_path(run_dir / "logs" / "rank-1.log")
    # no newline at the end either
    index.write_bytes(b"garbage\n" + b"9" * 5_000_000 + b"\nnan nan\n-5 1.0\n0 1e400\n0 -99999999999999\n")
    result = rpcctl("logs", "--merge", "--timestamps", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 15
    rank1 = [line for line in lines if "[rank1]" in line]
    assert len(rank1) == 5 and all(line.startswith("- ") for line in rank1), rank1
    index.unlink()  # a run from before the index: still every line
    assert len(rpcctl("logs", "--merge", "--runs-dir", str(runs_dir)).stdout.splitlines()) == 15


def test_raw_takes_no_merge(tmp_path, runs_dir):
    _turns_job(tmp_path, runs_dir)
    result = rpcctl("logs", "--raw", "--merge", "--runs-dir", str(runs_dir))
    assert result.returncode == 2 and "--raw" in result.stderr and "--merge" in result.stderr


def test_the_index_writes_one_entry_per_resolution_at_most(tmp_path):
    log = tmp_path / "rank-0.log"
    writer = TimeIndexWriter(log)
    for i in range(1000):  # 1000 chunks within 0.1 s: a rank printing as fast as it can
        writer.note(offset=10 * i, now=1000.0 + i * 0.0001)
    writer.note(offset=10_000, now=1000.0 + 0.1 + RESOLUTION)
    writer.close()
    entries = [
        (int(offset), float(moment))
        for offset, moment in (line.split() for line in times_path(log).read_text().splitlines())
    ]
    assert 10 <= len(entries) <= 12, entries  # 0.1 s at 10 ms apiece, not 1001
    assert entries[0] == (0, 1000.0) and entries[-1] == (10_000, 1000.11)
    assert all(later[1] - earlier[1] >= RESOLUTION - 1e-3 for earlier, later in zip(entries, entries[1:])), entries
