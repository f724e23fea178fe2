"""Tune a Lightning ``Trainer``'s clocks: ``Trainer(callbacks=[OpdvfsCallback()])``.

:class:`OpdvfsCallback` is a ``lightning.pytorch.Callback``: it opens :class:`opdvfs.tune`
when training starts and closes it when training ends, or when training raises
(``on_exception``: the clock restored, the error handed on); tune's files go to ``out``, by
default ``<default_root_dir>/opdvfs``. Then tune's headline
(:func:`~opdvfs.tuner.report.headline_metrics`: ``opdvfs/steady_saving``,
``opdvfs/run_saving``, ``opdvfs/break_even_iteration``, ``opdvfs/static_saving`` ...) goes to
every logger of the trainer (``log_metrics``), and tune's figures to those that take images
(TensorBoard's ``add_image``, Weights & Biases' ``log_image``). The model, the data and the
loop are untouched; the iterations are the optimizer steps.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from opdvfs.integrations._session import TunedCallback, TuneSession

__all__ = ["OpdvfsCallback"]

log = logging.getLogger("opdvfs")


class OpdvfsCallback(TunedCallback, Callback):
    """Tune the clocks of the training the Lightning ``Trainer`` runs; report to its loggers.

    tune's files go to ``out``, by default ``<default_root_dir>/opdvfs``.

    The parameters are :class:`~opdvfs.integrations._session.TunedCallback`'s (``target``,
    ``actuator``, ``out`` and :class:`opdvfs.tune`'s keywords).
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the tune (the top clock locked for its warm-up)."""
        self.session.start(default_out=os.path.join(trainer.default_root_dir, "opdvfs"))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the tune; send its headline and figures to the trainer's loggers."""
        if self.session.stop() is None:
            return
        if trainer.is_global_zero:
            send(trainer, self.session)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Close the tune with the error (the clock restored at once); Lightning re-raises."""
        self.session.stop(exception)


def send(trainer: Trainer, session: TuneSession) -> None:
    """Send the headline to every logger of ``trainer``, and the figures to those taking images.

    A logger that fails is skipped with a line on the ``opdvfs`` logger; the others still get
    theirs.
    """
    metrics = session.metrics()
    step = trainer.global_step
    figures = session.figures()
    for logger in trainer.loggers:
        try:
            logger.log_metrics(metrics, step=step)
            experiment: Any = getattr(logger, "experiment", None)
            if figures and hasattr(logger, "log_image"):  # Weights & Biases
                for name, path in figures.items():
                    logger.log_image(key=f"opdvfs/{name}", images=[str(path)], step=step)
            elif figures and hasattr(experiment, "add_image"):  # TensorBoard
                for name, image in session.figure_arrays().items():
                    experiment.add_image(f"opdvfs/{name}", image[..., :3], step, dataformats="HWC")
            logger.save()
        except Exception as exc:  # a logger's failure never ends the training's report
            log.warning("tune: could not send the headline to %s: %s", type(logger).__name__, exc)
