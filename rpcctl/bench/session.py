"""One ``rpcctl bench`` run: plan → units through the launcher (with progress) → report.

The command layer only parses flags and renders; this module does the work and is what tests
drive. Progress goes to stderr: a bar on a terminal, one line per unit elsewhere (CI logs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl.bench.results import BenchReport, BenchResult, machine_info, with_ratios
from rpcctl.bench.runner import BenchPlan, LaunchFn, Unit, UnitOutcome, run_unit
from rpcctl.console import Console, get_console
from rpcctl.records.runs import new_run_id
from rpcctl.base.states import RunStatus

BUSY_LOAD_PER_CPU = 0.5  # a 1-minute load above this many runnable tasks per CPU makes noise likely


class Progress:
    """Progress on stderr: a rich bar when stderr is a terminal, plain lines otherwise."""

    def __init__(self, console: Console, plan: BenchPlan):
        self.console, self.plan = console, plan
        self.bar = None
        self.task = None
        self.unit: Unit | None = None
        self.seen = 0

    def __enter__(self) -> Progress:
        if self.console.err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console.err,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("bench", total=self.plan.total_cases)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start_unit(self, unit: Unit) -> None:
        self.unit, self.seen = unit, 0
        self._describe(f"{unit.transport.name} (world {unit.world_size}): starting")

    def on_event(self, event: dict) -> None:  # called from the events thread
        if event.get("event") == "case" and self.unit is not None:
            from rpcctl.bench.suites import Case

            case = Case(**event["case"])
            self._describe(f"{self.unit.transport.name}: {case.suite} {case.label()}")
        elif event.get("event") == "result":
            self.seen += 1
            if self.bar is not None:
                self.bar.advance(self.task)

    def end_unit(self, outcome: UnitOutcome) -> None:
        missing = len(outcome.unit.cases) - self.seen
        if self.bar is not None and missing > 0:
            self.bar.advance(self.task, missing)
        if self.bar is None:
            self.console.info(
                f"bench: {outcome.unit.transport.name} (world {outcome.unit.world_size}): "
                f"{len(outcome.results)}/{len(outcome.unit.cases)} cases, {outcome.status}"
            )

    def _describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)


@dataclass
class SessionResult:
    report: BenchReport
    bench_dir: Path
    outcomes: list[UnitOutcome] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [o.error for o in self.outcomes if o.status == RunStatus.FAILED and o.error]

    @property
    def cancelled(self) -> bool:
        return any(o.status == RunStatus.CANCELLED for o in self.outcomes)


def run_session(
    plan: BenchPlan,
    runs_dir: Path,
    *,
    console: Console | None = None,
    launch: LaunchFn | None = None,
    name: str = "bench",
    extra_settings: dict[str, Any] | None = None,
) -> SessionResult:
    """Run every unit of ``plan`` (stopping early only on Ctrl-C) and save the report."""
    console = console or get_console()
    bench_dir = (runs_dir / new_run_id(name)).resolve()
    bench_dir.mkdir(parents=True)
    (bench_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    machine = machine_info()
    warn_if_busy(console, machine)

    outcomes: list[UnitOutcome] = []
    with Progress(console, plan) as progress:
        for unit in plan.units:
            progress.start_unit(unit)
            outcome = run_unit(unit, plan, bench_dir, progress.on_event, launch=launch, console=console)
            progress.end_unit(outcome)
            outcomes.append(outcome)
            if outcome.status == RunStatus.CANCELLED:
                break
    machine["load_average_end"] = _load_average()
    results = with_ratios(merge_rounds(outcomes))
    notes = (
        list(plan.notes)
        + [o.error for o in outcomes if o.error]
        + list(dict.fromkeys(n for o in outcomes for n in o.notes))
    )
    notes += unsupported_notes(results)
    settings = {
        "profile": plan.profile.name,
        "suites": list(plan.suites),
        "timing": plan.timing.to_dict(),
        "transports": {t.name: t.to_dict() for t in plan.transports},
        "run_dir": str(bench_dir),
        "rounds": plan.rounds,
        "pin": plan.pin,
        "observed": {f"{o.unit.transport.name}@{o.unit.world_size}": o.observed for o in outcomes if o.observed},
        "launches": {o.unit.slug: o.run_dir for o in outcomes},
        **(extra_settings or {}),
    }
    report = BenchReport(results=results, machine=machine, settings=settings, notes=notes)
    report.save(bench_dir / "results.json")
    return SessionResult(report, bench_dir, outcomes)


def merge_rounds(outcomes: list[UnitOutcome]) -> list[BenchResult]:
    """One row per transport and case: a case launched in several rounds has its timed calls
    and repeats pooled (each round's warm-up stays in its own launch)."""
    from rpcctl.bench.results import merge_measurements, result_from_measurement
    from rpcctl.bench.suites import Case

    groups: dict[tuple, list[tuple[dict, dict | None]]] = {}
    for outcome in outcomes:
        measured = outcome.measured or [None] * len(outcome.results)
        for result, raw in zip(outcome.results, measured):
            key = (
                result["transport"],
                result["suite"],
                result["op"],
                result["payload_bytes"],
                result["in_flight"],
                result["world_size"],
            )
            groups.setdefault(key, []).append((result, raw))
    merged = []
    for parts in groups.values():
        first = parts[0][0]
        raws = [raw for _, raw in parts]
        if len(parts) == 1 or not first.get("supported", True) or any(raw is None for raw in raws):
            merged.append(BenchResult.from_dict(first))
            continue
        case = Case(first["suite"], first["op"], first["payload_bytes"], first["in_flight"], first["world_size"])
        merged.append(
            BenchResult.from_dict(
                result_from_measurement(first["transport"], case, merge_measurements(raws), first.get("bytes_per_call"))
            )
        )
    return merged


def unsupported_notes(results: list[BenchResult]) -> list[str]:
    """One note per transport and reason, naming its unsupported cases."""
    from rpcctl.bench.suites import Case

    by_reason: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if not r.supported:
            label = Case(r.suite, r.op, r.payload_bytes, r.in_flight, r.world_size).label()
            by_reason.setdefault((r.transport, r.reason or "not supported"), []).append(label)
    return [f"{transport}: {', '.join(labels)}: {reason}" for (transport, reason), labels in by_reason.items()]


def _load_average() -> list[float] | None:
    import os

    try:
        return list(os.getloadavg())
    except OSError:
        return None


def warn_if_busy(console: Console, machine: dict[str, Any]) -> None:
    load = (machine.get("load_average") or [0.0])[0]
    cpus = machine.get("logical_cpus") or 1
    if load > BUSY_LOAD_PER_CPU * cpus:
        console.warn(
            f"the machine is busy (load {load:.1f} on {cpus} CPUs): expect noisy numbers; "
            "rows whose repeats disagree are marked 'noisy'"
        )
