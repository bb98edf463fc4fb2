"""``rpcctl k8s CONFIG --nodes N --image IMAGE``: the Kubernetes objects that run a job on N
pods (``--nodes MIN:MAX``: elastic, on up to MAX); printed, written, or applied with kubectl."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from rpcctl.commands.common import check_output, output_option, write_output
from rpcctl.config import load_config
from rpcctl.console import get_console
from rpcctl.base.errors import RpcctlError, UsageError
from rpcctl.schedulers.k8s import K8sSpec, dump, manifests
from rpcctl.schedulers.nodes import parse_nodes


class Kind(str, Enum):
    job = "job"
    trainjob = "trainjob"


def k8s(
    config: Annotated[
        Path,
        typer.Argument(
            metavar="CONFIG",
            help="The job's YAML config (shipped to the pods in a ConfigMap, with its script).",
            show_default=False,
        ),
    ],
    nodes: Annotated[
        str,
        typer.Option(
            "--nodes",
            "-N",
            metavar="N|MIN:MAX",
            help="Pods, one launcher (one node of the job) each; MIN:MAX: elastic, up to MAX pods, going on while MIN "
            "remain.",
            show_default=False,
        ),
    ],
    image: Annotated[
        str,
        typer.Option(
            "--image",
            help="Container image with python, torch and rpcctl (and the script's own imports).",
            show_default=False,
        ),
    ],
    gpus_per_node: Annotated[
        int,
        typer.Option(
            "--gpus-per-node",
            min=0,
            help="nvidia.com/gpu per pod (default: 0); the config's devices becomes auto (one GPU per rank) unless it "
            "lists them.",
            show_default=False,
        ),
    ] = 0,
    cpus_per_node: Annotated[
        Optional[str],
        typer.Option(
            "--cpus-per-node",
            help="CPU request per pod, a quantity like 4 or 3500m (default: nproc_per_node).",
            show_default=False,
        ),
    ] = None,
    memory_per_node: Annotated[
        Optional[str],
        typer.Option(
            "--memory-per-node", help="Memory request and limit per pod, like 16Gi (default: none).", show_default=False
        ),
    ] = None,
    namespace: Annotated[
        Optional[str],
        typer.Option(
            "--namespace", help="Namespace of every object (default: kubectl's current one).", show_default=False
        ),
    ] = None,
    kind: Annotated[
        Kind,
        typer.Option(
            "--kind",
            help="job (default): an Indexed Job with a headless Service (plain Kubernetes); trainjob: a Kubeflow "
            "Trainer v2 TrainJob.",
            case_sensitive=False,
            show_default=False,
        ),
    ] = Kind.job,
    name: Annotated[
        Optional[str],
        typer.Option(
            "--name",
            help="Name of the Job or TrainJob and its Service; the Secret and ConfigMap add -secret, -config (default: "
            "the config's name).",
            show_default=False,
        ),
    ] = None,
    runs_claim: Annotated[
        Optional[str],
        typer.Option(
            "--runs-claim",
            help="PersistentVolumeClaim mounted at /runs for run records and logs (default: an emptyDir, gone with the "
            "pod).",
            show_default=False,
        ),
    ] = None,
    script_in_image: Annotated[
        Optional[str],
        typer.Option(
            "--script-in-image",
            help="The script's absolute path in the image (default: shipped in the ConfigMap).",
            show_default=False,
        ),
    ] = None,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="With --kind trainjob: the ClusterTrainingRuntime to run on (default: torch-distributed).",
            show_default=False,
        ),
    ] = "torch-distributed",
    set_: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            "-s",
            help="Override a config key before it is shipped: KEY.PATH=VALUE. Repeatable.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Optional[Path],
        output_option("Write the manifests to this file (0600: it holds the run's secret) instead of applying them."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the manifests and apply nothing.")] = False,
) -> None:
    """Run CONFIG on N pods: write the Kubernetes objects, or apply them with kubectl.

    --kind job (default): a Secret with the run's RPCCTL_SECRET, a ConfigMap with the config and
    its script, a headless Service, and an Indexed Job of N pods (backoffLimit 0: rpcctl
    restarts every node itself, max_restarts times). --kind trainjob: the Secret, the
    ConfigMap and a Kubeflow Trainer v2 TrainJob. Each pod runs `rpcctl launch` with no flag:
    nodes, node rank and master come from its environment. Without -o or --dry-run, the
    objects are applied with `kubectl apply -f -`. Exit code 2, before anything is written,
    for a bad config, flag or name.
    """
    console = get_console()
    if output is not None and not dry_run:
        check_output(output, "--output")  # a device, a FIFO, a link, a full disk: refused before the work
    spec = load_config(config, set_ or [])
    count = parse_nodes(nodes, "--nodes")
    wanted = K8sSpec(
        name=name if name is not None else spec.name,
        nodes=count.high,
        min_nodes=count.low if count.elastic else None,
        image=image,
        secret=secrets.token_hex(16),
        kind=kind.value,
        gpus_per_node=gpus_per_node,
        cpus_per_node=cpus_per_node,
        memory_per_node=memory_per_node,
        namespace=namespace,
        runs_claim=runs_claim,
        script_in_image=script_in_image,
        runtime=runtime,
    )
    wanted.check("--name" if name is not None else f"the job's name (key 'name' of {config}; or --name)")
    text = dump(manifests(spec, wanted))
    if dry_run:
        console.raw(text)
        return
    if output is not None:
        write_output(output, text, "--output")  # 0600, renamed into place: another link to an old file keeps it
        console.info(
            f"rpcctl: wrote the {kind.value} '{wanted.name}' ({count} pod(s)) to {output}; "
            f"apply it with `kubectl apply -f {output}`"
        )
        return
    apply(text, wanted)


def apply(text: str, wanted: K8sSpec) -> None:
    console = get_console()
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise UsageError(
            "kubectl is not on PATH: write the manifests with -o FILE (then `kubectl apply -f FILE`), or print them "
            "with --dry-run"
        )
    try:
        result = subprocess.run([kubectl, "apply", "-f", "-"], input=text, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RpcctlError(f"`kubectl apply` failed: {exc}") from None
    if result.returncode != 0:
        raise RpcctlError(
            f"`kubectl apply` failed (exit code {result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
        )
    for line in result.stdout.splitlines():
        console.info(line)
    what = "job" if wanted.kind == "job" else "trainjob"
    ns = f" -n {wanted.namespace}" if wanted.namespace else ""
    console.info(
        f"rpcctl: applied; follow node 0 with `kubectl logs{ns} -f {what}/{wanted.name}`"
        if wanted.kind == "job"
        else f"rpcctl: applied; watch it with `kubectl get{ns} trainjob {wanted.name}` "
        f"and `kubectl logs{ns} -f -l jobset.sigs.k8s.io/jobset-name={wanted.name}`"
    )
