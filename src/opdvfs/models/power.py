"""Power and thermal models: per-operator core and chip power at any clock (paper §5).

The paper's core-rail model is (eqs. 11-14)

    P = alpha_i f V^2 + beta f V^2 + gamma dT V + theta V,

with ``alpha_i`` per operator instance, ``beta f V^2 + theta V`` the idle power (eq. 12),
``gamma dT V`` the temperature-dependent leakage and the thermal model ``T = T0 + k P_chip`` (eq.
15) solved by fixed-point iteration from ``dT = 0``. Here:

* ``beta`` is folded into ``alpha_i`` unless idle power at two clocks is given (it multiplies the
  same ``f V^2``); ``gamma`` and ``theta`` are fitted jointly over all operators and clocks (a
  fixed-effects least squares: ``alpha_i`` are eliminated per op, vectorised with bincount),
  or ``gamma`` comes from a cool-down trace (``dP/dT = gamma V`` while the chip cools idle);
* the chip/board rail is the core model plus a per-op constant (uncore power does not scale with
  the core clock: paper §7), or, when only chip power is measured, ``alpha_i f V^2 + u_i``;
* ``V(f)`` comes from the device (``DeviceSpec.voltage``) or is fitted jointly across all ops
  (flat below a knee, linear above; needs 3+ training clocks);
* ``T0`` and ``k`` come from the profile's load runs: the mean temperature and chip power of each
  profiled clock;
* ``dT`` at a new clock: the fixed point of ``T = T0 + k P`` with ``P`` the op's own chip power
  (``thermal="op"``, the paper's per-op use) or the workload's time-weighted mean power
  (``thermal="workload"``, default: a chip's temperature follows its average power over seconds,
  far longer than one operator). The iteration count is kept (paper: <= 4).

``dynamic="throughput"`` adds the op's energy per launch spent at its own pace,
``e_i V^2 / t_i(f)``, with ``t_i(f)`` the op's time at ``f`` (measured at the training clocks,
from the performance model elsewhere) and ``e_i`` its switching energy per V^2. For a
compute-bound op ``t = cycles / f`` and the term is the paper's ``alpha_i f V^2`` with
``alpha_i = e_i / cycles``; a memory-bound op's time hardly moves with the clock, so its busy
units' power scales with ``V^2`` alone. The second per-op term is, on the core rail, the
paper's ``alpha_i f V^2`` (what an op switches every cycle, busy or not), and on the chip/board
rail ``m_i / t_i(f)``, the energy of the op's memory traffic over its time (a GPU board's and
the simulator's uncore power is energy per byte over time, not clock-scaled). Both with the idle
power ``beta f V^2 + theta V`` of eq. (12). Two per-op terms take two clocks; the idle terms are
then not identified from an op's own points: they come from idle runs
(``PowerCalibration.idle``), from a device characterisation (:func:`characterise_device`, e.g.
on micro-benchmarks at every clock) or, with 3+ clocks, from the joint fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Self, get_args

import numpy as np
import pandas as pd
import scipy.optimize

from opdvfs._files import JsonFile
from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import InputFormatError, NotFittedError, ValidationError
from opdvfs.models.attribution import attribute_class_power
from opdvfs.profile import Profile

__all__ = [
    "PowerModel",
    "characterise_device",
    "fit_core_power",
    "fit_fixed_effects",
    "fit_voltage_curve",
    "solve_temperature",
]

Thermal = Literal["workload", "op"]
Dynamic = Literal["clock", "throughput"]
DYNAMIC_FORMS: tuple[str, ...] = get_args(Dynamic)


_FIXED_POINT_TOL_C = 0.01
_FIXED_POINT_MAX = 50


def fit_fixed_effects(
    per_op: np.ndarray,
    shared: np.ndarray,
    target: np.ndarray,
    op: np.ndarray,
    n_ops: int,
    *,
    weight: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Least squares ``target = per_op . c_op + shared . s`` with ``s >= 0``, all ops at once.

    The per-op coefficients are eliminated exactly (each op's rows are projected off the span
    of its own columns: batched ``k x k`` normal equations built with ``bincount``), the shared
    ones solved by NNLS on what is left, then the per-op ones recovered. A shared column that
    the per-op columns already span (e.g. two clocks per op and two per-op columns) is not
    identified by the data: it is left out (coefficient 0) instead of fitting noise.

    Parameters
    ----------
    per_op
        Columns with a coefficient per operator, shape (rows, k).
    shared
        Columns with one coefficient for every operator, shape (rows, s); s may be 0.
    target
        Measured values, shape (rows,).
    op
        Operator index of each row, in ``[0, n_ops)``.
    weight
        Row weights (e.g. ``1 / target**2`` for relative errors); default 1.

    Returns
    -------
    per_op_coef : ndarray, shape (n_ops, k)
        Min-norm where an op's rows do not pin all k (fewer distinct points than columns).
    shared_coef : ndarray, shape (s,)
    """
    root = np.sqrt(weight) if weight is not None else np.ones(len(target))
    b = per_op * root[:, None]
    k = b.shape[1]
    gram = np.empty((n_ops, k, k))
    for i in range(k):
        for j in range(i, k):
            gram[:, i, j] = gram[:, j, i] = np.bincount(op, b[:, i] * b[:, j], minlength=n_ops)
    # relative cutoff: the columns' scales differ by orders of magnitude (W vs W us)
    scale = np.sqrt(np.einsum("nii->ni", gram)) + 1e-300
    inv = np.linalg.pinv(gram / scale[:, :, None] / scale[:, None, :], rcond=1e-10)
    inv = inv / scale[:, :, None] / scale[:, None, :]

    def per_op_fit(col: np.ndarray) -> np.ndarray:
        rhs = np.stack([np.bincount(op, b[:, i] * col, minlength=n_ops) for i in range(k)], 1)
        return np.einsum("nij,nj->ni", inv, rhs)

    def within(col: np.ndarray) -> np.ndarray:
        return col - np.einsum("rk,rk->r", b, per_op_fit(col)[op])

    y = target * root
    cols = shared * root[:, None]
    design = np.stack([within(c) for c in cols.T], axis=1) if cols.shape[1] else cols
    norm = np.linalg.norm(cols, axis=0)
    design[:, np.linalg.norm(design, axis=0) <= 1e-9 * np.maximum(norm, 1e-300)] = 0.0
    shared_coef = scipy.optimize.nnls(design, within(y))[0] if cols.shape[1] else np.zeros(0)
    return per_op_fit(y - cols @ shared_coef), shared_coef


def fit_core_power(
    x: np.ndarray,
    volt: np.ndarray,
    dtemp: np.ndarray | None,
    power: np.ndarray,
    op: np.ndarray,
    n_ops: int,
    *,
    intercept: bool = False,
) -> tuple[np.ndarray, float, float]:
    """Fit ``P = alpha_op x + gamma dT V + theta V`` over all rows (eq. 11, beta in alpha).

    With ``intercept=True`` each op also gets a constant ``u_op`` (fitted jointly, returned by
    the caller as the mean residual): the chip rail's memory/uncore power, which differs per
    kernel and does not scale with the core clock. ``theta V`` then competes with it and is
    only identified through ``V``'s variation; with two clocks per op the op's line goes
    through both points.

    Parameters
    ----------
    x
        ``f V^2`` of each row (f in GHz).
    volt, dtemp, power
        Core voltage, temperature rise (None: no temperature term) and measured power per row.
    op
        Operator index of each row, in ``[0, n_ops)``.

    Returns
    -------
    alpha : ndarray, shape (n_ops,)
    gamma, theta : float
        Shared coefficients; ``gamma`` is 0 without temperature, and both are >= 0 (leakage
        grows with T and ``theta V`` is a positive static power: an unconstrained solve then
        clipped kept the other coefficient's compensating excess).
    """
    per_op = np.stack([x, np.ones_like(x)] if intercept else [x], axis=1)
    shared = np.stack([volt * dtemp, volt] if dtemp is not None else [volt], axis=1)
    coef, shared_coef = fit_fixed_effects(per_op, shared, power, op, n_ops)
    gamma, theta = (shared_coef[0], shared_coef[1]) if dtemp is not None else (0.0, shared_coef[0])
    return coef[:, 0], float(gamma), float(theta)


def fit_voltage_curve(
    freqs_mhz: np.ndarray, power: np.ndarray, *, knees: int = 25, slopes: int = 25
) -> VoltageCurve:
    """Fit ``V(f)`` (flat below a knee, linear above) jointly across all ops.

    ``power`` (n_ops, k>=3 clocks) is modelled per op as ``u_i + a_i f V(f)^2``; the voltage
    scale is absorbed by ``a_i`` (V is returned relative to 1 V below the knee). The knee and
    slope minimise the total relative squared error, over a grid, each candidate one vectorised
    per-op least-squares pass.
    """
    f = np.asarray(freqs_mhz, dtype=float)
    if len(f) < 3:
        raise ValidationError("fitting a V-f curve needs 3 or more clocks", field="train_freqs")
    w = np.where(np.isfinite(power) & (power > 0), 1.0 / np.where(power > 0, power, 1.0) ** 2, 0)
    y = np.nan_to_num(power)
    best: tuple[float, float, float] = (np.inf, f[0], 0.0)
    # Knees inside the clock range (a knee below it fits 3 clocks better but interpolates
    # worse: measured on the V100 data); slopes up to 3 / f_min.
    for knee in np.linspace(f[0], f[-1], knees):
        for slope in np.linspace(0.0, 3.0 / f[0], slopes):
            v = 1.0 + slope * np.maximum(0.0, f - knee)
            x = f / 1e3 * v**2
            # per-op weighted LS of y = u + a x, closed form
            sw, swx, swxx = w.sum(1), w @ x, w @ (x * x)
            swy, swxy = (w * y).sum(1), (w * y) @ x
            det = sw * swxx - swx**2
            a = np.where(det > 0, (sw * swxy - swx * swy) / np.where(det > 0, det, 1), 0)
            u = np.where(sw > 0, (swy - a * swx) / np.where(sw > 0, sw, 1), 0)
            sse = float((w * (u[:, None] + a[:, None] * x - y) ** 2).sum())
            if sse < best[0]:
                best = (sse, float(knee), float(slope))
    return VoltageCurve(knee_mhz=best[1], flat_v=1.0, slope_v_per_mhz=best[2])


def characterise_device(
    profile: Profile, *, knees: int = 28, slopes: int = 31
) -> tuple[VoltageCurve, PowerCalibration]:
    """Fit a device's V-f curve and idle power on benchmark kernels run at 3+ clocks.

    Fits the throughput form (module docstring; ``P = beta f V^2 + theta V + (e_i V^2 + m_i)
    / t_i(f)`` on the chip rail, ``m_i / t_i`` replaced by ``alpha_i f V^2`` on the core rail
    where measured) to every kernel at every clock, with the kernels' measured times. The V-f
    curve (flat below a knee, linear above, relative to 1 V) is the one on a knee x slope grid
    with the least relative squared error, each candidate one vectorised fixed-effects solve.
    The result stands in for the firmware's V-f table and the paper's idle runs (eq. 12) on a
    device that gives neither:

        vf, cal = characterise_device(micro_benchmarks)
        PowerModel(voltage=vf, dynamic="throughput").fit(app, [f_lo, f_hi], calibration=cal)

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

    def solve(curve: VoltageCurve) -> tuple[float, np.ndarray]:
        volt = curve.voltage_v(f)
        per_op = np.stack([volt**2 * inv_t, inv_t if rail == "chip" else f / 1e3 * volt**2], 1)
        shared = np.stack([f / 1e3 * volt**2, volt], axis=1)
        coef, idle = fit_fixed_effects(per_op, shared, power, op, len(op_ids), weight=weight)
        resid = power - np.einsum("rk,rk->r", per_op, coef[op]) - shared @ idle
        return float(weight @ resid**2), idle

    best: tuple[float, VoltageCurve, np.ndarray] | None = None
    for knee in np.linspace(clocks[0], clocks[-1], knees):
        for slope in np.linspace(0.0, 3.0 / clocks[0], slopes):
            curve = VoltageCurve(knee_mhz=float(knee), flat_v=1.0, slope_v_per_mhz=float(slope))
            sse, idle = solve(curve)
            if best is None or sse < best[0]:
                best = (sse, curve, idle)
    assert best is not None
    _, curve, (beta, theta) = best
    volt = curve.voltage_v(clocks)
    idle_w = beta * clocks / 1e3 * volt**2 + theta * volt
    return curve, PowerCalibration(idle=pd.DataFrame({"freq_mhz": clocks, column: idle_w}))


def solve_temperature(
    chip_w_at: Any, ambient_c: float, k_c_per_w: float, n: int
) -> tuple[np.ndarray, int]:
    """Solve ``dT = k P_chip(dT)`` by fixed-point iteration from ``dT = 0`` (paper §5.3).

    Returns the rise and the number of iterations taken.

    ``chip_w_at(dtemp)`` gives the chip power, shape (n,) or scalar, at temperature rise ``dT``.
    """
    del ambient_c  # the rise is relative to the ambient temperature
    dtemp = np.zeros(n)
    for it in range(1, _FIXED_POINT_MAX + 1):
        new = k_c_per_w * np.asarray(chip_w_at(dtemp), dtype=float)
        done = np.max(np.abs(new - dtemp)) < _FIXED_POINT_TOL_C
        dtemp = np.broadcast_to(new, (n,)).copy()
        if done:
            return dtemp, it
    return dtemp, _FIXED_POINT_MAX


class PowerModel(JsonFile):
    """Per-operator core and chip power vs clock, with the temperature term (paper §5).

    Parameters
    ----------
    voltage
        V-f curve; default: the device's (``fit(device=...)``), else fitted from 3+ clocks, else
        flat (V = 1).
    temperature
        Whether to model ``gamma dT V`` (the paper reports 4.62% with it, 4.97% without).
    thermal
        ``"workload"`` (default) or ``"op"``: whose power sets the temperature at a new clock.
    dynamic
        ``"clock"`` (default, the paper's ``alpha_i f V^2``) or ``"throughput"``: plus each
        op's energy per launch over its time at the clock (module docstring); :meth:`predict`
        then needs the ops' times.

    Attributes
    ----------
    alpha_ : ndarray, shape (n_ops,)
        Per-op activity coefficient of the core rail (W per GHz V^2; includes beta; beta
        alone for every op in the throughput form on the chip rail).
    core_uj_per_v2_, uncore_uj_ : ndarray, shape (n_ops,)
        Throughput form: the op's switching energy per launch per V^2 (uJ/V^2) and, on the
        chip rail, its memory energy per launch (uJ). Zero in the clock form.
    gamma_, theta_ : float
        Core-rail temperature and static coefficients.
    beta_ : float
        Load-independent dynamic coefficient from idle calibration (0 when folded in alpha).
    uncore_w_ : ndarray, shape (n_ops,)
        Chip power not on the core rail, per op (constant in the clock).
    ambient_c_, k_c_per_w_ : float
        Thermal model ``T = T0 + k P_chip``.
    rail_ : str
        ``"core"`` when core power was measured, else ``"chip"`` (core terms then model the chip).
    """

    def __init__(
        self,
        *,
        voltage: VoltageCurve | None = None,
        temperature: bool = True,
        thermal: Thermal = "workload",
        dynamic: Dynamic = "clock",
    ) -> None:
        self.voltage = voltage
        self.temperature = temperature
        self.thermal = thermal
        self.dynamic = dynamic

    # ----------------------------------------------------------------------------- fit
    def fit(
        self,
        profile: Profile,
        train_freqs_mhz: Sequence[float] | None = None,
        *,
        device: DeviceSpec | None = None,
        window_ms: float | None = None,
        calibration: PowerCalibration | None = None,
    ) -> Self:
        """Fit on the rows at ``train_freqs_mhz`` (default all clocks).

        With per-op power columns they are used directly; with only sensor samples the window
        energy is first attributed to op classes (``window_ms``: the samples' averaging window,
        default from the profile's metadata). With a ``calibration`` (core rail only), the
        paper's procedure is followed: ``gamma`` from the cool-down, ``beta, theta`` from idle at
        two clocks, then ``alpha_i`` per op (eq. 14); otherwise ``gamma, theta`` are fitted jointly.
        The throughput form takes the idle terms from the calibration's idle runs when given.
        """
        if self.dynamic not in DYNAMIC_FORMS:
            raise ValidationError(
                f"unknown dynamic form {self.dynamic!r}; expected one of "
                f"{', '.join(DYNAMIC_FORMS)}",
                field="dynamic",
            )
        rows = self.power_rows(profile, window_ms)
        clocks = np.unique(rows["freq_mhz"])
        train = clocks if train_freqs_mhz is None else np.sort(np.asarray(train_freqs_mhz, float))
        for f in train:
            if not np.isclose(clocks, f).any():
                raise ValidationError(
                    f"training clock {f:g} MHz has no power data in the profile (clocks: "
                    f"{', '.join(f'{c:g}' for c in clocks)})",
                    field="train_freqs_mhz",
                )
        rows = rows[np.isclose(rows["freq_mhz"].to_numpy()[:, None], train[None, :]).any(1)]
        op_ids = np.unique(profile.ops["op"])
        op = np.searchsorted(op_ids, rows["op"].to_numpy())
        n_ops = len(op_ids)
        f = rows["freq_mhz"].to_numpy(dtype=float)
        self.rail_ = "core" if "core_power_w" in rows else "chip"
        target = rows[f"{self.rail_}_power_w"].to_numpy(dtype=float)
        self.voltage_ = self._voltage(device, rows, train, op, n_ops)
        volt = self.voltage_.voltage_v(f)
        x = f / 1e3 * volt**2
        use_t = self.temperature and "temp_c" in rows and rows["temp_c"].notna().all()
        # On the chip rail alone gamma cannot be told apart from the per-op uncore constants and
        # can make T = T0 + k P run away; the paper's temperature term is a core-rail term.
        use_t = use_t and (self.rail_ == "core")
        self.ambient_c_, self.k_c_per_w_ = self._thermal_fit(rows, calibration)
        dtemp = rows["temp_c"].to_numpy(dtype=float) - self.ambient_c_ if use_t else None
        self.beta_ = 0.0
        self.theta_op_ = np.zeros(n_ops)
        self.core_uj_per_v2_ = np.zeros(n_ops)
        self.uncore_uj_ = np.zeros(n_ops)
        inv_t = None
        if self.dynamic == "throughput":
            inv_t = 1.0 / rows["time_us"].to_numpy(dtype=float)
            self._fit_throughput(op, n_ops, x, volt, dtemp, inv_t, target, calibration)
        elif self.rail_ == "core" and calibration is not None:
            # the paper's procedure: gamma from the cool-down, beta and theta from idle (eq. 12),
            # then alpha per op from what is left (eqs. 13-14)
            rest, leakage = self._leakage(calibration, volt, dtemp, target)
            self.beta_, self.theta_ = self._idle_fit(calibration)
            # alpha_ carries beta too: both multiply f V^2 (beta_ is kept for reporting)
            coef, fitted = fit_fixed_effects(
                x[:, None], _columns(leakage, len(x)), rest - self.theta_ * volt, op, n_ops
            )
            self.alpha_ = coef[:, 0]
            if leakage:
                self.gamma_ = float(fitted[0])
        elif self.rail_ == "core":
            self.alpha_, self.gamma_, self.theta_ = fit_core_power(
                x, volt, dtemp, target, op, n_ops
            )
        else:
            # chip only: alpha_i f V^2 + u_i per op (+ gamma dT V), fitted jointly; u_i is the
            # kernel's memory/uncore power and stands in for theta V
            self.alpha_, self.gamma_, _ = fit_core_power(
                x, volt, dtemp, target, op, n_ops, intercept=True
            )
            self.theta_ = 0.0
            if dtemp is None and np.ptp(self.voltage_.voltage_v(train)) > 0 and len(train) >= 3:
                # three clocks or more, the voltage moving among them: each kernel gets its own
                # V-proportional static term too (its power is not one f V^2 shape plus a constant)
                self.alpha_, self.theta_op_ = _per_op_static(x, volt, target, op, n_ops)
        model = self._core(op, x, volt, dtemp, inv_t)
        measured = rows["chip_power_w"].to_numpy(dtype=float) if "chip_power_w" in rows else model
        self.uncore_w_ = _mean_by(op, measured - model, n_ops)
        self.use_temperature_ = bool(use_t)
        self.op_ids_ = op_ids
        times = profile.ops.groupby("op")["time_us"].median()
        self.time_weight_ = times.reindex(op_ids).fillna(0.0).to_numpy(dtype=float)
        self.train_freqs_mhz_ = train
        return self

    def _fit_throughput(
        self,
        op: np.ndarray,
        n_ops: int,
        x: np.ndarray,
        volt: np.ndarray,
        dtemp: np.ndarray | None,
        inv_t: np.ndarray,
        target: np.ndarray,
        calibration: PowerCalibration | None,
    ) -> None:
        """Per-op energies per launch; idle ``beta, theta`` from the calibration or jointly."""
        per_op = [volt**2 * inv_t] + ([inv_t] if self.rail_ == "chip" else [x])
        target, shared = self._leakage(calibration, volt, dtemp, target)
        joint_gamma = bool(shared)
        if calibration is not None:
            self.beta_, self.theta_ = self._idle_fit(calibration)
            target = target - self.beta_ * x - self.theta_ * volt
        else:
            shared = [*shared, x, volt]
        coef, shared_coef = fit_fixed_effects(
            np.stack(per_op, axis=1),
            _columns(shared, len(x)),
            target,
            op,
            n_ops,
            weight=1.0 / np.maximum(np.abs(target), 1e-9) ** 2,  # relative errors
        )
        fitted = iter(shared_coef)
        if joint_gamma:
            self.gamma_ = float(next(fitted))
        if calibration is None:
            self.beta_, self.theta_ = float(next(fitted)), float(next(fitted))
        self.alpha_ = np.full(n_ops, self.beta_)  # the idle f V^2 term, as in every op
        self.core_uj_per_v2_ = coef[:, 0]
        if self.rail_ == "chip":
            self.uncore_uj_ = coef[:, 1]
        else:
            self.alpha_ = self.alpha_ + coef[:, 1]

    def _leakage(
        self,
        calibration: PowerCalibration | None,
        volt: np.ndarray,
        dtemp: np.ndarray | None,
        target: np.ndarray,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Set ``gamma_`` from a cool-down trace, or return the column to fit it jointly.

        With a trace its term is taken off ``target``; without one (no calibration, or a device
        characterisation) the ``V dT`` column is returned; no temperature: ``gamma_ = 0``.
        """
        self.gamma_ = 0.0
        if dtemp is None:
            return target, []
        if calibration is not None and calibration.cooldown is not None:
            self.gamma_ = calibration.gamma(self.voltage_)
            return target - self.gamma_ * volt * dtemp, []
        return target, [volt * dtemp]

    def power_rows(self, profile: Profile, window_ms: float | None = None) -> pd.DataFrame:
        """Profile rows with per-op power: measured, or attributed from the sensor windows."""
        ops = profile.ops
        if "core_power_w" in ops or "chip_power_w" in ops:
            cols = [c for c in ("core_power_w", "chip_power_w") if c in ops]
            return ops.dropna(subset=cols)
        samples = profile.samples
        if samples is None or "wall_s" not in ops or ops["wall_s"].isna().any():
            raise ValidationError(
                "profile has no per-op power columns and no sensor samples with op wall times "
                "(wall_s) to attribute them from",
                field="chip_power_w",
            )
        window = window_ms or profile.meta.get("sensor", {}).get("window_ms")
        if not window:
            raise ValidationError(
                "the sensor's averaging window is unknown: pass window_ms", field="window_ms"
            )
        cls = attribute_class_power(ops, samples, window_s=float(window) / 1e3)
        table = cls.set_index(["freq_mhz", "type"])["power_w"]
        key = pd.MultiIndex.from_arrays([ops["freq_mhz"], ops["type"].astype(str)])
        return ops.assign(chip_power_w=table.reindex(key).to_numpy())

    def _voltage(
        self,
        device: DeviceSpec | None,
        rows: pd.DataFrame,
        train: np.ndarray,
        op: np.ndarray,
        n_ops: int,
    ) -> VoltageCurve:
        if self.voltage is not None:
            return self.voltage
        if device is not None and device.voltage is not None:
            return device.voltage
        if len(train) >= 3:
            col = "core_power_w" if "core_power_w" in rows else "chip_power_w"
            grid = np.full((n_ops, len(train)), np.nan)
            j = np.searchsorted(train, rows["freq_mhz"].to_numpy())
            grid[op, j] = rows[col].to_numpy()
            return fit_voltage_curve(train, grid)
        return VoltageCurve(knee_mhz=float(train[-1]), flat_v=1.0, slope_v_per_mhz=0.0)

    def _idle_fit(self, cal: PowerCalibration) -> tuple[float, float]:
        """``beta, theta`` from idle power at two clocks or more (eq. 12), leakage rise removed."""
        idle = cal.idle.sort_values("freq_mhz")
        column = f"{self.rail_}_power_w"
        if column not in idle or len(idle) < 2:
            raise ValidationError(
                f"the calibration's idle runs need {column} at two clocks or more",
                field="calibration.idle",
            )
        f = idle["freq_mhz"].to_numpy(float)
        volt = self.voltage_.voltage_v(f)
        rise = 0.0
        if self.gamma_ and "temp_c" in idle:
            rise = (idle["temp_c"].to_numpy(float) - self.ambient_c_) * volt * self.gamma_
        design = np.stack([f / 1e3 * volt**2, volt], axis=1)
        coef = scipy.optimize.nnls(design, idle[column].to_numpy(float) - rise)[0]
        return float(coef[0]), float(coef[1])

    @staticmethod
    def _thermal_fit(
        rows: pd.DataFrame, cal: PowerCalibration | None = None
    ) -> tuple[float, float]:
        """``T0, k`` of ``T = T0 + k P_chip`` from each clock's run (the paper's load runs).

        Idle runs of a calibration, when given, are load runs too (at the lowest power).
        """
        if "temp_c" not in rows or "chip_power_w" not in rows:
            return 25.0, 0.0
        weighted = rows.assign(_pt=rows["chip_power_w"] * rows["time_us"])
        sums = weighted.groupby("freq_mhz").agg(
            t=("temp_c", "mean"), pt=("_pt", "sum"), time=("time_us", "sum")
        )
        runs = pd.DataFrame({"t": sums["t"], "p": sums["pt"] / sums["time"]})
        if cal is not None and {"temp_c", "chip_power_w"} <= set(cal.idle.columns):
            idle = pd.DataFrame({"t": cal.idle["temp_c"], "p": cal.idle["chip_power_w"]})
            runs = pd.concat([runs, idle], ignore_index=True)
        if len(runs) < 2 or np.ptp(runs["p"]) < 1e-6:
            return float(runs["t"].mean()), 0.0
        k, t0 = np.polyfit(runs["p"], runs["t"], 1)
        return float(t0), float(max(k, 0.0))

    def _core(
        self,
        op: np.ndarray,
        x: np.ndarray,
        volt: np.ndarray,
        dtemp: np.ndarray | None,
        inv_t: np.ndarray | None = None,
    ) -> np.ndarray:
        """Core-rail power, eq. (11) (``alpha_`` includes ``beta``), plus the throughput term."""
        out = self.alpha_[op] * x + (self.theta_ + self.theta_op_[op]) * volt
        if inv_t is not None:
            out = out + (self.core_uj_per_v2_[op] * volt**2 + self.uncore_uj_[op]) * inv_t
        return out + (self.gamma_ * volt * dtemp if dtemp is not None else 0.0)

    # ----------------------------------------------------------------------------- predict
    def _check_fitted(self) -> None:
        if not hasattr(self, "alpha_"):
            raise NotFittedError("this PowerModel is not fitted yet; call fit(profile) first")

    def predict(
        self, freqs_mhz: Sequence[float] | np.ndarray, time_us: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Predicted power of every op at each clock, with the temperature solved per clock.

        Parameters
        ----------
        freqs_mhz
            Clocks to predict at.
        time_us
            Each op's time at each clock, shape (n_ops, n_freqs) (e.g. ``PerfModel.predict``);
            needed by the throughput form, ignored by the clock form.

        Returns
        -------
        dict
            ``core_w`` and ``chip_w`` (n_ops, n_freqs), ``temp_c`` (n_ops, n_freqs) and
            ``iterations`` (n_freqs,): the fixed-point steps taken (paper: <= 4).
        """
        self._check_fitted()
        freqs = np.atleast_1d(np.asarray(freqs_mhz, dtype=float))
        n = len(self.op_ids_)
        core = np.empty((n, len(freqs)))
        temps = np.empty_like(core)
        steps = np.zeros(len(freqs), dtype=int)
        weight = self.time_weight_ / max(self.time_weight_.sum(), 1e-300)
        ops = np.arange(n)
        inv_t = self._inverse_times(time_us, n, len(freqs))
        for j, f in enumerate(freqs):
            volt = float(self.voltage_.voltage_v(f))
            x = np.full(n, f / 1e3 * volt**2)
            vv = np.full(n, volt)
            it = None if inv_t is None else inv_t[:, j]

            def chip_at(dt: np.ndarray, x=x, vv=vv, it=it) -> np.ndarray:
                p = self._core(ops, x, vv, dt if self.use_temperature_ else None, it)
                p = p + self.uncore_w_
                return np.asarray(weight @ p) if self.thermal == "workload" else p

            if self.use_temperature_ and self.k_c_per_w_ > 0:
                dtemp, steps[j] = solve_temperature(chip_at, self.ambient_c_, self.k_c_per_w_, n)
            else:
                dtemp = np.zeros(n)
            core[:, j] = self._core(ops, x, vv, dtemp if self.use_temperature_ else None, it)
            temps[:, j] = self.ambient_c_ + dtemp
        chip = core + self.uncore_w_[:, None]
        if self.rail_ == "chip":
            core, chip = chip, chip
        return {"core_w": core, "chip_w": chip, "temp_c": temps, "iterations": steps}

    def _inverse_times(self, time_us: np.ndarray | None, n: int, k: int) -> np.ndarray | None:
        if self.dynamic != "throughput":
            return None
        if time_us is None:
            raise ValidationError(
                "the throughput power form needs each op's time at the clocks (time_us, e.g. "
                "from PerfModel.predict)",
                field="time_us",
            )
        time_us = np.asarray(time_us, dtype=float)
        if time_us.shape != (n, k):
            raise ValidationError(
                f"time_us has shape {time_us.shape}, expected ({n}, {k}): ops x clocks",
                field="time_us",
            )
        return 1.0 / time_us

    # ----------------------------------------------------------------------------- files
    def to_dict(self) -> dict[str, Any]:
        """Return the fitted model as a JSON-ready dict."""
        self._check_fitted()
        return {
            "format": "opdvfs.power-model",
            "version": 1,
            "rail": self.rail_,
            "temperature": self.use_temperature_,
            "thermal": self.thermal,
            "dynamic": self.dynamic,
            "voltage": self.voltage_.model_dump(),
            "gamma": self.gamma_,
            "theta": self.theta_,
            "beta": self.beta_,
            "ambient_c": self.ambient_c_,
            "k_c_per_w": self.k_c_per_w_,
            "train_freqs_mhz": self.train_freqs_mhz_.tolist(),
            "op_ids": self.op_ids_.tolist(),
            "alpha": self.alpha_.tolist(),
            "theta_op": self.theta_op_.tolist(),
            "core_uj_per_v2": self.core_uj_per_v2_.tolist(),
            "uncore_uj": self.uncore_uj_.tolist(),
            "uncore_w": self.uncore_w_.tolist(),
            "time_weight": self.time_weight_.tolist(),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, source: str = "<dict>") -> PowerModel:
        """Rebuild a fitted model from :meth:`to_dict` output."""
        if not isinstance(doc, dict) or doc.get("format") != "opdvfs.power-model":
            raise InputFormatError(f'{source}: expected "format": "opdvfs.power-model"')
        try:
            model = cls(
                temperature=bool(doc["temperature"]),
                thermal=doc["thermal"],
                dynamic=doc.get("dynamic", "clock"),
            )
            if model.dynamic not in DYNAMIC_FORMS:
                raise ValueError(f"unknown dynamic form {model.dynamic!r}")
            model.rail_ = str(doc["rail"])
            model.use_temperature_ = bool(doc["temperature"])
            model.voltage_ = VoltageCurve.model_validate(doc["voltage"])
            model.gamma_, model.theta_ = float(doc["gamma"]), float(doc["theta"])
            model.beta_ = float(doc["beta"])
            model.ambient_c_, model.k_c_per_w_ = float(doc["ambient_c"]), float(doc["k_c_per_w"])
            model.train_freqs_mhz_ = np.asarray(doc["train_freqs_mhz"], dtype=float)
            model.op_ids_ = np.asarray(doc["op_ids"], dtype=np.int64)
            model.alpha_ = np.asarray(doc["alpha"], dtype=float)
            zeros = np.zeros(len(model.alpha_))
            model.theta_op_ = np.asarray(doc.get("theta_op", zeros), float)
            model.core_uj_per_v2_ = np.asarray(doc.get("core_uj_per_v2", zeros), float)
            model.uncore_uj_ = np.asarray(doc.get("uncore_uj", zeros), float)
            model.uncore_w_ = np.asarray(doc["uncore_w"], dtype=float)
            model.time_weight_ = np.asarray(doc["time_weight"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFormatError(f"{source}: malformed power model ({exc})") from None
        return model


def _per_op_static(
    x: np.ndarray, volt: np.ndarray, power: np.ndarray, op: np.ndarray, n_ops: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-op least squares ``P = u + theta V + alpha x``: (alpha, theta) per op, all at once.

    The 3x3 normal equations of every op are built with ``bincount`` and solved as one batch;
    an op whose points do not pin three parameters keeps theta = 0 and the two-parameter line.
    """
    basis = np.stack([np.ones_like(x), volt, x], axis=1)
    gram = np.zeros((n_ops, 3, 3))
    rhs = np.zeros((n_ops, 3))
    for a in range(3):
        rhs[:, a] = np.bincount(op, basis[:, a] * power, minlength=n_ops)
        for b in range(3):
            gram[:, a, b] = np.bincount(op, basis[:, a] * basis[:, b], minlength=n_ops)
    ok = np.linalg.cond(gram) < 1e12
    coef = np.zeros((n_ops, 3))
    coef[ok] = np.linalg.solve(gram[ok], rhs[ok][..., None])[..., 0]
    # the two-parameter line (u + alpha x) where three are not identified
    two = gram[:, [0, 2]][:, :, [0, 2]]
    fallback = np.linalg.solve(two[~ok] + 1e-300 * np.eye(2), rhs[~ok][:, [0, 2], None])[..., 0]
    coef[~ok, 2] = fallback[:, 1]
    return coef[:, 2], coef[:, 1]


def _columns(cols: list[np.ndarray], rows: int) -> np.ndarray:
    """Stack columns into a (rows, len(cols)) design; (rows, 0) when there are none."""
    return np.stack(cols, axis=1) if cols else np.zeros((rows, 0))


def _mean_by(op: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    count = np.bincount(op, minlength=n)
    return np.bincount(op, values, minlength=n) / np.maximum(count, 1)
