"""``rpcctl trace [RUN] -o trace.json``: the run as Chrome trace-event JSON (``rpcctl.views.trace``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import RunArgument, RunsDirOption, check_output, output_option, write_output
from rpcctl.console import get_console, human_bytes
from rpcctl.base.errors import UsageError
from rpcctl.records.runs import resolve_run


def trace(
    run: RunArgument = None,
    output: Annotated[
        Optional[Path], output_option("Where to write it ('-': stdout; default: RUN_ID.trace.json here).")
    ] = None,
    max_events: Annotated[
        int,
        typer.Option(
            "--max-events",
            min=0,
            show_default=False,
            help="About how many events at most (default: 100,000, about 10 MB): the counters (losses, metrics) are "
            "thinned evenly to fit; 0 keeps every event of every kind (the file can be hundreds of MB).",
        ),
    ] = 100_000,
    runs_dir: RunsDirOption = None,
) -> None:
    """Write the run as a Chrome trace (open it in ui.perfetto.dev or chrome://tracing).

    One track per rank and per process a rank spawned: calls of 1 s or more as spans with
    flow arrows to what the callee ran for them, RRef lifetimes, losses as counters, exits and
    restarts as instants. Bounded size (--max-events: about 10 MB by default) however long the
    run and however many metrics it reports.
    """
    from rpcctl import inspect
    from rpcctl.views.trace import build_trace

    run_dir = resolve_run(run, runs_dir)
    if not inspect.has_telemetry(run_dir):
        raise UsageError(f"run {run_dir.name} has no telemetry store: nothing to trace")
    path = None if output is not None and str(output) == "-" else output or Path(f"{run_dir.name}.trace.json")
    if path is not None:
        check_output(path, "--output")  # before the work: /dev/null, a FIFO, a link or a full disk is refused at once
    document = build_trace(run_dir, max_events)
    text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    if path is None:
        get_console().raw(text + "\n")
        return
    write_output(path, text, "--output")  # 0600, as the report; an old file is replaced, never re-moded
    get_console().note(
        f"wrote {path} ({len(document['traceEvents'])} events, {human_bytes(len(text))}): open it in ui.perfetto.dev or chrome://tracing"
    )
