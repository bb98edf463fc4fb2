"""What telemetry cost a run, in CPU time (``telemetry_cost``): the launcher's end-of-run line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.console import human_seconds
from rpcctl.telemetry.reader import StoreReader


@dataclass
class TelemetryCost:
    """What rpcctl's telemetry cost a run, in CPU time, measured by the threads that do it: the
    sender thread of each process and the launcher's server thread. Not included: the hooks
    on the calling threads (about a microsecond per rpc.remote, see
    benchmarks/tracking_overhead.py --micro) and, on a multi-node run, other nodes' relays."""

    processes_cpu_s: float  # every tracked process, all threads, at its last probe
    senders_cpu_s: float
    server_cpu_s: float | None  # None: a store written by an older rpcctl
    share: float | None  # (senders + server) / processes
    refused_messages: int = 0  # malformed lines and events the server counted and dropped

    def describe(self) -> str:
        server = f" + launcher {human_seconds(self.server_cpu_s)}" if self.server_cpu_s is not None else ""
        share = (
            f" = {self.share:.1%} of the processes' {human_seconds(self.processes_cpu_s)}"
            if self.share is not None
            else ""
        )
        refused = f"; {self.refused_messages} malformed telemetry message(s) refused" if self.refused_messages else ""
        return f"telemetry CPU: senders {human_seconds(self.senders_cpu_s)}{server}{share}{refused}"


def telemetry_cost(run_dir: Path) -> TelemetryCost | None:
    """The run's telemetry cost so far (every restart); None before any process reported."""
    with StoreReader(run_dir) as s:
        row = s.cpu_totals()
        if row is None:  # a store written by an older rpcctl, or none yet
            return None
        server = s.meta.get("server_cpu_s")
        refused = s.meta.get("refused_messages")
    if row["cpu"] is None:
        return None
    spent = (row["telemetry"] or 0.0) + (server or 0.0)
    return TelemetryCost(
        row["cpu"],
        row["telemetry"] or 0.0,
        server,
        spent / row["cpu"] if row["cpu"] > 0 else None,
        refused if isinstance(refused, int) else 0,
    )
