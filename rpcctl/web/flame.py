"""A profile kept in the run (``rpcctl profile``: speedscope JSON or a Chrome trace, as py-spy
wrote it) as a flame graph: plotly's icicle, its root at the bottom, each box a function (file
and line), as wide as the time sampled in it and under it. The page shows the latest profile
of the run (``section``); a box under ``MIN_SHARE`` of the whole is left out, and at most
``MAX_BOXES`` are drawn. Names come from the rank's own code: escaped, never markup."""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from rpcctl.inspect.profiles import profiles

MIN_SHARE = 0.002
MAX_BOXES = 3000
MAX_BYTES = 64 * 1024 * 1024  # a profile larger than this is not read for the page


def totals(path: Path) -> Counter:
    """Seconds sampled in each stack and under it (root first: a tuple of labels), from either
    format: speedscope's samples, or the Chrome trace's complete (X) spans, nested by thread."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "profiles" in data:
        return _speedscope(data)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return _chrome(events)


def _label(name: Any, file: Any, line: Any) -> str:
    where = f" ({os.path.basename(str(file))}:{line})" if file else ""
    return f"{name}{where}"


def _speedscope(data: dict) -> Counter:
    frames = [_label(f.get("name"), f.get("file"), f.get("line")) for f in data.get("shared", {}).get("frames", [])]
    out: Counter = Counter()
    for prof in data.get("profiles", []):
        if prof.get("type") != "sampled":
            continue
        for sample, weight in zip(prof.get("samples", []), prof.get("weights", [])):
            stack = tuple(frames[i] for i in sample if 0 <= i < len(frames))
            for depth in range(1, len(stack) + 1):
                out[stack[:depth]] += float(weight)
    return out


def _chrome(events: list) -> Counter:
    """X spans per thread: a span inside another (by its start and end) is its callee."""
    out: Counter = Counter()
    spans = sorted(
        (e for e in events if isinstance(e, dict) and e.get("ph") == "X"),
        key=lambda e: (e.get("pid"), e.get("tid"), e.get("ts", 0), -e.get("dur", 0)),
    )
    open_spans: list[tuple[tuple, float, str]] = []  # (thread, end, label)
    for span in spans:
        thread, ts, dur = (span.get("pid"), span.get("tid")), float(span.get("ts", 0)), float(span.get("dur", 0))
        while open_spans and (open_spans[-1][0] != thread or open_spans[-1][1] < ts + dur):
            open_spans.pop()
        args = span.get("args") or {}
        open_spans.append((thread, ts + dur, _label(span.get("name"), args.get("filename"), args.get("line"))))
        out[tuple(label for _, _, label in open_spans)] += dur / 1e6
    return out


def figure(path: Path, title: str) -> dict[str, Any]:
    """The icicle figure of one profile (root at the bottom: a flame graph)."""
    sums = totals(path)
    total = sum(seconds for prefix, seconds in sums.items() if len(prefix) == 1) or 1.0
    ids, labels, parents, values = ["root"], ["all"], [""], [total]
    index: dict[tuple, str] = {(): "root"}
    for prefix, seconds in sorted(sums.items(), key=lambda kv: (len(kv[0]), -kv[1])):
        if seconds < MIN_SHARE * total or prefix[:-1] not in index or len(ids) >= MAX_BOXES:
            continue
        index[prefix] = f"n{len(ids)}"
        ids.append(index[prefix])
        labels.append(escape(prefix[-1]))
        parents.append(index[prefix[:-1]])
        values.append(seconds)
    return {
        "area": "profile",
        "data": [
            {
                "type": "icicle",
                "ids": ids,
                "labels": labels,
                "parents": parents,
                "values": values,
                "branchvalues": "total",
                "tiling": {"orientation": "v", "flip": "y"},
                "hovertemplate": "%{label}<br>%{value:.2f} s (%{percentRoot:.1%})<extra></extra>",
                "meta": {"what": "flame"},
            }
        ],
        "layout": {"title": {"text": escape(title)}, "height": 520, "margin": {"l": 10, "r": 10, "t": 40, "b": 10}},
    }


@functools.lru_cache(maxsize=4)
def _figure(path: str, mtime_ns: int, title: str) -> dict[str, Any]:
    """The live page asks every second: a profile is read once (again only when it changes)."""
    return figure(Path(path), title)


def section(run_dir: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """The profile section's text and its flame graph (the run's latest profile), or a note."""
    kept = profiles(run_dir)
    if not kept:
        return (
            (
                '<p class="empty">No profile taken: <code>rpcctl profile --rank R --seconds S</code> '
                "samples a live rank.</p>"
            ),
            {},
        )
    latest = kept[-1]
    if latest.stat().st_size > MAX_BYTES:
        return (
            (
                f'<p class="note">{escape(latest.name)} is too large to draw here; '
                "open it in speedscope.app or ui.perfetto.dev.</p>"
            ),
            {},
        )
    try:
        drawn = _figure(str(latest), latest.stat().st_mtime_ns, f"where {latest.name.split('.')[0]} spent its time")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return f'<p class="warn">{escape(latest.name)} could not be read: {escape(str(exc))}</p>', {}
    more = f" ({len(kept)} profiles in the run's profiles/ folder)" if len(kept) > 1 else ""
    return (
        f"<p>The latest profile, {escape(latest.name)}{escape(more)}: each box a function, as wide as the time sampled "
        "in it and in what it called.</p>"
    ), {"fig-flame": drawn}
