"""``RunResult``: what an execution of a schedule measured (on the simulator or a real device)."""

from __future__ import annotations

from typing import Self

import pydantic
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from opdvfs._model import FrozenModel

__all__ = ["RunResult", "StageRecord"]


class StageRecord(FrozenModel):
    """One stage as it actually ran: when, at which clock, and what it cost."""

    stage: NonNegativeInt
    first_op: NonNegativeInt
    last_op: NonNegativeInt
    freq_mhz: PositiveFloat
    start_s: NonNegativeFloat
    end_s: NonNegativeFloat
    chip_energy_j: NonNegativeFloat | None = None
    core_energy_j: NonNegativeFloat | None = None

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.end_s < self.start_s or self.last_op < self.first_op:
            raise ValueError("a stage must end at or after its start")
        return self


class RunResult(FrozenModel):
    """Measured outcome of running a workload, per iteration (means over ``iterations``).

    Energies are per iteration; powers are the mean over the iteration. ``simulated`` says
    whether the numbers come from the built-in simulator, and reports must say so.
    """

    device: str = Field(min_length=1)
    workload: str = Field(min_length=1)
    simulated: bool
    iterations: PositiveInt
    iteration_time_s: PositiveFloat
    chip_power_w: NonNegativeFloat
    chip_energy_j: NonNegativeFloat
    core_power_w: NonNegativeFloat | None = None
    core_energy_j: NonNegativeFloat | None = None
    switches: NonNegativeInt = 0
    schedule: str | None = None
    timeline: tuple[StageRecord, ...] = ()

    @pydantic.model_validator(mode="after")
    def _energy_matches_power(self) -> Self:
        # Energy and mean power over the same time must agree; a mismatch means a unit slip.
        expected = self.chip_power_w * self.iteration_time_s
        if abs(self.chip_energy_j - expected) > 1e-6 * max(1.0, expected):
            raise ValueError(
                f"chip_energy_j {self.chip_energy_j:g} J != chip_power_w x iteration_time_s "
                f"= {expected:g} J"
            )
        return self
