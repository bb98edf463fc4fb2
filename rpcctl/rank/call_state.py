"""The calls family's state, as one explicit object (``STATE``): what its hooks (``calls``, the
hot path) keep for its sender (``call_summary``), which reads this object and nothing else of
the hooks'.

The tables are made here and the hooks bind the same objects as module globals of ``calls``
(cheaper per call than an attribute of an object; ``observer``); a forked child clears them in
place, so the bindings hold. The rest the calls observer sets (``active``, ``workers``, torch's
functions once prepared) or ``calls`` fills in at import (its functions the sender shares).

==================  =============================================================================
attribute           what
==================  =============================================================================
pending             id(call) → call (``calls.Call``), for the timed calls in flight
done                ended timed calls, for the sender
watched             untimed rpc_async calls: (future, to, func, args, code, lasti, tid, t0)
seen_done           (watched, status, when seen): those the caller's thread saw done
untimed             untimed calls that returned: (kind, to, func, method)
in_flight           thread → (to, func, args, start, code, lasti) of its untimed rpc_sync
listed_sync         id(an in_flight entry) → call id, for those the sender listed (it holds them)
listed_ends         (call id, status, when) of those, ended (the hook tells)
serving_now         thread → (python_udf, start) of the call it runs for another worker
workers             rank → worker name, from init_rpc (a new dict each time: the sender's cache of
                    names is keyed by it)
local_invokes       rref_proxy's functions behind rref.rpc_sync().method()
future_done, value  torch._C.Future's own done() and value() (torch.futures wraps each in a frame)
active              telemetry runs: the hooks record
set_sender(tid)     the sender thread's ident (its own calls, RRef descriptions, are not the job's)
proxy_method, ...   ``calls``' functions the sender applies as the hooks do (a call's method, its
                    request bytes, a failure's status)
==================  =============================================================================
"""

from __future__ import annotations

import types
from collections import deque
from typing import Any

TORCH_INTERNAL = "torch.distributed.rpc."  # functions of torch's own protocol: not counted
# A call's first argument of these types is the method a helper runs (``_call_method``).
HELPED = frozenset((types.FunctionType, types.MethodType, types.BuiltinFunctionType))


def _unset(*args: Any) -> Any:
    raise RuntimeError("rpcctl.rank.calls fills this in at import")


class CallsState:
    HELPED = HELPED
    TORCH_INTERNAL = TORCH_INTERNAL

    def __init__(self) -> None:
        self.pending: dict[int, Any] = {}
        self.done: deque[Any] = deque()
        self.watched: deque[tuple[Any, ...]] = deque()
        self.seen_done: deque[tuple[tuple[Any, ...], str, float]] = deque()
        self.untimed: deque[tuple[str, Any, Any, Any]] = deque()
        self.in_flight: dict[int, tuple[Any, ...]] = {}
        self.listed_sync: dict[int, int] = {}
        self.listed_ends: deque[tuple[int, str, float]] = deque()
        self.serving_now: dict[int, tuple[Any, float]] = {}
        self.workers: dict[int, str] = {}
        self.local_invokes: tuple[Any, ...] = ()
        self.future_done: Any = lambda fut: fut.done()
        self.future_value: Any = lambda fut: fut.value()
        self.active = False
        self.set_sender: Any = _unset
        self.proxy_method: Any = _unset
        self.sent_bytes: Any = _unset
        self.failure: Any = _unset

    def sender_is(self, tid: int) -> None:
        self.set_sender(tid)


STATE = CallsState()
