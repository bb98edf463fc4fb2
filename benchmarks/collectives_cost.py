"""What recording collectives costs a DDP-style step loop (3 ranks, gloo, CPU: per step a small
matmul and one all_reduce of 4 KiB), measured by separate launches, interleaved: ``rpcctl launch``
with telemetry (collectives recorded), with ``RPCCTL_TELEMETRY_DISABLE=1`` (no sender thread, no
Flight Recorder set up), and ``torchrun --standalone``, in rotating order over several rounds.

    python benchmarks/collectives_cost.py                 # 5 rounds
    python benchmarks/collectives_cost.py --rounds 9 --seconds 3 --json

This is ``benchmarks/launch_cost.py --shapes ddp`` (its options, its report; 5 rounds unless
told): that script measures the other shapes (RPC) the same way. The target is ≥ 0.97 (issue 27).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_cost import main  # noqa: E402 - the folder of benchmarks is not a package

if __name__ == "__main__":
    main(["--shapes", "ddp", "--rounds", "5", *sys.argv[1:]])
