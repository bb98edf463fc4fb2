"""``rpcctl inspect rrefs|workers|gpus|losses`` and ``rpcctl stack``: views over a run's telemetry.

Each view: a table for people (``--wide`` adds the detail columns), ``--json`` for programs (one
document, raw units, ``[]`` when empty), ``--watch`` to refresh until the run ends. The data comes
from ``rpcctl.inspect``; this module only parses flags and renders.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from rpcctl import inspect as sdk
from rpcctl.commands.common import JsonOption, RunArgument, RunsDirOption, WatchOption
from rpcctl.console import get_console, render_table
from rpcctl.errors import RunNotFoundError, UsageError
from rpcctl.runs import TERMINAL, load_record, resolve_run

inspect_app = typer.Typer(
    help="Look inside a run, live or after it ended: RRefs, workers, devices, losses.",
    no_args_is_help=True,
)

WideOption = Annotated[bool, typer.Option("--wide", help="Show every column.")]


def _run_dir(run: str | None, runs_dir: Path | None) -> Path:
    run_dir = resolve_run(run, runs_dir)
    if not sdk.has_telemetry(run_dir):
        get_console().warn(f"run {run_dir.name} has no telemetry store (launched without telemetry, or by an older rpcctl)")
    return run_dir


def _show(run_dir: Path, render: Callable[[], Any], watch: bool) -> None:
    console = get_console()
    if not watch:
        console.print(render())
        return
    from rich.live import Live

    try:
        with Live(render(), console=console.out, auto_refresh=False) as live:
            while not _finished(run_dir):
                time.sleep(1.0)
                live.update(render(), refresh=True)
            live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass


def _finished(run_dir: Path) -> bool:
    try:
        return load_record(run_dir).effective_status in TERMINAL
    except RunNotFoundError:
        return True


def _view(run: str | None, runs_dir: Path | None, json_: bool, watch: bool,
          records: Callable[[Path], list[Any]], render: Callable[[list[Any], Path], Any]) -> None:
    """The shape of a plain view: records from the SDK, as JSON or rendered (and refreshed)."""
    _no_json_watch(json_, watch)
    run_dir = _run_dir(run, runs_dir)
    if json_:
        get_console().json(records(run_dir))
        return
    _show(run_dir, lambda: render(records(run_dir), run_dir), watch)


def _no_json_watch(json_: bool, watch: bool) -> None:
    if json_ and watch:
        raise UsageError("--json and --watch cannot be combined: poll with --json instead")


# ---------------------------------------------------------------------------------------------


@inspect_app.command("rrefs")
def rrefs(
    run: RunArgument = None,
    owner: Annotated[Optional[str], typer.Option("--owner", help="Only RRefs owned by this worker (name or rank).", show_default=False)] = None,
    state: Annotated[Optional[str], typer.Option("--state", help="Only RRefs in this state: pending, live or deleted.", show_default=False)] = None,
    summary: Annotated[bool, typer.Option("--summary", help="Only the per-owner summary (count, bytes).")] = False,
    wide: WideOption = False,
    runs_dir: RunsDirOption = None,
    json_: JsonOption = False,
    watch: WatchOption = False,
) -> None:
    """Who owns which RRef, who holds references to it, and what it is (type, shape, bytes).

    One row per RRef (not per fork), then a summary per owner. RRefs that lived less than
    0.2 s are not listed: the summary counts them as SHORT-LIVED.
    """
    _no_json_watch(json_, watch)
    if state is not None and state not in sdk.RREF_STATES:
        raise UsageError(f"--state {state}: choose from {', '.join(sdk.RREF_STATES)}")
    run_dir = _run_dir(run, runs_dir)
    if json_:
        records = sdk.rrefs(run_dir, owner=owner, state=state)
        get_console().json(sdk.rref_owners(run_dir, records=records) if summary else records)
        return

    def render() -> Any:
        records = sdk.rrefs(run_dir, owner=owner, state=state)
        owners = sdk.rref_owners(run_dir, records=records) if owner is None and state is None else _owners_of(run_dir, records)
        owners_table = render_table(owners, sdk.OwnerSummary.COLUMNS, title="RRefs by owner", empty="no RRefs")
        if summary:
            return owners_table
        table = render_table(records, sdk.RRefRecord.COLUMNS, detail=wide, empty=_empty_rrefs(owner, state))
        return Group(table, "", owners_table) if owners else table

    _show(run_dir, render, watch)


def _owners_of(run_dir: Path, records: list[sdk.RRefRecord]) -> list[sdk.OwnerSummary]:
    owners = {r.owner for r in records}
    return [o for o in sdk.rref_owners(run_dir, records=records) if o.owner in owners]


def _empty_rrefs(owner: str | None, state: str | None) -> str:
    which = " ".join(filter(None, [state, f"owned by {owner}" if owner else None]))
    return f"no {which} RRefs" if which else "no RRefs (none created, or all lived < 0.2 s)"


@inspect_app.command("workers")
def workers(
    run: RunArgument = None,
    wide: WideOption = False,
    runs_dir: RunsDirOption = None,
    json_: JsonOption = False,
    watch: WatchOption = False,
) -> None:
    """Every rank and the processes it spawned: pid, state, CPU, memory, device, heartbeat.

    A running rank whose heartbeat is older than 5 s is flagged STALE (hung, or stopped).
    Below the table: the CPU time rpcctl's own telemetry used, and its share of the job's.
    """

    def render(records: list[sdk.WorkerRecord], run_dir: Path) -> Any:
        table = render_table(records, sdk.WorkerRecord.COLUMNS, detail=wide, empty="no workers yet")
        lines = [f"[yellow]STALE:[/yellow] rank {w.rank} (pid {w.pid}) no heartbeat for {w.heartbeat_age_s:.0f} s — try `rpcctl stack --rank {w.rank}`"
                 for w in records if w.stale]
        cost = sdk.telemetry_cost(run_dir) if records else None
        if cost is not None:
            lines.append(Text(cost.describe(), style="dim"))
        return Group(table, "", *lines) if lines else table

    _view(run, runs_dir, json_, watch, sdk.workers, render)


@inspect_app.command("gpus")
def gpus(
    run: RunArgument = None,
    wide: WideOption = False,
    runs_dir: RunsDirOption = None,
    json_: JsonOption = False,
    watch: WatchOption = False,
) -> None:
    """Per device: the ranks placed on it, memory used/total, and bytes of RRef values on it."""

    def render(records: list[sdk.DeviceRecord], _run_dir: Path) -> Any:
        table = render_table(records, sdk.DeviceRecord.COLUMNS, detail=wide, empty="no placement recorded yet")
        if records and all(r.device == "cpu" for r in records):
            return Group("No GPU in this run: every rank ran on the CPU.", "", table)
        return table

    _view(run, runs_dir, json_, watch, sdk.gpus, render)


@inspect_app.command("losses")
def losses(
    run: RunArgument = None,
    rank: Annotated[Optional[int], typer.Option("--rank", "-r", help="Only this rank.", show_default=False)] = None,
    last: Annotated[int, typer.Option("--last", help="Steps shown in the steps × ranks table.")] = 10,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also write a loss chart to this PNG file (needs matplotlib).", show_default=False)] = None,
    runs_dir: RunsDirOption = None,
    json_: JsonOption = False,
    watch: WatchOption = False,
) -> None:
    """Loss per rank and step: the last steps × ranks, then min/last and a trend per rank.

    Losses come from rpcctl.report() and from the ranks' printed output (`step 3 loss 0.52`,
    `loss=0.52`, `Epoch 3: 0.52`, or the config's losses.pattern).
    """
    _no_json_watch(json_, watch)
    if last < 1:
        raise UsageError("--last must be at least 1")
    run_dir = _run_dir(run, runs_dir)
    if plot is not None:
        sdk.plot_losses(sdk.losses(run_dir, rank=rank), plot, title=run_dir.name)
        get_console().note(f"wrote {plot}")
    if json_:
        get_console().json(sdk.losses(run_dir, rank=rank))
        return

    def render() -> Any:
        records = sdk.losses(run_dir, rank=rank)
        if not records:
            return "no losses yet (print them, e.g. `step 3 loss 0.52`, or call rpcctl.report(step=..., loss=...))"
        steps, ranks, cells = sdk.loss_grid(records, last)
        grid = Table(title=f"Last {len(steps)} steps", title_justify="left", header_style="bold", box=None, pad_edge=False)
        grid.add_column("STEP", justify="right", no_wrap=True)
        for r in ranks:
            grid.add_column(f"RANK {r}", justify="right", no_wrap=True)
        for step in steps:
            grid.add_row(str(step), *(_loss_cell(cells, step, r) for r in ranks))
        summary = render_table(sdk.loss_summaries(records), sdk.LossSummary.COLUMNS, title="Per rank")
        return Group(grid, "", summary)

    _show(run_dir, render, watch)


def _loss_cell(cells: dict[tuple[int, int], float | None], step: int, rank: int) -> str:
    if (step, rank) not in cells:
        return ""
    value = cells[(step, rank)]
    return "nan" if value is None else f"{value:.6g}"


# ---------------------------------------------------------------------------------------------


def stack(
    run: RunArgument = None,
    rank: Annotated[Optional[list[int]], typer.Option("--rank", "-r", help="Rank to dump; repeatable (default: every running rank).", show_default=False)] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each rank's dump.")] = 5.0,
    runs_dir: RunsDirOption = None,
) -> None:
    """Dump the Python stacks of a live rank's threads (SIGUSR1 → faulthandler): for hung jobs.

    Python processes a rank started itself (mp.spawn, subprocess) are dumped after it.
    """
    console = get_console()
    run_dir = resolve_run(run, runs_dir)
    record = load_record(run_dir)
    if record.effective_status != "running":
        raise UsageError(f"run {record.run_id} is not running (status: {record.effective_status}): no live rank to dump")
    ranks = rank if rank else [r.rank for r in record.ranks if r.state == "running"]
    if not ranks:
        raise UsageError(f"run {record.run_id} has no running rank")
    first = True
    for r in ranks:
        for dump in sdk.dump_stacks(run_dir, r, timeout=timeout):
            if not first:
                console.raw("\n")
            first = False
            if dump.kind == "rank":
                console.raw(f"── rank {r} (pid {dump.pid}) ──\n{dump.text}")
            else:
                # A process the rank started itself (mp.spawn, subprocess): often where a hang is.
                started = shlex.join(dump.cmdline)
                text = dump.text if dump.text is not None else f"(wrote no stack within {timeout:g} s)\n"
                console.raw(f"── rank {r} › pid {dump.pid}: {started} ──\n{text}")
