"""A run's files are its owner's alone: directories 0700, files 0600, whatever the umask.

Rank logs, config.yaml (``env:`` can carry secrets), telemetry.db and its -wal/-shm, stacks
and error files are all made through these functions. None follows a symbolic link at the
name it is given (``O_NOFOLLOW``; a directory is opened ``O_DIRECTORY | O_NOFOLLOW`` and its
mode set through that): a run file or directory swapped for a link is an error, never written
through. (The directories above are guarded by refusing a runs directory other users could
swap things in: ``rpcctl.records.runs.check_runs_dir``.) Standard library only: the ranks import it too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
FILE_MODE = 0o600
PARENT_MODE = 0o755  # a runs directory (or above) that rpcctl makes: never writable by others, whatever the umask

_FLAGS = {
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC


def private_dir(path: Path, *, exist_ok: bool = True) -> Path:
    """Make ``path`` (its missing parents 0755: ``make_parents``) and set it to 0700."""
    path = Path(path)
    make_parents(path)
    path.mkdir(mode=DIR_MODE, exist_ok=exist_ok)  # never follows a link
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NO_LINK)  # a link there (made or swapped in): ELOOP
    try:
        os.fchmod(fd, DIR_MODE)  # mkdir's mode is cut by the umask, and an existing one keeps its own
    finally:
        os.close(fd)
    return path


def make_parents(path: Path) -> None:
    """Make ``path``'s missing parents, each ``PARENT_MODE`` cut by the umask (``mkdir -p`` would
    make them 0777 under umask 000: a runs directory other users could write in)."""
    missing = []
    parent = Path(path).parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PARENT_MODE)
        except FileExistsError:
            pass


def private_open(path: Path, mode: str = "a", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for writing (a, w or x, with an optional b), created 0600."""
    fd = os.open(path, _FLAGS[mode[0]] | _NO_LINK, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a file that was there already
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 if it is not there (before another library opens it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | _NO_LINK, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def write_private_atomic(path: Path, data: str | bytes, *, encoding: str = "utf-8") -> None:
    """Write ``data`` (text or bytes) to ``path`` whole or not at all, 0600: into a new temporary
    file beside it, then renamed over it. An old file of that name stays intact until the rename
    (a full disk leaves it as it was, and no temporary file behind), another hard link to it
    keeps its content, and nothing that was there has its mode changed. A target that is not a
    regular file (a device such as /dev/null, a FIFO, a directory, a symbolic link) is refused
    with ``OSError`` (its ``strerror`` says why), before anything is opened: a FIFO never blocks.
    This is the one writer of every file a user names (``-o``, ``--plot``, ``--write-config``)."""
    import tempfile

    path = Path(path)
    refuse_non_regular(path)
    # 0600, whatever the umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temporary_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def check_writable(path: Path) -> None:
    """Raise ``OSError`` now if ``write_private_atomic(path, ...)`` is bound to fail: ``path`` is
    not a regular file (``refuse_non_regular``), or its folder takes no new file, or not one byte
    (a full disk, a read-only one, no such folder). For a command that works for minutes before
    it writes (``bench -o``, ``report -o``): what it finds is said before the work, not after.
    Leaves nothing behind; a disk that fills up meanwhile is the writer's to report."""
    import tempfile

    path = Path(path)
    refuse_non_regular(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temporary_prefix(path), suffix=".tmp")
    try:
        os.write(fd, b"\n")  # a full disk refuses even one byte: its first block
    finally:
        os.close(fd)
        os.unlink(tmp)


def _temporary_prefix(path: Path) -> str:
    return f".{path.name[:200]}."  # the temporary file's name fits NAME_MAX (255) whatever the target's


def refuse_non_regular(path: Path) -> None:
    """Raise ``OSError`` (``strerror`` says why) if ``path`` exists and is not a regular file:
    an output is never written into a device, a FIFO or a directory, nor through a link."""
    import errno
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = (
            "a symbolic link"
            if stat.S_ISLNK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise OSError(
            errno.EINVAL,
            f"it is {kind}; rpcctl writes only regular files (name a new file or a regular one)",
            str(path),
        )
