"""The state machines' words: one ``StrEnum`` per machine, each knowing its terminal states
(TorchX's ``AppState`` is the model). A member *is* its string (``RunStatus.FAILED == "failed"``),
so run.json, the telemetry store and every ``--json`` document hold the same words as before.

A run (``RunRecord.status``)::

    running ──▶ succeeded | failed | cancelled
       └ the launcher is gone while the record says running ──▶ lost (``rpcctl stop`` writes it)
    damaged: a run.json that cannot be read (shown by ``rpcctl runs``, never stored)

A rank (``RankState.state``, the ranks of ``inspect workers``)::

    pending ──▶ running ──▶ succeeded (exit 0) | failed | killed (torn down by rpcctl)
                   ⇅ stopped (SIGSTOP / SIGCONT; shown by the views, never stored)
       └ the launcher died (kill -9) ──▶ lost (gone with it, exit status never recorded)
                                     └─▶ orphaned (still alive, unsupervised: ``rpcctl stop`` kills it)
    exited: a process a rank spawned itself ended (its exit status is not known; one its parent
            reaped through multiprocessing, mp.spawn's, takes succeeded, failed or killed)

An RRef (``RRefRecord.state``): pending (``rpc.remote`` not yet confirmed) ──▶ live ──▶ deleted;
how it ended (``RRefEnding``, ``RRefRecord.ending``): at shutdown, at exit, held unused, or leaked.
Its words hold a space; ``--state`` takes them with a hyphen too (``held-unused``).

An RPC call as its caller saw it (``PendingCall.state``, the store's ``calls.status``)::

    pending ──▶ ok | error | timeout
       └ its process ended first ──▶ unfinished

A function a worker runs for another (``ServingRecord.state``): running ──▶ done | unfinished.

Not a state machine, a category: why a run failed (``FailureReason``, ``Failure.reason``, the
root cause's "reason" in run.json): exited, signal, timeout, hang, launch, launcher, rendezvous,
remote (each member says when).

A leaf module: it imports nothing from rpcctl, so every layer may use it (the ranks too).
"""

from __future__ import annotations

from enum import StrEnum


class _State(StrEnum):
    """A state whose ``is_terminal`` says that nothing more will happen to it."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL[type(self)]

    @classmethod
    def read(cls, value: object, otherwise: _State) -> _State:
        """The member named by ``value`` (text from a store a rank writes to), else ``otherwise``."""
        try:
            return cls(value)
        except ValueError:
            return otherwise


class RunStatus(_State):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the record says running, its launcher is gone: nothing will end it now
    DAMAGED = "damaged"  # run.json cannot be read: what happens to the run is not known


class RankStatus(_State):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"  # its launcher died without ending it; it is gone, its exit status never recorded
    ORPHANED = "orphaned"  # its launcher (and rank server) died and it still lives, unsupervised
    STOPPED = "stopped"  # shown, never stored: a running rank that SIGSTOP (Ctrl-Z, a tracer) stopped
    EXITED = "exited"  # a process a rank spawned itself ended; whether it succeeded is not known


class RRefState(_State):
    PENDING = "pending"
    LIVE = "live"
    DELETED = "deleted"


class RRefEnding(_State):
    """How a deleted RRef ended, once its processes stopped (``inspect/rrefs.py``)."""

    AT_SHUTDOWN = "at shutdown"
    AT_EXIT = "at exit"  # its holder ended without rpc.shutdown() (failed, killed, stopped) still holding it
    HELD_UNUSED = "held unused"  # at shutdown, but unused long before: it kept its value alive for nothing
    LEAKED = "leaked"

    @classmethod
    def from_flag(cls, text: str) -> RRefEnding | None:
        """The ending a ``--state`` value names, spelled as stored (``held unused``) or as a flag
        (``held-unused``); None if it names none."""
        try:
            return cls(text.replace("-", " "))
        except ValueError:
            return None

    @property
    def flag(self) -> str:
        """The spelling a command line takes without quotes: ``held-unused``."""
        return self.value.replace(" ", "-")


class FailureReason(StrEnum):
    """Why a ``Failure`` happened: the category of a root cause (not a state machine)."""

    EXITED = "exited"  # the rank exited with a non-zero code
    SIGNAL = "signal"  # the rank was killed by a signal it did not get from rpcctl
    TIMEOUT = "timeout"  # the job ran past its ``timeout`` (rank -1: found by the launcher)
    HANG = "hang"  # no progress for ``hang_timeout`` (rank -1; its pid is the suspect's)
    LAUNCH = "launch"  # the rank could not be started
    LAUNCHER = "launcher"  # the launcher itself failed, or died without ending the run (rank -1)
    RENDEZVOUS = "rendezvous"  # the nodes could not meet again to restart (rank -1)
    REMOTE = "remote"  # a rank failed on another node (``node``, ``host`` say where)

    @classmethod
    def read(cls, value: object) -> FailureReason | str:
        """The member named by ``value`` (a run.json's word); a word no member has (a newer
        rpcctl's) stays as it is, so that the record still reads."""
        try:
            return cls(value)
        except ValueError:
            return str(value)


class CallState(_State):
    PENDING = "pending"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    UNFINISHED = "unfinished"  # its process ended before the call did


class ServingState(_State):
    RUNNING = "running"
    DONE = "done"
    UNFINISHED = "unfinished"  # its process ended before the function returned


# The terminal states of each machine (``is_terminal``).
TERMINAL: dict[type[_State], frozenset[_State]] = {
    RunStatus: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST}),
    RankStatus: frozenset(
        {RankStatus.SUCCEEDED, RankStatus.FAILED, RankStatus.KILLED, RankStatus.LOST, RankStatus.EXITED}
    ),
    RRefState: frozenset({RRefState.DELETED}),
    RRefEnding: frozenset(RRefEnding),
    CallState: frozenset({CallState.OK, CallState.ERROR, CallState.TIMEOUT, CallState.UNFINISHED}),
    ServingState: frozenset({ServingState.DONE, ServingState.UNFINISHED}),
}
