"""rpcctl under a real SLURM: ``srun ... rpcctl launch`` and ``rpcctl sbatch``, on a one-node
cluster and on a two-node cluster whose nodes are network namespaces (tests/slurm/).

The fixtures apt-get install slurm-wlm and munge when they are missing (root, Debian/Ubuntu; the
tests skip otherwise), start a private munged, slurmctld and slurmd(s) under a fresh directory in
/tmp, and stop every one of them by pid at the end of the module. Nothing here uses /etc/slurm or
the system's munged. See docs/slurm.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, assert_no_process_left, only_run, record

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

SLURM = Path(__file__).resolve().parent / "slurm"
TAG = f"rs{os.getpid() % 100000}"  # network namespaces rs<pid>a / rs<pid>b (tests/hosts.py: rt<pid>a/b)
SUBNET = "10.213.8"  # tests/hosts.py uses 10.213.7
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any SLURM_* (the tests may run inside a real job) or secret."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "RPCCTL_SECRET"}
    env.update(extra)
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run argv in its own session; on a timeout, kill that session (ours only) and fail."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        raise AssertionError(f"{' '.join(argv)} did not end within {timeout}s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    name: str
    conf: Path
    prefix: list[str] = field(default_factory=list)  # how a client runs "on" the submit host
    script_env: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        return _clean_env(SLURM_CONF=str(self.conf), **extra)

    def run(self, *argv: str, timeout: float = 30, **extra_env: str) -> subprocess.CompletedProcess:
        return _run([*self.prefix, *argv], self.env(**extra_env), timeout)

    def job(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll `scontrol show job` (sacct does not work here) until the job ends; scancel it on the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") and info["JobState"] not in ACTIVE:
                return info
            time.sleep(0.5)
        self.run("scancel", "--full", job_id)
        raise AssertionError(f"SLURM job {job_id} did not end within {timeout}s: {self.job(job_id)}")

    def log_tail(self) -> str:
        base = self.conf.parent / "log"
        return "".join(f"\n--- {p}\n" + p.read_text(errors="replace")[-3000:] for p in sorted(base.glob("*.log")))


@dataclass
class Slurm:
    state: Path
    env: dict[str, str]


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "SLURM tests need Linux"
    if os.geteuid() != 0:
        return "SLURM tests need root (they apt-get install slurm-wlm/munge and start its daemons)"
    return None


def _processes_of(state: Path) -> list[tuple[int, str]]:
    """Live processes that belong to our private SLURM: daemons (state dir on their command line),
    job steps (its logs open), job processes (SLURM_CONF in their environment)."""
    mark = str(state)
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if (
                mark in " ".join(proc.info["cmdline"] or [])
                or any(f.path.startswith(mark) for f in proc.open_files())
                or any(mark in v for v in proc.environ().values())
            ):
                found.append((proc.pid, proc.info["name"]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="module")
def slurm():
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    install = subprocess.run(["bash", str(SLURM / "install.sh")], capture_output=True, text=True, timeout=600)
    if install.returncode in (3, 4):
        pytest.skip(f"cannot install SLURM here: {install.stdout.strip()} {install.stderr.strip()}"[:2000])
    assert install.returncode == 0, install.stdout + install.stderr
    state = Path(tempfile.mkdtemp(prefix=f"rpcctl-slurm-{os.getpid()}-", dir="/tmp"))
    env = _clean_env(
        RS_STATE=str(state),
        RS_TAG=TAG,
        RS_SUBNET=SUBNET,
        RS_CTLD_PORT=str(_free_port()),
        RS_SLURMD_PORT=str(_free_port()),
    )
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    if os.environ.get("RPCCTL_SLURM_KEEP") == "1":  # keep the state dir (logs) after a failure
        env["RS_KEEP"] = "1"
    try:
        yield Slurm(state, env)
    finally:
        down = subprocess.run(["bash", str(SLURM / "down.sh")], env=env, capture_output=True, text=True, timeout=120)
        left = _processes_of(state)
        for pid, _ in left:  # a process of our own cluster: stop it so nothing is left behind
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert down.returncode == 0, down.stdout + down.stderr
        assert not left, f"processes of the test SLURM still alive after down.sh: {left}"
        assert not {f"{TAG}a", f"{TAG}b"} & set(namespaces), namespaces
        assert env.get("RS_KEEP") == "1" or not state.exists()


def _up(slurm: Slurm, script: str) -> None:
    result = subprocess.run(["bash", str(SLURM / script)], env=slurm.env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"{script} failed:\n{result.stdout}\n{result.stderr}", pytrace=False)


@pytest.fixture(scope="module")
def single(slurm) -> Cluster:
    """One node (this box, root network namespace)."""
    _up(slurm, "up-single.sh")
    return Cluster("single", slurm.state / "single" / "slurm.conf")


@pytest.fixture(scope="module")
def pair(slurm) -> Cluster:
    """Two nodes rs<pid>a and rs<pid>b (network namespaces); clients run on node a."""
    _up(slurm, "up-pair.sh")
    return Cluster(
        "pair",
        slurm.state / "pair" / "slurm.conf",
        prefix=["env", *(f"{k}={slurm.env[k]}" for k in ("RS_STATE", "RS_TAG")), str(SLURM / "onhost.sh"), "a"],
    )


def error_lines(text: str) -> str:
    """The lines of a job's output that name an error (tracebacks can be long; these are what matter)."""
    return "\n".join(line for line in text.splitlines() if re.search(r"Error|error:|root cause", line))


def runs_under(runs_dir: Path) -> list[dict]:
    """Every run record anywhere under runs_dir (one per launcher, whatever the layout)."""
    return sorted((json.loads(p.read_text()) for p in runs_dir.rglob("run.json")), key=lambda r: r["node_rank"])


def sbatch(cluster: Cluster, config: str, runs_dir: Path, *args: str) -> str:
    result = cluster.run(
        sys.executable, "-m", "rpcctl", "sbatch", config, "--runs-dir", str(runs_dir), "--time", "5", *args, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), result.stdout  # stdout: the job id alone (--parsable style)
    (script,) = runs_dir.glob("sbatch-*.sh")
    assert json.loads(script.with_suffix(".json").read_text())["slurm_job_id"] == job_id
    return job_id


# -- no cluster needed --------------------------------------------------------------------------------


def test_sbatch_dry_run_prints_the_script_and_submits_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "sbatch-was-called"
    fake = bin_dir / "sbatch"  # first on PATH: proves --dry-run never calls sbatch
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho 99\n")
    fake.chmod(0o755)
    runs = tmp_path / "runs"
    env = _clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    result = _run(
        [
            sys.executable,
            "-m",
            "rpcctl",
            "sbatch",
            "configs/parameter_server.yaml",
            "--nodes",
            "3",
            "--dry-run",
            "--runs-dir",
            str(runs),
            "--partition",
            "gpu",
            "--time",
            "0:30:00",
            "--set",
            "nproc_per_node=2",
        ],
        env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    script = result.stdout
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for directive in (
        "--nodes=3",
        "--ntasks-per-node=1",
        "--partition=gpu",
        "--time=0:30:00",
        f"--output={runs.resolve()}/slurm-%j.out",
    ):
        assert f"#SBATCH {directive}" in lines, script
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert "--ntasks-per-node=1" in srun and " -P -m rpcctl launch " in srun and "--no-live" in srun
    assert (
        str(ROOT / "configs/parameter_server.yaml") in srun
        and f"--runs-dir {runs.resolve()}" in srun
        and "--set nproc_per_node=2" in srun
    )
    # made at run time, not written into the file
    assert any(line.startswith("export RPCCTL_SECRET=") for line in lines)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not marker.exists() and not runs.exists()


# -- one node -----------------------------------------------------------------------------------------


def test_srun_launch_on_one_node_records_the_job_id(single, tmp_path):
    runs = tmp_path / "runs"
    result = single.run(
        "srun",
        "-N1",
        "-n1",
        "--time=3",
        "--job-name=rpcctl-srun-1",
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        "configs/remote_call.yaml",
        "--no-live",
        "--runs-dir",
        str(runs),
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr + single.log_tail()
    assert "[rank0]: remote_call OK" in result.stdout
    run_dir = only_run(runs)
    rec = record(run_dir)
    assert rec["status"] == "succeeded" and rec["nnodes"] == 1 and [r["rank"] for r in rec["ranks"]] == [0, 1]
    assert re.fullmatch(r"\d+", rec["slurm_job_id"] or ""), rec["slurm_job_id"]
    # srun returns when the step ends; the job may still be COMPLETING for a moment after.
    job = single.wait_job(rec["slurm_job_id"], timeout=30)
    assert job["JobName"] == "rpcctl-srun-1" and job["JobState"] == "COMPLETED", job
    assert_no_process_left(run_dir)


def test_sbatch_on_one_node_runs_the_job(single, tmp_path):
    runs = tmp_path / "runs"
    job_id = sbatch(single, "configs/remote_call.yaml", runs, "--nodes", "1")
    job = single.wait_job(job_id, timeout=150)
    output = (runs / f"slurm-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{output}{single.log_tail()}"
    assert job["NumNodes"] == "1"
    run_dir = only_run(runs)
    rec = record(run_dir)
    assert rec["status"] == "succeeded" and rec["slurm_job_id"] == job_id
    assert "[rank0]: remote_call OK" in output and f"run {run_dir.name}" in output
    assert_no_process_left(run_dir)


# -- two nodes (network namespaces) -------------------------------------------------------------------


def _check_two_node_records(records: list[dict], job_id: str | None = None) -> None:
    assert [r["node_rank"] for r in records] == [0, 1], records
    rec0, rec1 = records
    assert rec0["status"] == rec1["status"] == "succeeded", (
        rec0["status"],
        rec1["status"],
        rec0.get("root_cause"),
        rec1.get("root_cause"),
    )
    assert rec0["run_id"] == rec1["run_id"]  # one run, named by node 0
    assert [r["rank"] for r in rec0["ranks"]] == [0, 1] and [r["rank"] for r in rec1["ranks"]] == [2, 3]
    assert rec0["world_size"] == rec1["world_size"] == 4 and rec0["nnodes"] == rec1["nnodes"] == 2
    assert (rec0["host"], rec1["host"]) == (f"{TAG}a", f"{TAG}b")  # the nodes SLURM put them on
    assert rec0["slurm_job_id"] == rec1["slurm_job_id"] and rec0["slurm_job_id"]
    if job_id is not None:
        assert rec0["slurm_job_id"] == job_id
    for rec in records:
        assert_no_process_left(Path(rec["run_dir"]))


def test_srun_launch_on_two_nodes_with_a_runs_dir_per_node(pair, tmp_path):
    """No flags: nnodes, node_rank and master_addr all come from the srun step. Each node writes
    under its own runs dir."""
    runs = tmp_path / "runs"
    launch = (
        f"exec {sys.executable} -m rpcctl launch configs/parameter_server.yaml --no-live --set nproc_per_node=2"
        f" --runs-dir {runs}/node$SLURM_NODEID"
    )
    result = pair.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--time=3",
        "bash",
        "-c",
        launch,
        timeout=180,
        RPCCTL_SECRET=os.urandom(16).hex(),
    )
    assert result.returncode == 0, result.stdout + result.stderr + pair.log_tail()
    assert "[rank0]: parameter server:" in result.stdout
    assert "[rank2]: step 29 loss" in result.stdout and "[rank3]: step 29 loss" in result.stdout  # trainers on node b
    records = runs_under(runs)
    _check_two_node_records(records)
    assert {Path(r["run_dir"]).parent.name for r in records} == {"node0", "node1"}


def test_srun_launch_on_two_nodes_with_one_shared_runs_dir(pair, tmp_path):
    """As on a shared filesystem: node 0 writes <id>/, node 1 <id>.node1/."""
    runs = tmp_path / "runs"
    result = pair.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--time=3",
        sys.executable,
        "-m",
        "rpcctl",
        "launch",
        "configs/parameter_server.yaml",
        "--no-live",
        "--set",
        "nproc_per_node=2",
        "--runs-dir",
        str(runs),
        timeout=180,
        RPCCTL_SECRET=os.urandom(16).hex(),
    )
    for rec in runs_under(runs):
        assert_no_process_left(Path(rec["run_dir"]))
    assert result.returncode == 0, error_lines(result.stdout + result.stderr)
    _check_two_node_records(runs_under(runs))


def test_an_sbatch_scripts_torchrun_line_runs_with_the_word_replaced(pair, tmp_path):
    """The line of a real sbatch script, torchrun's word replaced by rpcctl launch (issue 39, item
    6): the head node from scontrol, c10d at head:29500, the node rank from the step."""
    runs = tmp_path / "runs"
    line = (
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); '
        f"exec {sys.executable} -m rpcctl launch --nnodes 2 --nproc-per-node 2 "
        '--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d '
        f'--rdzv-endpoint "$head:29500" --no-live --runs-dir {runs} tests/workers/dist_orders.py pg,ar,destroy'
    )
    result = pair.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--time=3",
        "bash",
        "-c",
        line,
        timeout=180,
        RPCCTL_SECRET=os.urandom(16).hex(),
    )
    assert result.returncode == 0, error_lines(result.stdout + result.stderr) + pair.log_tail()
    assert all(f"ok {rank} pg,ar,destroy" in result.stdout for rank in range(4)), result.stdout
    records = runs_under(runs)
    _check_two_node_records(records)
    assert records[0]["command_line"][:4] == ["rpcctl", "launch", "--nnodes", "2"]


def test_sbatch_on_two_nodes_runs_the_job(pair, tmp_path):
    runs = tmp_path / "runs"
    job_id = sbatch(pair, "configs/parameter_server.yaml", runs, "--nodes", "2", "--set", "nproc_per_node=2")
    job = pair.wait_job(job_id, timeout=180)
    output = (runs / f"slurm-{job_id}.out").read_text()
    for rec in runs_under(runs):
        assert_no_process_left(Path(rec["run_dir"]))
    assert job["NumNodes"] == "2", job
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", f"{job}\n{error_lines(output)}"
    assert "[rank2]: step 29 loss" in output and "[rank3]: step 29 loss" in output
    _check_two_node_records(runs_under(runs), job_id)


# -- elastic: MIN:MAX nodes (issue 43, item 5) ---------------------------------------------------------


def test_sbatch_dry_run_of_an_elastic_job_asks_slurm_for_min_to_max_nodes(tmp_path):
    runs = tmp_path / "runs"
    result = _run(
        [
            sys.executable,
            "-m",
            "rpcctl",
            "sbatch",
            "configs/parameter_server.yaml",
            "--nodes",
            "1:3",
            "--dry-run",
            "--runs-dir",
            str(runs),
        ],
        _clean_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    script = result.stdout
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1-3" in directives and "#SBATCH --no-kill" in directives, script
    assert not any("--ntasks" in d for d in directives), directives  # with it, SLURM gave MIN nodes where MAX were idle
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--kill-on-bad-exit=0" in srun and "--no-kill" in srun and srun.endswith("--nnodes 1:3"), srun
    assert script.rstrip().endswith('exit "${node0:-$step}"')  # node 0's verdict, else the step's
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    bad = _run(
        [sys.executable, "-m", "rpcctl", "sbatch", "configs/parameter_server.yaml", "--nodes", "3:1", "--dry-run"],
        _clean_env(),
        timeout=60,
    )
    assert bad.returncode == 2 and "--nodes '3:1' is not a node count N nor an elastic range MIN:MAX" in bad.stderr, (
        bad.stderr
    )


def _elastic_config(tmp_path: Path, steps: int, pause: float) -> tuple[Path, Path]:
    checkpoint = tmp_path / "checkpoint.json"
    config = tmp_path / "elastic.yaml"
    config.write_text(
        f"name: elastic\nscript: {ROOT / 'tests/workers/elastic_train.py'}\n"
        f"args: [{checkpoint}, '{steps}', '{pause}']\n"
        'nproc_per_node: 1\nnnodes: "1:2"\nrdzv_timeout: 60\nrdzv_last_call: 2\npreload: []\n'
    )
    return config, checkpoint


def _checkpoint(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Shrunk:
    job: dict[str, str]
    output: str
    records: list[dict]
    checkpoint: dict
    killed: int


@pytest.fixture(scope="module")
def shrunk(pair, tmp_path_factory) -> Shrunk:
    """One elastic sbatch (nnodes "1:2") on both nodes; once both train, node 1's launcher is
    killed (SIGKILL, by its pid in node 1's run record): the job goes on with node 0."""
    tmp = tmp_path_factory.mktemp("shrunk")
    runs = tmp / "runs"
    config, checkpoint = _elastic_config(tmp, steps=20, pause=0.15)
    job_id = sbatch(pair, str(config), runs)
    try:

        def both_train():
            node1 = [Path(p) for p in runs.glob("*.node1/run.json")]
            return (
                node1
                and _checkpoint(checkpoint).get("world") == 2
                and _checkpoint(checkpoint)["step"] >= 3
                and node1[0]
            )

        both_train_at = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not both_train_at and pair.job(job_id).get("JobState") in ACTIVE:
            both_train_at = both_train()
            time.sleep(0.2)
        assert both_train_at, (
            f"the two nodes never trained together: {pair.job(job_id)}\n"
            f"{(runs / f'slurm-{job_id}.out').read_text()[-3000:]}"
        )
        node1 = json.loads(both_train_at.read_text())
        launcher = psutil.Process(node1["launcher_pid"])
        # that launcher, no other
        assert "launch" in launcher.cmdline() and launcher.create_time() == pytest.approx(
            node1["launcher_started"], abs=1
        )
        launcher.kill()
        job = pair.wait_job(job_id, timeout=120)
    finally:
        pair.run("scancel", "--full", job_id)
    return Shrunk(
        job,
        (runs / f"slurm-{job_id}.out").read_text(),
        runs_under(runs),
        _checkpoint(checkpoint),
        node1["launcher_pid"],
    )


def test_an_elastic_sbatch_starts_on_both_nodes_and_goes_on_when_one_nodes_launcher_dies(shrunk):
    host = next(r for r in shrunk.records if r["node_rank"] == 0 and r["status"] != "running")
    assert shrunk.job["JobState"] == "COMPLETED" and shrunk.job["ExitCode"] == "0:0", (
        f"{shrunk.job}\n{error_lines(shrunk.output)}"
    )
    assert shrunk.job["NumNodes"] == "2"  # --nodes=1-2 with both idle: SLURM gave both
    # srun saw it; node 0's verdict is the job's
    assert "srun: error: " in shrunk.output and "task 1: Exited with exit code 137" in shrunk.output
    assert host["status"] == "succeeded" and host["host"] == f"{TAG}a", host
    rounds = host["rounds"]
    assert [(r["nnodes"], r["world_size"]) for r in rounds] == [(2, 2), (1, 1)], rounds
    assert rounds[0]["why"] == "start" and f"{TAG}b (pid {shrunk.killed}) was lost" in rounds[1]["why"], rounds
    assert host["restarts"] == 0  # a membership change, not a restart
    assert shrunk.checkpoint == {"step": 20, "world": 1}  # the survivor went on from the step saved
    for rec in shrunk.records:
        assert_no_process_left(Path(rec["run_dir"]))


def test_an_elastic_sbatch_given_fewer_than_max_nodes_starts_with_what_it_got(pair, tmp_path):
    """Node b is taken by another job: SLURM starts the 1:2 job on node a alone, at once, and
    rpcctl caps MAX at what SLURM gave (a SLURM job does not grow): no wait for a second node."""
    runs = tmp_path / "runs"
    config, checkpoint = _elastic_config(tmp_path, steps=2, pause=0.1)
    blocker = pair.run(
        "sbatch",
        "--parsable",
        "-w",
        f"{TAG}b",
        "--exclusive",
        "--time=3",
        f"--output={tmp_path}/blocker.out",
        "--wrap",
        "sleep 120",
    ).stdout.strip()
    assert re.fullmatch(r"\d+", blocker), blocker
    try:
        wait_until_running = time.monotonic() + 30
        while pair.job(blocker).get("JobState") != "RUNNING" and time.monotonic() < wait_until_running:
            time.sleep(0.2)
        job_id = sbatch(pair, str(config), runs)
        job = pair.wait_job(job_id, timeout=120)
    finally:
        pair.run("scancel", "--full", blocker)
    output = (runs / f"slurm-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["NumNodes"] == "1" and job["NodeList"] == f"{TAG}a", (
        f"{job}\n{error_lines(output)}"
    )
    assert "rpcctl: elastic job of 1 to 1 nodes: hosting the rendezvous" in output, output
    (rec,) = runs_under(runs)
    assert rec["status"] == "succeeded" and [(r["nnodes"], r["why"]) for r in rec["rounds"]] == [(1, "start")]
    assert _checkpoint(checkpoint) == {"step": 2, "world": 1}
    assert_no_process_left(Path(rec["run_dir"]))


def test_srun_launch_with_an_elastic_line_reads_its_range_within_the_step(pair, tmp_path):
    """torchrun's elastic line inside an allocation: MAX capped at the step's nodes, the endpoint
    its first host; a step outside MIN:MAX is one message, exit 2, before anything starts."""
    line = (
        f"exec {sys.executable} -m rpcctl launch --nnodes {{}} --nproc-per-node 1 --rdzv-backend c10d --dry-run --json "
        # a file each: srun mixes two tasks' lines
        f"tests/workers/elastic_train.py /tmp/x 3 > {tmp_path}/plan-$SLURM_NODEID.json"
    )
    result = pair.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--time=2",
        "bash",
        "-c",
        line.format("1:4"),
        timeout=90,
        RPCCTL_SECRET=os.urandom(16).hex(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    plans = [
        {
            row["key"]: (row["value"], row["source"])
            for row in json.loads((tmp_path / f"plan-{node}.json").read_text())["sources"]
        }
        for node in (0, 1)
    ]
    for sources in plans:
        assert sources["nnodes"] == ("1:2", "SLURM_STEP_NUM_NODES=2 (of nnodes 1:4: a SLURM job does not grow)"), (
            sources
        )
        assert sources["master_addr"] == (f"{TAG}a", f"first of SLURM_JOB_NODELIST={TAG}a,{TAG}b"), sources
        assert sources["node_rank"] == (0, "default")  # the rendezvous numbers the nodes
    refused = pair.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--time=2",
        "bash",
        "-c",
        line.format("3:4"),
        timeout=90,
        RPCCTL_SECRET=os.urandom(16).hex(),
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        "nnodes 3:4 (elastic), but this srun step has 2 node(s) ($SLURM_STEP_NUM_NODES): a SLURM job never grows"
        in refused.stderr
    ), refused.stderr
