"""Telemetry: what every rank (and every process a rank starts) reports, and the store it lands in.

Process tree and data flow::

    launcher process (no torch)                        rank processes (torch)
    ─────────────────────────                          ──────────────────────
    TelemetryServer ── one thread ── SQLite (WAL)      reporter.start(): hooks + one sender thread
       ▲  <run_dir>/telemetry.db (the only writer)        │ hot path: append a tuple to a bounded
       │                                                  │ deque (drop + count when full)
       │  Unix socket <run_dir>/telemetry.sock (0600,     │ sender thread, every 0.1 s: resolve ids,
       │  peer uid checked), newline-delimited JSON ◀─────┘ filter short-lived RRefs, send one batch
       │  (never pickle)                                 processes a rank spawns itself (mp.spawn):
       │                                                  sitecustomize on PYTHONPATH installs the
       │                                                  same hooks when torch.distributed.rpc is
       │                                                  imported; joins at init_rpc(), or
       │                                                  at once in a Monarch mesh process
       ├── log_line(rank, line): losses parsed from unmodified prints (``losses.py``)
       └── rank_started / rank_exited: the launcher's own view of each rank

    readers: rpcctl.inspect (SDK) ── rpcctl inspect ... / the live dashboard / leaked_rrefs()

Environment contract (``TelemetryServer.start()`` returns the first two; the rank's
``rank.reporter.start()`` adds the rest for the processes it spawns):

==========================  =========================================================
variable                    meaning
==========================  =========================================================
RPCCTL_TELEMETRY_SOCKET     path of the run's Unix socket; no telemetry when unset
PYTHONPATH                  prefixed with the sitecustomize folder (``rank/_site``)
RPCCTL_TELEMETRY_RANK       the launcher rank a process descends from
RPCCTL_TELEMETRY_RANK_PID   the pid of that rank: any other pid is a spawned child
RPCCTL_TELEMETRY_DISABLE    set to 1 to switch tracking off (benchmarks)
==========================  =========================================================

Modules: ``protocol`` and ``histogram`` (the wire: shared by both sides), ``server``, ``store``,
``channel`` and ``forward`` (inside the launcher), ``losses`` (the log parser), ``dashboard``
(panels for the live view). What runs inside ranks is the ``rpcctl.rank`` package (the
reporter, the hooks, ``_site/sitecustomize.py``), which this package never imports.
"""
