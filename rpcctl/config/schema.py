"""The spec: what a config may say, as frozen pydantic models (``JobSpec`` and its parts).

Plain data, no I/O: ``plan`` turns a ``JobSpec`` into a ``LaunchPlan``. Types are strict: a
quoted ``"4"`` is not an integer and ``1`` is not ``true``; a value that ``${VAR}`` expansion
produced (an ``Expanded``) is read as its field's type. A validator's error about one entry of
a list or mapping raises ``EntryError``, so that the error names that entry's key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rpcctl.config.variables import Expanded
from rpcctl.base.linear_re import compile_linear

DEFAULT_PRELOAD = ["torch", "torch.distributed.rpc"]


_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][-+]?\d+)?")


def _strict_number(value: Any, kind: type) -> Any:
    """Before pydantic's own check: refuse what lax coercion would silently accept."""
    if isinstance(value, bool):  # YAML's `true` would otherwise pass as the integer 1
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, Expanded):  # `${N}`: the environment only has strings
        text = value.strip()
        if re.fullmatch(r"[-+]?\d+", text) or kind is float and _NUMBER.fullmatch(text):
            value = kind(text)  # a fraction for an int is left to pydantic's own message
    elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        if "e" in text.lower() and "." not in text:  # YAML 1.1 reads a float only with a dot
            raise ValueError(
                f"expected a number, got the string {value!r}: YAML 1.1 needs a dot in a float, e.g. 1.0e+3"
            )
        raise ValueError(f"expected a number, got the string {value!r}: write {text} without quotes")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return value


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool) or isinstance(value, Expanded):  # `${FLAG}`: pydantic reads true/false/1/0
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        raise ValueError(
            f"expected true or false, got the string {value!r}: write {value.strip().lower()} without quotes"
        )
    if isinstance(value, (int, float)):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


# Strict scalar types for the spec: a string is never silently a number, nor a number a boolean.
Int = Annotated[int, BeforeValidator(lambda v: _strict_number(v, int))]
Float = Annotated[float, BeforeValidator(lambda v: _strict_number(v, float)), Field(allow_inf_nan=False)]
Bool = Annotated[bool, BeforeValidator(_strict_bool)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RpcSpec(_Spec):
    """``rpc:`` — have rpcctl call ``init_rpc`` before the script and ``shutdown`` after it."""

    init: Bool = False
    name: str = "worker{rank}"  # worker name template: {rank}, {local_rank}
    rpc_timeout: Float = Field(60.0, gt=0)
    num_worker_threads: Int = Field(16, ge=1)
    # {remote worker name: {local device: remote device}}, as TensorPipeRpcBackendOptions takes.
    device_maps: dict[str, dict[str, str]] = Field(default_factory=dict)
    devices: list[str] = Field(default_factory=list)
    # auto: the single-node settings `rpcctl bench --tune` found good (shared-memory transport,
    # huge-page allocation); see docs/bench.md. Your own `env:` still wins.
    tuning: Literal["off", "auto"] = "off"

    @field_validator("name")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(rank=0, local_rank=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"bad name template {value!r}: only {{rank}} and {{local_rank}} may appear") from exc
        return value


class LossesSpec(_Spec):
    """``losses:`` — how losses are captured from each rank's printed output."""

    # A regex with a named group ``loss`` (and optionally ``step``, ``epoch``).
    pattern: str | None = None

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if "loss" not in compile_linear(value).groupindex:  # RE2, the loss parser's engine
            raise ValueError("the pattern needs a named group (?P<loss>...)")
        return value


Scalar = str | int | float | bool


# A host name as resolvers take it (RFC 1123, RFC 1035 2.3.4): labels of 1 to 63 characters
# joined by dots (one trailing dot: the root), 253 in all; letters, digits, '-' and '_' (which
# some site names hold), or non-ASCII letters (IDNA). Python's resolver raised UnicodeError (a
# traceback, not an error) on an empty label or one over 63.
_HOST_LABEL = re.compile(r"[A-Za-z0-9_-]+")


def host_problem(value: str) -> str | None:
    """Why ``value`` is neither an IP address nor a host name a resolver can be asked about
    (``master_addr``, ``--master-addr``, ``$PET_MASTER_ADDR``), or None."""
    import ipaddress

    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") and value != "." else value
    if not name:
        return "it is empty"
    if len(name) > 253:
        return f"it is {len(name)} characters; a host name has at most 253"
    for label in name.split("."):
        if not label:
            return (
                "it has an empty label (two dots in a row, or a dot at its start): "
                "a host name is labels joined by single dots"
            )
        if not _HOST_LABEL.fullmatch(label):
            odd = next((c for c in label if not c.isalnum() and c not in "-_"), None)
            if odd is not None:
                return f"it holds {odd!r}, which no host name does (letters, digits, '-', '_' and '.')"
            try:
                label = label.encode("idna").decode("ascii")
            except UnicodeError:
                return f"its label {label!r} is not a host name's"
        if len(label) > 63:
            return f"it has a label of {len(label)} characters ({label[:16]}...); a DNS label has at most 63"
    return None


class EntryError(ValueError):
    """A validator's error about one entry of a list or mapping: ``entry`` extends the key path."""

    def __init__(self, message: str, entry: str | int):
        super().__init__(message)
        self.entry = entry


class JobSpec(_Spec):
    """What the user asked for. Plain data, no I/O: ``plan`` turns it into a ``LaunchPlan``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    script: Path | None = None  # the Python script each rank runs (or, with no_python, the program)
    module: str | None = None  # instead of a script: run this module as `python -m MODULE` (torchrun -m)
    no_python: Bool = False  # run `script` as a program, not with Python (torchrun --no-python)
    # the rank's sys.argv[0] (the script as typed on a torchrun line); default: the script's path
    argv0: str | None = None
    args: list[Scalar] = Field(default_factory=list)
    nproc_per_node: Int = Field(1, ge=1, le=1024)
    env: dict[str, Scalar] = Field(default_factory=dict)
    timeout: Float | None = Field(None, gt=0)  # job deadline in seconds; none by default
    max_restarts: Int = Field(0, ge=0)
    grace: Float = Field(5.0, ge=0)  # seconds between SIGTERM and SIGKILL at teardown
    # No progress (no call ended, no loss, no output line) for this long in a job that uses
    # RPC: dump stacks and calls, name the suspect, then stop the job or keep it. 0: off.
    hang_timeout: Float = Field(300.0, ge=0)
    on_hang: Literal["stop", "keep"] = "stop"
    # cpu: hide GPUs; inherit: leave CUDA_VISIBLE_DEVICES alone (what torchrun does);
    # auto: one local GPU per rank, round-robin; a list: one entry per local rank (GPU index or "cpu").
    devices: str | list[int | str] = "inherit"
    rpc: RpcSpec = Field(default_factory=RpcSpec)
    losses: LossesSpec = Field(default_factory=LossesSpec)
    master_port: Int | None = Field(None, ge=1, le=65535)  # one node: a free port when unset
    # Several nodes: one launcher per node. Node 0 hosts the rendezvous (torch's TCPStore) on
    # master_addr:master_port; the ranks' own rendezvous port is picked by node 0 and shared.
    nnodes: Int = Field(1, ge=1, le=65536)
    node_rank: Int = Field(0, ge=0)
    master_addr: str | None = None
    ifname: str | None = None  # network interface for TensorPipe/Gloo; default: the one routing to master_addr
    rdzv_timeout: Float = Field(300.0, gt=0)  # seconds to wait for every node to arrive
    # Elastic (issue 43): nnodes "MIN:MAX" sets min_nodes and nnodes (MAX); master_addr:master_port
    # is then torchrun's --rdzv-endpoint. rdzv_last_call: once MIN are there, the wait for more.
    min_nodes: Int | None = Field(None, ge=1)
    rdzv_last_call: Float = Field(30.0, ge=0)
    # fork: one process imports `preload` once and forks the ranks (fast); spawn: a fresh
    # interpreter per rank, for scripts that must set things up before torch is imported.
    start_method: Literal["fork", "spawn"] = "fork"
    preload: list[str] = Field(default_factory=lambda: list(DEFAULT_PRELOAD))
    # torchrun's worker-spec values the ranks see: ROLE_NAME, TORCHELASTIC_RUN_ID (rdzv_id; unset:
    # the run's id), TORCHELASTIC_SIGNALS_TO_HANDLE; virtual_local_rank: LOCAL_RANK 0 in every rank,
    # CUDA_VISIBLE_DEVICES its local rank (torchrun --virtual-local-rank).
    role: str = Field("default", min_length=1)
    rdzv_id: str | None = Field(None, min_length=1)
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    virtual_local_rank: Bool = False

    @model_validator(mode="after")
    def _one_program(self) -> "JobSpec":
        if self.script is None and self.module is None:
            raise ValueError("give the script to run (script: train.py) or a module (module: pkg.train)")
        if self.script is not None and self.module is not None:
            raise ValueError("script and module are two programs: give one of them")
        if self.module is not None and self.no_python:
            raise ValueError("module runs with Python: no_python goes with a script (a program)")
        if self.module is not None and not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", self.module
        ):
            raise ValueError(f"module {self.module!r} is not a dotted module name (pkg.train)")
        return self

    @field_validator("args")
    @classmethod
    def _args_as_strings(cls, value: list[Scalar]) -> list[Scalar]:
        return [str(v) for v in value]

    @field_validator("env")
    @classmethod
    def _env_as_strings(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise EntryError(f"{key!r} is not a valid environment variable name", key)
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}

    @field_validator("node_rank")
    @classmethod
    def _node_rank_in_range(cls, value: int, info: ValidationInfo) -> int:
        nnodes = info.data.get("nnodes")
        if nnodes is not None and value >= nnodes:
            raise ValueError(f"node_rank {value} is out of range for nnodes {nnodes} (0-{nnodes - 1})")
        return value

    @field_validator("master_addr")
    @classmethod
    def _master_addr_needed(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("master_addr is empty")
        problem = host_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(f"not an IP address or a host name: {problem}")
        return value

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None

    @model_validator(mode="before")
    @classmethod
    def _node_range(cls, data: Any) -> Any:
        """nnodes "MIN:MAX" (torchrun's --nnodes): an elastic job of MIN to MAX nodes."""
        value = data.get("nnodes") if isinstance(data, dict) else None
        if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*:\s*\d+\s*", value):
            low, high = (int(part) for part in value.split(":"))
            if low > high:
                raise EntryError(f"nnodes {value!r}: MIN is above MAX", "nnodes")
            return {**data, "nnodes": high, "min_nodes": low}
        return data

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            if value not in ("cpu", "auto", "inherit"):
                raise ValueError(
                    "devices must be 'cpu', 'auto', 'inherit' or a list (one GPU index or 'cpu' per local rank), "
                    f"got {value!r}"
                )
            return value
        if not isinstance(value, list):
            raise ValueError(f"devices must be 'cpu', 'auto', 'inherit' or a list, got {type(value).__name__}")
        nproc = info.data.get("nproc_per_node")
        if nproc is not None and len(value) != nproc:
            raise ValueError(
                f"devices lists {len(value)} entries but nproc_per_node is {nproc}: give one per local rank"
            )
        parsed: list[int | str] = []
        for index, entry in enumerate(value):
            text = str(entry).strip()
            match = re.fullmatch(r"(?:cuda:)?(\d+)", text)
            if match and not isinstance(entry, bool):
                parsed.append(int(match.group(1)))
            elif text == "cpu":
                parsed.append("cpu")
            else:
                raise EntryError(f"device entry {entry!r} is neither a GPU index (0, 'cuda:1') nor 'cpu'", index)
        return parsed
