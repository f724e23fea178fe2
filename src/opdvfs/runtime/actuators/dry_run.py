"""An actuator that changes nothing and records every call (one JSON line each, if logging).

Given a ``meter`` (an :class:`~opdvfs.runtime.actuators.nvml.NvmlReader`), it measures the real
GPU it runs on, read-only: power, the energy counter and the die temperature come from the
meter, while every clock call is only recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from opdvfs.runtime.actuators.base import Actuator, Meter

__all__ = ["DryRunActuator"]


class DryRunActuator(Actuator):
    """Pretend to set clocks; keep ``calls`` and optionally append them to a JSON-lines log.

    Each record is ``{"kind": "set"|"restore", "iteration", "op_index", "freq_mhz", "t_s",
    "offset_s"}``; the executor sets ``iteration``, ``op_index`` and ``offset_s`` through
    :meth:`at` before each call. The log
    is appended to and opened at the first record, which a header line ``{"kind": "run", "t_s",
    "pid", "freqs_mhz", ...header}`` precedes, so runs sharing one file can be told apart.

    Parameters
    ----------
    freqs_mhz
        The clocks it accepts (MHz), in any order.
    log
        JSON-lines file the records are appended to (created with its folder), or None.
    power_w
        What :meth:`read_power_w` returns without a meter (W).
    header
        More fields for the log's header line (the command, the schedule, the rank ...).
    meter
        Read-only sensors of the device the program runs on (an
        :class:`~opdvfs.runtime.actuators.nvml.NvmlReader`), or None: nothing is measured
        (power ``power_w``, no energy counter, no temperature). Closed with the actuator;
        :attr:`meter` returns it.
    """

    def __init__(
        self,
        freqs_mhz: Sequence[float],
        *,
        log: str | os.PathLike[str] | None = None,
        power_w: float = 0.0,
        header: Mapping[str, Any] | None = None,
        meter: Meter | None = None,
    ) -> None:
        self._meter = meter
        self._freqs = tuple(sorted(float(f) for f in freqs_mhz))
        self._power_w = power_w
        # re-entrant: a signal handler restoring the clock may interrupt a record on this thread
        self._lock = threading.RLock()
        self._where: tuple[int | None, int | None] = (None, None)
        self._offset_s: float | None = None
        self._log: TextIO | None = None
        # absolute now: the log opens at the first record, after a script's os.chdir
        self._log_path = Path(log).absolute() if log else None
        self._header = dict(header or {})
        self.calls: list[dict[str, Any]] = []
        self._current_mhz: float | None = None

    @property
    def kind(self) -> str:
        """``"dry-run"``."""
        return "dry-run"

    @property
    def current_mhz(self) -> float | None:
        """The clock last recorded as set (MHz), or None: none since construction or reset."""
        return self._current_mhz

    @property
    def meter(self) -> Meter | None:
        """The meter given at construction (the GPU it runs on, read-only), or None."""
        return self._meter

    def at(
        self, iteration: int | None, op_index: int | None, offset_s: float | None = None
    ) -> None:
        """Store where in the program the next call happens (written into its record).

        Parameters
        ----------
        iteration
            Training iteration (0-based), or None outside any.
        op_index
            Position of the trigger operator in that iteration (0-based), or None (a switch
            issued by time, counted from the iteration's start).
        offset_s
            Seconds after that operator (or the iteration) started that the call is issued,
            on the plan's time line; None: at once. Recorded as ``offset_s``.
        """
        self._where = (iteration, op_index)
        self._offset_s = offset_s

    @property
    def where(self) -> tuple[int | None, int | None]:
        """The ``(iteration, op_index)`` the next call will be recorded at (see :meth:`at`)."""
        return self._where

    def _record(self, kind: str, freq: float | None) -> None:
        iteration, op_index = self._where
        entry = {
            "kind": kind,
            "iteration": iteration,
            "op_index": op_index,
            "freq_mhz": freq,
            "t_s": time.time(),
            "offset_s": self._offset_s,
        }
        line = json.dumps(entry) + "\n"
        with self._lock:
            self.calls.append(entry)
            if self._log is None and self._log_path is not None:
                self._open_log()
            if self._log is not None:
                self._log.write(line)
                self._log.flush()

    def _open_log(self) -> None:
        """Open the log at the first record (a run refused before it starts leaves no trace)."""
        assert self._log_path is not None
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self._log_path.open("a", encoding="utf-8")
        first = {"kind": "run", "t_s": time.time(), "pid": os.getpid()}
        first.update(freqs_mhz=list(self._freqs), **self._header)
        self._log.write(json.dumps(first) + "\n")

    def supported_freqs_mhz(self) -> Sequence[float]:
        """Return the clocks given at construction."""
        return self._freqs

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Record a clock change (MHz; only when the clock actually changes).

        Raises
        ------
        UnsupportedClockError
            If ``freq_mhz`` is not one of the clocks given at construction.
        """
        freq = self.check_freq_mhz(freq_mhz)
        if freq == self._current_mhz:
            return
        self._current_mhz = freq
        self._record("set", freq)

    def reset(self) -> None:
        """Record the restore of the default clock management."""
        self._current_mhz = None
        self._record("restore", None)

    def read_power_w(self) -> float:
        """Return the meter's power (W), or without one the constant given at construction."""
        if self._meter is not None:
            return self._meter.read_power_w()
        return self._power_w

    def read_energy_j(self) -> float | None:
        """Return the meter's energy counter (J), or None without a meter."""
        return self._meter.read_energy_j() if self._meter is not None else None

    def read_temperature_c(self) -> float | None:
        """Return the meter's die temperature (deg C), or None without a meter."""
        return self._meter.read_temperature_c() if self._meter is not None else None

    def close(self) -> None:
        """Close the log file and the meter (the calls stay in :attr:`calls`); idempotent."""
        with self._lock:
            self._log_path = None  # nothing is recorded into the file after this
            if self._log is not None:
                self._log.close()
                self._log = None
        if self._meter is not None:
            self._meter.close()
