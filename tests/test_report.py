"""``rpcctl report`` and ``rpcctl web``: pages of real runs, opened in headless Chromium.

The jobs are real (tests/workers/report_job.py: RPC, rpc.remote RRefs, rpcctl.report losses);
the checks read what plotly drew (each chart's data and its SVG) and what the page shows as
text. Every browser test saves a screenshot in its tmp dir (``page.png``). Without chromium,
chromedriver, selenium or plotly those tests skip, naming the install command.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rpcctl import inspect
from browser import browser  # noqa: F401 - the fixture
from conftest import WORKERS, assert_no_process_left, only_run, record, rpcctl, write_config

pytestmark = pytest.mark.timeout(180)

STEPS = 6
HOSTILE = "<script>window.__pwned=1</script>"
HOSTILE_METRIC = "<img src=x onerror=window.__pwned=2>"


def _job(tmp_path: Path, ranks: int = 3, **env: str) -> Path:
    return write_config(
        tmp_path,
        name="report-job",
        script=str(WORKERS / "report_job.py"),
        nproc_per_node=ranks,
        preload=["torch", "torch.distributed.rpc"],
        rpc={"init": True},
        env={"STEPS": str(STEPS), **env},
    )


def _launch(tmp_path: Path, runs_dir: Path, ranks: int = 3, *flags: str, **env: str) -> Path:
    rpcctl("launch", str(_job(tmp_path, ranks, **env)), "--no-live", "--runs-dir", str(runs_dir), *flags, timeout=150)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    return run_dir


def _report(target: str, out: Path, *extra: str) -> None:
    result = rpcctl("report", target, "-o", str(out), *extra)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o600


def _drawn(browser, chart: str) -> list[dict]:
    """Per trace of a chart: its meta, name, last point, and whether its SVG path exists."""
    return browser.js(
        """
        var gd = document.getElementById(arguments[0]);
        if (!gd || !gd._fullData) { return null; }
        var paths = gd.querySelectorAll('.scatterlayer .trace');
        return gd._fullData.map(function (t, i) {
          return {meta: t.meta, name: t.name, n: t.y ? t.y.length : 0,
                  last: t.y && t.y.length ? [t.x[t.x.length - 1], t.y[t.y.length - 1]] : null,
                  drawn: !!(paths[i] && paths[i].querySelector('path.js-line, path.point'))};
        });
        """,
        chart,
    )


def _open_report(browser, path: Path) -> None:
    browser.open(path.resolve().as_uri())
    browser.wait_for("return window.rpcctlView && window.rpcctlView.draws >= 1", 60, "the report's first draw")


def _loss_chart_id(browser, metric: str) -> str:
    return browser.wait_for(
        "var metric = arguments[0]; var c = Array.from(document.querySelectorAll('.chart')).find(function (e) {"
        " return e._fullData && e._fullData.length && e._fullData[0].meta && e._fullData[0].meta.metric === metric; });"
        " return c ? c.id : null;",
        30,
        f"the {metric} chart",
        metric,
    )


# ---------------------------------------------------------------------------------------------
# The report file


@pytest.mark.browser
def test_report_of_a_real_run_draws_a_series_per_rank_and_the_ownership_graph(browser, tmp_path, runs_dir):
    run_dir = _launch(tmp_path, runs_dir)
    assert record(run_dir)["status"] == "succeeded"
    out = tmp_path / "report.html"
    _report(run_dir.name, out, "--runs-dir", str(runs_dir))
    _open_report(browser, out)
    try:
        # One series per rank, ending at the values the ranks reported: loss (r+1)·10/(step+1).
        traces = _drawn(browser, _loss_chart_id(browser, "loss"))
        assert sorted(t["meta"]["rank"] for t in traces) == [0, 1, 2]
        for t in traces:
            rank = t["meta"]["rank"]
            assert t["name"] == f"rank {rank}" and t["n"] == STEPS and t["drawn"], t
            assert t["last"][0] == STEPS - 1
            assert t["last"][1] == pytest.approx((rank + 1) * 10.0 / STEPS)
        # The second metric has its own chart, one series per rank too.
        accuracy = _drawn(browser, _loss_chart_id(browser, "accuracy"))
        assert [t["last"][1] for t in sorted(accuracy, key=lambda t: t["meta"]["rank"])] == [
            pytest.approx((STEPS - 1) / 10)
        ] * 3

        # Log scale: the chart's own button switches the axis.
        chart = _loss_chart_id(browser, "loss")
        buttons = browser.driver.find_elements("css selector", f"#{chart} .updatemenu-button")
        assert [b.text for b in buttons] == ["linear", "log"]
        buttons[1].click()
        browser.wait_for(
            "return document.getElementById(arguments[0])._fullLayout.yaxis.type === 'log'", 10, "a log axis", chart
        )

        # The ownership graph: rank 0's worker0, which created an RRef on each other worker, on
        # the left; the owners on the right.
        graph = _drawn(browser, "fig-rref-graph")
        sides = {t["meta"]["side"]: t["meta"]["nodes"] for t in graph if t["meta"] and "side" in t["meta"]}
        assert sides == {"holder": ["worker0"], "owner": ["worker1", "worker2"]}
        edges = sorted(
            (t["meta"]["edge"][0], t["meta"]["edge"][1], t["meta"]["relation"])
            for t in graph
            if "edge" in (t["meta"] or {})
        )
        assert edges == [("worker0", "worker1", "created"), ("worker0", "worker2", "created")]
        drawn_nodes = browser.js(
            "return document.querySelectorAll('#fig-rref-graph .scatterlayer .trace path.point').length"
        )
        assert drawn_nodes == 3
        node_labels = browser.js(
            "return Array.from(document.querySelectorAll('#fig-rref-graph .textpoint')).map(e => e.textContent)"
        )
        assert [label.split(" ")[0][:7] for label in node_labels] == ["worker0", "worker1", "worker2"]

        # Text sections: the run, its ranks' exits, placement, the calls section's state.
        page = browser.js("return document.body.innerText")
        assert record(run_dir)["run_id"] in page and "succeeded" in page
        assert "rank 2 succeeded (exit code 0)" in page
        # CPU and RSS over time: a series per worker, from its probes (a Python rank with torch: > 50 MiB).
        for chart in ("fig-usage-cpu", "fig-usage-rss"):
            usage = _drawn(browser, chart)
            assert sorted(t["name"] for t in usage) == ["worker0", "worker1", "worker2"] and all(
                t["n"] >= 1 for t in usage
            ), usage
        assert all(t["last"][1] > 50 for t in _drawn(browser, "fig-usage-rss"))
        placement = _drawn(browser, "fig-placement")
        assert placement[0]["meta"] == {"what": "ranks"} and placement[0]["last"] == ["cpu", 3]
        # The call summary: rank 0's rpc.remote to each other worker.
        summary = browser.js(
            "var t = Array.from(document.querySelectorAll('#calls table'))"
            ".find(t => t.tHead.innerText.indexOf('CALLS') >= 0);"
            " return t ? Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells).map(c => c.innerText)) : null;"
        )
        assert sorted((row[0], row[1], row[3], row[4]) for row in summary) == [
            ("worker0", "worker1", "remote", "1"),
            ("worker0", "worker2", "remote", "1"),
        ]

        # Self-contained: nothing was fetched to draw it.
        assert browser.js("return performance.getEntriesByType('resource').length") == 0
    finally:
        browser.screenshot(tmp_path / "page.png")


@pytest.mark.browser
def test_text_from_ranks_is_shown_as_text_never_run(browser, tmp_path, runs_dir):
    """A rank's error and a metric name that are HTML: shown literally, nothing executes."""
    run_dir = _launch(tmp_path, runs_dir, ranks=2, FAIL=HOSTILE, METRIC=HOSTILE_METRIC)
    assert record(run_dir)["status"] == "failed"
    out = tmp_path / "report.html"
    _report(str(run_dir), out)
    _open_report(browser, out)
    try:
        assert browser.js("return typeof window.__pwned") == "undefined"
        cause = browser.js("return document.querySelector('.root-cause').innerText")
        assert "rank 1" in cause and HOSTILE in cause
        assert HOSTILE in browser.js("return document.querySelector('.traceback').innerText")
        chart = _loss_chart_id(browser, HOSTILE_METRIC)
        title = browser.js("return document.querySelector('#' + arguments[0] + ' .gtitle').textContent", chart)
        assert title == HOSTILE_METRIC
        assert browser.js("return document.querySelectorAll('img, main script').length") == 0
        assert (
            browser.js("return document.querySelector('#fig-timeline .annotation-text').textContent")
            == "root cause: rank 1"
        )
    finally:
        browser.screenshot(tmp_path / "page.png")


@pytest.mark.browser
def test_a_hung_run_shows_the_watchdogs_diagnosis(browser, tmp_path, runs_dir):
    run_dir = _launch(tmp_path, runs_dir, 2, "--hang-timeout", "6", HANG="1")
    assert record(run_dir)["root_cause"]["reason"] == "hang"
    out = tmp_path / "report.html"
    _report(str(run_dir), out)
    _open_report(browser, out)
    try:
        diagnosis = browser.js("return document.querySelector('#timeline pre.hang-diagnosis').innerText")
        assert diagnosis.rstrip("\n") == (run_dir / "hang" / "diagnosis.txt").read_text().rstrip("\n")
        assert (
            diagnosis.startswith("rank 0 (worker0, pid ") and "worker1 is running sleep_long for worker0" in diagnosis
        )
        assert browser.js("return document.querySelector('.root-cause').innerText").startswith(
            "found by the launcher (hang): hang: rank 0"
        )
        assert (
            browser.js("return document.querySelector('#fig-timeline .annotation-text').textContent")
            == "root cause: hang"
        )
    finally:
        browser.screenshot(tmp_path / "page.png")


@pytest.mark.browser
def test_a_restarted_run_shows_every_attempt_on_the_timeline(browser, tmp_path, runs_dir):
    config = write_config(
        tmp_path,
        name="restarted",
        script=str(WORKERS / "report_job.py"),
        nproc_per_node=2,
        max_restarts=1,
        preload=["torch", "torch.distributed.rpc"],
        rpc={"init": True},
        env={"STEPS": "2", "FAIL_ONCE": "1"},
    )
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=150)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(runs_dir)
    assert record(run_dir)["restarts"] == 1
    attempts = [(a.rank, a.restart, a.state) for a in inspect.rank_attempts(run_dir)]
    assert attempts[-2:] == [(0, 1, "succeeded"), (1, 1, "succeeded")] and (1, 0, "failed") in attempts, attempts
    out = tmp_path / "report.html"
    _report(str(run_dir), out)
    _open_report(browser, out)
    try:
        bars = browser.js(
            "return document.getElementById('fig-timeline')._fullData"
            ".flatMap(t => t.y.map((y, i) => [y, t.customdata[i], t.marker.color]));"
        )
        drawn = sorted((y, r) for y, r, _ in bars)
        assert drawn == [
            ("rank 0: exit code 0", 0),
            ("rank 0: exit code 0", 1),
            ("rank 1: exit code 0", 0),
            ("rank 1: exit code 0", 1),
        ], bars
        failed_first = [c for y, r, c in bars if (y, r) == ("rank 1: exit code 0", 0)]
        # the failed attempt in the failure colour (its row says how the latest ended)
        assert failed_first == ["#d62728"]
        events = browser.js(
            "return Array.from(document.querySelectorAll('#timeline ol.events li')).map(e => e.innerText)"
        )
        assert any("rank 1 failed (exit code 1)" in e for e in events) and not any("None" in e for e in events), events
        assert any("rank 1 started (restart 1, pid " in e for e in events), events
        assert any("rank 1 succeeded (restart 1, exit code 0)" in e for e in events), events
    finally:
        browser.screenshot(tmp_path / "page.png")
    assert_no_process_left(run_dir)


def _bench_document(path: Path) -> Path:
    """A bench result as `rpcctl bench --json` writes it (two transports, every suite)."""
    from rpcctl.bench.results import BenchReport, BenchResult

    def row(suite, transport, op, p50, payload=None, in_flight=1, gbps=None, rate=None, repeats=(0.9, 1.0, 1.1)):
        estimates = [rate * f for f in repeats] if rate else [p50 * f for f in repeats]
        return BenchResult(
            suite=suite,
            transport=transport,
            op=op,
            payload_bytes=payload,
            in_flight=in_flight,
            world_size=2,
            n=100,
            repeats=3,
            p50_us=p50,
            p90_us=p50 * 1.2,
            p99_us=p50 * 1.5,
            min_us=p50 * 0.8,
            max_us=p50 * 2,
            mean_us=p50,
            gbps=gbps,
            calls_per_s=rate,
            spread=0.2,
            noisy=False,
            repeat_estimates=estimates,
        )

    rows = []
    for transport, factor in (("rpc", 1.0), ("tcp", 0.5)):
        rows.append(row("latency", transport, "rpc_sync", 100 * factor))
        for size in (1024, 1 << 20, 64 << 20):
            p50 = (20 + size / 1e3) * factor
            rows.append(row("payload", transport, "rpc_sync", p50, payload=size, gbps=2 * size / (p50 * 1e-6) / 1e9))
        for flight in (1, 8, 64):
            rows.append(row("throughput", transport, "rpc_async", 50, in_flight=flight, rate=1000 * flight / factor))
    BenchReport(results=rows, machine={"hostname": "<b>bench-host</b>"}).save(path)
    return path


@pytest.mark.browser
def test_bench_result_renders_latency_bandwidth_on_log_axes_and_throughput(browser, tmp_path):
    bench = _bench_document(tmp_path / "bench.json")
    out = tmp_path / "bench.html"
    out.write_text("an older file, readable by everyone")
    out.chmod(0o644)
    _report(str(bench), out)  # rewritten, and the owner's alone again
    _open_report(browser, out)
    try:
        latency = _drawn(browser, "fig-bench-latency")
        assert {t["meta"]["transport"]: t["last"][1] for t in latency} == {"rpc": 100, "tcp": 50}
        payload = [t for t in _drawn(browser, "fig-bench-payload") if not t["meta"].get("band")]
        assert {t["meta"]["transport"]: t["last"][0] for t in payload} == {"rpc": 64 << 20, "tcp": 64 << 20}
        assert all(t["n"] == 3 and t["drawn"] for t in payload)
        axes = browser.js(
            "var l = document.getElementById('fig-bench-payload')._fullLayout; return [l.xaxis.type, l.yaxis.type]"
        )
        assert axes == ["log", "log"]
        bands = [t for t in _drawn(browser, "fig-bench-payload") if t["meta"].get("band")]
        assert len(bands) == 2  # a noise band behind each line
        throughput = [t for t in _drawn(browser, "fig-bench-throughput") if not t["meta"].get("band")]
        assert {t["meta"]["transport"]: t["last"] for t in throughput} == {"rpc": [64, 64000], "tcp": [64, 128000]}
        assert "<b>bench-host</b>" in browser.js("return document.getElementById('about').innerText")
    finally:
        browser.screenshot(tmp_path / "page.png")


# ---------------------------------------------------------------------------------------------
# The live page


def _start_web(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpcctl", "web", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, _read_url(proc)


def _read_url(proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(r"http://127\.0\.0\.1:\d+/\?token=[\w-]+", line)
        if match:
            return match.group(0)
    proc.kill()
    raise AssertionError(f"no URL printed within {timeout}s: {''.join(seen)}")


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()


def _port_closed(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/")
        conn.getresponse()
    except OSError:
        return True
    return False


def _last_loss_of_rank0(browser, chart: str):
    return browser.js(
        "var gd = document.getElementById(arguments[0]);"
        " var t = (gd._fullData || []).find(d => d.meta && d.meta.rank === 0);"
        " return t ? t.y[t.y.length - 1] : null;",
        chart,
    )


@pytest.mark.browser
def test_live_page_follows_a_running_job_without_a_reload(browser, tmp_path, runs_dir):
    gate = tmp_path / "gate"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rpcctl",
            "launch",
            str(_job(tmp_path, 2, GATE=str(gate))),
            "--no-live",
            "--runs-dir",
            str(runs_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    web = None
    try:
        run_dir = only_run(runs_dir)
        web, url = _start_web(str(run_dir))
        browser.open(url)
        browser.wait_for("return window.rpcctlView && window.rpcctlView.live", 60, "the live page")
        chart = _loss_chart_id(browser, "loss")
        # Rank 0 has reported its STEPS losses and waits at the gate.
        browser.wait_for(
            "var gd = document.getElementById(arguments[0]); var t = gd._fullData.find(d => d.meta.rank === 0);"
            " return t && t.y.length === arguments[1];",
            60,
            "rank 0's first losses",
            chart,
            STEPS,
        )
        browser.js("window.__sameDocument = true")
        draws = browser.js("return window.rpcctlView.draws")
        gate.write_text("go")
        started = time.monotonic()
        browser.wait_for(
            "var gd = document.getElementById(arguments[0]); var t = gd._fullData.find(d => d.meta.rank === 0);"
            " return t && t.y[t.y.length - 1] === 0.125;",
            15,
            "the new loss point",
            chart,
        )
        took = time.monotonic() - started
        assert browser.js("return window.__sameDocument") is True  # drawn in place, not reloaded
        assert browser.js("return window.rpcctlView.draws") > draws
        assert took < 15
        browser.screenshot(tmp_path / "page.png")
        assert launcher.wait(timeout=60) == 0, launcher.stderr.read()
        browser.wait_for("return window.rpcctlView.status === 'succeeded'", 20, "the run's end on the page")
        browser.screenshot(tmp_path / "page-ended.png")
    finally:
        if web is not None:
            port = int(re.search(r":(\d+)/", url).group(1))
            assert _stop(web) == 130
            assert _port_closed(port)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert_no_process_left(run_dir)


@pytest.mark.browser
def test_launch_web_serves_the_job_and_stops_with_it(browser, tmp_path, runs_dir):
    gate = tmp_path / "gate"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rpcctl",
            "launch",
            str(_job(tmp_path, 2, GATE=str(gate))),
            "--no-live",
            "--web",
            "--runs-dir",
            str(runs_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        url = _read_url(launcher)
        port = int(re.search(r":(\d+)/", url).group(1))
        browser.open(url)
        browser.wait_for("return window.rpcctlView && window.rpcctlView.live", 60, "the live page")
        browser.wait_for(
            "return (document.getElementById('workers').innerText.match(/running/g) || []).length === 2",
            60,
            "both ranks running in the workers table",
        )
        assert browser.js("return window.rpcctlView.status") == "running"
        browser.screenshot(tmp_path / "page.png")
        gate.write_text("go")
        assert launcher.wait(timeout=60) == 0
        assert _port_closed(port)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert_no_process_left(only_run(runs_dir))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real 2-rank run for the tests that need a run but no browser."""
    tmp_path = tmp_path_factory.mktemp("finished")
    run_dir = _launch(tmp_path, tmp_path / "runs", ranks=2)
    assert record(run_dir)["status"] == "succeeded"
    return run_dir


def test_usage_keeps_every_probe_of_every_rank(finished_run):
    """inspect.usage: the history behind the CPU and RSS charts, one sample per probe."""
    samples = inspect.usage(finished_run)
    assert {s.rank for s in samples} == {0, 1}
    assert all(s.rss_bytes and s.rss_bytes > 50 * 2**20 for s in samples)
    times = [s.time for s in samples]
    assert times == sorted(times)
    last_probe = {w.rank: w for w in inspect.workers(finished_run)}
    assert {s.name for s in samples} == {w.name for w in last_probe.values()} == {"worker0", "worker1"}


def test_live_server_refuses_wrong_tokens_hosts_origins_and_writes(finished_run):
    """Real HTTP against `rpcctl web` on a finished run (no browser needed)."""
    pytest.importorskip("plotly", reason="needs plotly: pip install -c constraints.txt -e '.[test]'")
    web, url = _start_web(str(finished_run))
    try:
        port = int(re.search(r":(\d+)/", url).group(1))
        token = url.split("token=", 1)[1]

        def get(path: str, method: str = "GET", **headers: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            conn.close()
            return response.status, body

        assert get(f"/?token={token}")[0] == 200
        status, body = get(f"/api/view?token={token}")
        assert status == 200 and json.loads(body)["status"] == "succeeded"
        assert get("/")[0] == 403
        assert get("/api/view?token=" + "x" * len(token))[0] == 403
        assert get(f"/?token={token}", Host=f"attacker.example:{port}")[0] == 403  # DNS rebinding
        assert get(f"/api/view?token={token}", Origin="http://attacker.example")[0] == 403
        assert get(f"/api/view?token={token}", Origin=f"http://127.0.0.1:{port}")[0] == 200
        for method in ("POST", "PUT", "DELETE"):
            assert get(f"/api/view?token={token}", method)[0] == 405
        listening = [c.laddr for c in psutil.Process(web.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [a.ip for a in listening] == ["127.0.0.1"]
    finally:
        assert _stop(web) == 130


# ---------------------------------------------------------------------------------------------
# Bad input


def test_a_missing_run_or_a_bad_bench_file_is_one_message_and_exit_2(tmp_path, runs_dir):
    pytest.importorskip("plotly", reason="needs plotly: pip install -c constraints.txt -e '.[test]'")
    missing = rpcctl("report", "no-such-run", "-o", str(tmp_path / "r.html"), "--runs-dir", str(runs_dir))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: no run 'no-such-run' in {runs_dir} (see `rpcctl runs`)"
    assert not (tmp_path / "r.html").exists()
    bad = tmp_path / "bench.json"
    bad.write_text('{"rows": []}')
    wrong = rpcctl("report", str(bad), "-o", str(tmp_path / "r.html"))
    assert (
        wrong.returncode == 2 and "not a bench document" in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1
    )
    web = rpcctl("web", "no-such-run", "--runs-dir", str(runs_dir))
    assert web.returncode == 2 and web.stderr.startswith("error: ")


def test_without_plotly_the_message_names_the_install_command(tmp_path, runs_dir):
    # The one faked edge: an installed package made unimportable, as on a default install.
    shadow = tmp_path / "shadow" / "plotly"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named plotly', name='plotly')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(shadow.parent)}
    result = rpcctl("report", "-o", str(tmp_path / "r.html"), "--runs-dir", str(runs_dir), env=env)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: the HTML report needs plotly, which is not installed: pip install 'rpcctl[report]'"
    )
