"""CUDA_VISIBLE_DEVICES, read one way everywhere (the plan, the in-rank probe, ``inspect gpus``).

No torch and no CUDA here: the launcher reads it before any rank exists, and each rank reads it
without initialising CUDA.
"""

from __future__ import annotations

import re

# What CUDA accepts as one entry: an index, or a GPU/MIG UUID (or a unique prefix of one).
_DEVICE_ID = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z/-]+")


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU is visible), else the
    listed ids in order, up to the first one that is not an id: CUDA hides that one and every
    one after it, so ``"0,-1,1"`` shows only GPU 0 and ``""`` or ``"-1"`` show none."""
    if value is None:
        return None
    visible = []
    for entry in value.split(","):
        entry = entry.strip()
        if not _DEVICE_ID.fullmatch(entry):
            break
        visible.append(entry)
    return visible
