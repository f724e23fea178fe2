"""Callbacks that tune inside the trainers people use, and send tune's headline to their loggers.

- :mod:`opdvfs.integrations.huggingface`: :class:`~opdvfs.integrations.huggingface.OpdvfsCallback`,
  a ``transformers.TrainerCallback``;
- :mod:`opdvfs.integrations.lightning`: :class:`~opdvfs.integrations.lightning.OpdvfsCallback`, a
  ``lightning.pytorch.Callback``.

Each runs :class:`opdvfs.tune` around the trainer's training loop (its optimizer steps end the
iterations, as for any script), writes tune's files, and sends the headline
(:func:`~opdvfs.tuner.report.headline_metrics`) and figures to the trainer's loggers. What both
share is :class:`~opdvfs.integrations._session.TuneSession`. Neither package is imported until
its module is.
"""
