"""One HTML document for a view: plotly.js inlined, the view's data as JSON, a small script
that draws it (``Plotly.react``) and, on the live page, polls for the next view.

A *view* is ``{"title", "status", "live", "taken_at", "html": {section: HTML}, "figures":
{id: figure}}``: ``run_view`` (a run) and ``rpcctl.web.bench.bench_view`` (a bench result)
make one. The document works from a file with no network: its Content-Security-Policy allows
only its own inline scripts (by nonce) and no connection anywhere, except ``'self'`` on the
live page.
"""

from __future__ import annotations

import functools
import json
import secrets
from html import escape
from pathlib import Path
from typing import Any

from rpcctl.console import iso_time, to_jsonable
from rpcctl.base.errors import UsageError
from rpcctl.web import figures, flame, tables
from rpcctl.web.data import run_snapshot

INSTALL_HINT = "pip install 'rpcctl[report]'"


def run_sections() -> tuple[tuple[str, str], ...]:
    """(section id, heading) of a run's page: the run, its timeline, each view of
    ``inspect.VIEWS`` (its name, its title), the profile. A section holds its charts (data-area)
    above its text."""
    from rpcctl import inspect

    return (
        ("summary", "Run"),
        ("timeline", "Timeline"),
        *((v.name, v.title) for v in inspect.VIEWS),
        ("profile", "Profile"),
    )


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as the plotly Python package ships it (one pinned, offline copy)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UsageError(f"the HTML report needs plotly, which is not installed: {INSTALL_HINT}") from None
    return get_plotlyjs()


def require_plotly() -> None:
    """Fail early (exit 2, nothing started) when the extra is missing."""
    plotly_js()


def run_view(run_dir: Path, *, complete: bool = False) -> dict[str, Any]:
    """``complete``: every metric's chart with every point (``rpcctl report --all``); else at
    most ``figures.MAX_METRIC_CHARTS`` charts, thinned, and a note says what was left out."""
    snap = run_snapshot(run_dir)
    html = tables.run_sections(snap)
    html["profile"], flames = flame.section(run_dir)  # the latest `rpcctl profile`, a flame graph
    hidden = 0 if complete else len(figures.metric_series(snap)) - figures.MAX_METRIC_CHARTS
    if hidden > 0:
        html["losses"] += (
            f'<p class="note">{hidden} more metric(s) not drawn: the first {figures.MAX_METRIC_CHARTS} are '
            "(rpcctl report --all draws every metric and every point).</p>"
        )
    drawn = figures.run_figures(snap, complete=complete)
    folded = drawn["fig-rref-graph"]["layout"].get("meta", {}).get("folded")
    if folded:
        html["rrefs"] = (
            f'<p class="note graph-folded">Not drawn apart: {escape(folded)} '
            "(<code>rpcctl inspect rrefs</code> lists every RRef).</p>"
        ) + html["rrefs"]
    return {
        "title": f"{snap.record.run_id}: {snap.status}",
        "status": snap.status,
        "live": snap.live,
        "taken_at": iso_time(snap.taken_at),
        "html": html,
        "figures": {**drawn, **flames},
    }


def view_json(view: dict[str, Any]) -> str:
    """The view as JSON that is safe inside a <script> element (no '<', '>' or '&' in it)."""
    text = json.dumps(to_jsonable(view), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(view: dict[str, Any], sections: tuple[tuple[str, str], ...] | None = None, *, api: str | None = None) -> str:
    """The whole document (``sections``: a run's, ``run_sections()``, unless given). ``api``: the
    live page's polling path (relative, token appended by the script from the page's own URL);
    None for a static file."""
    sections = run_sections() if sections is None else sections
    nonce = secrets.token_urlsafe(16)
    connect = "'self'" if api else "'none'"
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
        f"connect-src {connect}; base-uri 'none'; form-action 'none'"
    )
    nav = " ".join(f'<a href="#sec-{sid}">{escape(heading)}</a>' for sid, heading in sections)
    body = "\n".join(
        f'<section id="sec-{sid}"><h2>{escape(heading)}</h2><div class="charts" data-area="{sid}"></div>'
        f'<div class="text" id="{sid}"></div></section>'
        for sid, heading in sections
    )
    api_attr = f' data-api="{escape(api)}"' if api else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(view["title"])}</title>
<style>{_CSS}</style>
</head><body{api_attr}>
<header><h1 id="title">{escape(view["title"])}</h1><span id="live-state"></span><nav>{nav}</nav></header>
<main>
{body}
</main>
<footer>rpcctl · drawn with plotly.js · generated {escape(str(view.get("taken_at")))}</footer>
<script nonce="{nonce}">{plotly_js()}</script>
<script type="application/json" id="rpcctl-view">{view_json(view)}</script>
<script nonce="{nonce}">{_SCRIPT}</script>
</body></html>
"""


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; background: #f4f5f7; }
header { background: #1d2b3a; color: #fff; padding: 10px 20px; position: sticky; top: 0; z-index: 10; }
header h1 { font-size: 18px; margin: 0 12px 4px 0; display: inline-block; }
header nav a { color: #9cc3ff; margin-right: 12px; text-decoration: none; }
#live-state { font-size: 12px; padding: 2px 8px; border-radius: 8px; background: #34495e; }
#live-state.live { background: #1f7a3a; } #live-state.lost { background: #a33; }
main { padding: 12px 20px; }
section { background: #fff; border-radius: 6px; padding: 8px 16px 14px; margin-bottom: 14px;
  box-shadow: 0 1px 2px rgba(0,0,0,.08); }
section h2 { font-size: 16px; margin: 6px 0 8px; }
section h3 { font-size: 14px; margin: 12px 0 4px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 10px; }
.charts > .chart { min-height: 160px; min-width: 0; overflow: hidden; }
.charts > .chart.wide { grid-column: 1 / -1; }
table { border-collapse: collapse; font-size: 12.5px; margin: 4px 0; display: block; overflow-x: auto; }
th, td { padding: 3px 10px 3px 0; white-space: nowrap; border-bottom: 1px solid #eee; }
th { text-align: left; color: #555; font-weight: 600; } .right { text-align: right; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 4px 0; }
dl.facts dt { color: #666; } dl.facts dd { margin: 0; word-break: break-all; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; font-size: 12px; max-height: 360px;
  white-space: pre-wrap; word-break: break-word; }
.status { font-weight: 700; display: inline-block; padding: 1px 10px; border-radius: 8px; background: #eee;
  margin: 0 0 6px; }
.status-succeeded { background: #d8f0dc; } .status-failed, .status-lost { background: #f8d7d7; }
.status-running { background: #d6e6fb; }
.bad, .warn { color: #b22; } .empty, .note { color: #777; }
ol.events { list-style: none; padding: 0; margin: 0; font-size: 13px; }
ol.events .t { color: #777; font-family: monospace; }
footer { color: #888; font-size: 12px; padding: 0 20px 16px; }
"""

# Draws a view; on the live page polls the next one. Text arrives as escaped HTML from the
# server (rpcctl.web.tables); the title is set as text.
_SCRIPT = r"""
(function () {
  "use strict";
  var config = {displaylogo: false, responsive: true};
  var state = document.getElementById("live-state");
  var draws = 0;
  function draw(view) {
    document.title = view.title;
    document.getElementById("title").textContent = view.title;
    Object.keys(view.html).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && el.innerHTML !== view.html[id]) { el.innerHTML = view.html[id]; }
    });
    var ids = Object.keys(view.figures), added = false;
    ids.forEach(function (id) {  // every chart's place first, so each is drawn at its final width
      if (!document.getElementById(id)) {
        var el = document.createElement("div");
        el.id = id;
        el.className = view.figures[id].wide ? "chart wide" : "chart";
        document.querySelector('[data-area="' + view.figures[id].area + '"]').appendChild(el);
        added = true;
      }
    });
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      Plotly.react(el, view.figures[id].data, view.figures[id].layout, config);
      if (added) { Plotly.Plots.resize(el); }  // a new neighbour narrowed the older charts
    });
    document.querySelectorAll(".chart").forEach(function (el) {
      if (!(el.id in view.figures)) { Plotly.purge(el); el.remove(); }
    });
    draws += 1;
    window.rpcctlView = {takenAt: view.taken_at, status: view.status, live: view.live, draws: draws};
  }
  draw(JSON.parse(document.getElementById("rpcctl-view").textContent));
  var api = document.body.getAttribute("data-api");
  if (!api) { state.textContent = "report"; return; }
  function poll() {
    fetch(api + window.location.search, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (view) {
        draw(view);
        state.className = view.live ? "live" : "";
        state.textContent = view.live ? "live · " + new Date().toLocaleTimeString() : "run " + view.status;
        setTimeout(poll, view.live ? 1000 : 5000);
      })
      .catch(function (err) {
        state.className = "lost";
        state.textContent = "disconnected (" + err.message + "), retrying";
        setTimeout(poll, 2000);
      });
  }
  state.textContent = "live";
  setTimeout(poll, 1000);
})();
"""
