"""Result records, the report document, and its table.

The ``--json`` document (and ``results.json`` in the bench's run directory)::

    {"results": [BenchResult...], "machine": {...}, "settings": {...}, "notes": [...]}

Each result carries the keys of the issue's schema (``transport``, ``op``, ``payload_bytes``,
``p50_us``, ``p99_us``, ``gbps``, ``calls_per_s``, ``n``) plus the rest of its statistics. Units
are raw: microseconds for times, GB/s as 1e9 bytes per second, calls (or training steps) per
second. A figure that does not apply to a suite is ``null``:

=============  ======================================================  ========================
suite          p50_us / p99_us                                         gbps / calls_per_s
=============  ======================================================  ========================
latency        time of one round trip                                  null / null
payload        time of one round trip (echo of ``payload_bytes``)      2·bytes / p50 time; null
throughput     time from issue to reply, ``in_flight`` outstanding     null / median over repeats
train          time of one training step on a trainer                  null / steps/s, all trainers
=============  ======================================================  ========================

``vs_rpc`` is this row's speed relative to the ``rpc`` row (TensorPipe defaults) of the same
case: >1 means faster. Speed is 1/p50 for latency and payload, calls/s for throughput and train.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rpcctl.bench.stats import is_noisy, spread, summarize
from rpcctl.console import HIGH, KEY, Column, bandwidth_scale, human_bytes, rate_scale, render_table

BASELINE = "rpc"
# The rpc op a row of another transport is compared with, per suite.
BASELINE_OP = {
    "latency": "rpc_sync",
    "payload": "rpc_sync",
    "throughput": "rpc_async",
    "train": "train_step",
    "startup": "first_call",
}
# Collectives are compared with torch's own gloo collective of the same op and size, never with rpc.
COLLECTIVE_BASELINE = "gloo"
RATE_SUITES = frozenset({"throughput", "train"})  # speed is calls/s; elsewhere it is 1/p50


def fmt_us(us: float) -> str:
    if us < 1000:
        return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e4:
        return f"{value / 1e3:.1f} k"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}×" if value < 100 else f"{value:.0f}×"


@dataclass
class RowId:
    """Which row: a transport and a case. Shared by results and comparisons."""

    suite: str
    transport: str
    op: str
    payload_bytes: int | None
    in_flight: int
    world_size: int

    def row_id(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(RowId)}


@dataclass
class BenchResult(RowId):
    # Figures are None only on a row that is not supported (``reason`` says why).
    n: int | None  # timed calls (all repeats); launches for startup
    repeats: int
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    min_us: float | None
    max_us: float | None
    mean_us: float | None
    gbps: float | None
    calls_per_s: float | None
    spread: float  # range of the per-repeat estimates / their median
    noisy: bool
    repeat_estimates: list[float] = field(default_factory=list)  # per repeat: p50 (µs) or calls/s
    bytes_per_call: int | None = None  # bytes that crossed, both ways, in the checked round trip
    vs_rpc: float | None = None
    kind: str = ""  # point-to-point | collective | training | startup (from the suite)
    supported: bool = True
    reason: str | None = None  # why not, on a row that is not supported ("not supported: ...")
    vs_gloo: float | None = None  # collectives: speed over gloo's same collective of the same size
    parts_us: dict[str, float] | None = None  # startup: median import / init / first call

    def __post_init__(self) -> None:
        if not self.kind:
            from rpcctl.bench.suites import KIND

            self.kind = KIND.get(self.suite, self.suite)

    @property
    def key(self) -> tuple:
        return (self.suite, self.op, self.payload_bytes, self.in_flight, self.world_size)

    @property
    def speed(self) -> float | None:
        """Bigger is better: calls/s for rate suites, 1/p50 otherwise."""
        if self.suite in RATE_SUITES:
            return self.calls_per_s
        return 1e6 / self.p50_us if self.p50_us else None

    @property
    def noise(self) -> str:
        """Half the range of the repeats around their median; ``*`` marks a noisy row."""
        if not self.supported:
            return "not supported"
        text = f"±{self.spread * 50:.0f}%" if math.isfinite(self.spread) else "±?"
        return f"{text}*" if self.noisy else text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# The table's columns, per suite, beside the record they read (every key is a BenchResult
# field or property: tests/test_bench.py checks).
_TRANSPORT = Column("transport", "TRANSPORT", priority=KEY)
_OP = Column("op", "OP", priority=KEY)
_P50 = Column("p50_us", "P50", fmt_us, "right", priority=KEY)
_P90 = Column("p90_us", "P90", fmt_us, "right", detail=True)
_P99 = Column("p99_us", "P99", fmt_us, "right")
_MIN = Column("min_us", "MIN", fmt_us, "right", detail=True)
_MAX = Column("max_us", "MAX", fmt_us, "right", detail=True)
_N = Column("n", "N", str, "right", detail=True)
_NOISE = Column("noise", "NOISE", justify="right")
_VS = Column("vs_rpc", "VS RPC", fmt_ratio, "right")
_VS_GLOO = Column("vs_gloo", "VS GLOO", fmt_ratio, "right")
_GBPS = Column("gbps", "BANDWIDTH", bandwidth_scale, "right", priority=HIGH)
_PAYLOAD = Column("payload_bytes", "PAYLOAD", human_bytes, "right", priority=KEY)

SUITE_COLUMNS: dict[str, list[Column]] = {
    "latency": [_TRANSPORT, _OP, _P50, _P90, _P99, _MIN, _MAX, _VS, _N, _NOISE],
    "payload": [_PAYLOAD, _TRANSPORT, _OP, _GBPS, _P50, _P90, _P99, _MIN, _MAX, _VS, _N, _NOISE],
    "collective": [_PAYLOAD, _TRANSPORT, _OP, _GBPS, _P50, _P90, _P99, _MIN, _MAX, _VS_GLOO, _N, _NOISE],
    "startup": [_TRANSPORT, _P50, _P99, _MIN, _MAX, _VS, Column("n", "LAUNCHES", str, "right"), _NOISE],
    "throughput": [
        Column("in_flight", "IN FLIGHT", str, "right", priority=KEY),
        _TRANSPORT,
        _OP,
        Column("calls_per_s", "CALLS/S", rate_scale, "right", priority=KEY),
        _P50,
        _P90,
        _P99,
        _MAX,
        _VS,
        _N,
        _NOISE,
    ],
    "train": [
        Column("world_size", "WORLD", str, "right", priority=KEY),
        _TRANSPORT,
        _OP,
        Column("calls_per_s", "STEPS/S", rate_scale, "right", priority=KEY),
        _P50,
        _P90,
        _P99,
        _MAX,
        _VS,
        _N,
        _NOISE,
    ],
}


def unsupported_result(transport: str, case: Any, reason: str) -> dict:
    """The row of a case the transport cannot do: every figure null, and why."""
    return BenchResult(
        suite=case.suite,
        transport=transport,
        op=case.op,
        payload_bytes=case.payload_bytes,
        in_flight=case.in_flight,
        world_size=case.world_size,
        n=None,
        repeats=0,
        p50_us=None,
        p90_us=None,
        p99_us=None,
        min_us=None,
        max_us=None,
        mean_us=None,
        gbps=None,
        calls_per_s=None,
        spread=0.0,
        noisy=False,
        supported=False,
        reason=reason if reason.startswith("not supported") else f"not supported: {reason}",
    ).to_dict()


def merge_measurements(parts: list[dict]) -> dict:
    """One case measured in several launches (rounds): every timed call and every repeat pooled."""
    merged = {
        key: [v for part in parts for v in part[key]] for key in ("samples_s", "repeat_medians_s", "repeat_rates")
    }
    merged["calls_per_repeat"] = parts[0].get("calls_per_repeat")
    merged["warmup_calls"] = sum(part.get("warmup_calls") or 0 for part in parts)
    if any(part.get("parts_s") for part in parts):
        names = dict.fromkeys(k for part in parts for k in (part.get("parts_s") or {}))
        merged["parts_s"] = {k: [v for part in parts for v in (part.get("parts_s") or {}).get(k, [])] for k in names}
    return merged


def result_from_measurement(transport: str, case: Any, measured: dict, bytes_per_call: int | None) -> dict:
    """A ``BenchResult`` (as a dict) from a measurement: the one place raw timings become figures."""
    summary = summarize(measured["samples_s"])
    rates = list(measured["repeat_rates"])
    medians = list(measured["repeat_medians_s"])
    rate_suite = case.suite in RATE_SUITES
    estimates = rates if rate_suite else [m * 1e6 for m in medians]
    noise = spread(estimates)
    gbps = None
    if case.suite == "payload" and case.payload_bytes:
        gbps = 2 * case.payload_bytes / summary.p50 / 1e9
    elif case.suite == "collective" and case.payload_bytes:
        gbps = case.payload_bytes / summary.p50 / 1e9  # each rank's buffer per call (nccl-tests' algbw)
    parts = measured.get("parts_s")
    result = BenchResult(
        suite=case.suite,
        transport=transport,
        op=case.op,
        payload_bytes=case.payload_bytes,
        in_flight=case.in_flight,
        world_size=case.world_size,
        n=summary.n,
        repeats=len(estimates),
        p50_us=summary.p50 * 1e6,
        p90_us=summary.p90 * 1e6,
        p99_us=summary.p99 * 1e6,
        min_us=summary.min * 1e6,
        max_us=summary.max * 1e6,
        mean_us=summary.mean * 1e6,
        gbps=gbps,
        calls_per_s=statistics.median(rates) if rate_suite else None,
        spread=noise,
        noisy=is_noisy(noise),
        repeat_estimates=estimates,
        bytes_per_call=bytes_per_call,
        parts_us={k: statistics.median(v) * 1e6 for k, v in parts.items() if v} if parts else None,
    )
    return result.to_dict()


def _match_key(r: BenchResult, op: str | None) -> tuple:
    # World size is part of the case only for train; point-to-point rows compare across it
    # (memcpy runs in one process, the others in two).
    return (r.suite, op, r.payload_bytes, r.in_flight, r.world_size if r.suite == "train" else None)


def with_ratios(results: list[BenchResult]) -> list[BenchResult]:
    """Fill ``vs_rpc`` from the ``rpc`` rows of the same cases, and a collective's ``vs_gloo``
    from gloo's same collective (collectives get no ``vs_rpc``: unlike operations)."""
    base = {_match_key(r, r.op): r for r in results if r.transport == BASELINE}
    gloo = {_match_key(r, r.op): r for r in results if r.transport == COLLECTIVE_BASELINE and r.suite == "collective"}
    for r in results:
        if r.suite == "collective":
            ref = gloo.get(_match_key(r, r.op))
            r.vs_rpc = None
            r.vs_gloo = r.speed / ref.speed if ref is not None and ref.speed and r.speed else None
            continue
        ref = base.get(_match_key(r, r.op)) or base.get(_match_key(r, BASELINE_OP.get(r.suite)))
        r.vs_rpc = r.speed / ref.speed if ref is not None and ref.speed and r.speed else None
    return results


# -- the document ------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """Facts that decide how comparable two runs are (and how quiet this one was)."""
    import psutil

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "transparent_hugepages": _read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        info["torch"] = None
    try:
        from importlib.metadata import version

        info["ray"] = version("ray")
    except Exception:
        info["ray"] = None
    from rpcctl import __version__

    info["rpcctl"] = __version__
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _read_first_line(path: str) -> str | None:
    try:
        return Path(path).read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None


@dataclass
class BenchReport:
    results: list[BenchResult]
    machine: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [r.to_dict() for r in self.results],
            "machine": self.machine,
            "settings": self.settings,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise ValueError("not a bench document: expected an object with a 'results' list")
        return cls(
            results=[BenchResult.from_dict(_fill_defaults(r)) for r in data["results"]],
            machine=dict(data.get("machine") or {}),
            settings=dict(data.get("settings") or {}),
            notes=list(data.get("notes") or []),
        )

    def save(self, path: Path) -> None:
        from rpcctl.console import to_jsonable
        from rpcctl.records.runs import write_json_atomic

        write_json_atomic(path, to_jsonable(self.to_dict()))


def _fill_defaults(row: dict[str, Any]) -> dict[str, Any]:
    """Accept the issue's minimal schema too (only the required keys)."""
    row = dict(row)
    if row.get("supported") is False:
        return row
    p50 = row.get("p50_us")
    p99 = row.get("p99_us", p50)
    defaults = {
        "suite": _infer_suite(row),
        "in_flight": 1,
        "world_size": 2,
        "repeats": 1,
        "p90_us": p50,
        "min_us": p50,
        "max_us": p99,
        "mean_us": p50,
        "gbps": None,
        "calls_per_s": None,
        "spread": 0.0,
        "noisy": False,
        "n": 0,
    }
    for key, value in defaults.items():
        if row.get(key) is None:
            row[key] = value
    return row


def _infer_suite(row: dict[str, Any]) -> str:
    if row.get("gbps") is not None:
        return "payload"
    if row.get("calls_per_s") is not None:
        return "throughput"
    return "latency"


def load_report(path: Path) -> BenchReport:
    from rpcctl.base.errors import UsageError

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        return BenchReport.from_dict(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: {exc}") from None


# -- the table ---------------------------------------------------------------------------------


SUITE_TITLES = {
    "latency": "latency: one round trip, 8-byte payload (point-to-point)",
    "payload": "payload: echo, GB/s counts bytes both ways (point-to-point)",
    "throughput": "throughput: calls/s with N in flight, 8-byte payload (point-to-point)",
    "collective": (
        "collective: every rank takes part, GB/s = size / p50; VS GLOO against torch's gloo (never ranked "
        "against point-to-point)"
    ),
    "train": "train: parameter-server steps/s (all trainers), world = 1 server + trainers",
    "startup": "startup: a fresh process (spawn): import + init to first call, one sample per launch",
}


def sorted_for_display(results: list[BenchResult], order: list[str]) -> list[BenchResult]:
    """Within a suite: by case (payload size, in flight, world size), then transport order."""
    rank = {name: i for i, name in enumerate(order)}
    return sorted(
        results,
        key=lambda r: (
            r.payload_bytes or 0,
            r.in_flight,
            r.world_size if r.suite == "train" else 0,
            rank.get(r.transport, len(rank)),
            r.transport,
            r.op,
        ),
    )


def render_report(report: BenchReport, *, detail: bool = False, order: list[str] | None = None) -> list:
    """One table per suite (in suite order), for ``Console.print``."""
    from rpcctl.bench.suites import SUITES

    order = order or []
    rows = with_ratios(list(report.results))
    tables = []
    for suite in SUITES:
        in_suite = sorted_for_display([r for r in rows if r.suite == suite], order)
        if not in_suite:
            continue
        tables.append(render_table(in_suite, SUITE_COLUMNS[suite], title=SUITE_TITLES[suite], detail=detail))
    return tables
