"""rpcctl bench for real: every suite in quick mode through rpcctl's launcher, with sanity checks
on the numbers (positive, finite, ordered percentiles, bytes that match the sizes) and never a
timing threshold. Then a tuned launch, a failing one, and proof that no rank is left behind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import assert_no_process_left
from rpcctl.bench.suites import QUICK, TINY_BYTES, Case
from rpcctl.commands.bench import bench_app

pytestmark = pytest.mark.timeout(300)

TRANSPORTS = ("rpc", "gloo", "tcp", "memcpy")
REPEATS = 3


def launches(bench_dir: Path) -> list[Path]:
    return sorted(p for p in (bench_dir / "launches").iterdir() if (p / "run.json").is_file())


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick bench of every suite over the point-to-point transports (rpc also trains), in
    one round: rounds interleaved and pooled are test_compare_preset's (the default's 3 rounds
    made this fixture the suite's longest, 80-130 s)."""
    runs = tmp_path_factory.mktemp("bench-runs")
    out = runs / "quick.json"
    result = CliRunner().invoke(
        bench_app,
        [
            "--quick",
            "--repeats",
            str(REPEATS),
            "--rounds",
            "1",
            "--transport",
            ",".join(TRANSPORTS),
            "--runs-dir",
            str(runs),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    document = json.loads(out.read_text())
    bench_dir = Path(document["settings"]["run_dir"])
    return result, document, bench_dir


def rows(document: dict, suite: str) -> list[dict]:
    return [r for r in document["results"] if r["suite"] == suite]


def assert_sane(row: dict, repeats: int = REPEATS) -> None:
    for key in ("p50_us", "p90_us", "p99_us", "min_us", "max_us", "mean_us"):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row)
    assert row["min_us"] <= row["p50_us"] <= row["p90_us"] <= row["p99_us"] <= row["max_us"], row
    assert row["n"] >= row["repeats"] == repeats, row
    assert len(row["repeat_estimates"]) == repeats and all(v > 0 for v in row["repeat_estimates"])
    assert row["spread"] >= 0 and isinstance(row["noisy"], bool)


def test_quick_bench_runs_every_suite_and_saves_one_document(quick):
    result, document, bench_dir = quick
    assert json.loads((bench_dir / "results.json").read_text()) == document
    assert {"results", "machine"} <= set(document) and document["machine"]["logical_cpus"] >= 1
    assert {r["suite"] for r in document["results"]} == {"latency", "payload", "throughput", "train"}
    for title in (
        "latency: one round trip",
        "payload: echo",
        "throughput: calls/s",
        "train: parameter-server",
        "VS RPC",
    ):
        assert title in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("verdict: "), result.stderr  # the last word
    for run_dir in launches(bench_dir):
        assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
        assert_no_process_left(run_dir)


def test_latency_rows(quick):
    _, document, _ = quick
    latency = rows(document, "latency")
    assert {(r["transport"], r["op"]) for r in latency} == {
        ("rpc", "rpc_sync"),
        ("rpc", "rpc_async"),
        ("rpc", "remote"),
        ("gloo", "send_recv"),
        ("tcp", "echo"),
        ("memcpy", "copy"),
    }
    for row in latency:
        assert_sane(row)
        assert row["payload_bytes"] == TINY_BYTES and row["bytes_per_call"] == 2 * TINY_BYTES
        assert row["gbps"] is None and row["calls_per_s"] is None
    assert {r["op"]: r["vs_rpc"] for r in latency if r["transport"] == "rpc"}["rpc_sync"] == 1.0


def test_payload_rows_cover_the_sizes_with_bytes_both_ways(quick):
    _, document, _ = quick
    payload = rows(document, "payload")
    for transport in TRANSPORTS:
        sizes = [r["payload_bytes"] for r in payload if r["transport"] == transport]
        assert sorted(sizes) == sorted(QUICK.payload_sizes) and len(sizes) >= 5 and max(sizes) == 64 << 20
    for row in payload:
        assert_sane(row)
        assert row["bytes_per_call"] == 2 * row["payload_bytes"]
        assert row["gbps"] == pytest.approx(2 * row["payload_bytes"] / (row["p50_us"] * 1e-6) / 1e9)


def test_throughput_rows_per_calls_in_flight(quick):
    _, document, _ = quick
    throughput = rows(document, "throughput")
    for transport in ("rpc", "gloo", "tcp"):
        assert sorted(r["in_flight"] for r in throughput if r["transport"] == transport) == [1, 8, 64]
    for row in throughput:
        assert_sane(row)
        assert math.isfinite(row["calls_per_s"]) and row["calls_per_s"] > 0
        assert row["n"] >= row["in_flight"] or row["n"] >= REPEATS


def test_train_rows_per_world_size(quick):
    _, document, _ = quick
    train = rows(document, "train")
    assert sorted(r["world_size"] for r in train) == list(QUICK.train_world_sizes)
    for row in train:
        assert_sane(row)
        assert row["transport"] == "rpc" and row["op"] == "train_step"
        assert math.isfinite(row["calls_per_s"]) and row["calls_per_s"] > 0


def test_tuned_rpc_gets_what_it_asks_for(tmp_path):
    out = tmp_path / "tuned.json"
    result = CliRunner().invoke(  # the old spelling --json FILE still writes the file (with a warning)
        bench_app,
        [
            "--quick",
            "--repeats",
            "2",
            "--rounds",
            "1",
            "--suite",
            "latency",
            "--transport",
            "rpc-tuned",
            "--runs-dir",
            str(tmp_path),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert f"'--json FILE' is deprecated: use '--output {out}'" in result.stderr
    document = json.loads(out.read_text())
    assert {r["transport"] for r in document["results"]} == {"rpc-tuned"}
    for row in document["results"]:
        assert 0 < row["min_us"] <= row["p50_us"] <= row["p99_us"] <= row["max_us"] and row["repeats"] == 2
    observed = document["settings"]["observed"]["rpc-tuned@2"]
    assert observed["shm_transport"] is True
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip().startswith("[never]"):
        pytest.skip("transparent huge pages are off on this machine")
    # THP_MEM_ALLOC_ENABLE reached c10 before its first allocation, although the rank was forked
    assert observed["huge_pages"] is True and not document["notes"]
    (run_dir,) = launches(Path(document["settings"]["run_dir"]))
    assert json.loads((run_dir / "run.json").read_text())["start_method"] == "fork"
    assert_no_process_left(run_dir)


def test_transport_settings_reach_tensorpipe(tmp_path):
    """rpc-uv asks TensorPipe for TCP only: its ranks must hold no shared-memory segment, while
    rpc-tuned (TensorPipe's choice: shm on one machine) must. TensorPipe's own default is shm, so a
    dropped ``_transports`` makes rpc-uv fail here."""
    document = run_bench(tmp_path, "--suite", "latency", "--transport", "rpc-uv,rpc-tuned")
    observed = document["settings"]["observed"]
    assert observed["rpc-uv@2"]["shm_transport"] is False, observed
    assert observed["rpc-tuned@2"]["shm_transport"] is True, observed


def test_a_failing_launch_is_reported_and_the_rest_still_runs(tmp_path):
    from rpcctl.bench.runner import BenchPlan, Unit
    from rpcctl.bench.session import run_session
    from rpcctl.bench.suites import Timing
    from rpcctl.bench.transports import transports

    known = transports()
    timing = Timing(warmup_s=0.0, repeat_s=0.01, repeats=2, min_calls=1, max_calls=100, min_warmup_calls=1)
    # 8 × 1 MiB in flight is more than the tcp adapter pipelines: rank 0 raises, rank 1 is torn down.
    failing = Unit(0, known["tcp"], 2, [Case("throughput", "echo", 1 << 20, 8, 2)])
    fine = Unit(1, known["memcpy"], 1, [Case("latency", "copy", TINY_BYTES, 1, 1)])
    plan = BenchPlan(QUICK, timing, ("latency", "throughput"), [known["tcp"], known["memcpy"]], [failing, fine])
    session = run_session(plan, tmp_path)
    assert [o.status for o in session.outcomes] == ["failed", "succeeded"]
    assert "too much to pipeline" in session.failures[0] and "tcp (world 2) failed" in session.failures[0]
    assert [r.transport for r in session.report.results] == ["memcpy"]
    assert any("too much to pipeline" in n for n in session.report.notes)
    for run_dir in launches(session.bench_dir):
        assert_no_process_left(run_dir)


def test_ray_for_real_when_installed(tmp_path):
    """Ray is an optional extra (`pip install 'rpcctl[ray]'`), not in the test install: this runs
    where it is installed, and proves the adapter against a real local Ray instance whose
    processes (GCS, raylet, workers) all go away with the bench's rank."""
    pytest.importorskip("ray")
    out = tmp_path / "ray.json"
    result = CliRunner().invoke(
        bench_app,
        [
            "--quick",
            "--repeats",
            "2",
            "--suite",
            "latency,payload",
            "--transport",
            "ray",
            "--runs-dir",
            str(tmp_path / "runs"),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    document = json.loads(out.read_text())
    ray_rows = [r for r in document["results"] if r["transport"] == "ray"]
    assert {r["op"] for r in ray_rows} == {"actor_call"} and {r["suite"] for r in ray_rows} == {"latency", "payload"}
    for row in ray_rows:
        assert (
            all(math.isfinite(row[k]) and row[k] > 0 for k in ("p50_us", "p99_us")) and row["p50_us"] <= row["p99_us"]
        ), row
    sizes = sorted(r["payload_bytes"] for r in ray_rows if r["suite"] == "payload")
    assert all(r["gbps"] > 0 for r in ray_rows if r["suite"] == "payload") and len(sizes) >= 5
    for run_dir in launches(Path(document["settings"]["run_dir"])):
        assert_no_process_left(run_dir, timeout=30)


def needs(module: str, reason: str) -> None:
    """Skip unless ``module`` is installed (without importing it here: the ranks do)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(reason)


def run_bench(tmp_path, *args: str) -> dict:
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        bench_app,
        ["--quick", "--repeats", "2", "--rounds", "1", "--runs-dir", str(tmp_path / "runs"), "-o", str(out), *args],
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    document = json.loads(out.read_text())
    for run_dir in launches(Path(document["settings"]["run_dir"])):
        assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
        assert_no_process_left(run_dir, timeout=30)
    return document


def assert_startup_row(row: dict) -> None:
    """Units: microseconds. A fresh interpreter that imports a framework takes well over 0.1 s;
    the parts (interpreter, import, init, first call) add up to the whole."""
    assert row["kind"] == "startup" and row["op"] == "first_call" and row["payload_bytes"] is None
    assert row["p50_us"] > 1e5 and row["gbps"] is None and row["calls_per_s"] is None, row
    assert set(row["parts_us"]) == {"interpreter", "import", "init", "first_call"}
    assert sum(row["parts_us"].values()) == pytest.approx(row["p50_us"], rel=1e-6)
    assert row["parts_us"]["import"] > 0 and row["parts_us"]["first_call"] > 0


def test_tensorflow_rpc_and_allreduce_for_real(tmp_path):
    """tf-rpc (gRPC echo) and tf-allreduce (MultiWorkerMirroredStrategy) through rpcctl's
    launcher: real rows up to gRPC's cap, "not supported" rows with the reason above it."""
    needs("tensorflow", "tensorflow-cpu is an extra: pip install 'rpcctl[tensorflow]'")
    document = run_bench(
        tmp_path, "--suite", "latency,payload,collective,startup", "--transport", "tf-rpc,tf-allreduce"
    )
    rows = {(r["transport"], r["suite"], r["payload_bytes"]): r for r in document["results"]}
    latency = rows[("tf-rpc", "latency", TINY_BYTES)]
    assert (
        latency["kind"] == "point-to-point" and latency["op"] == "call" and latency["bytes_per_call"] == 2 * TINY_BYTES
    )
    for size in QUICK.payload_sizes:
        row = rows[("tf-rpc", "payload", size)]
        if size < 4 << 20:
            assert row["supported"] and row["reason"] is None and row["gbps"] > 0 and row["bytes_per_call"] == 2 * size
            assert_sane(row, repeats=2)
        else:  # gRPC's default 4 MiB cap: every figure null, and why
            assert row["supported"] is False and row["reason"].startswith("not supported: gRPC caps a message at 4 MiB")
            assert all(row[k] is None for k in ("p50_us", "p99_us", "gbps", "calls_per_s", "n", "vs_rpc"))
    assert any("not supported: gRPC caps" in note for note in document["notes"])
    for size in QUICK.payload_sizes:
        row = rows[("tf-allreduce", "collective", size)]
        assert row["kind"] == "collective" and row["op"] == "all_reduce" and row["vs_rpc"] is None
        assert row["gbps"] == pytest.approx(size / (row["p50_us"] * 1e-6) / 1e9) and row["bytes_per_call"] == size
        assert_sane(row, repeats=2)
    for transport in ("tf-rpc", "tf-allreduce"):
        assert_startup_row(rows[(transport, "startup", None)])


def test_monarch_endpoint_and_rdma_for_real(tmp_path):
    """Monarch (an extra; .ci/run installs it): a real one-process mesh on this host, the same
    rows as Ray's plus RDMABuffer's payloads, every echo checked, the mesh gone afterwards."""
    needs("monarch", "torchmonarch is an extra: pip install 'rpcctl[monarch]'")
    document = run_bench(tmp_path, "--suite", "latency,payload,startup", "--transport", "monarch,monarch-rdma")
    rows = {(r["transport"], r["suite"], r["payload_bytes"]): r for r in document["results"]}
    latency = rows[("monarch", "latency", TINY_BYTES)]
    assert (
        latency["op"] == "endpoint_call" and latency["bytes_per_call"] == 2 * TINY_BYTES and latency["world_size"] == 1
    )
    assert_sane(latency, repeats=2)
    for transport, op in (("monarch", "endpoint_call"), ("monarch-rdma", "rdma_echo")):
        for size in QUICK.payload_sizes:
            row = rows[(transport, "payload", size)]
            assert row["op"] == op and row["gbps"] > 0 and row["bytes_per_call"] == 2 * size
            assert_sane(row, repeats=2)
        assert_startup_row(rows[(transport, "startup", None)])
    assert ("monarch-rdma", "latency", TINY_BYTES) not in rows  # RDMA is offered for payloads only
    backend = document["settings"]["observed"]["monarch-rdma@1"]["rdma_backend"]
    assert backend in ("ibverbs", "tcp")
    assert any(n.startswith("monarch-rdma: no ibverbs device here") for n in document["notes"]) == (backend == "tcp"), (
        document["notes"]
    )


def test_horovod_collectives_for_real_against_gloo(tmp_path):
    """Horovod over its Gloo controller, next to torch's own gloo collectives (VS GLOO).
    Horovod is built by scripts/build_horovod.sh (minutes), which CI does not run."""
    needs("horovod", "horovod is not installed: scripts/build_horovod.sh builds it")
    document = run_bench(tmp_path, "--suite", "collective,startup", "--transport", "gloo,horovod")
    rows = {(r["transport"], r["op"], r["payload_bytes"]): r for r in document["results"]}
    for op in ("all_reduce", "broadcast", "all_gather"):
        for size in QUICK.payload_sizes:
            hvd, gloo = rows[("horovod", op, size)], rows[("gloo", op, size)]
            for row in (hvd, gloo):
                assert row["kind"] == "collective" and row["world_size"] == 2 and row["vs_rpc"] is None
                assert_sane(row, repeats=2)
            assert gloo["vs_gloo"] == 1.0
            assert hvd["vs_gloo"] == pytest.approx(gloo["p50_us"] / hvd["p50_us"])
    assert_startup_row(rows[("horovod", "first_call", None)])
    assert_startup_row(rows[("gloo", "first_call", None)])


def test_compare_preset_interleaves_rounds_and_pools_them(tmp_path):
    """--suite compare over rpc and gloo in two rounds: one shared op per suite, each transport
    launched once per round (spawned, for the start-up row), the rounds' repeats pooled."""
    out = tmp_path / "cmp.json"
    result = CliRunner().invoke(
        bench_app,
        [
            "--quick",
            "--repeats",
            "2",
            "--rounds",
            "2",
            "--suite",
            "compare",
            "--transport",
            "rpc,gloo",
            "--runs-dir",
            str(tmp_path / "runs"),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    document = json.loads(out.read_text())
    plan = json.loads((Path(document["settings"]["run_dir"]) / "plan.json").read_text())
    assert [(u["transport"], u["round"]) for u in plan["units"]] == [("rpc", 0), ("gloo", 0), ("gloo", 1), ("rpc", 1)]
    assert {u["start_method"] for u in plan["units"]} == {"spawn"} and plan["timing"]["repeats"] == 1
    ops = {(r["transport"], r["suite"], r["op"]) for r in document["results"]}
    assert ("rpc", "latency", "rpc_sync") in ops and ("rpc", "latency", "remote") not in ops  # the shared op only
    assert ("gloo", "collective", "all_reduce") in ops and ("gloo", "collective", "broadcast") not in ops
    for row in document["results"]:
        assert row["repeats"] == 2, row  # one per round
        if row["suite"] == "startup":
            assert row["n"] == 2 and row["p50_us"] > 1e5  # one sample per launch, microseconds
    for title in ("(point-to-point)", "collective: every rank takes part", "startup: a fresh process"):
        assert title in result.stdout
    for run_dir in launches(Path(document["settings"]["run_dir"])):
        assert_no_process_left(run_dir)
