"""Plotly figure specs (plain dicts in plotly.js's JSON schema) for a run snapshot.

Each figure is ``{"data": [...], "layout": {...}, "area": SECTION}``; the page draws it with
``Plotly.react`` in the section named by ``area``. Traces carry a ``meta`` dict (rank, metric,
edge...) that says what they show, for people reading the JSON and for the browser tests.

Plotly reads a small set of tags (``<b>``, ``<br>``...), entities and ``%{...}`` placeholders
in its text, so every string that came from a rank goes through ``label()`` first: it is then
drawn literally. ``meta`` holds the raw values: it is data, never drawn, and no text a rank
wrote can name it.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rpcctl import inspect
from rpcctl.console import human_bytes
from rpcctl.base.states import RankStatus, RRefState, RunStatus
from rpcctl.web import data
from rpcctl.web.data import MAX_POINTS_PER_SERIES, RunSnapshot, process_rows, rank_ranges, thin

# plotly's default colours: one per owner or transport, the same in every chart of a page.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
STATE_COLOURS = {  # a rank's state (RankStatus) and a run's (RunStatus): the same word, the same colour
    RankStatus.RUNNING: "#1f77b4",
    RankStatus.SUCCEEDED: "#2ca02c",
    RankStatus.EXITED: "#2ca02c",
    RankStatus.FAILED: "#d62728",
    RankStatus.KILLED: "#ff7f0e",
    RankStatus.PENDING: "#bbbbbb",
    RunStatus.CANCELLED: "#ff7f0e",
    RunStatus.LOST: "#7f7f7f",
}
_BASE_LAYOUT = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "height": 340,
    "hovermode": "closest",
    "uirevision": "keep",  # the live page redraws every second: keep the reader's zoom and legend
    "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"},
    "paper_bgcolor": "white",
    "plot_bgcolor": "#fafafa",
}


def label(text: Any) -> str:
    """A rank's text as Plotly text: shown literally, never read as tags, entities or
    placeholders. Plotly fills ``%{...}`` (``%{meta.metric}``, ``%{x}``) in names, titles and
    hover templates *after* our escaping, with the raw values: a ``%`` becomes ``&#37;``, which
    plotly shows as ``%`` once the substitution is done."""
    return html.escape(str(text), quote=False).replace("%", "&#37;")


def layout(title: str, **extra: Any) -> dict[str, Any]:
    out = dict(_BASE_LAYOUT, title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}})
    out.update(extra)
    return out


def log_scale_menu(axis: str = "yaxis") -> list[dict[str, Any]]:
    """Buttons that switch an axis between linear and log scale."""
    return [
        {
            "type": "buttons",
            "direction": "left",
            "x": 1,
            "xanchor": "right",
            "y": -0.3,
            "yanchor": "top",
            "showactive": True,
            "pad": {"r": 0, "t": 0},
            "buttons": [
                {"label": "linear", "method": "relayout", "args": [{f"{axis}.type": "linear"}]},
                {"label": "log", "method": "relayout", "args": [{f"{axis}.type": "log"}]},
            ],
        }
    ]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# ---------------------------------------------------------------------------------------------
# Losses


# A report or a live view draws at most this many metric charts (``loss`` first) and this many
# points in all across them (each series an even share, thinned evenly): 200 metrics of 2,500
# steps made a 24 MB report of 201 charts. ``rpcctl report --all`` draws everything.
MAX_METRIC_CHARTS = 16
MAX_METRIC_POINTS = 100_000
MIN_SERIES_POINTS = 200


def metric_series(snap: RunSnapshot) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """metric → rank → its finite points (x, value), ``loss`` first, then the others by name."""
    series: dict[str, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    _, x_of = inspect.x_axis(snap.losses)  # the step, or the arrival index where steps repeat
    for record in snap.losses:
        if _finite(record.loss):
            series["loss"][record.rank].append((x_of(record), record.loss))
        for name, value in (record.metrics or {}).items():
            if _finite(value):
                series[str(name)][record.rank].append((x_of(record), value))
    names = (["loss"] if "loss" in series else []) + sorted(n for n in series if n != "loss")
    return {name: series[name] for name in names}


def loss_figures(snap: RunSnapshot, *, complete: bool = False) -> dict[str, dict[str, Any]]:
    """One chart per metric (``loss`` first, then every other reported metric), one series per
    rank; unless ``complete`` (every metric, every point), at most ``MAX_METRIC_CHARTS`` charts
    of ``MAX_METRIC_POINTS`` points in all."""
    x_title, _ = inspect.x_axis(snap.losses)
    series = metric_series(snap)
    names = list(series) if complete else list(series)[:MAX_METRIC_CHARTS]
    count = sum(len(series[name]) for name in names)
    share = None if complete else max(MIN_SERIES_POINTS, MAX_METRIC_POINTS // max(1, count))
    figures = {}
    for index, name in enumerate(names):
        traces = []
        for rank in sorted(series[name]):
            points = (
                series[name][rank] if share is None else thin(series[name][rank], min(share, MAX_POINTS_PER_SERIES))
            )
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers" if len(points) <= 60 else "lines",
                    "name": f"rank {rank}",
                    "x": [p[0] for p in points],
                    "y": [p[1] for p in points],
                    "hovertemplate": (
                        f"rank {rank}<br>{'step' if x_title == 'step' else '#'} "
                        f"%{{x}}<br>{label(name)} %{{y:.6g}}<extra></extra>"
                    ),
                    "meta": {"rank": rank, "metric": name},
                }
            )
        figures[f"fig-metric-{index}"] = {
            "area": "losses",
            "data": traces,
            "layout": layout(
                label(name),
                xaxis={"title": {"text": x_title}},
                yaxis={"title": {"text": label(name)}, "type": "linear"},
                updatemenus=log_scale_menu(),
            ),
        }
    return figures


# ---------------------------------------------------------------------------------------------
# RRefs: who owns what, who holds it


def _several_worlds(snap: RunSnapshot) -> bool:
    return len({ref.world for ref in snap.rrefs}) > 1


def _in_world(name: str, world: int, several: bool) -> str:
    """A worker's name where a run has several RPC worlds (mp.spawn rounds) that reuse names."""
    return f"{name} · world {world}" if several else name


def ownership_edges(snap: RunSnapshot) -> dict[tuple[str, str, str], dict[str, int]]:
    """(from, to, relation) → counts and bytes, relation ``created`` (creator → owner) or
    ``holds`` (a holder other than the creator → owner); a worker is named with its world where
    the run has several."""
    several = _several_worlds(snap)
    edges: dict[tuple[str, str, str], dict[str, int]] = {}
    for (world, source, target, relation), counts in _world_edges(snap).items():
        edges[(_in_world(source, world, several), _in_world(target, world, several), relation)] = counts
    return edges


def _counts() -> dict[str, int]:
    return {"live": 0, "pending": 0, "deleted": 0, "live_bytes": 0}


def _world_edges(snap: RunSnapshot) -> dict[tuple[int, str, str, str], dict[str, int]]:
    edges: dict[tuple[int, str, str, str], dict[str, int]] = defaultdict(_counts)
    for ref in snap.rrefs:
        owner = ref.owner or "?"
        pairs = []
        if ref.creator and ref.creator != owner:
            pairs.append((ref.creator, "created"))
        pairs += [(h, "holds") for h in ref.holders if h not in (owner, ref.creator)]
        for source, relation in pairs:
            entry = edges[(ref.world, source, owner, relation)]
            entry[ref.state] += 1
            if ref.state == RRefState.LIVE:
                entry["live_bytes"] += ref.nbytes or 0
    return edges


# The ownership picture: per RPC world (a round of mp.spawn is one), the workers that created or
# hold RRefs on another (left) and the owners (right), one row each, an edge from each to the
# owner. At most GRAPH_MAX_ROWS rows: past them the worlds are drawn as one, merged by worker
# name; a side of more than GRAPH_MAX_SIDE workers draws its busiest and one "+N more" row.
GRAPH_MAX_ROWS = 40
GRAPH_MAX_SIDE = 8
GRAPH_ROW_PX = 26
GRAPH_NAME_CHARS = 28
_MORE = "\0more"  # the key of a side's folded row (no worker is named with a NUL)


@dataclass
class _Side:
    rrefs: dict[str, int] = field(default_factory=dict)  # worker → RRefs (owned, or created/held on others)
    # owner → live, pending, deleted, live_bytes, short_lived
    owned: dict[str, dict[str, int]] = field(default_factory=dict)
    folded: int = 0  # workers in the "+N more" row
    folded_rrefs: int = 0


@dataclass
class _Panel:
    world: int | None  # None: every world, merged by name
    sources: _Side
    owners: _Side
    edges: dict[tuple[str, str, str], dict[str, int]]
    title: str | None = None


def _panels(snap: RunSnapshot) -> tuple[list[_Panel], str | None]:
    """The picture's panels (one per world, or one of every world merged by name) and what was
    merged or folded, said once."""
    worlds = sorted({ref.world for ref in snap.rrefs} | {o.world for o in snap.owners})
    edges = _world_edges(snap)

    def panel(keep: Callable[[int], bool], world: int | None) -> _Panel:
        sources, owners = _Side(), _Side()
        merged: dict[tuple[str, str, str], dict[str, int]] = defaultdict(_counts)
        for (w, source, target, relation), counts in edges.items():
            if keep(w):
                for key, n in counts.items():
                    merged[(source, target, relation)][key] += n
                sources.rrefs[source] = (
                    sources.rrefs.get(source, 0) + counts["live"] + counts["pending"] + counts["deleted"]
                )
        for o in snap.owners:
            if keep(o.world):
                entry = owners.owned.setdefault(
                    o.owner, {"live": 0, "pending": 0, "deleted": 0, "live_bytes": 0, "short_lived": 0}
                )
                for key in entry:
                    entry[key] += getattr(o, key)
                owners.rrefs[o.owner] = owners.rrefs.get(o.owner, 0) + o.live + o.pending + o.deleted
        for _, target, _ in merged:
            owners.rrefs.setdefault(target, 0)
        return _Panel(world, sources, owners, dict(merged))

    separate = [panel(lambda w, world=world: w == world, world) for world in worlds]
    rows = sum(1 + min(GRAPH_MAX_SIDE, max(len(p.sources.rrefs), len(p.owners.rrefs))) for p in separate)
    notes = []
    if len(separate) > 1 and rows + 1 <= GRAPH_MAX_ROWS:
        panels = separate
        for p in panels:
            p.title = (
                f"world {p.world}: {len(set(p.sources.rrefs) | set(p.owners.rrefs))} workers, "
                f"{sum(p.owners.rrefs.values())} RRefs"
            )
    elif len(separate) > 1:
        panels = [panel(lambda w: True, None)]
        panels[
            0
        ].title = f"all {len(worlds)} worlds, merged by worker name: {sum(panels[0].owners.rrefs.values())} RRefs"
        notes.append(f"the {len(worlds)} RPC worlds are drawn as one, each worker name once (too many to draw apart)")
    else:
        panels = separate
    for p in panels:
        _fold(p)
        for side, what in ((p.owners, "owners"), (p.sources, "creators and holders")):
            if side.folded:
                where = f" in world {p.world}" if p.world is not None and len(panels) > 1 else ""
                notes.append(f"{side.folded} more {what}{where} ({side.folded_rrefs} RRefs) share one row")
    return panels, "; ".join(notes) or None


def _fold(p: _Panel) -> None:
    """Past GRAPH_MAX_SIDE workers on a side, the busiest stay and the rest are one row."""
    for side, at in ((p.sources, 0), (p.owners, 1)):
        if len(side.rrefs) <= GRAPH_MAX_SIDE:
            continue
        ranked = sorted(side.rrefs, key=lambda n: (-side.rrefs[n], _natural(n)))
        gone = set(ranked[GRAPH_MAX_SIDE - 1 :])
        side.folded, side.folded_rrefs = len(gone), sum(side.rrefs[n] for n in gone)
        side.rrefs = {n: side.rrefs[n] for n in ranked if n not in gone} | {_MORE: side.folded_rrefs}
        more = {"live": 0, "pending": 0, "deleted": 0, "live_bytes": 0, "short_lived": 0}
        for name in gone & set(side.owned):
            for key, n in side.owned.pop(name).items():
                more[key] += n
        if at == 1:
            side.owned[_MORE] = more
        edges: dict[tuple[str, str, str], dict[str, int]] = defaultdict(_counts)
        for (source, target, relation), counts in p.edges.items():
            ends = [source, target]
            if ends[at] in gone:
                ends[at] = _MORE
            for key, n in counts.items():
                edges[(ends[0], ends[1], relation)][key] += n
        p.edges = dict(edges)


def _rrefs(n: int) -> str:
    return f"{n} RRef" if n == 1 else f"{n} RRefs"


def _short(name: str) -> str:
    return name if len(name) <= GRAPH_NAME_CHARS else name[: GRAPH_NAME_CHARS - 1] + "…"


def ownership_graph(snap: RunSnapshot) -> dict[str, Any]:
    """Per RPC world, who created or holds RRefs on whom: a row per worker, those that created
    or hold RRefs on another on the left, the owners on the right (marker sized by the bytes of
    live values they own), an edge from each to the owner (solid: created; dotted: held through
    a fork; grey: every RRef on it deleted). Rows are spaced for their labels, which never meet:
    past the bounds, worlds merge and a side's quietest workers share a "+N more" row."""
    panels, folded = _panels(snap)
    hidden = {"visible": False}
    if not any(p.owners.rrefs for p in panels):
        return {
            "area": "rrefs",
            "wide": True,
            "data": [],
            "layout": layout("RRef ownership: no RRefs yet", xaxis=hidden, yaxis=hidden, height=200),
        }
    traces: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = [
        {
            "x": 0,
            "y": 0,
            "text": "<b>created or holds</b>",
            "xanchor": "right",
            "showarrow": False,
            "font": {"size": 12, "color": "#555"},
        },
        {
            "x": 1,
            "y": 0,
            "text": "<b>owner</b>",
            "xanchor": "left",
            "showarrow": False,
            "font": {"size": 12, "color": "#555"},
        },
    ]
    nodes: dict[str, dict[str, list[Any]]] = {
        side: {"x": [], "y": [], "text": [], "hovertext": [], "size": [], "names": []} for side in ("holder", "owner")
    }
    row = 1
    for p in panels:
        if p.title:
            annotations.append(
                {
                    "x": 0.5,
                    "y": -row,
                    "text": label(p.title),
                    "xanchor": "center",
                    "showarrow": False,
                    "font": {"size": 12, "color": "#1d2b3a"},
                }
            )
            row += 1
        where = f" (world {p.world})" if p.world is not None and len(panels) > 1 else ""
        ys: dict[tuple[int, str], float] = {}
        for at, (side, kind) in enumerate(((p.sources, "holder"), (p.owners, "owner"))):
            names = sorted((n for n in side.rrefs if n != _MORE), key=_natural) + (
                [_MORE] if _MORE in side.rrefs else []
            )
            for index, name in enumerate(names):
                y = -(row + index)
                ys[(at, name)] = y
                shown = f"+{side.folded} more" if name == _MORE else _short(name)
                entry = nodes[kind]
                entry["x"].append(at)
                entry["y"].append(y)
                entry["names"].append(None if name == _MORE else name)
                if kind == "owner":
                    owned = side.owned.get(
                        name, {"live": 0, "pending": 0, "deleted": 0, "live_bytes": 0, "short_lived": 0}
                    )
                    entry["text"].append(
                        f"{label(shown)}  ·  {_rrefs(side.rrefs[name])}, {owned['live']} live, "
                        f"{human_bytes(owned['live_bytes'])}"
                    )
                    entry["hovertext"].append(
                        f"{label(name if name != _MORE else f'{side.folded} more owners')}{where}"
                        f"<br>owns {side.rrefs[name]} RRef(s): "
                        f"live {owned['live']}, pending {owned['pending']}, deleted {owned['deleted']}, "
                        f"short-lived {owned['short_lived']}"
                        f"<br>live bytes {human_bytes(owned['live_bytes'])}"
                    )
                    kib = owned["live_bytes"] / 1024
                    entry["size"].append(10 + min(10.0, 2 * math.log2(1 + kib)))
                else:
                    entry["text"].append(f"{label(shown)}  ·  {_rrefs(side.rrefs[name])}  ")
                    entry["hovertext"].append(
                        f"{label(name if name != _MORE else f'{side.folded} more workers')}{where}"
                        f"<br>created or holds {side.rrefs[name]} RRef(s) of other owners"
                    )
                    entry["size"].append(10)
        row += max(len(p.sources.rrefs), len(p.owners.rrefs))
        for (source, target, relation), counts in sorted(p.edges.items()):
            y0, y1 = ys[(0, source)], ys[(1, target)]
            alive = counts["live"] + counts["pending"]
            ends = [
                source if source != _MORE else f"+{p.sources.folded} more",
                target if target != _MORE else f"+{p.owners.folded} more",
            ]
            text = (
                f"{label(ends[0])} → {label(ends[1])}{where} ({relation})"
                f"<br>live {counts['live']}, pending {counts['pending']}, "
                f"deleted {counts['deleted']}<br>live bytes {human_bytes(counts['live_bytes'])}"
            )
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": [0, 0.5, 1],
                    "y": [y0, (y0 + y1) / 2, y1],
                    "line": {
                        "width": 1 + min(5, alive),
                        "color": "#555" if alive else "#bbb",
                        "dash": "solid" if relation == "created" else "dot",
                    },
                    "hoverinfo": "text",
                    "text": ["", text, ""],
                    "showlegend": False,
                    "meta": {"edge": ends, "relation": relation, "world": p.world, **counts},
                }
            )
    for kind, entry in nodes.items():
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "x": entry["x"],
                "y": entry["y"],
                "text": entry["text"],
                "textposition": "middle left" if kind == "holder" else "middle right",
                "hovertext": entry["hovertext"],
                "hoverinfo": "text",
                "cliponaxis": False,
                "textfont": {"size": 12},
                "marker": {
                    "size": entry["size"],
                    "color": "#4c78a8" if kind == "owner" else "#9ecae9",
                    "line": {"width": 1, "color": "#223"},
                },
                "showlegend": False,
                "meta": {"side": kind, "nodes": entry["names"]},
            }
        )
    title = "RRef ownership" + (f": {len(panels)} RPC worlds" if len(panels) > 1 else "")
    return {
        "area": "rrefs",
        "wide": True,
        "data": traces,
        "layout": layout(
            title,
            xaxis=dict(hidden, range=[-1.4, 2.4], fixedrange=True),
            yaxis=dict(hidden, range=[-(row - 0.5), 0.6], fixedrange=True),
            annotations=annotations,
            margin={"l": 10, "r": 10, "t": 40, "b": 10},
            height=60 + GRAPH_ROW_PX * row,
            meta={"rows": row, "folded": folded, "worlds": [p.world for p in panels]},
        ),
    }


# Series of the RRefs-over-time chart: one per owner up to this many, else one per world, else
# the run's total and its busiest owners; the legend names what each series sums.
MAX_OWNER_SERIES = 8


def rrefs_over_time(snap: RunSnapshot) -> dict[str, Any]:
    """Per owner: RRefs live at each moment (solid) and deleted so far (dotted), one colour per
    owner (one legend entry for both). Past MAX_OWNER_SERIES owners, a series per world (a round
    of mp.spawn), or per worker name across the worlds (rounds reuse names), or else all owners
    together and the busiest owners alone."""
    several = _several_worlds(snap)
    owners: dict[str, list[Any]] = defaultdict(list)
    for ref in snap.rrefs:
        owners[_in_world(ref.owner or "?", ref.world, several)].append(ref)
    worlds = {ref.world for ref in snap.rrefs}
    if len(owners) <= MAX_OWNER_SERIES:
        series = {owner: refs for owner, refs in owners.items()}
        what = "owner"
    elif len(worlds) <= MAX_OWNER_SERIES:
        series = defaultdict(list)
        for ref in snap.rrefs:
            series[f"world {ref.world} ({len({r.owner for r in snap.rrefs if r.world == ref.world})} owners)"].append(
                ref
            )
        what = "world"
    elif len({ref.owner for ref in snap.rrefs}) <= MAX_OWNER_SERIES:  # mp.spawn rounds reuse their names
        series = defaultdict(list)
        for ref in snap.rrefs:
            series[f"{ref.owner or '?'} (all {len(worlds)} worlds)"].append(ref)
        what = "worker name, across worlds"
    else:
        busiest = sorted(owners, key=lambda o: (-len(owners[o]), _natural(o)))[: MAX_OWNER_SERIES - 1]
        series = {f"all {len(owners)} owners": list(snap.rrefs), **{owner: owners[owner] for owner in busiest}}
        what = "busiest owner"
    now = round((snap.ended or snap.taken_at) - snap.started, 3)
    traces = []
    names = list(series) if what == "busiest owner" else sorted(series, key=_natural)
    for index, name in enumerate(names):
        changes: list[tuple[float, int]] = []
        for ref in series[name]:
            created = snap.since_start(ref.created_at)
            if created is None:
                continue
            changes.append((created, 1))
            deleted = snap.since_start(ref.deleted_at)
            if deleted is not None:
                changes.append((deleted, -1))
        xs, live, gone = [0.0], [0], [0]
        for moment, delta in sorted(changes):
            xs.append(moment)
            live.append(live[-1] + delta)
            gone.append(gone[-1] + (delta < 0))
        xs.append(max(now, xs[-1]))
        live.append(live[-1])
        gone.append(gone[-1])
        colour = PALETTE[index % len(PALETTE)]
        for state, ys, dash in ((RRefState.LIVE, live, "solid"), (RRefState.DELETED, gone, "dot")):
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "line": {"shape": "hv", "color": colour, "dash": dash},
                    "name": label(name),
                    "legendgroup": name,
                    "showlegend": state == RRefState.LIVE,
                    "x": xs,
                    "y": ys,
                    "hovertemplate": f"{label(name)} {state}<br>%{{x:.1f}} s: %{{y}}<extra></extra>",
                    "meta": {"owner": name, "state": state, "series": what},
                }
            )
    return {
        "area": "rrefs",
        "wide": True,
        "data": traces,
        "layout": layout(
            f"RRefs over time, per {what}: live (solid), deleted so far (dotted)",
            xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
            yaxis={"title": {"text": "RRefs"}, "rangemode": "tozero", "ticklabelstandoff": 6},
            legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},
            margin=dict(_BASE_LAYOUT["margin"], r=220),
        ),
    }


# ---------------------------------------------------------------------------------------------
# Placement, workers, timeline


def placement(snap: RunSnapshot) -> dict[str, Any]:
    """Ranks per device and, where there are any, the bytes of live RRef values on it."""
    devices = [label(d.device) for d in snap.placement]
    traces = [
        {
            "type": "bar",
            "name": "ranks",
            "x": devices,
            "y": [len(d.ranks) for d in snap.placement],
            "offsetgroup": 0,
            "width": 0.3,
            "hovertext": [label(rank_ranges(d.ranks)) for d in snap.placement],
            "meta": {"what": "ranks"},
        }
    ]
    extra: dict[str, Any] = {}
    if any(d.rref_bytes for d in snap.placement):
        traces.append(
            {
                "type": "bar",
                "name": "live RRef MiB",
                "x": devices,
                "y": [d.rref_bytes / 2**20 for d in snap.placement],
                "yaxis": "y2",
                "offsetgroup": 1,
                "width": 0.3,
                "meta": {"what": "rref_bytes"},
            }
        )
        extra["yaxis2"] = {
            "title": {"text": "MiB of live RRefs"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        }
    return {
        "area": "placement",
        "data": traces,
        "layout": layout(
            "Placement per device",
            barmode="group",
            yaxis={
                "title": {"text": "ranks"},
                **({"dtick": 1} if max((len(d.ranks) for d in snap.placement), default=0) <= 10 else {}),
            },
            height=280,
            **extra,
        ),
    }


def worker_usage(snap: RunSnapshot) -> dict[str, dict[str, Any]]:
    """CPU % and RSS of every process over the run, one series per process (from its probes)."""
    series: dict[tuple, list[Any]] = defaultdict(list)
    for sample in snap.usage:
        series[(sample.rank if sample.rank is not None else -1, sample.kind != "rank", sample.pid, sample.name)].append(
            sample
        )
    figures = {}
    for key, title, unit, value in (
        ("cpu", "CPU over time", "CPU %", lambda s: s.cpu_percent),
        ("rss", "RSS over time", "MiB", lambda s: None if s.rss_bytes is None else s.rss_bytes / 2**20),
    ):
        traces = []
        for (rank, _child, pid, name), samples in sorted(series.items(), key=lambda item: item[0][:3]):
            points = thin([(snap.since_start(s.time), value(s)) for s in samples if value(s) is not None])
            who = name or (f"rank {rank} pid {pid}" if rank >= 0 else f"pid {pid}")
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers" if len(points) <= 60 else "lines",
                    "name": label(who),
                    "x": [p[0] for p in points],
                    "y": [p[1] for p in points],
                    "hovertemplate": f"{label(who)}<br>%{{x:.1f}} s<br>%{{y:.1f}} {unit}<extra></extra>",
                    "meta": {"rank": rank, "pid": pid, "what": key},
                }
            )
        figures[f"fig-usage-{key}"] = {
            "area": "workers",
            "data": traces,
            "layout": layout(
                title,
                xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
                yaxis={"title": {"text": unit}, "rangemode": "tozero", "ticklabelstandoff": 6},
            ),
        }
    return figures if series else {}


def timeline(snap: RunSnapshot) -> dict[str, Any]:
    """One row per process, each rank followed by the processes it spawned (by world, then
    name), a bar for its life from its start to its end (or now), coloured by how it ended, the
    ending in its label; a restarted rank has a bar per restart on its row. Past
    ``data.MAX_TIMELINE_ROWS`` rows, processes share rows by world or rank (``process_rows``),
    and the title says how many processes the rows hold."""
    story = process_rows(snap)
    per_state: dict[str, dict[str, list[Any]]] = {}
    for row in story.rows:
        for life in row.lives:
            bars = per_state.setdefault(life.state, {"y": [], "x": [], "base": [], "hovertext": [], "customdata": []})
            name = snap.attempt_name(life.restart, snap.started + life.start)
            which = f" ({name})" if name else ""
            who = f"{label(row.label.rsplit(': ', 1)[0])}{which}"
            count = f" ({row.members} processes)" if row.members > 1 else (f", pid {life.pid}" if life.pid else "")
            bars["y"].append(label(row.label))
            bars["x"].append(max(life.end - life.start, 0.001))
            bars["base"].append(life.start)
            bars["hovertext"].append(f"{who}{count}: {label(life.how)}<br>{life.start:.2f} s → {life.end:.2f} s")
            bars["customdata"].append(life.restart)
    traces = [
        {
            "type": "bar",
            "orientation": "h",
            "name": label(state),
            **bars,
            "marker": {"color": STATE_COLOURS.get(state, "#999")},
            "hoverinfo": "text",
            "meta": {"what": "processes", "state": state},
        }
        for state, bars in sorted(per_state.items(), key=lambda item: data.severity(item[0]))
    ]
    shapes, annotations = [], []
    cause = snap.record.root_cause
    if cause is not None:
        moment = snap.since_start(cause.timestamp)
        if moment is not None:
            shapes.append(
                {
                    "type": "line",
                    "x0": moment,
                    "x1": moment,
                    "yref": "paper",
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#d62728", "dash": "dash"},
                }
            )
            annotations.append(
                {
                    "x": moment,
                    "yref": "paper",
                    "y": 1,
                    "text": f"root cause: rank {cause.rank}"
                    if cause.rank >= 0
                    else f"root cause: {label(cause.reason)}",
                    "showarrow": False,
                    "font": {"color": "#d62728"},
                    "xanchor": "left",
                    "yanchor": "bottom",
                }
            )
    spawned = f", {story.spawned} spawned" if story.spawned else ""
    shared = f" in {len(story.rows)} rows" if story.grouped else ""
    rows = [label(row.label) for row in story.rows]
    return {
        "area": "timeline",
        "data": traces,
        "layout": layout(
            (
                f"Processes over time: {story.ranks} rank{'s' if story.ranks != 1 else ''}{spawned}{shared} "
                f"(restarts: {snap.record.restarts})"
            ),
            xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
            yaxis={
                "autorange": "reversed",
                "type": "category",
                "categoryorder": "array",
                "categoryarray": rows,
                "automargin": True,
                "tickfont": {"size": 11},
            },
            barmode="overlay",
            bargap=0.25,
            shapes=shapes,
            annotations=annotations,
            legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
            margin=dict(_BASE_LAYOUT["margin"], b=90),
            meta={"rows": len(rows), "processes": story.processes, "grouped": story.grouped},
            height=max(180, 110 + 20 * len(rows)),
        ),
    }


def run_figures(snap: RunSnapshot, *, complete: bool = False) -> dict[str, dict[str, Any]]:
    figures = {"fig-timeline": timeline(snap)}
    figures.update(loss_figures(snap, complete=complete))
    figures["fig-rref-graph"] = ownership_graph(snap)
    figures["fig-rref-time"] = rrefs_over_time(snap)
    figures["fig-placement"] = placement(snap)
    figures.update(worker_usage(snap))
    return figures


def _natural(name: str) -> tuple:
    """worker2 before worker10."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)
