"""Losses from unmodified prints: the parser ``TelemetryServer.log_line`` runs on every line.

Rules, tried in this order (the first that applies decides; ``rpcctl inspect losses --explain
LINE`` names it)::

    rule      example                                              yields
    dict      {"step": 1, "loss": 1.0}                             JSON lines
              {'loss': '1.0', 'grad_norm': '0.3', 'epoch': '0.25'} Python dicts (HF Trainer; numbers
                                                                   may be quoted strings)
    bar       Epoch 0:  75%|███▌ | 3/4 [00:00<00:00, train_loss=0.33]   tqdm / Lightning: step 3, epoch 0
              Epoch 0/2 ━━━━━━━━━━ 4/4 0:00:01 • 0:00:00 train_loss: 0.33 Lightning's Rich bar
              3/4 ━━━━━━━━━━━━━━━━━━━━ 0s 5ms/step - loss: 0.52 - acc: 0.9  Keras: step 3
    text      step 3 loss 0.52 | lr=1e-3 acc: 0.9                  step 3, metrics lr, acc
              Epoch [3/10], Step [100/600], Loss: 0.1234           epoch 3, step 100
              Train Epoch: 1 [640/60000 (1%)]  Loss: 2.30          epoch 1, step 640 (the counter)
              loss=0.52                                            no step: keyed by arrival order
    epoch     Epoch 3: 0.52                                        epoch 3
    header    Epoch 2/3                                            no loss; later lines of the rank
                                                                   without an epoch get epoch 2 (Keras)

Steps are as printed (often per epoch): records are keyed by (epoch, step), and by arrival
order where those repeat (see ``rpcctl.inspect``). Validation/test losses (``val_loss``,
``eval_loss``, ``test loss``) are not the loss: written as ``key=value`` or ``key: value`` they
are kept as metrics. A run summary (HF's ``{'train_runtime': …, 'train_loss': …}``, the mean of
the whole run) is not a step's loss and is skipped. A ``losses.pattern`` regex in the config
replaces every rule: its named group ``loss`` is required, ``step`` and ``epoch`` are optional,
and any other named group becomes a metric.

Every record passes the bounds every ``loss`` event passes (``protocol.loss_refusal``): a line
whose step or epoch no training has (beyond ±2^53: a hash, a counter of a C++ log, so its "loss"
is no loss either) makes no record, and a metric whose name is too long is left out;
``--explain`` says so. No line makes the parser raise.

One ``LossParser`` per rank (it remembers the last epoch header). Cost: a line without ``loss``
or ``epoch`` in it is rejected by one precompiled search.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from rpcctl.base.linear_re import Hit as _Hit, Rule as _Rule, compile_linear, re2
from rpcctl.wire import protocol

# Every rule runs on RE2 (``rpcctl.base.linear_re``): time linear in the line, whatever it holds. Python's
# ``\w``, ``\s`` and ``\d`` are Unicode, RE2's ASCII: the classes below spell out Python's.
_W = r"\pL\pN_"  # \w, inside a class
_S = r"[\s\pZ\x85]"  # \s
_D = r"\p{Nd}"  # \d
_NUM = rf"[-+]?(?:{_D}+(?:\.{_D}*)?|\.{_D}+)(?:[eE][-+]?{_D}+)?|[-+]?(?:nan|inf)\b"
_NOT_IN_WORD = _W + "."  # a rule's start is not inside a longer word, a dotted name or a number
_EVAL_WORDS = ("val", "valid", "validation", "test", "eval", "dev")
_EVAL_TAILS = tuple(f"{word}{sep}" for word in _EVAL_WORDS for sep in " _-")


def _not_eval(line: str, hit: _Hit) -> bool:
    """Not a validation/test loss: 'val loss', 'eval-loss' (``val_loss`` never matches: '_' is a word character)."""
    return not line[max(0, hit.start() - 11) : hit.start()].lower().endswith(_EVAL_TAILS)


def _whole_word(line: str, hit: _Hit, group: str) -> bool:
    """The number ends where a word would: 'nanλ' is one word to Python's Unicode ``\\b``, not nan
    (RE2's ``\\b`` is ASCII, and only 'nan' and 'inf' end in a letter)."""
    end = hit.end(group)
    return end >= len(line) or not (line[end].isalnum() or line[end] == "_") or not line[end - 1].isalpha()


_PREFILTER = re2.compile(r"(?i)loss|epoch")
_LOSS = _Rule(
    rf"(?:train(?:ing)?[ _/-]?)?loss(?:[_/]step)?\b(?:{_S}*\([^)]*\))?{_S}*[:=]?{_S}*(?P<loss>{_NUM})",
    not_after=_NOT_IN_WORD,
)
_STEP = _Rule(
    r"(?:global[ _]?)?(?:step|iter(?:ation)?|it|batch|update)s?\b"
    rf"{_S}*[:=#]?{_S}*\[?{_S}*(?P<step>{_D}+)(?:{_S}*/{_S}*{_D}+)?",
    not_after=_NOT_IN_WORD,
)
_EPOCH = _Rule(rf"epoch\b{_S}*[:=#]?{_S}*\[?{_S}*(?P<epoch>{_D}+)(?:{_S}*/{_S}*{_D}+)?", not_after=_NOT_IN_WORD)
_EPOCH_VALUE = _Rule(
    rf"[^{_W}]*epoch{_S}*\[?{_S}*(?P<epoch>{_D}+)(?:{_S}*/{_S}*{_D}+)?\]?{_S}*[:=,-]{_S}*(?P<loss>{_NUM})(?:{_S}.*)?$",
    anchored=True,
)
# "Epoch 2/3", "=== epoch 4 ===", "Epoch 5:" alone on a line: what the following lines belong to.
_EPOCH_HEADER = _Rule(
    rf"[^{_W}]*epoch{_S}*[:#]?{_S}*\[?{_S}*(?P<epoch>{_D}+)(?:{_S}*/{_S}*{_D}+)?{_S}*\]?[^{_W}]*$", anchored=True
)
# A progress counter "n/total" (tqdm, Lightning, Keras, the mnist example's "[640/60000 (1%)]").
_COUNTER = _Rule(rf"(?P<n>{_D}+){_S}*/{_S}*(?P<total>{_D}+)", not_after=_W + "./", not_before=_W + "./")
# A progress bar: a tqdm bar "|█▌  |" or a Rich/Keras bar of box-drawing characters.
_BAR = _Rule(rf"\|[^|]*\|{_S}*{_D}+/|[━─╸╺]{{3,}}|{_D}+%\|")
_METRIC = _Rule(rf"(?P<name>[A-Za-z][{_W}./@-]*?){_S}*[:=]{_S}*(?P<value>{_NUM})", not_after=_NOT_IN_WORD)
# The PyTorch imagenet example's meters: "Acc@1  50.00 ( 48.12)" (the value, then the average).
_METER = _Rule(
    rf"(?P<name>[A-Za-z][{_W}@]*){_S}+(?P<value>{_NUM}){_S}+\({_S}*(?:{_NUM}){_S}*\)", not_after=_NOT_IN_WORD
)
_NOT_METRICS = frozenset(
    {
        "loss",
        "train_loss",
        "training_loss",
        "train/loss",
        "train_loss_step",
        "step",
        "epoch",
        "iter",
        "iteration",
        "it",
        "batch",
        "global_step",
        "v_num",
    }
)
_DICT_LOSS_KEYS = ("loss", "train_loss", "training_loss", "train/loss", "train_loss_step")
_DICT_STEP_KEYS = ("step", "global_step", "iter", "iteration", "it", "batch", "train/global_step")
_DICT_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second")


@dataclass(frozen=True)
class ParsedLoss:
    loss: float
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rule: str = "text"


@dataclass(frozen=True)
class Explanation:
    """What one line yields and why (``rpcctl inspect losses --explain``)."""

    line: str
    rule: str | None  # the rule that decided (None: no rule applied)
    reason: str
    parsed: ParsedLoss | None = None
    epoch_context: int | None = None  # the epoch a header line set, for the lines after it


class LossParser:
    """Turns one rank's printed lines into ``ParsedLoss`` records; ``pattern`` (a regex) replaces
    the default rules. Keep one per rank: an epoch header applies to that rank's later lines."""

    def __init__(self, pattern: str | None = None):
        self.custom = compile_pattern(pattern) if pattern else None
        self.epoch: int | None = None  # from the last epoch header line
        self.last_loss: float | None = None  # the last loss this rank printed (a bar reset repeats it)

    def parse(self, line: str) -> ParsedLoss | None:
        return self.explain(line).parsed

    @staticmethod
    def may_matter(line: str) -> bool:
        """Could this line yield a loss or set the epoch? (Cheap: lines to forward, to count.)"""
        return _PREFILTER.search(line) is not None

    def explain(self, line: str) -> Explanation:
        if self.custom is not None:
            parsed = self._parse_custom(line)
            if parsed is None:
                return Explanation(
                    line, None, "the config's losses.pattern does not match (it replaces every built-in rule)"
                )
            return _storable(Explanation(line, "pattern", "the config's losses.pattern matched", parsed))
        if _PREFILTER.search(line) is None:
            return Explanation(line, None, "no 'loss' or 'epoch' in the line")
        explanation = (
            self._dict(line) or self._bar(line) or self._text(line) or self._epoch_value(line) or self._header(line)
        )
        if explanation is None:
            return Explanation(
                line, None, "no training loss value in the line (validation/test losses, a loss without a number)"
            )
        if explanation.parsed is not None and explanation.parsed.epoch is None and self.epoch is not None:
            parsed = explanation.parsed
            parsed = ParsedLoss(parsed.loss, parsed.step, self.epoch, parsed.metrics, parsed.rule)
            explanation = Explanation(
                line, explanation.rule, explanation.reason + f"; epoch {self.epoch} from the last epoch header", parsed
            )
        explanation = _storable(explanation)
        if explanation.parsed is not None:
            self.last_loss = explanation.parsed.loss
        return explanation

    # -- the rules (each returns None when it does not apply) ------------------------------------
    def _dict(self, line: str) -> Explanation | None:
        start, end = line.find("{"), line.rfind("}")
        if start < 0 or end < start:
            return None
        data = _load_mapping(line[start : end + 1])
        if data is None:
            return None
        kind = "a JSON object" if data[1] == "json" else "a Python dict"
        values: dict[str, Any] = data[0]
        if any(key in values for key in _DICT_SUMMARY_KEYS):
            return Explanation(
                line,
                "dict",
                f"{kind} with {_DICT_SUMMARY_KEYS[0]!r}: a run summary (its loss is the run's mean), not a step",
            )
        loss_key = next((k for k in _DICT_LOSS_KEYS if _number(values.get(k)) is not None), None)
        if loss_key is None:
            return Explanation(line, "dict", f"{kind} without a training loss key ({', '.join(_DICT_LOSS_KEYS)})")
        step_key = next((k for k in _DICT_STEP_KEYS if _number(values.get(k)) is not None), None)
        step = _whole(_number(values.get(step_key))) if step_key else None
        # An int epoch is the epoch; HF's progress through the epochs ('0.25', '1') is a metric.
        raw_epoch = values.get("epoch")
        epoch = raw_epoch if isinstance(raw_epoch, int) and not isinstance(raw_epoch, bool) else None
        metrics = {}
        for key, value in values.items():
            number = _number(value)
            if number is None or key in (loss_key, step_key) or (key == "epoch" and epoch is not None):
                continue
            metrics[str(key)] = number
        parsed = ParsedLoss(_number(values[loss_key]), step, epoch, metrics, "dict")  # type: ignore[arg-type]
        return Explanation(
            line, "dict", f"{kind}: loss from {loss_key!r}" + (f", step from {step_key!r}" if step_key else ""), parsed
        )

    def _bar(self, line: str) -> Explanation | None:
        if _BAR.search(line) is None:
            return None
        loss = _training_loss(line)
        if loss is None:
            return None
        epoch = _EPOCH.search(line)
        counter = next((c for c in _COUNTER.finditer(line) if epoch is None or c.start() >= epoch.end()), None)
        step = _count(counter["n"]) if counter else None
        if step == 0 and _float(loss["loss"]) == self.last_loss:
            # Lightning starts each epoch's bar at 0/N with the last epoch's postfix still on it.
            return Explanation(
                line, "bar", f"a bar reset to {counter[0]!r} still showing the previous loss: not a new step"
            )
        metrics = _metrics(line, loss, start=counter.end() if counter else 0)  # not the bar's "desc: 30%"
        parsed = ParsedLoss(_float(loss["loss"]), step, _count(epoch["epoch"]) if epoch else None, metrics, "bar")
        where = f", step {step} from the counter {counter[0]!r}" if counter else ""
        return Explanation(line, "bar", f"a progress bar: loss from {loss[0]!r}{where}", parsed)

    def _text(self, line: str) -> Explanation | None:
        loss = _training_loss(line)
        if loss is None:
            return None
        step = _STEP.search(line)
        epoch = _EPOCH.search(line)
        step_value = _count(step["step"]) if step else None
        how = f", step from {step[0]!r}" if step else ""
        if step is None:
            counter = next(
                (
                    c
                    for c in _COUNTER.finditer(line)
                    if (epoch is None or c.start() >= epoch.end()) and c.end() <= loss.start()
                ),
                None,
            )
            if counter is not None:
                step_value, how = _count(counter["n"]), f", step from the counter {counter[0]!r}"
        parsed = ParsedLoss(
            _float(loss["loss"]), step_value, _count(epoch["epoch"]) if epoch else None, _metrics(line, loss), "text"
        )
        if step_value is None and parsed.epoch is None:
            how = ", no step or epoch: keyed by arrival order"
        return Explanation(line, "text", f"loss from {loss[0]!r}{how}", parsed)

    def _epoch_value(self, line: str) -> Explanation | None:
        whole = _EPOCH_VALUE.match(line)
        if whole is None:
            return None
        parsed = ParsedLoss(loss=_float(whole["loss"]), epoch=_count(whole["epoch"]), rule="epoch")
        return Explanation(line, "epoch", "'Epoch N: VALUE': the value is the epoch's loss", parsed)

    def _header(self, line: str) -> Explanation | None:
        header = _EPOCH_HEADER.match(line)
        if header is None:
            return None
        epoch = _count(header["epoch"])
        if not protocol.STEP.ok(epoch):  # a hash or a counter, not an epoch: the later lines keep theirs
            return Explanation(line, "header", f"an epoch header whose epoch is not {protocol.STEP.what}: not taken")
        self.epoch = epoch
        return Explanation(
            line,
            "header",
            f"an epoch header: this rank's later lines without an epoch get epoch {self.epoch}",
            epoch_context=self.epoch,
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
        return ParsedLoss(
            loss=loss, step=_int(groups.get("step")), epoch=_int(groups.get("epoch")), metrics=metrics, rule="pattern"
        )


def compile_pattern(pattern: str) -> Any:
    """A config's ``losses.pattern``, compiled by RE2; ``ValueError`` says why one is refused."""
    compiled = compile_linear(pattern)
    if "loss" not in compiled.groupindex:
        raise ValueError("the pattern needs a named group (?P<loss>...)")
    return compiled


def _training_loss(line: str) -> _Hit | None:
    return _LOSS.search(line, keep=lambda hit: _not_eval(line, hit) and _whole_word(line, hit, "loss"))


def _metrics(line: str, loss: _Hit, start: int = 0) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for pattern in (_METRIC, _METER):
        for m in pattern.finditer(line, start, keep=lambda hit: _whole_word(line, hit, "value")):
            name = m["name"].lower()
            if name not in _NOT_METRICS and m.start() != loss.start():
                metrics.setdefault(m["name"], _float(m["value"]))
    return metrics


def _load_mapping(text: str) -> tuple[dict[str, Any], str] | None:
    """A JSON object or a Python dict literal (never evaluated: ``ast.literal_eval``)."""
    try:
        value = json.loads(text)
        kind = "json"
    except RecursionError:  # '{"loss": [[[[...' thousands deep
        return None
    except ValueError:
        try:
            with warnings.catch_warnings():  # '{1abc}' warns on the launcher's stderr: rank text is data
                warnings.simplefilter("ignore", SyntaxWarning)
                value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return None
        kind = "python"
    return (value, kind) if isinstance(value, dict) else None


def _number(value: Any) -> float | None:
    """A number, or a string that spells one (transformers 5 prints ``'loss': '1.0'``)."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value)
    except (ValueError, OverflowError):  # not a number; an integer of 400 digits, beyond any float
        return None
    return None


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) and value == int(value) else None


def _float(text: str) -> float:
    return float(text)


def _count(digits: str) -> int:
    """A step or an epoch as printed. Python refuses to read an integer of more than 4,300 digits:
    one of more than 30 reads as 10^30, which no step is (``_storable`` refuses the record)."""
    return int(digits) if len(digits) <= 30 else 10**30


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text.lstrip("+-").isdigit():
        return _count(text.lstrip("+")) if not text.startswith("-") else -_count(text[1:])
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) else None


def _storable(explanation: Explanation) -> Explanation:
    """The explanation, but without its record when the store could not take one so (a step or an
    epoch that no training has: a hash, a counter of a C++ log, so its 'loss' is no loss either;
    the checker is the one every loss event passes, ``protocol.loss_refusal``)."""
    parsed = explanation.parsed
    if parsed is None:
        return explanation
    metrics = parsed.metrics
    # a metric is extra: only it goes
    kept = {k: v for k, v in metrics.items() if protocol.NAME.ok(k) and protocol.MEASURE.ok(v)}
    if len(kept) != len(metrics):
        parsed = ParsedLoss(parsed.loss, parsed.step, parsed.epoch, kept, parsed.rule)
        explanation = Explanation(
            explanation.line,
            explanation.rule,
            f"{explanation.reason}; {len(metrics) - len(kept)} metric(s)"
            f" left out (a name longer than {protocol.NAME.most:,} characters)",
            parsed,
        )
    refused = protocol.loss_refusal(parsed.step, parsed.epoch, parsed.loss, parsed.metrics)
    if refused is None:
        return explanation
    return Explanation(explanation.line, explanation.rule, f"{explanation.reason}; not a record: {refused}")
