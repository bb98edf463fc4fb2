"""The bench's facade: the one module ``rpcctl bench`` (rpcctl/commands/bench.py) calls.

The command parses flags and prints what it gets from here; planning, running, listing, tuning,
comparing and building the tables live behind these functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rpcctl.bench.compare import Comparison, compare, machine_differences, render_comparisons, summary_counts
from rpcctl.bench.results import BenchReport, load_report, render_report
from rpcctl.bench.runner import BenchPlan, is_compare, plan_bench, resolve_suites, resolve_transports
from rpcctl.bench.session import SessionResult, run_session
from rpcctl.bench.suites import COMPARE, FULL, QUICK, SUITES, Profile
from rpcctl.console import KEY, Column, render_table

__all__ = [
    "BenchPlan",
    "BenchReport",
    "Comparison",
    "SessionResult",
    "NOISY_LEGEND",
    "TransportInfo",
    "plan",
    "run",
    "report_tables",
    "verdict",
    "listing",
    "listing_table",
    "compare_files",
    "comparison_table",
    "tune",
    "profile_for",
]

NOISY_LEGEND = (
    "* noisy: this row's repeats disagree by more than ±10%; a difference smaller than the noise "
    "is not evidence (see docs/bench.md)"
)


def profile_for(quick: bool) -> Profile:
    return QUICK if quick else FULL


DEFAULT_ROUNDS = 3  # launches per transport when several transports are compared


def plan(
    suites: list[str] | None,
    transport_names: list[str] | None,
    *,
    quick: bool,
    repeats: int | None = None,
    rounds: int | None = None,
    pin: bool = False,
) -> BenchPlan:
    """What ``rpcctl bench`` will launch (bad names are a ``UsageError``, before anything runs).

    ``--suite compare`` is the preset: the frameworks (unless ``--transport`` names others), one
    shared op per suite. Several transports are interleaved over ``DEFAULT_ROUNDS`` rounds unless
    ``rounds`` says otherwise (never more rounds than repeats)."""
    profile = profile_for(quick)
    compare_preset = is_compare(suites)
    if compare_preset and not transport_names:
        transport_names = [COMPARE]
    specs = resolve_transports(transport_names, profile)
    repeats = repeats or profile.timing.repeats
    if rounds is None:
        rounds = DEFAULT_ROUNDS if len(specs) > 1 else 1
    return plan_bench(
        resolve_suites(suites),
        specs,
        profile,
        repeats=repeats,
        rounds=min(rounds, repeats),
        pin=pin,
        shared_ops_only=compare_preset,
    )


def run(bench_plan: BenchPlan, runs_dir: Path, console=None) -> SessionResult:
    return run_session(bench_plan, runs_dir, console=console)


def report_tables(report: BenchReport, *, wide: bool = False, order: list[str] | None = None) -> list:
    return render_report(report, detail=wide, order=order)


def verdict(report: BenchReport) -> str:
    """One line that sums the run up: per transport, its speed against ``rpc`` (geometric mean
    over the rows both have), and whether that is beyond the noise. Point-to-point rows only
    (collectives are compared with gloo's all-reduce, never with rpc)."""
    parts = _ranking(report, "rpc", "vs_rpc", lambda r: r.suite not in ("collective", "startup"))
    parts += _ranking(report, "gloo", "vs_gloo", lambda r: r.suite == "collective", prefix="collectives: ")
    noisy = sum(r.noisy for r in report.results)
    if not parts:
        return f"verdict: {len(report.results)} rows, {noisy} noisy; nothing to rank against rpc"
    return (
        "verdict: "
        + "; ".join(parts)
        + f" (geometric mean over each transport's rows; {noisy} of {len(report.results)} rows noisy)"
    )


def _ranking(report: BenchReport, baseline: str, ratio: str, include, prefix: str = "") -> list[str]:
    from rpcctl.bench.results import fmt_ratio
    from rpcctl.bench.stats import tolerance

    base = {r.key: r for r in report.results if r.transport == baseline and include(r)}
    by_transport: dict[str, list[tuple[float, float]]] = {}
    for r in report.results:
        value = getattr(r, ratio)
        if r.transport == baseline or not include(r) or value is None or not value > 0:
            continue
        ref = base.get(r.key)
        by_transport.setdefault(r.transport, []).append(
            (value, tolerance(r.spread, ref.spread if ref is not None else None))
        )
    faster, slower, same = [], [], []
    for name, pairs in by_transport.items():
        geo = math.exp(sum(math.log(v) for v, _ in pairs) / len(pairs))
        band = sorted(b for _, b in pairs)[len(pairs) // 2]
        (faster if geo > 1 + band else slower if geo < 1 - band else same).append((geo, f"{name} {fmt_ratio(geo)}"))
    parts = []
    for label, group in (
        (f"faster than {baseline}", faster),
        ("slower", slower),
        (f"within the noise of {baseline}", same),
    ):
        if group:
            parts.append(f"{label}: " + ", ".join(e for _, e in sorted(group, reverse=True)))
    return [prefix + "; ".join(parts)] if parts else []


# -- --list ----------------------------------------------------------------------------------------


@dataclass
class TransportInfo:
    """One row of ``rpcctl bench --list``."""

    name: str
    suites: str
    runs_in: str
    status: str
    summary: str

    # The name and status are never cut: the suites and the summary wrap on a narrow terminal.
    COLUMNS: ClassVar[list[Column]] = [
        Column("name", "TRANSPORT", priority=KEY),
        Column("suites", "SUITES", wrap=True),
        Column("runs_in", "DEFAULT IN"),
        Column("status", "STATUS", priority=KEY),
        Column("summary", "WHAT", wrap=True),
    ]


def listing() -> tuple[list[TransportInfo], list[str]]:
    """Every known transport, and a note per transport that cannot run here (with the fix)."""
    from rpcctl.bench.transports import transports

    rows, notes = [], []
    for name, spec in transports().items():
        cls = spec.adapter
        runs_in = [label for label, profile in (("quick", QUICK), ("full", FULL)) if name in profile.default_transports]
        reason = cls.unavailable()
        rows.append(
            TransportInfo(
                name=name,
                suites="all" if set(cls.ops) >= set(SUITES) else ", ".join(s for s in SUITES if s in cls.ops),
                runs_in=",".join(runs_in) or "on request",
                status="ok" if reason is None else "missing",
                summary=spec.summary,
            )
        )
        if reason:
            notes.append(f"{name}: {reason}")
    return rows, notes


def listing_table(rows: list[TransportInfo]):
    return render_table(rows, TransportInfo.COLUMNS, hint="a wider terminal shows them")


# -- compare ---------------------------------------------------------------------------------------


def results_path(path: Path) -> Path:
    """A results file, or a bench run directory (its results.json)."""
    from rpcctl.base.errors import UsageError

    if path.is_dir():
        candidate = path / "results.json"
        if not candidate.is_file():
            raise UsageError(f"{path} is a directory without results.json")
        return candidate
    return path


def compare_files(old: Path, new: Path, *, common_only: bool = False) -> dict[str, Any]:
    """NEW vs OLD: the comparisons, their counts, and how the two machines differ."""
    before, after = load_report(results_path(old)), load_report(results_path(new))
    comparisons = compare(before, after)
    if common_only:
        comparisons = [c for c in comparisons if c.old is not None and c.new is not None]
    return {
        "comparisons": comparisons,
        "summary": summary_counts(comparisons),
        "machine_differences": machine_differences(before, after),
    }


def comparison_table(comparisons: list[Comparison]):
    return render_comparisons(comparisons)


# -- --tune ----------------------------------------------------------------------------------------


def tune(quick: bool, runs_dir: Path, *, repeats: int | None = None, console=None):
    from rpcctl.bench import tuning

    return tuning.run_tuning(profile_for(quick), runs_dir, repeats=repeats, console=console)


def tune_knob_count() -> int:
    from rpcctl.bench import tuning

    return len(tuning.KNOBS)


def tune_views(result) -> dict[str, Any]:
    """What the command prints after ``--tune``: the tables, the spread of the defaults between
    launches, the advice, and the launch-config snippet (``None`` when the defaults win)."""
    from rpcctl.bench import tuning
    from rpcctl.bench.transports.rpc import describe

    views: dict[str, Any] = {
        "candidates": candidates_table(
            result.candidates, "each setting alone: speed vs the defaults measured around it (>1 is faster)"
        ),
        "between": None,
        "finalists": None,
        "snippet": tuning.config_snippet(result.chosen) if result.chosen else None,
    }
    between = result.sessions[0].report.settings.get("defaults_spread_between_launches") or {}
    if between:
        worst = max(between, key=between.get)
        views["between"] = (
            f"the defaults, measured {len(tuning.KNOBS) + 1} times in between, varied by up to "
            f"±{between[worst] * 50:.0f}% from launch to launch ({worst}); NOISE includes it"
        )
    if result.finalists:
        views["finalists"] = candidates_table(
            result.finalists, f"measured again: {describe(result.tried)} (rpc-chosen)"
        )
    if result.chosen:
        views["advice"] = "Put this in a launch config (or use rpc.tuning: auto for the known-good set):"
    elif result.tried:
        views["advice"] = "The gain did not hold up when measured again: keep TensorPipe's defaults."
    else:
        views["advice"] = "Nothing beat TensorPipe's defaults beyond the noise here: keep them."
    return views


def tune_document(result) -> dict[str, Any]:
    document = result.final.report.to_dict()
    document["tuning"] = result.to_dict()
    return document


def write_tuned_config(path: Path, settings: dict) -> list[str]:
    from rpcctl.bench import tuning

    return tuning.write_config(path, settings)


def candidates_table(candidates, title: str):
    from rpcctl.bench.results import fmt_ratio

    labels = list(dict.fromkeys(label for c in candidates for label in (c.ratios or {})))
    rows = []
    for c in candidates:
        row = {"name": c.name, "score": c.score, "noise": f"±{c.tolerance * 100:.0f}%", "verdict": c.verdict}
        row.update({label: (c.ratios or {}).get(label) for label in labels})
        rows.append(row)
    columns = [
        Column("name", "SETTING", priority=KEY),
        *(Column(label, label.upper(), fmt_ratio, "right") for label in labels),
        Column("score", "GEOMEAN", fmt_ratio, "right"),
        Column("noise", "NOISE", justify="right"),
        Column("verdict", "VERDICT", priority=KEY),
    ]
    return render_table(rows, columns, title=title)
