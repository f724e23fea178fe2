"""An actuator over a simulated GPU (``sim:PRESET``): a clock that can be set, on any CPU.

:class:`SimGpuActuator` sets the clock of a :class:`~opdvfs.sim.gpu.SimulatedGpu` and reads
its power and energy counter, as the NVML actuator does a real GPU's. Entered (``with``), it
launches every operator the program dispatches on that GPU
(:class:`~opdvfs.runtime.simgpu_feed.SimGpuFeed`), so a script running on the CPU behaves, for
opdvfs, like a GPU whose clock can be set: its times and energy are the simulated device's.
Each call is recorded like the dry run's (the same JSON lines), so a run's log reads the same.
Its :attr:`~SimGpuActuator.timeline` is the simulated GPU: callers put switches on the device's
virtual clock, and read its times there, through that query alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from opdvfs.runtime.actuators.dry_run import DryRunActuator
from opdvfs.sim.gpu import SimulatedGpu

__all__ = ["SIM_PREFIX", "SimGpuActuator"]

#: ``make_actuator`` kind prefix of a simulated GPU: ``sim:a100-like``.
SIM_PREFIX = "sim:"


class SimGpuActuator(DryRunActuator):
    """Set and read a simulated GPU's clock; record each call like :class:`DryRunActuator`.

    Parameters
    ----------
    gpu
        The simulated GPU (also :attr:`gpu`, and :attr:`timeline`).
    optimizer_steps
        Whether its iterations end at optimizer steps (False: only at :meth:`mark_iteration`).
    log, header
        As :class:`DryRunActuator`.
    """

    def __init__(
        self,
        gpu: SimulatedGpu,
        *,
        optimizer_steps: bool = True,
        log: str | os.PathLike[str] | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(gpu.supported_freqs_mhz(), log=log, header=header)
        self.gpu = gpu
        self.optimizer_steps = optimizer_steps
        self._feed: Any = None
        self._op: tuple[int | None, int | None, float | None] = (None, None, None)

    @property
    def kind(self) -> str:
        """The actuator kind that builds it (``sim:PRESET``)."""
        return f"{SIM_PREFIX}{self.gpu.name}"

    @property
    def timeline(self) -> SimulatedGpu:
        """The simulated GPU the program runs on: its virtual clock is the program's."""
        return self.gpu

    @property
    def preset(self) -> str:
        """The simulated GPU's preset."""
        return self.gpu.name

    def cancel_pending(self) -> None:
        """Drop the requests waiting on the GPU's timeline; the clock: where the GPU settles."""
        self._current_mhz = self.gpu.cancel_requests()

    def at(
        self, iteration: int | None, op_index: int | None, offset_s: float | None = None
    ) -> None:
        """Store where the next call happens (as :meth:`DryRunActuator.at`).

        A switch issued ``offset_s`` after its trigger operator started is issued that long
        after that operator started on the device's timeline.
        """
        super().at(iteration, op_index, offset_s)
        self._op = (iteration, op_index, offset_s)

    def _issue_at_s(self) -> float | None:
        iteration, op_index, offset_s = self._op
        self._op = (None, None, None)
        if iteration is None or op_index is None or not offset_s:
            return None
        start_s = self.gpu.op_start_s(iteration, op_index)
        return None if start_s is None else start_s + offset_s

    def set_freq_mhz(self, freq_mhz: float) -> None:
        """Request ``freq_mhz`` (MHz) on the device; it lands the switch latency later.

        Raises
        ------
        UnsupportedClockError
            If the device does not support it.
        """
        freq = self.check_freq_mhz(freq_mhz)
        if freq == self._current_mhz:
            self._op = (None, None, None)
            return
        at_s = self._issue_at_s()
        super().set_freq_mhz(freq)
        self.gpu.request_freq_mhz(freq, at_s=at_s)

    def reset(self) -> None:
        """Give the clock back to the driver (a request for the top clock); recorded."""
        super().reset()
        self.gpu.reset()

    def read_power_w(self) -> float:
        """Return the device's power over its sensor's last window (W)."""
        return self.gpu.power_w()

    def read_energy_j(self) -> float:
        """Return the device's total-energy counter (J)."""
        return self.gpu.energy_j()

    def mark_iteration(self) -> None:
        """End an iteration on the device (``--iteration-at``; optimizer steps end their own)."""
        if self._feed is not None:
            self._feed.mark_iteration()

    def per_iteration(self, skip: int = 1) -> dict[str, float | None]:
        """Mean virtual time (s) and energy (J) per iteration after the first ``skip``."""
        return self.gpu.per_iteration(skip)

    def __enter__(self) -> Self:
        """Start launching the program's operators on the device (a dispatch mode; torch)."""
        from opdvfs.runtime.simgpu_feed import SimGpuFeed

        if self._feed is None:
            feed = SimGpuFeed(self.gpu, optimizer_steps=self.optimizer_steps)
            feed.__enter__()
            self._feed = feed
        return self

    def close(self) -> None:
        """Stop launching operators on the device and close the log; safe more than once."""
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.__exit__(None, None, None)
        super().close()
