"""``rpcctl bench``: measure RPC against its alternatives; ``rpcctl bench compare``; ``--tune``.

Thin: parses flags, calls ``rpcctl.bench.api`` (the bench's one facade), prints what it returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from rpcctl.commands.common import JsonOption, RunsDirOption, check_output, output_option, output_to
from rpcctl.base.errors import JobCancelledError, JobFailedError, RpcctlError, UsageError

# Old spellings that still work (with a warning): the same short flag must mean the same thing
# in every command (-s is launch's --set, -t is sbatch's --time), and --json is a switch.
DEPRECATED_FLAGS = {"-s": "--suite", "-t": "--transport", "--detail": "--wide"}


class BenchGroup(TyperGroup):
    """Rewrites deprecated spellings before click parses ``rpcctl bench`` (never a subcommand's)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, rewrite_deprecated(args, set(self.commands)))


def rewrite_deprecated(args: list[str], subcommands: set[str]) -> list[str]:
    from rpcctl.console import get_console

    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in subcommands or arg == "--":
            return out + args[i:]
        flag, eq, value = arg.partition("=")
        if flag in DEPRECATED_FLAGS:
            new = DEPRECATED_FLAGS[flag]
            get_console().warn(f"'{flag}' is deprecated: use '{new}'")
            out.append(new + eq + value)
        elif flag == "--json" and (eq or (i + 1 < len(args) and _is_value(args[i + 1], subcommands))):
            target = value if eq else args[i + 1]
            i += 0 if eq else 1
            if target == "-":
                get_console().warn("'--json -' is deprecated: '--json' alone prints the document")
                out.append("--json")
            else:
                get_console().warn(
                    f"'--json FILE' is deprecated: use '--output {target}' ('--json' alone prints the document)"
                )
                out += ["--output", target]
        else:
            out.append(arg)
        i += 1
    return out


def _is_value(token: str, subcommands: set[str]) -> bool:
    return token == "-" or (not token.startswith("-") and token not in subcommands)


bench_app = typer.Typer(
    add_completion=False,  # a sub-app (rpcctl.cli builds it on its own when it is called)
    cls=BenchGroup,
    help="Benchmark torch RPC against its alternatives (Gloo, raw TCP, memcpy, Ray, Horovod, TensorFlow), or tune it.",
    no_args_is_help=False,
    rich_markup_mode=None,
    epilog="Examples: rpcctl bench --quick; rpcctl bench --suite payload --transport rpc,gloo -o out.json; "
    "rpcctl bench compare old.json new.json; rpcctl bench --tune (takes minutes).",
)

SuiteOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--suite",
        help="Suites to run: latency, payload, throughput, collective, train, startup, or 'all' (repeat or "
        "comma-separate; default: latency, payload, throughput, train). 'compare' is the preset that answers 'how does "
        "torch RPC compare with Gloo, Ray, Horovod and TensorFlow': their shared operations side by side.",
        show_default=False,
    ),
]
TransportOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--transport",
        help="Transports (rows) to run, e.g. rpc,gloo,tcp; 'all' for every variant (default: rpc, rpc-tuned, gloo, "
        "tcp, memcpy, ray with --quick; every variant otherwise). See --list.",
        show_default=False,
    ),
]


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    suite: SuiteOption = None,
    transport: TransportOption = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Short timing and fewer variants (17 launches): about 4 minutes on a busy 2-core machine."
        ),
    ] = False,
    repeats: Annotated[
        Optional[int],
        typer.Option(
            "--repeats", min=2, help="Timed repeats per case (default: 5 with --quick, else 10).", show_default=False
        ),
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="Print the results document (JSON) instead of the tables.")
    ] = False,
    out: Annotated[Optional[Path], output_option("Also write the results document (JSON) to FILE.", "--out")] = None,
    runs_dir: RunsDirOption = None,
    wide: Annotated[bool, typer.Option("--wide", help="Show p90, min, max and n columns too.")] = False,
    rounds: Annotated[
        Optional[int],
        typer.Option(
            "--rounds",
            min=1,
            help="Launch each transport this many times, interleaved round by round, the repeats split between them "
            "(default: 3 with several transports, else 1).",
            show_default=False,
        ),
    ] = None,
    pin: Annotated[
        bool, typer.Option("--pin", help="Pin each rank to a core of its own (see docs/bench.md for whether it helps).")
    ] = False,
    tune: Annotated[
        bool,
        typer.Option(
            "--tune",
            help="Search for the fastest RPC settings on this machine and print them (takes minutes: about 15 "
            "launches).",
        ),
    ] = False,
    write_config: Annotated[
        Optional[Path],
        typer.Option(
            "--write-config", help="With --tune: merge the settings found into this launch config.", show_default=False
        ),
    ] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the transports and suites, then exit.")] = False,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from rpcctl.bench import api
    from rpcctl.console import get_console
    from rpcctl.records.runs import default_runs_dir

    console = get_console()
    if list_:
        rows, notes = api.listing()
        console.print(api.listing_table(rows))
        for note in notes:
            console.note(note)
        return
    if write_config is not None and not tune:
        raise UsageError("--write-config goes with --tune")
    runs_dir = runs_dir or default_runs_dir()
    if out is not None:
        check_output(out, "--output")  # before minutes of measuring: /dev/null, a link or a full disk is refused now
    if write_config is not None:
        check_output(write_config, "--write-config")
    if tune:
        if suite or transport:
            raise UsageError("--tune picks its own cases and RPC variants: drop --suite/--transport")
        _tune(console, quick, runs_dir, repeats, json_, out, write_config)
        return

    plan = api.plan(suite, transport, quick=quick, repeats=repeats, rounds=rounds, pin=pin)
    for note in plan.notes:
        console.note(note)
    if not plan.units:
        raise UsageError("nothing to run: no transport offers the suites asked for")
    console.info(
        f"bench: {plan.total_cases} cases over {len(plan.units)} launches "
        f"({', '.join(t.name for t in plan.transports)}; {plan.profile.name} timing, "
        + (
            f"{plan.rounds} rounds of {plan.timing.repeats} repeats)"
            if plan.rounds > 1
            else f"{plan.timing.repeats} repeats)"
        )
    )
    session = api.run(plan, runs_dir, console=console)
    report = session.report
    if json_:
        console.json(report.to_dict())
    else:
        for table in api.report_tables(report, wide=wide, order=[t.name for t in plan.transports]):
            console.print(table)
            console.print()
        if any(r.noisy for r in report.results):
            console.print(api.NOISY_LEGEND, markup=False)
        for note in report.notes:
            if "not supported" in note:
                console.note(note)
    if out is not None:
        output_to(out, report.save, "--output")  # atomic, 0600 (runs.write_json_atomic)
        console.info(f"bench: results written to {out}")
    console.info(f"bench: run directory {session.bench_dir}")
    console.info(api.verdict(report))
    _finish(session)


def _finish(session) -> None:
    if session.cancelled:
        raise JobCancelledError("bench interrupted: partial results saved in " + str(session.bench_dir), 130)
    if session.failures:
        raise JobFailedError("some bench launches failed:\n  " + "\n  ".join(session.failures))


def _tune(
    console, quick: bool, runs_dir: Path, repeats: int | None, json_: bool, out: Path | None, write_config: Path | None
) -> None:
    from rpcctl.bench import api
    from rpcctl.console import to_jsonable
    from rpcctl.records.runs import write_json_atomic

    console.info(
        f"bench --tune: {api.tune_knob_count()} settings, each between two runs of the TensorPipe defaults; "
        "then the best of each kind together (this takes minutes)"
    )
    result = api.tune(quick, runs_dir, repeats=repeats, console=console)
    document = api.tune_document(result)
    if json_:
        console.json(document)
    else:
        views = api.tune_views(result)
        console.print(views["candidates"])
        if views["between"]:
            console.print(views["between"], markup=False)
        console.print()
        if views["finalists"] is not None:
            console.print(views["finalists"])
            console.print()
        console.print(views["advice"], markup=False)
        if views["snippet"]:
            console.print(views["snippet"], markup=False)
    if write_config is not None:
        if result.chosen:
            notes: list[str] = []
            output_to(
                write_config, lambda path: notes.extend(api.write_tuned_config(path, result.chosen)), "--write-config"
            )
            for note in notes:
                console.note(note)
            console.info(f"bench: wrote the settings into {write_config}")
        else:
            console.info(f"bench: {write_config} left unchanged")
    if out is not None:
        output_to(out, lambda path: write_json_atomic(path, to_jsonable(document)), "--output")
        console.info(f"bench: results written to {out}")
    for s in result.sessions:
        console.info(f"bench: run directory {s.bench_dir}")
    for session in result.sessions:
        _finish(session)


@bench_app.command(
    "compare", epilog="Example: rpcctl bench compare runs/bench-old runs/bench-new --common --fail-on-regression"
)
def compare_cmd(
    old: Annotated[
        Path,
        typer.Argument(
            metavar="OLD",
            help="The earlier results (rpcctl bench -o FILE, or a bench run directory).",
            show_default=False,
        ),
    ],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="The later results.", show_default=False)],
    json_: JsonOption = False,
    common: Annotated[
        bool, typer.Option("--common", help="Show only the rows both results have (no added/removed rows).")
    ] = False,
    fail_on_regression: Annotated[
        bool, typer.Option("--fail-on-regression", help="Exit 1 when a row got slower beyond the noise.")
    ] = False,
) -> None:
    """Ratios NEW/OLD per row; flags the rows that changed by more than their noise."""
    from rpcctl.bench import api
    from rpcctl.console import get_console

    console = get_console()
    found = api.compare_files(old, new, common_only=common)
    counts = found["summary"]
    if json_:
        console.json(found)
    else:
        for line in found["machine_differences"]:
            console.warn(f"the machines differ: {line}")
        console.print(api.comparison_table(found["comparisons"]))
        console.info(
            f"{counts['slower']} slower, {counts['faster']} faster, {counts['same']} within noise"
            + (
                f", {counts['added']} added, {counts['removed']} removed"
                if counts["added"] or counts["removed"]
                else ""
            )
        )
    if fail_on_regression and counts["slower"]:
        raise RpcctlError(f"{counts['slower']} regression(s) beyond the noise")
