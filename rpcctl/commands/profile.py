"""``rpcctl profile [RUN] --rank R --seconds S -o FILE``: a sampling profile of a live rank and
every process under it, read from outside (py-spy), with no change to the script: speedscope
JSON (speedscope.app) or a Chrome trace (ui.perfetto.dev). The run keeps a copy
(``profiles/``, ``rpcctl.inspect.profiles``) that ``report`` and ``web`` draw as a flame graph."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import RunArgument, RunsDirOption, check_output, output_option, write_output
from rpcctl.console import get_console, human_bytes
from rpcctl.base.errors import UsageError
from rpcctl.base.states import RunStatus
from rpcctl.inspect.profiles import SUFFIX, take_profile
from rpcctl.records.runs import load_record, resolve_run


def profile(
    run: RunArgument = None,
    rank: Annotated[
        int,
        typer.Option("--rank", min=0, help="The rank to profile (with every process under it).", show_default=False),
    ] = 0,
    seconds: Annotated[
        float, typer.Option("--seconds", help="How long to sample (default: 10).", show_default=False)
    ] = 10.0,
    output: Annotated[
        Optional[Path],
        output_option("Where to write it (default: RUN_ID-rank-R.speedscope.json, or .trace.json, here)."),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="speedscope (speedscope.app) or chrome (a trace for ui.perfetto.dev); default: speedscope.",
            show_default=False,
        ),
    ] = "speedscope",
    rate: Annotated[int, typer.Option("--rate", help="Samples a second (default: 100).", show_default=False)] = 100,
    native: Annotated[
        bool, typer.Option("--native", help="Native frames too (pauses each process while a sample is read).")
    ] = False,
    runs_dir: RunsDirOption = None,
) -> None:
    """Profile a live rank and its processes for --seconds, from outside (py-spy): a flame graph
    of where it spends its time, with no change to the script. `report` and `web` draw it."""
    if fmt not in SUFFIX:
        raise UsageError(f"--format {fmt}: one of {', '.join(SUFFIX)}")
    if output is not None:
        check_output(output, "--output")  # a target it cannot write is said first, whatever the run
    run_dir = resolve_run(run, runs_dir)
    record = load_record(run_dir)
    if record.effective_status != RunStatus.RUNNING:
        raise UsageError(
            f"run {record.run_id} is not running (status: {record.effective_status}): no live rank to profile"
        )
    if output is None:
        output = Path(f"{record.run_id}-rank-{rank}{SUFFIX[fmt]}")
        check_output(output, "--output")  # before the seconds of sampling
    console = get_console()
    console.info(f"rpcctl: profiling rank {rank} of {record.run_id} for {seconds:g} s")
    taken = take_profile(run_dir, rank, seconds, fmt, rate, native)
    data = taken.path.read_bytes()
    write_output(output, data, "--output")
    samples = f"{taken.samples} samples, " if taken.samples is not None else ""
    console.info(
        f"rpcctl: wrote {output} ({samples}{human_bytes(len(data))}; the run keeps it for `rpcctl report`: "
        f"{taken.path.name})"
    )
