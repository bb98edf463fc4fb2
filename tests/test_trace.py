"""``rpcctl trace``: a real run (a restart, a long call, an RRef, losses) as Chrome trace-event
JSON, checked strictly against the Trace Event Format: every event's phase and fields, flow
arrows that start and end inside spans, and a bounded size.

No trace reader can be installed here: Perfetto's Python TraceProcessor downloads its
``trace_processor_shell`` binary when first used (no network), and the ``chrometrace``
package only writes traces. So the format is checked field by field, as the spec states it."""

from __future__ import annotations

import json
import textwrap
from collections import Counter, defaultdict

import pytest

from conftest import assert_no_process_left, only_run, rpcctl
from rpcctl.views import trace

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import os, sys, time

    import torch
    import torch.distributed.rpc as rpc


    class Model:
        def __init__(self):
            self.w = torch.zeros(8)

        def step(self):
            time.sleep(1.3)
            return 1


    rank = int(os.environ["RANK"])
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and rank == 1:
        sys.exit(3)  # the first attempt fails: the trace shows the restart
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
    if rank == 0:
        model = rpc.remote("worker1", Model)
        model.rpc_sync().step()
        for step in range(5):
            print(f"step {step} loss {1.0 / (step + 1)}", flush=True)
        time.sleep(0.5)
        del model
    rpc.shutdown()
    """
)

PHASES = {"X", "M", "s", "t", "f", "C", "i"}
METADATA = {
    "process_name": "name",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}


def validate(document: dict) -> list[dict]:
    """The Trace Event Format's JSON Object Format, field by field; returns the events."""
    assert set(document) <= {
        "traceEvents",
        "displayTimeUnit",
        "otherData",
        "systemTraceEvents",
        "stackFrames",
        "samples",
    }
    assert document["displayTimeUnit"] in ("ms", "ns")
    json.dumps(document, allow_nan=False)  # NaN/Infinity are not JSON
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    spans = defaultdict(list)
    flows = defaultdict(dict)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in METADATA and METADATA[e["name"]] in e["args"], e
            if e["name"].startswith("thread"):
                assert isinstance(e["tid"], int), e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e.get("args", {}), dict)
            spans[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t"), e
        else:  # flow start / step / end
            assert isinstance(e["tid"], int) and isinstance(e["id"], (str, int)), e
            assert e["ph"] == "t" or e["ph"] not in flows[e["id"]], f"two {e['ph']} events for flow {e['id']}"
            flows[e["id"]].setdefault(e["ph"], []).append(e)
    for flow_id, ends in flows.items():
        assert set(ends) <= {"s", "t", "f"} and "s" in ends and "f" in ends, (flow_id, ends)
        [start], [finish], steps = ends["s"], ends["f"], ends.get("t", [])
        assert finish["bp"] == "e" and finish["ts"] >= max([start["ts"]] + [t["ts"] for t in steps])
        assert all(t["ts"] >= start["ts"] for t in steps)
        for point in (start, *steps, finish):  # each point binds to the span around it on its thread
            assert any(x["ts"] <= point["ts"] <= x["ts"] + x["dur"] for x in spans[(point["pid"], point["tid"])]), point
    return events


def test_a_run_traces_to_valid_chrome_trace_json_with_every_kind_of_track(tmp_path, runs_dir):
    (tmp_path / "traced.py").write_text(SCRIPT)
    config = tmp_path / "traced.yaml"
    config.write_text("script: traced.py\nnproc_per_node: 2\nmax_restarts: 1\ngrace: 2\ntimeout: 150\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=150)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)

    out = tmp_path / "trace.json"
    result = rpcctl("trace", "-o", str(out), "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    events = validate(document)

    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    # A track per rank of each attempt; the second attempt's processes say so.
    assert sum(1 for n in names.values() if n.startswith("rank 0") and "restart 1" in n) == 1
    assert any(n.startswith("rank 1 · worker1") for n in names.values())
    restarts = [e for e in events if e["ph"] == "i" and e["s"] == "g"]
    assert [e["name"] for e in restarts] == ["restart 1"]
    exits = Counter(e["name"] for e in events if e["ph"] == "i" and e["s"] == "p")
    assert exits["rank 1 failed (exit 3)"] == 1 and exits["rank 1 succeeded (exit 0)"] == 1
    # The long proxy call, on the caller's thread, with its arrow to what worker1 ran for it.
    [call] = [e for e in events if e["ph"] == "X" and e.get("cat") == "rpc"]
    assert call["name"] == "rpc_sync → worker1: rref.step" and call["dur"] >= 1.0e6 and call["args"]["status"] == "ok"
    [served] = [e for e in events if e["ph"] == "X" and e.get("cat") == "served"]
    assert served["name"] == "Model.step" and "worker1" in names[served["pid"]]
    # A Python thread ident is above 2^32, where Perfetto drops a tid (and draws the call on the
    # process's own track): each thread has a small tid of its own, its ident in its name and args.
    threads = {(e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(0 <= tid < 2**31 for _, tid in threads), sorted(threads)
    for span in (call, served):
        thread = threads[(span["pid"], span["tid"])]
        assert span["tid"] >= 2 and thread["ident"] > 2**32 and f"{thread['ident']:#x}" in thread["name"]
    # (RPC's own gloo group has collectives too)
    [flow_start] = [e for e in events if e["ph"] == "s" and e["cat"] == "rpc"]
    [flow_end] = [e for e in events if e["ph"] == "f" and e["cat"] == "rpc"]
    assert (flow_start["pid"], flow_start["tid"]) == (call["pid"], call["tid"])
    assert (flow_end["pid"], flow_end["tid"]) == (served["pid"], served["tid"])
    # The RRef's lifetime on its owner, and the losses as a counter on rank 0's track.
    [model] = [e for e in events if e["ph"] == "X" and e.get("cat") == "rref"]
    assert model["name"] == "RRef Model" and model["pid"] == served["pid"] and 0.5e6 <= model["dur"]
    losses = [e["args"]["loss"] for e in events if e["ph"] == "C" and e["name"] == "loss" and e["pid"] == call["pid"]]
    assert losses == [1.0, 0.5, pytest.approx(1 / 3), 0.25, 0.2]
    # The fast calls' summary rides along.
    assert any(s["func"] == "Model" and s["kind"] == "remote" for s in document["otherData"]["calls"])
    assert document["otherData"]["left_out"] == {}


def test_a_long_run_stays_within_its_bounds(tmp_path, runs_dir, monkeypatch):
    """The caps, made small: the longest spans are kept and what was left out is counted."""
    (tmp_path / "traced.py").write_text(
        SCRIPT.replace("model.rpc_sync().step()", "model.rpc_sync().step(); model.rpc_sync().step()").replace(
            "range(5)", "range(50)"
        )
    )
    config = tmp_path / "traced.yaml"
    config.write_text("script: traced.py\nnproc_per_node: 2\nmax_restarts: 1\ngrace: 2\ntimeout: 150\n")
    result = rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir), timeout=150)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(runs_dir)
    monkeypatch.setattr(trace, "MAX_SPANS", 1)
    monkeypatch.setattr(trace, "MAX_POINTS", 10)
    document = trace.build_trace(run_dir)
    events = validate(document)
    assert len([e for e in events if e["ph"] == "X" and e.get("cat") == "rpc"]) == 1
    assert len([e for e in events if e["ph"] == "C" and e["name"] == "loss"]) == 10
    assert document["otherData"]["left_out"] == {"calls": 1, "served": 1, "counter_points": 40}
    last = [e for e in events if e["ph"] == "C" and e["name"] == "loss"][-1]
    assert last["args"]["loss"] == pytest.approx(1 / 50)  # thinning keeps the last point


def test_a_loss_the_trainer_reported_and_printed_is_one_point(runs_dir):
    # As inspect losses: a rank's loss counter comes from its most direct source (here the HF
    # Trainer callback's records, not the dicts rank 0 also printed), in each restart.
    from rpcctl.wire import protocol
    from rpcctl.telemetry.store import StoreWriter

    run_dir = runs_dir / "trainer-1"
    run_dir.mkdir(parents=True)
    w = StoreWriter(protocol.db_path(run_dir))
    t = 1_800_000_000.0
    w.rank_started(0, 0, 1000, 0, "cpu", t)
    for step in (1, 2, 3):
        w.loss(0, 0, None, None, round(1 / step, 2), None, t + step, "log")
        w.loss(0, 0, step, None, 1 / step, None, t + step + 0.01, "transformers")
    w.rank_exited(0, 1000, "succeeded", 0, t + 5)
    w.close()
    events = trace.build_trace(run_dir)["traceEvents"]
    assert [e["args"]["loss"] for e in events if e["ph"] == "C" and e["name"] == "loss"] == [
        1.0,
        0.5,
        pytest.approx(1 / 3),
    ]
