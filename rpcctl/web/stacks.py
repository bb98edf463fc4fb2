"""``/stacks`` of the live page (``rpcctl web``, ``launch --web``): the native stacks of every
running rank and of every process under it, read from outside when asked (as ``rpcctl stack
--native``: py-spy, each process within ``native_stacks.TIMEOUT_S``), as plain text. Only on
demand, one read at a time (a second request waits for the first's answer): the page's
once-a-second poll never reads a stack."""

from __future__ import annotations

import threading
from pathlib import Path

from rpcctl.base import native_stacks
from rpcctl.base.errors import RpcctlError
from rpcctl.base.states import RankStatus, RunStatus
from rpcctl.console import sanitize
from rpcctl.inspect.stacks import native_stacks_of, native_text
from rpcctl.records.runs import load_record

PATH = "/stacks"
_one_at_a_time = threading.Lock()


def live_native_text(run_dir: Path) -> str:
    """What the page's ``/stacks`` answers: the stacks, or one line saying why there are none."""
    record = load_record(run_dir)
    if record.effective_status != RunStatus.RUNNING:
        return f"run {record.run_id} is not running (status: {record.effective_status}): no live rank to read\n"
    ranks = [r.rank for r in record.ranks if r.state == RankStatus.RUNNING]
    if not _one_at_a_time.acquire(timeout=2 * native_stacks.TIMEOUT_S):
        return "another read of the stacks is under way: ask again in a few seconds\n"
    try:
        dumps = native_stacks_of(run_dir, ranks)
    except RpcctlError as exc:  # a rank ended meanwhile
        return f"{exc}\n"
    finally:
        _one_at_a_time.release()
    said = ""
    if dumps and all(d.dump.refused for procs in dumps.values() for d in procs):
        said = native_stacks.refused_hint().split("; the Python stacks")[0] + " (`rpcctl stack` gives faulthandler's)\n"
    return sanitize(said + native_text(dumps))
