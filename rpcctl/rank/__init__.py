"""Everything that runs inside a rank, and inside the processes a rank starts.

The launcher side never imports this package (it names ``rpcctl.rank.runtime`` as a string:
``python -P -m rpcctl.rank.runtime SCRIPT``, the rank server's forked child), and nothing here
imports the launcher side: only the leaves (``lines``, ``frames``, ``private``, ``devices``,
``states``, ``rpc_settings``, ``python_cmd``, ``stacks``), the wire code both sides share
(``wire.protocol``, ``wire.histogram``) and this package. ``tests/test_rank_side.py``
checks both.

Modules::

    runtime     the in-rank bootstrap: runs the user's script (``python -m rpcctl.rank.runtime``)
    reporter    the rank's telemetry reporter: connects to the run's socket, one sender thread
    autohook    installs the hooks when torch (or monarch) is imported, in processes a rank spawns
    families    the registry: each family's observer, sender processor, after-fork, events (FAMILIES)
    patch       the one module that patches torch.distributed; forwards to the families' observers
    observer    what an observer is (a family's hooks' side): its explicit methods
    _site/      sitecustomize.py, put on the ranks' PYTHONPATH (processes a rank spawns)
    rrefs/      RRef tracking: the hooks' hot path and the sender's Tracker
    calls       RPC call tracking, the hot path: the hooks on rpc_sync / rpc_async / remote
    call_state  the calls family's state: what its hooks keep for its sender, one object
    call_summary  the sender's side of it: counts, long calls, what this process serves
    collectives the Flight Recorder, read by the sender thread
    children    exit codes of the processes a rank started with multiprocessing

Nothing is imported at ``import rpcctl.rank``.
"""
