"""Several nodes: one launcher per emulated host (network namespaces + veth), real RPC across
them, and failures and cancellations that cross nodes."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT, WORKERS, assert_no_process_left, only_run, record, rpcctl, wait_until, write_config
from hosts import create_pair, destroy_pair, unavailable
from test_dist_orders import ORDERS

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    pair = create_pair(f"rt{os.getpid() % 10000}")
    yield pair
    destroy_pair(pair)


@pytest.fixture
def secret(monkeypatch):
    value = secrets.token_hex(16)
    monkeypatch.setenv("RPCCTL_SECRET", value)
    return value


def start_node(host, node_rank, master, config, runs_dir, *extra, port=29731):
    argv = [
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        str(config),
        "--no-live",
        "--runs-dir",
        str(runs_dir),
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--master-addr",
        master.address,
        "--master-port",
        str(port),
        *extra,
    ]
    return subprocess.Popen(
        host.command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT
    )


def start_both(hosts, config, tmp_path):
    """Node 0 on the first host, node 1 on the second, each with its own runs directory."""
    a, b = hosts
    return start_node(a, 0, a, config, tmp_path / "n0"), start_node(b, 1, a, config, tmp_path / "n1")


def finish(*launchers, timeout=120):
    """Wait for every launcher; on a timeout, kill them all (their ranks die with them)."""
    try:
        return [launcher.communicate(timeout=timeout) for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.communicate()


def test_two_nodes_train_a_parameter_server_over_rpc(hosts, tmp_path, secret):
    a, b = hosts
    node0 = start_node(a, 0, a, ROOT / "configs/parameter_server.yaml", tmp_path / "n0", "-n", "2")
    node1 = start_node(b, 1, a, ROOT / "configs/parameter_server.yaml", tmp_path / "n1", "-n", "2")
    (out0, err0), (out1, err1) = finish(node0, node1)
    assert node0.returncode == 0, err0 + out0
    assert node1.returncode == 0, err1 + out1
    run0, run1 = only_run(tmp_path / "n0"), only_run(tmp_path / "n1")
    rec0, rec1 = record(run0), record(run1)
    assert rec0["run_id"] == rec1["run_id"]  # one run id, decided by node 0
    assert run0.name == rec0["run_id"] and run1.name == f"{rec0['run_id']}.node1"
    assert [r["rank"] for r in rec0["ranks"]] == [0, 1] and [r["rank"] for r in rec1["ranks"]] == [2, 3]
    assert rec0["world_size"] == rec1["world_size"] == 4
    assert rec0["host"] == a.hostname and rec1["host"] == b.hostname
    assert "[rank0]: parameter server:" in out0
    assert "[rank2]: step 29 loss" in out1 and "[rank3]: step 29 loss" in out1  # trainers on node 1
    assert_no_process_left(run0)
    # Node 0's store holds every node's ranks, with their hosts and losses.
    workers = json.loads(rpcctl("inspect", "workers", str(run0), "--json").stdout)
    assert sorted((w["rank"], w["host"]) for w in workers) == [
        (0, a.hostname),
        (1, a.hostname),
        (2, b.hostname),
        (3, b.hostname),
    ]
    assert {w["state"] for w in workers} == {"succeeded"}  # the run record's word for exit 0
    losses = json.loads(rpcctl("inspect", "losses", str(run0), "--json").stdout)
    assert {row["rank"] for row in losses} == {1, 2, 3}  # the trainers: rank 1 on node 0, ranks 2-3 on node 1


def test_process_groups_and_rpc_in_every_order_on_two_nodes(hosts, tmp_path, secret):
    # tests/test_dist_orders.py runs each order on one node; here each is a job of 2 nodes x 2
    # ranks (the new group and the RPC calls cross the nodes), all the jobs at once.
    a, _ = hosts
    jobs = []
    for i, order in enumerate(ORDERS):
        config = write_config(
            tmp_path,
            name=f"orders{i}",
            script=str(WORKERS / "dist_orders.py"),
            args=[order],
            nproc_per_node=2,
            preload=["torch"],
        )
        jobs += [
            start_node(host, node, a, config, tmp_path / f"order{i}-n{node}", port=29741 + i)
            for node, host in enumerate(hosts)
        ]
    outputs = finish(*jobs, timeout=150)
    for i, order in enumerate(ORDERS):
        (out0, err0), (out1, err1) = outputs[2 * i : 2 * i + 2]
        both = f"{order}\n--- node 0\n{err0}{out0}\n--- node 1\n{err1}{out1}"
        assert jobs[2 * i].returncode == 0 and jobs[2 * i + 1].returncode == 0, both
        assert "Address already in use" not in both
        for rank, out in ((0, out0), (1, out0), (2, out1), (3, out1)):
            assert f"[rank{rank}]: ok {rank} {order}" in out, both
        for node in (0, 1):
            run = only_run(tmp_path / f"order{i}-n{node}")
            assert record(run)["status"] == "succeeded"
            assert_no_process_left(run)


def test_nodes_sharing_one_runs_directory_do_not_collide(hosts, tmp_path, secret):
    # As on a cluster with a shared filesystem (and what `rpcctl sbatch` sets up).
    a, b = hosts
    config = write_config(tmp_path, nproc_per_node=1)
    node0 = start_node(a, 0, a, config, tmp_path / "shared")
    node1 = start_node(b, 1, a, config, tmp_path / "shared")
    (_, err0), (_, err1) = finish(node0, node1, timeout=60)
    assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
    runs = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert len(runs) == 2 and runs[1] == runs[0] + ".node1"
    assert [record(tmp_path / "shared" / r)["node_rank"] for r in runs] == [0, 1]


def test_a_crash_on_node_1_tears_down_node_0(hosts, tmp_path, secret):
    _, b = hosts
    config = write_config(tmp_path, nproc_per_node=2, args=["3=raise", "0=hang", "1=hang", "2=hang"])
    node0, node1 = start_both(hosts, config, tmp_path)
    (out0, err0), (out1, err1) = finish(node0, node1, timeout=60)
    assert node1.returncode == 1, err1
    assert node0.returncode == 1, err0
    assert "root cause: rank 3 on node 1" in err0 and "ValueError: bad value in rank 3" in err0
    rec0 = record(only_run(tmp_path / "n0"))
    assert rec0["status"] == "failed" and rec0["root_cause"]["node"] == 1 and rec0["root_cause"]["host"] == b.hostname
    assert {r["state"] for r in rec0["ranks"]} == {"killed"}
    assert_no_process_left(only_run(tmp_path / "n0"))


def test_ctrl_c_on_node_0_cancels_every_node(hosts, tmp_path, secret):
    config = write_config(tmp_path, nproc_per_node=1, args=["0=hang", "1=hang"])
    node0, node1 = start_both(hosts, config, tmp_path)
    run1 = only_run(tmp_path / "n1", timeout=60)
    wait_until(lambda: all(r["state"] == "running" for r in record(run1)["ranks"]), 60, "node 1's rank running")
    node0.send_signal(signal.SIGINT)
    (_, err0), (_, err1) = finish(node0, node1, timeout=60)
    assert node0.returncode == 130, err0
    assert node1.returncode == 130, err1
    assert record(run1)["status"] == "cancelled" and "another node" in record(run1)["reason"]
    assert_no_process_left(run1)


def test_a_failure_on_node_1_restarts_every_node_with_real_rpc(hosts, tmp_path, secret):
    # Rank 1 (node 1) fails on the first attempt; rank 0 (node 0) is in init_rpc waiting for it.
    # Both launchers tear down, meet again, and both ranks rerun with the restart count set
    # and a fresh rendezvous port, and then talk over RPC across the hosts.
    config = write_config(tmp_path, nproc_per_node=1, args=["0=rpc", "1=flaky-rpc"], max_restarts=2, rdzv_timeout=60)
    node0, node1 = start_both(hosts, config, tmp_path)
    (out0, err0), (out1, err1) = finish(node0, node1)
    assert node0.returncode == 0, err0 + out0
    assert node1.returncode == 0, err1 + out1
    assert (
        "restarting the whole group on every node (1/2)" in err0
        and "restarting the whole group on every node (1/2)" in err1
    )
    rec0, rec1 = record(only_run(tmp_path / "n0")), record(only_run(tmp_path / "n1"))
    assert rec0["status"] == rec1["status"] == "succeeded" and rec0["restarts"] == rec1["restarts"] == 1
    port = rec0["master_port"]
    assert rec1["master_port"] == port  # node 0 picked the new port for everyone
    assert f"[rank0]: rank 0 rpc result [1.0, 1.0] attempt 1 port {port}" in out0
    assert f"[rank1]: rank 1 rpc result [2.0, 2.0] attempt 1 port {port}" in out1
    log1 = (only_run(tmp_path / "n1") / "logs/rank-1.log").read_text()
    assert log1.index("attempt 0") < log1.index("--- rpcctl: restart 1 ---") < log1.index("rpc result")
    assert_no_process_left(only_run(tmp_path / "n0"))
    assert_no_process_left(only_run(tmp_path / "n1"))


def test_restarts_across_nodes_run_out_together(hosts, tmp_path, secret):
    config = write_config(tmp_path, nproc_per_node=1, args=["0=hang", "1=exit:5"], max_restarts=1, rdzv_timeout=60)
    node0, node1 = start_both(hosts, config, tmp_path)
    (out0, err0), (out1, err1) = finish(node0, node1)
    assert node0.returncode == 1 and node1.returncode == 1, err0 + err1
    rec0, rec1 = record(only_run(tmp_path / "n0")), record(only_run(tmp_path / "n1"))
    assert rec0["restarts"] == rec1["restarts"] == 1  # one restart everywhere, then the end everywhere
    assert rec0["root_cause"]["node"] == 1 and rec0["root_cause"]["exit_code"] == 5
    assert "root cause: rank 1 on node 1" in err0 and "restarts: 1 of 1" in err0
    assert_no_process_left(only_run(tmp_path / "n0"))


def test_a_node_that_does_not_come_back_ends_the_job_with_its_name(hosts, tmp_path, secret):
    _, b = hosts
    config = write_config(tmp_path, nproc_per_node=1, args=["0=hang", "1=hang"], max_restarts=2, rdzv_timeout=6)
    node0, node1 = start_both(hosts, config, tmp_path)
    run1 = only_run(tmp_path / "n1", timeout=60)
    wait_until(lambda: all(r["state"] == "running" for r in record(run1)["ranks"]), 60, "node 1's rank running")
    os.killpg(node1.pid, signal.SIGKILL)  # node 1's launcher vanishes; its rank dies with it
    (_, err0), _ = finish(node0, node1)
    assert node0.returncode == 1, err0
    assert f"the launcher of node 1 ({b.hostname}) stopped answering" in err0  # the failure that started the restart
    assert f"root cause: node 1 ({b.hostname}) did not come back for restart 1 within rdzv_timeout (6s)" in err0
    rec0 = record(only_run(tmp_path / "n0"))
    assert rec0["status"] == "failed" and rec0["restarts"] == 0
    assert rec0["root_cause"]["node"] == 1 and rec0["root_cause"]["host"] == b.hostname
    assert_no_process_left(only_run(tmp_path / "n0"))
    assert_no_process_left(run1)


def test_a_node_that_never_arrives_is_named(tmp_path, secret):
    config = write_config(tmp_path, nproc_per_node=1, rdzv_timeout=2)
    started = time.monotonic()
    result = rpcctl(
        "launch",
        str(config),
        "--no-live",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--nnodes",
        "3",
        "--node-rank",
        "0",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29733",
    )
    assert result.returncode != 0
    assert "node(s) 1, 2 of 3 never arrived" in result.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "runs").exists()  # nothing was started, no run directory


def test_multi_node_without_a_secret_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("RPCCTL_SECRET", raising=False)
    config = write_config(tmp_path, nproc_per_node=1)
    result = rpcctl(
        "launch",
        str(config),
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert result.returncode == 2 and "RPCCTL_SECRET" in result.stderr


STUCK_ACROSS_NODES = """
import os, time
import torch.distributed.rpc as rpc


def stuck():
    time.sleep(600)  # the callee never answers: the job hangs across the nodes


rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
if rank == 0:
    rpc.rpc_sync("worker1", stuck)
rpc.shutdown()
"""


def test_a_hang_across_nodes_is_diagnosed_on_node_0_and_ends_every_node(hosts, tmp_path, secret):
    """Node 0's store has every node's calls: its watchdog follows rank 0's call to worker1 on
    the other host, names what worker1 runs there and where to get its stack, dumps node 0's
    own ranks only, and the hang tears both nodes down."""
    _, b = hosts
    (tmp_path / "stuck.py").write_text(STUCK_ACROSS_NODES)
    config = write_config(
        tmp_path, script=str(tmp_path / "stuck.py"), nproc_per_node=1, hang_timeout=6, preload=["torch"]
    )
    node0, node1 = start_both(hosts, config, tmp_path)
    (_, err0), (_, err1) = finish(node0, node1, timeout=150)
    assert node0.returncode == 1, err0
    assert node1.returncode != 0, err1
    hang = next(line for line in err0.splitlines() if line.startswith("root cause: hang:"))
    assert "rank 0 (worker0, pid " in hang and "has waited" in hang and "on rpc_sync → worker1 (stuck, " in hang, hang
    assert "worker1 is running stuck for worker0" in hang and f"its stack: `rpcctl stack` on {b.hostname}" in hang, hang
    run0 = only_run(tmp_path / "n0")
    rec0 = record(run0)
    assert rec0["status"] == "failed" and rec0["root_cause"]["reason"] == "hang", rec0["root_cause"]
    dumped = (run0 / "hang" / "stacks.txt").read_text()
    assert "── rank 0 (pid " in dumped and "in <module>" in dumped  # node 0's rank, dumped
    assert f"on {b.hostname}) ──\n(not dumped from this node; its stack: `rpcctl stack` on {b.hostname})" in dumped, (
        dumped
    )
    assert_no_process_left(run0)
    assert_no_process_left(only_run(tmp_path / "n1"))


RELAYED_ONLY = """
import os, time
import torch.distributed.rpc as rpc

rank = int(os.environ["RANK"])


def echo(x):
    return x


rpc.init_rpc(f"worker{rank}", rank=rank, world_size=4)
if rank == 2:  # node 1's ranks work; node 0's hear of it only through node 1's relay
    print("calling", flush=True)
    calls, started = 0, time.time()
    while time.time() - started < 14:
        rpc.rpc_sync("worker3", echo, args=(calls,))
        calls += 1
    print("calls", calls, flush=True)
rpc.shutdown()
"""


def test_a_node_whose_relay_stops_is_telemetry_impaired_not_a_hang(hosts, tmp_path, secret):
    """Node 1's launcher (its telemetry relay) is stopped for 8 s while its ranks work: node 0's
    store hears nothing of them, but every process of that node falling silent at once is the
    relay's silence, not the job's. No hang is declared (the old watchdog stopped the job after
    4 s), it is said once, and the job ends well on both nodes."""
    (tmp_path / "relayed.py").write_text(RELAYED_ONLY)
    config = write_config(
        tmp_path, script=str(tmp_path / "relayed.py"), nproc_per_node=2, hang_timeout=4, preload=["torch"]
    )
    node0, node1 = start_both(hosts, config, tmp_path)
    try:
        run1 = only_run(tmp_path / "n1", timeout=60)
        log = run1 / "logs" / "rank-2.log"
        wait_until(lambda: log.exists() and "calling" in log.read_text(), 90, "rank 2 calling", run1 / "logs")
        os.kill(node1.pid, signal.SIGSTOP)
        time.sleep(8)
    finally:
        os.kill(node1.pid, signal.SIGCONT)
    (_, err0), (out1, err1) = finish(node0, node1, timeout=120)
    assert node0.returncode == 0, err0
    assert node1.returncode == 0, err1
    impaired = [line for line in err0.splitlines() if "declares no hang while telemetry is impaired" in line]
    assert len(impaired) == 1 and f"telemetry from {hosts[1].hostname} has stopped" in impaired[0], err0
    assert "the hang watchdog watches again" in err0
    assert "[rank2]: calls " in out1
    assert_no_process_left(only_run(tmp_path / "n0"))
    assert_no_process_left(run1)


# --- pods: no flags, the environment a Kubernetes pod has -------------------------------------


def write_hosts(path, names: dict[str, str]) -> None:
    """A pod's view of DNS: rewritten in place (the bind mount over /etc/hosts keeps the inode)."""
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in names.items()))


def start_pod(host, pod, env, argv, hosts_file, log):
    """``argv`` on ``host`` as pod ``pod``: its hostname, its /etc/hosts, exactly ``env`` on top of
    a clean environment (nothing of SLURM or of another pod), stdout and stderr to files."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM_", "JOB_COMPLETION_INDEX", "RPCCTL_"))
    }
    out, err = open(f"{log}.out", "w"), open(f"{log}.err", "w")
    with out, err:
        return subprocess.Popen(
            host.command(argv, hostname=pod, hosts_file=hosts_file),
            env={**base, **env},
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
            cwd=ROOT,
        )


def read(log, stream):
    return open(f"{log}.{stream}").read()


def test_trainjob_pods_need_no_flags_and_wait_for_dns_and_node_0(hosts, tmp_path):
    """Two pods of a Kubeflow TrainJob named rpc-train, with exactly the torch plugin's variables
    and the run's secret, start before the master's name resolves anywhere: both wait for it;
    pod 1 then waits for pod 0 to listen, saying so; and both train to the end."""
    a, b = hosts
    master = "rpc-train-node-0-0.rpc-train"  # the Trainer's PET_MASTER_ADDR for TrainJob rpc-train
    secret = secrets.token_hex(16)

    def pod_env(index):
        return {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(index),
            "JOB_COMPLETION_INDEX": str(index),
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29500",
            "RPCCTL_SECRET": secret,
            "RPCCTL_RUNS_DIR": str(tmp_path / f"runs{index}"),
        }

    argv = [sys.executable, "-m", "rpcctl", "launch", str(ROOT / "configs/parameter_server.yaml")]
    logs = [tmp_path / "pod0", tmp_path / "pod1"]
    for i in (0, 1):
        write_hosts(tmp_path / f"hosts{i}", {})  # the Service has not published pod 0 yet
    pods = [
        start_pod(host, f"rpc-train-node-0-{i}", pod_env(i), argv, tmp_path / f"hosts{i}", logs[i])
        for i, host in enumerate((a, b))
    ]
    try:
        for log in logs:
            wait_until(
                lambda log=log: "to resolve" in read(log, "err"), 60, f"{log.name} waiting for the master's name"
            )
        write_hosts(tmp_path / "hosts1", {master: a.address})
        wait_until(lambda: "rendezvous at" in read(logs[1], "err"), 30, "pod 1 waiting for node 0 to listen")
        write_hosts(tmp_path / "hosts0", {master: a.address})
        finish(*pods)
    finally:
        finish(*pods, timeout=1)
    log0, log1 = logs
    assert f"for master_addr '{master}' to resolve" in read(log0, "err")
    err1 = read(log1, "err")
    assert pods[0].returncode == 0, read(log0, "err") + read(log0, "out")
    assert pods[1].returncode == 0, err1 + read(log1, "out")
    assert f"for master_addr '{master}' to resolve" in err1
    assert f"for node 0's rendezvous at {master} ({a.address}):29500: Connection refused" in err1
    out1 = read(log1, "out")
    # the server on pod 0, its trainer on pod 1
    assert "[rank1]: step 29 loss" in out1 and "[rank0]: parameter server:" in read(log0, "out")
    rec0, rec1 = record(only_run(tmp_path / "runs0")), record(only_run(tmp_path / "runs1"))
    assert rec0["run_id"] == rec1["run_id"] and rec0["world_size"] == 2  # PET_NPROC_PER_NODE=1, not the config's 3
    assert (rec0["host"], rec1["host"]) == ("rpc-train-node-0-0", "rpc-train-node-0-1")
    assert_no_process_left(only_run(tmp_path / "runs0"))


def test_a_trainjob_containers_torchrun_line_runs_with_the_word_replaced(hosts, tmp_path):
    """A TrainJob container's command, torchrun's word replaced by rpcctl launch (issue 39, item 6),
    with the torch plugin's PET_* variables: the node values come from them, as for a config."""
    master, secret = "line-node-0-0.line", secrets.token_hex(16)
    write_hosts(tmp_path / "hosts", {master: hosts[0].address})
    argv = [
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        "--nproc-per-node",
        "1",
        "--no-live",
        "tests/workers/dist_orders.py",
        "pg,ar,destroy",
    ]
    pods = []
    for i, host in enumerate(hosts):
        env = {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(i),
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29533",
            "RPCCTL_SECRET": secret,
            "RPCCTL_RUNS_DIR": str(tmp_path / f"runs{i}"),
        }
        pods.append(start_pod(host, f"line-node-0-{i}", env, argv, tmp_path / "hosts", tmp_path / f"pod{i}"))
    finish(*pods, timeout=90)
    for i, pod in enumerate(pods):
        assert pod.returncode == 0, read(tmp_path / f"pod{i}", "err")
        assert f"ok {i} pg,ar,destroy" in read(tmp_path / f"pod{i}", "out")
    rec0, rec1 = (record(only_run(tmp_path / f"runs{i}")) for i in (0, 1))
    assert rec0["run_id"] == rec1["run_id"] and rec0["world_size"] == 2 and rec1["node_rank"] == 1
    assert rec0["command_line"] == ["rpcctl", "launch", *argv[4:]]
    assert_no_process_left(only_run(tmp_path / "runs0"))


def test_indexed_job_pods_from_rpcctl_k8s_fail_together(hosts, tmp_path):
    """The pods of the Indexed Job that `rpcctl k8s` writes, run with that Job's command and
    environment (the Secret's value, the ConfigMap's config, and the JOB_COMPLETION_INDEX the
    Job controller adds): a rank that fails in pod 1 tears pod 0 down, as on bare metal."""
    a, b = hosts
    config = write_config(tmp_path, name="crash", nproc_per_node=2, args=["3=raise", "0=hang", "1=hang", "2=hang"])
    written = rpcctl(
        "k8s",
        str(config),
        "--nodes",
        "2",
        "--image",
        "train:1.0",
        "--name",
        "rpc-crash",
        "--script-in-image",
        str(WORKERS / "behave.py"),
        "--dry-run",
    )
    assert written.returncode == 0, written.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(written.stdout)}
    container = docs["Job"]["spec"]["template"]["spec"]["containers"][0]
    (tmp_path / "job.yaml").write_text(docs["ConfigMap"]["data"]["job.yaml"])  # the ConfigMap, as mounted

    def pod_env(index):
        env = {}
        for var in container["env"]:
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                assert ref["name"] == docs["Secret"]["metadata"]["name"]
                env[var["name"]] = docs["Secret"]["stringData"][ref["key"]]
        assert env.pop("RPCCTL_RUNS_DIR") == "/runs"
        return {**env, "RPCCTL_RUNS_DIR": str(tmp_path / f"runs{index}"), "JOB_COMPLETION_INDEX": str(index)}

    mounted = {"rpcctl": [sys.executable, "-m", "rpcctl"], "/etc/rpcctl/job.yaml": [str(tmp_path / "job.yaml")]}
    argv = [part for arg in container["command"] for part in mounted.get(arg, [arg])]
    master = pod_env(0)["PET_MASTER_ADDR"]
    assert master == "rpc-crash-0.rpc-crash"  # pod 0 through the headless Service
    write_hosts(tmp_path / "hosts", {master: a.address})
    pods = [
        start_pod(host, f"rpc-crash-{i}", pod_env(i), argv, tmp_path / "hosts", tmp_path / f"pod{i}")
        for i, host in enumerate((a, b))
    ]
    finish(*pods, timeout=90)
    err0 = read(tmp_path / "pod0", "err")
    assert pods[1].returncode == 1, read(tmp_path / "pod1", "err")
    assert pods[0].returncode == 1, err0
    assert "root cause: rank 3 on node 1 (rpc-crash-1)" in err0 and "ValueError: bad value in rank 3" in err0
    rec0 = record(only_run(tmp_path / "runs0"))
    assert rec0["status"] == "failed" and {r["state"] for r in rec0["ranks"]} == {"killed"}
    assert_no_process_left(only_run(tmp_path / "runs0"))
    assert_no_process_left(only_run(tmp_path / "runs1"))
