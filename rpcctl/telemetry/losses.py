"""Losses from unmodified prints: the parser ``TelemetryServer.log_line`` runs on every line.

The default pattern understands the common shapes (case does not matter)::

    step 3 loss 0.52                 step=3, loss=0.52
    loss=0.52                        loss only: step is the loss's index on that rank
    Epoch 3: 0.52                    epoch=3, loss=0.52 (step = epoch)
    Epoch [3/10], Step [100/600], Loss: 0.1234
    iter 40 | train_loss 0.31 | lr=1e-3 acc: 0.9     + metrics {"lr": 0.001, "acc": 0.9}

Validation/test losses (``val loss``, ``val_loss``, ``test loss``) are not the loss; written
as ``key=value`` or ``key: value`` they are kept as metrics. A ``losses.pattern`` regex in the
config replaces the default: its named group ``loss`` is required, ``step`` and ``epoch`` are
optional, and any other named group becomes a metric.

Cost: a line without ``loss`` or ``epoch`` in it is rejected by one precompiled search.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b"
_START = r"(?<![\w.])"  # not inside a longer word, a dotted name or a number
_NOT_EVAL = "".join(rf"(?<!{p}[ _-])" for p in ("val", "valid", "validation", "test", "eval", "dev"))

_PREFILTER = re.compile(r"loss|epoch", re.IGNORECASE)
_LOSS = re.compile(
    rf"{_START}{_NOT_EVAL}(?:train(?:ing)?[ _-]?)?loss\b(?:\s*\([^)]*\))?\s*[:=]?\s*(?P<loss>{_NUM})",
    re.IGNORECASE,
)
_STEP = re.compile(
    rf"{_START}(?:global[ _]?)?(?:step|iter(?:ation)?|it|batch|update)s?\b\s*[:=#]?\s*\[?\s*(?P<step>\d+)(?:\s*/\s*\d+)?",
    re.IGNORECASE,
)
_EPOCH = re.compile(rf"{_START}epoch\b\s*[:=#]?\s*\[?\s*(?P<epoch>\d+)(?:\s*/\s*\d+)?", re.IGNORECASE)
_EPOCH_VALUE = re.compile(
    rf"^\W*epoch\s*\[?\s*(?P<epoch>\d+)(?:\s*/\s*\d+)?\]?\s*[:=,-]\s*(?P<loss>{_NUM})(?:\s.*)?$",
    re.IGNORECASE,
)
_METRIC = re.compile(rf"{_START}(?P<name>[A-Za-z][\w./-]*?)\s*[:=]\s*(?P<value>{_NUM})")
_NOT_METRICS = frozenset({"loss", "train_loss", "training_loss", "step", "epoch", "iter", "iteration", "it", "batch", "global_step"})


@dataclass(frozen=True)
class ParsedLoss:
    loss: float
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class LossParser:
    """Turns printed lines into ``ParsedLoss`` records; ``pattern`` (a regex) replaces the default."""

    def __init__(self, pattern: str | None = None):
        self.custom = re.compile(pattern) if pattern else None

    def parse(self, line: str) -> ParsedLoss | None:
        if self.custom is not None:
            return self._parse_custom(line)
        if _PREFILTER.search(line) is None:
            return None
        match = _LOSS.search(line)
        if match is None:
            whole = _EPOCH_VALUE.match(line)
            if whole is None:
                return None
            epoch = int(whole["epoch"])
            return ParsedLoss(loss=_float(whole["loss"]), epoch=epoch)
        step = _STEP.search(line)
        epoch = _EPOCH.search(line)
        metrics = {}
        for m in _METRIC.finditer(line):
            name = m["name"].lower()
            if name not in _NOT_METRICS and m.start() != match.start():
                metrics.setdefault(m["name"], _float(m["value"]))
        return ParsedLoss(
            loss=_float(match["loss"]),
            step=int(step["step"]) if step else None,
            epoch=int(epoch["epoch"]) if epoch else None,
            metrics=metrics,
        )

    def _parse_custom(self, line: str) -> ParsedLoss | None:
        assert self.custom is not None
        match = self.custom.search(line)
        if match is None or match.group("loss") is None:
            return None
        try:
            loss = _float(match.group("loss"))
        except ValueError:
            return None
        groups = match.groupdict()
        metrics = {}
        for name, value in groups.items():
            if name in ("loss", "step", "epoch") or value is None:
                continue
            try:
                metrics[name] = _float(value)
            except ValueError:
                continue
        return ParsedLoss(loss=loss, step=_int(groups.get("step")), epoch=_int(groups.get("epoch")), metrics=metrics)


def _float(text: str) -> float:
    return float(text)


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return int(float(text))
        except ValueError:
            return None
