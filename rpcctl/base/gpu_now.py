"""Each GPU's memory and utilisation now, and the processes on it, from ``nvidia-smi`` (a
process of its own, bounded): what a hang verdict records as evidence. CUDA is never
initialised here (the launcher must not hold a context on the job's GPUs), and NVML is not
loaded into the launcher either. No ``nvidia-smi`` on PATH (no NVIDIA driver): None, silently.

The standard library only."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

TIMEOUT_S = 5.0
GPU_FIELDS = "index,uuid,name,memory.used,memory.total,utilization.gpu,utilization.memory"
APP_FIELDS = "pid,gpu_uuid,used_memory"
MIB = 1024 * 1024


@dataclass
class GpuNow:
    index: int
    uuid: str
    name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_pct: int | None  # the share of the last sample period a kernel ran
    memory_utilization_pct: int | None
    processes: dict[int, int | None] = field(default_factory=dict)  # pid → bytes it holds on this GPU

    def describe(self, names: dict[int, str] | None = None) -> str:
        """``GPU 0 (NVIDIA H100): 3.1 GiB of 79.6 GiB used, 0% busy; rank 0 (pid 41) holds 2.9 GiB``."""

        def gib(n: int | None) -> str:
            return "?" if n is None else f"{n / 1024**3:.1f} GiB"

        busy = "?" if self.utilization_pct is None else f"{self.utilization_pct}%"
        held = "; ".join(
            f"{(names or {}).get(pid, 'pid ' + str(pid))} holds {gib(used)}"
            for pid, used in sorted(self.processes.items())
        )
        return (
            f"GPU {self.index} ({self.name}): {gib(self.memory_used_bytes)} of {gib(self.memory_total_bytes)} used,"
            f" {busy} busy" + (f"; {held}" if held else "; no process of its own")
        )


def snapshot(binary: str | None = None, timeout: float = TIMEOUT_S) -> list[GpuNow] | None:
    """Every GPU nvidia-smi sees, now; None without nvidia-smi or when it gives no answer in time."""
    binary = binary or shutil.which("nvidia-smi")
    if binary is None:
        return None
    gpus = _query(binary, "--query-gpu", GPU_FIELDS, timeout)
    if gpus is None:
        return None
    out = []
    for row in gpus:
        if len(row) < 7:
            continue
        out.append(GpuNow(_int(row[0]) or 0, row[1], row[2], _mib(row[3]), _mib(row[4]), _int(row[5]), _int(row[6])))
    by_uuid = {g.uuid: g for g in out}
    for row in _query(binary, "--query-compute-apps", APP_FIELDS, timeout) or []:
        if len(row) >= 3 and row[1] in by_uuid and _int(row[0]) is not None:
            by_uuid[row[1]].processes[_int(row[0])] = _mib(row[2])
    return out


def _query(binary: str, what: str, fields: str, timeout: float) -> list[list[str]] | None:
    try:
        done = subprocess.run(
            [binary, f"{what}={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _mib(text: str) -> int | None:
    value = _int(text)
    return None if value is None else value * MIB
