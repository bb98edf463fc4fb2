"""``rpcctl trace [RUN] -o trace.json``: the run as Chrome trace-event JSON (``rpcctl.trace``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import RunArgument, RunsDirOption
from rpcctl.console import get_console, human_bytes
from rpcctl.errors import UsageError
from rpcctl.private import refuse_non_regular, write_private_atomic
from rpcctl.runs import resolve_run


def trace(
    run: RunArgument = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Where to write it ('-': stdout; default: RUN_ID.trace.json here).", show_default=False)] = None,
    runs_dir: RunsDirOption = None,
) -> None:
    """Write the run as a Chrome trace (open it in ui.perfetto.dev or chrome://tracing).

    One track per rank and per process a rank spawned: calls of 1 s or more as spans with
    flow arrows to what the callee ran for them, RRef lifetimes, losses as counters, exits and
    restarts as instants. Bounded size (about 10 MB at most) however long the run.
    """
    from rpcctl import inspect
    from rpcctl.trace import build_trace

    run_dir = resolve_run(run, runs_dir)
    if not inspect.has_telemetry(run_dir):
        raise UsageError(f"run {run_dir.name} has no telemetry store: nothing to trace")
    path = None if output is not None and str(output) == "-" else output or Path(f"{run_dir.name}.trace.json")
    if path is not None:
        _writable(path, refuse_non_regular)  # before the work: /dev/null or a link is refused at once
    document = build_trace(run_dir)
    text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    if path is None:
        get_console().raw(text + "\n")
        return
    _writable(path, lambda p: write_private_atomic(p, text))  # 0600, as the report; an old file is replaced, never re-moded
    get_console().note(f"wrote {path} ({len(document['traceEvents'])} events, {human_bytes(len(text))}): open it in ui.perfetto.dev or chrome://tracing")


def _writable(path: Path, write) -> None:
    try:
        write(path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
