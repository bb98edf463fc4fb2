"""Faults around a job, with real launchers, ranks and signals: the launcher's own signals
(SIGHUP, SIGQUIT), a full disk (an injected writer, and a real tiny tmpfs), a run directory
that cannot be made or disappears, and the rank server killed with SIGKILL. After each: the
record says what happened, no log byte written before the fault is lost, no process is left."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import (
    assert_no_process_left,
    kill_if_running,
    launch_until_running,
    only_run,
    pids_gone,
    record,
    rpcctl,
    start_rpcctl,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.timeout(120)


# -- signals to the launcher ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_sighup_and_sigquit_cancel_like_sigterm(tmp_path, runs_dir, sig):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=child", "1=hang"])
    wait_until(lambda: (run_dir / "grandchild-0.pid").exists(), 10, "the grandchild")
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + sig, err
    assert "Traceback" not in err
    rec = record(run_dir)
    assert rec["status"] == "cancelled" and rec["reason"] == f"cancelled by {sig.name}", rec
    assert rec["exit_code"] == 128 + sig
    assert {r["state"] for r in rec["ranks"]} == {"killed"}
    assert not (run_dir / "telemetry.sock").exists()
    assert not (run_dir / "telemetry.db-wal").exists()
    assert_no_process_left(run_dir)
    listed = json.loads(rpcctl("runs", "--runs-dir", str(runs_dir), "--json").stdout)
    assert listed[0]["status"] == "cancelled"  # not "lost"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_ranks_start_ends_the_launch_in_one_line(tmp_path, runs_dir, monkeypatch, sig):
    """A node of a two-node job waits at the rendezvous for a node 0 that never comes: a cancel
    signal then, before the supervisor's own handling, ends it with one line and the signal's
    code (SIGINT was a bare KeyboardInterrupt there; SIGTERM ended it unannounced)."""
    with socket.socket() as placeholder:  # a port no one listens on: node 0 never comes
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    monkeypatch.setenv("RPCCTL_SECRET", "s" * 32)
    config = write_config(tmp_path, nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=port, rdzv_timeout=60)
    launcher = start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live")
    try:
        waiting = launcher.stderr.readline()
        assert "for node 0's rendezvous" in waiting, waiting
        time.sleep(0.5)
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
    finally:
        kill_if_running(launcher)
    assert launcher.returncode == 128 + sig, err
    assert "Traceback" not in err and f"cancelled by {sig.name} before the job started" in err, err
    assert not runs_dir.exists() or not any(runs_dir.iterdir()), list(runs_dir.iterdir())  # nothing of the job was made


# -- a full disk -------------------------------------------------------------------------------


class _FillsUp:
    """A log file on a disk with ``room`` bytes left: writes what fits, then raises ENOSPC, as
    a real file does (a short write first, an error on the next)."""

    def __init__(self, path, mode, buffering=0, room=0):
        self.file = open(path, mode, buffering=buffering)  # noqa: SIM115 - closed by the pump
        self.room = room

    def write(self, data):
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.file.write(bytes(data[: self.room]))
        self.room -= n
        return n

    def close(self):
        self.file.close()


def test_log_pump_keeps_draining_after_enospc(tmp_path):
    from rpcctl.processes.procs import LogPump

    lines: list[str] = []
    errors: list[tuple[int, Path, int, OSError]] = []
    pump = LogPump(
        lambda rank, piece: piece.final and lines.append(piece.text),
        lambda *e: errors.append(e),
        open_log=lambda path, mode, buffering: _FillsUp(path, mode, buffering, room=1000),
    )
    pump.start()
    log = tmp_path / "logs" / "rank-1.log"
    write_fd = pump.add(1, log)
    # A real process writes 4 MB: far more than a pipe holds, so it blocks unless the pump drains.
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfor i in range(40000): print(f'line {i:06d} ' + 'x' * 88)"], stdout=write_fd
    )
    os.close(write_fd)
    assert writer.wait(timeout=60) == 0
    pump.drain(timeout=30)
    assert len(lines) == 40000 and lines[-1].startswith("line 039999")
    assert len(errors) == 1
    rank, path, written, exc = errors[0]
    assert (rank, path, written, exc.errno) == (1, log, 1000, errno.ENOSPC)
    assert log.read_bytes() == ("".join(f"line {i:06d} " + "x" * 88 + "\n" for i in range(10)).encode())[:1000]


@contextlib.contextmanager
def tmpfs(where: Path, options: str):
    """A real tmpfs at ``where`` (root only; the test is skipped where it cannot mount)."""
    where.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB file system."""
    with tmpfs(tmp_path / "tiny", "size=1m,mode=0755") as where:
        yield where


def test_full_disk_truncates_the_log_with_one_warning_and_the_job_succeeds(tmp_path, tiny_tmpfs):
    runs_dir = tiny_tmpfs / "runs"
    # Rank 0 prints 6 MB, six times the disk; rank 1 a little. Rank 0's first line goes out
    # flushed at its start: the telemetry store's WAL shares the disk and grows while the job
    # runs (in CI under load it once took the last page before rank 0's first 8 KiB block).
    lines = 60000
    script = tmp_path / "loud.py"
    script.write_text(
        "import os\n"
        "rank = int(os.environ['RANK'])\n"
        f"for i in range({lines} if rank == 0 else 10):\n"
        "    print(f'rank {rank} line {i:06d} ' + 'y' * 80, flush=rank == 1 or i == 0)\n"
        "print(f'rank {rank} the end', flush=True)\n"
    )
    config = write_config(tmp_path, script=str(script), nproc_per_node=2)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=90)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # The console got every line, the disk or not.
    assert result.stdout.count("[rank0]: rank 0 line") == lines
    assert "[rank0]: rank 0 the end" in result.stdout and "[rank1]: rank 1 the end" in result.stdout
    # One warning per rank whose log lost bytes (rank 1 may find the disk already full).
    warnings = [line for line in result.stderr.splitlines() if "log truncated" in line]
    rank0 = [line for line in warnings if "rank 0's" in line]
    assert len(rank0) == 1 and len(warnings) <= 2, result.stderr
    assert "disk full: rank 0's log truncated after" in rank0[0] and "rank-0.log" in rank0[0]
    run_dir = only_run(runs_dir)
    kept = int(rank0[0].split("truncated after ")[1].split(" bytes")[0])
    log = (run_dir / "logs" / "rank-0.log").read_bytes()
    # Every byte that reached the disk is the rank's output, in order, none lost or doubled.
    printed = "".join(f"rank 0 line {i:06d} " + "y" * 80 + "\n" for i in range(lines)).encode()
    assert kept > 0 and len(log) == kept and log == printed[:kept], (kept, log[:200])
    # The record ends, disk full or not (its reserve is rewritten in place), and says what was lost.
    ended = json.loads((run_dir / "run.json").read_text())
    assert ended["status"] == "succeeded" and ended["ended_at"], ended
    assert [r["state"] for r in ended["ranks"]] == ["succeeded", "succeeded"]
    assert any("rank 0's log truncated" in w for w in ended["warnings"]), ended["warnings"]
    listed = rpcctl("runs", "--json", "--runs-dir", str(runs_dir))
    assert json.loads(listed.stdout)[0]["status"] == "succeeded", listed.stdout
    assert_no_process_left(run_dir)


def test_store_degrades_with_one_warning_on_a_full_disk(tiny_tmpfs):
    from rpcctl.telemetry.store import StoreWriter

    warnings: list[str] = []
    store = StoreWriter(tiny_tmpfs / "telemetry.db", warn=warnings.append)
    for i in range(20000):  # ~4 MB of rows into 1 MiB
        store.loss(0, 0, i, None, 1.0 / (i + 1), {"note": "z" * 200}, time.time(), "log")
        if i % 100 == 0:
            store.commit()
    store.close()  # no traceback: a warning already said it
    assert len(warnings) == 1 and "disk is full" in warnings[0], warnings


# -- the run directory -------------------------------------------------------------------------


def test_runs_dir_that_is_a_file_is_a_usage_error(tmp_path):
    not_a_dir = tmp_path / "runs-file"
    not_a_dir.write_text("")
    config = write_config(tmp_path, nproc_per_node=1)
    result = rpcctl("launch", str(config), "--runs-dir", str(not_a_dir), "--no-live")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"--runs-dir {not_a_dir}" in result.stderr and "is a file, not a directory" in result.stderr


def test_read_only_runs_dir_is_a_usage_error(tmp_path):
    config = write_config(tmp_path, nproc_per_node=1)
    with tmpfs(tmp_path / "ro", "ro,size=64k") as where:
        result = rpcctl("launch", str(config), "--runs-dir", str(where), "--no-live")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "cannot create the run directory" in result.stderr and "Read-only file system" in result.stderr


def test_job_name_over_the_file_name_limit_is_a_config_error(tmp_path, runs_dir):
    config = write_config(tmp_path, name="n" * 250, nproc_per_node=1)
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "key 'name'" in result.stderr and "too long" in result.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_run_dir_removed_mid_run_does_not_fail_the_job(tmp_path, runs_dir):
    import shutil

    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=slow:3", "1=slow:3"])
    run_id = record(run_dir)["run_id"]
    for rank in (0, 1):  # past rpcctl's bootstrap, which makes files in the run directory
        wait_until(
            lambda rank=rank: "started" in (run_dir / "logs" / f"rank-{rank}.log").read_text(),
            30,
            f"rank {rank} started",
        )
    shutil.rmtree(run_dir)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err
    assert "Traceback" not in err
    assert "could not write the run record" in err
    assert "[rank0]: rank 0 started" in out
    wait_until(lambda: not _processes_with_run_id(run_id), 10, "the run's processes to end")


def _processes_with_run_id(run_id):
    from conftest import processes_of_run

    return processes_of_run(run_id)


# -- the rank server killed under the launcher -------------------------------------------------


def _ignore_term_grandchild_script(tmp_path: Path) -> Path:
    """A rank that starts a grandchild which ignores SIGTERM, and one more that leaves the
    rank's process group (setsid), then hangs."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "stubborn = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
        "kids = [subprocess.Popen([sys.executable, '-c', stubborn]),\n"
        "        subprocess.Popen([sys.executable, '-c', stubborn], start_new_session=True)]\n"
        "rank = os.environ['RANK']\n"
        "with open(os.path.join(os.environ['RPCCTL_RUN_DIR'], f'kids-{rank}.pid'), 'w') as f:\n"
        "    f.write(' '.join(str(k.pid) for k in kids))\n"
        "print('kids started', flush=True)\n"
        "time.sleep(600)\n"
    )
    return script


def test_kill_9_of_the_rank_server_takes_every_rank_tree_down(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(
        tmp_path, runs_dir, nproc_per_node=2, script=str(_ignore_term_grandchild_script(tmp_path))
    )
    for rank in (0, 1):
        wait_until(
            lambda rank=rank: (run_dir / f"kids-{rank}.pid").exists(),
            30,
            f"rank {rank}'s grandchildren",
            run_dir / "logs",
        )
    kids = [int(pid) for rank in (0, 1) for pid in (run_dir / f"kids-{rank}.pid").read_text().split()]
    ranks = [r["pid"] for r in record(run_dir)["ranks"]]
    server = next(
        p for p in psutil.Process(launcher.pid).children() if "rpcctl.processes.rank_server" in " ".join(p.cmdline())
    )
    server.kill()
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1, err
    assert "Traceback" not in err
    wait_until(
        lambda: pids_gone([*kids, *ranks, server.pid]),
        10,
        "the ranks, their grandchildren and the rank server to be gone",
    )
    assert_no_process_left(run_dir)
    rec = record(run_dir)
    assert (
        rec["status"] == "failed"
        and f"the rank server (pid {server.pid}) killed by SIGKILL" in rec["root_cause"]["message"]
    ), rec
    assert {r["state"] for r in rec["ranks"]} == {"killed"}


# -- a log rotated while `rpcctl logs -f` follows it -------------------------------------------

GATED = """
import os, pathlib, time
for i in range(5):
    print(f"before {i}", flush=True)
while not pathlib.Path(os.environ["GATE"]).exists():
    time.sleep(0.05)
"""


@pytest.mark.parametrize("raw", [False, True], ids=["lines", "raw"])
def test_logs_follow_goes_on_with_a_log_renamed_or_truncated_under_it(tmp_path, runs_dir, raw):
    script = tmp_path / "gated.py"
    script.write_text(GATED)
    gate = tmp_path / "gate"
    launcher, run_dir = launch_until_running(
        tmp_path, runs_dir, script=str(script), nproc_per_node=1, env={"GATE": str(gate)}
    )
    log = run_dir / "logs" / "rank-0.log"
    follower = None
    try:
        wait_until(lambda: b"before 4\n" in log.read_bytes(), 30, "the rank's lines")
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rpcctl",
                "logs",
                "-f",
                *(["--raw"] if raw else []),
                run_dir.name,
                "--runs-dir",
                str(runs_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        shown: list[str] = []
        reader = threading.Thread(target=lambda: shown.extend(follower.stdout), daemon=True)
        reader.start()
        wait_until(lambda: any("before 4" in line for line in shown), 30, "logs -f showing the lines")
        log.rename(log.with_name("rank-0.log.1"))  # logrotate's `create`: a new file at the same path
        log.write_text("new file, line 1\nnew file, line 2\n")
        wait_until(
            lambda: any("new file, line 2" in line for line in shown),
            10,
            f"logs -f showing the new file's lines: {shown}",
        )
        with open(log, "r+") as f:  # logrotate's `copytruncate`
            f.truncate(0)
            f.write("truncated\n")
        gate.touch()
        follower.wait(timeout=30)
        reader.join(timeout=10)
        out, err = "".join(shown), follower.stderr.read()
        assert launcher.wait(timeout=30) == 0
    finally:
        gate.touch()
        kill_if_running(launcher)
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()
    prefix = "" if raw else "[rank0]: "
    assert out.splitlines() == [f"{prefix}before {i}" for i in range(5)] + [
        f"{prefix}new file, line 1",
        f"{prefix}new file, line 2",
        f"{prefix}truncated",
    ], (out, err)
    assert err.splitlines() == [
        f"rpcctl: rank 0's log {log} was replaced (renamed or rotated): following the new file",
        f"rpcctl: rank 0's log {log} was truncated: reading it again from its start",
    ], err
    assert_no_process_left(run_dir)
