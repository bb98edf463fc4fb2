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

Events (``e``) inside a batch (each field's type: ``EVENT_FIELDS``; ``valid_event`` checks them
and the server drops, and counts, any event that fails):

=========  =========================================================================
event      fields (``t`` is the wall-clock time of the observation, epoch seconds)
=========  =========================================================================
probe      cpu_percent, rss_bytes, threads, device, cuda_visible_devices, gpus,
           gpu_memory_bytes, dropped, cpu_s, telemetry_cpu_s (a heartbeat with the
           process's vital signs)
rpc        name, rpc_rank, world_size, workers {rank: name}, device_maps, devices, rdv (the rendezvous: "host:port" or init_method)
rref       id, fork, owner, owner_rank, kind (remote|local), callee, site, confirmed,
           value (local RRefs: the value's description)
conf       id (the owner confirmed a pending RRef)
desc       id, value (the owner describes a value: type, shape, dtype, device, nbytes)
vfree      id (the owner's value was freed)
fork       id, fork, owner_rank, type (this process received a user reference)
rel        id, fork (this process dropped a reference)
used       id, fork (when rpc.shutdown() began: this process last used its reference at
           ``t``: to_here, local_value, a proxy call, or sent it in a call)
churn      owner, callee, site, n (RRefs that lived less than MIN_AGE_S: counted, not listed)
loss       step, loss, epoch, metrics, source (absent: rpcctl.report; a library's name: its
           trainer's callback, ``steps``)
shutdown   done, autograd_contexts (rpc.shutdown() began in this process; with done: it returned,
           with so many distributed autograd contexts still open)
join       (init_rpc() began in this process)
cstat      callee, func, kind, n, err, tmo, sum, max, h {bucket: n}, bytes (calls that ended this
           cycle; sum, h and bytes over the timed ones: bytes of their tensor arguments)
call       id, kind, callee, func, site, thread, nbytes (a call running for calls.LONG_S; t: its start)
cend       id, status (ok|error|timeout) (a listed call ended)
srv        id, thread, func, nbytes (this process has run func for an incoming call for LONG_S)
send       id (that function returned)
coll       pg, name, size, enq, done (a process group's last collective entered and completed,
           by sequence number); seq, op, sizes, dtypes, bytes, since (the one in flight, once
           read: ``collectives``)
cop        pg, op, n, bytes, sum, max, h (collectives of a group that completed since the last
           read: count, input bytes, durations as cstat's histogram)
cent       pg, seq, op, sizes, dtypes, bytes, entered, completed (one sampled collective)
pgjoin     call (init_process_group or new_group began in this process)
pgw        rank, world_size, rdv (who the process is in the c10d world init_process_group made:
           ``dist.get_rank()``, its size, where it met the others; sent before its groups)
error      message (the sender hit a bug of its own; not stored)
bye        dropped (the worker stopped cleanly)
cexit      pid, code (a process this one started with multiprocessing ended: its exit code, or
           minus its signal's number; ``rank.children``)
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
# Where a rank's loss records come from, the most direct first: ``inspect.losses`` shows each
# rank's records from the first of these it has ("log": parsed from its printed lines).
LOSS_SOURCES = ("report", "transformers", "lightning", "log")
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


# Events: what each field must be, checked by the server before the store sees the event (a
# field of another type is a hostile or broken sender: the whole event is dropped and counted).
# None is allowed everywhere (a field not known); fields not listed here are ignored. Nested
# values have their own shapes (below). ``t`` is checked on every event.
_NUM = (int, float)
MIN_INT, MAX_INT = -(2**63), 2**63 - 1  # SQLite's INTEGER
_STR = (str,)
_INT = (int,)
_BOOL = (bool,)
EVENT_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "probe": {"cpu_percent": _NUM, "rss_bytes": _INT, "threads": _INT, "device": _STR, "cuda_visible_devices": _STR,
              "gpus": (list,), "gpu_memory_bytes": _INT, "dropped": _INT, "cpu_s": _NUM, "telemetry_cpu_s": _NUM},
    "rpc": {"name": _STR, "rpc_rank": _INT, "world_size": _INT, "workers": (dict,), "device_maps": (dict,), "devices": (list,),
            "rdv": _STR},
    "rref": {"id": _STR, "fork": _STR, "owner": _STR, "owner_rank": _INT, "kind": _STR, "callee": _STR, "site": _STR,
             "confirmed": _BOOL, "value": (dict,), "watched": _BOOL},
    "conf": {"id": _STR},
    "desc": {"id": _STR, "value": (dict,), "watched": _BOOL, "kind": _STR, "site": _STR},
    "vfree": {"id": _STR},
    "fork": {"id": _STR, "fork": _STR, "owner_rank": _INT, "type": _STR},
    "rel": {"id": _STR, "fork": _STR},
    "used": {"id": _STR, "fork": _STR},
    "churn": {"owner": _STR, "callee": _STR, "site": _STR, "n": _INT},
    "loss": {"step": _INT, "epoch": _INT, "loss": _NUM, "metrics": (dict,), "source": _STR},
    "shutdown": {"done": (bool,), "autograd_contexts": _INT},
    "join": {},
    "cstat": {"callee": _STR, "func": _STR, "kind": _STR, "n": _INT, "err": _INT, "tmo": _INT, "sum": _NUM, "max": _NUM, "h": (dict,), "bytes": _INT},
    "call": {"id": _INT, "kind": _STR, "callee": _STR, "func": _STR, "site": _STR, "thread": _INT, "nbytes": _INT},
    "cend": {"id": _INT, "status": _STR},
    "srv": {"id": _INT, "thread": _INT, "func": _STR, "nbytes": _INT},
    "send": {"id": _INT},
    "coll": {"pg": _STR, "name": _STR, "size": _INT, "enq": _INT, "done": _INT, "seq": _INT, "op": _STR, "sizes": (list,),
             "dtypes": (list,), "bytes": _INT, "since": _NUM, "ranks": (list,)},
    "cop": {"pg": _STR, "op": _STR, "n": _INT, "bytes": _INT, "sum": _NUM, "max": _NUM, "h": (dict,)},
    "cent": {"pg": _STR, "seq": _INT, "op": _STR, "sizes": (list,), "dtypes": (list,), "bytes": _INT, "entered": _NUM, "completed": _NUM},
    "pgjoin": {"call": _STR},
    "pgw": {"rank": _INT, "world_size": _INT, "rdv": _STR},
    "error": {"message": _STR},
    "bye": {"dropped": _INT},
    "cexit": {"pid": _INT, "code": _INT},
}
# Fields that must be present (the store keys rows by them).
EVENT_REQUIRED: dict[str, tuple[str, ...]] = {
    "rref": ("id",), "conf": ("id",), "desc": ("id",), "vfree": ("id",), "fork": ("id",), "rel": ("id",), "used": ("id",),
    "call": ("id",), "cend": ("id",), "srv": ("id",), "send": ("id",), "cstat": ("callee", "func", "kind"),
    "cexit": ("pid", "code"),
    "coll": ("pg", "enq", "done"), "cop": ("pg", "op"), "cent": ("pg", "seq"),
}
_VALUE_FIELDS: dict[str, tuple[type, ...]] = {"type": _STR, "shape": (list,), "dtype": _STR, "device": _STR, "nbytes": _INT,
                                              "storages": (list,)}
MAX_STORAGES = 1_000  # as rrefs.values.MAX_STORAGES
_GPU_FIELDS: dict[str, tuple[type, ...]] = {"index": _INT, "physical": _STR, "name": _STR, "total_bytes": _INT,
                                            "reserved_bytes": _INT, "allocated_bytes": _INT, "device_used_bytes": _INT}
MAX_SHAPE = 64  # a tensor has at most 64 dimensions (torch's own limit)


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    # bool is an int to Python; only a field that asks for bool takes one. An int is one SQLite
    # can store (64 bits): a larger one would fail the store's statement half-way through an event.
    if value is None:
        return True
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int):
        return int in types and MIN_INT <= value <= MAX_INT
    return isinstance(value, types)


def _fields_ok(mapping: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> bool:
    return all(_typed(mapping.get(key), types) for key, types in fields.items())


def _nested_ok(kind: str, event: dict[str, Any]) -> bool:
    value = event.get("value")
    if isinstance(value, dict):
        if not _fields_ok(value, _VALUE_FIELDS):
            return False
        shape = value.get("shape")
        if shape is not None and (len(shape) > MAX_SHAPE or not all(_typed(d, _INT) and d is not None for d in shape)):
            return False
        storages = value.get("storages")
        if storages is not None and (len(storages) > MAX_STORAGES or not all(_typed(d, _INT) and d is not None for d in storages)):
            return False
    if kind == "rpc":
        workers, maps, devices = event.get("workers"), event.get("device_maps"), event.get("devices")
        if workers and not all(isinstance(k, str) and k.lstrip("-").isdigit() and isinstance(v, str) for k, v in workers.items()):
            return False
        if maps and not all(isinstance(m, dict) and all(isinstance(a, str) and isinstance(b, str) for a, b in m.items()) for m in maps.values()):
            return False
        if devices and not all(isinstance(d, str) for d in devices):
            return False
    elif kind == "loss":
        metrics = event.get("metrics")
        if metrics and not all(_typed(v, _NUM) for v in metrics.values()):
            return False
    elif kind in ("coll", "cent"):
        sizes, dtypes = event.get("sizes"), event.get("dtypes")
        if sizes and not all(isinstance(s, list) and len(s) <= MAX_SHAPE and all(_typed(d, _INT) and d is not None for d in s) for s in sizes):
            return False
        if dtypes and not all(isinstance(d, str) for d in dtypes):
            return False
        ranks = event.get("ranks") if kind == "coll" else None
        if ranks and (len(ranks) > 1 << 20 or not all(_typed(r, _INT) and r is not None and 0 <= r < 2**31 for r in ranks)):
            return False
    elif kind in ("cstat", "cop"):
        hist = event.get("h")
        if hist and not all(k.isdigit() and _typed(v, _INT) and v is not None for k, v in hist.items()):
            return False
    elif kind == "probe":
        gpus = event.get("gpus")
        if gpus and not all(isinstance(g, dict) and _fields_ok(g, _GPU_FIELDS) for g in gpus):
            return False
    return True


def valid_event(event: Any) -> bool:
    """True for an event the store may apply: a known kind (``e``), every listed field of its
    type, the keys it is stored under present, nested values of their shapes."""
    if not isinstance(event, dict):
        return False
    kind = event.get("e")
    fields = EVENT_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None or not _typed(event.get("t"), _NUM):
        return False
    if not _fields_ok(event, fields) or any(event.get(key) is None for key in EVENT_REQUIRED.get(kind, ())):
        return False
    return _nested_ok(kind, event)


def db_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / DB_NAME
