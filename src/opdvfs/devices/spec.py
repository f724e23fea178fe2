"""``DeviceSpec``: what planning and simulation need to know about an accelerator."""

from __future__ import annotations

import itertools
from typing import Literal, Self

import numpy as np
import pydantic
from pydantic import Field, PositiveFloat

from opdvfs._model import FrozenModel

__all__ = ["DeviceSpec", "IdlePower", "VoltageCurve"]


class VoltageCurve(FrozenModel):
    """Core voltage against core clock: flat below a knee, linear above (paper Fig. 9).

    ``V(f) = flat_v + slope_v_per_mhz * max(0, f - knee_mhz)``. On the paper's Ascend part the
    voltage is constant below 1300 MHz and rises linearly to about 0.81-0.82 V at 1800 MHz.
    """

    knee_mhz: PositiveFloat
    flat_v: PositiveFloat
    slope_v_per_mhz: float = Field(ge=0.0)

    def voltage_v(self, freq_mhz: np.ndarray | float) -> np.ndarray:
        """Return the core voltage (V) at each clock in ``freq_mhz`` (vectorised)."""
        f = np.asarray(freq_mhz, dtype=float)
        return self.flat_v + self.slope_v_per_mhz * np.maximum(0.0, f - self.knee_mhz)


class IdlePower(FrozenModel):
    """A rail's idle power, ``beta f V^2 + theta V`` (paper eq. 12), f in GHz, V from the curve.

    The power floor the throughput form of the power model stands on when a profile trains on
    two clocks (its two per-op terms cannot also identify it); ``opdvfs characterise`` fits it
    with the device's V-f curve (relative volts, like the curve).
    """

    rail: Literal["core", "chip"]
    beta_w_per_ghz_v2: float = Field(ge=0.0)
    theta_w_per_v: float = Field(ge=0.0)

    def power_w(self, freq_mhz: np.ndarray | float, voltage: VoltageCurve) -> np.ndarray:
        """Return the idle power (W) at each clock in ``freq_mhz`` on ``voltage``."""
        f = np.asarray(freq_mhz, dtype=float)
        volt = voltage.voltage_v(f)
        return self.beta_w_per_ghz_v2 * f / 1e3 * volt**2 + self.theta_w_per_v * volt


class DeviceSpec(FrozenModel):
    """An accelerator's clock domain, its V-f curve, switching and sensing behaviour.

    Parameters
    ----------
    name
        Preset or device name (``ascend-910b-like``, ``NVIDIA H100 80GB HBM3``).
    freqs_mhz
        Supported core clocks, strictly ascending (MHz).
    simulated
        Whether the device is the built-in simulator (reports then say results are simulated).
    voltage
        V-f curve, if known (a preset's, or ``opdvfs characterise``'s from power alone); the
        power model uses the generic prior or fits one when it is not.
    idle
        Idle power on ``voltage`` (``opdvfs characterise``), if known.
    switch_latency_ms
        Time from a clock request to the clock taking effect (Ascend ~1 ms, NVIDIA ~15 ms).
    power_sample_period_ms
        Granularity of the power sensor (Ascend ~1 ms; NVML averages over 100 ms-1 s).
    tdp_w
        Board/chip power limit (W), if known.
    ambient_c
        Ambient (inlet) temperature for the thermal model (deg C), if known.
    source
        Where the numbers come from (datasheet, paper table, measured file).
    """

    name: str = Field(min_length=1)
    freqs_mhz: tuple[PositiveFloat, ...] = Field(min_length=1)
    simulated: bool = False
    vendor: str = "unknown"
    voltage: VoltageCurve | None = None
    idle: IdlePower | None = None
    switch_latency_ms: float = Field(default=1.0, ge=0.0)
    power_sample_period_ms: PositiveFloat = 1.0
    tdp_w: PositiveFloat | None = None
    ambient_c: float | None = None
    source: str = ""

    @pydantic.field_validator("freqs_mhz")
    @classmethod
    def _ascending(cls, freqs: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in itertools.pairwise(freqs)):
            raise ValueError("clocks must be strictly ascending (MHz), without repeats")
        return freqs

    @property
    def max_freq_mhz(self) -> float:
        """Highest supported clock (MHz): the baseline of every plan."""
        return self.freqs_mhz[-1]

    @property
    def min_freq_mhz(self) -> float:
        """Lowest supported clock (MHz)."""
        return self.freqs_mhz[0]

    def nearest_freqs_mhz(self, freq_mhz: np.ndarray | float) -> np.ndarray:
        """Snap each requested clock to the nearest supported one (ties go to the higher)."""
        grid = np.asarray(self.freqs_mhz)
        f = np.atleast_1d(np.asarray(freq_mhz, dtype=float))
        idx = np.clip(np.searchsorted(grid, f), 1, len(grid) - 1) if len(grid) > 1 else None
        if idx is None:
            return np.full_like(f, grid[0])
        lower, upper = grid[idx - 1], grid[idx]
        return np.where(f - lower < upper - f, lower, upper)

    def with_changes(self, **changes: object) -> Self:
        """Return a validated copy with some fields replaced."""
        return type(self).model_validate({**self.model_dump(), **changes})
