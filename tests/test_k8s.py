"""``rpcctl k8s`` and a pod's environment: the manifests, validated offline against the
Kubernetes API schemas (kubernetes-validate) and the Kubeflow Trainer's TrainJob CRD schema
(vendored in tests/data/k8s/, with its source commit); names refused before anything is
written; values kept in their fields; kubectl at the system's edge; and the launcher's wait for
a master that does not resolve or listen yet. The pods themselves run in tests/test_multinode.py."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT, assert_no_process_left, only_run, record, rpcctl, write_config
from rpcctl.cli import app
from rpcctl.supervise.cluster import RendezvousError, wait_for_master
from rpcctl.config import JobSpec

K8S_VERSION = "1.33.0"  # a version every maintained cluster has passed; strict: no unknown field
TRAINJOB_SCHEMA = json.loads((Path(__file__).parent / "data/k8s/trainjob.v1alpha1.schema.json").read_text())[
    "openAPIV3Schema"
]
PS = str(ROOT / "configs/parameter_server.yaml")


def invoke(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's runner): as fast as a test of many cases needs."""
    result = CliRunner().invoke(app, list(args), env=env)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def k8s(*args: str, **kwargs):
    """`rpcctl k8s` as a real process: what kubectl and the file system see."""
    return rpcctl("k8s", *args, **kwargs)


def documents(text: str) -> list[dict]:
    return list(yaml.safe_load_all(text))


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs}


def validate_kubernetes(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def validate_trainjob(doc: dict) -> None:
    jsonschema.Draft202012Validator(TRAINJOB_SCHEMA).validate(doc)
    for rule in TRAINJOB_SCHEMA["x-kubernetes-validations"]:  # the CRD's CEL rules on the name, by hand
        name = doc["metadata"]["name"]
        match = re.fullmatch(r"self\.metadata\.name\.matches\('(.*)'\)", rule["rule"])
        if match:
            assert re.fullmatch(match.group(1), name), rule["message"]
        else:
            assert rule["rule"] == "size(self.metadata.name) <= 63" and len(name) <= 63, rule["message"]


def container(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def test_an_indexed_job_is_valid_kubernetes_and_wires_its_pods(tmp_path):
    out = tmp_path / "job.k8s.yaml"
    result = k8s(
        PS,
        "--nodes",
        "3",
        "--image",
        "registry.example.com:5000/team/train:1.0",
        "--gpus-per-node",
        "2",
        "--memory-per-node",
        "16Gi",
        "--namespace",
        "ml-team",
        "--runs-claim",
        "rpc-runs",
        "--set",
        "max_restarts=2",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert f"to {out}; apply it with `kubectl apply -f {out}`" in result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds the run's secret
    docs = documents(out.read_text())
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "Service", "Job"]
    for doc in docs:
        validate_kubernetes(doc)
        assert doc["metadata"]["namespace"] == "ml-team"
    secret, config, service, job = docs
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"  # rpcctl does the 2 restarts itself
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == service["metadata"]["name"] == "parameter-server"
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    env = {e["name"]: e for e in container(job)["env"]}
    assert env["PET_NNODES"]["value"] == "3" and env["PET_MASTER_PORT"]["value"] == "29500"
    assert env["PET_MASTER_ADDR"]["value"] == "parameter-server-0.parameter-server"  # pod 0, through the Service
    ref = env["RPCCTL_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and len(secret["stringData"][ref["key"]]) == 32
    assert container(job)["resources"]["limits"] == {"nvidia.com/gpu": 2, "memory": "16Gi"}
    assert container(job)["resources"]["requests"] == {"cpu": "3", "memory": "16Gi"}  # nproc_per_node CPUs
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (
        volumes["runs"]["persistentVolumeClaim"] == {"claimName": "rpc-runs"}
        and volumes["config"]["configMap"]["name"] == config["metadata"]["name"]
    )
    assert {m["name"] for m in container(job)["volumeMounts"]} == set(volumes)
    # The config the pods run: the job's, with the script beside it in the ConfigMap and a GPU per rank.
    shipped = yaml.safe_load(config["data"]["job.yaml"])
    assert (
        shipped["script"] == "/etc/rpcctl/parameter_server.py"
        and "DistributedOptimizer" in config["data"]["parameter_server.py"]
    )
    # no flag: the environment says the rest
    assert container(job)["command"] == ["rpcctl", "launch", "/etc/rpcctl/job.yaml"]
    spec = JobSpec.model_validate(shipped)
    assert spec.devices == "auto" and spec.max_restarts == 2 and spec.nproc_per_node == 3


def test_a_trainjob_matches_the_trainer_crd(tmp_path):
    result = invoke(
        "k8s",
        PS,
        "--nodes",
        "2",
        "--image",
        "train:1.0",
        "--kind",
        "trainjob",
        "--set",
        "nproc_per_node=2",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    docs = documents(result.stdout)
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "TrainJob"]
    for doc in docs[:2]:
        validate_kubernetes(doc)
    trainjob = docs[2]
    validate_trainjob(trainjob)
    trainer = trainjob["spec"]["trainer"]
    assert (
        trainer["numNodes"] == 2
        and trainer["numProcPerNode"] == 2
        and trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    )
    # reserved by the torch plugin
    assert not {e["name"] for e in trainer["env"]} & {
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    }
    pod = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["name"] == "node"  # the torch runtime's trainer job, whose container is 'node'
    spec = pod["template"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["name"] == "node"
    assert {m["name"] for m in spec["containers"][0]["volumeMounts"]} == {v["name"] for v in spec["volumes"]}


def test_the_validators_refuse_what_kubernetes_would(tmp_path):
    # The checks above can fail: a wrong type, an unknown field, a bad TrainJob name are caught.
    docs = documents(invoke("k8s", PS, "--nodes", "2", "--image", "train:1.0", "--dry-run").stdout)
    job = docs[3]
    job["spec"]["backoffLimit"] = "zero"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes(job)
    job["spec"]["backoffLimit"] = 0
    container(job)["imagePullPolicee"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes(job)
    trainjob = documents(
        invoke("k8s", PS, "--nodes", "2", "--image", "train:1.0", "--kind", "trainjob", "--dry-run").stdout
    )[2]
    trainjob["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate_trainjob(trainjob)
    trainjob["spec"]["trainer"]["numNodes"] = 2
    trainjob["metadata"]["name"] = "9-starts-with-a-digit"
    with pytest.raises(AssertionError, match="RFC 1035"):
        validate_trainjob(trainjob)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--name", "Train_Job"], "--name: 'Train_Job' is not a valid Kubernetes name: it must be an RFC 1035 label"),
        (["--name", "9lives"], "--name: '9lives' is not a valid Kubernetes name"),
        # pod <name>-<i>
        (["--name", "a" * 62], "--name: '" + "a" * 62 + "' is 62 characters; Kubernetes allows 61 here"),
        # pod <name>-node-0-<i>
        (["--name", "a" * 55, "--kind", "trainjob"], "is 55 characters; Kubernetes allows 54 here"),
        (["--namespace", "ML"], "--namespace: 'ML' is not a valid Kubernetes name"),
        (["--runs-claim", "runs\nkind: Pod"], "--runs-claim: 'runs\\nkind: Pod' is not a valid Kubernetes name"),
        (["--image", "train:1.0\n  command: [sh]"], "--image: 'train:1.0\\n  command: [sh]' is not an image reference"),
        (["--memory-per-node", "16 GB"], "--memory-per-node: '16 GB' is not a Kubernetes quantity"),
        (["--script-in-image", "train.py"], "--script-in-image: 'train.py' is not an absolute path in the image"),
        (
            ["--script-in-image", "/app/train.py\nkind: Pod"],
            "--script-in-image: '/app/train.py\\nkind: Pod' holds U+000A",
        ),
        (["--script-in-image", "/app/train\t.py"], "--script-in-image: '/app/train\\t.py' holds U+0009"),
        (["--script-in-image", "/app/\x1b]0;x\x07train.py"], "holds U+001B"),
        (["--script-in-image", "/app/\u202eyp.niart"], "holds U+202E (RIGHT-TO-LEFT OVERRIDE)"),
        (["--script-in-image", "/app/"], "--script-in-image: '/app/' is not an absolute path in the image (of a file"),
        (["--script-in-image", "/app/" + "x" * 256], "is longer than Linux allows (255 bytes a name, 4095 in all)"),
        (["--set", "name=My.Job"], "the job's name (key 'name' of"),  # the config's own name, when no --name is given
        (
            ["--gpus-per-node", "2", "--set", "devices=cpu"],
            "--gpus-per-node 2, but the config's devices is 'cpu': drop one of them",
        ),
    ],
)
def test_bad_names_are_refused_before_anything_is_written(tmp_path, args, says):
    out = tmp_path / "out.yaml"
    args = ["--image", "train:1.0", *args] if "--image" not in args else args
    result = invoke("k8s", PS, "--nodes", "2", *args, "-o", str(out))
    assert result.returncode == 2, result.stderr
    assert says in " ".join(result.stderr.split()) or says in result.stderr, result.stderr
    assert not out.exists()


def test_values_stay_in_their_fields(tmp_path):
    # What a config holds goes into the ConfigMap's job.yaml as data, whatever it looks like.
    hostile = "x\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: evil}\n$(RPCCTL_SECRET)"
    config = write_config(tmp_path, name="tricky", nproc_per_node=2, env={"NOTE": hostile}, args=[hostile])
    result = invoke("k8s", str(config), "--nodes", "2", "--image", "train:1.0", "--dry-run")
    assert result.returncode == 0, result.stderr
    docs = documents(result.stdout)
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "Service", "Job"]
    shipped = yaml.safe_load(docs[1]["data"]["job.yaml"])
    assert shipped["env"] == {"NOTE": hostile} and shipped["args"] == [hostile]
    assert hostile not in json.dumps(docs[3])  # nothing of it reaches the pod's command or env


def fake_kubectl(tmp_path: Path, code: int) -> dict:
    """A kubectl at the system's edge: it keeps its arguments and stdin, answers like kubectl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "kubectl"
    tool.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/kubectl.args\n'
        f"cat > {tmp_path}/kubectl.stdin\n"
        f'[ {code} = 0 ] && echo "job.batch/parameter-server created"'
        ' || echo "error: the server has asked for the client to provide credentials" >&2\n'
        f"exit {code}\n"
    )
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_kubectl_applies_the_manifests(tmp_path):
    result = k8s(PS, "--nodes", "2", "--image", "train:1.0", env=fake_kubectl(tmp_path, 0))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kubectl.args").read_text().split() == ["apply", "-f", "-"]
    assert [d["kind"] for d in documents((tmp_path / "kubectl.stdin").read_text())] == [
        "Secret",
        "ConfigMap",
        "Service",
        "Job",
    ]
    assert (
        "job.batch/parameter-server created" in result.stderr
        and "kubectl logs -f job/parameter-server" in result.stderr
    )


def test_a_kubectl_failure_is_the_commands_failure(tmp_path):
    result = k8s(PS, "--nodes", "2", "--image", "train:1.0", env=fake_kubectl(tmp_path, 1))
    assert result.returncode == 1
    assert (
        "`kubectl apply` failed (exit code 1): error: the server has asked for the client to provide credentials"
        in " ".join(result.stderr.split())
    )


def test_without_kubectl_it_says_how_to_write_the_manifests(tmp_path):
    result = invoke("k8s", PS, "--nodes", "2", "--image", "train:1.0", env={"PATH": str(tmp_path)})
    assert result.returncode == 2 and "kubectl is not on PATH: write the manifests with -o FILE" in " ".join(
        result.stderr.split()
    )


# --- a pod's environment -----------------------------------------------------------------------


def dry_run(tmp_path, config, env, *args):
    """`launch --dry-run --json` in a pod's environment (conftest clears the test's own PET_*)."""
    return invoke("launch", str(config), "--dry-run", "--json", *args, env={"CUDA_VISIBLE_DEVICES": "", **env})


def sources(result) -> dict:
    assert result.returncode == 0, result.stderr
    return {row["key"]: (row["value"], row["source"]) for row in json.loads(result.stdout)["sources"]}


POD = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NODE_RANK": "1",
    "JOB_COMPLETION_INDEX": "1",
    "PET_MASTER_ADDR": "127.0.0.1",
    "PET_MASTER_PORT": "29555",
}


def test_a_trainjob_pods_environment_sets_the_node(tmp_path):
    config = write_config(tmp_path, nproc_per_node=3)
    found = sources(dry_run(tmp_path, config, POD))
    assert found == {
        "nnodes": (2, "PET_NNODES=2"),
        "node_rank": (1, "PET_NODE_RANK=1"),
        "master_addr": ("127.0.0.1", "PET_MASTER_ADDR=127.0.0.1"),
        "master_port": (29555, "PET_MASTER_PORT=29555"),
        "nproc_per_node": (2, "PET_NPROC_PER_NODE=2"),
    }
    plan = json.loads(dry_run(tmp_path, config, POD).stdout)
    assert [r["rank"] for r in plan["ranks"]] == [2, 3] and plan["world_size"] == 4


def test_nproc_per_node_auto_is_one_rank_per_visible_gpu(tmp_path):
    # The Trainer sets PET_NPROC_PER_NODE=auto when a TrainJob asks for GPUs and no numProcPerNode.
    config = write_config(tmp_path, nproc_per_node=3)
    env = {**POD, "PET_NPROC_PER_NODE": "auto"}
    assert sources(dry_run(tmp_path, config, {**env, "CUDA_VISIBLE_DEVICES": "0,1"}))["nproc_per_node"] == (
        2,
        "PET_NPROC_PER_NODE=auto (2 GPUs visible)",
    )
    # no GPU: the config's
    assert sources(dry_run(tmp_path, config, env))["nproc_per_node"] == (
        3,
        f"{config}:{config.read_text().splitlines().index('nproc_per_node: 3') + 1}",
    )


def test_flags_beat_the_environment_which_beats_the_config(tmp_path):
    config = write_config(tmp_path, nproc_per_node=3, master_port=29001, rdzv_timeout=5)
    found = sources(dry_run(tmp_path, config, {**POD, "PET_MASTER_PORT": ""}, "--node-rank", "0", "-n", "1"))
    assert found["node_rank"] == (0, "--node-rank 0") and found["nproc_per_node"] == (1, "-n 1")
    line = config.read_text().splitlines().index("master_port: 29001") + 1
    assert found["nnodes"] == (2, "PET_NNODES=2") and found["master_port"] == (29001, f"{config}:{line}")


def test_an_indexed_jobs_index_is_the_node_rank_of_a_multi_node_job_only(tmp_path):
    one = write_config(tmp_path, name="one", nproc_per_node=1)
    # independent single-node pods
    assert sources(dry_run(tmp_path, one, {"JOB_COMPLETION_INDEX": "3"}))["node_rank"] == (0, "default")
    two = write_config(tmp_path, name="two", nproc_per_node=1, nnodes=2, master_addr="127.0.0.1")
    result = dry_run(tmp_path, two, {"JOB_COMPLETION_INDEX": "1"}, "--set", "rdzv_timeout=5")
    assert sources(result)["node_rank"] == (1, "JOB_COMPLETION_INDEX=1")
    assert sources(result)["master_port"] == (29500, "default (several nodes)")  # what node 0 will listen on
    result = rpcctl("launch", str(two), "--dry-run", env={**os.environ, "JOB_COMPLETION_INDEX": "1", "COLUMNS": "200"})
    assert re.search(r"node_rank\s+1\s+JOB_COMPLETION_INDEX=1", result.stdout), result.stdout  # the table says it too


@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"PET_NNODES": "4:1"},
            "$PET_NNODES '4:1' is not a node count N nor an elastic range MIN:MAX (whole numbers, 1 <= MIN <= MAX",
        ),
        ({"PET_NNODES": "0:2"}, "$PET_NNODES '0:2' is not a node count N nor an elastic range MIN:MAX"),
        (
            {"PET_NNODES": "1:2", "JOB_COMPLETION_INDEX": "x"},
            "$JOB_COMPLETION_INDEX='x' is not a whole number of at least 0",
        ),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "-1"}, "$PET_NODE_RANK='-1' is not a whole number of at least 0"),
        (
            {"PET_NNODES": "2", "PET_NODE_RANK": "2"},
            "PET_NODE_RANK=2: key 'node_rank': node_rank 2 is out of range for nnodes 2",
        ),
        ({"PET_MASTER_PORT": "70000"}, "$PET_MASTER_PORT='70000' is not a port (1-65535)"),
    ],
)
def test_a_bad_pod_environment_is_refused_before_anything_starts(tmp_path, env, says):
    result = dry_run(tmp_path, write_config(tmp_path, nproc_per_node=1), env)
    assert result.returncode == 2 and says in result.stderr, result.stderr


# --- waiting for the master ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_node_waits_for_node_0_to_listen_and_says_so():
    port, heard = free_port(), []
    listener = socket.socket()

    def listen_later():
        time.sleep(1.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        started = time.monotonic()
        assert wait_for_master("localhost", port, node_rank=1, timeout=30, say=heard.append) == "127.0.0.1"
        assert 1.4 < time.monotonic() - started < 10
    finally:
        thread.join()
        listener.close()
    assert heard == [
        f"rpcctl: waiting up to rdzv_timeout (30s) for node 0's rendezvous at localhost (127.0.0.1):{port}:"
        " Connection refused"
    ]


def test_a_master_that_never_resolves_ends_the_wait_at_rdzv_timeout():
    heard = []
    started = time.monotonic()
    with pytest.raises(
        RendezvousError,
        match=(
            r"node 1 gave up waiting for master_addr 'rpc-train-0\.rpc-train\.invalid' to resolve .*"
            r" after rdzv_timeout \(2s\)"
        ),
    ):
        wait_for_master("rpc-train-0.rpc-train.invalid", 29500, node_rank=1, timeout=2, say=heard.append)
    assert time.monotonic() - started < 10
    assert heard and heard[0].startswith(
        "rpcctl: waiting up to rdzv_timeout (2s) for master_addr 'rpc-train-0.rpc-train.invalid' to resolve"
    )


def test_node_0_waits_until_master_addr_is_its_own():
    # A name that resolves to an address this node does not hold (a stale DNS record of a pod
    # that is gone) is waited for, not bound to.
    with pytest.raises(
        RendezvousError, match=r"master_addr '192\.0\.2\.1' \(192\.0\.2\.1\) to be an address of this node"
    ):
        wait_for_master("192.0.2.1", 29500, node_rank=0, timeout=1)
    assert wait_for_master("127.0.0.1", 29500, node_rank=0, timeout=1) == "127.0.0.1"


# --- elastic: MIN:MAX pods (issue 43, item 5) -----------------------------------------------------


def test_an_elastic_indexed_job_runs_on_fewer_pods_than_max(tmp_path):
    """--nodes 1:3: MAX completions, PET_NNODES=1:3, and the Job's completion policy lets it end
    well with fewer pods; valid for the API server, every field checked."""
    result = invoke("k8s", PS, "--nodes", "1:3", "--image", "train:1.0", "--dry-run")
    assert result.returncode == 0, result.stderr
    docs = documents(result.stdout)
    for doc in docs:
        validate_kubernetes(doc)
    job = by_kind(docs)["Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    # pod 0 hosts the rendezvous and holds the record
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    # 1 of 3 may go on
    assert spec["backoffLimitPerIndex"] == 0 and spec["maxFailedIndexes"] == 2 and "backoffLimit" not in spec
    assert spec["podFailurePolicy"] == {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    env = {e["name"]: e.get("value") for e in container(job)["env"]}
    assert env["PET_NNODES"] == "1:3" and env["PET_MASTER_ADDR"] == "parameter-server-0.parameter-server"
    static = by_kind(documents(invoke("k8s", PS, "--nodes", "3", "--image", "train:1.0", "--dry-run").stdout))["Job"][
        "spec"
    ]
    assert static["backoffLimit"] == 0 and not {"successPolicy", "backoffLimitPerIndex", "podFailurePolicy"} & set(
        static
    )
    bad = invoke("k8s", PS, "--nodes", "3:1", "--image", "train:1.0", "--dry-run")
    assert bad.returncode == 2 and "--nodes '3:1' is not a node count N nor an elastic range MIN:MAX" in " ".join(
        bad.stderr.split()
    )


def test_an_elastic_trainjob_gives_its_range_on_the_command_line(tmp_path):
    """The Trainer's torch plugin sets PET_NNODES=numNodes (no elastic TrainJob in v2): the range
    goes on rpcctl's command line, which beats PET_NNODES; the pod's index is not its node rank."""
    result = invoke(
        "k8s",
        PS,
        "--nodes",
        "1:2",
        "--image",
        "train:1.0",
        "--kind",
        "trainjob",
        "--set",
        "nproc_per_node=1",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    trainjob = documents(result.stdout)[2]
    validate_trainjob(trainjob)
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["command"] == [
        "rpcctl",
        "launch",
        "/etc/rpcctl/job.yaml",
        "--nnodes",
        "1:2",
    ]
    plugin = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "1",
        "JOB_COMPLETION_INDEX": "1",
        # what the plugin sets (its master, here loopback)
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29400",
    }
    config = write_config(tmp_path, nproc_per_node=1)
    found = sources(dry_run(tmp_path, config, plugin, *trainer["command"][3:]))
    assert found["nnodes"] == ("1:2", "--nnodes 1:2") and found["node_rank"] == (0, "default"), found
    assert found["master_addr"] == ("127.0.0.1", "PET_MASTER_ADDR=127.0.0.1") and found["master_port"] == (
        29400,
        "PET_MASTER_PORT=29400",
    )


def test_an_elastic_pods_launcher_reads_pet_nnodes_as_a_range_and_runs(tmp_path):
    """The Indexed Job's pod environment (PET_NNODES=1:2, its completion index, its master), read by
    a real `rpcctl launch` of the config it ships: an elastic job that starts with the one pod
    there after rdzv_last_call, as torchrun's would."""
    docs = documents(
        invoke(
            "k8s",
            PS,
            "--nodes",
            "1:2",
            "--image",
            "train:1.0",
            "--script-in-image",
            str(ROOT / "tests/workers/behave.py"),
            "--dry-run",
        ).stdout
    )
    shipped = tmp_path / "job.yaml"
    shipped.write_text(by_kind(docs)["ConfigMap"]["data"]["job.yaml"])
    env = {
        e["name"]: e["value"]
        for e in container(by_kind(docs)["Job"])["env"]
        if "value" in e and e["name"].startswith("PET_")
    }
    assert env["PET_NNODES"] == "1:2"
    runs = tmp_path / "runs"
    pod = {
        **os.environ,
        **env,
        "JOB_COMPLETION_INDEX": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
        # pod 0's name through the Service: loopback here
        "RPCCTL_SECRET": os.urandom(16).hex(),
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = rpcctl(
        "launch",
        str(shipped),
        "--no-live",
        "--runs-dir",
        str(runs),
        "--set",
        "nproc_per_node=1",
        "--set",
        "rdzv_last_call=1",
        "--set",
        "preload=[]",
        env=pod,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rpcctl: elastic job of 1 to 2 nodes: hosting the rendezvous at 127.0.0.1" in result.stderr, result.stderr
    rec = record(only_run(runs))
    assert rec["status"] == "succeeded" and [(r["nnodes"], r["why"]) for r in rec["rounds"]] == [(1, "start")], rec
    assert_no_process_left(Path(rec["run_dir"]))
