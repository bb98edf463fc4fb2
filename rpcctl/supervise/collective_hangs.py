"""What the hang watchdog says about collectives (issue 27): who waits in which collective, who
has not entered it, and who called another one at the same sequence number.

Input: the process groups of the live processes, as the SDK gives them (``inspect.progress``'s
``StoredGroup``s, from ``rank.collectives``: per process and group, the last collective entered
and completed, and the one in flight with its op and sizes) and the watchdog's ``Proc``s (stacks
dumped). Pure: no I/O here, no store column.

For each process group with ranks inside collective #k (entered k, completed k - 1):

- a rank of the group that entered fewer than k collectives *has not entered it*: it is named
  with where its main thread is (``ranks 0, 1 wait in all_reduce #5 (pg 0, 4.0 KiB float) for
  10 s; rank 2 has not entered it: it is at train.py:31 in load_batch (`time.sleep(600)`)``);
- ranks inside #k with different ops, or sizes, are a *mismatch* (``rank 1 called broadcast #4
  where ranks 0, 2 called all_reduce #4``).

Which ranks a group has: its members as c10d gave them to the ranks that reported it (the rows'
``members``), so a member that never entered the group's first collective, or never reached it,
is named too, and a rank of no such group is never said to be missing from it; and for the
default group every rank that entered ``init_process_group``. Groups are matched across ranks
by their name (``rank.collectives``), never by the recorder's per-process id. A store before
schema 9 has no members: the ranks that reported the group.

When several groups have a rank that has not entered their collective (rank 2 sleeps; rank 1
waits for it in their pair's all_reduce, rank 0 for both in the default group's barrier), the
verdict names the one whose missing rank waits in no collective: the others wait on it.

A rank here is the process's rank in its c10d world (``dist.get_rank()``): in a job whose
script ``mp.spawn``s its workers, a process the launcher rank spawned, named with its pid and
its parent (``rank 2 (pid 4242, spawned by rank 0) has not entered it``); its stack is the one
it registered for ``rpcctl stack``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rpcctl.console import human_seconds
from rpcctl.inspect import StoredGroup
from rpcctl.inspect.collectives import in_flight


@dataclass
class CollectiveVerdict:
    headline: str
    details: list[str]
    suspect: Any  # the watchdog's Proc, or None


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def _who(rows: list[StoredGroup], by_proc: dict[Any, Any]) -> str:
    """``rank 2``, or for a process a rank spawned ``rank 2 (pid 4242, spawned by rank 0)``."""
    spawned = [by_proc.get(r.proc_id) for r in rows]
    if len(rows) != 1 or spawned[0] is None or spawned[0].kind == "rank":
        return _ranks([r.rank for r in rows])
    return f"rank {rows[0].rank} (pid {spawned[0].pid}, spawned by rank {spawned[0].rank})"


def _what(row: StoredGroup) -> tuple[Any, ...]:
    return (row.cur_op, row.cur_sizes, row.cur_dtypes)


def _absent(pg: str, rows: list[StoredGroup], procs: list[Any], by_proc: dict[Any, Any]) -> list[StoredGroup]:
    """Processes of group ``pg`` with no row for it: its members (the ranks c10d gave the group)
    that reported nothing of it, and for the default group every rank that entered
    init_process_group (it is in it even before its first collective)."""
    present = {r.proc_id for r in rows}
    world = {getattr(by_proc.get(r.proc_id), "pg_world", 0) for r in rows}
    ranks = next((r.members for r in rows if r.members is not None), None)
    default = rows[0].is_default
    absent = []
    for p in procs:
        rank = p.dist_rank if p.dist_rank is not None else p.rank if p.kind == "rank" else None
        if (
            p.proc_id in present
            or p.pg_world not in world
            or rank is None
            or p.dist_rank is None
            and p.pg_joined_at is None
        ):
            continue  # a process that has not entered init_process_group is absent_from_groups' to name
        if (ranks is not None and rank in ranks) or (default and (p.kind == "rank" or p.dist_rank is not None)):
            absent.append(StoredGroup(p.proc_id, rank, pg, 0, 0, None, None, None, None, None, None, None, None))
    return absent


def verdict(rows: list[StoredGroup], procs: list[Any], now: float, where: Any) -> CollectiveVerdict | None:
    """The collective hang among ``rows`` (the process groups of live ranks), or None if no rank waits in
    a collective. ``where(proc)``: the text for where a process's main thread is."""
    by_proc = {p.proc_id: p for p in procs}
    groups: dict[str, list[StoredGroup]] = defaultdict(list)
    for row in rows:
        groups[row.pg].append(row)
    waiting_somewhere = {r.proc_id for r in rows if r.entered > r.completed}
    details: list[str] = []
    found: list[tuple[int, int, CollectiveVerdict]] = []  # (how much of it other collectives explain, order, verdict)
    for order, (pg, rows_of) in enumerate(
        sorted(groups.items(), key=lambda kv: -max(r.entered - r.completed for r in kv[1]))
    ):
        inside = [r for r in rows_of if r.entered > r.completed]
        if not inside:
            continue
        k = max(r.entered for r in inside)
        waiting = [r for r in inside if r.entered == k]
        described = [r for r in waiting if r.cur_seq == k and r.cur_op]
        for r in inside:
            what = in_flight(r) or f"collective #{r.entered}"
            since = f" for {human_seconds(now - r.cur_since)}" if r.cur_since else ""
            details.append(f"rank {r.rank} is inside {what} of pg {pg}{since}")
        kinds: dict[tuple[Any, ...], list[StoredGroup]] = defaultdict(list)
        for r in described:
            kinds[_what(r)].append(r)
        if len(kinds) > 1:
            ordered = sorted(kinds.values(), key=len)
            odd, usual = ordered[0], [r for group in ordered[1:] for r in group]
            same_op = odd[0].cur_op == usual[0].cur_op
            headline = (
                f"collective mismatch in pg {pg}: {_ranks([r.rank for r in odd])} called {odd[0].cur_op} #{k}"
                + (f" with other sizes ({in_flight(odd[0])})" if same_op else "")
                + f" where {_ranks([r.rank for r in usual])} called {usual[0].cur_op} #{k}"
                + (f" ({in_flight(usual[0])})" if same_op else "")
            )
            found.append((0, order, CollectiveVerdict(headline, details, by_proc.get(odd[0].proc_id))))
            continue
        behind = [r for r in rows_of if r.entered < k] + _absent(pg, rows_of, procs, by_proc)
        if not behind:
            continue
        first = described[0] if described else waiting[0]
        op = in_flight(first) or f"collective #{k}"
        label = op.replace(f" #{k} (", f" #{k} (pg {pg}, ") if " (" in op else f"{op} (pg {pg})"
        waited = f" for {human_seconds(now - first.cur_since)}" if first.cur_since else ""
        # The missing rank to follow: one that waits in no collective of its own (the others wait on it),
        # the furthest behind.
        suspect_row = min(behind, key=lambda r: (r.proc_id in waiting_somewhere, r.entered))
        suspect = by_proc.get(suspect_row.proc_id)
        at = where(suspect) if suspect is not None else None
        if suspect is not None and suspect.stopped:
            state = "it is stopped (SIGSTOP)"
        else:
            state = f"it is at {at}" if at else "its stack did not come"
        headline = (
            f"{_ranks([r.rank for r in waiting])} {'waits' if len(waiting) == 1 else 'wait'} in {label}{waited}; "
            f"{_who(behind, by_proc)} {'has' if len(behind) == 1 else 'have'} not entered it"
            + (f" (last entered #{suspect_row.entered})" if suspect_row.entered else "")
            + f": {state}"
        )
        # 0: none of the missing waits elsewhere (this group's wait is the root); 1: some do; 2: even the suspect does.
        elsewhere = [r.proc_id in waiting_somewhere for r in behind]
        found.append(
            (
                2 if suspect_row.proc_id in waiting_somewhere else int(any(elsewhere)),
                order,
                CollectiveVerdict(headline, details, suspect),
            )
        )
    return min(found, key=lambda f: f[:2])[2] if found else None


def absent_from_groups(procs: list[Any]) -> list[Any]:
    """Ranks that have not entered init_process_group while another rank has."""
    if not any(p.pg_joined_at is not None for p in procs if p.kind == "rank"):
        return []
    return [p for p in procs if p.kind == "rank" and p.pg_joined_at is None]
