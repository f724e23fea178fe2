"""A real device's actuator that also writes the dry run's log of its calls (``--log`` on nvml).

``--log`` records every clock call as JSON lines; the recording actuators (dry run, twin, a
simulated GPU) write it themselves. :class:`LoggedActuator` gives the same log to an actuator
that sets a real clock (``nvml``, ``zeusd``): each set or restore is written after the device
has taken it, through a :class:`~opdvfs.runtime.actuators.dry_run.DryRunActuator` that records
only, so a run's log reads the same whichever actuator ran it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opdvfs.runtime.actuators.base import Actuator, Meter
from opdvfs.runtime.actuators.dry_run import DryRunActuator

__all__ = ["LoggedActuator"]


class LoggedActuator(Actuator):
    """``device``'s clock calls, passed on, then appended to ``log`` (JSON lines).

    Everything but the clock calls is ``device``'s own (its kind, clocks, sensors, and any
    attribute of its class, such as an NVML actuator's ``device``).

    Parameters
    ----------
    device
        The actuator that sets the clock (closed with this one).
    log
        JSON-lines file (appended to; a header line per run, as the dry run's).
    header
        More fields for that header line.
    """

    def __init__(
        self,
        device: Actuator,
        *,
        log: str | os.PathLike[str],
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.inner = device
        header = {"actuator": device.kind, **(header or {})}
        self.recorder = DryRunActuator(device.supported_freqs_mhz(), log=log, header=header)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "recorder"):  # not yet set: during construction
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def kind(self) -> str:
        """The device's kind (``"nvml"``, ``"zeusd"``)."""
        return self.inner.kind

    @property
    def current_mhz(self) -> float | None:
        """The device's last locked clock (MHz), or None."""
        return self.inner.current_mhz

    @property
    def meter(self) -> Meter | None:
        """The device's sensors."""
        return self.inner.meter

    def supported_freqs_mhz(self) -> Sequence[float]:
        """Return the device's clocks (MHz)."""
        return self.inner.supported_freqs_mhz()

    def at(
        self, iteration: int | None, op_index: int | None, offset_s: float | None = None
    ) -> None:
        """Store where the next call happens, for its record (:meth:`DryRunActuator.at`)."""
        self.recorder.at(iteration, op_index, offset_s)

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the device at ``freq_mhz`` (MHz), then record it (when the clock changed)."""
        self.inner.set_freq_mhz(freq_mhz)
        self.recorder.set_freq_mhz(freq_mhz)

    def reset(self) -> None:
        """Reset the device's clock, then record the restore (a refused reset records none)."""
        self.inner.reset()
        self.recorder.reset()

    def give_back(self) -> None:
        """Give the device's clock back whoever set it, then record the restore."""
        self.inner.give_back()
        self.recorder.reset()

    def read_power_w(self) -> float:
        """Return the device's power (W)."""
        return self.inner.read_power_w()

    def read_energy_j(self) -> float | None:
        """Return the device's energy counter (J), or None."""
        return self.inner.read_energy_j()

    def close(self) -> None:
        """Close the log and the device (the clock is untouched)."""
        self.recorder.close()
        self.inner.close()
