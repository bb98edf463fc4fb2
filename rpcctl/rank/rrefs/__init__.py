"""RRef tracking inside a process: hooks on torch.distributed.rpc, and their off-path processing.

Torch keeps no list of RRefs (only counters), so rpcctl wraps what creates and moves them:

===========================================  =================================================
hook                                         what it records (hot path: one tuple appended)
===========================================  =================================================
``rpc.remote`` / ``rpc.api.remote``          a weakref to the new UserRRef, ``to``, ``func``
                                             and the call site (the call itself is untouched)
``rpc.RRef.__init__``                        a weakref to a local OwnerRRef (value on hand)
``_InternalRPCPickler._py_rref_receiver``    a weakref to a fork this process received
``rpc.init_rpc``                             who we are (name, rank, worker list, device
                                             maps); a spawned child joins telemetry here
``rpc.shutdown``                             when shutdown began (RRefs live then: leaks)
===========================================  =================================================

Deleting a handle fires its weakref callback (one more tuple). Everything else runs on the
reporter's sender thread (``Tracker.process``), after ``MIN_AGE_S``: RRefs gone by then are only
counted per call site (``churn``); the others get their ids (``str(rref)``), owner and call
site resolved, and — once the owner confirmed them — a batched ``rpc_async`` per owner asks
the owner to describe the values (``_describe_on_owner``: type, shape, dtype, device, bytes;
it also watches each value, to see it freed). At most ``DESCRIBE_PER_CYCLE`` RRefs per owner
per cycle: a burst of long-lived RRefs is described over the following cycles. So a
short-lived RRef costs its creator a tuple and a dictionary lookup, and its owner nothing.

The wrappers must be installed before ``init_rpc`` (``patch.install``): torch's RPC handler captures
``api.remote`` then, for ``rref.remote()`` proxies. Never called here: ``rref._get_type()``
(caches a Future and breaks later proxy calls) and ``rref._serialize()`` (registers a fork).

Modules::

    hooks     the hot path: the wrappers (``patch`` puts them on torch), OBSERVER (the queue they append to)
    sender    the sender thread: Tracker (queue → events), in_slices (letting go of the GIL)
    values    describe(): type, shape, dtype, device and bytes of a value
"""

from __future__ import annotations

from rpcctl.rank.rrefs import hooks, sender
from rpcctl.rank.rrefs.sender import GIL_SLICE, Tracker, in_slices, pause, tracker
from rpcctl.rank.rrefs.values import describe

__all__ = ["GIL_SLICE", "Tracker", "describe", "hooks", "in_slices", "pause", "sender", "tracker"]
