"""Names, messages and framing of the telemetry channel (worker → launcher, node → node 0).

Each message is one line of UTF-8 JSON: an object whose ``k`` key names it. Nothing is ever
unpickled on either side. Who may connect, and how, is ``channel``'s business.

Messages (``k``), in the order a connection sends them:

=========  ============  ====================================================================
message    sent by       fields
=========  ============  ====================================================================
challenge  node 0        nonce (32 hex digits, fresh per connection). First line on every
                         TCP connection from another node; local connections get none.
auth       other node    mac: hex HMAC-SHA256(run secret, nonce). Must be the first line
                         such a connection sends; anything else (or a wrong mac) ends it.
hello      worker        pid, ppid, host, rank (the launcher's rank, or null), kind (rank |
                         child: a process the rank spawned itself), t. First line of a
                         worker; a connection's batches count only after it.
batch      worker        ev: a list of events (below), at most one per sender cycle
                         (``SEND_INTERVAL_S``); also the heartbeat
launcher   other node    op, args: another node's launcher calls, relayed to node 0:
                         started [rank, pid, local_rank, device, restart],
                         exited [rank, pid, state, exit_code], log [rank, line]
=========  ============  ====================================================================

Events (``e``) inside a batch:

=========  =========================================================================
event      fields (``t`` is the wall-clock time of the observation, epoch seconds)
=========  =========================================================================
probe      cpu_percent, rss_bytes, threads, device, cuda_visible_devices, gpus,
           gpu_memory_bytes, dropped, cpu_s, telemetry_cpu_s (a heartbeat with the
           process's vital signs)
rpc        name, rpc_rank, world_size, workers {rank: name}, device_maps, devices
rref       id, fork, owner, owner_rank, kind (remote|local), callee, site, confirmed,
           value (local RRefs: the value's description)
conf       id (the owner confirmed a pending RRef)
desc       id, value (the owner describes a value: type, shape, dtype, device, nbytes)
vfree      id (the owner's value was freed)
fork       id, fork, owner_rank, type (this process received a user reference)
rel        id, fork (this process dropped a reference)
churn      owner, callee, site, n (RRefs that lived less than MIN_AGE_S: counted, not listed)
loss       step, loss, epoch, metrics
shutdown   (rpc.shutdown() began in this process)
join       (init_rpc() began in this process)
cstat      callee, func, kind, n, err, tmo, sum, max, h {bucket: n} (calls that ended this cycle)
call       id, kind, callee, func, site, thread (a call running for calls.LONG_S; t: its start)
cend       id, status (ok|error|timeout) (a listed call ended)
srv        id, thread, func, nbytes (this process has run func for an incoming call for LONG_S)
send       id (that function returned)
error      message (the sender hit a bug of its own; not stored)
bye        dropped (the worker stopped cleanly)
=========  =========================================================================
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_SOCKET = "RPCCTL_TELEMETRY_SOCKET"
ENV_RANK = "RPCCTL_TELEMETRY_RANK"
ENV_RANK_PID = "RPCCTL_TELEMETRY_RANK_PID"
ENV_DISABLE = "RPCCTL_TELEMETRY_DISABLE"

DB_NAME = "telemetry.db"
SOCKET_NAME = "telemetry.sock"

SEND_INTERVAL_S = 0.1  # the sender thread's cycle
PROBE_INTERVAL_S = 1.0  # heartbeat and process probe
MIN_AGE_S = 0.2  # RRefs/handles/values younger than this wait a cycle; if gone by then: churn
STALE_AFTER_S = 5.0  # a running process whose heartbeat is older than this is flagged
MAX_QUEUE = 100_000  # events waiting for the sender; beyond this, drop and count
MAX_LINE = 16 * 1024 * 1024  # the server drops a connection that sends a longer line

# sun_path is 108 bytes on Linux (104 on macOS), including the terminating NUL.
MAX_SOCKET_PATH = 100


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), allow_nan=True) + "\n").encode()


def decode(line: bytes) -> dict[str, Any] | None:
    """One message, or None for anything that is not one (too long, too deep, not an object):
    a line from a channel is untrusted, and the server counts and drops what this refuses."""
    if len(line) > MAX_LINE:
        return None
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[[[[..." a million deep
        return None
    return message if isinstance(message, dict) else None


# hello: what each field must be (None is always allowed). A wrong type would reach SQLite
# (a mapping as pid: ProgrammingError) or the server's bookkeeping.
HELLO_FIELDS: dict[str, tuple[type, ...]] = {"pid": (int,), "ppid": (int,), "rank": (int,), "host": (str,), "kind": (str,)}


def valid_hello(message: dict[str, Any]) -> bool:
    for key, types in HELLO_FIELDS.items():
        value = message.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return False
    return True


def db_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / DB_NAME
