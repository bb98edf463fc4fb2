"""rpcctl bench, the pure parts: statistics, timing loops, results, rendering, compare, planning,
tuning, and the adapter interface run in-process. No launches here (see test_bench_suites.py)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console as RichConsole
from typer.testing import CliRunner

from rpcctl.bench import measure, stats
from rpcctl.bench.compare import compare, summary_counts
from rpcctl.bench.results import BenchReport, BenchResult, render_report, result_from_measurement, with_ratios
from rpcctl.bench.runner import EventFollower, plan_bench, resolve_suites, resolve_transports
from rpcctl.bench.suites import FULL, QUICK, Case, Timing, payload
from rpcctl.bench.transports import RankContext, Transport, TransportSpec, register, transports
from rpcctl.bench.unit import run_unit
from rpcctl.commands.bench import bench_app
from rpcctl.console import Console, set_console
from rpcctl.base.errors import RpcctlError, UsageError

pytestmark = pytest.mark.timeout(60)

TINY = Timing(warmup_s=0.0, repeat_s=0.001, repeats=3, min_calls=2, max_calls=50, min_warmup_calls=1)


def capture_console() -> tuple[Console, RichConsole, RichConsole]:
    out = RichConsole(record=True, width=160, no_color=True, file=io.StringIO())
    err = RichConsole(record=True, width=160, no_color=True, file=io.StringIO())
    console = Console(out=out, err=err)
    set_console(console)
    return console, out, err


# -- stats -------------------------------------------------------------------------------------


def test_summarize_percentiles_interpolate_like_numpy():
    s = stats.summarize([float(i) for i in range(1, 101)])
    assert (s.n, s.min, s.max) == (100, 1.0, 100.0)
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.mean == pytest.approx(50.5)


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf]])
def test_summarize_refuses_empty_or_non_finite(bad):
    with pytest.raises(ValueError):
        stats.summarize(bad)


def test_spread_and_noise_flag():
    assert stats.spread([10.0]) == 0.0
    assert stats.spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)
    assert not stats.is_noisy(stats.spread([9.5, 10.0, 10.5]))
    assert stats.is_noisy(stats.spread([5.0, 10.0, 15.0]))
    assert stats.spread([0.0, 0.0]) == math.inf


def test_tolerance_is_half_the_widest_spread_with_a_floor():
    assert stats.tolerance(0.0, 0.01) == stats.MIN_TOLERANCE
    assert stats.tolerance(0.4, 0.1) == pytest.approx(0.2)
    assert stats.tolerance(None, math.inf) == stats.MIN_TOLERANCE


def test_calls_per_repeat_is_clamped():
    assert stats.calls_per_repeat(0.001, 0.1, 2, 1000) == 100
    assert stats.calls_per_repeat(10.0, 0.1, 2, 1000) == 2
    assert stats.calls_per_repeat(1e-9, 0.1, 2, 1000) == 1000
    assert stats.calls_per_repeat(0.0, 0.1, 2, 1000) == 1000


# -- timing loops --------------------------------------------------------------------------------


def test_pipelined_keeps_at_most_in_flight_outstanding_and_completes_fifo():
    outstanding, peak, issued, waited = [0], [0], [], []

    def issue():
        outstanding[0] += 1
        peak[0] = max(peak[0], outstanding[0])
        issued.append(len(issued))
        return issued[-1]

    def wait(handle):
        outstanding[0] -= 1
        waited.append(handle)

    batch = measure.pipelined(issue, wait, calls=20, in_flight=8)
    assert peak[0] == 8 and outstanding[0] == 0
    assert waited == list(range(20))
    assert len(batch.latencies_ns) == 20 and all(ns >= 0 for ns in batch.latencies_ns)
    assert batch.elapsed_ns > 0 and batch.rate > 0


def test_measure_warms_up_twice_at_least_then_times_every_repeat():
    sizes = []

    def run_batch(calls):
        sizes.append(calls)
        return measure.closed_loop(lambda: sum(range(50)), calls)

    m = measure.measure(run_batch, TINY)
    warmups = len(sizes) - TINY.repeats
    assert warmups >= 2
    assert m.warmup_calls == sum(sizes[:warmups])
    assert len(m.repeat_medians_s) == len(m.repeat_rates) == TINY.repeats
    assert len(m.samples_s) == TINY.repeats * m.calls_per_repeat
    assert TINY.min_calls <= m.calls_per_repeat <= TINY.max_calls
    assert all(s > 0 for s in m.samples_s)


# -- results -------------------------------------------------------------------------------------


def measured(samples_s, rates=(100.0, 110.0, 105.0)):
    return {"samples_s": list(samples_s), "repeat_medians_s": [0.001, 0.0011, 0.00105], "repeat_rates": list(rates)}


def test_payload_result_counts_bytes_both_ways_and_leaves_calls_null():
    case = Case("payload", "echo", 1 << 20)
    row = result_from_measurement("tcp", case, measured([0.001] * 10), bytes_per_call=2 << 20)
    assert row["gbps"] == pytest.approx(2 * (1 << 20) / 0.001 / 1e9)
    assert row["calls_per_s"] is None
    assert row["p50_us"] == pytest.approx(1000.0) and row["n"] == 10
    assert row["repeat_estimates"] == pytest.approx([1000.0, 1100.0, 1050.0])


def test_throughput_result_reports_the_median_rate_and_its_noise():
    case = Case("throughput", "echo", 8, in_flight=8)
    row = result_from_measurement("tcp", case, measured([0.001] * 10, rates=(90.0, 100.0, 130.0)), bytes_per_call=16)
    assert row["calls_per_s"] == 100.0 and row["gbps"] is None
    assert row["spread"] == pytest.approx(0.4) and row["noisy"] is True


def row(transport, suite="latency", op="rpc_sync", p50=100.0, rate=None, world=2, size=8, spread=0.0, in_flight=1):
    return BenchResult(
        suite=suite,
        transport=transport,
        op=op,
        payload_bytes=size,
        in_flight=in_flight,
        world_size=world,
        n=10,
        repeats=5,
        p50_us=p50,
        p90_us=p50,
        p99_us=p50 * 2,
        min_us=p50 / 2,
        max_us=p50 * 3,
        mean_us=p50,
        gbps=None,
        calls_per_s=rate,
        spread=spread,
        noisy=stats.is_noisy(spread),
    )


def test_ratios_use_the_rpc_row_of_the_same_case():
    rows = with_ratios(
        [
            row("rpc", p50=200.0),
            row("rpc", op="rpc_async", p50=400.0),
            row("rpc-tuned", op="rpc_async", p50=200.0),
            row("gloo", op="send_recv", p50=50.0),
            row("memcpy", op="copy", p50=2.0, world=1),
            row("rpc", suite="throughput", op="rpc_async", rate=1000.0, in_flight=8),
            row("tcp", suite="throughput", op="echo", rate=30000.0, in_flight=8),
            row("tcp", suite="throughput", op="echo", rate=30000.0, in_flight=64),
        ]
    )
    ratios = {(r.transport, r.op, r.in_flight): r.vs_rpc for r in rows}
    assert ratios[("rpc", "rpc_sync", 1)] == 1.0
    assert ratios[("rpc-tuned", "rpc_async", 1)] == 2.0  # against rpc's rpc_async, not rpc_sync
    assert ratios[("gloo", "send_recv", 1)] == 4.0
    assert ratios[("memcpy", "copy", 1)] == 100.0  # one process vs two: still the same case
    assert ratios[("tcp", "echo", 8)] == 30.0
    assert ratios[("tcp", "echo", 64)] is None  # no rpc row to compare with


def test_document_has_the_issue_schema_and_round_trips(tmp_path):
    report = BenchReport(results=[row("rpc")], machine={"cpu": "x"}, notes=["ray: skipped"])
    report.save(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert set(data) >= {"results", "machine"}
    assert set(data["results"][0]) >= {
        "transport",
        "op",
        "payload_bytes",
        "p50_us",
        "p99_us",
        "gbps",
        "calls_per_s",
        "n",
    }
    assert data["results"][0]["gbps"] is None
    again = BenchReport.from_dict(data)
    assert again.results[0] == report.results[0]


def test_minimal_schema_documents_load():
    data = {
        "results": [
            {
                "transport": "rpc",
                "op": "rpc_sync",
                "payload_bytes": 1024,
                "p50_us": 500.0,
                "p99_us": 900.0,
                "gbps": 0.004,
                "calls_per_s": None,
                "n": 100,
            }
        ],
        "machine": {},
    }
    report = BenchReport.from_dict(data)
    assert report.results[0].suite == "payload" and report.results[0].spread == 0.0


def test_tables_are_grouped_by_suite_with_ratios():
    console, out, _ = capture_console()
    report = BenchReport(
        results=[
            row("rpc", p50=200.0),
            row("gloo", op="send_recv", p50=50.0),
            row("rpc", suite="train", op="train_step", rate=50.0, size=None, world=3, spread=0.5),
        ],
        machine={},
    )
    for table in render_report(report, order=["rpc", "gloo"]):
        console.print(table)
    text = out.export_text()
    assert "latency: one round trip" in text and "train: parameter-server" in text
    assert text.index("rpc ") < text.index("gloo")
    assert "4.00×" in text and "200 µs" in text
    assert "±25%*" in text  # the noisy train row is marked


# -- compare -------------------------------------------------------------------------------------


def test_compare_flags_only_changes_beyond_the_noise():
    old = BenchReport(
        [
            row("rpc", p50=100.0, spread=0.02),
            row("gloo", op="send_recv", p50=100.0, spread=0.6),
            row("tcp", op="echo", p50=10.0),
        ],
        {},
    )
    new = BenchReport(
        [
            row("rpc", p50=150.0, spread=0.02),
            row("gloo", op="send_recv", p50=125.0, spread=0.1),
            row("memcpy", op="copy", p50=1.0, world=1),
        ],
        {},
    )
    verdicts = {c.transport: c.verdict for c in compare(old, new)}
    assert verdicts == {"rpc": "slower", "gloo": "same", "tcp": "removed", "memcpy": "added"}
    assert summary_counts(compare(old, new))["slower"] == 1


def test_compare_command_prints_ratios_and_can_fail_on_regression(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    BenchReport(
        [row("rpc", p50=100.0), row("rpc", suite="throughput", op="rpc_async", rate=1000.0, in_flight=8)], {"cpu": "a"}
    ).save(old)
    BenchReport(
        [row("rpc", p50=200.0), row("rpc", suite="throughput", op="rpc_async", rate=2000.0, in_flight=8)], {"cpu": "a"}
    ).save(new)
    console, out, err = capture_console()
    result = CliRunner().invoke(bench_app, ["compare", str(old), str(new)])
    assert result.exit_code == 0, result.output
    text = out.export_text()
    assert "-50.0%" in text and "REGRESSION" in text and "+100.0%" in text and "faster" in text
    assert "1 slower, 1 faster" in err.export_text()

    result = CliRunner().invoke(bench_app, ["compare", str(old), str(new), "--fail-on-regression"])
    assert isinstance(result.exception, RpcctlError) and result.exception.exit_code == 1


def test_compare_common_shows_only_the_rows_both_have(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    BenchReport([row("rpc", p50=100.0), row("tcp", op="echo", p50=10.0)], {}).save(old)
    BenchReport([row("rpc", p50=100.0), row("memcpy", op="copy", p50=1.0, world=1)], {}).save(new)
    everything = json.loads(CliRunner().invoke(bench_app, ["compare", str(old), str(new), "--json"]).stdout)
    assert sorted(c["verdict"] for c in everything["comparisons"]) == ["added", "removed", "same"]
    common = json.loads(CliRunner().invoke(bench_app, ["compare", str(old), str(new), "--json", "--common"]).stdout)
    assert [(c["transport"], c["verdict"]) for c in common["comparisons"]] == [("rpc", "same")]
    assert common["summary"]["added"] == common["summary"]["removed"] == 0
    console, out, _ = capture_console()
    assert CliRunner().invoke(bench_app, ["compare", str(old), str(new), "--common"]).exit_code == 0
    table = out.export_text()
    assert "rpc" in table and "tcp" not in table and "memcpy" not in table


def test_compare_json_is_one_document(tmp_path, capsys):
    path = tmp_path / "r.json"
    BenchReport([row("rpc")], {}).save(path)
    result = CliRunner().invoke(bench_app, ["compare", str(path), str(path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["summary"]["same"] == 1 and data["comparisons"][0]["speedup"] == 1.0


def test_compare_rejects_files_that_are_not_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    result = CliRunner().invoke(bench_app, ["compare", str(bad), str(bad)])
    assert isinstance(result.exception, UsageError) and "results" in str(result.exception)
    result = CliRunner().invoke(bench_app, ["compare", str(tmp_path / "missing.json"), str(bad)])
    assert isinstance(result.exception, UsageError)


# -- planning ------------------------------------------------------------------------------------


def test_unknown_transport_or_suite_is_a_usage_error_with_a_hint():
    with pytest.raises(UsageError, match="did you mean 'gloo'"):
        resolve_transports(["glo"], QUICK)
    with pytest.raises(UsageError, match="suites: latency"):
        resolve_suites(["latncy"])
    assert resolve_suites(["payload,latency"]) == ("latency", "payload")
    names = [t.name for t in resolve_transports(["tcp", "rpc,tcp"], QUICK)]
    assert names == ["rpc", "tcp"]  # registry order, no duplicates


def test_plan_units_per_transport_and_world_size(monkeypatch):
    specs = resolve_transports(["rpc,rpc-thp,gloo,memcpy"], QUICK)
    plan = plan_bench(("latency", "payload", "throughput", "train"), specs, QUICK)
    units = {(u.transport.name, u.world_size): u for u in plan.units}
    assert set(units) == {("rpc", 2), ("rpc", 3), ("rpc-thp", 2), ("rpc-thp", 3), ("gloo", 2), ("memcpy", 1)}
    rpc2 = units[("rpc", 2)]
    assert [c.suite for c in rpc2.cases].count("payload") == len(QUICK.payload_sizes) >= 5
    assert [c.in_flight for c in rpc2.cases if c.suite == "throughput"] == [1, 8, 64]
    assert [c.suite for c in units[("rpc", 3)].cases] == ["train"]
    assert not any(c.suite == "throughput" for c in units[("memcpy", 1)].cases)
    assert units[("rpc-thp", 2)].env["THP_MEM_ALLOC_ENABLE"] == "1" and "THP_MEM_ALLOC_ENABLE" not in rpc2.env
    assert rpc2.env["OMP_NUM_THREADS"] == "1"
    assert plan.total_cases == sum(len(u.cases) for u in plan.units)


def test_unavailable_transports_become_notes(monkeypatch):
    from rpcctl.bench.transports.ray import RayTransport

    monkeypatch.setattr(RayTransport, "unavailable", classmethod(lambda cls: "ray is not installed"))
    plan = plan_bench(("latency",), resolve_transports(["ray,tcp"], QUICK), QUICK)
    assert [u.transport.name for u in plan.units] == ["tcp"]
    assert plan.notes == ["ray: skipped: ray is not installed"]
    plan = plan_bench(("throughput",), resolve_transports(["memcpy"], QUICK), QUICK)
    assert not plan.units and "memcpy: no case" in plan.notes[0]


def test_every_known_transport_is_listed():
    console, out, _ = capture_console()
    result = CliRunner().invoke(bench_app, ["--list"])
    assert result.exit_code == 0, result.output
    text = out.export_text()
    for name in transports():
        assert name in text
    assert set(QUICK.default_transports) <= set(transports()) and set(FULL.default_transports) <= set(transports())


@pytest.mark.parametrize("width", [80, 160])
def test_list_never_cuts_a_transport_name_or_status(width):
    out = RichConsole(record=True, width=width, no_color=True, file=io.StringIO())
    set_console(Console(out=out, err=RichConsole(record=True, width=width, file=io.StringIO())))
    result = CliRunner().invoke(bench_app, ["--list"])
    assert result.exit_code == 0, result.output
    lines = out.export_text().splitlines()
    assert all(len(line) <= width for line in lines)
    heads = [re.split(r"\s{2,}", line.strip())[:4] for line in lines[1:] if line.strip() and not line.startswith(" ")]
    assert {h[0] for h in heads} == set(transports())  # whole names; a wrapped summary goes below
    for head in heads:
        assert not any("…" in cell for cell in head), head
        assert head[3] in ("ok", "missing"), head


def test_every_column_key_is_a_field_or_property_of_its_record():
    from rpcctl.bench.api import TransportInfo
    from rpcctl.bench.compare import Comparison
    from rpcctl.bench.results import SUITE_COLUMNS

    def attributes(cls):
        return {f.name for f in dataclasses.fields(cls)} | {
            n for n in dir(cls) if isinstance(getattr(cls, n, None), property)
        }

    views = [(BenchResult, c) for columns in SUITE_COLUMNS.values() for c in columns]
    views += [(Comparison, c) for c in Comparison.COLUMNS] + [(TransportInfo, c) for c in TransportInfo.COLUMNS]
    for cls, column in views:
        assert column.key in attributes(cls), (cls.__name__, column.key)
    # and each suite's rows render every declared column from a real record
    sample = row("rpc")
    for column in {c.key: c for _, c in views if _ is BenchResult}.values():
        assert column.cell(sample) is not None


def test_verdict_ranks_only_beyond_the_noise():
    from rpcctl.bench.api import verdict

    rows = with_ratios(
        [
            row("rpc", p50=100.0, spread=0.02),
            row("tcp", op="echo", p50=25.0, spread=0.02),
            row("gloo", op="send_recv", p50=97.0, spread=0.02),
            row("ray", op="actor_call", p50=400.0, spread=0.02),
        ]
    )
    line = verdict(BenchReport(rows, {}))
    assert line.startswith(
        "verdict: faster than rpc: tcp 4.00×; slower: ray 0.25×; within the noise of rpc: gloo 1.03×"
    ), line
    assert "\n" not in line
    noisy = with_ratios([row("rpc", p50=100.0, spread=0.6), row("tcp", op="echo", p50=80.0, spread=0.6)])
    assert "within the noise of rpc: tcp 1.25×" in verdict(BenchReport(noisy, {}))


def test_bad_flag_combinations_are_usage_errors(tmp_path):
    """Each refusal names its own reason, exits 2, and starts nothing (no run directory)."""
    runs = tmp_path / "runs"
    refusals = [
        (["--write-config", str(tmp_path / "c.yaml")], "--write-config goes with --tune"),
        (["--tune", "--suite", "latency"], "drop --suite/--transport"),
        (["--tune", "--transport", "rpc"], "drop --suite/--transport"),
        (["--transport", "nope"], "unknown transport 'nope'"),
        (["--suite", "latncy"], "unknown suite 'latncy'"),
    ]
    for args, message in refusals:
        result = CliRunner().invoke(bench_app, [*args, "--runs-dir", str(runs)])
        assert isinstance(result.exception, UsageError), (args, result.exception)
        assert message in str(result.exception) and result.exception.exit_code == 2, (args, str(result.exception))
        assert not runs.exists(), args


def test_deprecated_spellings_still_work_and_say_so():
    from rpcctl.commands.bench import rewrite_deprecated

    _, _, err = capture_console()
    subcommands = {"compare"}
    assert rewrite_deprecated(["-s", "latency", "-t", "rpc", "--detail"], subcommands) == [
        "--suite",
        "latency",
        "--transport",
        "rpc",
        "--wide",
    ]
    assert rewrite_deprecated(["--json", "out.json", "--quick"], subcommands) == ["--output", "out.json", "--quick"]
    assert rewrite_deprecated(["--json=out.json"], subcommands) == ["--output", "out.json"]
    assert rewrite_deprecated(["--json", "-"], subcommands) == ["--json"]
    warnings = err.export_text()
    for old, new in (
        ("-s", "--suite"),
        ("-t", "--transport"),
        ("--detail", "--wide"),
        ("--json FILE", "--output out.json"),
    ):
        assert f"'{old}' is deprecated: use '{new}'" in warnings, warnings
    # the switch itself, and a subcommand's own flags, are left alone
    assert rewrite_deprecated(["--json", "--quick"], subcommands) == ["--json", "--quick"]
    assert rewrite_deprecated(["--json", "compare", "a", "b"], subcommands) == ["--json", "compare", "a", "b"]
    assert rewrite_deprecated(["compare", "a", "b", "-s"], subcommands) == ["compare", "a", "b", "-s"]

    # and through the command: -s and -t reach --suite and --transport
    result = CliRunner().invoke(bench_app, ["-s", "latncy"])
    assert isinstance(result.exception, UsageError) and "unknown suite 'latncy'" in str(result.exception)
    result = CliRunner().invoke(bench_app, ["-t", "nope"])
    assert isinstance(result.exception, UsageError) and "unknown transport 'nope'" in str(result.exception)


def test_event_follower_waits_for_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    seen = []
    follower = EventFollower(path, seen.append)
    follower.poll()  # no file yet
    path.write_text('{"event": "case"}\n{"event": "res')
    follower.poll()
    assert seen == [{"event": "case"}]
    with open(path, "a") as f:
        f.write('ult"}\n')
    assert follower.finish() == [{"event": "case"}, {"event": "result"}]


# -- tuning --------------------------------------------------------------------------------------


def test_auto_env_and_backend_options():
    """The known-good set, written out (not derived from AUTO_SETTINGS, which it checks)."""
    from rpcctl.base import rpc_settings

    env = rpc_settings.auto_rpc_env()
    assert env == {
        "THP_MEM_ALLOC_ENABLE": "1",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "67108864",
    }
    assert rpc_settings.backend_options_kwargs(env) == {}  # all of it is environment, read by c10 and glibc
    assert rpc_settings.backend_options_kwargs({}) == {}
    kwargs = rpc_settings.backend_options_kwargs(
        {"RPCCTL_RPC_TRANSPORTS": "shm, uv", "RPCCTL_RPC_CHANNELS": "cma,basic", "RPCCTL_RPC_WORKER_THREADS": "4"}
    )
    assert kwargs == {"_transports": ["shm", "uv"], "_channels": ["cma", "basic"], "num_worker_threads": 4}


# (Whether the transports really reach TensorPipe is checked by a real launch:
# tests/test_bench_suites.py::test_transport_settings_reach_tensorpipe.)


def test_score_is_the_geometric_mean_of_speedups():
    from rpcctl.bench import tuning

    base = [row("rpc", p50=100.0), row("rpc", suite="throughput", op="rpc_async", rate=100.0, in_flight=8)]
    knob = [row("rpc-x", p50=50.0), row("rpc-x", suite="throughput", op="rpc_async", rate=50.0, in_flight=8)]
    geo, band, ratios = tuning.score(knob, base)
    assert geo == pytest.approx(1.0) and set(ratios.values()) == {2.0, 0.5}
    faster = [row("rpc-x", p50=50.0)]
    geo, band, _ = tuning.score(faster, base)
    assert geo == pytest.approx(2.0) and tuning.Candidate("rpc-x", {}, geo, band).wins


def test_write_config_merges_env_and_keeps_a_backup(tmp_path):
    import yaml

    from rpcctl.bench import tuning

    config = tmp_path / "job.yaml"
    config.write_text("# mine\nscript: train.py\nenv:\n  FOO: bar\n")
    notes = tuning.write_config(config, {"transports": ["shm", "uv"], "env": {"THP_MEM_ALLOC_ENABLE": "1"}})
    data = yaml.safe_load(config.read_text())
    assert data["env"] == {"FOO": "bar", "THP_MEM_ALLOC_ENABLE": "1", "RPCCTL_RPC_TRANSPORTS": "shm,uv"}
    assert data["script"] == "train.py" and "start_method" not in data
    assert (tmp_path / "job.yaml.bak").read_text().startswith("# mine")
    assert any(".bak" in n for n in notes)


# -- the adapter interface, in-process -------------------------------------------------------------


class Loopback(Transport):
    """A test adapter: echoes in-process, so the whole worker path runs without a launch."""

    kind = "test-loopback"
    summary = "in-process echo (tests)"
    ops = {"latency": ("echo",), "payload": ("echo",), "throughput": ("echo",)}
    processes = 1

    def setup(self, ctx):
        self.ctx, self.prepared = ctx, []

    def prepare(self, op, payload, calls, in_flight):
        self.prepared.append((payload.numel(), calls, in_flight))

    def issue(self, op, payload):
        return payload.clone()

    def teardown(self):
        pass


def test_a_units_program_runs_every_case_through_an_adapter(tmp_path):
    from rpcctl.bench.unit import Events

    register(Loopback)
    spec = TransportSpec("test-loopback", "test-loopback", Loopback.summary)
    plan = plan_bench(("latency", "payload", "throughput"), [spec], QUICK, payload_sizes=(1024, 4096))
    (unit,) = plan.units
    events = tmp_path / "events.jsonl"
    document = {"transport": spec.to_dict(), "timing": TINY.to_dict(), "cases": [c.to_dict() for c in unit.cases]}
    results = run_unit(document, RankContext(0, 1, "127.0.0.1", 0), Events(events))
    assert [(r["suite"], r["payload_bytes"], r["in_flight"]) for r in results] == [
        ("latency", 8, 1),
        ("payload", 1024, 1),
        ("payload", 4096, 1),
        ("throughput", 8, 1),
        ("throughput", 8, 8),
        ("throughput", 8, 64),
    ]
    for r in results:
        assert r["bytes_per_call"] == 2 * r["payload_bytes"]
        assert 0 < r["min_us"] <= r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]
    kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert kinds == ["case", "result"] * len(results) + ["observed", "done"]


class Corrupting(Loopback):
    kind = "test-corrupting"

    def issue(self, op, payload):
        return payload[:-1].clone()


def test_an_echo_that_loses_bytes_fails_the_case():
    register(Corrupting)
    spec = TransportSpec("test-corrupting", "test-corrupting", "")
    document = {
        "transport": spec.to_dict(),
        "timing": TINY.to_dict(),
        "cases": [Case("payload", "echo", 64, 1, 1).to_dict()],
    }
    with pytest.raises(AssertionError, match="differs"):
        run_unit(document, RankContext(0, 1, "127.0.0.1", 0))


def test_adapters_load_from_module_paths():
    from rpcctl.bench.transports import adapter

    assert adapter(f"{__name__}:Loopback") is Loopback
    with pytest.raises(TypeError):
        adapter("json:JSONDecoder")


def test_memcpy_in_process_moves_the_payload_both_ways():
    spec = transports()["memcpy"]
    document = {
        "transport": spec.to_dict(),
        "timing": TINY.to_dict(),
        "cases": [Case("payload", "copy", 1 << 16, 1, 1).to_dict()],
    }
    (result,) = run_unit(document, RankContext(0, 1, "127.0.0.1", 0))
    assert result["bytes_per_call"] == 2 << 16 and result["gbps"] > 0


def test_ray_adapter_against_a_stand_in(monkeypatch):
    """Ray is an optional extra (not installed here): check the adapter's use of its API."""
    fake = types.ModuleType("ray")
    calls = []

    class Ref:
        def __init__(self, value):
            self.value = value

    def remote(cls):
        class Handle:
            def remote(self_inner):
                instance = cls()
                actor = types.SimpleNamespace(echo=types.SimpleNamespace(remote=lambda x: Ref(instance.echo(x))))
                return actor

        return Handle()

    fake.init = lambda **kw: calls.append(("init", kw))
    fake.shutdown = lambda: calls.append(("shutdown",))
    fake.remote = remote
    fake.get = lambda ref: ref.value
    monkeypatch.setitem(sys.modules, "ray", fake)
    spec = transports()["ray"]
    document = {
        "transport": spec.to_dict(),
        "timing": TINY.to_dict(),
        "cases": [
            Case("latency", "actor_call", 8, 1, 1).to_dict(),
            Case("throughput", "actor_call", 8, 8, 1).to_dict(),
        ],
    }
    results = run_unit(document, RankContext(0, 1, "127.0.0.1", 0))
    assert len(results) == 2 and results[1]["calls_per_s"] > 0
    assert calls[0][0] == "init" and calls[-1] == ("shutdown",)


def test_payloads_are_identical_for_every_transport():
    """Every rank builds its payload in its own process: the bytes must not depend on the process
    (an unseeded or uninitialised tensor would differ), and must not be a constant fill."""
    import hashlib
    import subprocess

    code = (
        "import hashlib; from rpcctl.bench.suites import payload;"
        " print(hashlib.sha256(payload(4096).numpy().tobytes()).hexdigest())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    here = payload(4096)
    assert hashlib.sha256(here.numpy().tobytes()).hexdigest() == other
    assert here.numel() == 4096 and here.dtype.itemsize == 1
    assert len(set(here.tolist())) > 200  # random-looking bytes, not zeros or a pattern


def test_results_doc_path_is_a_dir_or_file(tmp_path):
    from rpcctl.bench.api import results_path

    (tmp_path / "results.json").write_text("{}")
    assert results_path(tmp_path) == tmp_path / "results.json"
    assert results_path(Path("x.json")) == Path("x.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError):
        results_path(tmp_path / "empty")


def test_a_setting_that_did_not_take_effect_becomes_a_note():
    from rpcctl.bench.transports.rpc import RpcTransport

    thp = {"env": {"THP_MEM_ALLOC_ENABLE": "1"}}
    assert RpcTransport.mismatches(thp, {"huge_pages": True, "shm_transport": True}) == []
    assert "did not get huge pages" in RpcTransport.mismatches(thp, {"huge_pages": False})[0]
    assert RpcTransport.mismatches(thp, {"huge_pages": None}) == []  # cannot tell: say nothing
    assert RpcTransport.mismatches({"transports": ["shm", "uv"]}, {"shm_transport": False})


def fake_launch(effects):
    """A stand-in for rpcctl.launch.launcher.launch: writes the unit's results as rank 0 would, with
    each setting's effect on speed given by ``effects(settings, case) -> factor``."""
    from rpcctl.bench.unit import Events

    def launch(spec, runs_dir, **kwargs):
        unit = json.loads(Path(spec.args[1]).read_text())
        events = Events(unit["events"])
        for case_dict in unit["cases"]:
            case = Case(**case_dict)
            factor = effects(unit["transport"]["settings"], case)
            per_call = 0.001 / factor
            measured = {
                "samples_s": [per_call] * 20,
                "repeat_medians_s": [per_call] * 4,
                "repeat_rates": [1 / per_call] * 4,
            }
            events.emit(
                "result", result=result_from_measurement(unit["transport"]["name"], case, measured, bytes_per_call=None)
            )
        run_dir = Path(runs_dir) / unit["transport"]["name"]
        run_dir.mkdir(parents=True, exist_ok=True)
        return types.SimpleNamespace(status="succeeded", run_dir=str(run_dir), root_cause=None, reason=None)

    return launch


def test_tune_interleaves_the_defaults_and_keeps_the_best_knob_of_each_kind(tmp_path):
    from rpcctl.bench import tuning

    def effects(settings, case):
        factor = 1.0
        if settings.get("env", {}).get("THP_MEM_ALLOC_ENABLE") and case.suite == "payload":
            factor *= 3.0  # huge pages: big payloads much faster
        if settings.get("channels") == ["basic"]:
            factor *= 0.5
        if settings.get("num_worker_threads") == 4:
            factor *= 1.02  # within the noise floor: not a win
        return factor

    capture_console()
    result = tuning.run_tuning(QUICK, tmp_path, launch=fake_launch(effects))
    verdicts = {c.name: (c.wins, c.loses) for c in result.candidates}
    assert verdicts["rpc-thp"] == (True, False)
    assert verdicts["rpc-basic"] == (False, True)
    assert verdicts["rpc-threads"] == (False, False)
    assert result.chosen == {"env": {"THP_MEM_ALLOC_ENABLE": "1"}}
    assert result.finalists[0].wins and {g["case"] for g in result.gain} >= {"echo 64.0 MiB", "rpc_sync 8 B"}
    first_round = json.loads((result.sessions[0].bench_dir / "plan.json").read_text())
    names = [u["transport"] for u in first_round["units"]]
    assert names[0::2] == [f"rpc.{i}" for i in range(len(tuning.KNOBS) + 1)]
    assert names[1::2] == list(tuning.KNOBS)


def test_tune_discounts_a_gain_that_is_only_drift(tmp_path):
    """The machine slows down steadily during the round: every later launch looks slower. No
    knob really changes anything, so none may win."""
    from rpcctl.bench import tuning

    clock = iter(range(1000))

    def drifting(settings, case):
        return 1.0 / (1 + 0.03 * next(clock))

    capture_console()
    result = tuning.run_tuning(QUICK, tmp_path, launch=fake_launch(drifting))
    assert not any(c.wins or c.loses for c in result.candidates), [
        (c.name, c.score, c.tolerance) for c in result.candidates
    ]
    assert result.chosen == {} and result.finalists == []


def test_the_real_cli_lists_compares_and_maps_errors_to_exit_codes(tmp_path):
    from conftest import rpcctl

    listed = rpcctl("bench", "--list")
    assert listed.returncode == 0 and "memcpy" in listed.stdout, listed.stderr
    path = tmp_path / "r.json"
    BenchReport([row("rpc")], {}).save(path)
    compared = rpcctl("bench", "compare", str(path), str(path), "--json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["summary"]["same"] == 1
    bad = rpcctl("bench", "--transport", "nope")
    assert bad.returncode == 2 and "unknown transport 'nope'" in bad.stderr and not bad.stdout


# -- the compare preset, rounds, missing frameworks -------------------------------------------------


def test_missing_frameworks_are_notes_with_the_install_command_and_the_rest_runs(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    missing = {"ray", "tensorflow", "horovod", "monarch"}
    # the system edge: which packages are installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name.split(".")[0] in missing else real(name, *a)
    )
    from rpcctl.bench import api

    plan = api.plan(["compare"], None, quick=True)
    assert sorted({u.transport.name for u in plan.units}) == ["gloo", "rpc"]
    notes = "\n".join(plan.notes)
    assert "ray: skipped: ray is not installed (pip install 'rpcctl[ray]')" in notes
    assert "tf-rpc: skipped: tensorflow is not installed (pip install 'rpcctl[tensorflow]')" in notes
    assert "tf-allreduce: skipped: tensorflow is not installed" in notes
    assert "horovod: skipped: horovod is not installed (scripts/build_horovod.sh" in notes
    assert "monarch: skipped: torchmonarch is not installed (pip install 'rpcctl[monarch]')" in notes
    assert "monarch-rdma: skipped: torchmonarch is not installed" in notes


def test_compare_preset_plans_shared_ops_in_rotated_rounds():
    from rpcctl.bench import api

    plan = api.plan(["compare"], ["rpc,gloo,memcpy"], quick=True, repeats=4, rounds=2)
    order = [(u.transport.name, u.round) for u in plan.units]
    assert order == [("rpc", 0), ("gloo", 0), ("memcpy", 0), ("gloo", 1), ("memcpy", 1), ("rpc", 1)]
    assert plan.timing.repeats == 2 and plan.rounds == 2  # the repeats split between the rounds
    rpc = next(u for u in plan.units if u.transport.name == "rpc")
    assert {(c.suite, c.op) for c in rpc.cases} == {
        ("latency", "rpc_sync"),
        ("payload", "rpc_sync"),
        ("throughput", "rpc_async"),
        ("startup", "first_call"),
    }
    gloo = next(u for u in plan.units if u.transport.name == "gloo")
    assert {c.op for c in gloo.cases if c.suite == "collective"} == {"all_reduce"}
    assert all(u.start_method == "spawn" for u in plan.units)  # the start-up row needs fresh interpreters
    # without the preset: every op, one launch per transport, forked
    plan = api.plan(["latency"], ["rpc"], quick=True)
    assert plan.rounds == 1 and [c.op for c in plan.units[0].cases] == ["rpc_sync", "rpc_async", "remote"]
    assert plan.units[0].start_method == "fork"


def test_rounds_pool_their_repeats_into_one_row():
    from rpcctl.bench.runner import UnitOutcome
    from rpcctl.bench.session import merge_rounds

    case = Case("latency", "echo", 8, 1, 2)

    def outcome(per_call_s):
        measured = {
            "samples_s": [per_call_s] * 10,
            "repeat_medians_s": [per_call_s] * 2,
            "repeat_rates": [1 / per_call_s] * 2,
            "calls_per_repeat": 5,
            "warmup_calls": 3,
        }
        return UnitOutcome(None, "succeeded", [result_from_measurement("tcp", case, measured, 16)], measured=[measured])

    (merged,) = merge_rounds([outcome(0.001), outcome(0.003)])
    assert merged.n == 20 and merged.repeats == 4
    assert merged.repeat_estimates == pytest.approx([1000.0, 1000.0, 3000.0, 3000.0])
    assert merged.spread == pytest.approx(1.0) and merged.noisy  # the launches disagree: that is noise
    assert merged.p50_us == pytest.approx(2000.0)


def test_collective_rows_compare_with_gloo_never_with_rpc():
    rows = with_ratios(
        [
            row("rpc", p50=100.0),
            row("gloo", suite="collective", op="all_reduce", p50=200.0, size=1024),
            row("horovod", suite="collective", op="all_reduce", p50=400.0, size=1024),
            row("horovod", suite="collective", op="all_gather", p50=400.0, size=1024),
        ]
    )
    ratios = {(r.transport, r.op): (r.vs_rpc, r.vs_gloo) for r in rows}
    assert ratios[("horovod", "all_reduce")] == (None, 0.5) and ratios[("gloo", "all_reduce")] == (None, 1.0)
    assert ratios[("horovod", "all_gather")] == (None, None)  # gloo measured no all_gather here
    from rpcctl.bench.api import verdict

    assert "collectives: slower: horovod 0.50×" in verdict(BenchReport(rows, {}))


def test_unsupported_rows_have_null_figures_a_reason_and_survive_the_document(tmp_path):
    from rpcctl.bench.results import unsupported_result
    from rpcctl.bench.transports.tensorflow import TfRpcTransport

    big, small = Case("payload", "call", 4 << 20), Case("payload", "call", 256 << 10)
    assert TfRpcTransport.unsupported(small) is None
    reason = TfRpcTransport.unsupported(big)
    data = unsupported_result("tf-rpc", big, reason)
    assert data["supported"] is False and data["reason"].startswith("not supported: gRPC caps a message at 4 MiB")
    assert all(data[k] is None for k in ("n", "p50_us", "p99_us", "gbps", "calls_per_s", "vs_rpc"))
    report = BenchReport([BenchResult.from_dict(data), row("rpc", suite="payload", size=4 << 20)], {})
    report.save(tmp_path / "r.json")
    again = json.loads((tmp_path / "r.json").read_text())
    loaded = BenchReport.from_dict(again).results[0]
    assert not loaded.supported and loaded.p50_us is None and loaded.noise == "not supported"
    console, out, _ = capture_console()
    for table in render_report(BenchReport([loaded], {})):
        console.print(table)
    assert "not supported" in out.export_text()
