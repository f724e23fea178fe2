"""The thermal model ``T = T0 + k P_chip`` (paper eq. 15) and its fixed point at a new clock.

``T0`` and ``k`` come from the profile's load runs: the mean temperature and the time-weighted
chip power of each profiled clock (and the idle runs of a calibration, when given). At a clock
not profiled, the temperature rise ``dT`` that the leakage term ``gamma dT V`` needs depends on
the power, which depends on ``dT``: :func:`solve_temperature` iterates from ``dT = 0`` (the
paper reports <= 4 steps).

The leakage slope ``gamma`` of ``gamma dT V`` (eqs. 10-11) is not identified by static-clock
profiles: across them the clock and the die's temperature move together (a lower clock runs
cooler), so a joint fit hands the temperature's share to the clock's terms. The paper takes it
from a cool-down instead (§5.2: ``dP/dT = gamma V`` while the idle chip cools at one clock):
:func:`leakage_slope`, on either rail.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import VoltageCurve

__all__ = ["fit_thermal", "leakage_slope", "solve_temperature"]

_FIXED_POINT_TOL_C = 0.01
_FIXED_POINT_MAX = 50
#: ``T0`` when the profile has no temperature or chip power to fit it from.
_DEFAULT_AMBIENT_C = 25.0


def solve_temperature(
    chip_w_at: Callable[[np.ndarray], np.ndarray | float], k_c_per_w: float, n: int
) -> tuple[np.ndarray, int]:
    """Solve ``dT = k P_chip(dT)`` by fixed-point iteration from ``dT = 0`` (paper §5.3).

    Parameters
    ----------
    chip_w_at
        ``chip_w_at(dtemp)``: the chip power (W), shape (n,) or scalar, at temperature rise
        ``dtemp`` (C over ``T0``), shape (n,).
    k_c_per_w
        Slope ``k`` of ``T = T0 + k P_chip`` (C per W).
    n
        Number of rises solved at once (one per op, or one broadcast to all).

    Returns
    -------
    dtemp : ndarray, shape (n,)
        Temperature rise over ``T0`` (C).
    iterations : int
        Fixed-point steps taken (at most 50).
    """
    dtemp = np.zeros(n)
    for it in range(1, _FIXED_POINT_MAX + 1):
        new = k_c_per_w * np.asarray(chip_w_at(dtemp), dtype=float)
        done = np.max(np.abs(new - dtemp)) < _FIXED_POINT_TOL_C
        dtemp = np.broadcast_to(new, (n,)).copy()
        if done:
            return dtemp, it
    return dtemp, _FIXED_POINT_MAX


def fit_thermal(
    rows: pd.DataFrame, calibration: PowerCalibration | None = None
) -> tuple[float, float]:
    """Fit ``T0, k`` of ``T = T0 + k P_chip`` (eq. 15) on each clock's run (the paper's load runs).

    Parameters
    ----------
    rows
        Profile rows with ``freq_mhz``, ``time_us`` and, to fit anything, ``temp_c`` and
        ``chip_power_w``.
    calibration
        Its idle runs, when they have ``temp_c`` and ``chip_power_w``, are load runs too (at the
        lowest power).

    Returns
    -------
    ambient_c : float
        ``T0`` (C); 25 without temperature or chip power.
    k_c_per_w : float
        ``k`` (C per W), >= 0; 0 when the runs' power does not vary.
    """
    if "temp_c" not in rows or "chip_power_w" not in rows:
        return _DEFAULT_AMBIENT_C, 0.0
    weighted = pd.DataFrame(  # only the columns used, not copied (3 x 24 MB at 1M ops x 3)
        {
            "freq_mhz": rows["freq_mhz"],
            "temp_c": rows["temp_c"],
            "_pt": rows["chip_power_w"] * rows["time_us"],
            "time_us": rows["time_us"],
        },
        copy=False,
    )
    sums = weighted.groupby("freq_mhz").agg(
        t=("temp_c", "mean"), pt=("_pt", "sum"), time=("time_us", "sum")
    )
    runs = pd.DataFrame({"t": sums["t"], "p": sums["pt"] / sums["time"]})
    if calibration is not None and {"temp_c", "chip_power_w"} <= set(calibration.idle.columns):
        idle = pd.DataFrame(
            {"t": calibration.idle["temp_c"], "p": calibration.idle["chip_power_w"]}
        )
        runs = pd.concat([runs, idle], ignore_index=True)
    if len(runs) < 2 or np.ptp(runs["p"]) < 1e-6:
        return float(runs["t"].mean()), 0.0
    k, t0 = np.polyfit(runs["p"], runs["t"], 1)
    return float(t0), float(max(k, 0.0))


def leakage_slope(
    cooldown: pd.DataFrame | None, column: str, voltage: VoltageCurve
) -> float | None:
    """``gamma`` (W per C per V) of one rail from a cool-down trace (paper §5.2, eqs. 10-11).

    While the idle chip cools at one clock only its leakage changes, ``dP/dT = gamma V``: the
    least-squares slope of ``column`` against ``temp_c`` over the samples, over ``V`` at the
    trace's clock, clipped at 0 (leakage grows with temperature).

    Parameters
    ----------
    cooldown
        Samples with ``freq_mhz``, ``temp_c`` and the rail's power column; None: no trace.
    column
        ``core_power_w`` (the paper's AICore ``gamma``) or ``chip_power_w`` (eq. 16's
        ``gamma_SoC``, the board's on a GPU).
    voltage
        The V-f curve the model uses.

    Returns
    -------
    float or None
        None when there is no trace, it lacks ``column``, or its temperature does not vary.
    """
    if cooldown is None or column not in cooldown or "temp_c" not in cooldown:
        return None
    temp = cooldown["temp_c"].to_numpy(dtype=float)
    power = cooldown[column].to_numpy(dtype=float)
    keep = np.isfinite(temp) & np.isfinite(power)
    temp, power = temp[keep], power[keep]
    if len(temp) < 2 or np.ptp(temp) <= 0:
        return None
    dt = temp - temp.mean()
    slope = float(dt @ (power - power.mean())) / float(dt @ dt)
    volt = float(voltage.voltage_v(float(cooldown["freq_mhz"].iloc[0])))
    return max(slope / volt, 0.0)
