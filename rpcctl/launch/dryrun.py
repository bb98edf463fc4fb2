"""A job's dry run, as TorchX's ``runner.dryrun()``: what ``launch`` would spawn on this node, as
data, with nothing started. ``rpcctl launch --dry-run`` only renders it; a library caller gets
the same object::

    from rpcctl.launch import dry_run, job_from_config
    described = dry_run(job_from_config("job.yaml"))
    described.ranks[0].command, described.ranks[0].env["MASTER_ADDR"], described.scheduler.scheduler
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcctl.config import JobSpec
from rpcctl.launch.job import Job, Resolution
from rpcctl.launch.launcher import plan_job
from rpcctl.planning.plan import LaunchPlan
from rpcctl.planning.preflight import check_before_spawn


@dataclass(frozen=True)
class PlannedRank:
    """One rank as it would be spawned: on which node, its command, the environment it gets on
    top of the launcher's (the torchrun contract), its device and its log."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    command: list[str]
    env: dict[str, str]
    device: str
    log: str


@dataclass(frozen=True)
class DryRun:
    """What would be spawned here (``plan``, per rank in ``ranks``), what the scheduler said
    (``scheduler``) and where each of the node's values came from (``sources``: key, value, source)."""

    plan: LaunchPlan
    host: str
    node_rank: int
    nnodes: int
    scheduler: Resolution
    sources: list[dict[str, Any]]

    @property
    def ranks(self) -> list[PlannedRank]:
        return [
            PlannedRank(r.rank, r.local_rank, self.node_rank, self.host, list(r.argv), dict(r.env), r.device, r.log)
            for r in self.plan.ranks
        ]

    def to_dict(self) -> dict[str, Any]:
        """``rpcctl launch --dry-run --json``: the plan and the sources."""
        return {**self.plan.to_dict(), "sources": self.sources}


def dry_run(job: Job | JobSpec, runs_dir: Path | None = None) -> DryRun:
    """The job planned on this node as ``launch`` would plan it, after the same checks (what
    ``launch`` would refuse, a dry run refuses too); nothing is made or started. A multi-node
    job's plan is its own node's, before any rendezvous (its port: torchrun's default)."""
    job = job if isinstance(job, Job) else Job(job)

    def planned():
        check_before_spawn(job.spec)
        return plan_job(job.spec, runs_dir)

    plan, facts = job.located(planned)
    return DryRun(plan, facts.hostname, job.spec.node_rank, job.spec.nnodes, job.scheduler, job.sources(plan))
