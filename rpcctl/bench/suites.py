"""What is measured: suites, their cases, and the two timing profiles (quick and full).

=============  ==========================================================  =====================
suite          one case per                                                figure of merit
=============  ==========================================================  =====================
latency        op the transport offers for a round trip (tiny payload)     p50 time per call
payload        payload size (echo: the payload goes there and back)        GB/s, both directions
throughput     number of calls kept in flight (1, 8, 64; tiny payload)     calls/s
collective     collective op × payload size, every rank taking part        GB/s (size / p50)
train          world size (1 parameter server + N-1 trainers)              steps/s, all trainers
startup        transport: a fresh process's import + init to first call   p50 seconds
=============  ==========================================================  =====================

``latency``, ``payload`` and ``throughput`` are point-to-point; ``collective`` rows are compared
with torch's gloo all-reduce only, never with point-to-point rows. ``compare`` is not a suite of
its own but a preset: the operations the frameworks share (one op per suite and transport),
every framework, launched round by round (see ``rpcctl.bench.runner``).

Every transport gets the same cases and the same payload bytes (``payload(n)`` is the same
tensor everywhere; collectives use ``collective_payload(n)``), so rows of one suite are
comparable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SUITES = ("latency", "payload", "throughput", "collective", "train", "startup")
POINT_TO_POINT = ("latency", "payload", "throughput")
# What each suite's rows are, in the JSON (``kind``) and the table titles.
KIND = {
    "latency": "point-to-point",
    "payload": "point-to-point",
    "throughput": "point-to-point",
    "collective": "collective",
    "train": "training",
    "startup": "startup",
}
COMPARE = "compare"  # the preset: --suite compare
COMPARE_SUITES = ("latency", "payload", "throughput", "collective", "startup")
COMPARE_TRANSPORTS = ("rpc", "gloo", "ray", "tf-rpc", "tf-allreduce", "horovod", "monarch", "monarch-rdma")
KiB, MiB = 1024, 1024 * 1024

TINY_BYTES = 8  # the latency and throughput payload: one 8-byte tensor


@dataclass(frozen=True)
class Case:
    """One row of results: a suite, the op measured, and its parameters."""

    suite: str
    op: str
    payload_bytes: int | None
    in_flight: int = 1
    world_size: int = 2

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}")
        if self.in_flight < 1 or self.world_size < 1 or (self.payload_bytes is not None and self.payload_bytes < 1):
            raise ValueError(f"a case needs in_flight, world_size and payload_bytes of at least 1: {self}")

    @property
    def key(self) -> tuple:
        return (self.suite, self.op, self.payload_bytes, self.in_flight, self.world_size)

    def label(self) -> str:
        from rpcctl.console import human_bytes

        if self.suite in ("payload", "collective"):
            return f"{self.op} {human_bytes(self.payload_bytes or 0)}"
        if self.suite == "throughput":
            return f"{self.op} ×{self.in_flight} in flight"
        if self.suite == "train":
            return f"{self.op} world {self.world_size}"
        return self.op

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """How long to measure each case. Calls per repeat are calibrated on the warm-up."""

    warmup_s: float
    repeat_s: float
    repeats: int
    min_calls: int  # per repeat, however slow the call
    max_calls: int  # per repeat, however fast the call
    min_warmup_calls: int = 3

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Profile:
    name: str
    payload_sizes: tuple[int, ...]
    in_flight: tuple[int, ...]
    train_world_sizes: tuple[int, ...]
    timing: Timing
    train_batch: int = 32
    # transports measured when --transport is not given (others are opt-in by name)
    default_transports: tuple[str, ...] = field(default=())


QUICK = Profile(
    name="quick",
    payload_sizes=(1 * KiB, 16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB),
    in_flight=(1, 8, 64),
    train_world_sizes=(2, 3),
    # One call per repeat at the least: a 64 MiB echo then costs 3 warm-up + 5 timed calls.
    timing=Timing(warmup_s=0.1, repeat_s=0.08, repeats=5, min_calls=1, max_calls=2000, min_warmup_calls=1),
    default_transports=("rpc", "rpc-tuned", "gloo", "tcp", "memcpy", "ray"),
)

FULL = Profile(
    name="full",
    payload_sizes=(1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB),
    in_flight=(1, 8, 64),
    train_world_sizes=(2, 3, 4),
    timing=Timing(warmup_s=0.3, repeat_s=0.2, repeats=10, min_calls=3, max_calls=200_000),
    default_transports=(
        "rpc",
        "rpc-uv",
        "rpc-basic",
        "rpc-cma",
        "rpc-threads",
        "rpc-thp",
        "rpc-malloc",
        "rpc-tuned",
        "gloo",
        "tcp",
        "memcpy",
        "ray",
    ),
)


def cases_for(
    ops: dict[str, tuple[str, ...]], suites: tuple[str, ...], profile: Profile, world_size: int = 2
) -> list[Case]:
    """The cases a transport offering ``ops`` (suite → op names) runs in ``suites``.

    Point-to-point suites run between two processes (``world_size`` 2, or 1 for in-process
    transports); ``train`` runs once per world size of the profile, in its own launch.
    """
    cases: list[Case] = []
    for suite in suites:
        # every adapter has a start-up cost; the other suites only where the adapter offers ops
        for op in ops.get(suite, ("first_call",) if suite == "startup" else ()):
            if suite == "latency":
                cases.append(Case(suite, op, TINY_BYTES, 1, world_size))
            elif suite == "payload":
                cases.extend(Case(suite, op, size, 1, world_size) for size in profile.payload_sizes)
            elif suite == "throughput":
                cases.extend(Case(suite, op, TINY_BYTES, n, world_size) for n in profile.in_flight)
            elif suite == "collective":
                cases.extend(Case(suite, op, size, 1, world_size) for size in profile.payload_sizes)
            elif suite == "train":
                cases.extend(Case(suite, op, None, 1, ws) for ws in profile.train_world_sizes)
            elif suite == "startup":
                cases.append(Case(suite, op, None, 1, world_size))
            else:
                raise ValueError(f"unknown suite {suite!r}")
    return cases


def payload(nbytes: int):
    """The payload of ``nbytes`` every transport sends: the same bytes everywhere (fixed seed)."""
    import torch

    generator = torch.Generator().manual_seed(nbytes)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


def collective_payload(nbytes: int):
    """The ``nbytes`` every rank contributes to a collective: float32 (what gradients are), with
    small whole values so that a sum over ranks is exact and can be checked."""
    import torch

    return payload(max(1, nbytes // 4)).to(torch.float32)
