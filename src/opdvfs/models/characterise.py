"""A device's V-f curve and idle power, fitted on power measured at 3+ clocks (paper §5).

A firmware V-f table and idle runs at two clocks (eq. 12) are what the paper's power model
starts from; many devices give neither. Both are fitted here instead, from operators (or
micro-benchmark kernels) measured at three clocks or more:

* :func:`fit_voltage_curve`: ``V(f)`` alone, each op's power modelled as ``u_i + a_i f V(f)^2``;
* :func:`characterise_device`: ``V(f)`` and the idle power ``beta f V^2 + theta V`` together,
  through the throughput form of :mod:`opdvfs.models.power`.

``V(f)`` is flat below a knee and linear above, relative to 1 V below the knee (the scale is
absorbed by the per-op coefficients). Both search one knee x slope grid (:func:`_best_curve`),
each candidate one vectorised least-squares pass over every op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pandas as pd

from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import VoltageCurve
from opdvfs.exceptions import ValidationError
from opdvfs.models._lsq import fit_fixed_effects
from opdvfs.profile import Profile

__all__ = ["characterise_device", "fit_voltage_curve"]

_Fitted = TypeVar("_Fitted")


def _best_curve(
    freqs_mhz: np.ndarray,
    knees: int,
    slopes: int,
    sse_of: Callable[[VoltageCurve], tuple[float, _Fitted]],
) -> tuple[VoltageCurve, _Fitted]:
    """Return the V-f curve of a knee x slope grid with the least ``sse_of(curve)[0]``.

    Knees lie inside the clock range (a knee below it fits 3 clocks better but interpolates
    worse: measured on the V100 data); slopes run from 0 to 3 / f_min. Returns the curve and
    what ``sse_of`` fitted with it; the first candidate (flat) when no error is finite.
    """
    best: tuple[VoltageCurve, _Fitted] | None = None
    best_sse = np.inf
    for knee in np.linspace(freqs_mhz[0], freqs_mhz[-1], knees):
        for slope in np.linspace(0.0, 3.0 / freqs_mhz[0], slopes):
            curve = VoltageCurve(knee_mhz=float(knee), flat_v=1.0, slope_v_per_mhz=float(slope))
            sse, fitted = sse_of(curve)
            if sse < best_sse:
                best, best_sse = (curve, fitted), sse
            elif best is None:  # kept until a finite error turns up
                best = (curve, fitted)
    assert best is not None  # the grid has at least one candidate
    return best


def fit_voltage_curve(
    freqs_mhz: np.ndarray, power: np.ndarray, *, knees: int = 25, slopes: int = 25
) -> VoltageCurve:
    """Fit ``V(f)`` (flat below a knee, linear above) jointly across all ops.

    Parameters
    ----------
    freqs_mhz
        The clocks (MHz), shape (k,), ascending, k >= 3.
    power
        Each op's power (W) at each clock, shape (n_ops, k); NaN where not measured.
    knees, slopes
        Grid size of the knee and slope search.

    Returns
    -------
    VoltageCurve
        Relative to 1 V below the knee: ``power`` is modelled per op as ``u_i + a_i f V(f)^2``,
        and ``a_i`` absorbs the voltage scale. The knee and slope minimise the total relative
        squared error.
    """
    f = np.asarray(freqs_mhz, dtype=float)
    if len(f) < 3:
        raise ValidationError("fitting a V-f curve needs 3 or more clocks", field="train_freqs")
    w = np.where(np.isfinite(power) & (power > 0), 1.0 / np.where(power > 0, power, 1.0) ** 2, 0)
    y = np.nan_to_num(power)

    def sse_of(curve: VoltageCurve) -> tuple[float, None]:
        x = f / 1e3 * curve.voltage_v(f) ** 2
        # per-op weighted LS of y = u + a x, closed form
        sw, swx, swxx = w.sum(1), w @ x, w @ (x * x)
        swy, swxy = (w * y).sum(1), (w * y) @ x
        det = sw * swxx - swx**2
        a = np.where(det > 0, (sw * swxy - swx * swy) / np.where(det > 0, det, 1), 0)
        u = np.where(sw > 0, (swy - a * swx) / np.where(sw > 0, sw, 1), 0)
        return float((w * (u[:, None] + a[:, None] * x - y) ** 2).sum()), None

    return _best_curve(f, knees, slopes, sse_of)[0]


def characterise_device(
    profile: Profile, *, knees: int = 28, slopes: int = 31
) -> tuple[VoltageCurve, PowerCalibration]:
    """Fit a device's V-f curve and idle power on benchmark kernels run at 3+ clocks.

    Fits the throughput form (:mod:`opdvfs.models.power`; ``P = beta f V^2 + theta V + (e_i V^2
    + m_i) / t_i(f)`` on the chip rail, ``m_i / t_i`` replaced by ``alpha_i f V^2`` on the core
    rail where measured) to every kernel at every clock, with the kernels' measured times. The
    V-f curve (flat below a knee, linear above, relative to 1 V) is the one on a knee x slope
    grid with the least relative squared error, each candidate one vectorised fixed-effects
    solve. The result stands in for the firmware's V-f table and the paper's idle runs (eq. 12)
    on a device that gives neither:

        vf, cal = characterise_device(micro_benchmarks)
        PowerModel(voltage=vf, dynamic="throughput").fit(app, [f_lo, f_hi], calibration=cal)

    Parameters
    ----------
    profile
        Kernels with ``time_us`` and ``core_power_w`` or ``chip_power_w`` at 3 or more clocks.
    knees, slopes
        Grid size of the knee and slope search.

    Returns
    -------
    voltage : VoltageCurve
    calibration : PowerCalibration
        Its ``idle`` table holds the idle power ``beta f V^2 + theta V`` the fit implies at the
        profile's clocks (no cool-down trace).
    """
    ops = profile.ops
    rail = "core" if "core_power_w" in ops else "chip"
    column = f"{rail}_power_w"
    if column not in ops:
        raise ValidationError(
            "characterising a device needs measured power per kernel", field="chip_power_w"
        )
    rows = ops.dropna(subset=[column])
    clocks = np.unique(rows["freq_mhz"].to_numpy(dtype=float))
    if len(clocks) < 3:
        raise ValidationError(
            f"characterising a device needs 3 or more clocks, the profile has {len(clocks)}",
            field="freq_mhz",
        )
    op_ids, op = np.unique(rows["op"].to_numpy(), return_inverse=True)
    f = rows["freq_mhz"].to_numpy(dtype=float)
    power = rows[column].to_numpy(dtype=float)
    inv_t = 1.0 / rows["time_us"].to_numpy(dtype=float)
    weight = 1.0 / power**2

    def sse_of(curve: VoltageCurve) -> tuple[float, np.ndarray]:
        volt = curve.voltage_v(f)
        per_op = np.stack([volt**2 * inv_t, inv_t if rail == "chip" else f / 1e3 * volt**2], 1)
        shared = np.stack([f / 1e3 * volt**2, volt], axis=1)
        coef, idle = fit_fixed_effects(per_op, shared, power, op, len(op_ids), weight=weight)
        resid = power - np.einsum("rk,rk->r", per_op, coef[op]) - shared @ idle
        return float(weight @ resid**2), idle

    curve, (beta, theta) = _best_curve(clocks, knees, slopes, sse_of)
    volt = curve.voltage_v(clocks)
    idle_w = beta * clocks / 1e3 * volt**2 + theta * volt
    return curve, PowerCalibration(idle=pd.DataFrame({"freq_mhz": clocks, column: idle_w}))
