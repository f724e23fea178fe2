"""Measure a block of code: its time and energy, on any device opdvfs reads (``opdvfs.measure``).

``with opdvfs.measure("sim:a100-like") as m: train()`` then ``m.window.time_s`` and
``m.window.energy_j``; or, in the manner of Zeus's ``ZeusMonitor``, named windows that may
overlap: ``monitor = Monitor("nvml"); monitor.begin_window("epoch"); ...;
monitor.end_window("epoch")``. Nothing here sets a clock: the actuators serve as read-only
instruments, through their :attr:`~opdvfs.runtime.actuators.Actuator.meter` (``nvml``,
``zeusd``, a dry run measuring the GPU it runs on) or, on a simulated GPU (``sim:PRESET``), its
own energy counter and virtual clock, which only the program's operators advance.

Time is the device's: a simulated GPU's virtual time; elsewhere the host's wall clock
(:func:`time.perf_counter`) after ``torch.cuda.synchronize()`` when CUDA is in use, so the
window ends when its kernels have. Energy is the device's counter difference (J), None where
there is none (a dry run with a preset's clocks measures nothing).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Self

from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators import Actuator, make_actuator

__all__ = ["Measurement", "Monitor", "Window", "measure"]


@dataclass(frozen=True)
class Window:
    """What one window measured.

    Attributes
    ----------
    name
        The window's name.
    time_s
        Its duration (s): a simulated GPU's virtual time, else wall time (CUDA synchronised).
    energy_j
        The device's energy over it (J), None without an energy counter.
    device
        What measured it: the actuator's kind (``nvml``, ``sim:a100-like`` ...).
    virtual
        Whether ``time_s`` is a simulated GPU's virtual time.
    """

    name: str
    time_s: float
    energy_j: float | None
    device: str
    virtual: bool = False

    @property
    def power_w(self) -> float | None:
        """The mean power over the window (W), None without energy or time."""
        if self.energy_j is None or not self.time_s > 0:
            return None
        return self.energy_j / self.time_s


def _cuda_synchronize() -> None:
    """Wait for the CUDA kernels in flight, where torch is loaded and CUDA is in use."""
    torch = sys.modules.get("torch")  # never import torch for this: a program without it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Monitor:
    """Named measurement windows over one device (they may nest and overlap).

    Parameters
    ----------
    actuator
        An actuator's name (:func:`~opdvfs.runtime.actuators.make_actuator`: ``"nvml"``,
        ``"zeusd"``, ``"sim:PRESET"``, ``"dry-run"``), opened here and closed by :meth:`close`
        (a ``sim:PRESET`` is entered, so the program's operators run on it); or an
        :class:`~opdvfs.runtime.actuators.Actuator` of the caller's (e.g. the one
        ``opdvfs.tune`` drives), only read.
    device, work_scale
        As :func:`~opdvfs.runtime.actuators.make_actuator`, for a name.
    """

    def __init__(
        self,
        actuator: Actuator | str = "nvml",
        *,
        device: str | None = None,
        work_scale: float | None = None,
    ) -> None:
        self._owned = isinstance(actuator, str)
        if isinstance(actuator, str):
            act = make_actuator(actuator, device=device, work_scale=work_scale)
            try:
                if act.timeline is not None:
                    act.__enter__()  # the program's operators run on the simulated GPU
            except BaseException:
                act.close()
                raise
            self.actuator = act
        else:
            self.actuator = actuator
        self._open: dict[str, tuple[float, float | None]] = {}
        self._lock = threading.Lock()

    @property
    def device(self) -> str:
        """The measuring actuator's kind."""
        return self.actuator.kind

    def _now(self) -> tuple[float, float | None]:
        """Return the device's time (s) and energy counter (J, None without one) now."""
        act = self.actuator
        timeline = act.timeline
        if timeline is not None:
            return timeline.now_s(), timeline.energy_j()
        _cuda_synchronize()
        now = time.perf_counter()
        meter = act.meter
        energy = meter.read_energy_j() if meter is not None else act.read_energy_j()
        return now, None if energy is None else float(energy)

    def begin_window(self, name: str) -> None:
        """Open the window ``name``.

        Raises
        ------
        ValidationError
            If a window of that name is open.
        """
        with self._lock:
            if name in self._open:
                raise ValidationError(f"window {name!r} is already open", field="name")
            self._open[name] = self._now()

    def end_window(self, name: str) -> Window:
        """Close the window ``name`` and return what it measured.

        Raises
        ------
        ValidationError
            If no window of that name is open.
        """
        end_s, end_j = self._now()
        with self._lock:
            if name not in self._open:
                raise ValidationError(f"window {name!r} is not open", field="name")
            start_s, start_j = self._open.pop(name)
        energy = end_j - start_j if end_j is not None and start_j is not None else None
        return Window(
            name, end_s - start_s, energy, self.device, virtual=self.actuator.timeline is not None
        )

    def close(self) -> None:
        """Close the actuator when it was opened here (a caller's is left alone); idempotent."""
        if self._owned:
            self._owned = False
            self.actuator.close()

    def __enter__(self) -> Self:
        """Return the monitor (closed on exit)."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the actuator when it was opened here."""
        self.close()


class Measurement:
    """The handle ``with opdvfs.measure(...) as m`` gives: :attr:`window` once the block ends."""

    def __init__(self, monitor: Monitor, name: str) -> None:
        self.monitor = monitor
        self.name = name
        #: What the block measured (None until it ends).
        self.window: Window | None = None

    def __enter__(self) -> Self:
        """Open the window."""
        self.monitor.begin_window(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the window (also when the block raised), then the monitor's own actuator."""
        try:
            self.window = self.monitor.end_window(self.name)
        finally:
            self.monitor.close()


def measure(
    actuator: Actuator | str = "nvml",
    *,
    name: str = "block",
    device: str | None = None,
    work_scale: float | None = None,
) -> Measurement:
    """Measure the time and energy of the block: ``with opdvfs.measure("nvml") as m: ...``.

    ``m.window`` is the :class:`Window` once the block ends. ``actuator``, ``device`` and
    ``work_scale`` are :class:`Monitor`'s. Nothing is set: the clock stays as it is.
    """
    return Measurement(Monitor(actuator, device=device, work_scale=work_scale), name)
