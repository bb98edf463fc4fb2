"""The listeners of a launch (``rpcctl.records.events``): what the console, telemetry, the hang watchdog
and the other nodes do with what the supervisor says. ``rpcctl.launch.launcher`` subscribes them.

Each is a callable taking one event; events it has no use for pass through untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from rpcctl.console import Console, sanitize
from rpcctl.records.events import (
    AttemptStarted,
    CancelRequested,
    Cancelled,
    Event,
    Failed,
    Notice,
    RankExited,
    RankOutput,
    RankStarted,
    RoundMeeting,
    Restarting,
)


class ConsoleEcho:
    """Finished lines of the ranks shown (``ranks_shown``; every rank when None), prefixed with
    their rank, to stdout; above the live panel while one is drawn (``Console.above``). Rank
    output arrives on the log pump's thread, so a slow terminal never stalls the policy loop."""

    def __init__(self, console: Console, ranks_shown: Iterable[int] | None = None):
        self.console = console
        self.ranks_shown = None if ranks_shown is None else set(ranks_shown)
        self.on = True
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        if not isinstance(event, RankOutput) or not event.final or not self.on:
            return
        if self.ranks_shown is not None and event.rank not in self.ranks_shown:
            return
        shown = f"[rank{event.rank}]: {sanitize(event.text, sgr=True)}"  # colour passes; other escapes are shown
        with self._lock:
            try:
                self.console.stream(shown)
            except OSError:  # `rpcctl launch ... | head`, a closed terminal: keep running, stop echoing
                self.on = False


def console_messages(console: Console):
    """The launcher's own messages: a cancel, a restart, notices. A terminal that is gone (SIGHUP)
    must never stop the teardown that follows: nothing is printed then."""

    def on(event: Event) -> None:
        try:
            match event:
                case CancelRequested(signal=name, grace=grace):
                    console.info(
                        f"rpcctl: {name} received: stopping the job (grace {grace:g}s;"
                        " press Ctrl-C again to kill at once)"
                    )
                case Restarting(restart=restart, of=of, after=after, everywhere=everywhere):
                    where = " on every node" if everywhere else ""
                    console.warn(f"restarting the whole group{where} ({restart}/{of}) after: {after}")
                case Notice(message=message, warning=True):
                    console.warn(message)
                case Notice(message=message):
                    console.info(message)
        except OSError:
            pass

    return on


def telemetry_relay(server: Any):
    """Ranks that start and end, and every state of their lines (for the loss parser), to the
    telemetry server (node 0's store) or forwarder (other nodes). Cheap: each call posts to a queue."""

    def on(event: Event) -> None:
        match event:
            case RankOutput(new=True):
                server.log_line(event.rank, event.text)
            case RankStarted():
                server.rank_started(event.rank, event.pid, event.local_rank, event.device, event.restart)
            case RoundMeeting(restart=restart):
                server.round_meeting(restart)
            case RankExited():
                server.rank_exited(event.rank, event.pid, event.state, event.exit_code)

    return on


def watchdog_relay(watchdog: Any):
    """A line a rank draws is progress (a progress bar that moves too); each attempt starts the
    watch afresh. The supervisor asks the watchdog for its verdict (``check``) itself."""

    def on(event: Event) -> None:
        match event:
            case RankOutput(new=True):
                watchdog.output_line()
            case AttemptStarted(restart=restart):
                watchdog.attempt_started(restart)

    return on


def cluster_relay(cluster: Any, host: str, console: Console):
    """This node's failures and cancels, to the other nodes (through the rendezvous store).
    Another node's failure (``remote``) is theirs to tell."""

    def on(event: Event) -> None:
        match event:
            case Failed(failure=failure, final=final) if failure.reason != "remote":
                info = {
                    "rank": failure.rank,
                    "pid": failure.pid,
                    "exit_code": failure.exit_code,
                    "signal": failure.signal,
                    "message": failure.message,
                    "traceback": failure.traceback,
                    "host": host,
                }
                try:
                    cluster.report_failure(info, final=final)
                except RuntimeError as exc:  # the store is unreachable: the others will time out on it
                    console.warn(f"could not tell the other nodes about the failure: {exc}")
            case Cancelled(reason=reason):
                cluster.report_cancelled(reason)

    return on
