"""What rpcctl writes out (report, trace, bench results, JSON views) is safe whatever a rank
printed: an output is written beside its target and renamed into place, 0600, never into a
device or through a link; non-finite losses are valid JSON; text from a rank carries no live
placeholder into plotly; outputs are bounded. Real runs, the real CLI."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from browser import browser  # noqa: F401 - the fixture
from conftest import assert_no_process_left, only_run, rpcctl

pytestmark = pytest.mark.timeout(120)

# A rank of a mixed-precision job: its loss and grad norm overflow, then recover.
NON_FINITE = textwrap.dedent(
    """
    values = [(1.0, 1.0), ("inf", "inf"), ("nan", "nan"), (0.5, "-inf"), (0.25, 0.5)]
    for step, (loss, grad_norm) in enumerate(values):
        print(f"step {step} loss={loss} grad_norm={grad_norm}", flush=True)
    """
)


def _run(tmp_path: Path, script: str, name: str = "job") -> Path:
    return _launch(tmp_path, script, name)[1]


def _launch(tmp_path: Path, script: str, name: str = "job") -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / f"{name}.py").write_text(script)
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"script: {name}.py\nnproc_per_node: 1\npreload: []\ngrace: 2\n")
    runs_dir = tmp_path / "runs"
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=90)
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    return result, run_dir


@pytest.fixture(scope="module")
def non_finite_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("non-finite"), NON_FINITE)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    return _run(
        tmp_path_factory.mktemp("finished"),
        "for step in range(3):\n    print(f'step {step} loss={1 / (step + 1)}', flush=True)\n",
    )


# -- where outputs are written (-o) --------------------------------------------------------------


def _targets(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """Targets that are not regular files, each with the file whose mode and content must not change."""
    other = tmp_path / "someone-elses.txt"
    other.write_text("keep me")
    other.chmod(0o644)
    link = tmp_path / "link.out"
    link.symlink_to(other)
    device = tmp_path / "null"  # a copy of /dev/null: the real one is the host's
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    device.chmod(0o666)
    return {"symlink": (link, other), "device": (device, device)}


@pytest.mark.parametrize("command", [["report"], ["trace"]])
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(finished_run, tmp_path, command):
    for what, (target, guarded) in _targets(tmp_path).items():
        before = (stat.S_IMODE(guarded.stat().st_mode), guarded.read_bytes() if guarded.is_file() else None)
        result = rpcctl(*command, str(finished_run), "-o", str(target))
        assert result.returncode == 2, (what, result.stderr)
        assert (
            f"cannot write {target}" in result.stderr
            and "regular file" in result.stderr
            and "Traceback" not in result.stderr
        )
        assert (stat.S_IMODE(guarded.stat().st_mode), guarded.read_bytes() if guarded.is_file() else None) == before, (
            what
        )
    # no temporary file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.out", "null", "someone-elses.txt"]


@pytest.mark.parametrize("command", [["report"], ["trace"]])
def test_an_output_is_a_new_0600_file_and_another_link_to_the_old_one_keeps_it(finished_run, tmp_path, command):
    """Written beside the target and renamed into place: an existing file is never re-moded or
    truncated (a hard link elsewhere to it keeps its mode and content), and the new one is 0600."""
    other = tmp_path / "shared.txt"
    other.write_text("keep me")
    other.chmod(0o644)
    target = tmp_path / "out.file"
    os.link(other, target)
    result = rpcctl(*command, str(finished_run), "-o", str(target))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(other.stat().st_mode) == 0o644 and other.read_text() == "keep me"
    assert target.stat().st_ino != other.stat().st_ino and target.stat().st_size > 500


def test_bench_out_that_is_not_a_regular_file_is_refused_before_anything_runs(tmp_path):
    target, guarded = _targets(tmp_path)["symlink"]
    result = rpcctl(
        "bench",
        "--suite",
        "latency",
        "--transport",
        "rpc",
        "--quick",
        "--out",
        str(target),
        "--runs-dir",
        str(tmp_path / "runs"),
        timeout=30,
    )
    assert result.returncode == 2 and f"--output cannot write {target}" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()  # nothing was launched
    assert guarded.read_text() == "keep me"


def test_o_is_the_output_file_everywhere():
    """``-o/--output FILE`` in every command that writes one (bench's ``--out`` stays an alias)."""
    from typer.main import get_command

    from rpcctl.cli import app

    root = get_command(app)
    writers = {name: root.get_command(None, name) for name in ("bench", "report", "trace", "k8s")}
    for name, command in writers.items():
        [option] = [p for p in command.params if "-o" in p.opts]
        assert option.opts[:2] == ["--output", "-o"], (name, option.opts)
    assert "--out" in writers["bench"].params[[p.name for p in writers["bench"].params].index("out")].opts


# -- every file a command writes, through the one writer ---------------------------------------
#
# Every option of every command (cli.COMMANDS, their subcommands too) that takes a path names a
# file rpcctl writes, but for these inputs. Each has a recipe: how to run its command cheaply.
# A new command's -o (or any new path option) has none, and test_every_file_option_has_a_recipe
# says so: add one here, and every case below runs on it.

INPUT_PATHS = {"--runs-dir"}


@dataclasses.dataclass(frozen=True)
class Recipe:
    argv: Callable[[dict[str, Path], Path], list[str]]  # (the fixtures' files, the target) -> the command line
    completes: str | None = None  # why it cannot write for real in a test (else None: it does, in seconds)
    big: bool = False  # its output is over 100 KiB: a disk with a little room fails it at the write itself


RECIPES: dict[tuple[str, str], Recipe] = {
    ("k8s", "--output"): Recipe(
        lambda f, t: ["k8s", str(f["k8s_config"]), "--nodes", "2", "--image", "train:1.0", "-o", str(t)], big=True
    ),
    ("report", "--output"): Recipe(lambda f, t: ["report", str(f["run"]), "-o", str(t)], big=True),
    ("trace", "--output"): Recipe(lambda f, t: ["trace", str(f["run"]), "-o", str(t)]),
    ("inspect losses", "--plot"): Recipe(lambda f, t: ["inspect", "losses", str(f["run"]), "--plot", str(t)]),
    ("bench", "--output"): Recipe(
        lambda f, t: [
            "bench",
            "--suite",
            "latency",
            "--transport",
            "memcpy",
            "--quick",
            "--repeats",
            "2",
            "--rounds",
            "1",
            "--runs-dir",
            str(f["tmp"] / "bench-runs"),
            "-o",
            str(t),
        ]
    ),
    ("launch", "--save-config"): Recipe(
        lambda f, t: [
            "launch",
            "--dry-run",
            "--save-config",
            str(t),
            "--nproc-per-node",
            "2",
            str(f["tmp"] / "train.py"),
        ]
    ),
    ("profile", "--output"): Recipe(
        lambda f, t: ["profile", str(f["run"]), "-o", str(t)],
        completes="it profiles a live rank (its writer, for real: tests/test_profile.py)",
    ),
    ("bench", "--write-config"): Recipe(
        lambda f, t: ["bench", "--tune", "--runs-dir", str(f["tmp"] / "bench-runs"), "--write-config", str(t)],
        completes="--tune measures for minutes (its writer: test_write_config_replaces_a_hard_linked_config)",
    ),
}


def _file_options() -> set[tuple[str, str]]:
    from typer.main import get_command

    from rpcctl.cli import COMMANDS, app

    root = get_command(app)
    found = set()

    def walk(command, name: str) -> None:
        if hasattr(command, "list_commands"):  # a group: bench, inspect
            for sub in command.list_commands(None):
                walk(command.get_command(None, sub), f"{name} {sub}")
        for param in command.params:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if param.param_type_name == "option" and annotation is Path and param.opts[0] not in INPUT_PATHS:
                found.add((name, param.opts[0]))

    for name in COMMANDS:
        walk(root.get_command(None, name), name)
    return found


def test_every_file_option_has_a_recipe():
    found = _file_options()
    assert ("k8s", "--output") in found and ("inspect losses", "--plot") in found  # the walk reads typer's commands
    assert found == set(RECIPES), (
        f"options that write a file without a recipe in RECIPES: {sorted(found - set(RECIPES))}"
    )


@pytest.fixture(scope="module")
def output_inputs(finished_run, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("inputs")
    script = tmp / "train.py"
    script.write_text("print('train')\n" + "# padding the ConfigMap\n" * 12_000)  # 300 KB: the manifests are big
    config = tmp / "train.yaml"
    config.write_text("script: train.py\nnproc_per_node: 2\n")
    return {"run": finished_run, "k8s_config": config, "tmp": tmp}


CASES = ["fifo", "device", "symlink", "directory", "hard-link", "full-disk", "disk-fills"]


def _fill(where: Path, leave: int = 0) -> None:
    """Fill the file system at ``where`` to the last block, then free ``leave`` bytes."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))


def _run_output(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return rpcctl(*argv, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rpcctl {' '.join(argv[:2])} ... hung (90 s) on its output")


def _refused(result: subprocess.CompletedProcess, target: Path, flag: str, why: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"error: {flag} cannot write {target}: {why}" or (
        why in lines[-1] and f"{flag} cannot write {target}" in lines[-1]
    ), lines
    assert "Traceback" not in result.stderr and len([line for line in lines if line.startswith("error:")]) == 1, (
        result.stderr
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("key", sorted(RECIPES), ids=lambda k: f"{k[0]} {k[1]}".replace(" ", "-"))
def test_every_file_option_refuses_what_is_not_a_regular_file_and_survives_a_full_disk(
    output_inputs, tmp_path, key, case
):
    """FIFO: refused at once, never opened (k8s -o blocked forever on one). /dev/null: refused,
    its mode unchanged (k8s -o made it 0600). A symlink, a directory: refused, left as they
    were. A hard link: replaced by a new 0600 file, the other name keeps its content and mode
    (k8s -o rewrote it in place). A full disk (a real 1 MiB tmpfs): refused before the work; a
    disk that fills at the write: one message, and the old file and no temporary one left."""
    from test_faults import tmpfs

    recipe = RECIPES[key]
    flag = key[1]
    other = tmp_path / "someone-elses.txt"
    other.write_text("keep me")
    other.chmod(0o644)
    if case == "fifo":
        target = tmp_path / "out.fifo"
        os.mkfifo(target)
        _refused(_run_output(recipe.argv(output_inputs, target)), target, flag, "it is a FIFO")
        assert stat.S_ISFIFO(target.lstat().st_mode)
    elif case == "device":
        target = Path("/dev/null")
        before = os.stat(target)
        _refused(_run_output(recipe.argv(output_inputs, target)), target, flag, "it is a device")
        after = os.stat(target)
        assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_rdev) == (
            stat.S_IMODE(before.st_mode),
            before.st_uid,
            before.st_rdev,
        )
    elif case == "symlink":
        target = tmp_path / "out.link"
        target.symlink_to(other)
        _refused(_run_output(recipe.argv(output_inputs, target)), target, flag, "it is a symbolic link")
        assert target.is_symlink() and other.read_text() == "keep me" and stat.S_IMODE(other.stat().st_mode) == 0o644
    elif case == "directory":
        target = tmp_path / "out.dir"
        target.mkdir()
        _refused(_run_output(recipe.argv(output_inputs, target)), target, flag, "it is a directory")
        assert target.is_dir() and list(target.iterdir()) == []
    elif case == "hard-link":
        if recipe.completes is not None:
            pytest.skip(recipe.completes)
        if key == ("inspect losses", "--plot"):
            pytest.importorskip("matplotlib", reason="--plot needs matplotlib: pip install 'rpcctl[plot]'")
        target = tmp_path / "out.file"
        os.link(other, target)
        result = _run_output(recipe.argv(output_inputs, target))
        assert result.returncode == 0, result.stderr
        assert other.read_text() == "keep me" and stat.S_IMODE(other.stat().st_mode) == 0o644
        assert (
            target.stat().st_ino != other.stat().st_ino
            and stat.S_IMODE(target.stat().st_mode) == 0o600
            and target.stat().st_size > 0
        )
    else:
        if case == "disk-fills" and not recipe.big:
            pytest.skip("its output fits in the block the check before the work takes: a full disk is that case")
        with tmpfs(tmp_path / "tiny", "size=1m,mode=0700") as disk:
            target = disk / "out.file"
            target.write_text("the old one")
            _fill(disk, leave=64 * 1024 if case == "disk-fills" else 0)
            result = _run_output(recipe.argv(output_inputs, target))
            _refused(result, target, flag, "No space left on device")
            assert target.read_text() == "the old one"
            assert sorted(p.name for p in disk.iterdir()) == ["filler", "out.file"]  # no temporary file left


def test_write_config_replaces_a_hard_linked_config(tmp_path):
    """``bench --tune --write-config``'s writer (the tuning takes minutes): the config and its
    .bak are new 0600 files; another name of the old config keeps it (it was rewritten in place)."""
    from rpcctl.bench import tuning

    shared = tmp_path / "shared.yaml"
    shared.write_text("script: train.py\n")
    shared.chmod(0o644)
    config = tmp_path / "job.yaml"
    os.link(shared, config)
    tuning.write_config(config, {"env": {"THP_MEM_ALLOC_ENABLE": "1"}})
    assert shared.read_text() == "script: train.py\n" and stat.S_IMODE(shared.stat().st_mode) == 0o644
    assert "THP_MEM_ALLOC_ENABLE" in config.read_text() and config.stat().st_ino != shared.stat().st_ino
    assert (
        stat.S_IMODE(config.stat().st_mode) == 0o600 and (tmp_path / "job.yaml.bak").read_text() == "script: train.py\n"
    )
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):
        tuning.write_config(fifo, {"env": {"A": "1"}})  # never opened: reading it would block


# -- non-finite values -----------------------------------------------------------------------------


def _strict(text: str):
    """JSON as the spec has it: NaN and Infinity are not JSON (browsers' JSON.parse refuses them)."""

    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON output")

    return json.loads(text, parse_constant=refuse)


def test_inf_and_nan_losses_reach_every_json_output_as_strict_json(non_finite_run, tmp_path):
    from rpcctl.web import page

    out = tmp_path / "trace.json"
    result = rpcctl("trace", str(non_finite_run), "-o", str(out))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    events = _strict(out.read_text())["traceEvents"]
    counters = [(e["name"], e["args"][e["name"]]) for e in events if e["ph"] == "C"]
    assert [v for n, v in counters if n == "loss"] == [1.0, 0.5, 0.25]
    assert [v for n, v in counters if n == "grad_norm"] == [1.0, 0.5]
    marks = sorted(
        (e["args"]["metric"], e["args"]["value"]) for e in events if e["ph"] == "i" and e.get("cat") == "metric"
    )
    # A NaN loss is stored as no value (SQLite has no NaN), a NaN metric as NaN.
    assert marks == [("grad_norm", "-inf"), ("grad_norm", "inf"), ("grad_norm", "nan"), ("loss", "inf")]

    shown = rpcctl("inspect", "losses", str(non_finite_run), "--json")
    assert shown.returncode == 0, shown.stderr
    assert [r["loss"] for r in _strict(shown.stdout)] == [1.0, None, None, 0.5, 0.25]

    report = tmp_path / "report.html"
    result = rpcctl("report", str(non_finite_run), "-o", str(report))
    assert result.returncode == 0, result.stderr
    embedded = report.read_text().split('<script type="application/json" id="rpcctl-view">')[1].split("</script>")[0]
    figures = _strict(embedded)["figures"]
    assert [t["y"] for t in figures["fig-metric-0"]["data"]] == [[1.0, 0.5, 0.25]]  # the chart leaves the gaps out
    _strict(page.view_json(page.run_view(non_finite_run)))  # the live page's /api/view


# -- plotly placeholders ---------------------------------------------------------------------------

# Plotly fills %{...} in names, titles and hover templates after our escaping, with raw values:
# this metric name would put a live link into the legend through %{meta.metric}.
PLACEHOLDERS = '<a href="https://evil.example/">click</a>%{meta.metric}%{x}%{meta}'
OUR_PLACEHOLDERS = re.compile(r"%\{(x|y|customdata)(:[^}]*)?\}")


def _live_placeholders(figure: dict) -> list[tuple[str, str]]:
    """Every %{...} in a figure's strings (``meta`` is data, never drawn) that is not one of
    rpcctl's own hover-template fields."""
    found = []

    def walk(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                if k != "meta":
                    walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str):
            for match in re.finditer(r"%\{[^}]*\}", value):
                if key != "hovertemplate" or not OUR_PLACEHOLDERS.fullmatch(match.group()):
                    found.append((key, value))

    walk({"data": figure["data"], "layout": figure["layout"]})
    return found


def test_rank_text_carries_no_plotly_placeholder_into_a_run_or_bench_page(tmp_path):
    from rpcctl.bench.results import BenchReport, BenchResult
    from rpcctl.web import bench, page

    run_dir = _run(
        tmp_path,
        "import rpcctl\n"
        f"for step in range(3):\n    rpcctl.report(step=step, loss=1.0 / (step + 1), **{{{PLACEHOLDERS!r}: 0.5}})\n",
    )
    figures = page.run_view(run_dir)["figures"]
    [chart] = [f for f in figures.values() if f["data"] and f["data"][0].get("meta", {}).get("metric") == PLACEHOLDERS]
    assert "&#37;{meta.metric}" in chart["layout"]["title"]["text"]  # shown as text: plotly draws &#37; as %
    assert {k: v for f in figures.values() for k, v in _live_placeholders(f)} == {}

    rows = [
        BenchResult(
            suite="latency",
            transport=PLACEHOLDERS,
            op=PLACEHOLDERS,
            payload_bytes=None,
            in_flight=1,
            world_size=2,
            n=10,
            repeats=3,
            p50_us=10.0,
            p90_us=12.0,
            p99_us=15.0,
            min_us=8.0,
            max_us=20.0,
            mean_us=10.0,
            gbps=None,
            calls_per_s=None,
            spread=0.1,
            noisy=False,
            repeat_estimates=[9.0, 10.0, 11.0],
        )
    ]
    BenchReport(results=rows, machine={"hostname": PLACEHOLDERS}).save(tmp_path / "bench.json")
    view, _ = bench.bench_view(tmp_path / "bench.json")
    assert view["figures"] and {k: v for f in view["figures"].values() for k, v in _live_placeholders(f)} == {}


@pytest.mark.browser
def test_a_bench_transport_named_with_a_placeholder_draws_no_link_in_the_legend(browser, tmp_path):
    """In the real page: plotly fills %{meta.transport} in a legend entry with the raw
    transport name, whose <a href> it would draw as a link."""
    from rpcctl.bench.results import BenchReport, BenchResult

    hostile = PLACEHOLDERS.replace("meta.metric", "meta.transport")
    rows = [
        BenchResult(
            suite="latency",
            transport=transport,
            op="rpc_sync",
            payload_bytes=None,
            in_flight=1,
            world_size=2,
            n=10,
            repeats=3,
            p50_us=10.0,
            p90_us=12.0,
            p99_us=15.0,
            min_us=8.0,
            max_us=20.0,
            mean_us=10.0,
            gbps=None,
            calls_per_s=None,
            spread=0.1,
            noisy=False,
            repeat_estimates=[9.0, 10.0, 11.0],
        )
        for transport in ("rpc", hostile)
    ]  # two: a legend is drawn
    BenchReport(results=rows, machine={}).save(tmp_path / "bench.json")
    out = tmp_path / "bench.html"
    assert rpcctl("report", str(tmp_path / "bench.json"), "-o", str(out)).returncode == 0
    browser.open(out.resolve().as_uri())
    browser.wait_for("return window.rpcctlView && window.rpcctlView.draws >= 1", 60, "the report's first draw")
    browser.screenshot(tmp_path / "page.png")
    legend = browser.wait_for(
        "var t = document.querySelectorAll('#fig-bench-latency .legendtext');"
        " return t.length == 2 && Array.from(t).map(function (e) { return e.textContent; })",
        30,
        "the legend",
    )
    assert sorted(legend) == sorted(["rpc", hostile])  # the name, as text
    assert browser.js("return document.querySelectorAll('svg a').length") == 0


# -- bounded outputs -------------------------------------------------------------------------------


def test_a_huge_exception_is_capped_where_it_is_stored_and_kept_whole_in_the_log(tmp_path):
    """2 MB of exception message: run.json, the error file, the terminal and the live view each
    keep its head and tail and say how much was cut; the rank's log keeps it all."""
    from rpcctl.web import page

    launched, run_dir = _launch(tmp_path, "raise RuntimeError('HEAD' + 'x' * 2_000_000 + 'TAIL')\n")
    assert launched.returncode == 1 and len(launched.stdout) + len(launched.stderr) < 64_000, len(launched.stderr)
    assert (run_dir / "run.json").stat().st_size < 100_000 and (
        run_dir / "errors" / "rank-0.json"
    ).stat().st_size < 64_000
    cause = json.loads((run_dir / "run.json").read_text())["root_cause"]
    for text in (cause["message"], cause["traceback"]):
        assert "HEAD" in text and "TAIL" in text and "characters cut; the whole is in logs/rank-0.log" in text
    assert len(cause["message"]) < 5_000 and len(cause["traceback"]) < 17_000
    assert (run_dir / "logs" / "rank-0.log").stat().st_size > 2_000_000
    assert len(page.view_json(page.run_view(run_dir))) < 100_000  # each poll of the live page


METRICS = textwrap.dedent(
    """
    import rpcctl
    for step in range(150):
        rpcctl.report(step=step, loss=1.0 / (step + 1), **{f"m{i:02d}": step * i for i in range(30)})
    """
)


def test_trace_and_report_are_bounded_however_many_metrics_and_say_how_to_get_all(tmp_path):
    run_dir = _run(tmp_path, METRICS)
    out = tmp_path / "trace.json"
    assert rpcctl("trace", str(run_dir), "-o", str(out), "--max-events", "1000").returncode == 0
    document = _strict(out.read_text())
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert 900 <= len(counters) <= 1000 and document["otherData"]["left_out"]["counter_points"] == 31 * 150 - len(
        counters
    )
    assert rpcctl("trace", str(run_dir), "-o", str(out), "--max-events", "0").returncode == 0
    assert len([e for e in _strict(out.read_text())["traceEvents"] if e["ph"] == "C"]) == 31 * 150

    report = tmp_path / "report.html"
    for flags, charts in (([], 16), (["--all"], 31)):
        assert rpcctl("report", str(run_dir), "-o", str(report), *flags).returncode == 0
        embedded = (
            report.read_text().split('<script type="application/json" id="rpcctl-view">')[1].split("</script>")[0]
        )
        view = _strict(embedded)
        assert len([f for f in view["figures"] if f.startswith("fig-metric-")]) == charts
        assert ("15 more metric(s) not drawn" in view["html"]["losses"]) == (not flags)
    help_text = rpcctl("report", "--help").stdout + rpcctl("trace", "--help").stdout
    assert "--all" in help_text and "--max-events" in help_text
