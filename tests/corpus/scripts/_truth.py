"""Where a corpus script writes what the library itself recorded (``$CORPUS_TRUTH``, JSON)."""

import json
import os


def save(records: list[dict]) -> None:
    path = os.environ.get("CORPUS_TRUTH")
    if path:
        with open(path, "w") as f:
            json.dump(records, f, indent=1)
