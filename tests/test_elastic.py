"""Elastic membership (issue 43): rpcctl's ElasticRendezvous over torch's own dynamic rendezvous
handler and c10d backend, for real: launchers-to-be (tests/workers/elastic_node.py, plain Python
processes on loopback) meet, grow from one node to two, see a killed member as lost and go on
alone (MIN 1), and refuse a rendezvous state forged into the store without the run's secret."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading

import pytest
import yaml
from hosts import create_pair, destroy_pair, unavailable
from test_multinode import finish, read, start_pod, write_hosts
from conftest import ROOT, WORKERS, assert_no_process_left, only_run, pids_gone, record, wait_until, write_config

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One elastic_node.py process and the JSON lines it printed."""

    def __init__(self, port: int, nproc: int, env: dict[str, str]):
        argv = [
            sys.executable,
            str(WORKERS / "elastic_node.py"),
            "127.0.0.1",
            str(port),
            "1",
            "2",
            str(nproc),
            "1",
            "3",
        ]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
        )
        self.lines: list[dict] = []
        self.text: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.text.append(line)
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def seen(self, key: str) -> list[dict]:
        return [line for line in self.lines if key in line]

    def wait(self, key: str, count: int = 1, timeout: float = 40) -> list[dict]:
        return wait_until(
            lambda: len(self.seen(key)) >= count and self.seen(key),
            timeout,
            f"{count} '{key}' line(s): {''.join(self.text)}",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


class Forgery:
    """What a forged state would do once unpickled: make a directory (it must never appear)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """One elastic job told once: A alone, B joins, B is killed, a state is forged, A refuses it."""
    tmp = tmp_path_factory.mktemp("elastic")
    env = {**os.environ, "RPCCTL_SECRET": secrets.token_hex(16), "PYTHONPATH": str(ROOT)}
    port = free_port()
    a = Node(port, 2, env)
    b = None
    try:
        a.wait("round")
        b = Node(port, 3, env)
        a.wait("round", 2)
        b.wait("round")
        b_pid = b.proc.pid
        b.proc.send_signal(signal.SIGKILL)  # a node lost: its launcher killed, by its pid
        b.proc.wait(10)
        a.wait("round", 3)
        marker = tmp / "unpickled"
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", port, None, False)  # anyone who reaches the port, without the secret
        store.set("torch.rendezvous.test-job", base64.b64encode(pickle.dumps(Forgery(str(marker)))))
        a.wait("error")
        a.proc.wait(20)
        yield {"a": a, "b": b, "b_pid": b_pid, "marker": marker}
    finally:
        for node in (a, b):
            if node is not None:
                node.stop()
        assert pids_gone([n.proc.pid for n in (a, b) if n is not None])


def test_the_first_node_starts_alone_and_hosts_the_store(story):
    a = story["a"]
    assert a.seen("opened")[0]["host"] is True
    first = a.seen("round")[0]
    assert (first["nnodes"], first["world_size"], first["group_rank"]) == (1, 2, 0)


def test_a_second_node_on_the_same_machine_joins_as_a_client_and_the_world_grows(story):
    a, b = story["a"], story["b"]
    assert b.seen("opened")[0]["host"] is False  # the endpoint is local to both: the first to bind hosts
    assert b.seen("opened")[0]["run_id"] == a.seen("opened")[0]["run_id"]  # the host's run document
    assert a.seen("waiting"), "A never saw B waiting to join"
    grown_a, grown_b = a.seen("round")[1], b.seen("round")[0]
    assert grown_a["round"] == grown_b["round"] > a.seen("round")[0]["round"]
    assert (grown_a["nnodes"], grown_a["world_size"]) == (grown_b["nnodes"], grown_b["world_size"]) == (2, 5)
    assert (grown_a["group_rank"], grown_a["first_rank"]) == (0, 0)
    assert (grown_b["group_rank"], grown_b["first_rank"]) == (1, 2)  # after A's two ranks
    assert grown_a["master"] == grown_b["master"]  # where the round's ranks meet, agreed


def test_a_killed_member_is_lost_and_the_survivor_goes_on_alone(story):
    a = story["a"]
    assert a.seen("lost") == [{"lost": story["b_pid"]}]
    alone = a.seen("round")[2]
    assert (alone["nnodes"], alone["world_size"], alone["pids"]) == (1, 2, [a.proc.pid])
    assert alone["round"] > a.seen("round")[1]["round"]


def test_a_state_forged_without_the_secret_is_refused_and_never_unpickled(story):
    a = story["a"]
    error = a.seen("error")[0]["error"]
    assert "not sealed with this run's secret" in error and "refused" in error
    assert a.proc.returncode == 3
    assert not story["marker"].exists()


# -- rpcctl launch of nnodes "1:2" -----------------------------------------------------------------

STEPS = 20


def elastic_config(tmp, port: int, checkpoint, endpoint: str = "127.0.0.1", **keys):
    return write_config(
        tmp,
        name="grow",
        script=str(WORKERS / "elastic_train.py"),
        args=[str(checkpoint), str(STEPS), "0.05", str(tmp / "hold"), "rpc"],
        nproc_per_node=2,
        nnodes="1:2",
        master_addr=endpoint,
        master_port=port,
        rdzv_timeout=10,
        rdzv_last_call=1,
        # each round's ranks fork from a server that imported torch once
        preload=["torch", "torch.distributed"],
        **keys,
    )


def launcher(host, config, runs: str, env: dict[str, str], *line: str) -> subprocess.Popen:
    """``rpcctl launch`` of ``config``, or (``line``) of a torchrun line instead, on an emulated ``host``."""
    argv = [
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        "--no-live",
        "--runs-dir",
        runs,
        *(list(line) if line else [str(config)]),
    ]
    return subprocess.Popen(
        host.command(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
        env=env,
    )


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    pair = create_pair(f"el{os.getpid() % 10000}", subnet="10.213.43")
    yield pair
    destroy_pair(pair)


def all_logs(run_dir) -> str:
    return "".join(path.read_text() for path in sorted((run_dir / "logs").glob("rank-*.log")))


def rank_log(run_dir, rank: int) -> str:
    path = run_dir / "logs" / f"rank-{rank}.log"
    return path.read_text() if path.is_file() else ""


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory, hosts):
    """One elastic job told once, as torchrun's users run theirs: node A starts alone (1:2, a config),
    node B (torchrun's line) joins (the world grows from 2 ranks to 4), B's launcher gets SIGTERM (by
    its pid) and A goes on alone to the end; the training script resumes from its checkpoint in each
    round. A and B are emulated hosts (network namespaces joined by a veth pair, as
    tests/test_multinode.py's)."""
    tmp = tmp_path_factory.mktemp("elastic_launch")
    env = {**os.environ, "RPCCTL_SECRET": secrets.token_hex(16), "NO_COLOR": "1", "COLUMNS": "200"}
    host_a, host_b = hosts
    port = 29843
    config = elastic_config(tmp, port, tmp / "checkpoint.json", host_a.address)
    hold = tmp / "hold"  # the ranks wait at this step (tests/workers/elastic_train.py): each round is seen training
    hold.write_text("3")
    a = launcher(host_a, config, str(tmp / "a"), env)
    b = None
    try:
        run_a = only_run(tmp / "a", timeout=30)
        wait_until(lambda: "step=3 " in rank_log(run_a, 0), 40, "A's ranks training alone", run_a / "logs")
        # torchrun's line
        b = launcher(
            host_b,
            None,
            str(tmp / "b"),
            env,
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{host_a.address}:{port}",
            "--rdzv-id",
            "grow",
            "--rdzv-conf",
            "join_timeout=10,last_call_timeout=1",
            str(WORKERS / "elastic_train.py"),
            *yaml.safe_load(config.read_text())["args"],
        )
        run_b = only_run(tmp / "b", timeout=40)
        wait_until(
            lambda: re.search(r"resume step=3 rank=\d world=4", all_logs(run_b)),
            40,
            "B's ranks at world 4",
            run_b / "logs",
        )
        hold.write_text("6")
        wait_until(
            lambda: re.search(r"^step=6 rank=\d world=4", all_logs(run_b), re.M),
            30,
            "B's ranks training at world 4",
            run_b / "logs",
        )
        b_ranks = [r["pid"] for r in record(run_b)["ranks"]]
        # node B leaves (a spot node's preemption): its launcher, by its pid
        os.kill(record(run_b)["launcher_pid"], signal.SIGTERM)
        b.communicate(timeout=30)
        wait_until(lambda: len(record(run_a).get("rounds", [])) == 3, 30, "A's third round", run_a / "logs")
        hold.unlink()
        a_out, a_err = a.communicate(timeout=60)
        yield {
            "a": (a.returncode, a_out, a_err),
            "run_a": run_a,
            "run_b": run_b,
            "b_ranks": b_ranks,
            "tmp": tmp,
            "env": env,
        }
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


def test_the_job_grows_and_shrinks_and_the_first_node_goes_on_to_the_end(elastic_run):
    code, out, err = elastic_run["a"]
    assert code == 0, err
    rec = record(elastic_run["run_a"])
    assert rec["status"] == "succeeded" and rec["restarts"] == 0  # membership changes are not restarts
    rounds = [(r["nnodes"], r["world_size"]) for r in rec["rounds"]]
    assert rounds == [(1, 2), (2, 4), (1, 2)], rec["rounds"]
    whys = [r["why"] for r in rec["rounds"]]
    assert whys[0] == "start" and "waiting to join" in whys[1] and "left the job (cancelled)" in whys[2], whys
    assert record(elastic_run["run_b"])["status"] == "cancelled"  # B's own run says what happened to it
    assert [len(r["members"]) for r in rec["rounds"]] == [1, 2, 1] and all(r["at"] for r in rec["rounds"])
    assert "round 1: 2 node(s), world size 4" in err and "round 2: 1 node(s), world size 2" in err
    assert pids_gone(elastic_run["b_ranks"])  # B's ranks stopped with its launcher
    assert_no_process_left(elastic_run["run_a"])


def test_every_round_restarts_the_ranks_at_the_new_world_size_rank_and_restart_count(elastic_run):
    a, b = all_logs(elastic_run["run_a"]), all_logs(elastic_run["run_b"])
    resumed = re.findall(r"resume step=\d+ rank=(\d) world=(\d) restart=(\d)", a)
    # TORCHELASTIC_RESTART_COUNT
    assert {(w, c) for _, w, c in resumed} == {("2", "0"), ("4", "1"), ("2", "2")}, resumed
    grown = {int(r) for r, w, _ in resumed if w == "4"}
    joined = {int(r) for r in re.findall(r"resume step=\d+ rank=(\d) world=4", b)}
    assert grown | joined == {0, 1, 2, 3} and len(grown) == len(joined) == 2  # a node's ranks side by side
    assert "world=2" not in b


def test_the_training_keeps_its_step_across_rounds(elastic_run):
    log = all_logs(elastic_run["run_a"]) + all_logs(elastic_run["run_b"])
    resumes = sorted(int(s) for s in re.findall(r"resume step=(\d+) rank=0 ", log))
    assert resumes == [0, 3, 6], resumes  # each round from the checkpoint
    steps = sorted(int(s) for s in re.findall(r"^step=(\d+) rank=0 ", log, re.M))
    assert steps == list(range(1, STEPS + 1)), steps  # each step once: no round started over
    assert f"done step={STEPS} rank=0 world=2" in log


def test_rpc_calls_cross_the_nodes_in_the_grown_world(elastic_run):
    """A static-world RPC script restarts at the new size like any other (issue 43, item 4): at
    world 4 a rank calls the next one, and some of those calls go to the other node's ranks."""
    a, b = all_logs(elastic_run["run_a"]), all_logs(elastic_run["run_b"])
    grown = {int(r) for r in re.findall(r"^step=\d+ rank=(\d) world=4 ", a, re.M)}
    called = {int(p) for p in re.findall(r"^step=\d+ rank=\d world=4 restart=\d rpc=worker(\d)$", a, re.M)}
    assert len(grown) == 2 and called - grown, (grown, called)  # at least one call to the other node
    assert re.search(r"^step=\d+ rank=\d world=4 restart=\d rpc=worker\d$", b, re.M), b[-2000:]
    alone = set(re.findall(r"^step=\d+ rank=(\d) world=2 restart=\d rpc=worker(\d)$", a, re.M))
    assert alone == {("0", "1"), ("1", "0")}, alone  # a round of one node: the two ranks call each other


def on_node_a(elastic_run, *args: str) -> subprocess.CompletedProcess:
    """``rpcctl ARGS`` on node A's runs, as its user runs it there after the job."""
    argv = [sys.executable, "-m", "rpcctl", *args, "--runs-dir", str(elastic_run["tmp"] / "a")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=elastic_run["env"], timeout=60)


def test_runs_shows_the_round(elastic_run):
    shown = on_node_a(elastic_run, "runs")
    assert shown.returncode == 0 and "ROUND" in shown.stdout and "2 (1 node)" in shown.stdout, shown.stdout


def test_inspect_workers_shows_the_round(elastic_run):
    shown = on_node_a(elastic_run, "inspect", "workers", elastic_run["run_a"].name)
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        r"ROUND: 2 \(1 node\(s\), world size 2\), since \S+: \S+ \(pid \d+\) left the job \(cancelled\)", shown.stdout
    ), shown.stdout


def test_inspect_calls_shows_any_rounds_calls_by_its_attempt(elastic_run):
    """Calls are kept per round (issue 43, item 3): ``--restart N`` shows attempt N's, the
    latest by default. Node 0's ranks (workers 0 and 1 in every round) call each other alone,
    and worker 2 on the other node in the grown round; the other node's ranks (workers 2 and 3)
    are filed under node 0's attempt, round 1, though their own launcher's count was 0 there
    (they were filed under attempt 0, the first round's). Past its attempts: exit 2."""

    def calls(*flags: str) -> set[tuple[str, str]]:
        shown = on_node_a(elastic_run, "inspect", "calls", elastic_run["run_a"].name, "--json", *flags)
        assert shown.returncode == 0, shown.stderr
        return {(row["caller"], row["callee"]) for row in json.loads(shown.stdout)["summary"]}

    alone = {("worker0", "worker1"), ("worker1", "worker0")}
    assert calls("--restart", "0") == calls("--restart", "2") == calls() == alone
    grown = calls("--restart", "1")
    assert {c for c in grown if c[0] in ("worker0", "worker1")} == {("worker0", "worker1"), ("worker1", "worker2")}, (
        grown
    )
    assert {c for c in grown if c[0] in ("worker2", "worker3")} == {("worker2", "worker3"), ("worker3", "worker0")}, (
        grown
    )
    past = on_node_a(elastic_run, "inspect", "calls", elastic_run["run_a"].name, "--restart", "3")
    assert past.returncode == 2 and f"--restart 3: run {elastic_run['run_a'].name} has attempts 0-2" in past.stderr, (
        past.stderr
    )


def test_the_trace_marks_each_round_and_names_the_tracks_by_round(elastic_run):
    """Every attempt of an elastic job is a round (run.json's restarts stay 0): the trace says
    "round N: M node(s), world size W" with why, never "restart N" (issue 43, item 3)."""
    out = elastic_run["tmp"] / "a.trace.json"
    shown = on_node_a(elastic_run, "trace", elastic_run["run_a"].name, "-o", str(out))
    assert shown.returncode == 0, shown.stderr
    events = json.loads(out.read_text())["traceEvents"]
    marks = [(e["name"], e["args"].get("why")) for e in events if e["ph"] == "i" and e.get("s") == "g"]
    assert [name for name, _ in marks] == [
        "round 0: 1 node(s), world size 2",
        "round 1: 2 node(s), world size 4",
        "round 2: 1 node(s), world size 2",
    ], marks
    assert marks[0][1] == "start" and "left the job" in marks[2][1], marks
    tracks = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert any(", round 1)" in t for t in tracks) and not any("restart" in t for t in tracks), tracks
    assert not any(re.match(r"rank [23] .*, round [02]\)", t) for t in tracks), tracks  # the other node's: round 1 only


def test_the_report_lists_each_round_and_names_each_attempt_by_its_round(elastic_run):
    """The report's facts say how many rounds and where membership stands; its events list each
    round with why, and each rank's start by its round, not "restart N" (issue 43, item 3)."""
    out = elastic_run["tmp"] / "a.html"
    made = on_node_a(elastic_run, "report", elastic_run["run_a"].name, "-o", str(out))
    assert made.returncode == 0, made.stderr
    view = re.search(r'<script type="application/json" id="rpcctl-view">(.*?)</script>', out.read_text(), re.S)
    page = json.dumps(json.loads(view.group(1)), ensure_ascii=False)  # the page's sections, as it draws them
    assert "<dt>rounds</dt><dd>3; now round 2: 1 node(s), world size 2</dd>" in page
    assert "round 0: 1 node(s), world size 2 (start)" in page and "round 1: 2 node(s), world size 4 (" in page
    assert re.search(r"rank 0 started \(round 1, pid \d+", page) and not re.search(r"started \(restart \d", page)
    # The other node's ranks, in this node's store, by the round they ran in (their own count says 0).
    assert re.search(r"rank [23] started \(round 1, pid \d+", page) and not re.search(
        r"rank [23] started \(round 0", page
    )


def test_an_elastic_pod_whose_own_name_resolves_late_hosts_its_rendezvous(hosts, tmp_path):
    """Pod 0 of an elastic Indexed Job (PET_NNODES=1:2): its endpoint is its own Service name,
    which resolves only once the Service publishes it. It waits for the name, then hosts; before,
    it decided "not this node" at once and waited as a client for itself until join_timeout."""
    a, _ = hosts
    master = "grow-0.grow"
    write_hosts(tmp_path / "hosts", {})  # not published yet
    env = {
        "PET_NNODES": "1:2",
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": "29844",
        "JOB_COMPLETION_INDEX": "0",
        "RPCCTL_SECRET": secrets.token_hex(16),
        "RPCCTL_RUNS_DIR": str(tmp_path / "runs"),
    }
    argv = [
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        "--nproc-per-node",
        "1",
        "--no-live",
        "--rdzv-conf",
        "join_timeout=40,last_call_timeout=1",
        str(WORKERS / "dist_orders.py"),
        "pg,ar,destroy",
    ]
    log = tmp_path / "pod0"
    pod = start_pod(a, "grow-0", env, argv, tmp_path / "hosts", log)
    try:
        wait_until(lambda: "to resolve" in read(log, "err"), 60, "pod 0 waiting for its own name", tmp_path)
        write_hosts(tmp_path / "hosts", {master: a.address})
        finish(pod, timeout=60)
    finally:
        finish(pod, timeout=1)
    err = read(log, "err")
    assert pod.returncode == 0, err + read(log, "out")
    assert f"for the rendezvous endpoint '{master}' to resolve" in err and "for node 0's rendezvous" not in err, err
    assert "ok 0 pg,ar,destroy" in read(log, "out")
    rec = record(only_run(tmp_path / "runs"))
    assert [(r["nnodes"], r["world_size"]) for r in rec["rounds"]] == [(1, 1)], rec["rounds"]
    assert_no_process_left(only_run(tmp_path / "runs"))


def test_a_dry_run_of_a_torchrun_elastic_line_meets_no_one(tmp_path):
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "rpcctl",
            "launch",
            "--dry-run",
            "--json",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            str(WORKERS / "elastic_train.py"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RPCCTL_SECRET": secrets.token_hex(16)},
        timeout=60,
    )
    # node 0 of MAX
    assert shown.returncode == 0 and json.loads(shown.stdout[shown.stdout.index("{") :])["world_size"] == 4, (
        shown.stderr
    )


def test_below_min_nodes_the_job_ends_with_one_reason(tmp_path):
    env = {**os.environ, "RPCCTL_SECRET": secrets.token_hex(16)}
    config = elastic_config(tmp_path, free_port(), tmp_path / "checkpoint.json")
    config.write_text(
        config.read_text().replace("nnodes: '1:2'", "nnodes: '2:2'").replace("rdzv_timeout: 10", "rdzv_timeout: 1")
    )
    done = subprocess.run(
        [sys.executable, "-m", "rpcctl", "launch", str(config), "--no-live", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "did not gather 2 node(s) (--nnodes 2:2) within 1 s" in done.stderr and "Traceback" not in done.stderr, (
        done.stderr
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_host_waits_for_min_nodes_ends_in_one_line(tmp_path, monkeypatch, sig):
    """Cancelled while it hosts the rendezvous and waits for a second node that never comes
    (``nnodes: '2:2'``): one line, the signal's code, and nothing of the job made: no run
    directory, and no process (the preloaded fork server starts only with the job's first
    round)."""
    import psutil

    from conftest import kill_if_running, start_rpcctl

    config = elastic_config(tmp_path, free_port(), tmp_path / "checkpoint.json")
    config.write_text(
        config.read_text().replace("nnodes: '1:2'", "nnodes: '2:2'").replace("rdzv_timeout: 10", "rdzv_timeout: 60")
    )
    runs = tmp_path / "runs"
    monkeypatch.setenv("RPCCTL_SECRET", secrets.token_hex(16))  # start_rpcctl passes the test's environment on
    launcher = start_rpcctl("launch", str(config), "--no-live", "--runs-dir", str(runs))
    try:
        hosting = launcher.stderr.readline()
        assert "hosting the rendezvous at 127.0.0.1:" in hosting, hosting
        started = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
    finally:
        kill_if_running(launcher)
    assert launcher.returncode == 128 + sig, err
    assert "Traceback" not in err and f"cancelled by {sig.name} before the job started" in err, err
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
    assert started == [], "the launcher started processes before the job's first round"
