"""The facade the CLI and the bench call: a job read once and resolved on this node (its config,
its flags, what a SLURM step or a pod gives it: ``job``), its dry run, its launch (make the run
directory, subscribe the listeners, supervise); follow a run from outside, stop it, end a lost one.

Its names load when first used: ``rpcctl runs`` and ``inspect`` import ``control`` alone, never
the config models.
"""

import importlib

_WHERE = {
    "DryRun": "dryrun",
    "PlannedRank": "dryrun",
    "dry_run": "dryrun",
    "Job": "job",
    "Resolution": "job",
    "job_from_config": "job",
    "job_from_line": "job",
    "launch": "launcher",
    "plan_job": "launcher",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rpcctl.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rpcctl.launch.{_WHERE[name]}"), name)
