"""A training loop with a tqdm bar and ``set_postfix(loss=…)``.

    python tqdm_postfix.py [--stream stdout|stderr] [--steps 60]

Every update is drawn (``mininterval=0``) so that the truth, every loss set, is all on screen.
"""

import math
import sys

from tqdm import tqdm

import _truth


def main() -> None:
    stream = sys.stdout if "stdout" in sys.argv else sys.stderr
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 60
    records = []
    bar = tqdm(range(steps), desc="train", file=stream, mininterval=0, miniters=1)
    for step in bar:
        loss = 2.0 * math.exp(-step / 20)
        bar.set_postfix(loss=loss)
        records.append({"step": step, "loss": loss})
    bar.close()
    _truth.save(records)


if __name__ == "__main__":
    main()
