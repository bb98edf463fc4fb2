"""Plan a bench and run it through rpcctl's own launcher, one *unit* at a time.

A unit is one transport at one world size: its ranks are launched and supervised like any
``rpcctl launch`` job, run every case of the unit (``rpcctl.bench.unit``), and exit. One
launch per unit keeps transports from sharing a process (allocator caches, threads, sockets).

The bench's run directory::

    <runs-dir>/bench-<stamp>-<hex>/
        plan.json              suites, timing, transports, units
        units/NN-NAME-wW.json  what each unit's ranks run (unit.py's --unit file)
        events/NN-NAME-wW.jsonl  rank 0's events: case started, result, done
        launches/<run-id>/     each unit's run (run.json, logs/rank-N.log, ...)
        results.json           the report (the same document as --json)

The launcher blocks and owns the signal handlers, so it runs in the calling (main) thread while
a small thread follows the unit's events file and reports progress.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpcctl.bench.suites import COMPARE, COMPARE_SUITES, COMPARE_TRANSPORTS, SUITES, Case, Profile, Timing, cases_for
from rpcctl.bench.transports import TransportSpec, transports
from rpcctl.base.states import RunStatus

UNIT_PROGRAM = Path(__file__).with_name("unit.py")  # what every rank of a unit runs
# The same thread budget for every row: one OpenMP thread per rank.
COMMON_ENV = {"OMP_NUM_THREADS": "1"}


DEFAULT_SUITES = ("latency", "payload", "throughput", "train")  # without --suite


@dataclass
class Unit:
    index: int
    transport: TransportSpec
    world_size: int
    cases: list[Case]
    round: int = 0  # with several rounds, the same unit is launched once per round
    pin: bool = False  # each rank pinned to a core of its own
    # A start-up row needs a fresh interpreter per rank (a forked rank inherits imported torch).
    start_method: str = "fork"
    repeats: int | None = None  # this unit's own (training runs once, with every repeat)

    @property
    def slug(self) -> str:
        return f"{self.index:02d}-{self.transport.name}-w{self.world_size}" + (f"-r{self.round}" if self.round else "")

    @property
    def env(self) -> dict[str, str]:
        return {**COMMON_ENV, **self.transport.adapter.env_for(self.transport.settings)}

    def timeout(self, timing: Timing) -> float:
        per_case = timing.warmup_s * 2 + timing.repeats * max(timing.repeat_s, 0.05) * 4 + 15
        return 120.0 + per_case * len(self.cases)


@dataclass
class BenchPlan:
    profile: Profile
    timing: Timing
    suites: tuple[str, ...]
    transports: list[TransportSpec]
    units: list[Unit]
    notes: list[str] = field(default_factory=list)
    rounds: int = 1  # each unit launched this many times, transports interleaved round by round
    pin: bool = False

    @property
    def total_cases(self) -> int:
        return sum(len(u.cases) for u in self.units)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "timing": self.timing.to_dict(),
            "rounds": self.rounds,
            "pin": self.pin,
            "suites": list(self.suites),
            "transports": [t.to_dict() for t in self.transports],
            "units": [
                {
                    "unit": u.slug,
                    "transport": u.transport.name,
                    "world_size": u.world_size,
                    "round": u.round,
                    "start_method": u.start_method,
                    "cases": [c.to_dict() for c in u.cases],
                    "env": u.env,
                }
                for u in self.units
            ],
            "notes": list(self.notes),
        }


def resolve_transports(names: list[str] | None, profile: Profile) -> list[TransportSpec]:
    """``--transport`` values (names, comma lists, or ``all``) → specs, in a stable order."""
    from rpcctl.base.errors import UsageError

    known = transports()
    wanted: list[str] = []
    for value in names or list(profile.default_transports):
        value = ",".join(COMPARE_TRANSPORTS) if value == COMPARE else value
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name == "all":
                wanted.extend(known)
                continue
            if name not in known:
                import difflib

                close = difflib.get_close_matches(name, list(known), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise UsageError(f"unknown transport '{name}'{hint}; known: {', '.join(known)}")
            wanted.append(name)
    order = list(known)
    return [known[n] for n in sorted(dict.fromkeys(wanted), key=order.index)]


def resolve_suites(values: list[str] | None) -> tuple[str, ...]:
    from rpcctl.base.errors import UsageError

    chosen: list[str] = []
    for value in values or list(DEFAULT_SUITES):
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name == "all":
                chosen.extend(SUITES)
            elif name == COMPARE:
                chosen.extend(COMPARE_SUITES)
            elif name in SUITES:
                chosen.append(name)
            else:
                raise UsageError(f"unknown suite '{name}'; suites: {', '.join(SUITES)}, {COMPARE} (a preset), all")
    return tuple(s for s in SUITES if s in chosen)


def is_compare(values: list[str] | None) -> bool:
    """Whether ``--suite`` asked for the ``compare`` preset."""
    return any(COMPARE in (v.strip() for v in value.split(",")) for value in values or [])


def plan_bench(
    suites: tuple[str, ...],
    specs: list[TransportSpec],
    profile: Profile,
    *,
    repeats: int | None = None,
    payload_sizes: tuple[int, ...] | None = None,
    rounds: int = 1,
    pin: bool = False,
    shared_ops_only: bool = False,
) -> BenchPlan:
    """The units to launch: per transport, one for the point-to-point, collective and start-up
    suites (plus ``train`` at world size 2) and one per other training world size. Unavailable
    transports become notes.

    With ``rounds`` > 1 every unit but training is launched once per round, transports in a
    rotated order each round, and each launch times its share of the repeats: drift of a shared
    machine then falls on every transport alike instead of on whichever ran last, and the
    launch-to-launch noise shows in the noise band. ``shared_ops_only`` (the ``compare`` preset)
    keeps one op per suite and transport: the operation the frameworks share."""
    from dataclasses import replace

    rounds = max(1, rounds)
    total_repeats = repeats or profile.timing.repeats
    timing = replace(profile.timing, repeats=max(1, -(-total_repeats // rounds)))
    if payload_sizes:
        profile = replace(profile, payload_sizes=payload_sizes)
    units: list[Unit] = []
    notes: list[str] = []
    kept: list[TransportSpec] = []
    for spec in specs:
        cls = spec.adapter
        reason = cls.unavailable()
        if reason:
            notes.append(f"{spec.name}: skipped: {reason}")
            continue
        ops = {suite: names[:1] for suite, names in cls.ops.items()} if shared_ops_only else cls.ops
        p2p = cases_for(ops, tuple(s for s in suites if s != "train"), profile, world_size=cls.processes)
        train = cases_for(ops, ("train",), profile) if "train" in suites else []
        by_world: dict[int, list[Case]] = {}
        if p2p:
            by_world[cls.processes] = list(p2p)
        for case in train:
            by_world.setdefault(case.world_size, []).append(case)
        if not by_world:
            notes.append(f"{spec.name}: no case in {', '.join(suites)} (it offers {', '.join(cls.ops)})")
            continue
        kept.append(spec)
        for world_size in sorted(by_world):
            cases = by_world[world_size]
            method = "spawn" if any(c.suite == "startup" for c in cases) else "fork"
            units.append(Unit(len(units), spec, world_size, cases, pin=pin, start_method=method))
    return BenchPlan(
        profile, timing, suites, kept, interleave_rounds(units, rounds, total_repeats), notes, rounds=rounds, pin=pin
    )


def interleave_rounds(units: list[Unit], rounds: int, total_repeats: int | None = None) -> list[Unit]:
    """Round r launches every unit once, the order rotated by r; training units run once, with
    all the repeats."""
    from dataclasses import replace

    repeated = [u for u in units if any(c.suite != "train" for c in u.cases)]
    once = [replace(u, repeats=total_repeats if rounds > 1 else None) for u in units if u not in repeated]
    ordered: list[Unit] = []
    for r in range(rounds):
        shift = r % len(repeated) if repeated else 0
        ordered.extend(replace(u, round=r) for u in repeated[shift:] + repeated[:shift])
    ordered.extend(once)
    return [replace(u, index=i) for i, u in enumerate(ordered)]


# -- running -----------------------------------------------------------------------------------


@dataclass
class UnitOutcome:
    unit: Unit
    status: RunStatus  # succeeded | failed | cancelled
    results: list[dict]
    run_dir: str | None = None
    error: str | None = None
    observed: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured: list[dict | None] = field(default_factory=list)  # the raw timings behind each result


class EventFollower(threading.Thread):
    """Follows a unit's events file from a thread, handing each new event to ``on_event``."""

    def __init__(self, path: Path, on_event: Callable[[dict], None], interval: float = 0.1):
        super().__init__(name=f"bench-events-{path.stem}", daemon=True)
        self.path, self.on_event, self.interval = path, on_event, interval
        self.events: list[dict] = []
        self._offset = 0
        self._partial = ""
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        for line in lines:
            if line.strip():
                event = json.loads(line)
                self.events.append(event)
                self.on_event(event)

    def finish(self) -> list[dict]:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        self.poll()
        return self.events


LaunchFn = Callable[..., Any]


def default_launch() -> LaunchFn:
    from rpcctl.launch.launcher import launch

    return launch


def run_unit(
    unit: Unit,
    plan: BenchPlan,
    bench_dir: Path,
    on_event: Callable[[dict], None],
    launch: LaunchFn | None = None,
    console=None,
) -> UnitOutcome:
    """Launch one unit through rpcctl's launcher and collect its results."""
    from rpcctl.config import JobSpec, RpcSpec

    launch = launch or default_launch()
    for sub in ("units", "events", "launches"):
        (bench_dir / sub).mkdir(parents=True, exist_ok=True)
    unit_file = bench_dir / "units" / f"{unit.slug}.json"
    events_file = bench_dir / "events" / f"{unit.slug}.jsonl"
    unit_file.write_text(
        json.dumps(
            {
                "transport": unit.transport.to_dict(),
                "timing": {**plan.timing.to_dict(), **({"repeats": unit.repeats} if unit.repeats else {})},
                "cases": [c.to_dict() for c in unit.cases],
                "events": str(events_file),
                "pin": unit.pin,
            },
            indent=2,
        )
    )
    spec = JobSpec(
        name=re.sub(r"[^A-Za-z0-9._-]+", "-", f"bench-{unit.transport.name}"),
        script=UNIT_PROGRAM,
        args=["--unit", str(unit_file)],
        nproc_per_node=unit.world_size,
        env=unit.env,
        timeout=unit.timeout(plan.timing),
        rpc=RpcSpec(init=False),
        start_method=unit.start_method,  # fork: what `rpcctl launch` users get; spawn for start-up rows
        grace=2.0,
    )
    follower = EventFollower(events_file, on_event)
    follower.start()
    try:
        kwargs = {"runs_dir": bench_dir / "launches", "echo": False, "telemetry": False}
        if console is not None:
            kwargs["console"] = console
        record = launch(spec, **kwargs)
    finally:
        events = follower.finish()
    results = [e["result"] for e in events if e.get("event") == "result"]
    measured = [e.get("measured") for e in events if e.get("event") == "result"]
    status = getattr(record, "status", RunStatus.FAILED)
    error = None
    if status != RunStatus.SUCCEEDED:
        cause = getattr(record, "root_cause", None)
        message = cause.message if cause is not None else getattr(record, "reason", None) or status
        error = (
            f"{unit.transport.name} (world {unit.world_size}) {status}: {message}; logs: "
            f"{Path(record.run_dir) / 'logs'}"
        )
    observed = next((e["observed"] for e in events if e.get("event") == "observed"), {})
    outcome = UnitOutcome(unit, status, results, str(record.run_dir), error, observed, measured=measured)
    outcome.notes = [
        f"{unit.transport.name}: {n}" for n in unit.transport.adapter.mismatches(unit.transport.settings, observed)
    ]
    return outcome
