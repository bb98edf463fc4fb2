"""The live view of ``rpcctl launch`` on a terminal: rank output scrolls above, a status panel
(ranks, plus telemetry panels when available) stays pinned below it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from rpcctl.supervisor import Supervisor

STATE_STYLE = {"pending": "dim", "running": "cyan", "succeeded": "green", "failed": "bold red", "killed": "yellow"}


class LiveView:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.started = time.monotonic()
        self._live = Live(self, console=supervisor.console.out, refresh_per_second=4, transient=False, redirect_stdout=False, redirect_stderr=False)
        self.console = self._live.console

    def start(self) -> None:
        self._live.start()

    def stop(self) -> None:
        self._live.stop()

    def __rich__(self):
        sup = self.supervisor
        record = sup.record
        elapsed = time.monotonic() - self.started
        restarts = f"  restarts {record.restarts}/{record.max_restarts}" if record.max_restarts else ""
        table = Table(
            title=f"{record.name}  {record.run_id}  {elapsed:.0f}s{restarts}",
            title_justify="left",
            box=None,
            header_style="bold",
            pad_edge=False,
        )
        for column in ("RANK", "PID", "STATE", "DEVICE", "EXIT", "LAST LINE"):
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=60 if column == "LAST LINE" else None)
        for state in record.ranks:
            exit_text = state.signal or ("" if state.exit_code is None else str(state.exit_code))
            tail = sup.tails.get(state.rank)
            table.add_row(
                str(state.rank),
                str(state.pid or "-"),
                f"[{STATE_STYLE.get(state.state, '')}]{state.state}[/]",
                state.device,
                exit_text,
                tail[-1] if tail else "",
                
            )
        parts = [table]
        parts.extend(_telemetry_panels(Path(record.run_dir)))
        return Group(*parts)


def _telemetry_panels(run_dir: Path) -> list:
    from rpcctl.telemetry.dashboard import dashboard_panels

    try:
        return list(dashboard_panels(run_dir))
    except Exception:  # noqa: BLE001 - the view must never take the job down
        return []


