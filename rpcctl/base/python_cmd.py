"""The command lines of rpcctl's own Python processes: ``python -P -m MODULE ...``.

Plain ``python -m`` puts the working directory first on ``sys.path``, so an ``rpcctl/`` folder
there (another checkout, an old copy) would be imported in place of the installed package, in
the rank server, in every rank and in a SLURM node's launcher. ``-P`` (Python 3.11) leaves it
out; once ``rpcctl`` is imported, ``working_dir_on_path`` puts the directory back where
``python -m`` has it, for what users keep there (a ``preload`` module). From then on rpcctl's
own modules come from the imported package's folder, whatever ``sys.path`` says.
"""

from __future__ import annotations

import os
import sys

RUNTIME = "rpcctl.rank.runtime"  # the in-rank bootstrap
RANK_SERVER = "rpcctl.processes.rank_server"


def module_command(module: str, python: str = sys.executable) -> list[str]:
    return [python, "-P", "-m", module]


def working_dir_on_path() -> None:
    """The working directory first on ``sys.path``, as ``python -m`` would have it, in a process
    started by ``module_command`` (a no-op in one started with plain ``-m``: it is there)."""
    if sys.flags.safe_path:
        sys.path.insert(0, os.getcwd())
