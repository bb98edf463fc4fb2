"""The search behind ``rpcctl bench --tune``: which RPC settings make this machine faster.

The settings themselves (``AUTO_SETTINGS``, ``settings_to_env``, the ``RPCCTL_RPC_*``
variables) belong to the launch core, in ``rpcctl.base.rpc_settings``; this module measures them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rpcctl.base.rpc_settings import MALLOC_REUSE, settings_to_env


# -- --tune: a greedy search over single knobs, then their combination ---------------------------
#
# Launches run one after another, and a shared machine's load drifts in between: a knob measured
# a minute after the defaults may look slower (or faster) for no reason of its own. So the
# defaults are measured again between every two candidates (rpc.0, knob 1, rpc.1, knob 2, ...)
# and each candidate is compared with the two baseline runs around it: linear drift cancels, and
# the disagreement of the two baselines widens the noise band.

KNOBS: dict[str, dict[str, Any]] = {
    "rpc-uv": {"transports": ["uv"]},
    "rpc-shm": {"transports": ["shm", "uv"]},
    "rpc-cma": {"channels": ["cma", "basic"]},
    "rpc-basic": {"channels": ["basic"]},
    "rpc-threads": {"num_worker_threads": 4},
    "rpc-thp": {"env": {"THP_MEM_ALLOC_ENABLE": "1"}},
    "rpc-malloc": {"env": MALLOC_REUSE},
}


def merge_settings(*parts: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key == "env":
                merged["env"] = {**merged.get("env", {}), **value}
            else:
                merged[key] = value
    return merged


def knob_group(settings: Mapping[str, Any]) -> str:
    """Knobs of one group are alternatives (two transport lists cannot both apply)."""
    keys = [k for k in settings if k != "env"]
    return keys[0] if keys else "env:" + ",".join(sorted(settings.get("env", {})))


@dataclass
class Candidate:
    name: str
    settings: dict[str, Any]
    score: float | None = None  # geometric mean of speed vs the defaults, over the tuning cases
    tolerance: float = 0.0  # how much of that is noise (repeats, and drift of the defaults)
    ratios: dict[str, float] | None = None  # per case label

    @property
    def wins(self) -> bool:
        return self.score is not None and self.score > 1 + self.tolerance

    @property
    def loses(self) -> bool:
        return self.score is not None and self.score < 1 - self.tolerance

    @property
    def verdict(self) -> str:
        return (
            "faster"
            if self.wins
            else ("slower" if self.loses else ("no data" if self.score is None else "within noise"))
        )


def score(
    rows: list, before: list, after: list | None = None, between: Mapping[tuple, float] | None = None
) -> tuple[float | None, float, dict[str, float]]:
    """Geometric-mean speed of ``rows`` over the defaults measured ``before`` (and ``after``)
    them, its noise band, and the per-case ratios.

    The reference is the geometric mean of the two baseline runs around the candidate, so a
    steady drift cancels. The band of a case is the widest of: the repeats' noise of the three
    runs, the disagreement of the two baselines, and half the spread of the defaults over every
    launch of the round (``between``: case key → spread), which is the launch-to-launch noise a
    single launch's repeats cannot show. The candidate's band is the median over its cases (not
    shrunk with their number: on a busy machine a bad launch is bad for all its cases at once).
    """
    from rpcctl.bench.stats import tolerance

    first = {r.key: r for r in before}
    second = {r.key: r for r in (after or before)}
    ratios: dict[str, float] = {}
    bands: list[float] = []
    for row in rows:
        b1, b2 = first.get(row.key), second.get(row.key)
        if b1 is None or b2 is None or not (row.speed and b1.speed and b2.speed):
            continue
        ratios[case_label(row)] = row.speed / math.sqrt(b1.speed * b2.speed)
        drift = abs(b1.speed - b2.speed) / (b1.speed + b2.speed)
        launches = (between or {}).get(row.key, 0.0) / 2
        bands.append(max(tolerance(row.spread, b1.spread, b2.spread), drift, launches))
    if not ratios:
        return None, 0.0, {}
    geo = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
    return geo, statistics.median(bands), ratios


def baseline_spread(baselines: list[list]) -> dict[tuple, float]:
    """Per case: the spread of the defaults' speed over several launches."""
    from rpcctl.bench.stats import spread

    speeds: dict[tuple, list[float]] = {}
    for rows in baselines:
        for row in rows:
            if row.speed:
                speeds.setdefault(row.key, []).append(row.speed)
    return {key: spread(values) for key, values in speeds.items()}


def choose(candidates: list[Candidate]) -> dict[str, Any]:
    """The best winning knob of each group, merged ({} when none wins)."""
    best: dict[str, Candidate] = {}
    for cand in candidates:
        group = knob_group(cand.settings)
        if cand.wins and (group not in best or cand.score > best[group].score):
            best[group] = cand
    return merge_settings(*(c.settings for c in best.values()))


def case_label(row) -> str:
    return label_of(row.key)


def label_of(key: tuple) -> str:
    """A short name for a case key (suite, op, payload, in flight, world size)."""
    from rpcctl.console import human_bytes

    suite, op, payload_bytes, in_flight, _ = key
    if suite == "payload":
        return f"echo {human_bytes(payload_bytes)}"
    if suite == "throughput":
        return f"{op} ×{in_flight}"
    return f"{op} {human_bytes(payload_bytes or 0)}"


def config_snippet(settings: Mapping[str, Any]) -> str:
    """The YAML to put in a launch config for ``settings``."""
    import yaml

    env = settings_to_env(settings)
    data: dict[str, Any] = {}
    if env:
        data["env"] = env
    return (
        yaml.safe_dump(data, sort_keys=False).rstrip()
        if data
        else "# TensorPipe defaults are fastest here: nothing to set"
    )


# -- the --tune session ------------------------------------------------------------------------


def tuning_cases(profile) -> list:
    """What ``--tune`` measures: small-call latency, four payload sizes (both sides of the 2 MiB
    huge-page threshold), a pipelined rate."""
    from rpcctl.bench.suites import KiB, MiB, TINY_BYTES, Case

    return [
        Case("latency", "rpc_sync", TINY_BYTES),
        Case("payload", "rpc_sync", 16 * KiB),
        Case("payload", "rpc_sync", 1 * MiB),
        Case("payload", "rpc_sync", 4 * MiB),
        Case("payload", "rpc_sync", max(profile.payload_sizes)),
        Case("throughput", "rpc_async", TINY_BYTES, 8),
    ]


@dataclass
class TuneResult:
    candidates: list[Candidate]
    chosen: dict[str, Any]  # settings; {} when the defaults are fastest
    gain: list[dict[str, Any]]  # per case: defaults vs chosen, measured in the same round
    final: Any  # the SessionResult of the confirming round (or of the first, if nothing won)
    sessions: list[Any]
    finalists: list[Candidate] = field(default_factory=list)  # round 2: the combination (and auto)
    tried: dict[str, Any] = field(default_factory=dict)  # the combination round 2 measured

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "env": settings_to_env(self.chosen),
            "candidates": [candidate_dict(c) for c in self.candidates],
            "finalists": [candidate_dict(c) for c in self.finalists],
            "gain": self.gain,
            "runs": [str(s.bench_dir) for s in self.sessions],
        }


def candidate_dict(c: Candidate) -> dict[str, Any]:
    return {
        "name": c.name,
        "settings": c.settings,
        "score": c.score,
        "tolerance": c.tolerance,
        "ratios": c.ratios,
        "wins": c.wins,
    }


def interleave(specs: list, baseline) -> list:
    """rpc.0, specs[0], rpc.1, specs[1], ..., rpc.N: the defaults around every candidate."""
    from rpcctl.bench.transports.rpc import variant

    out = [variant(f"{baseline.name}.0", baseline.summary, **baseline.settings)]
    for i, spec in enumerate(specs, 1):
        out += [spec, variant(f"{baseline.name}.{i}", baseline.summary, **baseline.settings)]
    return out


def run_tuning(profile, runs_dir, *, repeats: int | None = None, console=None, launch=None) -> TuneResult:
    """Round 1: each knob alone, between two runs of the defaults. Round 2: the best knob of each
    group combined (and the ``auto`` set), again between runs of the defaults: the gain shown."""
    from dataclasses import replace

    from rpcctl.bench.runner import BenchPlan, Unit
    from rpcctl.bench.session import run_session
    from rpcctl.bench.transports import transports
    from rpcctl.bench.transports.rpc import variant

    timing = replace(profile.timing, repeats=repeats) if repeats else profile.timing
    cases = tuning_cases(profile)
    suites = tuple(dict.fromkeys(c.suite for c in cases))

    def session(candidates):
        specs = interleave(candidates, transports()["rpc"])
        units = [Unit(i, spec, 2, list(cases)) for i, spec in enumerate(specs)]
        plan = BenchPlan(profile, timing, suites, specs, units)
        result = run_session(
            plan, runs_dir, console=console, launch=launch, name="bench-tune", extra_settings={"tune": True}
        )
        rows = _rows_by_transport(result)
        between = baseline_spread([rows.get(f"rpc.{i}", []) for i in range(len(candidates) + 1)])
        scored = []
        for i, spec in enumerate(candidates, 1):
            geo, band, ratios = score(
                rows.get(spec.name, []), rows.get(f"rpc.{i - 1}", []), rows.get(f"rpc.{i}", []), between
            )
            scored.append(Candidate(spec.name, dict(spec.settings), geo, band, ratios))
        result.report.settings["defaults_spread_between_launches"] = {label_of(k): v for k, v in between.items()}
        return result, scored

    first, candidates = session([variant(name, "tuning knob", **settings) for name, settings in KNOBS.items()])
    chosen = choose(candidates)
    if not chosen:
        return TuneResult(candidates, {}, [], first, [first])

    finalists = [variant("rpc-chosen", "settings chosen by --tune", **chosen)]
    auto = transports()["rpc-tuned"]
    if dict(auto.settings) != chosen:
        finalists.append(auto)
    second, confirmed = session(finalists)
    gain = [{"case": label, "speedup": ratio} for label, ratio in (confirmed[0].ratios or {}).items()]
    # A gain that does not hold up when measured again was noise: recommend nothing then.
    return TuneResult(candidates, chosen if confirmed[0].wins else {}, gain, second, [first, second], confirmed, chosen)


def _rows_by_transport(session) -> dict[str, list]:
    rows: dict[str, list] = {}
    for row in session.report.results:
        rows.setdefault(row.transport, []).append(row)
    return rows


def write_config(path, settings: Mapping[str, Any]) -> list[str]:
    """Merge ``settings`` (as environment) into the launch config at ``path``; returns notes.

    The file is rewritten through YAML (comments are not kept), so a copy of the old one is
    left beside it as ``PATH.bak``; both are written whole, 0600, and renamed into place
    (``private.write_private_atomic``: a FIFO, a device or a link there is refused, OSError).
    """
    from pathlib import Path

    import yaml

    from rpcctl.base.private import refuse_non_regular, write_private_atomic

    path = Path(path)
    notes: list[str] = []
    data: dict[str, Any] = {}
    refuse_non_regular(path)  # never read from a FIFO (it blocks) nor written through a link or into a device
    if path.exists():
        old = path.read_text()
        loaded = yaml.safe_load(old)
        if loaded is not None and not isinstance(loaded, dict):
            from rpcctl.base.errors import UsageError

            raise UsageError(f"{path} is not a launch config (its top level is not a mapping)")
        data = loaded or {}
        write_private_atomic(path.with_name(path.name + ".bak"), old)
        notes.append(f"the previous version is in {path.name}.bak (comments are not carried over)")
    env = dict(data.get("env") or {})
    env.update(settings_to_env(settings))
    data["env"] = env
    # renamed into place: another link to it keeps the old one
    write_private_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return notes
