"""What both trainer callbacks share: a tune opened in one hook and closed in another.

A trainer calls a callback at the start and at the end of training, not around it, so the
:class:`opdvfs.tune` context is entered in one hook and left in another (or in the trainer's
exception hook). Where a trainer offers no exception hook (transformers), an exception out of
training leaves the context open: the clock guard then restores the clock at interpreter exit,
on SIGINT/SIGTERM, or at :meth:`TuneSession.close`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from opdvfs.tuner.context import tune
from opdvfs.tuner.report import headline_lines, headline_metrics
from opdvfs.tuner.result import TuneResult

__all__ = ["FIGURES", "TuneSession", "TunedCallback"]

log = logging.getLogger("opdvfs")

#: The figures tune writes that the callbacks send to the loggers (those that exist).
FIGURES = ("run.png", "clock.png", "phases.png")


class TuneSession:
    """One :class:`opdvfs.tune` opened by :meth:`start` and closed by :meth:`stop`.

    Parameters
    ----------
    target, actuator, out
        As :class:`opdvfs.tune` (``out``: the folder for tune's files; None: chosen at
        :meth:`start`).
    options
        The rest of :class:`opdvfs.tune`'s keywords (``clocks``, ``work_scale``, ``pairs``...).
    """

    def __init__(
        self,
        target: float,
        actuator: str,
        out: str | os.PathLike[str] | None,
        options: dict[str, Any],
    ) -> None:
        self.target, self.actuator, self.out = target, actuator, out
        self.options = options
        self.context: tune | None = None
        #: The last run's result (after :meth:`stop`).
        self.result: TuneResult | None = None
        #: The last run's tuner (after :meth:`stop`: its clock guard says it restored).
        self.tuner: Any = None
        self._status: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        """Whether a tune is open."""
        return self.context is not None

    def start(self, default_out: str | os.PathLike[str] | None = None) -> None:
        """Open the tune (the top clock locked for its warm-up); files go to ``out``."""
        if self.context is not None:
            return
        out = self.out if self.out is not None else default_out
        context = tune(
            self.target,
            actuator=self.actuator,
            out=out,
            on_iteration=self._progress,
            **self.options,
        )
        context.__enter__()
        self.context = context
        self.out = out
        log.info("tune: started on %s (target %.2f%% slowdown)", self.actuator, self.target * 100)

    def _progress(self, status: dict[str, Any]) -> None:
        self._status = status

    def status(self) -> dict[str, float]:
        """Return the run's state now as numbers for a logger: the clock and the saving so far."""
        s = self._status
        out: dict[str, float] = {}
        if s.get("freq_mhz") is not None:
            out["opdvfs/freq_mhz"] = float(s["freq_mhz"])
        if s.get("saving") is not None:
            out["opdvfs/measured_saving"] = float(s["saving"])
        return out

    def stop(self, exc: BaseException | None = None) -> TuneResult | None:
        """Close the tune (the clock restored; the files written); return its result."""
        context, self.context = self.context, None
        if context is None:
            return self.result
        if exc is None:
            context.__exit__(None, None, None)
        else:
            context.__exit__(type(exc), exc, exc.__traceback__)
        self.result = context.result
        self.tuner = context.tuner
        for line in headline_lines(self.result):
            log.info("tune: %s", line)
        return self.result

    close = stop

    def metrics(self) -> dict[str, float]:
        """Return the last result's headline as numbers (:func:`headline_metrics`)."""
        return headline_metrics(self.result) if self.result is not None else {}

    def figures(self) -> dict[str, Path]:
        """Return tune's figures that were written, by name (none without ``out``)."""
        if self.out is None:
            return {}
        folder = Path(self.out)
        return {name: folder / name for name in FIGURES if (folder / name).is_file()}

    def figure_arrays(self) -> dict[str, Any]:
        """Return the figures as RGB(A) arrays (height, width, channels), for image loggers."""
        from matplotlib.image import imread

        return {name: imread(path) for name, path in self.figures().items()}


class TunedCallback:
    """What both callbacks are besides their trainer's base class: a :class:`TuneSession`.

    Parameters
    ----------
    target
        Allowed measured slowdown (0.02 = 2%).
    actuator
        As :class:`opdvfs.tune`: ``"nvml"``, ``"zeusd"``, ``"sim:PRESET"``, ``"dry-run"``.
    out
        Folder for tune's files (default: the trainer's output folder's ``opdvfs``).
    options
        The rest of :class:`opdvfs.tune`'s keywords (``clocks``, ``work_scale``, ``pairs``,
        ``rounds``, ``cache`` ...).
    """

    def __init__(
        self,
        target: float = 0.02,
        *,
        actuator: str = "nvml",
        out: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()  # the trainer's callback base (no arguments)
        self.session = TuneSession(target, actuator, out, options)

    @property
    def result(self) -> TuneResult | None:
        """What the last training's tune measured (None before it ended)."""
        return self.session.result

    def close(self) -> None:
        """Close the tune if it is still open (training raised): the clock restored now."""
        self.session.close()
