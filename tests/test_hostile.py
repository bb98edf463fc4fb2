"""Hostile or broken records and text, with real launchers and the real CLI: a damaged
run.json or telemetry.db is listed as damaged and the other runs still work; `rpcctl stop`
signals only a launcher that is provably the run's; a rank's text reaches the terminal as plain
text (markup escaped, control sequences made visible, colour kept in streams only); and every
file of a run is the owner's alone, whatever the umask."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import (
    assert_no_process_left,
    kill_if_running,
    launch_job as launch,
    launch_until_running,
    only_run,
    record,
    rpcctl,
    start_rpcctl,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.timeout(120)


# -- damaged records ---------------------------------------------------------------------------

DAMAGED_RECORDS = {
    "not-utf8": b"\xff\xfe\x00garbage",
    "a-list": b"[]",
    "wrong-types": json.dumps({"run_id": 5, "status": "running", "started_at": 17, "ranks": "all"}).encode(),
    "bad-time": json.dumps(
        {
            **json.loads(
                '{"run_id": "x", "name": "x", "status": "succeeded", "run_dir": "x", "config_path": null, '
                '"script": "s", "world_size": 1, "nproc_per_node": 1, "start_method": "fork", "host": "h", '
                '"launcher_pid": 1, "launcher_started": 0, "master_addr": "a", "master_port": 1}'
            ),
            "started_at": "yesterday",
        }
    ).encode(),
}


def test_damaged_records_are_listed_as_damaged_and_the_other_runs_still_work(tmp_path, runs_dir):
    result, good, _ = launch(tmp_path, runs_dir, nproc_per_node=1)
    assert result.returncode == 0, result.stderr
    for name, content in DAMAGED_RECORDS.items():
        (runs_dir / name).mkdir()
        (runs_dir / name / "run.json").write_bytes(content)

    listed = rpcctl("runs", "--runs-dir", str(runs_dir))
    assert listed.returncode == 0, listed.stderr
    assert good.name in listed.stdout
    for name in DAMAGED_RECORDS:
        row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
        assert "damaged" in row
        assert f"damaged: {runs_dir / name / 'run.json'}: " in listed.stdout
    documents = json.loads(rpcctl("runs", "--runs-dir", str(runs_dir), "--json").stdout)
    assert documents[0]["run_id"] == good.name and documents[0]["status"] == "succeeded"
    assert {d["run_id"]: d["status"] for d in documents[1:]} == dict.fromkeys(DAMAGED_RECORDS, "damaged")

    # The latest readable run is still the default RUN.
    logs = rpcctl("logs", "--runs-dir", str(runs_dir))
    assert logs.returncode == 0 and "[rank0]: rank 0 done" in logs.stdout, logs.stderr
    rrefs = rpcctl("inspect", "rrefs", "--runs-dir", str(runs_dir))
    assert rrefs.returncode == 0, rrefs.stderr
    stop = rpcctl("stop", "--runs-dir", str(runs_dir))
    assert stop.returncode == 2 and "not running" in stop.stderr
    # Naming a damaged run: one message with its path, no traceback.
    for command in (["logs"], ["stop"]):
        named = rpcctl(*command, "not-utf8", "--runs-dir", str(runs_dir))
        assert named.returncode == 1, named.stderr
        assert f"{runs_dir / 'not-utf8' / 'run.json'} is damaged" in named.stderr and "Traceback" not in named.stderr


def test_a_link_to_a_run_is_listed_once_by_its_real_directory(tmp_path, runs_dir):
    """`ln -s RUN latest` in the runs directory: `runs` lists the run once (it listed it twice,
    and a prefix of its id was then "ambiguous" between it and itself); a link to a run kept
    elsewhere lists that run once, from its real directory; a link to nothing is not a run."""
    result, run_dir, _ = launch(tmp_path, runs_dir, nproc_per_node=1)
    assert result.returncode == 0, result.stderr
    (runs_dir / "latest").symlink_to(run_dir.name)
    (runs_dir / "also-latest").symlink_to(run_dir.resolve())
    (runs_dir / "dangling").symlink_to(tmp_path / "nowhere")
    elsewhere = tmp_path / "archive" / "old-run"
    elsewhere.parent.mkdir()
    (elsewhere / "logs").mkdir(parents=True)
    old = json.loads((run_dir / "run.json").read_text())
    old.update(
        run_id="old-run",
        run_dir=str(elsewhere),
        started_at="2020-01-01T00:00:00+00:00",
        ended_at="2020-01-01T00:00:01+00:00",
    )
    (elsewhere / "run.json").write_text(json.dumps(old))
    (runs_dir / "archived").symlink_to(elsewhere)

    documents = json.loads(rpcctl("runs", "--runs-dir", str(runs_dir), "--json").stdout)
    assert [d["run_id"] for d in documents] == [run_dir.name, "old-run"]
    table = rpcctl("runs", "--runs-dir", str(runs_dir))
    assert table.returncode == 0 and table.stdout.count(run_dir.name) == 1, table.stdout
    logs = rpcctl("logs", run_dir.name[:-3], "--runs-dir", str(runs_dir))  # a unique prefix of its id
    assert logs.returncode == 0 and "[rank0]: rank 0 done" in logs.stdout, logs.stderr
    assert rpcctl("logs", "latest", "--runs-dir", str(runs_dir)).returncode == 0  # a link is still a name for its run


def test_a_stamp_without_an_offset_reads_as_utc_in_every_view(runs_dir):
    """rpcctl writes its stamps in UTC with an offset; a hand-edited record may drop the offset.
    It is read as UTC everywhere: before, a naive start beside an aware end crashed ``rpcctl runs``
    (the two cannot be subtracted) and the STARTED column read it as local time."""
    from rpcctl.records.runs import RunRecord, save_record

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stamps = {
        "edited-1": ("2026-01-02T00:00:00", "2026-01-02T00:01:30+00:00"),  # 90 s, the newer run
        "written-1": ("2026-01-01T23:00:00+00:00", "2026-01-01T23:00:05+00:00"),
    }
    for run_id, (started, ended) in stamps.items():
        (runs_dir / run_id).mkdir(parents=True)
        save_record(
            RunRecord(
                run_id=run_id,
                name=run_id,
                status="succeeded",
                run_dir=str(runs_dir / run_id),
                config_path=None,
                script="s.py",
                world_size=1,
                nproc_per_node=1,
                start_method="fork",
                host="h",
                launcher_pid=gone.pid,
                launcher_started=0,
                master_addr="127.0.0.1",
                master_port=1,
                started_at=started,
                ended_at=ended,
            )
        )
    # A POSIX zone 5:30 east of UTC: a stamp read as local time would show 00:00, not 05:30.
    env = {**os.environ, "TZ": "IST-5:30", "COLUMNS": "200"}
    listed = rpcctl("runs", "--runs-dir", str(runs_dir), env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith(("edited-1", "written-1"))]
    assert [row.split()[0] for row in rows] == ["edited-1", "written-1"], listed.stdout  # newest first
    assert "2026-01-02 05:30" in rows[0] and "90.0 s" in rows[0], rows[0]
    assert "2026-01-02 04:30" in rows[1] and "5.0 s" in rows[1], rows[1]
    ninety = rpcctl("runs", "--runs-dir", str(runs_dir), "--json", "--filter", "duration_s=90.0", env=env)
    assert [d["run_id"] for d in json.loads(ninety.stdout)] == ["edited-1"], ninety.stderr


@pytest.mark.parametrize(("content", "why"), [(b"", "an empty file"), (b"\x00garbage" * 100, "not an SQLite database")])
def test_damaged_telemetry_store_is_reported_not_read_as_empty(tmp_path, runs_dir, content, why):
    result, run_dir, _ = launch(tmp_path, runs_dir, nproc_per_node=1)
    assert result.returncode == 0, result.stderr
    db = run_dir / "telemetry.db"
    db.write_bytes(content)
    an_hour_ago = time.time() - 3600
    os.utime(db, (an_hour_ago, an_hour_ago))  # not a store still being created
    for view in ("workers", "rrefs", "losses"):
        shown = rpcctl("inspect", view, run_dir.name, "--runs-dir", str(runs_dir))
        assert shown.returncode == 1, (view, shown.stdout, shown.stderr)
        assert f"{db} is damaged: {why}" in shown.stderr, shown.stderr


# -- rpcctl stop trusts nothing it reads --------------------------------------------------------


def test_stop_refuses_a_record_whose_pid_is_not_the_runs_launcher(tmp_path, runs_dir):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run_dir = runs_dir / "forged-1"
        run_dir.mkdir(parents=True)
        from rpcctl.records.runs import RunRecord, save_record

        save_record(
            RunRecord(
                run_id="forged-1",
                name="forged",
                status="running",
                run_dir=str(run_dir),
                config_path=None,
                script="s.py",
                world_size=1,
                nproc_per_node=1,
                start_method="fork",
                host="h",
                launcher_pid=bystander.pid,
                launcher_started=psutil.Process(bystander.pid).create_time(),
                master_addr="127.0.0.1",
                master_port=1,
                started_at="2026-01-01T00:00:00+00:00",
            )
        )
        result = rpcctl("stop", "forged-1", "--runs-dir", str(runs_dir))
        assert result.returncode == 1, result.stderr
        assert f"refusing to signal pid {bystander.pid}" in result.stderr
        time.sleep(0.5)
        assert bystander.poll() is None  # never signalled
    finally:
        bystander.kill()
        bystander.wait()


def test_bare_stop_with_several_live_runs_asks_for_one(tmp_path, runs_dir):
    (tmp_path / "a").mkdir()
    first, first_dir = launch_until_running(tmp_path / "a", runs_dir, nproc_per_node=1, args=["0=hang"])
    second, _ = _second_live_run(tmp_path, runs_dir, first_dir)
    try:
        result = rpcctl("stop", "--runs-dir", str(runs_dir))
        assert result.returncode == 2, result.stderr
        assert "2 runs are live" in result.stderr
        live = list(runs_dir.iterdir())
        for run_dir in live:
            assert run_dir.name in result.stderr
        assert first.poll() is None and second.poll() is None  # neither was stopped
        for run_dir in live:
            stopped = rpcctl("stop", run_dir.name, "--runs-dir", str(runs_dir))
            assert stopped.returncode == 0, stopped.stderr
    finally:
        for launcher in (first, second):
            if launcher.poll() is None:
                launcher.kill()
            launcher.communicate(timeout=30)
    for run_dir in runs_dir.iterdir():
        assert_no_process_left(run_dir)


def _second_live_run(tmp_path, runs_dir, first_dir):
    (tmp_path / "b").mkdir()
    config = write_config(tmp_path / "b", nproc_per_node=1, args=["0=hang"])
    launcher = start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live")

    def second_running():
        others = [p for p in runs_dir.iterdir() if p != first_dir and (p / "run.json").is_file()]
        return others and all(r["state"] == "running" for r in record(others[0])["ranks"]) and others[0]

    return launcher, wait_until(second_running, 30, "the second run's rank running")


# -- rank text reaches the terminal as text ----------------------------------------------------

HOSTILE = (
    "\x1b]0;pwned title\x07"  # OSC 0: window title
    "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: clipboard write
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\u009b2J"  # the same clear as a C1 control (CSI in one character)
    "\x1b[31mred\x1b[0m"  # colour: allowed in streams
    " [/bad] [bold]not bold[/bold]"
)


def _hostile_script(tmp_path: Path) -> Path:
    script = tmp_path / "hostile.py"
    script.write_text(
        "import os, pathlib, time\n"
        f"text = {HOSTILE!r}\n"
        f"printed = pathlib.Path({str(tmp_path / 'rank0-printed')!r})\n"
        "print(text, flush=True)\n"
        "if os.environ['RANK'] == '0':\n"
        "    printed.touch()\n"
        "if os.environ['RANK'] == '1':\n"
        "    # Fail only once rank 0 has printed: its line must be in the stream, not raced by the teardown.\n"
        "    deadline = time.monotonic() + 30\n"
        "    while not printed.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    raise ValueError(text)\n"
    )
    return script


def test_rank_text_with_markup_and_escape_sequences_is_shown_as_text(tmp_path, runs_dir):
    result, run_dir, _ = launch(tmp_path, runs_dir, script=str(_hostile_script(tmp_path)), nproc_per_node=2)
    assert result.returncode == 1, result.stderr
    # The stream and `logs`: no escape but colour reaches the terminal (the line splitter drops a
    # rank's drawing; sanitize shows what is left, like the C1 CSI).
    for out in (result.stdout, rpcctl("logs", "--runs-dir", str(runs_dir)).stdout):
        assert not re.search(r"\x1b(?!\[[0-9;]*m)", out), out
        assert "\x07" not in out and "\u009b" not in out
        assert "[rank0]: " in out and "\\x9b2J" in out
        assert "red [/bad] [bold]not bold[/bold]" in re.sub(r"\x1b\[[0-9;]*m", "", out)
    # `logs --raw`: the bytes as the rank wrote them.
    raw = subprocess.run(
        [sys.executable, "-m", "rpcctl", "logs", "--raw", "--rank", "0", "--runs-dir", str(runs_dir)],
        capture_output=True,
        timeout=60,
    )
    assert raw.returncode == 0 and raw.stdout == (run_dir / "logs" / "rank-0.log").read_bytes()
    assert (HOSTILE + "\n").encode() in raw.stdout
    # The root cause (stderr) and the runs table: plain text, no escape at all, markup literal.
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert "[/bad] [bold]not bold[/bold]" in result.stderr
    listed = rpcctl("runs", "--runs-dir", str(runs_dir))
    assert listed.returncode == 0, listed.stderr
    assert "MarkupError" not in listed.stderr and "\x1b" not in listed.stdout
    assert "rank 1: ValueError: \\x1b]0;pwned" in listed.stdout


def test_sanitize_keeps_text_and_colour_and_shows_everything_else():
    from rpcctl.console import sanitize

    assert sanitize("plain [x] text\twith tab\n") == "plain [x] text\twith tab\n"
    assert sanitize("\x1b[1;31mred\x1b[0m", sgr=True) == "\x1b[1;31mred\x1b[0m"
    assert sanitize("\x1b[1;31mred\x1b[0m") == "\\x1b[1;31mred\\x1b[0m"
    assert sanitize("a\x1b]0;t\x07b\x9bc\u202ed\x7f", sgr=True) == "a\\x1b]0;t\\x07b\\x9bc\\u202ed\\x7f"
    assert sanitize("[/bad]", markup=True) == "\\[/bad]"


# -- a run's files are the owner's alone --------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_run_files_are_private_whatever_the_umask(tmp_path, runs_dir, umask):
    flag = tmp_path / "go"
    script = tmp_path / "wait_then_raise.py"
    script.write_text(
        "import os, time\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.05)\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('done')\n"
        "time.sleep(60)\n"
    )
    config = write_config(tmp_path, script=str(script), nproc_per_node=2, env={"SECRET": "hunter2"})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rpcctl", "launch", str(config), "--runs-dir", str(runs_dir), "--no-live"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=umask,
        start_new_session=True,
    )
    try:
        run_dir = only_run(runs_dir)
        wait_until(lambda: (run_dir / "telemetry.db-wal").exists(), 30, "the live store")
        wait_until(lambda: all(r["state"] == "running" for r in record(run_dir)["ranks"]), 30, "ranks running")
        wait_until(lambda: len(list((run_dir / "stacks").glob("rank-*.txt"))) == 2, 30, "the ranks' stack files")
        live = _modes(run_dir)
        assert {"telemetry.db-wal", "telemetry.db-shm", "config.yaml", "run.json", "logs/rank-0.log"} <= set(live)
        # The socket is in the run directory, or in a private one when that path is too long.
        with sqlite3.connect(f"file:{run_dir / 'telemetry.db'}?mode=ro", uri=True) as db:
            socket_path = Path(json.loads(db.execute("SELECT value FROM meta WHERE key = 'socket'").fetchone()[0]))
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
        flag.write_text("")
        launcher.communicate(timeout=60)
    finally:
        kill_if_running(launcher)
    assert launcher.returncode == 1
    done = _modes(run_dir)
    assert "errors/rank-1.json" in done and "launcher.log" in done and "telemetry.db" in done
    loose = {path: oct(mode) for path, mode in {**live, **done}.items() if mode not in (0o700, 0o600)}
    assert not loose, loose
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert_no_process_left(run_dir)


def _modes(run_dir: Path) -> dict[str, int]:
    modes = {}
    for path in run_dir.rglob("*"):
        try:
            modes[str(path.relative_to(run_dir))] = stat.S_IMODE(path.lstat().st_mode)
        except FileNotFoundError:
            continue
    return modes


# -- the telemetry channel ---------------------------------------------------------------------


def test_malformed_telemetry_lines_are_dropped_and_the_server_goes_on(tmp_path):
    import socket as sockets

    from rpcctl.wire import protocol
    from rpcctl.telemetry.server import TelemetryServer

    server = TelemetryServer(tmp_path / "run")
    server.start()
    try:
        with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as bad:
            bad.connect(str(server.socket_path))
            bad.sendall(b"[" * 1_000_000 + b"\n")  # RecursionError in json
            bad.sendall(protocol.encode({"k": "hello", "pid": {"a": 1}, "rank": 0}))  # a mapping for SQLite
        with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as good:
            good.connect(str(server.socket_path))
            good.sendall(protocol.encode({"k": "hello", "pid": os.getpid(), "rank": 0, "host": "h", "kind": "rank"}))
            good.sendall(protocol.encode({"k": "batch", "ev": [{"e": "loss", "step": 1, "loss": {"not": "a number"}}]}))
            good.sendall(
                protocol.encode({"k": "batch", "ev": [{"e": "loss", "step": 2, "loss": 0.5, "t": time.time()}]})
            )
            wait_until(lambda: server.bad_messages >= 3, 20, "the bad messages to be counted")
            time.sleep(0.5)
    finally:
        server.close()
    with sqlite3.connect(protocol.db_path(tmp_path / "run")) as db:
        losses = db.execute("SELECT step, loss FROM losses").fetchall()
        pids = [row[0] for row in db.execute("SELECT pid FROM procs")]
        refused = db.execute("SELECT value FROM meta WHERE key = 'refused_messages'").fetchone()
    assert losses == [(2, 0.5)]  # what was valid landed after what was not
    assert pids == [os.getpid()]
    assert int(refused[0]) == 3  # and the run says how many were refused


def test_a_string_or_nan_loss_in_the_store_does_not_crash_inspect_losses(runs_dir):
    from rpcctl.telemetry.store import StoreWriter
    from test_inspect import _record

    run_dir = runs_dir / "odd-losses"
    run_dir.mkdir(parents=True)
    _record(run_dir)
    store = StoreWriter(run_dir / "telemetry.db")
    for step, loss in ((1, "abc"), (2, float("nan")), (3, 0.5)):
        store.loss(0, 0, step, None, loss, None, time.time(), "report")
    store.close()
    for extra in ([], ["--summary"], ["--json"]):
        shown = rpcctl("inspect", "losses", "odd-losses", "--runs-dir", str(runs_dir), *extra)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "0.5" in shown.stdout


# -- a runs directory other users can write in (issue 28, item 8) ---------------------------------


@pytest.mark.parametrize("case", ["world-writable", "a-parent-world-writable", "another-users"])
def test_a_runs_dir_others_could_swap_a_run_in_is_refused_before_anything_starts(tmp_path, case):
    shared = tmp_path / "shared"
    shared.mkdir()
    runs = shared / "runs"
    runs.mkdir()
    unsafe = {"world-writable": runs, "a-parent-world-writable": shared, "another-users": runs}[case]
    if case == "another-users":
        os.chown(runs, 65534, 65534)  # nobody's: we are root, so the directory is another user's
    else:
        unsafe.chmod(0o777)
    config = write_config(tmp_path, nproc_per_node=1)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs), "--no-live")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: --runs-dir {runs}: {unsafe} ") and len(result.stderr.splitlines()) == 1, (
        result.stderr
    )
    assert (
        "another user (uid 65534)" if case == "another-users" else "writable by every user (mode 777)"
    ) in result.stderr
    assert list(runs.iterdir()) == []  # no run directory, nothing started


def test_a_sticky_or_group_writable_runs_dir_is_used(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o1777)  # as /tmp: no one renames another's entries
    config = write_config(tmp_path, nproc_per_node=1)
    sticky = rpcctl("launch", str(config), "--runs-dir", str(runs), "--no-live")
    assert sticky.returncode == 0 and "warning" not in sticky.stderr, sticky.stderr
    runs.chmod(0o775)
    group = rpcctl("launch", str(config), "--runs-dir", str(runs), "--no-live")
    assert group.returncode == 0, group.stderr
    assert f"warning: {runs} is writable by its group (mode 775)" in group.stderr


def test_a_runs_dir_rpcctl_makes_is_not_writable_by_others_whatever_the_umask(tmp_path):
    runs = tmp_path / "new" / "runs"
    config = write_config(tmp_path, nproc_per_node=1)
    for _ in range(2):  # the second run uses the runs directory the first one made
        result = subprocess.run(
            [sys.executable, "-m", "rpcctl", "launch", str(config), "--runs-dir", str(runs), "--no-live"],
            capture_output=True,
            text=True,
            umask=0,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(runs.stat().st_mode) == 0o755 and stat.S_IMODE(runs.parent.stat().st_mode) == 0o755


def test_a_run_file_swapped_for_a_link_is_not_written_through(tmp_path, runs_dir):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=1, args=["0=hang"])
    try:
        stack_file = run_dir / "stacks" / "rank-0.txt"
        wait_until(stack_file.exists, 30, "the rank's stack file")
        stack_file.unlink()
        stack_file.symlink_to(outside)  # the launcher appends a header here before a teardown
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=60)
    finally:
        kill_if_running(launcher)
    assert launcher.returncode == 143
    assert outside.read_text() == "untouched\n"
    assert_no_process_left(run_dir)


def test_private_files_and_dirs_never_follow_a_link(tmp_path):
    from rpcctl.base.private import private_dir, private_file, private_open

    target = tmp_path / "target.txt"
    target.write_text("mine\n")
    target.chmod(0o644)
    target_dir = tmp_path / "target-dir"
    target_dir.mkdir(mode=0o755)
    for name, call in [
        ("a", lambda p: private_open(p, "a")),
        ("w", lambda p: private_open(p, "w")),
        ("file", private_file),
    ]:
        link = tmp_path / f"link-{name}"
        link.symlink_to(target)
        with pytest.raises(OSError):
            call(link)
    link_dir = tmp_path / "link-dir"
    link_dir.symlink_to(target_dir)
    with pytest.raises(OSError):
        private_dir(link_dir)
    assert target.read_text() == "mine\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE(target_dir.stat().st_mode) == 0o755
