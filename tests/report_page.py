"""Reading what the browser drew on a report page (tests/browser.py drives the browser): the
labels of a picture that overlap, the timeline's rows and bars, the Placement table, and
screenshots of each picture. Shared by the report's scale tests and the spawned-worker tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import rpcctl

# Every text element of a chart's SVG with its box as laid out (empty ones aside), and the
# pairs whose boxes meet by more than half a pixel either way.
OVERLAPS = """
var gd = document.getElementById(arguments[0]);
var boxes = Array.from(gd.querySelectorAll('svg text')).map(function (e) {
  var r = e.getBoundingClientRect();
  return {text: e.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom};
}).filter(function (b) { return b.text.trim() && b.r - b.l > 0 && b.b - b.t > 0; });
var clashes = [];
for (var i = 0; i < boxes.length; i++) {
  for (var j = i + 1; j < boxes.length; j++) {
    var a = boxes[i], c = boxes[j];
    if (Math.min(a.r, c.r) - Math.max(a.l, c.l) > 0.5 && Math.min(a.b, c.b) - Math.max(a.t, c.t) > 0.5) {
      clashes.push([a.text, c.text]);
    }
  }
}
return {texts: boxes.length, clashes: clashes.slice(0, 10)};
"""

# The timeline's rows (its y categories, top first) and, per row, the bars drawn on it.
TIMELINE_ROWS = """
var gd = document.getElementById('fig-timeline');
var rows = gd._fullLayout.yaxis.categoryarray.slice();
var bars = {};
gd._fullData.forEach(function (t) {
  t.y.forEach(function (y, i) {
    (bars[y] = bars[y] || []).push({state: t.meta.state, base: t.base[i], x: t.x[i]});
  });
});
var drawn = gd.querySelectorAll('.barlayer .point path').length;
var ticks = Array.from(gd.querySelectorAll('.ytick text')).map(function (e) { return e.textContent; });
return {rows: rows, bars: bars, drawn: drawn, ticks: ticks, title: gd._fullLayout.title.text};
"""


def make_report(run_dir: Path, out: Path) -> Path:
    made = rpcctl("report", str(run_dir), "-o", str(out))
    assert made.returncode == 0, made.stderr
    return out


def open_report(browser, page: Path) -> None:
    browser.open(page.resolve().as_uri())
    browser.wait_for("return window.rpcctlView && window.rpcctlView.draws >= 1", 60, "the report's first draw")


def assert_no_label_overlaps(browser, *charts: str) -> None:
    for chart in charts:
        found = browser.js(OVERLAPS, chart)
        assert found["texts"] > 0, chart
        assert not found["clashes"], (chart, found)


def screens(browser, tmp_path: Path, name: str) -> None:
    """The whole page and each picture's section, in tmp_path (and RPCCTL_SCREENS)."""
    shots = []
    for section in ("sec-timeline", "sec-rrefs", "sec-placement"):
        path = tmp_path / f"{name}-{section}.png"
        browser.driver.find_element("id", section).screenshot(str(path))
        shots.append(path)
    shots.append(browser.screenshot(tmp_path / f"{name}.png"))
    keep = os.environ.get("RPCCTL_SCREENS")
    if keep:
        for path in shots:
            shutil.copy(path, Path(keep) / path.name)


def placement_ranks(browser) -> tuple[list[str], list[str]]:
    table = browser.js(
        "var t = document.querySelector('#placement table');"
        " return [Array.from(t.tHead.rows[0].cells).map(c => c.innerText),"
        " Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells).map(c => c.innerText))];"
    )
    return table[0], table[1]
