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

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pandas as pd

from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import DeviceSpec, IdlePower, VoltageCurve
from opdvfs.exceptions import ValidationError
from opdvfs.models._lsq import fit_fixed_effects
from opdvfs.profile import Profile

__all__ = [
    "CHARACTERISE_GRID",
    "characterise_device",
    "characterise_spec",
    "fit_voltage_curve",
    "idle_calibration",
    "power_grid",
]

_Fitted = TypeVar("_Fitted")

#: Points per axis of each refining round of :func:`_best_curve`.
_REFINE_POINTS = 7
#: The search a characterisation (every clock) runs: ``fit_voltage_curve(**CHARACTERISE_GRID)``.
#: The default 25 x 25 grid's slope step is a voltage rise of ~0.13 at the top of an A40's
#: range: it misses a capped board's small rise and, the error being multi-modal, lands on
#: another knee (a synthetic 4% rise: a knee at the range's bottom, 22% off in V). Finer, then
#: refined, the curve from BLOOM scores GPT-3 on the A40 at 4.70% instead of 5.21% (best of
#: the family 4.46%; ``benchmarks/model_generalisation.py``, "curve 2").
CHARACTERISE_GRID = {"knees": 41, "slopes": 121, "refine": 2}


def _best_curve(
    freqs_mhz: np.ndarray,
    knees: int,
    slopes: int,
    sse_of: Callable[[VoltageCurve], tuple[float, _Fitted]],
    *,
    refine: int = 0,
) -> tuple[VoltageCurve, _Fitted]:
    """Return the V-f curve of a knee x slope grid with the least ``sse_of(curve)[0]``.

    Knees lie inside the clock range (a knee below it fits 3 clocks better but interpolates
    worse: measured on the V100 data); slopes run from 0 to 3 / f_min. ``refine`` rounds then
    search the best curve's cell again, each on a :data:`_REFINE_POINTS`-point grid spanning one
    step either side of it. Returns the curve and what ``sse_of`` fitted with it; the first
    candidate (flat) when no error is finite.
    """
    best: tuple[VoltageCurve, _Fitted] | None = None
    best_sse = np.inf
    knee_grid = np.linspace(freqs_mhz[0], freqs_mhz[-1], knees)
    slope_grid = np.linspace(0.0, 3.0 / freqs_mhz[0], slopes)
    for round_ in range(refine + 1):
        for knee in knee_grid:
            for slope in slope_grid:
                curve = VoltageCurve(knee_mhz=float(knee), flat_v=1.0, slope_v_per_mhz=float(slope))
                sse, fitted = sse_of(curve)
                if sse < best_sse:
                    best, best_sse = (curve, fitted), sse
                elif best is None:  # kept until a finite error turns up
                    best = (curve, fitted)
        assert best is not None  # the grid has at least one candidate
        if round_ < refine:
            knee_step = knee_grid[1] - knee_grid[0] if len(knee_grid) > 1 else 0.0
            slope_step = slope_grid[1] - slope_grid[0] if len(slope_grid) > 1 else 0.0
            knee, slope = best[0].knee_mhz, best[0].slope_v_per_mhz
            knee_grid = np.linspace(
                max(knee - knee_step, freqs_mhz[0]),
                min(knee + knee_step, freqs_mhz[-1]),
                _REFINE_POINTS,
            )
            slope_grid = np.linspace(
                max(slope - slope_step, 0.0), slope + slope_step, _REFINE_POINTS
            )
    assert best is not None
    return best


def fit_voltage_curve(
    freqs_mhz: np.ndarray,
    power: np.ndarray,
    *,
    knees: int = 25,
    slopes: int = 25,
    refine: int = 0,
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
    refine
        Rounds that search the best cell again on a finer grid. 0 (default) for a fit on a
        few training clocks: refined, a curve follows 3-4 points more closely and predicts the
        clocks between them worse (held-out, ``benchmarks/model_generalisation.py``: Perseus
        GPT-3 A100 at 4 clocks 1.98% -> 2.35%, V100 kernels at 3 clocks 3.81% -> 4.25%);
        :data:`CHARACTERISE_GRID` for a device characterised on every clock.

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

    return _best_curve(f, knees, slopes, sse_of, refine=refine)[0]


def characterise_device(
    profile: Profile, *, knees: int = 28, slopes: int = 31, voltage: VoltageCurve | None = None
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
    voltage
        A V-f curve to keep (e.g. :func:`fit_voltage_curve`'s, from power alone): then only the
        idle power is fitted on it (one solve).

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

    if voltage is not None:
        curve, idle = voltage, sse_of(voltage)[1]
    else:
        curve, idle = _best_curve(clocks, knees, slopes, sse_of)
    beta, theta = idle
    volt = curve.voltage_v(clocks)
    idle_w = beta * clocks / 1e3 * volt**2 + theta * volt
    return curve, PowerCalibration(idle=pd.DataFrame({"freq_mhz": clocks, column: idle_w}))


def power_grid(profile: Profile) -> tuple[str, np.ndarray, np.ndarray]:
    """Each op's median power at each clock: ``(rail, clocks (k,), power (n_ops, k))``.

    The rail is the core where measured, else the chip; NaN where an op has no power.
    """
    ops = profile.ops
    rail = "core" if "core_power_w" in ops and ops["core_power_w"].notna().any() else "chip"
    if f"{rail}_power_w" not in ops:
        raise ValidationError(
            "characterising a device needs measured power per kernel (chip_power_w or "
            "core_power_w)",
            field="chip_power_w",
        )
    table = ops.pivot_table(index="op", columns="freq_mhz", values=f"{rail}_power_w")
    return rail, table.columns.to_numpy(dtype=float), table.to_numpy(dtype=float)


def characterise_spec(
    profile: Profile,
    *,
    name: str,
    switch_latency_ms: float = 1.0,
    power_sample_period_ms: float = 1.0,
    source: str = "",
    freqs_mhz: Sequence[float] | None = None,
    vendor: str | None = None,
) -> DeviceSpec:
    """Characterise a device once, from kernels run at every supported clock (issue 16).

    The V-f curve comes from power alone (:func:`fit_voltage_curve`: each kernel's power is
    ``u_i + a_i f V(f)^2``, the curve shared by all kernels), so any kernels do: a
    micro-benchmark set or a workload swept once. The idle power ``beta f V^2 + theta V`` (the
    floor the throughput form needs) is then fitted on that curve with the kernels' times
    (:func:`characterise_device` with the curve kept). The device's supported clocks are
    ``freqs_mhz`` (the GPU's, e.g. from NVML: :mod:`opdvfs.devices.clocks`), which must hold
    every profiled clock; by default the profile's clocks (then the planner has nothing for its
    models to fill).

    Raises
    ------
    ValidationError
        If the profile has no power per kernel or fewer than 3 clocks with power, or measured a
        clock that ``freqs_mhz`` does not list (field ``clocks``).
    """
    rail, clocks, power = power_grid(profile)
    if len(clocks) < 3:
        raise ValidationError(
            f"characterising a device needs power at 3 or more clocks, the profile has "
            f"{len(clocks)}",
            field="freq_mhz",
        )
    curve = fit_voltage_curve(clocks, power, **CHARACTERISE_GRID)
    _, calibration = characterise_device(profile, voltage=curve)
    idle = calibration.idle
    volt = curve.voltage_v(clocks)
    design = np.stack([clocks / 1e3 * volt**2, volt], axis=1)
    # the idle table is beta f V^2 + theta V on the curve: its two numbers back, exactly
    beta, theta = np.linalg.lstsq(design, idle[f"{rail}_power_w"].to_numpy(float), rcond=None)[0]
    idle_power = IdlePower(
        rail="core" if rail == "core" else "chip",
        beta_w_per_ghz_v2=max(float(beta), 0.0),
        theta_w_per_v=max(float(theta), 0.0),
    )
    supported = _supported(profile, freqs_mhz)
    return DeviceSpec(
        name=name,
        freqs_mhz=supported,
        vendor=vendor or "unknown",
        voltage=curve,
        idle=idle_power,
        switch_latency_ms=switch_latency_ms,
        power_sample_period_ms=power_sample_period_ms,
        source=source,
    )


def _supported(profile: Profile, freqs_mhz: Sequence[float] | None) -> tuple[float, ...]:
    """Return the device's clocks, ascending: ``freqs_mhz``, checked to hold every profiled one."""
    profiled = np.unique(np.asarray(profile.freqs_mhz, dtype=float))
    if freqs_mhz is None:
        return tuple(float(f) for f in profiled)
    grid = np.unique(np.asarray(freqs_mhz, dtype=float))
    pos = np.clip(np.searchsorted(grid, profiled), 0, len(grid) - 1)
    below = np.clip(pos - 1, 0, len(grid) - 1)
    near = np.isclose(grid[pos], profiled, rtol=0, atol=1e-6) | np.isclose(
        grid[below], profiled, rtol=0, atol=1e-6
    )
    if not near.all():
        missing = profiled[~near]
        raise ValidationError(
            f"the profile measured {', '.join(f'{f:g}' for f in missing[:5])} MHz"
            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
            + f", not among the device's {len(grid)} clocks {grid[0]:g}-{grid[-1]:g} MHz: "
            "list every clock the GPU offers",
            field="clocks",
        )
    return tuple(float(f) for f in grid)


def idle_calibration(
    device: DeviceSpec, rail: str, voltage: VoltageCurve | None = None
) -> PowerCalibration | None:
    """Return the device's idle power on ``rail`` as idle runs at its clocks, or None.

    What a characterised device gives the throughput form in place of the paper's idle runs
    (eq. 12); ``voltage`` stands in when the device has no curve of its own.
    """
    idle, curve = device.idle, device.voltage or voltage
    if idle is None or idle.rail != rail or curve is None:
        return None
    clocks = np.asarray(device.freqs_mhz, dtype=float)
    power = idle.power_w(clocks, curve)
    return PowerCalibration(idle=pd.DataFrame({"freq_mhz": clocks, f"{rail}_power_w": power}))
