"""Fuzz the telemetry decoder and store with hypothesis: no line ends the server (decode
returns a message or None; the store applies an event or raises one of the errors the server
counts and drops), and a valid event still lands after any number of bad ones."""

from __future__ import annotations

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpcctl.wire import protocol
from rpcctl.telemetry.server import BAD_EVENT_ERRORS
from rpcctl.telemetry.store import ProcInfo, StoreWriter

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
EVENT_KINDS = [
    "probe",
    "rpc",
    "rref",
    "conf",
    "desc",
    "vfree",
    "fork",
    "rel",
    "churn",
    "loss",
    "shutdown",
    "bye",
    "call",
    "cend",
    "cstat",
    "x",
]
events = st.dictionaries(
    st.sampled_from(
        [
            "e",
            "id",
            "fork",
            "owner",
            "owner_rank",
            "step",
            "loss",
            "epoch",
            "metrics",
            "t",
            "value",
            "workers",
            "n",
            "name",
            "rpc_rank",
            "status",
            "callee",
            "func",
            "kind",
            "h",
        ]
    ),
    json_values,
    max_size=8,
) | st.builds(
    lambda kind, rest: {"e": kind, **rest},
    st.sampled_from(EVENT_KINDS),
    st.dictionaries(st.text(max_size=8), json_values, max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=2000)
    | st.text(max_size=2000).map(str.encode)
    | json_values.map(lambda v: json.dumps(v).encode())
)
def test_decode_never_raises(line):
    message = protocol.decode(line)
    assert message is None or isinstance(message, dict)


def test_decode_refuses_a_line_a_million_deep():
    assert protocol.decode(b"[" * 1_000_000) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(events, max_size=10))
def test_store_takes_any_events_and_valid_ones_still_land(tmp_path, batch):
    store = StoreWriter(tmp_path / f"fuzz-{time.monotonic_ns()}.db")
    proc = ProcInfo(store.proc_connected({"pid": 1, "rank": 0, "kind": "rank"}, 0, time.time()), 1, 0, 0)
    for event in batch:
        if protocol.valid_event(event):
            store.apply(proc, event)  # what the server lets through, the store takes without an error
        else:
            try:
                store.apply(proc, event)
            except BAD_EVENT_ERRORS:
                pass  # (the server never applies these; the store alone must not die of them either)
    store.apply(proc, {"e": "loss", "step": 999, "loss": 0.25, "t": time.time()})
    store.commit()
    assert store.db.execute("SELECT loss FROM losses WHERE step = 999").fetchall() == [(0.25,)]
    store.close()


def _well_typed(kind: str) -> dict:
    return {"e": kind, "t": time.time(), **{key: None for key in protocol.EVENT_FIELDS[kind]}}


def _sample(kind: protocol.Field):
    """A value of ``kind``: its lower bound, a short string, one item."""
    if isinstance(kind, (protocol.Int, protocol.Real)):
        return kind.lo
    if isinstance(kind, protocol.IntText):
        return str(kind.number.lo)
    if isinstance(kind, protocol.Shape):
        return [2, 3]
    if isinstance(kind, protocol.ListOf):
        return [_sample(kind.item)]
    if isinstance(kind, protocol.MapOf):
        return {_sample(kind.key): _sample(kind.value)}
    return {protocol.Measure: 1.5, protocol.Flag: True, protocol.Text: "s", protocol.Record: {}}[type(kind)]


_TAKES = {
    protocol.Int: (int,),
    protocol.Real: (int, float),
    protocol.Measure: (int, float),
    protocol.Flag: (bool,),
    protocol.Text: (str,),
    protocol.ListOf: (list,),
    protocol.Shape: (list,),
    protocol.MapOf: (dict,),
    protocol.Record: (dict,),
}


def test_valid_event_refuses_each_field_of_another_type_or_beyond_its_bounds_and_takes_the_right_one():
    wrongs = [3, 2.5, "s", True, {}, []]
    for kind, fields in protocol.EVENT_FIELDS.items():
        for key, field in fields.items():
            event = _well_typed(kind)
            for required in protocol.EVENT_REQUIRED.get(kind, ()):
                event[required] = _sample(fields[required])
            assert protocol.valid_event({**event, key: _sample(field)}), (kind, key)
            takes = _TAKES[type(field)]
            for wrong in wrongs:
                if type(wrong) not in takes:
                    assert not protocol.valid_event({**event, key: wrong}), (kind, key, wrong)
            if isinstance(field, (protocol.Int, protocol.Real)):  # its bounds, and just beyond them
                assert protocol.valid_event({**event, key: field.hi}), (kind, key)
                assert not protocol.valid_event(
                    {**event, key: field.hi + 1 if isinstance(field.hi, int) else field.hi * 2}
                ), (kind, key)
                assert not protocol.valid_event({**event, key: field.lo - 1}), (kind, key)
                assert not protocol.valid_event({**event, key: 2**64}), (kind, key)  # no 64-bit integer holds it
            if isinstance(field, protocol.Real):
                for odd in (float("nan"), float("inf"), float("-inf"), 1e308):
                    assert not protocol.valid_event({**event, key: odd}), (kind, key, odd)
            if isinstance(field, protocol.Text):
                assert not protocol.valid_event({**event, key: "x" * (field.most + 1)}), (kind, key)
                # not UTF-8: SQLite refuses it
                assert not protocol.valid_event({**event, key: "lone \ud800 surrogate"}), (kind, key)
            if isinstance(field, protocol.ListOf):
                assert not protocol.valid_event({**event, key: [_sample(field.item)] * (field.most + 1)}), (kind, key)
    # the news: kept
    assert protocol.valid_event({"e": "loss", "t": 1.0, "loss": float("nan"), "metrics": {"acc": float("inf")}})
    assert not protocol.valid_event({"e": "loss", "t": 1.0, "loss": 2**64})
    assert not protocol.valid_event({"e": "loss", "t": 2**64})
    assert not protocol.valid_event({"e": "loss", "t": float("nan")})
    assert not protocol.valid_event({"e": "loss", "t": -1.0})
    assert not protocol.valid_event({"e": "desc", "id": "1:1", "t": 1.0, "value": {"nbytes": 2**64}})
    assert not protocol.valid_event({"e": "rref", "t": 1.0})  # the key it is stored under is missing
    assert not protocol.valid_event({"e": "nope", "t": 1.0})
    assert not protocol.valid_event({"e": "probe", "t": "now"})
    assert not protocol.valid_event({"e": "desc", "id": "1:1", "t": 1.0, "value": {"shape": [2, "x"]}})
    assert not protocol.valid_event({"e": "desc", "id": "1:1", "t": 1.0, "value": {"shape": [1] * 65}})
    # 2^80 elements
    assert not protocol.valid_event({"e": "desc", "id": "1:1", "t": 1.0, "value": {"shape": [2**40, 2**40]}})
    assert not protocol.valid_event({"e": "loss", "t": 1.0, "metrics": {"acc": "high"}})
    assert not protocol.valid_event({"e": "rpc", "t": 1.0, "workers": {"zero": "worker0"}})
    assert not protocol.valid_event({"e": "rpc", "t": 1.0, "workers": {"1" * 40: "worker0"}})
    assert not protocol.valid_event(
        {"e": "cstat", "callee": "w", "func": "f", "kind": "remote", "t": 1.0, "h": {"3": "many"}}
    )
    # no such bucket
    assert not protocol.valid_event(
        {"e": "cstat", "callee": "w", "func": "f", "kind": "remote", "t": 1.0, "h": {"99999": 1}}
    )
    assert not protocol.valid_event({"e": "probe", "t": 1.0, "gpus": [{"index": "0"}]})
    assert (
        protocol.refusal({"e": "probe", "t": 1.0, "cpu_s": 1e308})
        == "cpu_s: 1e+308 is not a finite number in [0, 1e+10]"
    )
    assert protocol.refusal({"e": "loss", "t": 1.0, "step": 10**30}).startswith(
        "step: 1000000000000000000000000000000 is not"
    )
