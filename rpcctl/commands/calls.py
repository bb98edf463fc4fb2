"""``rpcctl inspect calls``: the calls in flight (oldest first), per caller → callee summary,
and what each worker is running for whom. Data from ``rpcctl.inspect.calls``."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from rpcctl import inspect as sdk
from rpcctl.console import render_table
from rpcctl.base.states import CallState, ServingState

HELP = """Who waits on whom: calls running 1 s or more (oldest first), then per caller → callee
    → function: count, p50/p99, errors, pending; then what each worker runs for whom.

    Calls that end within 1 s are counted, not listed. After the run: the same from the store,
    with calls that never ended marked unfinished.
    """


def render(report: sdk.CallsReport, wide: bool = False, no_calls: str = "no calls yet") -> Any:
    title = "Calls in flight (1 s or more), oldest first"
    if report.pending and all(c.state != CallState.PENDING for c in report.pending):
        title = "Calls that never ended"
    pending = render_table(
        report.pending, sdk.PendingCall.COLUMNS, title=title, detail=wide, empty="no call in flight for 1 s or more"
    )
    summary = render_table(
        report.summary, sdk.CallSummary.COLUMNS, title="Per caller → callee", detail=wide, empty=no_calls
    )
    parts: list[Any] = [pending, "", summary]
    running = [s for s in report.serving if s.state != ServingState.DONE]
    if running:
        parts += ["", Text("What the callees are running:", style="bold")]
        parts += [Text(f"  {s.describe()}") for s in running]
    return Group(*parts)
