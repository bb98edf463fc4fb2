"""`rpcctl launch` with real processes: every way a rank can end, every way the launcher can be
stopped, and proof after each that no process of the run is left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rpcctl.records.runs import rank_log
from conftest import (
    assert_no_process_left,
    launch_job as launch,
    launch_until_running,
    only_run,
    pids_gone,
    record,
    rpcctl,
    start_rpcctl,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.timeout(90)


def test_success_streams_prefixed_output_and_records_the_run(tmp_path, runs_dir):
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=3, args=["0=ok"])
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert f"[rank{rank}]: rank {rank} done" in result.stdout
        assert (run_dir / "logs" / f"rank-{rank}.log").read_text().endswith(f"rank {rank} done\n")
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0
    assert [r["state"] for r in rec["ranks"]] == ["succeeded"] * 3
    assert all(r["exit_code"] == 0 for r in rec["ranks"])
    assert rec["ended_at"] >= rec["started_at"]
    assert (run_dir / "config.yaml").is_file()
    assert "succeeded" in result.stderr


def test_env_contract_reaches_the_script(tmp_path, runs_dir):
    script = tmp_path / "env.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE','GROUP_RANK','MASTER_ADDR','MASTER_PORT',"
        "'RPCCTL_RUN_ID','RPCCTL_RUN_DIR','MY_VAR','TP_SOCKET_IFNAME','GLOO_SOCKET_IFNAME']\n"
        "print('ENV', json.dumps({k: os.environ.get(k) for k in keys}), json.dumps(sys.argv), __name__)\n"
    )
    result, run_dir, rec = launch(
        tmp_path, runs_dir, script=str(script), nproc_per_node=2, args=["--lr", 0.5], env={"MY_VAR": "x"}
    )
    assert result.returncode == 0, result.stderr
    seen = {}
    for line in result.stdout.splitlines():
        if " ENV " in line:
            _, payload = line.split(" ENV ", 1)
            env_json, rest = payload.split("} ", 1)
            env = json.loads(env_json + "}")
            argv, name = rest.rsplit(" ", 1)
            seen[int(env["RANK"])] = (env, json.loads(argv), name)
    assert set(seen) == {0, 1}
    for rank, (env, argv, name) in seen.items():
        assert env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == str(rec["master_port"])
        assert env["RPCCTL_RUN_ID"] == rec["run_id"] and env["RPCCTL_RUN_DIR"] == str(run_dir.resolve())
        assert env["MY_VAR"] == "x" and env["TP_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] != None  # noqa: E711
        assert argv == [str(script), "--lr", "0.5"] and name == "__main__"


@pytest.mark.parametrize(
    ("action", "exit_code", "signal_name", "message"),
    [
        ("exit:3", 3, None, "rank 1 (pid"),
        ("raise", 1, None, "ValueError: bad value in rank 1"),
        ("sigkill", None, "SIGKILL", "killed by SIGKILL"),
        ("sigsegv", None, "SIGSEGV", "killed by SIGSEGV"),
    ],
)
def test_failing_rank_is_the_root_cause_and_takes_the_job_down(
    tmp_path, runs_dir, action, exit_code, signal_name, message
):
    started = time.monotonic()
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=3, args=[f"1={action}", "0=hang", "2=hang"])
    assert result.returncode == 1
    assert time.monotonic() - started < 30  # torn down, not waiting for the hung ranks
    cause = rec["root_cause"]
    assert cause["rank"] == 1 and cause["exit_code"] == exit_code and cause["signal"] == signal_name
    assert rec["status"] == "failed"
    states = {r["rank"]: r["state"] for r in rec["ranks"]}
    assert states == {0: "killed", 1: "failed", 2: "killed"}
    assert "root cause: rank 1" in result.stderr and message in result.stderr
    # JobFailedError(reported=True): the boundary adds no second message. Counted as lines of
    # rpcctl's own: the rank's last lines quoted below the verdict may hold "Fatal Python error:".
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        result.stderr.splitlines()[0]
    ], result.stderr
    assert pids_gone(r["pid"] for r in rec["ranks"])


def test_launcher_log_keeps_the_launchers_messages_and_verdict(tmp_path, runs_dir):
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["1=raise"], max_restarts=1)
    assert result.returncode == 1
    log = run_dir / "launcher.log"
    assert (log.stat().st_mode & 0o777) == 0o600
    text = log.read_text()
    stamped = [line for line in text.splitlines() if not line.startswith(" ")]
    assert stamped and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", line) for line in stamped), text
    assert "warning: restarting the whole group (1/1)" in text, text  # a message during the run
    assert f"error: job '{rec['name']}' failed after" in text and "root cause: rank 1 (pid" in text, text  # the verdict
    assert "ValueError: bad value in rank 1" in text and "restarts: 1 of 1" in text, text
    assert text.index("restarting the whole group") < text.index("error: job")


def test_uncaught_exception_is_written_to_the_error_file_with_the_users_traceback(tmp_path, runs_dir):
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["1=raise", "0=hang"])
    error = json.loads((run_dir / "errors" / "rank-1.json").read_text())
    assert error["message"]["message"] == "ValueError: bad value in rank 1"
    callstack = error["message"]["extraInfo"]["py_callstack"]
    assert "behave.py" in callstack and "rpcctl/rank/runtime.py" not in callstack
    assert rec["root_cause"]["traceback"] == callstack
    assert 'raise ValueError(f"bad value in rank {rank}")' in result.stderr


def test_segfault_prints_the_python_stack_into_the_rank_log(tmp_path, runs_dir):
    _, run_dir, _ = launch(tmp_path, runs_dir, nproc_per_node=1, args=["0=sigsegv"])
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log and "behave.py" in log


def test_timeout_tears_the_job_down_and_says_why(tmp_path, runs_dir):
    started = time.monotonic()
    result, _, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["0=hang", "1=hang"], timeout=1.5)
    assert result.returncode == 1
    assert time.monotonic() - started < 20
    assert rec["status"] == "failed" and rec["root_cause"]["reason"] == "timeout"
    assert "exceeded its timeout of 1.5s" in result.stderr
    assert {r["state"] for r in rec["ranks"]} == {"killed"}


def test_a_rank_ignoring_sigterm_is_killed_after_grace(tmp_path, runs_dir):
    started = time.monotonic()
    result, _, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["0=ignore-term", "1=fail-after:1"], grace=1)
    assert result.returncode == 1
    assert time.monotonic() - started < 20
    rank0 = rec["ranks"][0]
    assert rank0["state"] == "killed" and rank0["signal"] == "SIGKILL"


def test_grandchildren_are_killed_with_their_rank(tmp_path, runs_dir):
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["0=child", "1=fail-after:1.5"])
    assert result.returncode == 1 and rec["root_cause"]["exit_code"] == 2
    grandchild = int((run_dir / "grandchild-0.pid").read_text())
    assert pids_gone([grandchild])


def test_restarts_rerun_the_whole_group_and_are_recorded(tmp_path, runs_dir):
    result, run_dir, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["1=flaky"], max_restarts=2)
    assert result.returncode == 0, result.stderr
    assert rec["status"] == "succeeded" and rec["restarts"] == 1
    assert "restarting the whole group (1/2)" in result.stderr
    log = (run_dir / "logs" / "rank-1.log").read_text()
    assert "attempt 0" in log and "--- rpcctl: restart 1 ---" in log and "attempt 1" in log


def test_restarts_run_out(tmp_path, runs_dir):
    result, _, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["1=exit:5"], max_restarts=2)
    assert result.returncode == 1
    assert rec["restarts"] == 2 and rec["root_cause"]["exit_code"] == 5


def test_spawn_start_method_runs_a_fresh_interpreter(tmp_path, runs_dir):
    script = tmp_path / "fresh.py"
    script.write_text("import sys\nprint('torch preloaded:', 'torch' in sys.modules)\n")
    result, _, rec = launch(tmp_path, runs_dir, script=str(script), nproc_per_node=2, start_method="spawn")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("torch preloaded: False") == 2


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_an_rpcctl_folder_in_the_working_directory_is_never_imported(tmp_path, runs_dir, start_method):
    # The rank server and the ranks ran as `python -m`, which puts the working directory first
    # on sys.path: launched beside another checkout, they imported its rpcctl/, not the
    # installed one. A preload module kept there is still found, as `python -m` finds it.
    import rpcctl

    work = tmp_path / "work"
    (work / "rpcctl").mkdir(parents=True)
    (work / "rpcctl" / "__init__.py").write_text("raise SystemExit('imported the rpcctl/ of the working directory')\n")
    (work / "kept_here.py").write_text("")
    script = tmp_path / "which.py"
    script.write_text(
        "import sys, rpcctl\nprint('rpcctl:', rpcctl.__file__, 'preloaded:', 'kept_here' in sys.modules)\n"
    )
    preload = ["kept_here"] if start_method == "fork" else []
    config = write_config(tmp_path, script=str(script), nproc_per_node=2, start_method=start_method, preload=preload)
    result = subprocess.run(  # the console script, as a user runs it
        [str(Path(sys.executable).parent / "rpcctl"), "launch", str(config), "--no-live", "--runs-dir", str(runs_dir)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_no_process_left(only_run(runs_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(f"rpcctl: {rpcctl.__file__} preloaded: {start_method == 'fork'}") == 2, result.stdout


def test_ranks_filter_limits_the_console_but_not_the_logs(tmp_path, runs_dir):
    result, run_dir, _ = launch(tmp_path, runs_dir, "--ranks", "1", nproc_per_node=3)
    assert result.returncode == 0
    assert "[rank1]:" in result.stdout and "[rank0]:" not in result.stdout and "[rank2]:" not in result.stdout
    assert "rank 0 done" in (run_dir / "logs" / "rank-0.log").read_text()


# -- the launcher itself is signalled or killed ------------------------------------------------


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_the_launcher_cancels_cleanly(tmp_path, runs_dir, sig, code):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=child", "1=hang"])
    wait_until(lambda: (run_dir / "grandchild-0.pid").exists(), 10, "the grandchild")
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == code, err
    rec = record(run_dir)
    assert rec["status"] == "cancelled" and rec["reason"] == f"cancelled by {signal.Signals(sig).name}"
    assert {r["state"] for r in rec["ranks"]} == {"killed"}
    assert_no_process_left(run_dir)


def test_kill_9_of_the_launcher_leaves_no_process_behind(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=child", "1=ignore-term"])
    wait_until(lambda: (run_dir / "grandchild-0.pid").exists(), 10, "the grandchild")
    grandchild = int((run_dir / "grandchild-0.pid").read_text())
    ranks = [r["pid"] for r in record(run_dir)["ranks"]]
    launcher.kill()
    launcher.communicate(timeout=10)
    assert_no_process_left(run_dir, timeout=10)
    assert pids_gone([grandchild, *ranks])
    assert record(run_dir)["status"] == "running"  # nobody could write the end...
    result = rpcctl("runs", "--runs-dir", str(runs_dir), "--json")
    assert json.loads(result.stdout)[0]["status"] == "lost"  # ...so readers see it is lost


def test_rpcctl_stop_cancels_a_live_run(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=hang", "1=hang"])
    result = rpcctl("stop", "--runs-dir", str(runs_dir))
    assert result.returncode == 0, result.stderr
    assert "cancelled" in result.stderr
    launcher.communicate(timeout=30)
    assert launcher.returncode == 143
    assert record(run_dir)["status"] == "cancelled"
    assert_no_process_left(run_dir)
    again = rpcctl("stop", run_dir.name, "--runs-dir", str(runs_dir))
    assert again.returncode == 2 and "not running" in again.stderr


# -- torch RPC --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_early_death_before_rendezvous_does_not_leave_the_others_waiting(tmp_path, runs_dir):
    # Rank 0 waits in init_rpc's rendezvous for rank 1, which exits before ever joining.
    started = time.monotonic()
    result, _, rec = launch(tmp_path, runs_dir, nproc_per_node=2, args=["0=rpc", "1=exit:9"], preload=["torch"])
    assert result.returncode == 1
    assert rec["root_cause"]["rank"] == 1 and rec["root_cause"]["exit_code"] == 9
    assert time.monotonic() - started < 30  # not torch's 30-minute rendezvous timeout


@pytest.mark.timeout(120)
def test_rpc_job_listens_on_loopback_only(tmp_path, runs_dir):
    config = write_config(
        tmp_path, nproc_per_node=2, args=["0=rpc", "1=rpc"], preload=["torch", "torch.distributed.rpc"]
    )
    launcher = start_rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live")
    run_dir = only_run(runs_dir)
    listening: dict[int, set[str]] = {}
    while launcher.poll() is None:  # sample the ranks' listening sockets while they live
        for rank in record(run_dir)["ranks"]:
            if not rank["pid"]:
                continue
            try:
                for conn in psutil.Process(rank["pid"]).net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        listening.setdefault(rank["rank"], set()).add(conn.laddr.ip)
            except psutil.Error:
                pass
        time.sleep(0.02)
    out, err = launcher.communicate()
    assert launcher.returncode == 0, err
    assert "[rank0]: rank 0 rpc result [1.0, 1.0]" in out and "[rank1]: rank 1 rpc result [2.0, 2.0]" in out
    assert 0 in listening, "never saw rank 0 listen (the job ended too fast to sample?)"
    assert set().union(*listening.values()) <= {"127.0.0.1"}, listening
    assert_no_process_left(run_dir)


SHUTDOWN_ORDER_JOB = """
import os, sys, time
import torch.distributed.rpc as rpc
rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
if rank == 1:
    time.sleep(0.5)  # the last one into shutdown's final barrier
# When torch's own shutdown returned, stamped before rpcctl's wrapper around it tells rank 0 so
# (a time printed afterwards can lag by however long the rank is descheduled).
torch_returned = []
def stamp(frame, event, arg):
    if (
        event == "return"
        and frame.f_code.co_name == "shutdown"
        and frame.f_code.co_filename.endswith(os.path.join("rpc", "api.py"))
    ):
        torch_returned.append(time.time())
sys.setprofile(stamp)
rpc.shutdown()
sys.setprofile(None)
print(f"shutdown returned at {time.time() if rank == 0 else torch_returned[0]:.6f}", flush=True)
"""


@pytest.mark.timeout(120)
def test_rank_0_keeps_the_rendezvous_store_until_every_rank_has_shut_down(tmp_path, runs_dir):
    """Rank 0 hosts the store that TensorPipe's shutdown ends on; leaving first cut a peer off
    inside that barrier (DistNetworkError: Connection reset by peer, a failed rank of a job
    that did nothing wrong). Its shutdown returns only after every other rank's did."""
    (tmp_path / "order.py").write_text(SHUTDOWN_ORDER_JOB)
    config = tmp_path / "order.yaml"
    config.write_text("name: order\nscript: order.py\nnproc_per_node: 3\n")
    result = rpcctl("launch", str(config), "--runs-dir", str(runs_dir), "--no-live", timeout=90)
    assert result.returncode == 0, result.stderr
    returned = {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r"\[rank(\d)\]: shutdown returned at ([\d.]+)", result.stdout)
    }
    assert sorted(returned) == [0, 1, 2], result.stdout
    assert returned[0] >= max(returned[1], returned[2]), returned
    assert_no_process_left(only_run(runs_dir))


def test_logs_follow_streams_until_the_run_ends(tmp_path, runs_dir):
    launcher, run_dir = launch_until_running(tmp_path, runs_dir, nproc_per_node=2, args=["0=slow:2", "1=slow:2"])
    follow = rpcctl("logs", "-f", "--runs-dir", str(runs_dir), timeout=30)  # returns once the run ends
    launcher.communicate(timeout=30)
    assert follow.returncode == 0
    assert "[rank0]: rank 0 started" in follow.stdout and "[rank1]: rank 1 started" in follow.stdout
    assert_no_process_left(run_dir)


def test_runs_lists_newest_first_as_a_table_and_json(tmp_path, runs_dir):
    config = write_config(tmp_path, name="first", nproc_per_node=1)
    assert rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir)).returncode == 0
    config = write_config(tmp_path, name="second", nproc_per_node=1, args=["0=exit:3"])
    assert rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir)).returncode == 1
    table = rpcctl("runs", "--runs-dir", str(runs_dir), env={**os.environ, "COLUMNS": "200"})
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "NAME", "STATUS"]
    assert lines[1].split()[1:3] == ["second", "failed"] and lines[2].split()[1:3] == ["first", "succeeded"]
    documents = json.loads(rpcctl("runs", "--json", "--runs-dir", str(runs_dir)).stdout)
    assert [d["name"] for d in documents] == ["second", "first"]
    assert documents[0]["root_cause"]["exit_code"] == 3
    empty = rpcctl("runs", "--json", "--runs-dir", str(tmp_path / "nowhere"))
    assert json.loads(empty.stdout) == []


def test_a_forked_rank_ends_like_python_does(tmp_path, runs_dir):
    # Forked ranks skip the interpreter teardown; what scripts rely on at exit must still happen.
    script = tmp_path / "ending.py"
    script.write_text(
        "import atexit, os, threading, time\n"
        "f = open(os.path.join(os.environ['RPCCTL_RUN_DIR'], 'unclosed-' + os.environ['RANK'] + '.txt'), 'w')\n"
        "f.write('never closed\\n')\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread finished', flush=True))).start()\n"
    )
    result, run_dir, _ = launch(tmp_path, runs_dir, script=str(script), nproc_per_node=2)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert (run_dir / f"unclosed-{rank}.txt").read_text() == "never closed\n"
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert log.index("thread finished") < log.index("atexit ran")  # threads joined first, as in CPython


def test_piped_tables_keep_whole_rows(tmp_path, runs_dir):
    name = "a-rather-long-job-name-that-would-not-fit-in-eighty-columns-with-the-rest-of-the-row"
    config = write_config(tmp_path, name=name, nproc_per_node=1)
    assert rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs_dir)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    table = rpcctl("runs", "--runs-dir", str(runs_dir), env=env)
    row = table.stdout.splitlines()[1]
    assert name in row and "succeeded" in row  # not cut to the 80 columns Rich assumes for a pipe


PRINTERS = """\
import multiprocessing as mp
import subprocess
import sys
import time

def lines(who, start, n=4000):
    time.sleep(max(0.0, start - time.time()))  # all five print at once
    for i in range(n):
        print(f"{who} line {i} end")
        if i % 40 == 0:
            print(f"{who} error {i} end", file=sys.stderr)

if __name__ == "__main__":
    start = time.time() + 2.0
    children = [mp.get_context("spawn").Process(target=lines, args=(f"spawned{k}", start)) for k in range(2)]
    children.append(mp.get_context("fork").Process(target=lines, args=("forked", start)))
    for child in children:
        child.start()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from printers import lines;"
        " lines('subprocess', float(sys.argv[2]))"
    )
    helper = subprocess.Popen([sys.executable, "-c", code, sys.argv[0].rsplit("/", 1)[0], str(start)])
    lines("rank", start)
    for child in children:
        child.join()
    assert helper.wait() == 0
"""


def test_processes_sharing_a_ranks_output_never_split_each_others_lines(tmp_path, runs_dir):
    # Unbuffered (PYTHONUNBUFFERED=1), print() is two writes, the text and the newline, and two
    # processes on one pipe interleave them ("a line 5 endb line 9 end\n\n"): a 2-process loop
    # of 20,000 prints split 18,808 lines so. Every process of the run writes whole lines
    # (the code before fails here: checked).
    script = tmp_path / "printers.py"
    script.write_text(PRINTERS)
    result, run_dir, _ = launch(tmp_path, runs_dir, script=str(script), nproc_per_node=1)
    assert result.returncode == 0, result.stderr
    assert_no_process_left(run_dir)
    log = rank_log(run_dir, 0).read_text()
    whole = re.compile(r"(spawned0|spawned1|forked|subprocess|rank) (line|error) \d+ end")
    split = [line for line in log.splitlines() if not whole.fullmatch(line)]
    assert not split, split[:5]
    assert len(log.splitlines()) == 5 * (4000 + 100)
