"""The placement view: per physical GPU (or "cpu"), the ranks placed there, memory, and the
bytes of live RRef values on it (``placement``; ``rpcctl inspect gpus``, the word users know)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpcctl.console import KEY, Column, human_bytes, join
from rpcctl.base.devices import parse_visible_devices
from rpcctl.telemetry.reader import StoreReader, loads
from rpcctl.inspect.rrefs import rrefs
from rpcctl.inspect.workers import workers
from rpcctl.base.states import RRefState


@dataclass
class PlacementRecord:
    device: str  # "cuda:N" (physical index) or "cpu"
    name: str | None
    ranks: list[int]
    workers: list[str]
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    rref_bytes: int  # bytes of live RRef values on this device
    rrefs: int

    COLUMNS = (
        Column("device", priority=KEY),
        Column("name", wrap=True),
        Column("ranks", fmt=join, priority=KEY),
        Column("workers", fmt=join, detail=True),
        Column("memory_used_bytes", "MEM USED", fmt=human_bytes, justify="right"),
        Column("memory_total_bytes", "MEM TOTAL", fmt=human_bytes, justify="right"),
        Column("rrefs", "RREFS", justify="right"),
        Column("rref_bytes", "RREF BYTES", fmt=human_bytes, justify="right"),
    )


def placement(run_dir: Path) -> list[PlacementRecord]:
    """Per device (physical GPU, or "cpu"): ranks placed there, memory, live RRef bytes on it."""
    live_rrefs = [r for r in rrefs(run_dir) if r.state != RRefState.DELETED]
    workers_ = workers(run_dir)
    devices: dict[str, PlacementRecord] = {}

    def device(key: str) -> PlacementRecord:
        if key not in devices:
            devices[key] = PlacementRecord(key, None, [], [], None, None, 0, 0)
        return devices[key]

    visible_of: dict[str | None, list[str]] = {}
    with StoreReader(run_dir) as s:
        procs = s.procs(s.latest_restart())
    for proc in procs:
        visible_of[proc["name"]] = [v.strip() for v in (proc["cuda_visible_devices"] or "").split(",") if v.strip()]
        if proc["ended_at"] is not None:
            continue
        for gpu in loads(proc["gpus"]) or []:
            entry = device(f"cuda:{gpu.get('physical', gpu.get('index'))}")
            entry.name = entry.name or gpu.get("name")
            entry.memory_total_bytes = gpu.get("total_bytes") or entry.memory_total_bytes
            used = gpu.get("device_used_bytes")
            if used is not None:
                entry.memory_used_bytes = max(entry.memory_used_bytes or 0, used)
    for worker in workers_:
        key = _physical(worker.device or "cpu", visible_of.get(worker.name) or _visible(worker.cuda_visible_devices))
        entry = device(key)
        if worker.rank is not None and worker.rank not in entry.ranks and worker.kind == "rank":
            entry.ranks.append(worker.rank)
        label = worker.name or f"pid {worker.pid}"
        if label not in entry.workers:
            entry.workers.append(label)
        if key == "cpu" and worker.rss_bytes:
            entry.memory_used_bytes = (entry.memory_used_bytes or 0) + worker.rss_bytes
    for record in live_rrefs:
        if not record.device:
            continue
        key = _physical(record.device, visible_of.get(record.owner) or [])
        entry = device(key)
        entry.rrefs += 1
        entry.rref_bytes += record.nbytes or 0
    return sorted(devices.values(), key=lambda d: (d.device == "cpu", _device_index(d.device)))


gpus = placement  # the CLI's word for the view (``rpcctl inspect gpus``)


def _visible(text: str | None) -> list[str]:
    return parse_visible_devices(text) or []


def _physical(device: str, visible: list[str]) -> str:
    """A process's 'cuda:N' → the physical 'cuda:M' its CUDA_VISIBLE_DEVICES maps N to."""
    if device.startswith("cuda"):
        index = device.partition(":")[2]
        if index.isdigit() and int(index) < len(visible) and visible[int(index)].isdigit():
            return f"cuda:{visible[int(index)]}"
        return device if index else "cuda:0"
    return "cpu" if device.startswith("cpu") else device


def _device_index(device: str) -> int:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 0
