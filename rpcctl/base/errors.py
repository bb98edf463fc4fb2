"""The error hierarchy. The CLI's single boundary (``rpcctl.cli.main``) maps these to exit codes.

=================  =========  ==================================================
class              exit code  meaning
=================  =========  ==================================================
RpcctlError        1          base; anything rpcctl reports without a traceback
UsageError         2          bad command line (flag values, unknown run, ...)
ConfigError        2          bad config file or override; nothing was spawned
DamagedRunError    1          a run.json or telemetry.db that cannot be read
JobFailedError     1          the job ran and failed (the summary is printed)
JobCancelledError  128 + N    the launcher got signal N (INT, TERM, HUP, QUIT)
=================  =========  ==================================================
"""

from __future__ import annotations


class RpcctlError(Exception):
    exit_code = 1
    reported = False  # True: the message is already on stderr (launch's root-cause report); the boundary only exits


class UsageError(RpcctlError):
    exit_code = 2


class ConfigError(RpcctlError):
    """A config problem, located: ``where`` is ``file:line`` or ``--set key``, ``key`` a dotted path."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, key: str | None = None):
        self.message, self.where, self.key = message, where, key
        parts = [p for p in (where, f"key '{key}'" if key else None) if p]
        super().__init__(f"{': '.join(parts)}: {message}" if parts else message)


class RunNotFoundError(UsageError):
    pass


class DamagedRunError(RpcctlError):
    """A run's record (run.json) or telemetry store exists but cannot be read."""

    def __init__(self, path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path} is damaged: {reason}")


class JobFailedError(RpcctlError):
    exit_code = 1

    def __init__(self, message: str, *, reported: bool = False):
        super().__init__(message)
        self.reported = reported


class JobCancelledError(RpcctlError):
    def __init__(self, message: str, exit_code: int, *, reported: bool = False):
        super().__init__(message)
        self.exit_code, self.reported = exit_code, reported
