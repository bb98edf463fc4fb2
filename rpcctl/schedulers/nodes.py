"""A job's node count as a scheduler is asked for it: ``N``, or torchrun's elastic ``MIN:MAX``
(issue 43), from a flag (``rpcctl sbatch --nodes``, ``rpcctl k8s --nodes``), a config's
``nnodes`` or a pod's ``PET_NNODES``. One reader, one message naming where the text came from."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rpcctl.base.errors import UsageError
from rpcctl.base.lines import cap_text

MAX_NODES = 65536  # the config's own limit on nnodes


@dataclass(frozen=True)
class Nodes:
    """``low`` to ``high`` nodes; ``elastic``: asked for as a range (``2:2`` is elastic too)."""

    low: int
    high: int
    elastic: bool = False

    def __str__(self) -> str:  # as torchrun's --nnodes writes it
        return f"{self.low}:{self.high}" if self.elastic else str(self.high)


def parse_nodes(text: str, source: str) -> Nodes:
    """``N`` or ``MIN:MAX`` (1 <= MIN <= MAX); else a UsageError (exit 2) naming ``source``."""
    match = re.fullmatch(r"\s*([0-9]{1,9})\s*(?::\s*([0-9]{1,9})\s*)?", str(text))
    low = int(match.group(1)) if match else 0
    high = int(match.group(2)) if match and match.group(2) is not None else low
    if not match or not 1 <= low <= high <= MAX_NODES:
        raise UsageError(
            f"{source} {cap_text(str(text), 60)!r} is not a node count N nor an elastic range MIN:MAX "
            f"(whole numbers, 1 <= MIN <= MAX <= {MAX_NODES})"
        )
    return Nodes(low, high, match.group(2) is not None)


def spec_nodes(spec) -> Nodes:
    """A JobSpec's nodes: its ``nnodes``, elastic when it was given as ``MIN:MAX``."""
    return Nodes(spec.min_nodes, spec.nnodes, True) if spec.elastic else Nodes(spec.nnodes, spec.nnodes, False)
