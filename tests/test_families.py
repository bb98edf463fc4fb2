"""The rank side's family registry (``rpcctl.rank.families``) and the store's handlers by event
name (``telemetry.store.HANDLERS``): every event is one family's (or the reporter's own), has its
fields in ``protocol.EVENT_FIELDS`` and a handler in the store; and a family that exists only in
this test (``tests/workers/toy_family.py``) is picked up everywhere, in a real rank launched by
``rpcctl launch``: its observer activated and forked, its after-import hook run, its processor
run by the sender, its events checked, stored and read back."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from conftest import ROOT, WORKERS, assert_no_process_left, only_run, write_config
from rpcctl.rank import families
from rpcctl.telemetry import store
from rpcctl.wire import protocol


def test_every_event_is_one_familys_and_has_its_fields_and_a_store_handler():
    owners: dict[str, str] = {}
    for family in families.FAMILIES:
        for event in family.events:
            assert event not in owners, f"{event} is {owners[event]}'s and {family.name}'s"
            owners[event] = family.name
    for event in families.REPORTER_EVENTS:
        assert event not in owners
        owners[event] = "reporter"
    assert set(owners) == set(protocol.EVENT_FIELDS)
    assert set(store.HANDLERS) == set(protocol.EVENT_FIELDS) - set(store.NOT_STORED)


def test_only_steps_has_after_import_hooks_of_rpcctls_own():
    """``families.imports()`` lists them before the families' modules are loaded: from steps alone."""
    assert [f.name for f in families.FAMILIES if f.imports] == ["steps"]
    assert families.imports() == list(families.STEPS.imports)
    # a process a rank starts (sitecustomize → autohook.install) that never imports torch
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from rpcctl.rank import autohook; autohook.install();"
            " print(sorted(m for m in sys.modules if m.startswith('rpcctl.rank.')))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "rpcctl.rank.steps" in loaded and "rpcctl.rank.calls" not in loaded and "rpcctl.rank.rrefs" not in loaded, (
        loaded
    )


def test_a_family_of_the_same_name_is_refused():
    """Also before anything made ``FAMILIES`` (a fresh interpreter: register is the first use)."""
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rpcctl.rank import families as f\n"
            "try:\n    f.register(f.Family('calls', ()))\nexcept ValueError as exc:\n    print(exc)\n"
            "print([x.name for x in f.FAMILIES].count('calls'))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split("\n")
    assert refused[:2] == ["a family 'calls' is registered already", "1"], refused


# The launcher of the toy's run: rpcctl's own entry point, with the toy's event declared and its
# handler in the store first (what a plugin of the launcher's side would do).
LAUNCHER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); import toy_family; toy_family.launcher_side();"
    " from rpcctl.__main__ import main; main()"
)


def test_a_family_added_in_a_test_alone_is_picked_up_everywhere(tmp_path, runs_dir):
    config = write_config(tmp_path, script=str(WORKERS / "toy_job.py"), nproc_per_node=1, timeout=60)
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(WORKERS), "launch", str(config), "--runs-dir", str(runs_dir), "--no-live"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    run_dir = only_run(runs_dir)
    assert_no_process_left(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    db = sqlite3.connect(protocol.db_path(run_dir))
    procs = dict(db.execute("SELECT pid, kind FROM procs"))
    rows = db.execute("SELECT pid, what, forked, n FROM toy ORDER BY t").fetchall()
    rank = next(pid for pid, kind in procs.items() if kind == "rank")
    child = next(pid for pid, kind in procs.items() if kind == "child")
    mine = [(what, forked) for pid, what, forked, _ in rows if pid == rank]
    # activated with telemetry; its after-import hook (``import wave``) ran; its processor ran in
    # the rank's sender, a final cycle among them, and saw what the observer queued
    assert mine[0] == ("activated", 0)
    assert ("imported", 0) in mine and ("final", 0) in mine
    (cycles,) = [n for pid, what, _, n in rows if pid == rank and what == "final"]
    assert cycles >= 2
    (seen,) = [n for pid, what, _, n in rows if pid == rank and what == "seen"]
    assert seen == 2  # the two items the observer queued (activated, imported)
    # the rank's forked child: both after-forks ran (the observer's, the sender's), then it joined
    theirs = [(what, forked) for pid, what, forked, _ in rows if pid == child]
    assert theirs[0] == ("activated", 1) and ("final", 1) in theirs
