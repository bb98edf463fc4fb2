"""Tables at the widths people use: key cells (ids, names, status) are never cut, the columns
that do not fit are hidden lowest priority first and named in a footnote, long text folds.
Through the real CLI on real runs at COLUMNS=80 and 160, and ``render_table`` directly; then the
number formatters (one format per quantity, one scale per column)."""

from __future__ import annotations

import json
import os
import re

import pytest
from rich.console import Console as RichConsole

from rpcctl.console import HIGH, KEY, LOW, Column, bandwidth_scale, fmt_loss, rate_scale, render_table, significant
from conftest import ROOT, WORKERS, assert_no_process_left, rpcctl, write_config

WIDTHS = (80, 160)
SHOWN_STATE = {"at shutdown": "released at shutdown", "leaked": "leaked"}  # RRefRecord.shown_state


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Two real runs: an RPC job holding RRefs to its end and reporting losses (3 ranks), and
    configs/failing.yaml."""
    runs_dir = tmp_path_factory.mktemp("runs")
    job = write_config(
        tmp_path_factory.mktemp("job"),
        name="rref-job",
        script=str(WORKERS / "report_job.py"),
        nproc_per_node=3,
        preload=["torch", "torch.distributed.rpc"],
        rpc={"init": True},
        env={"STEPS": "6"},
    )
    found = {}
    for name, config, expected in (("rref-job", str(job), 0), ("failing", "configs/failing.yaml", 1)):
        result = rpcctl("launch", config, "--runs-dir", str(runs_dir), "--no-live", cwd=ROOT, timeout=150)
        assert result.returncode == expected, result.stderr
        (run_dir,) = [p for p in runs_dir.iterdir() if p.name.startswith(name) and p.is_dir()]
        assert_no_process_left(run_dir)
        found[name] = run_dir
    found["dir"] = runs_dir
    return found


def view(width: int, *args: str) -> str:
    result = rpcctl(*args, env={**os.environ, "COLUMNS": str(width)}, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(len(line) <= width for line in lines), result.stdout
    return result.stdout


def document(*args: str) -> list[dict]:
    result = rpcctl(*args, "--json", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_rows_whole(out: str, headers: list[str], rows: list[list[str]]) -> None:
    """Every header is shown, and each row's key cells are whole, on one line, never cut."""
    lines = out.splitlines()
    header = next((line for line in lines if all(h in line.split("  ") or h in line for h in headers)), None)
    assert header is not None, f"headers {headers} not all shown:\n{out}"
    for cells in rows:
        assert any(all(f" {c} " in f" {line} " for c in cells) for line in lines), f"row {cells} cut or split:\n{out}"
    assert "…" not in out, out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("width", WIDTHS)
def test_runs_keeps_id_and_status(runs, width):
    out = view(width, "runs", "--runs-dir", str(runs["dir"]))
    records = document("runs", "--runs-dir", str(runs["dir"]))
    assert_rows_whole(out, ["RUN", "STATUS", "STARTED"], [[r["run_id"], r["status"]] for r in records])
    assert "failed" in out and "succeeded" in out
    if width == 80:  # what does not fit is named, with the way to see it
        assert "hidden to fit 80 columns:" in out and "--json shows them" in out
    else:
        assert "hidden" not in out
        assert_rows_whole(
            out, ["NAME", "RANKS", "DURATION", "ROOT CAUSE"], [[r["name"], str(r["world_size"])] for r in records]
        )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_rrefs_wide_keeps_id_owner_state(runs, width):
    run = str(runs["rref-job"])
    records = document("inspect", "rrefs", run)
    assert records
    for wide in ([], ["--wide"]):
        out = view(width, "inspect", "rrefs", run, *wide)
        assert_rows_whole(
            out,
            ["RREF", "OWNER", "STATE"],
            [[r["rref_id"], r["owner"], SHOWN_STATE.get(r["ending"], r["state"])] for r in records],
        )
    if width == 160:
        assert "CREATOR" in out and "CREATED" in out  # --wide's detail columns fit at 160
    else:
        assert "hidden to fit 80 columns:" in out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_workers_keeps_rank_name_state(runs, width):
    run = str(runs["rref-job"])
    records = document("inspect", "workers", run)
    for wide in ([], ["--wide"]):
        out = view(width, "inspect", "workers", run, *wide)
        assert_rows_whole(
            out, ["RANK", "NAME", "STATE", "PID"], [[str(r["rank"]), r["name"], r["state"]] for r in records]
        )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("width", WIDTHS)
def test_bench_list_keeps_transport_names(width):
    out = view(width, "bench", "--list")
    rows = [line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith(" ")]
    for name in ("rpc", "rpc-threads", "rpc-tuned", "gloo", "tcp", "memcpy", "tf-allreduce", "horovod"):
        assert name in rows, out
    assert_rows_whole(out, ["TRANSPORT", "STATUS", "WHAT"], [["tf-allreduce"], ["rpc-malloc", "ok"]])


@pytest.mark.timeout(240)
def test_losses_table_uses_four_significant_figures(runs):
    run = str(runs["rref-job"])
    summaries = document("inspect", "losses", run, "--summary")
    out = view(160, "inspect", "losses", run)
    shown = [s for s in summaries if s["count"]]
    assert shown
    for s in shown:
        cells = [fmt_loss(s["first"]), fmt_loss(s["last"])]
        assert any(
            line.split()[:1] == [str(s["rank"])] and all(c in line.split() for c in cells) for line in out.splitlines()
        ), out
    assert "1.667" in out  # rank 0's last loss, 10 / 6


def column_text(lines: list[str], header: str, title: str, first: int, end: int) -> str:
    """The text of the column titled ``title`` in rows ``first`` to ``end``, its folded lines joined."""
    start = header.index(title)
    return "".join(line[start:].split("  ")[0].strip() for line in lines[first:end])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("width", WIDTHS)
def test_launch_dry_run_keeps_ranks_and_folds_env_and_logs(tmp_path, width):
    # A long runs directory, so the logs and the run directory must fold at both widths.
    runs_dir = tmp_path / "runs-under-a-long-directory-name-so-every-path-is-wider-than-half-a-terminal"
    config = write_config(tmp_path, name="plan", nproc_per_node=3, env={"MARKUP": "[red]x[/red]\x1b[2J"})
    args = ("launch", str(config), "--dry-run", "--runs-dir", str(runs_dir))
    plan = document(*args)
    out = view(width, *args)
    assert "…" not in out and "hidden to fit" not in out, out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["RANK", "LOCAL", "DEVICE"])
    starts = [
        next(
            i
            for i, line in enumerate(lines)
            if line.split()[:4] == [str(r["rank"]), str(r["local_rank"]), r["device"], f"RANK={r['rank']}"]
        )
        for r in plan["ranks"]
    ]
    starts.append(next(i for i, line in enumerate(lines) if i > starts[-1] and not line.strip()))
    for rank, first, end in zip(plan["ranks"], starts, starts[1:]):
        log = column_text(lines, lines[header], "LOG", first, end)  # whole, once its folds are joined
        assert re.fullmatch(
            re.escape(str(runs_dir.resolve()))
            + r"/plan-[0-9]{8}-[0-9]{6}-[0-9a-f]+/logs/rank-"
            + str(rank["rank"])
            + r"\.log",
            log,
        ), out
    # The environment every rank shares: each name whole, values as they are (data, not markup).
    shared = {k: v for k, v in plan["ranks"][0]["env"].items() if all(r["env"].get(k) == v for r in plan["ranks"])}
    assert "RANK" not in shared and "WORLD_SIZE" in shared and "MARKUP" in shared
    for key in shared:
        assert any(line.split()[:1] == [key] for line in lines), (key, out)
    assert ["MARKUP", "[red]x[/red]\\x1b[2J"] in [line.split() for line in lines], out


# -- render_table itself --------------------------------------------------------------------------


COLUMNS = [
    Column("id", priority=KEY),
    Column("state", priority=KEY),
    Column("note", wrap=True, priority=HIGH),
    Column("size", justify="right"),
    Column("extra", priority=LOW),
]
ROWS = [
    {
        "id": "job-20261203-172622-4002",
        "state": "succeeded",
        "note": "a long note " * 6,
        "size": 123456,
        "extra": "x" * 12,
    }
]


def rendered(width: int, records=ROWS, columns=COLUMNS, **kwargs) -> str:
    console = RichConsole(width=width, no_color=True, highlight=False)
    with console.capture() as capture:
        console.print(render_table(records, columns, **kwargs))
    return capture.get()


def test_render_table_fits_at_natural_width_when_it_can():
    out = rendered(200, title="A title longer than the table itself, on one line")
    assert out.splitlines()[0] == "A title longer than the table itself, on one line"
    assert "EXTRA" in out and "hidden" not in out and ROWS[0]["note"].strip() in out


def test_render_table_folds_text_then_hides_lowest_priority_first():
    out = rendered(80)  # the note folds: everything else still fits
    assert "EXTRA" in out and "hidden" not in out and "a long note" in out
    out = rendered(72)
    assert "SIZE" in out and "hidden to fit 72 columns: EXTRA (--json shows them)" in out
    assert "EXTRA" not in out.replace("columns: EXTRA", "")
    table = render_table(ROWS, COLUMNS)
    assert [COLUMNS[i].key for i in table.layout(60)] == ["id", "state", "note"]  # SIZE next
    for width in (40, 60, 72, 80):
        out = rendered(width)
        assert ROWS[0]["id"] in out and "succeeded" in out and "…" not in out
        assert all(len(line) <= width for line in out.splitlines())


def test_render_table_never_hides_keys_even_too_narrow():
    out = rendered(20)  # the keys alone are wider: they fold, every character kept
    assert out.splitlines()[0].split() == ["ID", "STATE"]
    assert "…" not in out and "succeeded" in out and "job-20261" in out and "2-4002" in out


def test_render_table_clips_a_glimpse_column_to_one_line_and_styles_cells():
    # The live panel's LAST LINE: cut with "…" to keep one line a row; its STATE: coloured by value.
    columns = [Column("id", priority=KEY, style=lambda v: "bold red" if v == "b" else ""), Column("line", clip=True)]
    records = [{"id": "a", "line": "loss 0.5 " * 12}, {"id": "b", "line": "short"}]
    lines = rendered(40, records=records, columns=columns).splitlines()
    assert [line.split()[0] for line in lines] == ["ID", "a", "b"], lines
    assert lines[1].rstrip().endswith("…") and len(lines[1]) <= 40, lines
    assert [cell.style for cell, _ in render_table(records, columns).rows] == ["", "bold red"]


def test_a_varies_column_shows_only_where_values_differ_and_a_sparse_one_only_where_one_has_a_value():
    """WORLD (varies): shown where processes joined several worlds, a launched rank's none aside;
    ROUND (sparse): shown where one listed run is elastic, even alone."""
    columns = [Column("id", priority=KEY), Column("world", varies=True), Column("round", sparse=True)]

    def headers(records):
        return rendered(80, records=records, columns=columns).splitlines()[0].split()

    assert headers([{"id": "a", "world": None, "round": None}, {"id": "b", "world": 0, "round": None}]) == ["ID"]
    assert headers([{"id": "a", "world": 0, "round": ""}, {"id": "b", "world": 1, "round": None}]) == ["ID", "WORLD"]
    assert headers([{"id": "a", "world": 1, "round": "2 (1 node)"}]) == ["ID", "ROUND"]


def test_render_table_detail_hint_and_empty():
    out = rendered(40, detail=True)
    assert "(--json shows them)" in out
    assert rendered(40, records=[]).strip() == "nothing to show"


# -- numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, shown",
    [
        (0.0012341, "0.001234"),
        (12.3456, "12.35"),
        (1234.6, "1235"),
        (2.0, "2"),
        (0.5, "0.5"),
        (12345.0, "1.234e+04"),
        (float("nan"), "nan"),
    ],
)
def test_fmt_loss_four_significant_figures(value, shown):
    assert fmt_loss(value) == shown


@pytest.mark.parametrize(
    "value, digits, shown",
    [
        (1234.0, 3, "1234"),
        (0.0031, 3, "0.00310"),
        (9.996, 3, "10.0"),
        (2.0, 3, "2.00"),
        (0.0, 3, "0.00"),
        (13000.0, 3, "13000"),
    ],
)
def test_significant(value, digits, shown):
    assert significant(value, digits) == shown


def test_rate_scale_one_scale_per_column():
    column = [2269.0, 13000.0, 850.0]
    fmt = rate_scale.pick(column)
    assert [fmt(v) for v in column] == ["2.27 k", "13.0 k", "0.850 k"]
    fmt = rate_scale.pick([2269.0, 85.3])
    assert [fmt(v) for v in (2269.0, 85.3)] == ["2269", "85.3"]
    assert rate_scale(2.5e6) == "2.50 M"


def test_bandwidth_scale_megabytes_when_gigabytes_read_zero():
    fmt = bandwidth_scale.pick([0.0031, 0.42])
    assert [fmt(v) for v in (0.0031, 0.42)] == ["3.10 MB/s", "420 MB/s"]
    fmt = bandwidth_scale.pick([0.0031, 5.2])
    assert [fmt(v) for v in (0.0031, 5.2)] == ["0.00310 GB/s", "5.20 GB/s"]


def test_render_table_applies_one_scale_to_the_whole_column():
    columns = [Column("t", priority=KEY), Column("rate", "CALLS/S", rate_scale, "right")]
    out = rendered(
        80, records=[{"t": "a", "rate": 2269.0}, {"t": "b", "rate": 13000.0}, {"t": "c", "rate": None}], columns=columns
    )
    assert "2.27 k" in out and "13.0 k" in out and "2269" not in out


# -- messages: one grammar ------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_an_empty_filter_says_what_matched_nothing_and_exits_0(runs):
    run = str(runs["rref-job"])
    for extra, said in (
        (["--owner", "worker9"], "no RRefs match owner=worker9"),
        (["--owner", "worker1", "--state", "pending"], "no RRefs match owner=worker1, state=pending"),
        (["--owner", "worker9", "--summary"], "no RRefs match owner=worker9"),
    ):
        result = rpcctl("inspect", "rrefs", run, *extra, cwd=ROOT)
        assert result.returncode == 0 and result.stdout.strip() == said, (extra, result.stdout, result.stderr)
    # A rank the run does not have is a usage error, written as --ranks takes ranges (0-2).
    result = rpcctl("inspect", "losses", run, "--rank", "7", cwd=ROOT)
    assert result.returncode == 2 and f"--rank 7: run {runs['rref-job'].name} has ranks 0-2" in result.stderr, (
        result.stderr
    )
    result = rpcctl("logs", run, "--rank", "7", cwd=ROOT)
    assert result.returncode == 2 and "has ranks 0-2" in result.stderr, result.stderr


def test_notes_are_escaped_once():
    result = rpcctl("bench", "--list", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "\\[" not in result.stderr, result.stderr
    assert "pip install 'rpcctl[ray]'" in result.stderr or "ray" not in result.stderr, result.stderr


@pytest.mark.timeout(240)
def test_loss_grid_hides_the_rightmost_ranks_first(runs):
    run = str(runs["rref-job"])
    out = view(160, "inspect", "losses", run, "--last", "2")
    assert "STEP  RANK 0  RANK 1  RANK 2" in out and "1.667" in out  # 10 / 6: four significant figures
    out = view(24, "inspect", "losses", run, "--last", "2")
    grid = out.split("Per rank")[0]
    assert "STEP  RANK 0  RANK 1" in grid and "RANK 2  " not in grid and "…" not in grid, out
    assert "hidden to fit 24" in grid, out
