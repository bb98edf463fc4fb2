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
                         (``launcher_call``); only on a TCP connection that said no hello
=========  ============  ====================================================================

Events (``e``) inside a batch (each field's kind and bounds: ``EVENT_FIELDS``; ``refusal`` says
why an event fails them, and the server drops, and counts, any event that does; which family of
the rank side sends each: ``rank.families``; where the store keeps it: ``store.HANDLERS``):

=========  =========================================================================
event      fields (``t`` is the wall-clock time of the observation, epoch seconds)
=========  =========================================================================
probe      cpu_percent, rss_bytes, threads, device, cuda_visible_devices, gpus,
           gpu_memory_bytes, dropped, cpu_s, telemetry_cpu_s (a heartbeat with the
           process's vital signs)
rpc        name, rpc_rank, world_size, workers {rank: name}, device_maps, devices, rdv (the
           rendezvous: "host:port" or init_method)
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
import math
import os
from pathlib import Path
from typing import Any

from rpcctl.base.lines import MAX_LINE_BYTES
from rpcctl.wire import histogram

ENV_SOCKET = "RPCCTL_TELEMETRY_SOCKET"
ENV_RANK = "RPCCTL_TELEMETRY_RANK"
ENV_RANK_PID = "RPCCTL_TELEMETRY_RANK_PID"
ENV_DISABLE = "RPCCTL_TELEMETRY_DISABLE"

DB_NAME = "telemetry.db"
# A process a rank started with multiprocessing whose run() raised (its parent exits 0 all the
# same): rank/children.py writes it there, the supervisor reads it when the rank exits 0.
RAISED_FILE = "errors/process-{pid}.json"
SOCKET_NAME = "telemetry.sock"

SEND_INTERVAL_S = 0.1  # the sender thread's cycle
PROBE_INTERVAL_S = 1.0  # heartbeat and process probe
MIN_AGE_S = 0.2  # RRefs/handles/values younger than this wait a cycle; if gone by then: churn
STALE_AFTER_S = 5.0  # a running process whose heartbeat is older than this is flagged
# Where a rank's loss records come from, the most direct first: ``inspect.losses`` shows each
# rank's records from the first of these it has ("log": parsed from its printed lines).
LOSS_SOURCES = ("report", "transformers", "lightning", "log")
MAX_QUEUE = 100_000  # events waiting for the sender; beyond this, drop and count
# The longest line the server takes (it drops a connection that sends a longer one). A rank sends
# batches of GIL_SLICE (64) events (``reporter.send_in_slices``); the largest events are an RRef
# value's description with its MAX_STORAGES storages (~20 KB) and the rpc event of a large world
# (its workers and device maps: ~100 bytes a worker), so a rank's longest line is about 1.3 MiB,
# or an rpc event of 40,000 workers: 4 MiB is three times that.
MAX_LINE = 4 * 1024 * 1024

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


# -- what the server takes: every value checked once, here --------------------------------------
# A line from a channel is untrusted (a broken or hostile process of the run's owner). Every field
# of every message, event and parsed rank line (``telemetry.losses``) has a kind and bounds by
# what it means, checked here and nowhere else, so that nothing that passes can fail the store's
# statement (SQLite holds 64-bit integers; a lone surrogate is not UTF-8), overflow what is done
# with it later (Python's float() of a 400-digit integer raises; so does SQLite's SUM past 2^63)
# or print as a 180-digit figure. Counts are per sender cycle and bounded so that 2^31 of them
# still add up in 64 bits (and past that SQLite's ``+`` turns to REAL: it never raises). Floats
# are finite (json.loads takes NaN and Infinity), but for a measured loss or metric, where a
# non-finite value is the news. What fails is refused whole: counted and dropped by the server,
# never raised. None is allowed everywhere (a field not known); fields not listed are ignored.
MIN_INT, MAX_INT = -(2**63), 2**63 - 1  # SQLite's INTEGER


class Field:
    """A field's kind and bounds: ``ok(value)`` (None is always ok); ``what`` names them in a refusal."""

    __slots__ = ("what",)

    def ok(self, value: Any) -> bool:
        raise NotImplementedError


class Int(Field):
    __slots__ = ("lo", "hi")

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi, self.what = lo, hi, f"an integer in [{_bound(lo)}, {_bound(hi)}]"

    def ok(self, value: Any) -> bool:
        return value is None or (type(value) is int and self.lo <= value <= self.hi)  # bool is not an int here


class Real(Field):
    __slots__ = ("lo", "hi")

    def __init__(self, lo: float, hi: float):
        self.lo, self.hi, self.what = lo, hi, f"a finite number in [{_bound(lo)}, {_bound(hi)}]"

    def ok(self, value: Any) -> bool:
        return value is None or (type(value) in (int, float) and self.lo <= value <= self.hi)  # NaN fails both


class Measure(Field):
    """A measured value (a loss, a metric): any float, NaN and ±inf too (a diverged loss is the
    very thing to see), or an integer SQLite holds."""

    __slots__ = ()

    def __init__(self) -> None:
        self.what = "a number (an integer of at most 64 bits)"

    def ok(self, value: Any) -> bool:
        return value is None or type(value) is float or (type(value) is int and MIN_INT <= value <= MAX_INT)


class Flag(Field):
    __slots__ = ()

    def __init__(self) -> None:
        self.what = "true or false"

    def ok(self, value: Any) -> bool:
        return value is None or type(value) is bool


class Text(Field):
    __slots__ = ("most",)

    def __init__(self, most: int):
        self.most, self.what = most, f"a string of at most {most:,} characters"

    def ok(self, value: Any) -> bool:
        if value is None:
            return True
        if type(value) is not str or len(value) > self.most:
            return False
        return value.isascii() or _utf8(value)


class IntText(Field):
    """A mapping's key that spells an integer in [lo, hi] (a rank, a histogram's bucket)."""

    __slots__ = ("number",)

    def __init__(self, lo: int, hi: int):
        self.number = Int(lo, hi)
        self.what = f"a string of {self.number.what}"

    def ok(self, value: Any) -> bool:
        return (
            type(value) is str
            and 0 < len(value) <= 20
            and value.isascii()
            and value.lstrip("-").isdigit()
            and self.number.ok(int(value))
        )


class ListOf(Field):
    __slots__ = ("item", "most")

    def __init__(self, item: Field, most: int):
        self.item, self.most, self.what = item, most, f"a list of at most {most:,} of {item.what}"

    def ok(self, value: Any) -> bool:
        if value is None:
            return True
        ok = self.item.ok
        return type(value) is list and len(value) <= self.most and all(v is not None and ok(v) for v in value)


class Shape(ListOf):
    """A tensor's shape: at most 64 dimensions (torch's own limit), each ≥ 0, their product a
    number of elements that some tensor could have."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(Int(0, 2**53), 64)
        self.what = "a tensor's shape (at most 64 sizes, of at most 2^62 elements in all)"

    def ok(self, value: Any) -> bool:
        return super().ok(value) and (value is None or math.prod(value) <= 2**62)


class MapOf(Field):
    __slots__ = ("key", "value", "most", "nullable")

    def __init__(self, key: Field, value: Field, most: int, nullable: bool = False):
        self.key, self.value, self.most, self.nullable = key, value, most, nullable
        self.what = f"a mapping of at most {most:,} entries, {key.what} to {value.what}"

    def ok(self, value: Any) -> bool:
        if value is None:
            return True
        key_ok, value_ok, nullable = self.key.ok, self.value.ok, self.nullable
        return (
            type(value) is dict
            and len(value) <= self.most
            and all(key_ok(k) and (v is not None or nullable) and value_ok(v) for k, v in value.items())
        )


class Record(Field):
    """A nested object with fields of its own (an RRef's value, a GPU)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Field], what: str):
        self.fields, self.what = fields, what

    def ok(self, value: Any) -> bool:
        return value is None or (type(value) is dict and _first_wrong(value, self.fields) is None)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): json.loads makes one from "\\ud800"
        return False
    return True


def _bound(x: float) -> str:
    """A bound as a person reads it: 2^53, 2^63-1, -2^63."""
    if isinstance(x, int) and abs(x) >= 2**20:
        power = abs(x).bit_length()
        if abs(x) == 2 ** (power - 1):
            return f"{'-' if x < 0 else ''}2^{power - 1}"
        if x == 2**power - 1:
            return f"2^{power}-1"
    return f"{x:g}" if isinstance(x, float) else str(x)


# The kinds, by what a value means.
COUNT = Int(0, 2**32)  # things counted in one sender cycle (calls, errors, collectives)
# a count's change in one cycle (RRefs that churned: -1 takes back a +1 sent the cycle before)
CHANGE = Int(-(2**32), 2**32)
TOTAL = Int(0, 2**53)  # a running count (events dropped since the process started)
BYTES = Int(0, 2**53)  # a size in bytes (8 PiB): memory, a tensor, the arguments of a cycle's calls
SEQ = Int(0, 2**53)  # an id or a sequence number the rank counts up
THREAD = Int(0, MAX_INT)  # a Python thread's ident, a storage's address: a pointer
PID = Int(0, 2**31 - 1)  # pid_max is at most 2^22 on Linux
RANK = Int(-1, 2**31 - 1)
SIZE = Int(0, 2**31 - 1)  # a world's or a group's size, a thread count, a device's index
STEP = Int(-(2**53), 2**53)  # a step or an epoch: a billion a second for 100 days is below 2^53
EXIT = Int(-255, 255)  # an exit status, or minus the number of the signal that ended the process
TIME = Real(0, 2**33)  # a wall-clock time, epoch seconds (1970 to 2242)
# a duration, or the sum of a cycle's (wall-clock differences dip below 0 when the clock steps)
SECONDS = Real(-1e9, 1e12)
CPU = Real(0.0, 1e10)  # CPU seconds of a process (10,000 threads busy for 11 days)
PERCENT = Real(0.0, 1e6)  # CPU percent (100 per busy core)
MEASURE = Measure()
FLAG = Flag()
NAME = Text(1_024)  # a worker's or a host's name, a device, a dtype, a kind, an id
TEXT = Text(4_096)  # a call site, a function, a type, a rendezvous address
MESSAGE = Text(65_536)
MAX_ITEMS = 65_536  # entries of a list or a mapping (a tensor's storages: MAX_STORAGES)
MAX_WORLD = 1 << 20  # workers of an RPC world
MAX_STORAGES = 1_000  # as rrefs.values.MAX_STORAGES
MAX_SHAPE = 64  # a tensor has at most 64 dimensions (torch's own limit)
MAX_BUCKET = histogram.bucket(1e300)  # the histogram's last bucket
SHAPE = Shape()
HIST = MapOf(IntText(0, MAX_BUCKET), COUNT, MAX_BUCKET + 1)
SIZES = ListOf(SHAPE, MAX_ITEMS)
NAMES = ListOf(NAME, MAX_ITEMS)
VALUE = Record(
    {
        "type": TEXT,
        "shape": SHAPE,
        "dtype": NAME,
        "device": NAME,
        "nbytes": BYTES,
        "storages": ListOf(THREAD, MAX_STORAGES),
    },
    "a value's description",
)
GPU = Record(
    {
        "index": SIZE,
        "physical": NAME,
        "name": NAME,
        "total_bytes": BYTES,
        "reserved_bytes": BYTES,
        "allocated_bytes": BYTES,
        "device_used_bytes": BYTES,
    },
    "a GPU's figures",
)

HELLO_FIELDS: dict[str, Field] = {"pid": PID, "ppid": PID, "rank": RANK, "host": NAME, "kind": NAME, "t": TIME}
EVENT_FIELDS: dict[str, dict[str, Field]] = {
    "probe": {
        "cpu_percent": PERCENT,
        "rss_bytes": BYTES,
        "threads": SIZE,
        "device": NAME,
        "cuda_visible_devices": TEXT,
        "gpus": ListOf(GPU, 4_096),
        "gpu_memory_bytes": BYTES,
        "dropped": TOTAL,
        "cpu_s": CPU,
        "telemetry_cpu_s": CPU,
    },
    "rpc": {
        "name": NAME,
        "rpc_rank": RANK,
        "world_size": SIZE,
        "workers": MapOf(IntText(0, 2**31 - 1), NAME, MAX_WORLD),
        "device_maps": MapOf(NAME, MapOf(NAME, NAME, MAX_ITEMS), MAX_WORLD),
        "devices": NAMES,
        "rdv": TEXT,
    },
    "rref": {
        "id": NAME,
        "fork": NAME,
        "owner": NAME,
        "owner_rank": RANK,
        "kind": NAME,
        "callee": NAME,
        "site": TEXT,
        "confirmed": FLAG,
        "value": VALUE,
        "watched": FLAG,
    },
    "conf": {"id": NAME},
    "desc": {"id": NAME, "value": VALUE, "watched": FLAG, "kind": NAME, "site": TEXT},
    "vfree": {"id": NAME},
    "fork": {"id": NAME, "fork": NAME, "owner_rank": RANK, "type": TEXT},
    "rel": {"id": NAME, "fork": NAME},
    "used": {"id": NAME, "fork": NAME},
    "churn": {"owner": NAME, "callee": NAME, "site": TEXT, "n": CHANGE},
    "loss": {
        "step": STEP,
        "epoch": STEP,
        "loss": MEASURE,
        "metrics": MapOf(NAME, MEASURE, MAX_ITEMS, nullable=True),
        "source": NAME,
    },
    "shutdown": {"done": FLAG, "autograd_contexts": TOTAL},
    "join": {},
    "cstat": {
        "callee": NAME,
        "func": TEXT,
        "kind": NAME,
        "n": COUNT,
        "err": COUNT,
        "tmo": COUNT,
        "sum": SECONDS,
        "max": SECONDS,
        "h": HIST,
        "bytes": BYTES,
    },
    "call": {"id": SEQ, "kind": NAME, "callee": NAME, "func": TEXT, "site": TEXT, "thread": THREAD, "nbytes": BYTES},
    "cend": {"id": SEQ, "status": NAME},
    "srv": {"id": SEQ, "thread": THREAD, "func": TEXT, "nbytes": BYTES},
    "send": {"id": SEQ},
    "coll": {
        "pg": NAME,
        "name": NAME,
        "size": SIZE,
        "enq": SEQ,
        "done": SEQ,
        "seq": SEQ,
        "op": NAME,
        "sizes": SIZES,
        "dtypes": NAMES,
        "bytes": BYTES,
        "since": TIME,
        "ranks": ListOf(RANK, MAX_WORLD),
    },
    "cop": {"pg": NAME, "op": NAME, "n": COUNT, "bytes": BYTES, "sum": SECONDS, "max": SECONDS, "h": HIST},
    "cent": {
        "pg": NAME,
        "seq": SEQ,
        "op": NAME,
        "sizes": SIZES,
        "dtypes": NAMES,
        "bytes": BYTES,
        "entered": TIME,
        "completed": TIME,
    },
    "pgjoin": {"call": NAME},
    "pgw": {"rank": RANK, "world_size": SIZE, "rdv": TEXT},
    "error": {"message": MESSAGE},
    "bye": {"dropped": TOTAL},
    "cexit": {"pid": PID, "code": EXIT},
}
# Fields that must be present (the store keys rows by them).
EVENT_REQUIRED: dict[str, tuple[str, ...]] = {
    "rref": ("id",),
    "conf": ("id",),
    "desc": ("id",),
    "vfree": ("id",),
    "fork": ("id",),
    "rel": ("id",),
    "used": ("id",),
    "call": ("id",),
    "cend": ("id",),
    "srv": ("id",),
    "send": ("id",),
    "cstat": ("callee", "func", "kind"),
    "cexit": ("pid", "code"),
    "coll": ("pg", "enq", "done"),
    "cop": ("pg", "op"),
    "cent": ("pg", "seq"),
}
# Another node's launcher calls (``launcher`` messages): each argument, in order; all required
# but an exit code.
LAUNCHER_ARGS: dict[str, tuple[tuple[Field, bool], ...]] = {
    # rank, pid, local_rank, device, restart
    "started": ((RANK, True), (PID, True), (SIZE, True), (NAME, True), (SIZE, True)),
    "exited": ((RANK, True), (PID, True), (NAME, True), (EXIT, False)),  # rank, pid, state, exit_code
    "log": ((RANK, True), (Text(MAX_LINE_BYTES), True)),  # rank, line (at most what the log pump hands on)
}


def declare_event(name: str, fields: dict[str, Field], required: tuple[str, ...] = ()) -> None:
    """An event added at run time (a family registered outside rpcctl: a plugin, a test's toy),
    checked as those above are. The launcher's store keeps it only once it has a handler
    (``telemetry.store.HANDLERS``)."""
    if name in EVENT_FIELDS:
        raise ValueError(f"an event {name!r} is declared already")
    EVENT_FIELDS[name] = dict(fields)
    if required:
        EVENT_REQUIRED[name] = tuple(required)


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) else f"a {type(value).__name__} of {len(value):,}"
    return text if len(text) <= 40 else text[:37] + "..."


def _first_wrong(mapping: dict[str, Any], fields: dict[str, Field]) -> str | None:
    for key, kind in fields.items():
        value = mapping.get(key)
        if value is not None and not kind.ok(value):
            return f"{key}: {_shown(value)} is not {kind.what}"
    return None


def hello_refusal(message: dict[str, Any]) -> str | None:
    """Why a ``hello`` cannot be taken (None: it can)."""
    return _first_wrong(message, HELLO_FIELDS)


def valid_hello(message: dict[str, Any]) -> bool:
    return hello_refusal(message) is None


def refusal(event: Any) -> str | None:
    """Why an event cannot be applied to the store (None: it can): a known kind (``e``), ``t`` a
    time, every listed field of its kind and within its bounds, the keys it is stored under present."""
    if type(event) is not dict:
        return "an event is an object"
    kind = event.get("e")
    fields = EVENT_FIELDS.get(kind) if type(kind) is str else None
    if fields is None:
        return f"e: no event {_shown(kind)}"
    if not TIME.ok(event.get("t")):
        return f"t: {_shown(event.get('t'))} is not {TIME.what}"
    wrong = _first_wrong(event, fields)
    if wrong is not None:
        return wrong
    missing = next((key for key in EVENT_REQUIRED.get(kind, ()) if event.get(key) is None), None)
    return None if missing is None else f"{missing}: missing (the store keys a {kind} event by it)"


def valid_event(event: Any) -> bool:
    return refusal(event) is None


def loss_refusal(step: Any, epoch: Any, loss: Any, metrics: Any) -> str | None:
    """Why a loss record parsed from a rank's line cannot be stored (None: it can): the same
    bounds as a ``loss`` event's."""
    return _first_wrong({"step": step, "epoch": epoch, "loss": loss, "metrics": metrics or None}, EVENT_FIELDS["loss"])


def launcher_call(message: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """A ``launcher`` message's (op, args), or None when it is not one the server can take."""
    op, args = message.get("op"), message.get("args")
    kinds = LAUNCHER_ARGS.get(op) if type(op) is str else None
    if kinds is None or type(args) is not list or len(args) != len(kinds):
        return None
    if not all(kind.ok(arg) and (arg is not None or not required) for arg, (kind, required) in zip(args, kinds)):
        return None
    return op, args


def db_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / DB_NAME
