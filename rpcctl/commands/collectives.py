"""``rpcctl inspect collectives``: per process group and op (count, p50/p99, bytes), then per rank
the last collective entered and completed and the one it is inside now. Data from
``rpcctl.inspect.collectives``."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from rpcctl import inspect as sdk
from rpcctl.console import render_table

HELP = """Collectives of every process group (all_reduce, broadcast, barrier…), from torch's Flight
    Recorder: per group and op, count, p50/p99 time and bytes; per rank, the last collective
    entered and completed, and while the run lives, the one it is inside and for how long.

    PG names a group the same way on every rank: its c10d name (the default group is 0,
    new_group's 1, 2... in the order the script makes them), rpc for RPC's own gloo group;
    --wide adds its MEMBERS. RANK is the process's rank in its process group's world: in a
    script that mp.spawns its own workers, each worker's rank, not the rank that spawned them;
    a script that spawns twice has two worlds, and the second one's groups read w1:NAME. Times
    are upper bounds (gloo records no completion time). A rank whose torch has no Flight
    Recorder (before 2.5) shows none.
    """


def render(report: sdk.CollectivesReport, wide: bool = False, empty: str = "no collectives yet") -> Any:
    """``empty``: the line for a view with nothing in it (``inspect.none_yet``: "yet" only while the run goes on),
    said once."""
    if not report.summary and not report.ranks and not report.stragglers:
        return Text(empty)
    summary = render_table(
        report.summary, sdk.CollectiveSummary.COLUMNS, title="Per process group and op", detail=wide, empty=empty
    )
    ranks = render_table(report.ranks, sdk.RankCollectives.COLUMNS, title="Per rank", detail=wide, empty=empty)
    parts: list[Any] = [summary, "", ranks]
    if report.stragglers:
        parts += [
            "",
            render_table(
                report.stragglers, sdk.CollectiveStraggler.COLUMNS, title="Stragglers (arrival skew)", detail=wide
            ),
        ]
    return Group(*parts)
