"""``PowerCalibration``: the offline measurements a power model may use besides the profile.

A data contract between the device (the simulator, or a user's idle and cool-down runs) and the
power model (paper §5.2, Fig. 11), so that neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from opdvfs.devices.spec import VoltageCurve
from opdvfs.exceptions import ValidationError

__all__ = ["PowerCalibration"]


@dataclass(frozen=True)
class PowerCalibration:
    """The paper's offline measurements (Fig. 11): idle power at two clocks and a cool-down.

    Attributes
    ----------
    idle
        One row per clock: ``freq_mhz`` and the rail's power, ``core_power_w`` and/or
        ``chip_power_w``, optionally ``temp_c`` (steady state with nothing running).
    cooldown
        Samples while the idle chip cools after a load, at one clock: ``freq_mhz``,
        ``temp_c`` and the rails' power, ``core_power_w`` and/or ``chip_power_w`` (a GPU's
        board sensor reads the chip's only), none whose sensor window still covers the load.
        ``dP/dT = gamma V`` there (paper §5.2; eq. 16's ``gamma_SoC`` on the chip rail,
        :func:`~opdvfs.models.thermal.leakage_slope`). None: no trace (``gamma`` is then
        fitted jointly on the core rail, or the temperature term left out).
    """

    idle: pd.DataFrame
    cooldown: pd.DataFrame | None = None

    def gamma(self, voltage: VoltageCurve) -> float:
        """Leakage slope ``gamma`` (W per K per V) from the cool-down samples."""
        cool = self.cooldown
        if cool is None:
            raise ValidationError("the calibration has no cool-down trace", field="cooldown")
        volt = float(voltage.voltage_v(float(cool["freq_mhz"].iloc[0])))
        slope = np.polyfit(cool["temp_c"].to_numpy(float), cool["core_power_w"].to_numpy(float), 1)[
            0
        ]
        return max(float(slope) / volt, 0.0)
