"""Kubernetes: read node count, node rank and master from a pod's environment, and build the
manifests that ``rpcctl k8s`` writes or applies.

In a pod no flag is needed. The variables are torchrun's (``PET_<FLAG>``, which the Kubeflow
Trainer v2 torch plugin sets in every TrainJob pod, and which the Indexed Job that ``rpcctl k8s``
writes sets too) and the Indexed Job's own completion index:

=======================  ==================================================================
PET_NNODES               nnodes: N, or an elastic range ``MIN:MAX`` (issue 43: the node rank is
                         then the rendezvous's, not the pod's index)
PET_NODE_RANK            node_rank (the Trainer sets it from the pod's completion index)
JOB_COMPLETION_INDEX     node_rank when PET_NODE_RANK is not set (any Indexed Job), in a job
                         of several nodes only: a one-node job ignores it
PET_MASTER_ADDR          master_addr (``<trainjob>-node-0-0.<trainjob>`` in a TrainJob)
PET_MASTER_PORT          master_port (29500 in a TrainJob)
PET_NPROC_PER_NODE       nproc_per_node; ``auto``: one rank per visible GPU (the config's
                         value when there is none)
=======================  ==================================================================

Precedence, for every key: a flag (``--nnodes`` ...), then the environment (SLURM's or the
pod's), then the config (``--set`` over the file), then the default.

The manifests are Python dicts dumped with ``yaml.safe_dump``: a value can only ever be the
value of its own field. Every name is checked against Kubernetes' rules (DNS-1123 labels and
subdomains, RFC 1035 for the Service and the TrainJob) before anything is written:

- ``--kind job`` (plain Kubernetes): a Secret (the run's ``RPCCTL_SECRET``), a ConfigMap (the
  job's config and its script), a headless Service (pod *i* is ``<name>-<i>.<name>``), and an
  Indexed Job, ``backoffLimit: 0``: rpcctl restarts every node itself (``max_restarts``), so
  Kubernetes must never start a second launcher for a node mid-run.
- ``--kind trainjob``: the Secret, the ConfigMap and a Kubeflow Trainer v2 TrainJob on the
  ``torch-distributed`` runtime; volumes go through its ``runtimePatches``.

Elastic, ``--nodes MIN:MAX`` (issue 43): the Indexed Job has MAX completions, ``PET_NNODES=MIN:MAX``
(each pod's launcher joins torch's elastic rendezvous at pod 0, through the Service) and a
completion policy that lets it run on fewer: ``successPolicy`` (the Job succeeds when pod 0, the
rendezvous host whose run record holds the job, succeeds), ``backoffLimitPerIndex: 0`` with
``maxFailedIndexes: MAX-MIN`` (a pod that fails is not restarted, and the Job goes on while at
least MIN are left), and a ``podFailurePolicy`` that ignores a disruption (a preempted or evicted
pod is made again, and its launcher joins the job: it grows back). Kubeflow Trainer v2 has no
elastic TrainJob: its torch plugin sets ``PET_NNODES`` to ``numNodes`` and says so ("Add support
for PyTorch elastic when JobSet supports Elastic Jobs"; the runtime's
``mlPolicy.torch.elasticPolicy`` is not applied), the TrainJob may not set ``PET_*`` itself, and
its ``runtimePatches`` reach only the pod template, not the Job's policies. So the TrainJob gets
``numNodes: MAX`` and ``rpcctl launch ... --nnodes MIN:MAX`` (a flag beats ``PET_NNODES``): it
starts with the pods that come (at least MIN, after ``rdzv_last_call`` for more) and grows as late
pods start; a pod that fails ends the TrainJob as its JobSet's failure policy says.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from rpcctl.config import JobSpec, host_problem
from rpcctl.base.errors import UsageError
from rpcctl.schedulers.nodes import Nodes, parse_nodes

DEFAULT_PORT = 29500  # torchrun's, and the Trainer's ContainerTrainerPort
CONFIG_DIR = "/etc/rpcctl"  # where the ConfigMap is mounted
RUNS_DIR = "/runs"  # where the runs volume is mounted (RPCCTL_RUNS_DIR)
CONFIG_KEY = "job.yaml"
SECRET_KEY = "secret"
MAX_CONFIGMAP_BYTES = 1_000_000  # Kubernetes refuses a ConfigMap over 1 MiB (keys included)
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINER_NODE = "node"  # the Trainer's replicated job and container name for training nodes


# ---------------------------------------------------------------------------------------------
# The pod's environment


def _count(env: Mapping[str, str], name: str, low: int) -> tuple[int, str]:
    text = env[name].strip()
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < low:
        raise UsageError(f"${name}={env[name]!r} is not a whole number of at least {low}")
    return int(text), f"{name}={text}"


def pod_flags(env: Mapping[str, str], gpus: int = 0, wanted: Nodes | None = None) -> dict[str, tuple[Any, str]]:
    """Config values implied by the pod we run in, each with where it came from (empty outside
    Kubernetes). ``gpus``: the GPUs visible here, for ``PET_NPROC_PER_NODE=auto``. ``wanted``:
    the nodes a flag asks for; elastic there or in ``PET_NNODES``, no node rank is read."""
    flags: dict[str, tuple[Any, str]] = {}
    elastic = wanted is not None and wanted.elastic
    if env.get("PET_NNODES"):
        nodes = parse_nodes(env["PET_NNODES"], "$PET_NNODES")
        flags["nnodes"] = (str(nodes) if nodes.elastic else nodes.high, f"PET_NNODES={env['PET_NNODES'].strip()}")
        elastic = elastic or nodes.elastic
    for name in ("PET_NODE_RANK", "JOB_COMPLETION_INDEX"):
        if env.get(name):
            rank = _count(env, name, 0)  # checked even where the rendezvous numbers the nodes
            if not elastic:
                flags["node_rank"] = rank
            break
    if env.get("PET_MASTER_ADDR"):
        addr = env["PET_MASTER_ADDR"].strip()
        problem = host_problem(addr)
        if problem is not None:
            raise UsageError(
                f"$PET_MASTER_ADDR={_shown(env['PET_MASTER_ADDR'])} is not an IP address or a host name: {problem}"
            )
        flags["master_addr"] = (addr, f"PET_MASTER_ADDR={addr}")
    if env.get("PET_MASTER_PORT"):
        port = _count(env, "PET_MASTER_PORT", 1)
        if port[0] > 65535:
            raise UsageError(f"$PET_MASTER_PORT={env['PET_MASTER_PORT']!r} is not a port (1-65535)")
        flags["master_port"] = port
    nproc = env.get("PET_NPROC_PER_NODE", "").strip()
    if nproc in ("auto", "gpu"):
        if gpus:
            flags["nproc_per_node"] = (gpus, f"PET_NPROC_PER_NODE={nproc} ({gpus} GPUs visible)")
    elif nproc:
        flags["nproc_per_node"] = _count(env, "PET_NPROC_PER_NODE", 1)
    return flags


def weak_node_rank(flags: Mapping[str, tuple[Any, str]]) -> bool:
    """The node rank is only an Indexed Job's completion index, and nothing in the environment
    says the job has several nodes: a one-node config then ignores it."""
    return "nnodes" not in flags and "node_rank" in flags and flags["node_rank"][1].startswith("JOB_COMPLETION_INDEX=")


# ---------------------------------------------------------------------------------------------
# Names: Kubernetes' rules, checked before anything is written

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# An image reference, as the distribution project's grammar has it: [host[:port]/]path[:tag][@digest]
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?"
)
_QUANTITY = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?")
_CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 80 else repr(value[:77]) + "..."


def check_name(
    value: str, what: str, *, rule: Literal["label", "rfc1035", "subdomain"] = "label", max_len: int = 63
) -> str:
    """``value`` if it is a valid Kubernetes name of this kind, else a UsageError (exit 2)
    naming ``what`` (a flag or a config key)."""
    pattern, words = {
        "label": (
            _LABEL,
            "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit",
        ),
        "rfc1035": (
            _RFC1035,
            "an RFC 1035 label: lower-case letters, digits and '-', starting with a letter and ending with a letter or "
            "digit",
        ),
        "subdomain": (_SUBDOMAIN, "a DNS-1123 subdomain: DNS-1123 labels joined by '.'"),
    }[rule]
    if not pattern.fullmatch(value):
        raise UsageError(f"{what}: {_shown(value)} is not a valid Kubernetes name: it must be {words}")
    if len(value) > max_len:
        raise UsageError(f"{what}: {_shown(value)} is {len(value)} characters; Kubernetes allows {max_len} here")
    return value


def check_image(value: str) -> str:
    if not _IMAGE.fullmatch(value) or len(value) > 4096:
        raise UsageError(
            f"--image: {_shown(value)} is not an image reference like registry.example.com/team/train:1.0 or "
            "name@sha256:<digest>"
        )
    return value


# Characters no path in an image may hold here: control characters (a newline, a tab, an escape),
# formatting ones (a right-to-left override shows one path and is another), line and paragraph
# separators, and lone surrogates (bytes that are not UTF-8, which the ConfigMap cannot carry).
_NOT_IN_A_PATH = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def check_image_path(value: str, flag: str) -> str:
    """``value`` if it is an absolute path of a file, in printable text, that Linux can hold (a
    name of at most 255 bytes each, 4095 in all); else a UsageError (exit 2) naming ``flag``."""
    odd = next((c for c in value if unicodedata.category(c) in _NOT_IN_A_PATH), None)
    if odd is not None:
        raise UsageError(
            f"{flag}: {_shown(value)} holds U+{ord(odd):04X} ({unicodedata.name(odd, 'a control character')}): "
            "a path in the image is printable text"
        )
    if not value.startswith("/") or value.endswith("/"):
        raise UsageError(
            f"{flag}: {_shown(value)} is not an absolute path in the image (of a file, like /app/train.py)"
        )
    if len(value.encode()) > 4095 or any(len(part.encode()) > 255 for part in value.split("/")):
        raise UsageError(f"{flag}: {_shown(value)} is longer than Linux allows (255 bytes a name, 4095 in all)")
    return value


def check_quantity(value: str, flag: str) -> str:
    if not _QUANTITY.fullmatch(value):
        raise UsageError(f"{flag}: {_shown(value)} is not a Kubernetes quantity like 4, 500m, 16Gi")
    return value


# ---------------------------------------------------------------------------------------------
# Manifests


@dataclass(frozen=True)
class K8sSpec:
    """What ``rpcctl k8s`` was asked for (plain data; names are checked by ``check``)."""

    name: str  # the Job / TrainJob, its Service; the Secret and ConfigMap get -secret, -config
    nodes: int  # elastic: MAX
    image: str
    secret: str  # the run's RPCCTL_SECRET, made by the caller
    kind: Literal["job", "trainjob"] = "job"
    gpus_per_node: int = 0
    cpus_per_node: str | None = None  # default: nproc_per_node
    memory_per_node: str | None = None
    namespace: str | None = None
    runs_claim: str | None = None  # a PersistentVolumeClaim for the runs directory; default: emptyDir
    script_in_image: str | None = None  # the script's path in the image; default: shipped in the ConfigMap
    runtime: str = "torch-distributed"  # the TrainJob's ClusterTrainingRuntime
    min_nodes: int | None = None  # elastic (--nodes MIN:MAX): MIN

    @property
    def elastic_range(self) -> str | None:
        return f"{self.min_nodes}:{self.nodes}" if self.min_nodes is not None else None

    def check(self, name_from: str) -> None:
        """Refuse what Kubernetes would refuse (or what would break the pods' names) now."""
        digits = len(str(max(self.nodes - 1, 0)))
        if self.kind == "job":  # pod i's hostname is <name>-<i>; the Service's name is <name> (RFC 1035)
            check_name(self.name, name_from, rule="rfc1035", max_len=63 - 1 - digits)
        else:  # pod i is <name>-node-0-<i>; the TrainJob's CRD wants RFC 1035
            check_name(self.name, name_from, rule="rfc1035", max_len=63 - len("-node-0-") - digits)
        check_image(self.image)
        if self.namespace is not None:
            check_name(self.namespace, "--namespace")
        if self.runs_claim is not None:
            check_name(self.runs_claim, "--runs-claim", rule="subdomain", max_len=253)
        check_name(self.runtime, "--runtime", rule="subdomain", max_len=253)
        for value, flag in ((self.cpus_per_node, "--cpus-per-node"), (self.memory_per_node, "--memory-per-node")):
            if value is not None:
                check_quantity(value, flag)
        if self.script_in_image is not None:
            check_image_path(self.script_in_image, "--script-in-image")


def pod_config(spec: JobSpec, k8s: K8sSpec) -> tuple[str, dict[str, str]]:
    """The config the pods run (YAML text) and the ConfigMap's data: the job's resolved spec,
    its script pointed at the ConfigMap (or the image), ``devices: auto`` when GPUs are asked for."""
    update: dict[str, Any] = {}
    data: dict[str, str] = {}
    if k8s.script_in_image:
        update["script"] = k8s.script_in_image
    elif spec.script is None:  # a module (-m): the image holds it
        pass
    else:
        key = (
            spec.script.name
            if _CONFIGMAP_KEY.fullmatch(spec.script.name) and spec.script.name != CONFIG_KEY
            else "script.py"
        )
        try:
            data[key] = Path(spec.script).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot ship the script {spec.script} in a ConfigMap ({exc}): put it in the image and pass "
                "--script-in-image PATH"
            ) from None
        update["script"] = f"{CONFIG_DIR}/{key}"
    if k8s.gpus_per_node:
        if spec.devices == "cpu":
            raise UsageError(
                f"--gpus-per-node {k8s.gpus_per_node}, but the config's devices is 'cpu': drop one of them"
            )
        if spec.devices == "inherit":
            update["devices"] = "auto"  # one of the pod's GPUs per rank
    # The pod's environment gives nnodes, node_rank and master; the file keeps one-node values.
    update.update(nnodes=1, node_rank=0, master_addr=None)
    values = spec.model_copy(update=update).model_dump(mode="json")
    text = (
        "# Written by `rpcctl k8s` from the job's config; nodes, node rank and master come from the pod's "
        "environment.\n"
    )
    text += yaml.safe_dump(values, sort_keys=False)
    data[CONFIG_KEY] = text
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIGMAP_BYTES:
        raise UsageError(
            f"the config and script are {size:,} bytes, too big for a ConfigMap (1 MiB): put the script in the image "
            "and pass --script-in-image PATH"
        )
    return text, data


def _labels(k8s: K8sSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "rpcctl",
        "app.kubernetes.io/instance": k8s.name,
        "app.kubernetes.io/managed-by": "rpcctl",
    }


def _metadata(k8s: K8sSpec, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(k8s)}
    if k8s.namespace:
        meta["namespace"] = k8s.namespace
    return meta


def _resources(spec: JobSpec, k8s: K8sSpec) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": k8s.cpus_per_node or str(spec.nproc_per_node)}
    limits: dict[str, Any] = {}
    if k8s.memory_per_node:
        # memory is not compressible: request what the limit is
        requests["memory"] = limits["memory"] = k8s.memory_per_node
    if k8s.gpus_per_node:
        limits["nvidia.com/gpu"] = k8s.gpus_per_node
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def _env(k8s: K8sSpec) -> list[dict[str, Any]]:
    return [
        {"name": "RPCCTL_SECRET", "valueFrom": {"secretKeyRef": {"name": f"{k8s.name}-secret", "key": SECRET_KEY}}},
        {"name": "RPCCTL_RUNS_DIR", "value": RUNS_DIR},
    ]


def _volumes(k8s: K8sSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    runs = {"persistentVolumeClaim": {"claimName": k8s.runs_claim}} if k8s.runs_claim else {"emptyDir": {}}
    volumes = [
        {"name": "config", "configMap": {"name": f"{k8s.name}-config"}},
        {"name": "runs", **runs},
        # TensorPipe's shared memory: the container's own /dev/shm is 64 MiB
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "runs", "mountPath": RUNS_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return volumes, mounts


def command(nnodes: str | None = None) -> list[str]:
    return ["rpcctl", "launch", f"{CONFIG_DIR}/{CONFIG_KEY}", *(["--nnodes", nnodes] if nnodes else [])]


def manifests(spec: JobSpec, k8s: K8sSpec) -> list[dict[str, Any]]:
    """Everything that runs ``spec`` on ``k8s.nodes`` pods, in the order to apply it."""
    _, data = pod_config(spec, k8s)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(k8s, f"{k8s.name}-secret"),
        "type": "Opaque",
        "stringData": {SECRET_KEY: k8s.secret},
    }
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(k8s, f"{k8s.name}-config"), "data": data}
    if k8s.kind == "trainjob":
        return [secret, config, _trainjob(spec, k8s)]
    return [secret, config, _service(spec, k8s), _job(spec, k8s)]


def _service(spec: JobSpec, k8s: K8sSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(k8s, k8s.name),
        "spec": {
            "clusterIP": "None",  # headless: a DNS name per pod
            "publishNotReadyAddresses": True,  # pods find each other before they are ready
            "selector": _labels(k8s),
            "ports": [{"name": "rendezvous", "port": spec.master_port or DEFAULT_PORT, "protocol": "TCP"}],
        },
    }


def _job(spec: JobSpec, k8s: K8sSpec) -> dict[str, Any]:
    port = spec.master_port or DEFAULT_PORT
    volumes, mounts = _volumes(k8s)
    env = [
        # MIN:MAX: the pods' launchers meet elastically
        {"name": "PET_NNODES", "value": k8s.elastic_range or str(k8s.nodes)},
        {"name": "PET_MASTER_ADDR", "value": f"{k8s.name}-0.{k8s.name}"},  # pod 0 through the headless Service
        {"name": "PET_MASTER_PORT", "value": str(port)},
        *_env(k8s),
    ]  # the node rank is the pod's JOB_COMPLETION_INDEX
    container = {
        "name": "rpcctl",
        "image": k8s.image,
        "command": command(),
        "env": env,
        "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}],
        "resources": _resources(spec, k8s),
        "volumeMounts": mounts,
    }
    # rpcctl restarts every node together (max_restarts in the config); a pod that fails
    # has used those up, and a replacement could not rejoin the others: the Job fails.
    policy: dict[str, Any] = {"backoffLimit": 0}
    if k8s.min_nodes is not None:
        policy = {
            # pod 0 hosts the rendezvous: its verdict is the job's
            "successPolicy": {"rules": [{"succeededIndexes": "0"}]},
            "backoffLimitPerIndex": 0,  # a failed pod is not made again: the others go on without it
            "maxFailedIndexes": k8s.nodes - k8s.min_nodes,  # while at least MIN remain
            # a preempted or evicted pod is made again (not counted) and its launcher joins the job
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
            },
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(k8s, k8s.name),
        "spec": {
            "completionMode": "Indexed",
            "completions": k8s.nodes,
            "parallelism": k8s.nodes,
            **policy,
            "template": {
                "metadata": {"labels": _labels(k8s)},
                "spec": {
                    "subdomain": k8s.name,  # pod i is <name>-<i>.<name>
                    "restartPolicy": "Never",
                    # no <SERVICE>_PORT variables (a Service named 'master' would set MASTER_PORT)
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,  # rpcctl never talks to the API server
                    # the launcher's teardown: SIGTERM, grace, SIGKILL
                    "terminationGracePeriodSeconds": int(spec.grace) + 30,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _trainjob(spec: JobSpec, k8s: K8sSpec) -> dict[str, Any]:
    volumes, mounts = _volumes(k8s)
    pod = {"volumes": volumes, "containers": [{"name": TRAINER_NODE, "volumeMounts": mounts}]}
    patch = {
        "template": {
            "spec": {"replicatedJobs": [{"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": pod}}}}]}
        }
    }
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _metadata(k8s, k8s.name),
        "spec": {
            "runtimeRef": {"name": k8s.runtime},
            "trainer": {
                "image": k8s.image,
                # the torch plugin sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR/PORT, PET_NPROC_PER_NODE
                "command": command(k8s.elastic_range),
                "numNodes": k8s.nodes,
                "numProcPerNode": spec.nproc_per_node,
                "resourcesPerNode": _resources(spec, k8s),
                "env": _env(k8s),
            },
            "runtimePatches": [{"manager": "rpcctl", "trainingRuntimeSpec": patch}],
        },
    }


class _Dumper(yaml.SafeDumper):
    """safe_dump, with text of several lines (the config, the script) as a literal block where
    YAML can hold it as one (PyYAML falls back to a quoted string where it cannot)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, explicit_start=True, allow_unicode=False)
