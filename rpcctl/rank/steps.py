"""Losses at the training library's own global step: the Hugging Face Trainer and Lightning.

``autohook`` waits for the import of a library's trainer module (``transformers.trainer``,
``pytorch_lightning``, ``lightning.pytorch``), then registers a callback in every Trainer the
script creates; the script is not changed. Each callback sends ``loss`` events (as
``rpcctl.report`` does) with ``source`` the library's name::

    library       when                                   step                    loss
    transformers  on_log, with a "loss" (every           state.global_step       logs["loss"]: HF's mean over the
                  logging_steps; not eval, not the                               window of each optimizer step's
                  run summary)                                                   loss (gradient accumulation in it)
    lightning     on_train_batch_end, at an optimizer    the step Lightning's    the step's training_step losses,
                  step that Lightning logs               loggers write (one      summed (Lightning divides each by
                  (``should_update_logs``)               less than global_step)  accumulate_grad_batches): their mean

Other numbers go with it as metrics: HF's ``grad_norm``, ``learning_rate`` and its fractional
``epoch``; Lightning's ``epoch`` (``trainer.current_epoch``). The event's epoch stays empty: the
step is global, so the records are keyed by step alone.

Nothing is counted twice: the library's own printed lines (HF's dicts, Lightning's bar) are
still parsed, and ``rpcctl.inspect.losses`` keeps, per rank, the records of the most direct
source it has (``protocol.LOSS_SOURCES``: ``rpcctl.report``, then a library callback, then
printed lines). Printed steps cannot be matched to these: HF prints none, Lightning's bar counts
batches within the epoch. Printed lines stay the fallback: where the hook cannot attach (a
library whose API moved) it says so once on stderr, and the rank's prints are its losses.

HF: the callback class is appended to ``transformers.trainer.DEFAULT_CALLBACKS``, which every
``Trainer.__init__`` reads. Lightning: ``Trainer.__init__`` is wrapped to append the callback to
``trainer.callbacks``. A Lightning loss is converted to a number only at the steps it logs (as
Lightning's own logging does): no device sync at every step.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

TRANSFORMERS, LIGHTNING = "transformers", "lightning"


# How a record is sent (``reporter.report_loss``): given by whoever installs the hooks
# (``autohook.install``), since the reporter imports autohook, which imports this module.
_report: Any = None


def set_report(report: Any) -> None:
    global _report
    _report = report


def _post(step: int, loss: Any, metrics: dict[str, Any], source: str) -> None:
    if _report is not None:
        _report(step, loss, None, metrics, source)


def _say(library: str, exc: BaseException) -> None:
    print(f"rpcctl: {library} losses not read from the trainer (printed lines are used): {exc!r}", file=sys.stderr)


# -- Hugging Face Trainer ---------------------------------------------------------------------
_HF_METRICS = ("grad_norm", "learning_rate", "epoch")


def hf_imported() -> None:
    """``transformers.trainer`` has been imported: every Trainer created from now on reports."""
    try:
        hf_trainer = sys.modules["transformers.trainer"]
        TrainerCallback = hf_trainer.TrainerCallback  # noqa: N806 - the library's class

        if any(getattr(cb, "_rpcctl", False) for cb in hf_trainer.DEFAULT_CALLBACKS):
            return

        class RpcctlLosses(TrainerCallback):
            _rpcctl = True

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
                if not logs or "loss" not in logs or "train_runtime" in logs:
                    return
                try:
                    metrics = {k: logs[k] for k in _HF_METRICS if isinstance(logs.get(k), (int, float))}
                    _post(int(state.global_step), logs["loss"], metrics, TRANSFORMERS)
                except Exception:  # noqa: BLE001 - telemetry never breaks training
                    pass

        hf_trainer.DEFAULT_CALLBACKS.append(RpcctlLosses)
    except Exception as exc:  # noqa: BLE001
        _say(TRANSFORMERS, exc)


# -- Lightning (pytorch_lightning and lightning.pytorch: the same code under two names) -----------
def lightning_imported(package: str) -> None:
    """``package`` (``pytorch_lightning`` or ``lightning.pytorch``) has been imported."""
    try:
        module = sys.modules[package]
        trainer_class, callback_class = module.Trainer, module.Callback
        original = trainer_class.__init__
        if getattr(original, "_rpcctl", False):
            return
        callback_type = _lightning_callback(callback_class)

        @functools.wraps(original)  # its signature and source stay the library's (LightningCLI reads them)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            try:
                self.callbacks.append(callback_type())
            except Exception as exc:  # noqa: BLE001
                _say(LIGHTNING, exc)

        __init__._rpcctl = True  # type: ignore[attr-defined]
        trainer_class.__init__ = __init__
    except Exception as exc:  # noqa: BLE001
        _say(LIGHTNING, exc)


def _lightning_callback(base: type) -> type:
    class RpcctlLosses(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.before: int | None = None  # global_step when the batch started
            self.loss: Any = None  # the losses of the batches since the last optimizer step, summed

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.before = trainer.global_step

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            try:
                loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
                if loss is not None and hasattr(loss, "detach"):
                    self.loss = loss.detach() if self.loss is None else self.loss + loss.detach()
                step = int(trainer.global_step)
                if step == self.before:
                    return  # accumulating: no optimizer step yet
                summed, self.loss = self.loss, None
                written, logs = _lightning_logged(trainer, step)
                if summed is not None and logs:
                    _post(written, summed, {"epoch": trainer.current_epoch}, LIGHTNING)
            except Exception:  # noqa: BLE001 - telemetry never breaks training
                pass

    return RpcctlLosses


def _lightning_logged(trainer: Any, step: int) -> tuple[int, bool]:
    """At the batch of an optimizer step (``global_step`` is ``step`` already): the step Lightning's
    own loggers write for it (CSVLogger, TensorBoard: its epoch loop's ``_batches_that_stepped``, not
    yet counted up, so one less than ``global_step``) and whether it logs this one
    (``should_update_logs``); else as they compute them."""
    written = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    if type(written) is not int:
        written = step - 1
    logs = getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", None)
    if type(logs) is not bool:
        logs = (written + 1) % (getattr(trainer, "log_every_n_steps", 1) or 1) == 0
    return written, logs


IMPORT_HOOKS = (
    ("transformers.trainer", hf_imported),
    ("pytorch_lightning", lambda: lightning_imported("pytorch_lightning")),
    ("lightning.pytorch", lambda: lightning_imported("lightning.pytorch")),
)
