"""torchrun's command line as a job: every option of torch 2.13's parser
(``torch.distributed.run.get_args_parser()``), each with what rpcctl does with it.

``OPTIONS`` is the table (docs/torchrun.md is it, checked by tests/test_torchrun_dropin.py
against torch's own parser: a torch release that adds an option fails the suite until it has a
row here). ``line_flags`` turns the options of a line, given or read from the environment as
torchrun's parser reads them (``PET_<OPTION>``: a TrainJob's pod sets them), into config keys,
each with where it came from; an option rpcctl refuses is one ``UsageError`` (exit 2) naming it
and saying what rpcctl does instead, before anything is spawned.

Pure: no I/O, no torch; the machine's CPU and GPU counts are given.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rpcctl.base.errors import UsageError

C10D_DEFAULT_PORT = 29400  # torchrun's port of a c10d endpoint given without one
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


@dataclass(frozen=True)
class TorchrunOption:
    dest: str  # torchrun's argparse dest
    names: tuple[str, ...]  # every spelling torchrun takes (the long one first)
    does: str  # what rpcctl does with it (the docs' second column, the flag's help)
    flag: bool = False  # a switch (no value)
    key: str | None = None  # the config key it sets, if any
    notice: bool = False  # accepted, but rpcctl does it its own way: said once when given
    extra: tuple[str, ...] = ()  # rpcctl's own spellings besides torchrun's (-n)
    metavar: str | None = None  # how its value is written in --help

    @property
    def shown(self) -> str:
        return self.names[0]


def _o(dest: str, spellings: tuple[str, ...], metavar: str | None, does: str, **more: Any) -> TorchrunOption:
    """A row: the long spelling first (its ``--snake_case`` twin added), then the short ones;
    no metavar: a switch."""
    long, *short = spellings
    names = (long, "--" + long[2:].replace("-", "_")) if "-" in long[2:] else (long,)
    return TorchrunOption(dest, (*names, *short), does, flag=metavar is None, metavar=metavar, **more)


OPTIONS: tuple[TorchrunOption, ...] = (  # one row an option, in the order of torch's parser
    _o("nnodes", ("--nnodes",), "N", "nnodes: N, or MIN:MAX (elastic: docs/multinode.md)", key="nnodes"),
    _o(
        "nproc_per_node",
        ("--nproc-per-node",),
        "N|auto|cpu|gpu",
        (
            "nproc_per_node: N, or auto (the GPUs, else the CPUs this process may use), cpu (the CPUs), "
            "gpu (the GPUs; none: exit 2, as torchrun fails)"
        ),
        key="nproc_per_node",
        extra=("-n",),
    ),
    _o(
        "rdzv_backend",
        ("--rdzv-backend",),
        "static|c10d",
        (
            "static or c10d: both are rpcctl's own signed rendezvous (RPCCTL_SECRET) hosted by node 0; "
            "etcd, etcd-v2: exit 2"
        ),
    ),
    _o(
        "rdzv_endpoint",
        ("--rdzv-endpoint",),
        "HOST:PORT",
        (
            "HOST[:PORT] of node 0, which hosts the rendezvous: master_addr and master_port "
            "(PORT: 29400 if left out, as torchrun's c10d; 0, one node: a free port)"
        ),
    ),
    _o("rdzv_id", ("--rdzv-id",), "ID", "rdzv_id: the ranks' TORCHELASTIC_RUN_ID (unset: the run's id)", key="rdzv_id"),
    _o(
        "rdzv_conf",
        ("--rdzv-conf",),
        "KEY=VALUE,...",
        (
            "KEY=VALUE,...: join_timeout (also timeout) is rdzv_timeout; "
            "the other keys tune torch's c10d store and are left out (said once)"
        ),
    ),
    _o("standalone", ("--standalone",), None, "one node on loopback, a free port: what rpcctl does for one node"),
    _o(
        "max_restarts",
        ("--max-restarts",),
        "N",
        "max_restarts: restart every rank after a failure, this many times",
        key="max_restarts",
    ),
    _o(
        "monitor_interval",
        ("--monitor-interval",),
        "SECONDS",
        (
            "checked (seconds > 0), then left out: "
            "the rank server tells rpcctl's supervisor of each rank's exit as it reaps it"
        ),
        notice=True,
    ),
    _o(
        "start_method",
        ("--start-method",),
        "spawn|fork|forkserver",
        (
            "spawn, fork or forkserver: checked; torchrun starts a script with subprocess whatever it says, "
            "so rpcctl keeps its own start_method (fork)"
        ),
    ),
    _o(
        "event_log_handler",
        ("--event-log-handler",),
        "NAME",
        "checked, then left out: rpcctl records a run's events in run.json and telemetry.db",
        notice=True,
    ),
    _o("role", ("--role",), "NAME", "role: the ranks' ROLE_NAME", key="role"),
    _o("module", ("--module", "-m"), None, "module: the script is a module, run as python -m MODULE", key="module"),
    _o(
        "no_python",
        ("--no-python",),
        None,
        (
            "no_python: the script is a program (a shell script, a binary) the rank execs; "
            "telemetry then comes only from the Python processes it starts"
        ),
        key="no_python",
    ),
    _o(
        "run_path",
        ("--run-path",),
        None,
        "accepted: rpcctl's rank bootstrap always runs the script by its path in the rank's own interpreter",
    ),
    _o(
        "log_dir",
        ("--log-dir",),
        "DIR",
        "left out: every rank's whole output is in runs/RUN/logs/rank-N.log (--runs-dir picks the folder)",
        notice=True,
    ),
    _o(
        "redirects",
        ("--redirects", "-r"),
        "STD",
        (
            "checked (0-3 or LOCAL:N,...), then left out: "
            "every rank's output goes to its log file and, per --ranks, to the console"
        ),
        notice=True,
    ),
    _o(
        "tee",
        ("--tee", "-t"),
        "STD",
        (
            "checked (0-3 or LOCAL:N,...), then left out: "
            "every rank's output goes to its log file and, per --ranks, to the console"
        ),
        notice=True,
    ),
    _o(
        "local_ranks_filter",
        ("--local-ranks-filter",),
        "LOCAL,...",
        "LOCAL,...: only these local ranks' output on the console, as --ranks does (logs keep everything)",
    ),
    _o(
        "duplicate_stdout_filters",
        ("--duplicate-stdout-filters",),
        "FILTERS",
        "left out: each rank's whole output is kept in its log file (rpcctl logs --merge reads them)",
        notice=True,
    ),
    _o(
        "duplicate_stderr_filters",
        ("--duplicate-stderr-filters",),
        "FILTERS",
        "left out: each rank's whole output is kept in its log file (rpcctl logs --merge reads them)",
        notice=True,
    ),
    _o("node_rank", ("--node-rank",), "N", "node_rank: this node's rank, 0 to nnodes-1", key="node_rank"),
    _o(
        "master_addr",
        ("--master-addr",),
        "HOST",
        "master_addr: node 0's host, which hosts the rendezvous (one node: loopback)",
        key="master_addr",
    ),
    _o("master_port", ("--master-port",), "PORT", "master_port: the rendezvous port on node 0", key="master_port"),
    _o(
        "local_addr",
        ("--local-addr",),
        "HOST",
        "left out: rpcctl uses this node's interface that routes to node 0 (config: ifname)",
        notice=True,
    ),
    _o(
        "logs_specs",
        ("--logs-specs",),
        "NAME",
        (
            "refused (exit 2): a LogsSpecs plugin of torchrun's; "
            "rpcctl writes each rank's log to runs/RUN/logs/rank-N.log instead"
        ),
    ),
    _o(
        "numa_binding",
        ("--numa-binding",),
        "MODE",
        (
            "refused (exit 2): it binds ranks near their GPUs (no GPU: torchrun fails too); "
            "rpcctl binds no CPUs: wrap the program with numactl (--no-python)"
        ),
    ),
    _o(
        "signals_to_handle",
        ("--signals-to-handle",),
        "SIGNALS",
        (
            "signals_to_handle: the ranks' TORCHELASTIC_SIGNALS_TO_HANDLE; "
            "rpcctl itself stops the job on SIGTERM, SIGINT, SIGHUP and SIGQUIT"
        ),
        key="signals_to_handle",
    ),
    _o(
        "shutdown_timeout",
        ("--shutdown-timeout",),
        "SECONDS",
        "grace: seconds between SIGTERM and SIGKILL when the ranks are stopped",
        key="grace",
    ),
    _o(
        "virtual_local_rank",
        ("--virtual-local-rank",),
        None,
        "virtual_local_rank: LOCAL_RANK 0 in every rank, CUDA_VISIBLE_DEVICES its local rank",
        key="virtual_local_rank",
    ),
)
BY_DEST = {option.dest: option for option in OPTIONS}
# Where the script is named: torchrun's positional arguments (docs/torchrun.md lists them too).
POSITIONALS = {
    "training_script": "SCRIPT (or MODULE with -m, PROGRAM with --no-python)",
    "training_script_args": "ARGS: the script's, untouched",
}
# Options of the line that the form itself handles (what runs, not how).
PROGRAM_DESTS = ("module", "no_python", "run_path")


@dataclass
class LineValues:
    """A line's options as config keys: ``flags`` key → (value, where it came from); ``local_ranks``
    the console filter; ``notices`` one line each for what rpcctl does its own way."""

    flags: dict[str, tuple[Any, str]] = field(default_factory=dict)
    local_ranks: set[int] | None = None
    notices: list[str] = field(default_factory=list)


def pet_name(dest: str) -> str:
    """The environment variable torchrun's parser reads for an option (its ``env`` action)."""
    return f"PET_{dest.upper()}"


def given_or_env(
    given: Mapping[str, tuple[Any, str]], env: Mapping[str, str], skip: tuple[str, ...] = ()
) -> dict[str, tuple[Any, str]]:
    """Each option of the line, else its ``PET_*`` variable (torchrun's default): dest → (value,
    source). ``skip``: options whose variable another reader takes (a pod's node values)."""
    values = dict(given)
    for option in OPTIONS:
        name = pet_name(option.dest)
        if option.dest not in values and option.dest not in skip and env.get(name, "").strip():
            raw = env[name].strip()
            value = raw.lower() in ("1", "true", "yes") if option.flag else raw
            values[option.dest] = (value, f"{name}={raw}")
    return values


def _int(value: Any, source: str, low: int = 0) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UsageError(f"{source}: not an integer") from None
    if number < low:
        raise UsageError(f"{source}: must be {low} or more")
    return number


def _float(value: Any, source: str) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise UsageError(f"{source}: not a number") from None
    if not number > 0 or number == float("inf"):
        raise UsageError(f"{source}: must be a number of seconds above 0")
    return number


_STD = re.compile(r"[0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*")


def nproc_count(value: str, source: str, *, cpus: int, gpus: int) -> int:
    """``--nproc-per-node`` as torchrun's ``determine_local_world_size`` reads it here."""
    text = str(value).strip()
    if text == "cpu":
        return cpus
    if text == "auto":
        return gpus or cpus
    if text == "gpu":
        if not gpus:
            raise UsageError(
                f"{source}: this machine has no GPU (torchrun: 'Cuda is not available'); use a count, auto or cpu"
            )
        return gpus
    if text == "xpu":
        raise UsageError(
            f"{source}: this machine has no XPU (torchrun: 'Xpu is not available'); use a count, auto or cpu"
        )
    if not re.fullmatch(r"[0-9]+", text):
        raise UsageError(f"{source}: not a count of ranks, nor auto, cpu or gpu")
    return _int(text, source)  # 0: the config's own check says it, naming the key


def line_flags(
    values: Mapping[str, tuple[Any, str]], *, cpus: int, gpus: int, node_rank_known: bool = False
) -> LineValues:
    """The config keys of a line's options (``given_or_env``'s values). ``node_rank_known``:
    the environment gives this node's rank (a SLURM step, a pod)."""
    out = LineValues()
    flags = out.flags

    def set_key(key: str, value: Any, source: str) -> None:
        flags[key] = (value, source)

    for dest, (value, source) in values.items():
        option = BY_DEST[dest]
        if option.notice:
            out.notices.append(f"rpcctl: {source}: {option.does}")
        if dest == "nnodes":
            text = str(value).strip()
            low, _, high = text.partition(":")
            nmin = _int(low, source, 1)
            nmax = _int(high, source, 1) if high else nmin
            set_key("nnodes", nmin if nmin == nmax else f"{nmin}:{nmax}", source)  # MIN:MAX: elastic (issue 43)
        elif dest == "nproc_per_node":
            set_key("nproc_per_node", nproc_count(value, source, cpus=cpus, gpus=gpus), source)
        elif dest in ("node_rank", "max_restarts"):
            set_key(option.key, _int(value, source), source)
        elif dest == "master_port":
            port = _int(value, source, 1)
            if port > 65535:
                raise UsageError(f"{source}: not a port (1-65535)")
            set_key("master_port", port, source)
        elif dest in ("master_addr", "role", "rdzv_id"):
            if not str(value).strip():
                raise UsageError(f"{source}: empty")
            set_key(option.key, str(value).strip(), source)
        elif dest == "shutdown_timeout":
            set_key("grace", float(_int(value, source)), source)
        elif dest == "monitor_interval":
            _float(value, source)
        elif dest == "start_method":
            if str(value) not in ("spawn", "fork", "forkserver"):
                raise UsageError(f"{source}: choose spawn, fork or forkserver")
        elif dest in ("redirects", "tee"):
            if not _STD.fullmatch(str(value).strip()):
                raise UsageError(
                    f"{source}: write 0 (none), 1 (stdout), 2 (stderr), 3 (both), or LOCAL:N,... per local rank"
                )
            if str(value).strip() == "0":
                out.notices.pop()  # the default: nothing to say
        elif dest == "local_ranks_filter":
            try:
                out.local_ranks = {int(part) for part in str(value).split(",")}
            except ValueError:
                raise UsageError(f"{source}: write local ranks separated by commas, e.g. 0,1") from None
        elif dest == "signals_to_handle":
            for name in str(value).split(","):
                if name.strip() not in signal.Signals.__members__:
                    raise UsageError(f"{source}: {name.strip()!r} is not a signal's name (SIGTERM, SIGUSR1, ...)")
            set_key("signals_to_handle", ",".join(n.strip() for n in str(value).split(",")), source)
        elif dest == "rdzv_backend":
            if str(value) not in ("static", "c10d"):
                raise UsageError(
                    f"{source}: rpcctl meets the nodes over its own signed rendezvous on node 0 "
                    "(static and c10d mean it): "
                    "drop it, or give --rdzv-backend c10d --rdzv-endpoint NODE0:PORT"
                )
        elif dest == "rdzv_endpoint":
            pass  # below: it names node 0 over --master-addr and --master-port, as torchrun's get_rdzv_endpoint
        elif dest == "rdzv_conf":
            _rdzv_conf(str(value), source, out)
        elif dest == "logs_specs":
            raise UsageError(f"{source}: {option.does.removeprefix('refused (exit 2): ')}")
        elif dest == "numa_binding":
            why = "this machine has no GPU, and torchrun fails there too" if not gpus else "rpcctl binds no CPUs"
            raise UsageError(
                f"{source}: binds each rank to the CPUs near its GPU: {why}; "
                "wrap the program with numactl (--no-python) instead"
            )
        elif dest in ("virtual_local_rank", "no_python"):
            if value:
                set_key(option.key, True, source)
        # module and run_path: the form (-m MODULE, SCRIPT); standalone: below
    endpoint = values.get("rdzv_endpoint")
    if endpoint and str(endpoint[0]).strip():
        host, port = _endpoint(str(endpoint[0]).strip(), endpoint[1])
        set_key("master_addr", host, endpoint[1])
        if port:  # HOST:0, as --standalone's own localhost:0: a free port
            set_key("master_port", port, endpoint[1])
    standalone = values.get("standalone")
    if standalone and standalone[0]:
        flags["nnodes"] = (1, standalone[1])  # torchrun: --standalone is one node whatever --nnodes says
    backend = str(values.get("rdzv_backend", ("static", ""))[0])
    nnodes = flags.get("nnodes", (1, ""))[0]
    if (
        backend == "c10d"
        and isinstance(nnodes, int)
        and nnodes > 1
        and "node_rank" not in flags
        and not node_rank_known
    ):
        raise UsageError(
            f"{values['rdzv_backend'][1]} on {nnodes} nodes: torch's c10d numbers the nodes as they arrive; "
            "rpcctl's rendezvous needs each node's rank: give --node-rank N (a SLURM step or a pod gives it itself)"
        )
    return out


def one_node_master_addr(
    values: Mapping[str, tuple[Any, str]], flags: Mapping[str, tuple[Any, str]]
) -> tuple[str, str] | None:
    """torchrun's MASTER_ADDR on one node, when it is not the address given: ``localhost``
    (its standalone rendezvous, which a line without --master-port and every c10d line get),
    but for a static rendezvous with a port (then --master-addr, 127.0.0.1 by default)."""
    if flags.get("nnodes", (1, ""))[0] != 1:
        return None
    backend = str(values.get("rdzv_backend", ("static", ""))[0])
    if backend == "static" and "master_port" in flags:
        return None
    return "localhost", "torchrun's MASTER_ADDR on one node"


def _endpoint(text: str, source: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:PORT
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    if not host:
        raise UsageError(f"{source}: write HOST:PORT of node 0")
    number = _int(port, source) if port else C10D_DEFAULT_PORT
    if number > 65535:
        raise UsageError(f"{source}: {number} is not a port (1-65535, or 0: a free one)")
    return host, number


_CONF_TIMEOUTS = ("join_timeout", "timeout")


def _rdzv_conf(text: str, source: str, out: LineValues) -> None:
    left = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise UsageError(f"{source}: write KEY=VALUE pairs separated by commas ({part!r} has no '=')")
        if key.strip() in _CONF_TIMEOUTS:
            out.flags["rdzv_timeout"] = (_float(value, source), source)
        elif key.strip() == "last_call_timeout":  # elastic (issue 43): once MIN nodes are there, the wait for more
            out.flags["rdzv_last_call"] = (_float(value, source), source)
        else:
            left.append(key.strip())
    if left:
        out.notices.append(
            f"rpcctl: {source}: {', '.join(left)} left out: they tune torch's c10d store, which rpcctl does not use"
        )
