"""``rpcctl bench``: measure RPC against its alternatives; ``rpcctl bench compare``; ``--tune``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from rpcctl.commands.common import JsonOption, RunsDirOption
from rpcctl.errors import JobCancelledError, JobFailedError, RpcctlError, UsageError

bench_app = typer.Typer(
    help="Benchmark torch RPC against its alternatives (Gloo, raw TCP, memcpy, Ray), or tune it.",
    no_args_is_help=False,
    rich_markup_mode=None,
)

NOISY_LEGEND = (
    "* noisy: this row's repeats disagree by more than ±10%; a difference smaller than the noise "
    "is not evidence (see docs/bench.md)"
)

SuiteOption = Annotated[
    Optional[list[str]],
    typer.Option("--suite", "-s", help="Suites to run: latency, payload, throughput, train (repeat or comma-separate; default: all).", show_default=False),
]
TransportOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--transport", "-t",
        help="Transports (rows) to run, e.g. rpc,gloo,tcp; 'all' for every variant (default: rpc, rpc-tuned, gloo, tcp, "
        "memcpy, ray with --quick; every variant otherwise). See --list.",
        show_default=False,
    ),
]


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    suite: SuiteOption = None,
    transport: TransportOption = None,
    quick: Annotated[bool, typer.Option("--quick", help="Short timing and fewer variants: about a minute on a small machine.")] = False,
    repeats: Annotated[Optional[int], typer.Option("--repeats", min=2, help="Timed repeats per case (default: 5 with --quick, else 10).", show_default=False)] = None,
    json_file: Annotated[Optional[Path], typer.Option("--json", help="Also write the results document to FILE ('-': print it instead of the tables).", show_default=False)] = None,
    runs_dir: RunsDirOption = None,
    detail: Annotated[bool, typer.Option("--detail", help="Show p90, min and max columns too.")] = False,
    tune: Annotated[bool, typer.Option("--tune", help="Search for the fastest RPC settings on this machine and print them.")] = False,
    write_config: Annotated[Optional[Path], typer.Option("--write-config", help="With --tune: merge the settings found into this launch config.", show_default=False)] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the transports and suites, then exit.")] = False,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from rpcctl.bench.runner import plan_bench, resolve_suites, resolve_transports
    from rpcctl.bench.suites import FULL, QUICK
    from rpcctl.console import get_console
    from rpcctl.runs import default_runs_dir

    console = get_console()
    profile = QUICK if quick else FULL
    if list_:
        _print_list(console)
        return
    if write_config is not None and not tune:
        raise UsageError("--write-config goes with --tune")
    runs_dir = runs_dir or default_runs_dir()
    if tune:
        if suite or transport:
            raise UsageError("--tune picks its own cases and RPC variants: drop --suite/--transport")
        _tune(console, profile, runs_dir, repeats, json_file, write_config)
        return

    from rpcctl.bench.results import render_report
    from rpcctl.bench.session import run_session

    plan = plan_bench(resolve_suites(suite), resolve_transports(transport, profile), profile, repeats=repeats)
    for note in plan.notes:
        console.note(escape(note))
    if not plan.units:
        raise UsageError("nothing to run: no transport offers the suites asked for")
    console.info(
        f"bench: {plan.total_cases} cases over {len(plan.units)} launches "
        f"({', '.join(t.name for t in plan.transports)}; {profile.name} timing, {plan.timing.repeats} repeats)"
    )
    session = run_session(plan, runs_dir, console=console)
    report = session.report
    if json_file is not None and str(json_file) == "-":
        console.json(report.to_dict())
    else:
        for table in render_report(report, detail=detail, order=[t.name for t in plan.transports]):
            console.print(table)
            console.print()
        if any(r.noisy for r in report.results):
            console.print(NOISY_LEGEND, markup=False)
        if json_file is not None:
            report.save(json_file)
            console.info(f"bench: results written to {json_file}")
    console.info(f"bench: run directory {session.bench_dir}")
    _finish(session)


def _finish(session) -> None:
    if session.cancelled:
        raise JobCancelledError("bench interrupted: partial results saved in " + str(session.bench_dir), 130)
    if session.failures:
        raise JobFailedError("some bench launches failed:\n  " + "\n  ".join(session.failures))


def _print_list(console) -> None:
    from rpcctl.bench.suites import FULL, QUICK, SUITES
    from rpcctl.bench.transports import transports
    from rpcctl.console import Column, render_table

    rows = []
    for name, spec in transports().items():
        cls = spec.adapter
        runs_in = [label for label, profile in (("quick", QUICK), ("full", FULL)) if name in profile.default_transports]
        rows.append({
            "name": name,
            "suites": "all" if set(cls.ops) >= set(SUITES) else ",".join(s for s in SUITES if s in cls.ops),
            "runs_in": ",".join(runs_in) or "on request",
            "status": "ok" if cls.unavailable() is None else "missing",
            "summary": spec.summary,
        })
    columns = [Column("name", "TRANSPORT"), Column("suites", "SUITES"), Column("runs_in", "DEFAULT IN"),
               Column("status", "STATUS"), Column("summary", "WHAT")]
    console.print(render_table(rows, columns))
    for name, spec in transports().items():
        reason = spec.adapter.unavailable()
        if reason:
            console.note(escape(f"{name}: {reason}"))


def _tune(console, profile, runs_dir: Path, repeats: int | None, json_file: Path | None, write_config: Path | None) -> None:
    from rpcctl.bench import tuning
    from rpcctl.console import to_jsonable
    from rpcctl.runs import write_json_atomic

    console.info(
        f"bench --tune: {len(tuning.KNOBS)} settings, each between two runs of the TensorPipe defaults; "
        "then the best of each kind together"
    )
    result = tuning.run_tuning(profile, runs_dir, repeats=repeats, console=console)
    document = result.final.report.to_dict()
    document["tuning"] = result.to_dict()
    if json_file is not None and str(json_file) == "-":
        console.json(document)
        _finish_tune(result)
        return

    console.print(_candidates_table(result.candidates, "each setting alone: speed vs the defaults measured around it (>1 is faster)"))
    between = result.sessions[0].report.settings.get("defaults_spread_between_launches") or {}
    if between:
        worst = max(between, key=between.get)
        console.print(
            f"the defaults, measured {len(tuning.KNOBS) + 1} times in between, varied by up to ±{between[worst] * 50:.0f}% "
            f"from launch to launch ({worst}); NOISE includes it",
            markup=False,
        )
    console.print()
    if result.finalists:
        console.print(_candidates_table(result.finalists, f"measured again: {_describe(result.tried)} (rpc-chosen)"))
        console.print()
    if not result.chosen:
        if result.tried:
            console.print("The gain did not hold up when measured again: keep TensorPipe's defaults.", markup=False)
        else:
            console.print("Nothing beat TensorPipe's defaults beyond the noise here: keep them.", markup=False)
    else:
        console.print("Put this in a launch config (or use rpc.tuning: auto for the known-good set):", markup=False)
        console.print(tuning.config_snippet(result.chosen), markup=False)
        if write_config is not None:
            for note in tuning.write_config(write_config, result.chosen):
                console.note(escape(note))
            console.info(f"bench: wrote the settings into {write_config}")
    if write_config is not None and not result.chosen:
        console.info(f"bench: {write_config} left unchanged")
    if json_file is not None:
        write_json_atomic(json_file, to_jsonable(document))
        console.info(f"bench: results written to {json_file}")
    for s in result.sessions:
        console.info(f"bench: run directory {s.bench_dir}")
    _finish_tune(result)


def _candidates_table(candidates, title: str):
    from rpcctl.bench.results import fmt_ratio
    from rpcctl.console import Column, render_table

    labels = list(dict.fromkeys(label for c in candidates for label in (c.ratios or {})))
    rows = []
    for c in candidates:
        verdict = "faster" if c.wins else ("slower" if c.loses else ("no data" if c.score is None else "within noise"))
        row = {"name": c.name, "score": c.score, "noise": f"±{c.tolerance * 100:.0f}%", "verdict": verdict}
        row.update({label: (c.ratios or {}).get(label) for label in labels})
        rows.append(row)
    columns = [
        Column("name", "SETTING"),
        *(Column(label, label.upper(), fmt_ratio, "right") for label in labels),
        Column("score", "GEOMEAN", fmt_ratio, "right"),
        Column("noise", "NOISE", justify="right"),
        Column("verdict", "VERDICT"),
    ]
    return render_table(rows, columns, title=title)


def _finish_tune(result) -> None:
    for session in result.sessions:
        _finish(session)


def _describe(settings: dict) -> str:
    from rpcctl.bench.transports.rpc import describe

    return describe(settings)


@bench_app.command("compare")
def compare_cmd(
    old: Annotated[Path, typer.Argument(help="The earlier results (rpcctl bench --json FILE, or a run's results.json).", show_default=False)],
    new: Annotated[Path, typer.Argument(help="The later results.", show_default=False)],
    json_: JsonOption = False,
    fail_on_regression: Annotated[bool, typer.Option("--fail-on-regression", help="Exit 1 when a row got slower beyond the noise.")] = False,
) -> None:
    """Ratios NEW/OLD per row; flags the rows that changed by more than their noise."""
    from rpcctl.bench.compare import compare, machine_differences, render_comparisons, summary_counts
    from rpcctl.bench.results import load_report
    from rpcctl.console import get_console

    console = get_console()
    before, after = load_report(_results_path(old)), load_report(_results_path(new))
    comparisons = compare(before, after)
    counts = summary_counts(comparisons)
    differences = machine_differences(before, after)
    if json_:
        console.json({"comparisons": comparisons, "summary": counts, "machine_differences": differences})
    else:
        for line in differences:
            console.warn(f"the machines differ: {line}")
        console.print(render_comparisons(comparisons))
        console.info(
            f"{counts['slower']} slower, {counts['faster']} faster, {counts['same']} within noise"
            + (f", {counts['added']} added, {counts['removed']} removed" if counts["added"] or counts["removed"] else "")
        )
    if fail_on_regression and counts["slower"]:
        raise RpcctlError(f"{counts['slower']} regression(s) beyond the noise")


def _results_path(path: Path) -> Path:
    """A results file, or a bench run directory (its results.json)."""
    if path.is_dir():
        candidate = path / "results.json"
        if not candidate.is_file():
            raise UsageError(f"{path} is a directory without results.json")
        return candidate
    return path
