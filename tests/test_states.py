"""One vocabulary: every state machine's words are one ``StrEnum`` in rpcctl.base.states, each knowing
its terminal states; no module compares or writes a state as a bare string; and the views of
a real run (run.json, ``rpcctl runs``, ``inspect workers``) use the same words for its ranks."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from conftest import launch_job, rpcctl
from rpcctl.records.runs import Failure, load_record
from rpcctl.base.states import CallState, FailureReason, RankStatus, RRefEnding, RRefState, RunStatus, ServingState

PACKAGE = Path(__file__).resolve().parent.parent / "rpcctl"

# Written out by hand, not derived from rpcctl.base.states: a member added there must be added
# here too, with a decision on whether it is terminal.
TERMINAL = {
    RunStatus: {"running": False, "succeeded": True, "failed": True, "cancelled": True, "lost": True, "damaged": False},
    RankStatus: {
        "pending": False,
        "running": False,
        "succeeded": True,
        "failed": True,
        "killed": True,
        "lost": True,
        "orphaned": False,
        "stopped": False,
        "exited": True,
    },
    RRefState: {"pending": False, "live": False, "deleted": True},
    RRefEnding: {"at shutdown": True, "at exit": True, "held unused": True, "leaked": True},
    CallState: {"pending": False, "ok": True, "error": True, "timeout": True, "unfinished": True},
    ServingState: {"running": False, "done": True, "unfinished": True},
}
WORDS = {word for machine in TERMINAL.values() for word in machine}
STATE_NAMES = {"state", "status", "effective_status"}


@pytest.mark.parametrize("machine", list(TERMINAL), ids=lambda m: m.__name__)
def test_each_machine_knows_its_terminal_states(machine):
    assert {m.value for m in machine} == set(TERMINAL[machine])
    for member in machine:
        assert member.is_terminal is TERMINAL[machine][member.value], member
        # A member is its string: stores and JSON documents hold the same words as before.
        assert member == member.value and f"{member}" == member.value and json.dumps(member) == json.dumps(member.value)
        assert machine(member.value) is member


def test_read_takes_a_stores_text_without_trusting_it():
    assert CallState.read("timeout", CallState.ERROR) is CallState.TIMEOUT
    assert CallState.read("None", CallState.ERROR) is CallState.ERROR  # what a rank sent is data
    assert CallState.read(None, CallState.ERROR) is CallState.ERROR


def test_a_failure_reason_is_one_of_the_enums_words_and_run_json_keeps_the_word():
    # Written out by hand: every reason rpcctl gives a Failure (supervisor, watchdog, launcher).
    words = ["exited", "signal", "timeout", "hang", "launch", "launcher", "rendezvous", "remote"]
    assert [m.value for m in FailureReason] == words
    for word in words:
        failure = Failure(rank=-1, pid=None, exit_code=None, signal=None, reason=word, message="m", timestamp="t")
        assert failure.reason is FailureReason(word)
        assert json.loads(json.dumps(dataclasses.asdict(failure)))["reason"] == word  # run.json holds the word
    # A word no member has (a newer rpcctl's run.json) still reads, as it is.
    assert Failure(0, 1, 3, None, "preempted", "m", "t").reason == "preempted"


def test_an_rref_ending_reads_either_spelling():
    assert [e.flag for e in RRefEnding] == ["at-shutdown", "at-exit", "held-unused", "leaked"]
    for ending in RRefEnding:
        assert RRefEnding.from_flag(ending.flag) is ending and RRefEnding.from_flag(ending.value) is ending
    assert RRefEnding.from_flag("live") is None and RRefEnding.from_flag("held_unused") is None


def _is_state(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in STATE_NAMES) or (
        isinstance(node, ast.Name) and node.id in STATE_NAMES
    )


def _words(node: ast.AST) -> list[str]:
    """The state words among the string constants of ``node`` (a constant, a tuple, set or list)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.Set, ast.List)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in WORDS]


def state_literals(source: str, where: str) -> list[str]:
    """``where:line`` of every comparison of a state with a bare word (``x.state == "running"``,
    ``status in ("failed", ...)``) and every bare word written to one (``x.state = "killed"``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_state(side) for side in sides) and any(_words(side) for side in sides):
                found.append(f"{where}:{node.lineno}")
        elif isinstance(node, ast.Assign) and any(_is_state(t) for t in node.targets):
            values = [node.value.body, node.value.orelse] if isinstance(node.value, ast.IfExp) else [node.value]
            if any(_words(v) for v in values):
                found.append(f"{where}:{node.lineno}")
    return found


def test_no_state_is_a_bare_string_in_rpcctl():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += state_literals(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert found == [], "use the enums of rpcctl.base.states, not the strings: " + ", ".join(found)


def test_the_scan_sees_what_it_looks_for():
    # The check above can fail: each of these is one of the shapes it rejects.
    assert len(state_literals('if rec.state == "running": pass', "x")) == 1
    assert len(state_literals('if status in ("failed", "killed"): pass', "x")) == 1
    assert len(state_literals('state.state = "killed" if bad else FAILED', "x")) == 1
    assert len(state_literals('state = "pending"', "x")) == 1
    assert state_literals('if rec.state == RankStatus.RUNNING: pass\nkind = "running"', "x") == []


@pytest.mark.timeout(90)
def test_a_real_runs_states_are_members_and_its_views_agree(tmp_path, runs_dir):
    # rank 1 fails, rank 0 is torn down; a second run's ranks both exit 0.
    failed, failed_dir, _ = launch_job(tmp_path, runs_dir / "a", nproc_per_node=2, args=["1=exit:3", "0=hang"])
    ok, ok_dir, _ = launch_job(tmp_path, runs_dir / "b", nproc_per_node=2, args=["0=ok", "1=ok"])
    assert (failed.returncode, ok.returncode) == (1, 0), failed.stderr + ok.stderr
    expected = {
        failed_dir: (RunStatus.FAILED, [RankStatus.KILLED, RankStatus.FAILED]),
        ok_dir: (RunStatus.SUCCEEDED, [RankStatus.SUCCEEDED, RankStatus.SUCCEEDED]),
    }
    for run_dir, (status, ranks) in expected.items():
        record = load_record(run_dir)
        assert type(record.status) is RunStatus and record.status is status and record.effective_status.is_terminal
        assert [type(r.state) for r in record.ranks] == [RankStatus] * 2 and [r.state for r in record.ranks] == ranks
        assert all(r.state.is_terminal for r in record.ranks)
        if status is RunStatus.FAILED:  # the root cause's reason too: a member, a plain word in run.json
            assert type(record.root_cause.reason) is FailureReason and record.root_cause.reason is FailureReason.EXITED
            assert json.loads((run_dir / "run.json").read_text())["root_cause"]["reason"] == "exited"
        # `inspect workers` says what run.json (and `rpcctl runs`) says: succeeded, not "exited".
        workers = json.loads(rpcctl("inspect", "workers", str(run_dir), "--json").stdout)
        assert [(w["rank"], w["state"]) for w in workers if w["kind"] == "rank"] == [
            (0, ranks[0].value),
            (1, ranks[1].value),
        ]
    runs = json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir / "b")).stdout)
    assert [[r["state"] for r in d["ranks"]] for d in runs] == [["succeeded", "succeeded"]] and runs[0][
        "status"
    ] == "succeeded"
