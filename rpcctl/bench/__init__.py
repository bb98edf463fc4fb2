"""``rpcctl bench``: torch RPC measured against its alternatives, the same way for every row.

Modules::

    suites      what is measured: suites, cases, payloads, quick/full timing
    transports  adapters (rpc and its tuned variants, gloo, tcp, memcpy, ray) + the registry
    measure     the timing loops all adapters share (warm-up, calibration, repeats)
    stats       percentiles, the noise of the repeats, tolerance for comparisons
    unit        the program every rank runs (one *unit* = a transport at a world size)
    runner      plan units and launch each through rpcctl.launch.launcher, following its events
    session     one bench run: progress, the report, the run directory
    results     result records, the JSON document, the per-suite tables
    compare     NEW vs OLD with regressions beyond the noise
    tuning      the --tune search (the settings themselves: rpcctl.base.rpc_settings)

Process picture of one unit::

    rpcctl bench (main thread: launcher.launch; a thread follows events/NN.jsonl → progress)
    └── rank server ── rank 0: unit.py, drives the cases, appends events
                    └── rank 1: unit.py, serves (echo), or trains (train suite)
"""
