"""The families of telemetry a rank reports, each declared once (``FAMILIES``).

A family is one thing observed in a rank (RRefs, calls, collectives, the processes it starts,
the training library's steps). Its entry says everything the rest of the rank side needs::

    field        what                                      who uses it
    name         its word (``set_hooks(only=...)``)        the reporter
    observer     its hooks' side (``observer.Observer``):  ``patch`` (prepare, init_rpc, shutdown),
                 prepare, activate(queue), deactivate,     the reporter (activate, deactivate,
                 after-fork, dropped, rpc_*, shutdown_*    after-fork, dropped)
    processor    its sender's side: ``processor(cycle)``   the reporter's sender thread, made once
                 → an object with ``process(now, final)``  per thread; each cycle's events, in
                 → events (``Processor``); None: none      ``FAMILIES`` order
    after_fork   its sender's state reset in a forked      the reporter's at-fork hook (the
                 child (None: none kept)                   observer's is the hooks' state)
    events       the events it emits: names of             ``tests/test_families.py`` (each is
                 ``protocol.EVENT_FIELDS`` (their fields   declared, one family's, stored by
                 and bounds are declared there, in wire:   ``telemetry.store.HANDLERS``)
                 the launcher reads them too)
    imports      after-import hooks: (module, on_import)   ``autohook``: ``on_import()`` once the
                                                           module has finished importing
    at_start     what the rank's environment needs before  ``reporter.start`` (a rank's bootstrap,
                 the user's script runs (None: nothing)    before the script)
    rpc_hooks    its hooks wrap RPC calls (``set_hooks``   ``reporter.set_hooks``
                 turns them off and on for benchmarks)

Families post through the one handle they are given: the reporter's queue, at ``activate``
(the hot path appends to it; the sender drains it every cycle and hands the items to every
processor as ``cycle.items``). A new thing to observe is one module (its observer, its
processor, its hooks) and one entry here; one added at run time (``register``: a plugin, a
test's toy family) is picked up as if it had been here: prepared once torch is patched,
activated while telemetry runs, its processor made at the sender's next cycle, its import hooks
installed.

The hot-path wrappers stay in their family's module and read its state as module globals
(``observer``: cheaper per call than an object's attributes); nothing here is on a hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpcctl.rank import steps  # light: its import hooks wait for the trainer modules before torch is imported


class Cycle:
    """What a processor is given: this sender cycle's queue, drained (``items``: the hooks'
    records and the events posted, in order). The reporter's sender thread sets ``items``
    before each cycle's processors run."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[Any] = []


class Processor:
    """A family's sender side: ``process(now, final)`` → this cycle's events (``final``: the
    process's last cycle). A base to subclass, or any object with that method."""

    def process(self, now: float, final: bool) -> list[dict[str, Any]]:
        return []


class Family:
    """One family's entry (the fields: this module's docstring). ``observer`` None: no hooks of
    its own on torch (``observer.Observer``'s no-ops)."""

    __slots__ = ("name", "events", "observer", "processor", "after_fork", "imports", "rpc_hooks", "at_start")

    def __init__(
        self,
        name: str,
        events: tuple[str, ...],
        observer: Any = None,
        processor: Callable[[Cycle], Processor] | None = None,
        after_fork: Callable[[], None] | None = None,
        imports: tuple[tuple[str, Callable[[], None]], ...] = (),
        rpc_hooks: bool = False,
        at_start: Callable[[], Any] | None = None,
    ) -> None:
        self.name, self.events, self.observer, self.processor = name, tuple(events), observer, processor
        self.after_fork, self.imports, self.rpc_hooks, self.at_start = after_fork, tuple(imports), rpc_hooks, at_start

    def __repr__(self) -> str:
        return f"Family({self.name!r})"


class _OfItems:
    """A processor that reads the cycle's items (``process(items, now, final)``)."""

    __slots__ = ("cycle", "processor")

    def __init__(self, processor: Any, cycle: Cycle) -> None:
        self.processor, self.cycle = processor, cycle

    def process(self, now: float, final: bool) -> list[dict[str, Any]]:
        return self.processor.process(self.cycle.items, now, final)


class _Calls(_OfItems):
    def process(self, now: float, final: bool) -> list[dict[str, Any]]:
        return self.processor.process(now, final=final, items=self.cycle.items)


def _builtin() -> tuple[Family, ...]:
    """rpcctl's own families, in the order their events go out each cycle. Imported here, at the
    first use of ``FAMILIES``: a process a rank starts that never imports torch (a helper
    interpreter) loads only ``steps`` (``autohook``), not the families' ~45 ms of modules."""
    from rpcctl.rank import call_summary, calls, children, collectives
    from rpcctl.rank.rrefs import hooks, sender

    return (
        Family(
            "rrefs",
            ("rref", "conf", "desc", "vfree", "fork", "rel", "used", "churn", "shutdown"),
            hooks.OBSERVER,
            lambda cycle: _OfItems(sender.tracker(), cycle),
            sender.after_fork_in_child,
            rpc_hooks=True,
        ),
        Family(
            "calls",
            ("join", "cstat", "call", "cend", "srv", "send"),
            calls.OBSERVER,
            lambda cycle: _Calls(call_summary.summariser(), cycle),
            call_summary.after_fork_in_child,
            rpc_hooks=True,
        ),
        Family(
            "collectives",
            ("coll", "cop", "cent", "pgjoin", "pgw"),
            collectives.OBSERVER,
            lambda cycle: collectives.poller(),
            at_start=collectives.configure_env,
        ),
        Family("children", ("cexit",), children.OBSERVER),
        STEPS,
    )


STEPS = Family("steps", ("loss",), imports=steps.IMPORT_HOOKS)
# Events no family emits: the reporter's own (``reporter``: its probe and last word, the sender's
# own fault) and the init_rpc wrapper's (``patch``: who this process is in its RPC world).
REPORTER_EVENTS = ("probe", "rpc", "error", "bye")
_added: list[Family] = []  # registered at run time, in order
_listeners: list[Callable[[Family], None]] = []
# FAMILIES (every family, rpcctl's then those registered) and OBSERVERS (their observers, in
# that order) are made at first use (``__getattr__``) and remade by ``register``.


def __getattr__(name: str) -> Any:
    if name in ("FAMILIES", "OBSERVERS"):
        _made(_builtin())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _made(builtin: tuple[Family, ...]) -> None:
    global FAMILIES, OBSERVERS, _builtins
    _builtins = builtin
    FAMILIES = (*builtin, *_added)
    OBSERVERS = tuple(family.observer for family in FAMILIES if family.observer is not None)


def register(family: Family) -> None:
    """Add a family at run time (after the others; a second family of a name is refused); those
    who listen (``listen``: the reporter) pick it up."""
    every = globals().get("FAMILIES") or __getattr__("FAMILIES")
    if any(known.name == family.name for known in every):
        raise ValueError(f"a family {family.name!r} is registered already")
    _added.append(family)
    _made(_builtins)
    for listener in list(_listeners):
        listener(family)


def listen(listener: Callable[[Family], None]) -> None:
    """Call ``listener(family)`` for each family ``register`` adds from now on."""
    _listeners.append(listener)


def imports() -> list[tuple[str, Callable[[], None]]]:
    """Every family's after-import hooks, in order; before ``FAMILIES`` is made, without making
    it: of rpcctl's own families only ``steps`` has any (``tests/test_families.py``)."""
    every = globals().get("FAMILIES") or (STEPS, *_added)
    return [hook for family in every for hook in family.imports]
