"""A run's files are its owner's alone: directories 0700, files 0600, whatever the umask.

Rank logs, config.yaml (``env:`` can carry secrets), telemetry.db and its -wal/-shm, stacks
and error files are all made through these two functions. Standard library only: the ranks
import it too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600

_FLAGS = {
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}


def private_dir(path: Path, *, exist_ok: bool = True) -> Path:
    """Make ``path`` (its missing parents with the usual modes) and set it to 0700."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=DIR_MODE, exist_ok=exist_ok)
    os.chmod(path, DIR_MODE)  # mkdir's mode is cut by the umask, and an existing one keeps its own
    return path


def private_open(path: Path, mode: str = "a", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for writing (a, w or x, with an optional b), created 0600."""
    fd = os.open(path, _FLAGS[mode[0]] | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a file that was there already
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 if it is not there (before another library opens it)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
    os.chmod(path, FILE_MODE)
