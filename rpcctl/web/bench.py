"""A bench result (``rpcctl bench --json FILE``, or a bench run's results.json) as a view:
latency per transport, GB/s against payload size on log axes, throughput against calls in
flight, each with its noise band (the range of the per-repeat estimates)."""

from __future__ import annotations

import time
from html import escape
from collections import defaultdict
from pathlib import Path
from typing import Any

from rpcctl.bench.results import (
    SUITE_COLUMNS,
    SUITE_TITLES,
    BenchReport,
    BenchResult,
    load_report,
    sorted_for_display,
    with_ratios,
)
from rpcctl.console import iso_time
from rpcctl.web import tables
from rpcctl.web.figures import PALETTE, label, layout, log_scale_menu

BENCH_SECTIONS = (
    ("about", "Machine and settings"),
    ("latency", "Latency"),
    ("payload", "Payload"),
    ("throughput", "Throughput"),
    ("train", "Training"),
)


def _colours(results: list[BenchResult]) -> dict[str, str]:
    """A transport keeps one colour in every chart, and its noise band the colour of its line."""
    order = list(dict.fromkeys(r.transport for r in results))
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(order)}


def _translucent(colour: str, alpha: float = 0.18) -> str:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _band(result: BenchResult, scale: float = 1.0) -> tuple[float, float] | None:
    """(low, high) of the repeats, in the chart's unit."""
    estimates = [e for e in result.repeat_estimates if e is not None]
    return (min(estimates) * scale, max(estimates) * scale) if estimates else None


def _per_transport(results: list[BenchResult]) -> dict[str, list[BenchResult]]:
    grouped: dict[str, list[BenchResult]] = defaultdict(list)
    for result in results:
        grouped[result.transport].append(result)
    return grouped


def latency_figure(results: list[BenchResult], colours: dict[str, str]) -> dict[str, Any]:
    """p50 per transport and op, error bars from the repeats' range (p99 in the hover)."""
    traces = []
    for transport, rows in _per_transport(results).items():
        bands = [_band(r) for r in rows]
        traces.append(
            {
                "type": "bar",
                "name": label(transport),
                "x": [label(r.op) for r in rows],
                "y": [r.p50_us for r in rows],
                "marker": {"color": colours[transport]},
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": [max(0.0, b[1] - r.p50_us) if b else 0 for r, b in zip(rows, bands)],
                    "arrayminus": [max(0.0, r.p50_us - b[0]) if b else 0 for r, b in zip(rows, bands)],
                },
                "customdata": [r.p99_us for r in rows],
                "hovertemplate": (
                    f"{label(transport)} %{{x}}<br>p50 %{{y:.1f}} µs<br>p99 %{{customdata:.1f}} µs<extra></extra>"
                ),
                "meta": {"transport": transport},
            }
        )
    return {
        "area": "latency",
        "data": traces,
        "layout": layout(
            "Latency per transport (p50; bars: range of the repeats)",
            barmode="group",
            yaxis={"title": {"text": "µs"}, "type": "linear"},
            updatemenus=log_scale_menu(),
        ),
    }


def _line_with_band(
    transport: str, colour: str, xs: list[float], ys: list[float], bands: list[tuple[float, float] | None], hover: str
) -> list[dict[str, Any]]:
    """A line and, behind it, its noise band as a filled area between the repeats' low and high."""
    group = f"t-{transport}"
    lows = [b[0] if b else y for y, b in zip(ys, bands)]
    highs = [b[1] if b else y for y, b in zip(ys, bands)]
    return [
        {
            "type": "scatter",
            "mode": "lines",
            "x": xs + xs[::-1],
            "y": highs + lows[::-1],
            "fill": "toself",
            "fillcolor": _translucent(colour),
            "line": {"width": 0},
            "hoverinfo": "skip",
            "showlegend": False,
            "legendgroup": group,
            "name": f"{label(transport)} noise",
            "meta": {"transport": transport, "band": True},
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": xs,
            "y": ys,
            "name": label(transport),
            "legendgroup": group,
            "line": {"color": colour},
            "marker": {"color": colour},
            "hovertemplate": hover,
            "meta": {"transport": transport},
        },
    ]


def payload_figure(results: list[BenchResult], colours: dict[str, str]) -> dict[str, Any]:
    traces = []
    for transport, rows in _per_transport(results).items():
        rows = sorted((r for r in rows if r.gbps is not None and r.payload_bytes), key=lambda r: r.payload_bytes)
        if not rows:
            continue
        # GB/s from each repeat's median time: 2·bytes / p50, so the band flips (slow repeat = low GB/s).
        bands = [
            (2 * r.payload_bytes / (b[1] * 1e-6) / 1e9, 2 * r.payload_bytes / (b[0] * 1e-6) / 1e9)
            if (b := _band(r)) and b[0] > 0
            else None
            for r in rows
        ]
        traces += _line_with_band(
            transport,
            colours[transport],
            [r.payload_bytes for r in rows],
            [r.gbps for r in rows],
            bands,
            f"{label(transport)}<br>%{{x:.3s}}B<br>%{{y:.3f}} GB/s<extra></extra>",
        )
    return {
        "area": "payload",
        "data": traces,
        "layout": layout(
            "GB/s against payload size (both directions; band: range of the repeats)",
            xaxis={"title": {"text": "payload bytes"}, "type": "log"},
            yaxis={"title": {"text": "GB/s"}, "type": "log"},
        ),
    }


def throughput_figure(results: list[BenchResult], colours: dict[str, str]) -> dict[str, Any]:
    traces = []
    for transport, rows in _per_transport(results).items():
        rows = sorted((r for r in rows if r.calls_per_s is not None), key=lambda r: r.in_flight)
        if rows:
            traces += _line_with_band(
                transport,
                colours[transport],
                [r.in_flight for r in rows],
                [r.calls_per_s for r in rows],
                [_band(r) for r in rows],
                f"{label(transport)}<br>%{{x}} in flight<br>%{{y:.0f}} calls/s<extra></extra>",
            )
    return {
        "area": "throughput",
        "data": traces,
        "layout": layout(
            "Throughput against calls in flight (band: range of the repeats)",
            xaxis={
                "title": {"text": "calls in flight"},
                "type": "log",
                "tickvals": sorted({r.in_flight for r in results}),
            },
            yaxis={"title": {"text": "calls/s"}},
            updatemenus=log_scale_menu(),
        ),
    }


def train_figure(results: list[BenchResult], colours: dict[str, str]) -> dict[str, Any]:
    rows = [r for r in results if r.calls_per_s is not None]
    bands = [_band(r) for r in rows]
    return {
        "area": "train",
        "data": [
            {
                "type": "bar",
                "x": [f"{label(r.transport)} (world {r.world_size})" for r in rows],
                "y": [r.calls_per_s for r in rows],
                "marker": {"color": [colours[r.transport] for r in rows]},
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": [max(0.0, b[1] - r.calls_per_s) if b else 0 for r, b in zip(rows, bands)],
                    "arrayminus": [max(0.0, r.calls_per_s - b[0]) if b else 0 for r, b in zip(rows, bands)],
                },
                "meta": {"what": "steps_per_s"},
            }
        ],
        "layout": layout(
            "Parameter-server training steps/s (bars: range of the repeats)", yaxis={"title": {"text": "steps/s"}}
        ),
    }


_FIGURES = {
    "latency": latency_figure,
    "payload": payload_figure,
    "throughput": throughput_figure,
    "train": train_figure,
}


def bench_view(path: Path) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """The view of a bench document and the sections it has (suites without rows are left out)."""
    report: BenchReport = load_report(path)
    rows = with_ratios(list(report.results))
    machine = report.machine or {}
    about = [
        tables.facts(
            [(k, v) for k, v in machine.items()] + [(f"setting {k}", v) for k, v in (report.settings or {}).items()]
        )
    ]
    if report.notes:
        about.append("<ul>" + "".join(f"<li>{escape(str(n))}</li>" for n in report.notes) + "</ul>")
    html = {"about": "".join(about)}
    figures = {}
    colours = _colours(rows)
    sections = [BENCH_SECTIONS[0]]
    for suite, heading in BENCH_SECTIONS[1:]:
        in_suite = sorted_for_display([r for r in rows if r.suite == suite], [])
        if not in_suite:
            continue
        sections.append((suite, heading))
        html[suite] = f"<h3>{escape(SUITE_TITLES[suite])}</h3>" + tables.html_table(in_suite, SUITE_COLUMNS[suite])
        figures[f"fig-bench-{suite}"] = _FIGURES[suite](in_suite, colours)
    view = {
        "title": f"rpcctl bench: {Path(path).name}",
        "status": "bench",
        "live": False,
        "taken_at": iso_time(time.time()),
        "html": html,
        "figures": figures,
    }
    return view, tuple(sections)
