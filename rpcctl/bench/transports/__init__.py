"""Transport adapters: one class per way of moving bytes, one row name per configuration.

An adapter (a ``Transport`` subclass) knows how to set itself up inside a rank and how to do
one round trip of each op it offers; the shared loops in ``rpcctl.bench.measure`` do all the
timing, so every row is measured the same way. A *transport* (a ``TransportSpec``) is a row of
the results: an adapter plus its settings, e.g. ``rpc-uv`` is the ``rpc`` adapter told to use
only the TCP transport.

Roles inside a launch (``world_size`` ranks, rank 0 drives the point-to-point cases)::

    rank 0  import → setup → per p2p case: prepare → warm-up/repeats of issue+wait → stop
            → collectives → [train] → teardown
    rank k  import → setup → serve (until rank 0's stop)
            → collectives → [train] → teardown

Collective cases (suite ``collective``) run on every rank at once: each rank calls
``collective(op, tensor)`` in the same loop, and ``agree`` keeps the loops in step (rank 0
decides when the warm-up ends and how many calls a repeat has).

Adding an adapter: subclass ``Transport``, fill in ``kind``, ``ops``
(suite → op names) and the rank-side methods, and either call ``register`` from code that is
imported in the ranks too, or expose the class as an entry point in the group
``rpcctl.bench.adapters``; it then shows up in ``rpcctl bench --transport NAME``. A spec's
``kind`` may also be ``package.module:Class`` (importable in the ranks). Report
``unavailable()`` when its package is missing: the row is skipped with a one-line note.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

ENTRY_POINT_GROUP = "rpcctl.bench.adapters"


@dataclass(frozen=True)
class RankContext:
    """Where this rank is: the torchrun environment contract, read once."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls) -> RankContext:
        return cls(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(os.environ.get("MASTER_PORT", "0")),
        )


class Transport(ABC):
    """One adapter. Instances live in the ranks; class attributes are read by the launcher side."""

    kind: ClassVar[str]  # the adapter's name, e.g. "rpc"
    summary: ClassVar[str]
    # suite → ops it offers, e.g. {"latency": ("rpc_sync", ...), "payload": ("rpc_sync",)}
    ops: ClassVar[dict[str, tuple[str, ...]]]
    processes: ClassVar[int] = 2  # ranks for the point-to-point suites (1: all in one process)
    install_hint: ClassVar[str | None] = None  # e.g. "pip install 'rpcctl[ray]'"
    # What a user of this framework imports: timed first, as part of the start-up cost.
    modules: ClassVar[tuple[str, ...]] = ("torch",)

    def __init__(self, settings: dict[str, Any] | None = None):
        self.settings = dict(settings or {})
        self.ctx: RankContext | None = None

    # -- launcher side ----------------------------------------------------------------------

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this adapter cannot run here (a missing package), or None."""
        return None

    @classmethod
    def unsupported(cls, case: Any) -> str | None:
        """Why this adapter cannot run ``case`` (its row then says "not supported: ..."), or None."""
        return None

    @classmethod
    def env_for(cls, settings: dict[str, Any]) -> dict[str, str]:
        """Environment variables the ranks need for ``settings``."""
        return {}

    @classmethod
    def mismatches(cls, settings: dict[str, Any], observed: dict[str, Any]) -> list[str]:
        """What ``observe()`` saw that the settings asked otherwise (each becomes a note)."""
        return []

    # -- rank side ----------------------------------------------------------------------------

    @abstractmethod
    def setup(self, ctx: RankContext) -> None:
        """Connect to the other ranks."""

    def serve(self) -> None:
        """Ranks other than 0: answer rank 0's calls until it calls ``stop``."""

    def stop(self) -> None:
        """Rank 0: release the serving ranks (after the last point-to-point case)."""

    @abstractmethod
    def teardown(self) -> None:
        """Disconnect (all ranks; after ``stop``/``serve`` and any training)."""

    def abort(self) -> None:
        """After an error: nothing by default. Closing connections now would make the peers
        fail before this rank has reported its error, and the launcher names the first failure
        as the root cause; process exit closes them, and the launcher tears the peers down."""

    def observe(self) -> dict[str, Any]:
        """Rank 0, after the cases: what this rank saw of its own configuration (e.g. whether
        huge pages were really used), recorded next to the results."""
        return {}

    def native(self, tensor: Any) -> Any:
        """The payload (a torch tensor) as this framework's own tensor, made once per case and
        untimed, so that no row pays for a conversion its users would not make."""
        return tensor

    def as_torch(self, value: Any) -> Any:
        """Back from ``native`` (for the checks)."""
        return value

    def prepare(self, op: str, payload: Any, calls: int, in_flight: int) -> None:
        """Rank 0, before each batch (untimed): tell an active server what is coming."""

    @abstractmethod
    def issue(self, op: str, payload: Any) -> Any:
        """Rank 0: start one round trip of ``op`` carrying ``payload``; return a handle."""

    def wait(self, op: str, handle: Any) -> Any:
        """Rank 0: wait for ``handle``; return what came back (the echoed payload)."""
        return handle

    def collective(self, op: str, tensor: Any) -> Any:
        """Every rank: one collective ``op`` over ``tensor`` (this rank's contribution); returns
        the result (``all_reduce``: the sum over ranks; ``broadcast``: rank 0's tensor;
        ``all_gather``: every rank's tensor, concatenated in rank order)."""
        raise NotImplementedError(f"{self.kind} has no collectives")

    def agree(self, value: int) -> int:
        """Every rank: rank 0's ``value`` (a small int), so that collective loops stay in step."""
        if self.ctx is not None and self.ctx.world_size > 1:
            raise NotImplementedError(f"{self.kind} cannot agree across ranks")
        return value

    def train(self, case: Any, timing: Any) -> dict | None:
        """All ranks: the ``train`` suite (only adapters listing it in ``ops``). Rank 0 returns
        ``{"samples_s": [...], "repeat_medians_s": [...], "repeat_rates": [...], ...}``."""
        raise NotImplementedError(f"{self.kind} has no train suite")


@dataclass(frozen=True)
class TransportSpec:
    """A row name: an adapter and its settings."""

    name: str
    kind: str
    summary: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def adapter(self) -> type[Transport]:
        return adapter(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "summary": self.summary, "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransportSpec:
        return cls(
            name=data["name"],
            kind=data["kind"],
            summary=data.get("summary", ""),
            settings=dict(data.get("settings") or {}),
        )


_ADAPTERS: dict[str, type[Transport]] = {}
_TRANSPORTS: dict[str, TransportSpec] = {}
_loaded = False


def register(cls: type[Transport], *variants: TransportSpec) -> type[Transport]:
    """Make adapter ``cls`` known, with a row of its own (named after it) plus ``variants``."""
    _ADAPTERS[cls.kind] = cls
    specs = variants or (TransportSpec(cls.kind, cls.kind, cls.summary),)
    for spec in specs:
        _TRANSPORTS[spec.name] = spec
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in ("rpc", "gloo", "tcp", "memcpy", "ray", "tensorflow", "horovod", "monarch"):
        importlib.import_module(f"rpcctl.bench.transports.{module}")
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        cls = entry.load()
        if cls.kind not in _ADAPTERS:
            register(cls)


def adapter(kind: str) -> type[Transport]:
    """The adapter class for ``kind``: a registered name, or ``package.module:Class``."""
    _load()
    if kind not in _ADAPTERS and ":" in kind:
        module, _, name = kind.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise TypeError(f"{kind} is not a rpcctl.bench.transports.Transport subclass")
        _ADAPTERS[kind] = cls
    try:
        return _ADAPTERS[kind]
    except KeyError:
        raise KeyError(f"no bench adapter {kind!r} (known: {', '.join(sorted(_ADAPTERS))})") from None


def transports() -> dict[str, TransportSpec]:
    """Every known row name, in display order (rpc first)."""
    _load()
    return dict(_TRANSPORTS)


def create(spec: TransportSpec) -> Transport:
    """The adapter instance for ``spec`` (rank side)."""
    return adapter(spec.kind)(spec.settings)
