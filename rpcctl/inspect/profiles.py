"""Sampling profiles of a live rank and the processes under it (``rpcctl profile``), kept in the
run directory (``profiles/rank-R-STAMP.FORMAT.json``, 0600 in a 0700 folder) for ``report`` and
``web`` to draw as a flame graph (``rpcctl.web.flame``). py-spy reads the processes from outside
(``rpcctl.base.native_stacks.record_profile``): the script is not changed, and nothing runs in
the rank."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rpcctl.base import native_stacks
from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.base.private import private_dir, write_private_atomic
from rpcctl.inspect.stacks import live_rank

SUFFIX = {"speedscope": ".speedscope.json", "chrome": ".trace.json"}
MAX_SECONDS = 3600.0


@dataclass
class Profile:
    rank: int
    pid: int
    fmt: str  # speedscope | chrome
    seconds: float
    samples: int | None
    path: Path  # the run's copy


def take_profile(
    run_dir: Path, rank: int, seconds: float, fmt: str = "speedscope", rate: int = 100, native: bool = False
) -> Profile:
    """Sample a live rank and every process under it for ``seconds``; the file is kept in the run."""
    if fmt not in SUFFIX:
        raise UsageError(f"--format {fmt}: one of {', '.join(SUFFIX)}")
    if not 1 <= seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds {seconds:g}: between 1 and {MAX_SECONDS:g}")
    if not 1 <= rate <= 1000:
        raise UsageError(f"--rate {rate}: between 1 and 1000 samples a second")
    state = live_rank(run_dir, rank)
    folder = private_dir(run_dir / "profiles")
    path = folder / f"rank-{rank}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}{SUFFIX[fmt]}"
    partial = path.with_name(f".{path.name}.partial")
    samples, error = native_stacks.record_profile(state.pid, seconds, fmt, partial, rate, native)
    if error is not None:
        partial.unlink(missing_ok=True)
        raise RpcctlError(
            native_stacks.refused_hint().replace("native stacks:", "profile:").split("; the Python stacks")[0]
            if error == native_stacks.REFUSED
            else f"profile of rank {rank} (pid {state.pid}): {error}"
        )
    os.chmod(partial, 0o600)  # py-spy writes as its umask says: the run's files are the owner's alone
    if fmt == "chrome":
        write_private_atomic(partial, json.dumps(trace_document(json.loads(partial.read_text()), rank, state.pid)))
    os.replace(partial, path)
    return Profile(rank, state.pid, fmt, seconds, samples, path)


def trace_document(events: list, rank: int, pid: int) -> dict:
    """py-spy's Chrome trace (a list of B/E events, one B per frame of each sample) as the Trace
    Event Format's object form: complete (X) spans, a track named for each process and thread."""
    out: list[dict] = []
    open_at: dict[tuple, list[dict]] = {}
    names: dict[int, str] = {}
    for event in sorted(
        (e for e in events if isinstance(e, dict) and e.get("ph") in ("B", "E")), key=lambda e: e.get("ts", 0)
    ):
        key = (int(event.get("pid", 0)), int(event.get("tid", 0)))
        stack = open_at.setdefault(key, [])
        if event["ph"] == "B":
            stack.append(event)
            if not stack[:-1] and str(event.get("name", "")).startswith("process "):
                names.setdefault(key[0], str(event["name"]))
        elif stack:
            begun = stack.pop()
            out.append(
                {
                    "ph": "X",
                    "name": str(begun.get("name", "?")),
                    "cat": "profile",
                    "pid": key[0],
                    "tid": key[1],
                    "ts": begun.get("ts", 0),
                    "dur": max(float(event.get("ts", 0)) - float(begun.get("ts", 0)), 0.0),
                    "args": begun.get("args") or {},
                }
            )
    meta = [
        {"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"rank {rank} · {n}" if p == pid else n}}
        for p, n in names.items()
    ]
    meta += [
        {"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": f"thread {t:#x}"}}
        for p, t in sorted(open_at)
    ]
    return {
        "traceEvents": meta + out,
        "displayTimeUnit": "ms",
        "otherData": {"tool": "py-spy", "rank": rank, "pid": pid},
    }


def profiles(run_dir: Path) -> list[Path]:
    """The profiles kept in a run, oldest first."""
    folder = Path(run_dir) / "profiles"
    found = [p for p in folder.glob("rank-*.json") if p.is_file()] if folder.is_dir() else []
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))
