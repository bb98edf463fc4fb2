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
from typing import Any

from rpcctl import inspect
from rpcctl.console import human_bytes
from rpcctl.base.states import RankStatus, RRefState, RunStatus
from rpcctl.web.data import MAX_POINTS_PER_SERIES, RunSnapshot, thin

# plotly's default colours: one per owner or transport, the same in every chart of a page.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
STATE_COLOURS = {  # a rank's state (RankStatus) and a run's (RunStatus): the same word, the same colour
    RankStatus.RUNNING: "#1f77b4", RankStatus.SUCCEEDED: "#2ca02c", RankStatus.EXITED: "#2ca02c",
    RankStatus.FAILED: "#d62728", RankStatus.KILLED: "#ff7f0e", RankStatus.PENDING: "#bbbbbb",
    RunStatus.CANCELLED: "#ff7f0e", RunStatus.LOST: "#7f7f7f",
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
    return [{
        "type": "buttons", "direction": "left", "x": 1, "xanchor": "right", "y": -0.3, "yanchor": "top",
        "showactive": True, "pad": {"r": 0, "t": 0},
        "buttons": [
            {"label": "linear", "method": "relayout", "args": [{f"{axis}.type": "linear"}]},
            {"label": "log", "method": "relayout", "args": [{f"{axis}.type": "log"}]},
        ],
    }]


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
            points = series[name][rank] if share is None else thin(series[name][rank], min(share, MAX_POINTS_PER_SERIES))
            traces.append({
                "type": "scatter", "mode": "lines+markers" if len(points) <= 60 else "lines",
                "name": f"rank {rank}", "x": [p[0] for p in points], "y": [p[1] for p in points],
                "hovertemplate": f"rank {rank}<br>{'step' if x_title == 'step' else '#'} %{{x}}<br>{label(name)} %{{y:.6g}}<extra></extra>",
                "meta": {"rank": rank, "metric": name},
            })
        figures[f"fig-metric-{index}"] = {
            "area": "losses",
            "data": traces,
            "layout": layout(label(name), xaxis={"title": {"text": x_title}}, yaxis={"title": {"text": label(name)}, "type": "linear"},
                             updatemenus=log_scale_menu()),
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
    ``holds`` (a holder other than the creator → owner)."""
    edges: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: {"live": 0, "pending": 0, "deleted": 0, "live_bytes": 0})
    several = _several_worlds(snap)
    for ref in snap.rrefs:
        owner = _in_world(ref.owner or "?", ref.world, several)
        creator = _in_world(ref.creator, ref.world, several) if ref.creator else None
        pairs = []
        if creator and creator != owner:
            pairs.append((creator, owner, "created"))
        for holder in (_in_world(h, ref.world, several) for h in ref.holders):
            if holder != owner and holder != creator:
                pairs.append((holder, owner, "holds"))
        for pair in pairs:
            entry = edges[pair]
            entry[ref.state] += 1
            if ref.state == RRefState.LIVE:
                entry["live_bytes"] += ref.nbytes or 0
    return edges


def ownership_graph(snap: RunSnapshot) -> dict[str, Any]:
    """Workers as nodes (sized by the bytes of live values they own), edges to the owner."""
    import networkx as nx

    edges = ownership_edges(snap)
    several = _several_worlds(snap)
    owners = {_in_world(o.owner, o.world, several): o for o in snap.owners}
    graph = nx.DiGraph()
    for worker in snap.workers:
        if worker.name and not several:  # with several RPC worlds, a name alone is no node
            graph.add_node(worker.name)
    graph.add_nodes_from(owners)
    for source, target, _ in edges:
        graph.add_edge(source, target)
    nodes = sorted(graph.nodes, key=_natural)
    if not nodes:
        hidden = {"visible": False}
        return {"area": "rrefs", "data": [], "layout": layout("RRef ownership: no RRefs yet", xaxis=hidden, yaxis=hidden, height=200)}
    # A circle keeps every rank visible and the picture stable as the run grows; the spring
    # layout then pulls workers that share RRefs together.
    start = nx.circular_layout(nodes)
    position = start if len(nodes) <= 3 else nx.spring_layout(graph.to_undirected(), pos=start, seed=7, iterations=30)
    traces, annotations = [], []
    for (source, target, relation), counts in sorted(edges.items()):
        (x0, y0), (x1, y1) = (float(v) for v in position[source]), (float(v) for v in position[target])
        alive = counts["live"] + counts["pending"]
        text = (f"{label(source)} → {label(target)} ({relation})<br>live {counts['live']}, pending {counts['pending']}, "
                f"deleted {counts['deleted']}<br>live bytes {human_bytes(counts['live_bytes'])}")
        traces.append({
            "type": "scatter", "mode": "lines", "x": [x0, (x0 + x1) / 2, x1], "y": [y0, (y0 + y1) / 2, y1],
            "line": {"width": 1 + min(6, alive), "color": "#555" if alive else "#ccc", "dash": "solid" if relation == "created" else "dot"},
            "hoverinfo": "text", "text": ["", text, ""], "showlegend": False,
            "meta": {"edge": [source, target], "relation": relation, **counts},
        })
        annotations.append({
            "x": x1, "y": y1, "ax": x0, "ay": y0, "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
            "showarrow": True, "arrowhead": 3, "arrowsize": 1.5, "standoff": 22, "startstandoff": 22,
            "arrowcolor": "#555" if alive else "#ccc", "text": "",
        })
    sizes, texts, hovers = [], [], []
    for name in nodes:
        owner = owners.get(name)
        owned = owner.live_bytes if owner else 0
        sizes.append(28 + min(40, 4 * math.log2(1 + owned / 1024)) if owned else 28)
        live = owner.live if owner else 0
        texts.append(f"{label(name)}<br>{live} live, {human_bytes(owned)}")
        hovers.append(
            f"{label(name)}<br>owns {live} live RRef(s), {human_bytes(owned)}"
            + (f"<br>pending {owner.pending}, deleted {owner.deleted}, short-lived {owner.short_lived}" if owner else "")
        )
    traces.append({
        "type": "scatter", "mode": "markers+text", "x": [float(position[n][0]) for n in nodes], "y": [float(position[n][1]) for n in nodes],
        "text": texts, "textposition": "bottom center", "hovertext": hovers, "hoverinfo": "text",
        "marker": {"size": sizes, "color": "#4c78a8", "line": {"width": 1, "color": "#223"}},
        "showlegend": False, "meta": {"nodes": nodes},
    })
    hidden = {"visible": False, "range": [-1.5, 1.5]}
    return {
        "area": "rrefs",
        "data": traces,
        "layout": layout("RRef ownership",
                         xaxis=hidden, yaxis=dict(hidden, scaleanchor="x"), annotations=annotations, height=420),
    }


def rrefs_over_time(snap: RunSnapshot) -> dict[str, Any]:
    """Per owner: RRefs live at each moment (solid) and deleted so far (dotted), one colour per owner."""
    changes: dict[str, list[tuple[float, int]]] = defaultdict(list)
    several = _several_worlds(snap)
    for ref in snap.rrefs:
        created = snap.since_start(ref.created_at)
        if created is None:
            continue
        owner = _in_world(ref.owner or "?", ref.world, several)
        changes[owner].append((created, 1))
        deleted = snap.since_start(ref.deleted_at)
        if deleted is not None:
            changes[owner].append((deleted, -1))
    now = round((snap.ended or snap.taken_at) - snap.started, 3)
    traces = []
    for index, owner in enumerate(sorted(changes, key=_natural)):
        xs, live, gone = [0.0], [0], [0]
        for moment, delta in sorted(changes[owner]):
            xs.append(moment)
            live.append(live[-1] + delta)
            gone.append(gone[-1] + (delta < 0))
        xs.append(max(now, xs[-1]))
        live.append(live[-1])
        gone.append(gone[-1])
        colour = PALETTE[index % len(PALETTE)]
        for state, ys, dash in (("live", live, "solid"), ("deleted", gone, "dot")):
            traces.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "color": colour, "dash": dash},
                           "name": f"{label(owner)} {state}", "legendgroup": owner, "x": xs, "y": ys,
                           "meta": {"owner": owner, "state": state}})
    return {"area": "rrefs", "data": traces,
            "layout": layout("RRefs per owner over time: live (solid), deleted so far (dotted)",
                             xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
                             yaxis={"title": {"text": "RRefs"}, "rangemode": "tozero"})}


# ---------------------------------------------------------------------------------------------
# Placement, workers, timeline


def placement(snap: RunSnapshot) -> dict[str, Any]:
    """Ranks per device and, where there are any, the bytes of live RRef values on it."""
    devices = [label(d.device) for d in snap.devices]
    traces = [{"type": "bar", "name": "ranks", "x": devices, "y": [len(d.ranks) for d in snap.devices], "offsetgroup": 0, "width": 0.3,
               "hovertext": [f"ranks {', '.join(map(str, d.ranks)) or '-'}" for d in snap.devices], "meta": {"what": "ranks"}}]
    extra: dict[str, Any] = {}
    if any(d.rref_bytes for d in snap.devices):
        traces.append({"type": "bar", "name": "live RRef MiB", "x": devices, "y": [d.rref_bytes / 2**20 for d in snap.devices],
                       "yaxis": "y2", "offsetgroup": 1, "width": 0.3, "meta": {"what": "rref_bytes"}})
        extra["yaxis2"] = {"title": {"text": "MiB of live RRefs"}, "overlaying": "y", "side": "right", "rangemode": "tozero"}
    return {"area": "placement", "data": traces,
            "layout": layout("Placement per device", barmode="group", yaxis={"title": {"text": "ranks"}, "dtick": 1}, height=280, **extra)}


def worker_usage(snap: RunSnapshot) -> dict[str, dict[str, Any]]:
    """CPU % and RSS of every process over the run, one series per process (from its probes)."""
    series: dict[tuple, list[Any]] = defaultdict(list)
    for sample in snap.usage:
        series[(sample.rank if sample.rank is not None else -1, sample.kind != "rank", sample.pid, sample.name)].append(sample)
    figures = {}
    for key, title, unit, value in (
        ("cpu", "CPU over time", "CPU %", lambda s: s.cpu_percent),
        ("rss", "RSS over time", "MiB", lambda s: None if s.rss_bytes is None else s.rss_bytes / 2**20),
    ):
        traces = []
        for (rank, _child, pid, name), samples in sorted(series.items(), key=lambda item: item[0][:3]):
            points = thin([(snap.since_start(s.time), value(s)) for s in samples if value(s) is not None])
            who = name or (f"rank {rank} pid {pid}" if rank >= 0 else f"pid {pid}")
            traces.append({"type": "scatter", "mode": "lines+markers" if len(points) <= 60 else "lines", "name": label(who), "x": [p[0] for p in points], "y": [p[1] for p in points],
                           "hovertemplate": f"{label(who)}<br>%{{x:.1f}} s<br>%{{y:.1f}} {unit}<extra></extra>",
                           "meta": {"rank": rank, "pid": pid, "what": key}})
        figures[f"fig-usage-{key}"] = {
            "area": "workers", "data": traces,
            "layout": layout(title, xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
                             yaxis={"title": {"text": unit}, "rangemode": "tozero"}),
        }
    return figures if series else {}


def timeline(snap: RunSnapshot) -> dict[str, Any]:
    """One bar per rank and attempt from its start to its exit (or now), coloured by how it
    ended: a restarted rank has a bar per restart on its row."""
    now = round((snap.ended or snap.taken_at) - snap.started, 3)
    latest = {r.rank: r for r in snap.record.ranks}
    names, bases, lengths, colours, hovers, restarts = [], [], [], [], [], []
    for attempt in snap.rank_attempts:
        start = snap.since_start(attempt.started_at)
        if start is None:
            continue
        end = snap.since_start(attempt.ended_at)
        end = now if end is None else end
        names.append(f"rank {attempt.rank}")
        bases.append(start)
        lengths.append(max(end - start, 0.001))
        colours.append(STATE_COLOURS.get(attempt.state, "#999"))
        restarts.append(attempt.restart)
        how = f"exit code {attempt.exit_code}" if attempt.exit_code is not None else ""
        record = latest.get(attempt.rank)
        if record is not None and record.signal and attempt.restart == snap.record.restarts:
            how = f"killed by {label(record.signal)}"
        which = f" (restart {attempt.restart})" if snap.record.restarts else ""
        hovers.append(f"rank {attempt.rank}{which}: {label(attempt.state)} {how}<br>{start:.2f} s → {end:.2f} s")
    shapes, annotations = [], []
    cause = snap.record.root_cause
    if cause is not None:
        moment = snap.since_start(cause.timestamp)
        if moment is not None:
            shapes.append({"type": "line", "x0": moment, "x1": moment, "yref": "paper", "y0": 0, "y1": 1,
                           "line": {"color": "#d62728", "dash": "dash"}})
            annotations.append({"x": moment, "yref": "paper", "y": 1, "text": f"root cause: rank {cause.rank}" if cause.rank >= 0 else f"root cause: {label(cause.reason)}", "showarrow": False,
                                "font": {"color": "#d62728"}, "xanchor": "left", "yanchor": "bottom"})
    return {
        "area": "timeline",
        "data": [{"type": "bar", "orientation": "h", "y": names, "x": lengths, "base": bases, "marker": {"color": colours},
                  "hovertext": hovers, "hoverinfo": "text", "showlegend": False, "meta": {"what": "ranks"},
                  "customdata": restarts}],
        "layout": layout(f"Ranks over time (restarts: {snap.record.restarts})",
                         xaxis={"title": {"text": "seconds since start"}, "rangemode": "tozero"},
                         yaxis={"autorange": "reversed"}, shapes=shapes, annotations=annotations,
                         height=max(160, 60 + 28 * len(names))),
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
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)
