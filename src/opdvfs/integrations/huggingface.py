"""Tune a Hugging Face ``Trainer``'s clocks: ``Trainer(..., callbacks=[OpdvfsCallback()])``.

:class:`OpdvfsCallback` is a ``transformers.TrainerCallback``: it opens :class:`opdvfs.tune`
when training begins and closes it when training ends (the clock restored, tune's files written
to ``out``, by default ``<output_dir>/opdvfs``), then appends tune's headline
(:func:`~opdvfs.tuner.report.headline_metrics`: ``opdvfs/steady_saving``,
``opdvfs/run_saving``, ``opdvfs/break_even_iteration``, ``opdvfs/static_saving`` ...) to the
trainer's ``state.log_history`` and sends it and tune's figures to the loggers ``report_to``
names: TensorBoard (scalars and images, in ``logging_dir``, ``$TENSORBOARD_LOGGING_DIR`` or
``<output_dir>/runs/opdvfs``), Weights & Biases (the active run)
and MLflow (the active run: metrics and the figures as artifacts). The model, the data and the
training loop are untouched; the iterations are the trainer's optimizer steps.

``transformers`` has no hook for an exception out of training: then the tune stays open, and
its clock guard restores the clock at interpreter exit or on SIGINT/SIGTERM, or at once with
:meth:`OpdvfsCallback.close`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from opdvfs.integrations._session import TunedCallback, TuneSession

__all__ = ["OpdvfsCallback"]

log = logging.getLogger("opdvfs")


class OpdvfsCallback(TunedCallback, TrainerCallback):
    """Tune the clocks of the training the ``Trainer`` runs; report to its loggers.

    tune's files go to ``out``, by default ``<output_dir>/opdvfs``.

    The parameters are :class:`~opdvfs.integrations._session.TunedCallback`'s (``target``,
    ``actuator``, ``out`` and :class:`opdvfs.tune`'s keywords).
    """

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Open the tune (the top clock locked for its warm-up)."""
        self.session.start(default_out=os.path.join(args.output_dir or ".", "opdvfs"))

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Close the tune; log its headline to ``state.log_history`` and ``report_to``."""
        if self.session.stop() is None:
            return
        metrics = self.session.metrics()
        state.log_history.append({**metrics, "step": state.global_step})
        if state.is_world_process_zero:
            send(args, state.global_step, metrics, self.session)


def _report_to(args: TrainingArguments) -> list[str]:
    names = args.report_to
    if names is None or names == "none":
        return []
    if isinstance(names, str):
        names = [names]
    return [n for n in names if n != "none"]


def send(
    args: TrainingArguments, step: int, metrics: dict[str, float], session: TuneSession
) -> None:
    """Send the headline and the figures to each logger ``args.report_to`` names.

    A logger that cannot take them (its package missing, no active run) is skipped with a
    line on the ``opdvfs`` logger; the others still get theirs.
    """
    for name in _report_to(args):
        sender = _SENDERS.get(name)
        if sender is None:
            log.info("tune: no sender for the %r logger: its headline is in log_history", name)
            continue
        try:
            sender(args, step, metrics, session)
        except Exception as exc:  # a logger's failure never ends the training's report
            log.warning("tune: could not send the headline to %s: %s", name, exc)


def _tensorboard(
    args: TrainingArguments, step: int, metrics: dict[str, float], session: TuneSession
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    # transformers < 5: args.logging_dir; 5: $TENSORBOARD_LOGGING_DIR, else under output_dir
    log_dir = (
        getattr(args, "logging_dir", None)
        or os.environ.get("TENSORBOARD_LOGGING_DIR")
        or os.path.join(args.output_dir or ".", "runs", "opdvfs")
    )
    writer = SummaryWriter(log_dir=log_dir)
    try:
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        for name, image in session.figure_arrays().items():
            writer.add_image(f"opdvfs/{name}", image[..., :3], step, dataformats="HWC")
    finally:
        writer.close()


def _wandb(
    args: TrainingArguments, step: int, metrics: dict[str, float], session: TuneSession
) -> None:
    import wandb

    if wandb.run is None:
        raise RuntimeError("no active wandb run")
    figures = {f"opdvfs/{name}": wandb.Image(str(path)) for name, path in session.figures().items()}
    wandb.run.log({**metrics, **figures})


def _mlflow(
    args: TrainingArguments, step: int, metrics: dict[str, float], session: TuneSession
) -> None:
    import mlflow

    if mlflow.active_run() is None:
        raise RuntimeError("no active MLflow run")
    mlflow.log_metrics({k.replace("/", "_"): v for k, v in metrics.items()}, step=step)
    for path in session.figures().values():
        mlflow.log_artifact(str(path), artifact_path="opdvfs")


_SENDERS = {"tensorboard": _tensorboard, "wandb": _wandb, "mlflow": _mlflow}
