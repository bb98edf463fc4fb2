"""A family of telemetry that exists only in the tests (``tests/test_families.py``): one module
and one entry, as the registry promises. Each side registers its half:

- ``rank_side()`` (the rank's script calls it): ``families.register`` of a family whose observer
  posts ``activated`` when telemetry runs (``forked``: after its after-fork, in a forked child),
  whose after-import hook posts ``imported`` once ``wave`` is imported, and whose processor counts
  the sender's cycles and the toy items it saw, sent at the last cycle (``final``, ``seen``);
- ``launcher_side()`` (the launcher, before rpcctl's entry point): the ``toy`` event's fields
  (``protocol.declare_event``) and its handler in the store (``store.HANDLERS``), which keeps
  each in a table of its own (``toy``).
"""

from __future__ import annotations

import time
from typing import Any

_sender_forked = False  # the family's sender after-fork ran in this process


def rank_side() -> None:
    from rpcctl.rank import families
    from rpcctl.rank.observer import Observer

    class ToyObserver(Observer):
        name = "toy"

        def __init__(self) -> None:
            self.queue: Any = None
            self.forked = False

        def activate(self, queue: Any) -> None:
            self.queue = queue
            self.post("activated")

        def deactivate(self) -> None:
            self.queue = None

        def after_fork_in_child(self) -> None:
            self.queue, self.forked = None, True

        def post(self, what: str) -> None:
            if self.queue is not None:
                self.queue.append({"e": "toy", "what": what, "forked": self.forked, "t": time.time()})

    class ToyProcessor:
        def __init__(self, cycle: Any) -> None:
            self.cycle, self.cycles, self.seen = cycle, 0, 0

        def process(self, now: float, final: bool) -> list[dict[str, Any]]:
            self.cycles += 1
            self.seen += sum(1 for item in self.cycle.items if type(item) is dict and item.get("e") == "toy")
            if not final:
                return []
            return [
                {"e": "toy", "what": "final", "forked": _sender_forked, "n": self.cycles, "t": now},
                {"e": "toy", "what": "seen", "forked": _sender_forked, "n": self.seen, "t": now + 1e-6},
            ]

    def sender_after_fork() -> None:
        global _sender_forked
        _sender_forked = True

    observer = ToyObserver()
    families.register(
        families.Family(
            "toy",
            ("toy",),
            observer,
            ToyProcessor,
            sender_after_fork,
            imports=(("wave", lambda: observer.post("imported")),),
        )
    )


def launcher_side() -> None:
    from rpcctl.telemetry import store
    from rpcctl.wire import protocol

    protocol.declare_event(
        "toy", {"what": protocol.NAME, "forked": protocol.FLAG, "n": protocol.COUNT}, required=("what",)
    )

    def stored(writer: Any, proc: Any, event: dict[str, Any], t: float) -> None:
        writer._x("CREATE TABLE IF NOT EXISTS toy (pid INTEGER, what TEXT, forked INTEGER, n INTEGER, t REAL)")
        writer._x(
            "INSERT INTO toy VALUES (?, ?, ?, ?, ?)",
            (proc.pid, event["what"], int(bool(event.get("forked"))), event.get("n"), t),
        )

    store.HANDLERS["toy"] = stored
