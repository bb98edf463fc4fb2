"""rpcctl: launch, inspect and benchmark torch.distributed.rpc jobs."""

__version__ = "0.1.0"


def report(step: int | None = None, loss: float | None = None, **metrics: float) -> None:
    """Record a training metric from inside a rank launched by ``rpcctl launch``.

    Never blocks: the record is queued for a background sender, and dropped (and counted) if
    the queue is full. Outside rpcctl it does nothing, so scripts stay runnable under torchrun.
    """
    from rpcctl.rank import reporter

    reporter.report(step=step, loss=loss, **metrics)
