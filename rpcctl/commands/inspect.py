"""``rpcctl inspect VIEW`` and ``rpcctl stack``: views over a run's telemetry.

Each view: a table for people (``--wide`` adds the detail columns), ``--json`` for programs (one
document, raw units, ``[]`` when empty), ``--watch`` to refresh until the run ends. The data comes
from ``rpcctl.inspect``; this module only parses flags and renders.

The views are the SDK's one list, ``rpcctl.inspect.VIEWS`` (a name, the record type, whose
``COLUMNS`` make the table, the JSON keys and the ``--filter`` keys, and the reader): every entry
is a command, under its name (``command``: the word users know, ``gpus`` for placement). What
this module adds to a view, by its name, is in ``SHOWN``: its help, how it renders, its own
options; a view with none is the table of its records and their ``--json``. The shared flags (RUN,
``--wide``, ``--runs-dir``, ``--json``, ``--watch``, ``--filter``) are declared once, in
``commands.common``, and every view's command is built from its entry (``_command``). Adding a
view: a record type, a reader and an entry in ``inspect.VIEWS``; an entry in ``SHOWN`` only to
draw it otherwise than as a table.
"""

from __future__ import annotations

import functools
import inspect as pyinspect
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Group
from rich.text import Text

from rpcctl import inspect as sdk
from rpcctl.launch.control import ended, follow
from rpcctl.commands import calls as calls_view
from rpcctl.commands import collectives as collectives_view
from rpcctl.commands.common import (
    Filter,
    FilterOption,
    JsonOption,
    RunArgument,
    RunsDirOption,
    WatchOption,
    WideOption,
    check_output,
    filtered_empty,
    keep,
    no_match,
    parse_filters,
    RankOption,
    rank_option,
    scalar_fields,
)
from rpcctl.console import KEY, Column, fmt_loss, get_console, render_table, sanitize
from rpcctl.base.errors import RpcctlError, RunNotFoundError, UsageError
from rpcctl.base.frames import hide_own_frames
from rpcctl.inspect.stacks import StoppedRankError, native_stacks_of, native_text
from rpcctl.base.native_stacks import TIMEOUT_S as NATIVE_TIMEOUT_S
from rpcctl.records.runs import load_record, resolve_run
from rpcctl.base.stacks import stopped_message
from rpcctl.base.states import RankStatus, RunStatus


def _run_dir(run: str | None, runs_dir: Path | None) -> Path:
    run_dir = resolve_run(run, runs_dir)
    if not sdk.has_telemetry(run_dir):
        get_console().warn(
            f"run {run_dir.name} has no telemetry store (launched without telemetry, or by an older rpcctl)"
        )
    return run_dir


def _show(run_dir: Path, render: Callable[[], Any], watch: bool) -> None:
    console = get_console()
    if not watch:
        console.print(render())
        return
    from rich.live import Live

    try:
        with Live(console=console.out, auto_refresh=False) as live:
            for _ in follow(run_dir, every=1.0):
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass


def none_yet(run_dir: Path, what: str) -> str:
    """An empty view's line: "no calls yet" while the run goes on, "no calls were recorded" once
    it ended (nothing more will come)."""
    return f"no {what} {'was' if what == 'placement' else 'were'} recorded" if ended(run_dir) else f"no {what} yet"


def _no_json_watch(json_: bool, watch: bool) -> None:
    if json_ and watch:
        raise UsageError("--json and --watch cannot be combined: poll with --json instead")


# -- the views ----------------------------------------------------------------------------------


RestartOption = Annotated[
    Optional[int],
    typer.Option(
        "--restart",
        metavar="N",
        show_default=False,
        help="Show attempt N: 0 is the first start of the ranks, N the one after the N-th restart (each round of an "
        "elastic job is an attempt of this node's ranks; another node's ranks count their own). Default: the latest.",
    ),
]


def _attempt(call: "Call") -> dict[str, int]:
    """The ``restart=`` to read with, checked against the attempts the run has (exit 2 past them)."""
    restart = call.options.get("restart")
    if restart is None:
        return {}
    latest = sdk.latest_attempt(call.run_dir)
    if not 0 <= restart <= latest:
        raise UsageError(
            f"--restart {restart}: run {call.run_dir.name} has attempt{'s 0-' + str(latest) if latest else ' 0 only'}"
        )
    return {"restart": restart}


@dataclass(frozen=True)
class ViewOption:
    """A view's own flag: the parameter's name, its ``Annotated[type, typer.Option(...)]``, its default."""

    name: str
    annotation: Any
    default: Any = None


@dataclass(frozen=True)
class Shown:
    """What the CLI adds to a view of ``inspect.VIEWS``. ``render(found, call)``: what the
    terminal shows (the JSON is ``found`` itself; default: the table of the record's columns).
    A view with a flow of its own (options that change what is read) gives ``run(call)`` instead.
    ``filters``: ``--filter`` over the record's columns and scalar fields."""

    help: str
    example: str
    render: Callable[[Any, Call], Any] | None = None
    run: Callable[[Call], None] | None = None
    options: tuple[ViewOption, ...] = ()
    filters: bool = False
    wide: bool = True


@dataclass(frozen=True)
class View:
    """One ``rpcctl inspect`` command: the SDK's view (``name`` its command word, ``record``,
    ``read``) with what the CLI adds (``Shown``)."""

    name: str
    record: type
    read: Callable[[Path], Any]
    shown: Shown

    @property
    def render(self) -> Callable[[Any, Call], Any]:
        return self.shown.render or _render_table


@dataclass
class Call:
    """One invocation of a view: the shared flags, the view's own (``options``), the filters."""

    view: View
    run: str | None
    runs_dir: Path | None
    json: bool
    watch: bool
    wide: bool = False
    filters: list[Filter] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def run_dir(self) -> Path:
        return _run_dir(self.run, self.runs_dir)

    def show(self, render: Callable[[], Any]) -> None:
        _show(self.run_dir, render, self.watch)


def _plain(call: Call) -> None:
    """A view that reads and renders: records from the SDK (filtered), as JSON or rendered (and refreshed)."""
    view = call.view

    attempt = _attempt(call)

    def found() -> Any:
        records = view.read(call.run_dir, **attempt)
        return keep(records, call.filters) if view.shown.filters else records

    if call.json:
        get_console().json(found())
        return
    call.show(lambda: view.render(found(), call))


def _command(view: View) -> Callable[..., None]:
    """The typer command of a view: RUN, the view's options, then the shared flags."""

    def command(**given: Any) -> None:
        filters = given.pop("filter_", None)
        call = Call(
            view,
            given.pop("run"),
            given.pop("runs_dir"),
            given.pop("json_"),
            given.pop("watch"),
            given.pop("wide", False),
            options=given,
        )
        _no_json_watch(call.json, call.watch)
        if view.shown.filters:
            call.filters = parse_filters(filters, view.record.COLUMNS, scalar_fields(view.record))
        (view.shown.run or _plain)(call)

    keyword = pyinspect.Parameter.KEYWORD_ONLY
    params = [pyinspect.Parameter("run", keyword, default=None, annotation=RunArgument)]
    params += [
        pyinspect.Parameter(o.name, keyword, default=o.default, annotation=o.annotation) for o in view.shown.options
    ]
    shared = ([("wide", WideOption)] if view.shown.wide else []) + [
        ("runs_dir", RunsDirOption),
        ("json_", JsonOption),
        ("watch", WatchOption),
    ]
    shared += [("filter_", FilterOption)] if view.shown.filters else []
    params += [
        pyinspect.Parameter(
            name, keyword, default=None if name == "filter_" or name == "runs_dir" else False, annotation=annotation
        )
        for name, annotation in shared
    ]
    command.__signature__ = pyinspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = command.__qualname__ = view.name
    command.__doc__ = view.shown.help
    return command


def _render_table(found: Any, call: Call) -> Any:
    """A view the CLI adds nothing to: its records (or its one report) as the table of its columns."""
    records = found if isinstance(found, list) else [found]
    return render_table(
        records, call.view.record.COLUMNS, detail=call.wide, empty=none_yet(call.run_dir, call.view.name)
    )


# -- rrefs ----------------------------------------------------------------------------------------


def _rrefs(call: Call) -> None:
    owner, state, summary = call.options["owner"], call.options["state"], call.options["summary"]
    if state is not None and state not in sdk.RREF_STATES + sdk.RREF_ENDINGS:
        raise UsageError(f"--state {state}: choose from {', '.join(sdk.RREF_STATES + sdk.RREF_ENDINGS)}")
    run_dir, attempt = call.run_dir, _attempt(call)
    if call.json:
        records = sdk.rrefs(run_dir, owner=owner, state=state, **attempt)
        get_console().json(sdk.rref_owners(run_dir, records=records, **attempt) if summary else records)
        return

    def render() -> Any:
        records = sdk.rrefs(run_dir, owner=owner, state=state, **attempt)
        owners = (
            sdk.rref_owners(run_dir, records=records, **attempt)
            if owner is None and state is None
            else _owners_of(run_dir, records, **attempt)
        )
        owners_table = render_table(
            owners, sdk.OwnerSummary.COLUMNS, title="RRefs by owner", empty=_empty_rrefs(owner, state)
        )
        if summary:
            return owners_table
        table = render_table(records, sdk.RRefRecord.COLUMNS, detail=call.wide, empty=_empty_rrefs(owner, state))
        shown = Group(table, "", owners_table) if owners else table
        shared = [Text(w.describe()) for w in sdk.shared_worlds(run_dir)]  # names and ids are text, never markup
        return Group(shown, "", *shared) if shared else shown

    call.show(render)


def _owners_of(run_dir: Path, records: list[sdk.RRefRecord], **attempt: int) -> list[sdk.OwnerSummary]:
    owners = {r.owner for r in records}
    return [o for o in sdk.rref_owners(run_dir, records=records, **attempt) if o.owner in owners]


def _empty_rrefs(owner: str | None, state: str | None) -> str:
    return no_match("RRefs", owner=owner, state=state) or "no RRefs (none created, or all short-lived)"


# -- workers, gpus ------------------------------------------------------------------------------


def _render_workers(records: list[sdk.WorkerRecord], call: Call) -> Any:
    run_dir = call.run_dir
    table = render_table(
        records,
        sdk.WorkerRecord.COLUMNS,
        detail=call.wide,
        empty=filtered_empty("workers", call.filters) or none_yet(run_dir, "workers"),
    )
    lines = [
        f"[yellow]STALE:[/yellow] rank {w.rank} (pid {w.pid}) no heartbeat for {w.heartbeat_age_s:.0f} s — "
        f"try `rpcctl stack --rank {w.rank}`"
        for w in records
        if w.stale
    ]
    lines += [
        Text.assemble(("STOPPED: ", "yellow"), stopped_message(f"rank {w.rank}", w.pid))
        for w in records
        if w.state == RankStatus.STOPPED
    ]
    lines += [Text.assemble(("STRAGGLER: ", "yellow"), sanitize(w.straggler)) for w in records if w.straggler]
    if any(w.state in (RankStatus.LOST, RankStatus.ORPHANED) for w in records):
        lines.insert(0, Text.assemble(("LOST: ", "red"), f"run {load_record(run_dir).run_id}: {_lost_story(run_dir)}"))
    cost = sdk.telemetry_cost(run_dir) if records else None
    if cost is not None:
        lines.append(Text(cost.describe(), style="dim"))
    rounds = load_record(run_dir).rounds  # an elastic job (issue 43): the round these ranks are in
    if rounds and isinstance(rounds[-1], dict):
        last = rounds[-1]
        lines.insert(
            0,
            Text.assemble(
                ("ROUND: ", "cyan"),
                sanitize(
                    f"{last.get('round')} ({last.get('nnodes')} node(s), world size {last.get('world_size')}), since "
                    f"{last.get('at')}: {last.get('why')}"
                ),
            ),
        )
    return Group(table, "", *lines) if lines else table


def _lost_story(run_dir: Path) -> str:
    """What became of a run whose launcher died, as `runs`, `stack` and `stop` say it."""
    from rpcctl.launch.control import lost_runs

    record = load_record(run_dir)
    lost = lost_runs([record]).get(record.run_id)
    return lost.story() if lost is not None else f"status {record.effective_status}"


def _render_gpus(records: list[sdk.PlacementRecord], call: Call) -> Any:
    table = render_table(
        records, sdk.PlacementRecord.COLUMNS, detail=call.wide, empty=none_yet(call.run_dir, "placement")
    )
    if records and all(r.device == "cpu" for r in records):
        return Group("No GPU in this run: every rank ran on the CPU.", "", table)
    return table


# -- losses -------------------------------------------------------------------------------------


def _losses(call: Call) -> None:
    o = call.options
    ranks, last, metric, plot, summary = o["rank"], o["last"], o["metric"], o["plot"], o["summary"]
    if o["explain"]:
        _explain_lines(o["explain"], call.json)
        return
    if last < 1:
        raise UsageError("--last must be at least 1")
    run_dir = call.run_dir
    for rank in ranks or ():
        _check_rank(run_dir, rank)

    def records() -> list[sdk.LossRecord]:
        found = [r for r in sdk.losses(run_dir) if not ranks or r.rank in ranks]
        if metric is not None and found and not sdk.with_metric(found, metric):
            names = ", ".join(sdk.metric_names(found)) or "none"
            raise UsageError(f"--metric {metric}: no record of run {run_dir.name} has it (metrics: {names})")
        return found

    if plot is not None:
        check_output(plot, "--plot")  # a device, a FIFO, a link or a full disk: refused before drawing
        sdk.plot_losses(records(), plot, title=_plot_title(run_dir, ranks), metric=metric, log_scale=o["log_scale"])
        get_console().note(f"wrote {plot}")
    if call.json:
        found = records()
        get_console().json(sdk.loss_summaries(found, sdk.line_counts(run_dir)) if summary else found)
        return

    def render() -> Any:
        found = records()
        counts = sdk.line_counts(run_dir)
        if ranks:
            counts = {r: n for r, n in counts.items() if r in ranks}
        if not found:
            matched = f" ({sum(n for n, _ in counts.values())} printed lines read, none matched)" if counts else ""
            if ranks:
                return no_match("losses", rank=", ".join(map(str, ranks))) + matched
            return (
                f"{none_yet(run_dir, 'losses')}{matched}: print them (e.g. `step 3 loss 0.52`), call "
                "rpcctl.report(step=..., loss=...), or check a line with `rpcctl inspect losses --explain 'LINE'`"
            )
        shown = sdk.with_metric(found, metric)
        table = render_table(
            sdk.loss_summaries(shown, counts), sdk.LossSummary.COLUMNS, title=f"Per rank ({metric or 'loss'})"
        )
        if summary:
            return table
        return Group(_loss_grid(sdk.loss_grid(shown, last), metric), "", table)

    call.show(render)


# What the CLI adds to the SDK's views (inspect.VIEWS), by the view's name.
SHOWN: dict[str, Shown] = {
    "rrefs": Shown(
        run=_rrefs,
        example="rpcctl inspect rrefs --owner worker1 --state live --wide",
        help="""Who owns which RRef, who holds references to it, and what it is (type, shape, bytes).

    One row per RRef (not per fork), then a summary per owner. RRefs dropped before rpcctl's
    next look (every 0.1 s; most that lived under 0.2 s) are not listed: the summary counts them
    as SHORT-LIVED.
    """,
        options=(
            ViewOption(
                "owner",
                Annotated[
                    Optional[str],
                    typer.Option("--owner", help="Only RRefs owned by this worker (name or rank).", show_default=False),
                ],
            ),
            ViewOption(
                "state",
                Annotated[
                    Optional[str],
                    typer.Option(
                        "--state",
                        help="Only RRefs in this state: pending, live or deleted; or that ended so: at-shutdown "
                        "(released by rpc.shutdown, normal), at-exit (held by a process that ended without "
                        "rpc.shutdown), held-unused (held to rpc.shutdown but unused long before it) or leaked.",
                        show_default=False,
                    ),
                ],
            ),
            ViewOption(
                "summary",
                Annotated[bool, typer.Option("--summary", help="Only the per-owner summary (count, bytes).")],
                False,
            ),
            ViewOption("restart", RestartOption),
        ),
    ),
    "workers": Shown(
        render=_render_workers,
        filters=True,
        example="rpcctl inspect workers --watch",
        help="""Every rank and the processes it spawned: pid, state, CPU, memory, device, heartbeat.

    A running rank whose heartbeat is older than 5 s is flagged STALE (hung, or stopped); a rank
    whose step rate, call latency or arrival into collectives is far off the others' is flagged
    STRAGGLER, with the figures.
    Below the table: the CPU time rpcctl's own telemetry used, and its share of the job's.
    """,
    ),
    "placement": Shown(
        render=_render_gpus,
        example="rpcctl inspect gpus --json",
        help="Per device: the ranks placed on it, memory used/total, and bytes of RRef values on it.",
    ),
    "losses": Shown(
        run=_losses,
        wide=False,
        example="rpcctl inspect losses --metric acc --plot acc.png --log; "
        "rpcctl inspect losses --explain 'epoch 2 step 10 loss=0.52'",
        help="""Loss per rank and step: the last steps × ranks, then min/last and a trend per rank.

    Losses come from rpcctl.report() and from the ranks' printed output: `step 3 loss 0.52`,
    `epoch 2 step 10 loss=0.5 acc=0.9`, JSON or Python dict lines (Hugging Face Trainer), tqdm,
    Lightning and Keras progress bars, or the config's losses.pattern. Records are keyed by
    (epoch, step), or by arrival order (#n) where steps repeat or are not printed.
    """,
        options=(
            ViewOption("rank", RankOption),
            ViewOption(
                "last",
                Annotated[
                    int,
                    typer.Option(
                        "--last", help="Steps shown in the steps × ranks table (default: 10).", show_default=False
                    ),
                ],
                10,
            ),
            ViewOption(
                "metric",
                Annotated[
                    Optional[str],
                    typer.Option(
                        "--metric",
                        "-m",
                        help="Show this metric (acc, lr, grad_norm, ...) instead of the loss.",
                        show_default=False,
                    ),
                ],
            ),
            ViewOption(
                "plot",
                Annotated[
                    Optional[Path],
                    typer.Option(
                        "--plot", help="Also write a chart to this PNG file (needs matplotlib).", show_default=False
                    ),
                ],
            ),
            ViewOption(
                "log_scale",
                Annotated[bool, typer.Option("--log", help="Log scale for the --plot chart's values.")],
                False,
            ),
            ViewOption(
                "summary",
                Annotated[
                    bool,
                    typer.Option("--summary", help="Only the per-rank summary (with the printed lines that matched)."),
                ],
                False,
            ),
            ViewOption(
                "explain",
                Annotated[
                    Optional[list[str]],
                    typer.Option(
                        "--explain",
                        help="Say what this printed LINE yields and why (repeatable: lines in order); reads no run.",
                        show_default=False,
                    ),
                ],
            ),
        ),
    ),
    "calls": Shown(
        example="rpcctl inspect calls --watch",
        render=lambda report, call: calls_view.render(report, call.wide, none_yet(call.run_dir, "calls")),
        help=calls_view.HELP,
        options=(ViewOption("restart", RestartOption),),
    ),
    "collectives": Shown(
        example="rpcctl inspect collectives --watch",
        render=lambda report, call: collectives_view.render(report, call.wide, none_yet(call.run_dir, "collectives")),
        help=collectives_view.HELP,
        options=(ViewOption("restart", RestartOption),),
    ),
}


def _shown(view: sdk.View) -> Shown:
    return SHOWN.get(view.name) or Shown(
        help=f"{view.title}: one row per record (--wide: every column).", example=f"rpcctl inspect {view.word} --json"
    )


def views() -> list[View]:
    """Every command of ``rpcctl inspect``: each view of ``inspect.VIEWS``, under its word."""
    order = list(SHOWN)  # the order `rpcctl inspect --help` has always listed them in, then any other
    ordered = sorted(sdk.VIEWS, key=lambda v: order.index(v.name) if v.name in order else len(order))
    return [View(v.word, v.record, v.read, _shown(v)) for v in ordered]


def build_app() -> typer.Typer:
    """``rpcctl inspect``: a command per view of ``inspect.VIEWS`` as it is now."""
    app = typer.Typer(
        add_completion=False,  # a sub-app (rpcctl.cli builds it on its own when it is called)
        help="Look inside a run, live or after it ended: " + ", ".join(v.name for v in views()) + ".",
        epilog="Example: rpcctl inspect rrefs (the latest run), rpcctl inspect workers RUN --wide",
        rich_markup_mode=None,
        no_args_is_help=True,
    )
    for view in views():
        app.command(view.name, epilog=f"Example: {view.shown.example}")(_command(view))
    return app


def __getattr__(name: str) -> Any:
    """``inspect_app`` (what ``rpcctl.cli`` loads): built from ``inspect.VIEWS`` when it is asked for."""
    if name == "inspect_app":
        return build_app()
    raise AttributeError(name)


def _check_rank(run_dir: Path, rank: int) -> None:
    """A rank the run does not have is a usage error, as in ``logs`` and ``stack``."""
    try:
        ranks = load_record(run_dir).world_size
    except (RunNotFoundError, OSError, ValueError):
        return
    if not 0 <= rank < ranks:
        raise UsageError(f"--rank {rank}: run {run_dir.name} has ranks 0-{ranks - 1}")


def _loss_grid(grid: sdk.LossGrid, metric: str | None) -> Any:
    """The last steps × ranks, through render_table: the step columns are keys; on a narrow
    terminal the rightmost ranks are hidden first (and named)."""
    by_arrival = grid.keyed_by == sdk.BY_ARRIVAL
    title = (
        f"Last {len(grid.rows)} "
        f"{'records, in arrival order (steps repeat or are not printed)' if by_arrival else 'steps'}"
    )
    labels = [("seq", "#")] if by_arrival else ([("epoch", "EPOCH")] if grid.has_epochs else []) + [("step", "STEP")]
    columns = [Column(key, header, justify="right", priority=KEY) for key, header in labels]
    columns += [Column(f"rank{r}", f"RANK {r}", justify="right") for r in grid.ranks]
    rows = []
    for key in grid.rows:
        epoch, step = grid.labels[key]
        row = {"seq": str(key[0] + 1)} if by_arrival else {"epoch": _dash(epoch), "step": _dash(step)}
        row.update({f"rank{r}": _loss_cell(grid.cells, key, r) for r in grid.ranks})
        rows.append(row)
    return render_table(rows, columns, title=title + (f": {metric}" if metric else ""), hint="--rank N shows one rank")


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _loss_cell(cells: dict, key: tuple[int, ...], rank: int) -> str:
    if (key, rank) not in cells:
        return ""
    value = cells[(key, rank)]
    return "nan" if value is None else fmt_loss(value)


def _plot_title(run_dir: Path, ranks: list[int] | None) -> str:
    try:
        name = load_record(run_dir).name
    except (RunNotFoundError, OSError, ValueError):
        name = None
    title = f"{name}  ({run_dir.name})" if name else run_dir.name
    return title + (f", rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else "")


def _explain_lines(lines: list[str], json_: bool) -> None:
    from rpcctl.telemetry.losses import LossParser

    parser = LossParser()  # one rank's parser: an epoch header applies to the lines after it
    explained = [parser.explain(line) for line in lines]
    rows = [
        {
            "line": e.line,
            "rule": e.rule,
            "matched": e.parsed is not None,
            "loss": e.parsed.loss if e.parsed else None,
            "epoch": e.parsed.epoch if e.parsed else e.epoch_context,
            "step": e.parsed.step if e.parsed else None,
            "metrics": e.parsed.metrics if e.parsed else {},
            "why": e.reason,
        }
        for e in explained
    ]
    if json_:
        get_console().json(rows)
        return
    console = get_console()
    for row in rows:
        console.print(Text(f"line: {row['line']}"))
        if row["matched"]:
            fields = [f"loss {row['loss']:.6g}"] + [f"{k} {row[k]}" for k in ("epoch", "step") if row[k] is not None]
            fields += [f"{k} {v:.6g}" for k, v in row["metrics"].items()]
            console.print(Text(f"  yields: {', '.join(fields)}  (rule: {row['rule']})"))
        else:
            decided = f" (rule: {row['rule']})" if row["rule"] else ""
            console.print(Text(f"  yields: nothing{decided}"))
        console.print(Text(f"  why: {row['why']}"))


# ---------------------------------------------------------------------------------------------


def stack(
    run: RunArgument = None,
    rank: Annotated[Optional[list[int]], rank_option("Rank to dump", "every running rank")] = None,
    timeout: Annotated[
        Optional[float],
        typer.Option(
            "--timeout",
            help="Seconds to wait for each rank's dump (default: 5; with --native, for each process: 10).",
            show_default=False,
        ),
    ] = None,
    all_frames: Annotated[
        bool,
        typer.Option("--all-frames", help="Show rpcctl's own threads and frames too (the files in stacks/ keep them)."),
    ] = False,
    native: Annotated[
        bool,
        typer.Option(
            "--native",
            help="Read each process from outside (py-spy): Python frames with the native ones of their C calls, every "
            "thread, the rank and every process under it; works when the rank cannot run Python.",
        ),
    ] = False,
    runs_dir: RunsDirOption = None,
) -> None:
    """Dump the Python stacks of a live rank's threads: for hung jobs.

    The rank writes them itself, under the GIL (asked through its FIFO); one whose GIL a C call
    holds is dumped by faulthandler (SIGUSR1) instead. Python processes a rank started itself
    (mp.spawn, subprocess) are dumped after it. With --native, py-spy reads them instead
    (--timeout bounds each process); where that is not allowed, one line says how to allow it and
    the Python stacks follow.
    """
    console = get_console()
    run_dir = resolve_run(run, runs_dir)
    record = load_record(run_dir)
    if record.effective_status == RunStatus.LOST:
        raise UsageError(f"run {record.run_id} is lost: {_lost_story(run_dir)}; no live rank to dump")
    if record.effective_status != RunStatus.RUNNING:
        raise UsageError(
            f"run {record.run_id} is not running (status: {record.effective_status}): no live rank to dump"
        )
    ranks = rank if rank else [r.rank for r in record.ranks if r.state == RankStatus.RUNNING]
    if not ranks:
        raise UsageError(f"run {record.run_id} has no running rank")
    first = True
    stopped: list[str] = []
    if native:
        # the ranks it could not read
        ranks = _print_native(console, run_dir, ranks, NATIVE_TIMEOUT_S if timeout is None else timeout, all_frames)
    timeout = 5.0 if timeout is None else timeout
    for r in ranks:
        try:
            dumps = sdk.dump_stacks(run_dir, r, timeout=timeout)
        except StoppedRankError as exc:  # the others are still worth dumping
            stopped.append(str(exc))
            continue
        for dump in dumps:
            text = dump.text if all_frames or dump.text is None else hide_own_frames(dump.text)
            text = sanitize(text) if text is not None else None  # paths and names from the rank are data
            if not first:
                console.raw("\n")
            first = False
            if dump.kind == "rank":
                console.raw(f"── rank {r} (pid {dump.pid}) ──\n{text}")
            else:
                # A process the rank started itself (mp.spawn, subprocess): often where a hang is.
                started = shlex.join(dump.cmdline)
                text = text if text is not None else f"(wrote no stack within {timeout:g} s)\n"
                console.raw(f"── rank {r} › pid {dump.pid}: {sanitize(started)} ──\n{text}")
    if stopped:
        raise RpcctlError("; ".join(stopped))


def _print_native(console: Any, run_dir: Path, ranks: list[int], timeout: float, all_frames: bool) -> list[int]:
    """``stack --native``: each rank's processes as py-spy read them; returns the ranks none of
    whose processes could be read (py-spy missing, or refused: said once), for faulthandler."""
    from rpcctl.base import native_stacks

    fallback, told, read = [], set(), {}
    for r, dumps in native_stacks_of(run_dir, ranks, timeout=timeout).items():
        if any(d.dump.error is None for d in dumps):
            read[r] = dumps
            continue
        why = (
            native_stacks.refused_hint()
            if any(d.dump.refused for d in dumps)
            else (dumps[0].dump.error if dumps else "gone")
        )
        if why not in told:
            told.add(why)
            console.warn(why if "faulthandler" in why else f"native stacks: {why}; faulthandler's Python stacks follow")
        fallback.append(r)
    if read:
        console.raw(sanitize(native_text(read, all_frames)))  # names and paths from the rank are data
    return fallback
