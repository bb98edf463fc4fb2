"""`rpcctl profile` (issue 41, item 3): a sampling profile of a live rank and the processes under
it, read from outside (py-spy), with no change to the script; kept in the run (0600) and drawn
as a flame graph by `report`. One real run, shared: rank 0 busy in crunch_numbers, a subprocess
it started busy in child_work."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from browser import browser  # noqa: F401 - the fixture
from conftest import WORKERS, record, rpcctl, wait_until
from live_job import live_job
from test_trace import validate
from rpcctl.base import native_stacks
from rpcctl.cli import app

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(native_stacks.py_spy() is None, reason="py-spy is not installed"),
]

JOB = textwrap.dedent(
    """
    import subprocess, sys, time

    def crunch_numbers(n):
        total = 0
        for i in range(n):
            total += i * i
        return total

    def child_work():
        while True:
            crunch_numbers(10**6)

    if sys.argv[1:] == ["child"]:
        child_work()
    child = subprocess.Popen([sys.executable, __file__, "child"])
    print("child started", flush=True)
    try:
        while True:
            crunch_numbers(10**6)
    finally:
        child.kill()
    """
)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The busy run, profiled twice (speedscope, then a Chrome trace) and reported: a dict of paths."""
    tmp = tmp_path_factory.mktemp("profile")
    with live_job(tmp, "busy", JOB, 1, "") as run_dir:
        log = run_dir / "logs" / "rank-0.log"
        wait_until(lambda: log.is_file() and "child started" in log.read_text(), 30, "the child", run_dir / "logs")
        paths = {"run_dir": run_dir, "speedscope": tmp / "rank0.speedscope.json", "chrome": tmp / "rank0.trace.json"}
        paths["results"] = [
            rpcctl(
                "profile", str(run_dir), "--rank", "0", "--seconds", "2", "-o", str(paths["speedscope"]), timeout=60
            ),
            rpcctl(
                "profile",
                str(run_dir),
                "--rank",
                "0",
                "--seconds",
                "1",
                "--format",
                "chrome",
                "-o",
                str(paths["chrome"]),
                timeout=60,
            ),
        ]
        paths["refused"] = _under_no_ptrace(run_dir, tmp / "never.json")
        runner = CliRunner()  # in this process: each costs no interpreter start
        paths["bad"] = [
            runner.invoke(app, ["profile", str(run_dir), *args])
            for args in (
                ["--seconds", "0", "-o", str(tmp / "x.json")],
                ["--rank", "3", "-o", str(tmp / "x.json")],
                ["--format", "svg", "-o", str(tmp / "x.json")],
                ["-o", "/dev/null"],
            )
        ]
        yield paths


def _under_no_ptrace(run_dir, out):
    """`rpcctl profile` as a container's seccomp profile would let it run (tests/workers/no_ptrace.py)."""
    argv = [
        sys.executable,
        str(WORKERS / "no_ptrace.py"),
        sys.executable,
        "-m",
        "rpcctl",
        "profile",
        str(run_dir),
        "--seconds",
        "1",
        "--native",
        "-o",
        str(out),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_profile_of_a_busy_rank_names_its_function_and_its_childs(profiled):
    result = profiled["results"][0]
    assert result.returncode == 0, result.stderr
    document = json.loads(profiled["speedscope"].read_text())
    assert document["$schema"].startswith("https://www.speedscope.app/"), document.keys()
    names = {f["name"] for f in document["shared"]["frames"]}
    assert {"crunch_numbers", "child_work"} <= names, names  # the rank, and the process it started
    processes = {p["name"].split(" Thread")[0] for p in document["profiles"]}
    assert len(processes) == 2, processes
    assert stat.S_IMODE(profiled["speedscope"].stat().st_mode) == 0o600
    kept = sorted((profiled["run_dir"] / "profiles").glob("rank-0-*.json"), key=lambda p: p.name.split(".", 1)[1])
    assert [p.name.split(".", 1)[1] for p in kept] == ["speedscope.json", "trace.json"], kept
    assert stat.S_IMODE((profiled["run_dir"] / "profiles").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kept), kept
    assert kept[0].read_bytes() == profiled["speedscope"].read_bytes()
    assert "samples" in result.stderr and "wrote" in result.stderr, result.stderr


def test_a_chrome_profile_is_valid_trace_event_json(profiled):
    assert profiled["results"][1].returncode == 0, profiled["results"][1].stderr
    events = validate(json.loads(profiled["chrome"].read_text()))
    spans = [e for e in events if e["ph"] == "X"]
    assert any(e["name"] == "crunch_numbers" for e in spans) and any(e["name"] == "child_work" for e in spans), {
        e["name"] for e in spans
    }
    tracks = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(name.startswith("rank 0 · process ") for name in tracks), tracks


def test_where_ptrace_is_refused_the_profile_says_how_to_allow_it(profiled):
    """--native pauses each process to read it (ptrace): a container's seccomp profile refuses
    that (without --native, py-spy reads /proc/PID/mem unpaused, which the profile allows)."""
    refused = profiled["refused"]
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "profile: not allowed to read the rank's processes (a seccomp filter" in lines[0], (
        refused.stderr
    )
    assert "kernel.yama.ptrace_scope=0" in lines[0] and "Traceback" not in refused.stderr, refused.stderr


def test_bad_input_is_one_message_and_exit_2_before_any_sampling(profiled):
    seconds, rank, fmt, device = profiled["bad"]
    assert seconds.exit_code == 2 and "--seconds 0: between 1 and 3600" in seconds.output, seconds.output
    assert rank.exit_code == 2 and "--rank 3: run " in rank.output, rank.output
    assert fmt.exit_code == 2 and "--format svg: one of speedscope, chrome" in fmt.output, fmt.output
    assert device.exit_code == 2 and "/dev/null" in device.output and "profiling" not in device.output, device.output


@pytest.fixture(scope="module")
def report(profiled, tmp_path_factory):
    """`rpcctl report` of the profiled run, once: (the file, its view)."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    result = rpcctl("report", str(profiled["run_dir"]), "-o", str(out))
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    return out, json.loads(page.split('<script type="application/json" id="rpcctl-view">')[1].split("</script>")[0])


def test_the_report_draws_the_latest_profile_as_a_flame_graph(report):
    view = report[1]
    flame = view["figures"]["fig-flame"]
    assert flame["area"] == "profile" and flame["data"][0]["type"] == "icicle"
    labels = flame["data"][0]["labels"]
    assert any(label.startswith("crunch_numbers (busy.py:") for label in labels), labels
    assert any(label.startswith("child_work (busy.py:") for label in labels), labels
    assert "rank-0-" in view["html"]["profile"]


@pytest.mark.browser
def test_the_flame_graph_opens_in_the_browser(profiled, report, browser):  # noqa: F811
    browser.open(report[0].resolve().as_uri())
    browser.wait_for("return window.rpcctlView && window.rpcctlView.draws >= 1", 60, "the report's first draw")
    drawn = browser.wait_for(
        "var el = document.getElementById('fig-flame'); return el && el.data && el.querySelectorAll('.slice').length",
        30,
        "the flame graph's boxes",
    )
    assert drawn > 3
    labels = browser.js("return document.getElementById('fig-flame').data[0].labels")
    assert any(label.startswith("crunch_numbers") for label in labels), labels
    assert record(profiled["run_dir"])["status"] == "running"
