"""A job before it runs, for every caller (``rpcctl launch`` and a library alike): its config read
once, the values this node's scheduler gives it, and its dry run (TorchX's ``runner.dryrun()``:
the plan is data before it is action).

    config (read once) ─┐
    flags ──────────────┼─▶ Job: spec, where each value came from ──dry_run──▶ DryRun (printable, typed)
    SLURM_* / PET_* ────┘  (``scheduler``: a SLURM step's, else a pod's)  └──launch──▶ RunRecord

Precedence: the caller's flags, then the environment (a SLURM step's, else a pod's:
``rpcctl.schedulers.slurm`` / ``k8s``), then the config, then the default; but an elastic range
that a SLURM step capped at its node count stands over the flag's (it took the flag's in). A
library caller inside an sbatch or a pod gets the same values as the CLI there::

    from rpcctl.launch import dry_run, job_from_config, launch
    job = job_from_config("job.yaml")      # SLURM_NNODES / SLURM_NODEID / the nodelist → nnodes, node_rank, master_addr
    print(dry_run(job).to_dict())          # what would be spawned, and where each node value came from
    record = launch(job)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rpcctl.base.errors import ConfigError, UsageError
from rpcctl.config import ConfigFile, JobSpec, spec_from_line
from rpcctl.planning.plan import LaunchPlan, visible_gpus
from rpcctl.schedulers.k8s import pod_flags, weak_node_rank
from rpcctl.schedulers.nodes import Nodes, parse_nodes, spec_nodes
from rpcctl.schedulers.slurm import caps_the_range, in_srun_step, slurm_flags

Flags = dict[str, tuple[Any, str]]  # config key → (value, where it came from: a flag as written, SLURM_NODEID=1, ...)
T = TypeVar("T")

DEFAULT_MASTER_PORT = 29500  # torchrun's

# What a dry run says the origin of: the values a node of a multi-node job takes from flags,
# the environment or the config.
SOURCED_KEYS = ("nnodes", "node_rank", "master_addr", "master_port", "nproc_per_node")


@dataclass(frozen=True)
class Resolution:
    """What this node's scheduler says of the job: ``scheduler`` ("slurm", "kubernetes", or None
    outside both) and the config keys it gives (nnodes, node_rank, master_addr, master_port,
    nproc_per_node), each with the variable it came from."""

    scheduler: str | None = None
    values: Flags = field(default_factory=dict)


def _resolved(values: Flags, slurm: bool) -> Resolution:
    return Resolution(("slurm" if slurm else "kubernetes") if values else None, values)


def _wanted(flags: Mapping[str, tuple[Any, str]] | None) -> Nodes | None:
    """The caller's nnodes, N or MIN:MAX; None when not given or not readable (its own reader says why)."""
    try:
        return parse_nodes(flags["nnodes"][0], flags["nnodes"][1]) if flags and "nnodes" in flags else None
    except UsageError:
        return None


def config_resolution(
    config: ConfigFile, overrides: list[str] = (), flags: Flags | None = None, env: Mapping[str, str] = os.environ
) -> Resolution:
    """What the scheduler gives a config's job: a SLURM step's values, else a pod's. An Indexed
    Job's completion index alone is a node rank only for a config of several nodes. ``flags``:
    the caller's (an elastic ``nnodes`` MIN:MAX there, else in the config, is kept in a SLURM step)."""
    wanted = _wanted(flags)
    if wanted is None and in_srun_step(env):
        wanted = spec_nodes(config.spec(list(overrides)))
    values = slurm_flags(env, wanted)
    if values:
        return _resolved(values, True)
    values = pod_flags(env, gpus=len(visible_gpus()), wanted=wanted)
    if (
        weak_node_rank(values)
        and config.spec(list(overrides), flags={k: v for k, v in values.items() if k != "node_rank"}).nnodes == 1
    ):
        del values["node_rank"]
    return _resolved(values, False)


def line_resolution(flags: Flags, env: Mapping[str, str] = os.environ) -> Resolution:
    """As ``config_resolution``, for a torchrun line (``flags``: its options): an Indexed Job's
    completion index alone is a node rank only for a line of several nodes."""
    wanted = _wanted(flags)
    values = slurm_flags(env, wanted)
    if values:
        return _resolved(values, True)
    # PET_NPROC_PER_NODE is the line's --nproc-per-node (auto, cpu, gpu, N: torchrun's words), read with the rest
    values = pod_flags(
        {k: v for k, v in env.items() if k != "PET_NPROC_PER_NODE"}, gpus=len(visible_gpus()), wanted=wanted
    )
    nnodes = str(flags.get("nnodes", (values.get("nnodes", (1, ""))[0], ""))[0]).partition(":")[0]
    if weak_node_rank(values) and nnodes.strip() in ("", "1"):
        del values["node_rank"]
    return _resolved(values, False)


def over(resolution: Resolution, flags: Flags) -> Flags:
    """The caller's flags over the environment's values, but for an elastic range that a SLURM
    step capped at its node count: that one took the flag's range in already."""
    merged = {**resolution.values, **flags}
    if caps_the_range(resolution.values):
        merged["nnodes"] = resolution.values["nnodes"]
    return merged


@dataclass(frozen=True)
class Job:
    """A job as it will run on this node: its ``spec`` and where its values came from (the
    config, read once, the ``--set`` overrides, ``flags``: the caller's and the scheduler's)."""

    spec: JobSpec
    config: ConfigFile | None = None
    overrides: tuple[str, ...] = ()
    flags: Flags = field(default_factory=dict)
    scheduler: Resolution = field(default_factory=Resolution)

    @property
    def config_path(self) -> Path | None:
        return self.config.path if self.config is not None else None

    def with_env(self, **env: str) -> Job:
        """The same job, with these variables in every rank's planned environment."""
        return dataclasses.replace(self, spec=self.spec.model_copy(update={"env": {**self.spec.env, **env}}))

    def locate(self, key: str) -> str | None:
        """Where ``key`` was set: the flag or variable, ``--set``, ``FILE:LINE``; None: nowhere
        (the file's name for a key it lacks; the line's default)."""
        if self.config is not None:
            where = self.config.locate(key, overrides=list(self.overrides), flags=self.flags)
            return None if where == str(self.config.path) else where
        return self.flags.get(key.split(".")[0], (None, None))[1]

    def located(self, action: Callable[[], T]) -> T:
        """``action()``, with a config error found after loading (a GPU that is not there, a port
        in use) given the file and line of its key, or the flag that set it."""
        try:
            return action()
        except ConfigError as exc:
            if exc.where or not exc.key:
                raise
            where = self.locate(exc.key)
            if where is None:
                where = str(self.config.path) if self.config is not None else "the command line"
            raise ConfigError(exc.message, where=where, key=exc.key) from None

    def sources(self, plan: LaunchPlan) -> list[dict[str, Any]]:
        """Where each of ``SOURCED_KEYS`` came from: a flag, the environment (``SLURM_NODEID=1``,
        ``PET_NNODES=2``), ``--set``, the file's line, or the default."""
        spec, rows = self.spec, []
        for key in SOURCED_KEYS:
            value = f"{spec.min_nodes}:{spec.nnodes}" if key == "nnodes" and spec.elastic else getattr(spec, key)
            source = self.locate(key) or "default"
            if key == "master_port" and value is None:  # several nodes: torchrun's; one: the free port the plan took
                value, source = (
                    (DEFAULT_MASTER_PORT, "default (several nodes)")
                    if spec.multi_node
                    else (plan.master_port, "default (a free port)")
                )
            rows.append({"key": key, "value": value, "source": source})
        return rows


def job_from_config(
    config: str | os.PathLike[str] | ConfigFile,
    overrides: list[str] = (),
    *,
    flags: Flags | None = None,
    env: Mapping[str, str] = os.environ,
    resolution: Resolution | None = None,
) -> Job:
    """The job of a config file on this node: the config read once, under ``--set``
    ``overrides``, the caller's ``flags`` and what the scheduler gives (``resolution``; read
    from ``env`` when not given)."""
    config = config if isinstance(config, ConfigFile) else ConfigFile(config)
    flags = dict(flags or {})
    if resolution is None:
        resolution = config_resolution(config, overrides, flags, env)
    merged = over(resolution, flags)
    return Job(config.spec(list(overrides), flags=merged), config, tuple(overrides), merged, resolution)


def job_from_line(
    target: str,
    args: list[str],
    *,
    module: bool = False,
    no_python: bool = False,
    flags: Flags | None = None,
    env: Mapping[str, str] = os.environ,
    resolution: Resolution | None = None,
) -> Job:
    """The job of a torchrun line (``flags``: its options as config keys), as ``job_from_config``."""
    flags = dict(flags or {})
    if resolution is None:
        resolution = line_resolution(flags, env)
    merged = over(resolution, flags)
    return Job(
        spec_from_line(target, args, module=module, no_python=no_python, flags=merged), None, (), merged, resolution
    )
