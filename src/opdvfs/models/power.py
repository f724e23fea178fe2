"""Power and thermal models: per-operator core and chip power at any clock (paper §5).

The paper's core-rail model is (eqs. 11-14)

    P = alpha_i f V^2 + beta f V^2 + gamma dT V + theta V,

with ``alpha_i`` per operator instance, ``beta f V^2 + theta V`` the idle power (eq. 12),
``gamma dT V`` the temperature-dependent leakage and the thermal model ``T = T0 + k P_chip`` (eq.
15) solved by fixed-point iteration from ``dT = 0``. Here:

* ``beta`` is folded into ``alpha_i`` unless idle power at two clocks is given (it multiplies the
  same ``f V^2``); ``gamma`` and ``theta`` are fitted jointly over all operators and clocks (a
  fixed-effects least squares: ``alpha_i`` are eliminated per op, vectorised with bincount),
  or ``gamma`` comes from a cool-down trace (``dP/dT = gamma V`` while the chip cools idle:
  :func:`~opdvfs.models.thermal.leakage_slope`). Static-clock profiles do not identify it
  (a lower clock runs cooler: temperature and clock move together, and the joint fit gives
  ``gamma`` ~ 0); only the trace does;
* the chip/board rail is the core model plus a per-op constant (uncore power does not scale with
  the core clock: paper §7) and, with a cool-down that reads chip power too, the rest of the
  chip's leakage (``uncore_gamma_ dT V``, eq. 16's ``gamma_SoC`` beyond the core's); when only
  chip power is measured, ``alpha_i f V^2 + u_i``, plus ``gamma dT V`` with ``gamma`` from a
  chip cool-down (never fitted jointly there: it trades with ``u_i``);
* ``V(f)`` comes from the device (``DeviceSpec.voltage``: a preset's, or characterised from
  power alone by ``opdvfs characterise``), else never a constant (power is convex in ``f`` on
  every real GPU measured): from 2 clocks the generic GPU prior of :mod:`opdvfs.models.vf_prior`
  (or, ``two_clocks="envelope"``, its knee with the rise the kernels' lower envelope gives,
  weighed against the prior's: :func:`~opdvfs.models.vf_prior.two_clock_curve`), from 3 its
  knee with the rise fitted jointly across all ops (one shared number), from 4+ the
  knee and slope fitted jointly (flat below a knee, linear above);
* ``T0`` and ``k`` come from the profile's load runs: the mean temperature and chip power of each
  profiled clock;
* ``dT`` at a new clock: the fixed point of ``T = T0 + k P`` with ``P`` the op's own chip power
  (``thermal="op"``, the paper's per-op use) or the workload's time-weighted mean power
  (``thermal="workload"``, default: a chip's temperature follows its average power over seconds,
  far longer than one operator). The iteration count is kept (paper: <= 4). Or, with
  ``predict(die_at_mhz=...)``, the die held at one clock's steady temperature at every clock:
  what a per-operator plan that stays near the top clock runs its slowed ops on (the planner's
  use, :mod:`opdvfs.plan.measured`).

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
(``PowerCalibration.idle``), from a device characterisation
(:func:`~opdvfs.models.characterise.characterise_device`, e.g. on micro-benchmarks at every clock)
or, with 3+ clocks, from the joint fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self, get_args

import numpy as np
import pandas as pd

from opdvfs._files import JsonFile, check_format
from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import InputFormatError, ValidationError
from opdvfs.models._estimator import check_finite, check_is_fitted, training_clocks
from opdvfs.models._lsq import fit_fixed_effects, mean_by, per_op_static, stack_columns
from opdvfs.models.attribution import power_rows
from opdvfs.models.characterise import fit_voltage_curve, idle_calibration
from opdvfs.models.perf import check_times, op_names
from opdvfs.models.thermal import fit_thermal, leakage_slope, solve_temperature
from opdvfs.models.vf_prior import fit_top_rise, prior_curve, two_clock_curve
from opdvfs.profile import Profile

__all__ = ["DYNAMIC_FORMS", "TWO_CLOCK_CURVES", "PowerModel", "fit_core_power"]

Thermal = Literal["workload", "op"]
Dynamic = Literal["clock", "throughput"]
DYNAMIC_FORMS: tuple[str, ...] = get_args(Dynamic)
TwoClocks = Literal["prior", "envelope"]
TWO_CLOCK_CURVES: tuple[str, ...] = get_args(TwoClocks)


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


# --------------------------------------------------------------------------------- fitting paths
@dataclass(frozen=True)
class _Design:
    """The training rows as arrays, one entry per row: what every fitting path reads."""

    op: np.ndarray  # operator index, in [0, n_ops)
    n_ops: int
    x: np.ndarray  # f V^2 (f in GHz)
    volt: np.ndarray  # core voltage (V)
    dtemp: np.ndarray | None  # temperature rise over T0 (C); None: no temperature term
    inv_t: np.ndarray | None  # 1 / the op's time (1/us); the throughput form only
    target: np.ndarray  # measured power (W) of the rail fitted

    @classmethod
    def from_rows(
        cls,
        rows: pd.DataFrame,
        op: np.ndarray,
        n_ops: int,
        *,
        rail: str,
        voltage: VoltageCurve,
        ambient_c: float | None,
        throughput: bool,
    ) -> _Design:
        """Build the design of ``rows``; ``ambient_c`` None leaves the temperature term out."""
        f = rows["freq_mhz"].to_numpy(dtype=float)
        volt = voltage.voltage_v(f)
        temp = None if ambient_c is None else rows["temp_c"].to_numpy(dtype=float)
        return cls(
            op=op,
            n_ops=n_ops,
            x=f / 1e3 * volt**2,
            volt=volt,
            dtemp=None if temp is None else temp - ambient_c,
            inv_t=1.0 / rows["time_us"].to_numpy(dtype=float) if throughput else None,
            target=rows[f"{rail}_power_w"].to_numpy(dtype=float),
        )


@dataclass(frozen=True)
class _Coefficients:
    """What one fitting path returns: the core-rail terms of eq. (11) and the throughput form.

    The per-op arrays left ``None`` are zero for every op (the path does not fit them).
    """

    alpha: np.ndarray  # W per GHz V^2, per op (beta included)
    gamma: float  # W per C per V
    theta: float  # W per V
    beta: float = 0.0  # W per GHz V^2 from idle runs; 0 when folded into alpha
    theta_op: np.ndarray | None = None  # W per V, per op (chip rail, 3+ clocks)
    core_uj_per_v2: np.ndarray | None = None  # uJ per V^2, per op (throughput form)
    uncore_uj: np.ndarray | None = None  # uJ per launch, per op (throughput form, chip rail)


def _leakage(
    design: _Design, calibration: PowerCalibration | None, voltage: VoltageCurve, rail: str
) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """``gamma`` from a cool-down trace of ``rail``, or the column to fit it jointly.

    Returns ``gamma``, the target and the shared columns left to fit. With a trace its term is
    taken off the target; without one (no calibration, or a device characterisation) the
    ``V dT`` column is returned (``gamma`` 0 until fitted); no temperature: ``gamma = 0``.
    """
    if design.dtemp is None:
        return 0.0, design.target, []
    cooldown = calibration.cooldown if calibration is not None else None
    gamma = leakage_slope(cooldown, f"{rail}_power_w", voltage)
    if gamma is not None:
        return gamma, design.target - gamma * design.volt * design.dtemp, []
    return 0.0, design.target, [design.volt * design.dtemp]


def _idle_fit(
    calibration: PowerCalibration,
    rail: str,
    voltage: VoltageCurve,
    gamma: float,
    ambient_c: float,
) -> tuple[float, float]:
    """``beta, theta`` from idle power at two clocks or more (eq. 12), leakage rise removed."""
    idle = calibration.idle.sort_values("freq_mhz")
    column = f"{rail}_power_w"
    if column not in idle or len(idle) < 2:
        raise ValidationError(
            f"the calibration's idle runs need {column} at two clocks or more",
            field="calibration.idle",
        )
    f = idle["freq_mhz"].to_numpy(float)
    volt = voltage.voltage_v(f)
    rise = 0.0
    if gamma and "temp_c" in idle:
        rise = (idle["temp_c"].to_numpy(float) - ambient_c) * volt * gamma
    design = np.stack([f / 1e3 * volt**2, volt], axis=1)
    import scipy.optimize  # only calibrated fits need it; ~0.2 s that `plan` should not pay

    coef = scipy.optimize.nnls(design, idle[column].to_numpy(float) - rise)[0]
    return float(coef[0]), float(coef[1])


def _fit_clock_core(design: _Design) -> _Coefficients:
    """Fit the clock form on the core rail: ``alpha_i``, ``gamma``, ``theta`` jointly (eq. 11)."""
    d = design
    alpha, gamma, theta = fit_core_power(d.x, d.volt, d.dtemp, d.target, d.op, d.n_ops)
    return _Coefficients(alpha=alpha, gamma=gamma, theta=theta)


def _fit_paper_procedure(
    design: _Design, calibration: PowerCalibration, voltage: VoltageCurve, ambient_c: float
) -> _Coefficients:
    """Fit the core rail by the paper's procedure (eqs. 12-14).

    ``gamma`` from the cool-down, ``beta`` and ``theta`` from idle (eq. 12), then ``alpha``
    per op from what is left (eqs. 13-14). ``alpha`` carries ``beta`` too: both multiply
    ``f V^2`` (``beta`` is kept for reporting).
    """
    d = design
    gamma, rest, leakage = _leakage(d, calibration, voltage, "core")
    beta, theta = _idle_fit(calibration, "core", voltage, gamma, ambient_c)
    coef, fitted = fit_fixed_effects(
        d.x[:, None], stack_columns(leakage, len(d.x)), rest - theta * d.volt, d.op, d.n_ops
    )
    if leakage:
        gamma = float(fitted[0])
    return _Coefficients(alpha=coef[:, 0], gamma=gamma, theta=theta, beta=beta)


def _fit_chip(
    design: _Design,
    voltage: VoltageCurve,
    train_mhz: np.ndarray,
    calibration: PowerCalibration | None = None,
) -> _Coefficients:
    """Fit the clock form on the chip rail: ``alpha_i f V^2 + u_i`` per op (+ ``gamma dT V``).

    Fitted jointly; ``u_i`` is the kernel's memory/uncore power and stands in for ``theta V``.
    With temperature (only with a chip cool-down trace: :meth:`PowerModel.fit`), ``gamma`` comes
    from the trace (eq. 16's ``gamma_SoC``) and its term is taken off the rows first: fitted
    jointly with ``u_i`` it is not identified (the static profiles' temperature follows the
    clock).
    """
    d = design
    gamma, target, _ = _leakage(d, calibration, voltage, "chip")
    if np.ptp(voltage.voltage_v(train_mhz)) > 0 and len(train_mhz) >= 3:
        # three clocks or more, the voltage moving among them: each kernel gets its own
        # V-proportional static term too (its power is not one f V^2 shape plus a constant)
        alpha, theta_op = per_op_static(d.x, d.volt, target, d.op, d.n_ops)
        return _Coefficients(alpha=alpha, gamma=gamma, theta=0.0, theta_op=theta_op)
    alpha, _, _ = fit_core_power(d.x, d.volt, None, target, d.op, d.n_ops, intercept=True)
    return _Coefficients(alpha=alpha, gamma=gamma, theta=0.0)


def _fit_throughput(
    design: _Design,
    rail: str,
    calibration: PowerCalibration | None,
    voltage: VoltageCurve,
    ambient_c: float,
) -> _Coefficients:
    """Per-op energies per launch; idle ``beta, theta`` from the calibration or jointly."""
    d = design
    assert d.inv_t is not None  # the throughput form's design has the ops' times
    per_op = [d.volt**2 * d.inv_t] + ([d.inv_t] if rail == "chip" else [d.x])
    gamma, target, shared = _leakage(d, calibration, voltage, rail)
    joint_gamma = bool(shared)
    beta = theta = 0.0
    if calibration is not None:
        beta, theta = _idle_fit(calibration, rail, voltage, gamma, ambient_c)
        target = target - beta * d.x - theta * d.volt
    else:
        shared = [*shared, d.x, d.volt]
    coef, shared_coef = fit_fixed_effects(
        np.stack(per_op, axis=1),
        stack_columns(shared, len(d.x)),
        target,
        d.op,
        d.n_ops,
        weight=1.0 / np.maximum(np.abs(target), 1e-9) ** 2,  # relative errors
    )
    fitted = iter(shared_coef)
    if joint_gamma:
        gamma = float(next(fitted))
    if calibration is None:
        beta, theta = float(next(fitted)), float(next(fitted))
    alpha = np.full(d.n_ops, beta)  # the idle f V^2 term, as in every op
    if rail == "chip":
        return _Coefficients(
            alpha, gamma, theta, beta, core_uj_per_v2=coef[:, 0], uncore_uj=coef[:, 1]
        )
    return _Coefficients(alpha + coef[:, 1], gamma, theta, beta, core_uj_per_v2=coef[:, 0])


def _idle_floor(
    calibration: PowerCalibration | None,
    device: DeviceSpec | None,
    voltage: VoltageCurve,
    rail: str,
    train_mhz: np.ndarray,
) -> PowerCalibration | None:
    """Return the idle runs the throughput form stands on, or None to fit them jointly.

    Two per-op terms take two clocks each; the clock-independent floor ``beta f V^2 + theta V``
    then comes from idle runs, a characterised device (``DeviceSpec.idle`` on the same rail) or,
    with 3+ training clocks, the joint fit. Without any of them the form has no floor at all
    (issue 16): refused, saying what to add.
    """
    if calibration is not None:
        return calibration
    characterised = idle_calibration(device, rail, voltage) if device is not None else None
    if characterised is not None:
        return characterised
    if len(train_mhz) >= 3:
        return None
    raise ValidationError(
        "the throughput power form needs an idle power floor: add idle runs (--calibrate), a "
        "characterised device (--device DEVICE.json from `opdvfs characterise`, or "
        "--characterise BENCH), or a third training clock",
        field="calibration",
    )


# the row columns the power fit reads (the rest of the profile's rows are not copied)
_FIT_COLUMNS = ("op", "freq_mhz", "time_us", "temp_c", "core_power_w", "chip_power_w")


def _training_rows(
    profile: Profile, train_freqs_mhz: Sequence[float] | None, window_ms: float | None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Return the power rows at the training clocks and the clocks (default: all with power).

    Every operator must have a positive time (:func:`~opdvfs.models.perf.check_times`) and
    power at every training clock: one missing leaves its per-op terms unidentified (two per-op
    terms from one point), and the fit used to accept it silently.
    """
    rows = power_rows(profile, window_ms, columns=_FIT_COLUMNS)
    # per distinct clock (a profile's are finite), then gathered per row: a sort of every row
    # and (rows x clocks) comparisons took ~0.8 s at 3M rows
    row_clock, clocks = pd.factorize(rows["freq_mhz"].to_numpy())
    train = training_clocks(train_freqs_mhz, np.unique(clocks), "has no power data in the profile")
    keep = np.isclose(clocks[:, None], train[None, :]).any(1)[row_clock]
    if not keep.all():  # every clock trains by default: no copy then
        rows = rows[keep]
        row_clock, clocks = pd.factorize(rows["freq_mhz"].to_numpy())
    op_ids, freqs, times = profile.time_matrix_us()
    names = op_names(profile, op_ids)
    check_times(op_ids, names, train, times[:, np.searchsorted(freqs, train)])
    missing = np.ones((len(op_ids), len(train)), dtype=bool)
    clock = np.abs(clocks[:, None] - train[None, :]).argmin(axis=1)[row_clock]
    missing[np.searchsorted(op_ids, rows["op"].to_numpy()), clock] = False
    if missing.any():
        i, j = np.argwhere(missing)[0]
        raise ValidationError(
            f"operator {int(op_ids[i])} ({names[i]}) has no power at {train[j]:g} MHz "
            f"({int(missing.any(axis=1).sum())} operator(s) like it); every operator needs "
            "power at every training clock",
            field="chip_power_w" if "chip_power_w" in rows else "core_power_w",
        )
    return rows, train


def _voltage_curve(
    voltage: VoltageCurve | None,
    device: DeviceSpec | None,
    rows: pd.DataFrame,
    train_mhz: np.ndarray,
    op: np.ndarray,
    n_ops: int,
    top_mhz: float,
    two_clocks: str = "prior",
) -> VoltageCurve:
    """Return the V-f curve the fit uses (issue 16: power is never a straight line in f).

    The given curve, else the device's (a preset or a characterised ``DeviceSpec``), else: from
    4+ clocks one fitted on them (knee and slope), from 3 the generic prior's knee with the rise
    fitted across all ops (:func:`~opdvfs.models.vf_prior.fit_top_rise`), from 2 the generic
    prior (:func:`~opdvfs.models.vf_prior.prior_curve`) or, with ``two_clocks="envelope"``, its
    knee with the rise read off the kernels' lower envelope and weighed against the prior's
    (:func:`~opdvfs.models.vf_prior.two_clock_curve`); ``top_mhz`` is the device's top clock.
    """
    if voltage is not None:
        return voltage
    if device is not None and device.voltage is not None:
        return device.voltage
    if len(train_mhz) < 2 or (len(train_mhz) == 2 and two_clocks == "prior"):
        return prior_curve(top_mhz)
    col = "core_power_w" if "core_power_w" in rows else "chip_power_w"
    grid = np.full((n_ops, len(train_mhz)), np.nan)
    j = np.searchsorted(train_mhz, rows["freq_mhz"].to_numpy())
    grid[op, j] = rows[col].to_numpy()
    if len(train_mhz) == 2:
        return two_clock_curve(train_mhz, grid, top_mhz)
    if len(train_mhz) == 3:
        return fit_top_rise(train_mhz, grid, top_mhz)
    return fit_voltage_curve(train_mhz, grid)


class PowerModel(JsonFile):
    """Per-operator core and chip power vs clock, with the temperature term (paper §5).

    Parameters
    ----------
    voltage
        V-f curve; default: the device's (``fit(device=...)``), else the generic prior (2
        clocks; see ``two_clocks``), its knee with a fitted rise (3), or one fitted on the
        clocks (4+).
    temperature
        Whether to model ``gamma dT V`` (the paper reports 4.62% with it, 4.97% without).
    thermal
        ``"workload"`` (default) or ``"op"``: whose power sets the temperature at a new clock.
    dynamic
        ``"clock"`` (default, the paper's ``alpha_i f V^2``) or ``"throughput"``: plus each
        op's energy per launch over its time at the clock (module docstring); :meth:`predict`
        then needs the ops' times, and :meth:`fit` an idle floor (idle runs in the
        calibration, a device with ``idle``, or 3+ training clocks).
    two_clocks
        The V-f curve from two training clocks with no device and no ``voltage``:
        ``"prior"`` (default, :func:`~opdvfs.models.vf_prior.prior_curve`) or ``"envelope"``
        (:func:`~opdvfs.models.vf_prior.two_clock_curve`: the rise read off the kernels' lower
        envelope, weighed against the prior's). Leave-one-GPU-out on the real sets of
        ``benchmarks/model_generalisation.py`` the envelope is closer on 4 of 13 and further on
        6 (its kernels are the compute-bound ones; memory-bound kernels' power bends less), so
        it is not the default.

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
    gamma_from_ : str
        Where ``gamma_`` came from: ``"cooldown"`` (a cool-down trace: measured), ``"fit"``
        (fitted jointly on the profile's clocks, where temperature follows the clock: not
        identified, often ~0) or ``"none"`` (no temperature term).
    beta_ : float
        Load-independent dynamic coefficient from idle calibration (0 when folded in alpha).
    uncore_w_ : ndarray, shape (n_ops,)
        Chip power not on the core rail, per op (constant in the clock).
    uncore_beta_ : float
        Chip power not on the core rail that follows the core clock, W per GHz V^2 (one for
        every op, paper eq. 16's ``alpha_SoC f V^2``); 0 on the chip rail alone.
    uncore_gamma_ : float
        Leakage slope of the chip beyond the core's, W per C per V (eq. 16's ``gamma_SoC``
        less the core's ``gamma``): from a cool-down trace with ``chip_power_w`` beside the
        core's; 0 without one and on the chip rail alone (``gamma_`` is then the chip's).
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
        two_clocks: TwoClocks = "prior",
    ) -> None:
        self.voltage = voltage
        self.temperature = temperature
        self.thermal = thermal
        self.dynamic = dynamic
        self.two_clocks = two_clocks

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
        The input profile is not modified.

        Raises
        ------
        ValidationError
            If a training clock repeats or has no power data, an operator has no positive time
            or no power at a training clock, the sensor windows are too few to attribute
            (:func:`~opdvfs.models.attribution.power_rows`), or the fit produced a non-finite
            coefficient.
        """
        if self.two_clocks not in TWO_CLOCK_CURVES:
            raise ValidationError(
                f"unknown two-clock V-f curve {self.two_clocks!r}; expected one of "
                f"{', '.join(TWO_CLOCK_CURVES)}",
                field="two_clocks",
            )
        if self.dynamic not in DYNAMIC_FORMS:
            raise ValidationError(
                f"unknown dynamic form {self.dynamic!r}; expected one of "
                f"{', '.join(DYNAMIC_FORMS)}",
                field="dynamic",
            )
        rows, train = _training_rows(profile, train_freqs_mhz, window_ms)
        op_ids = profile.op_ids
        op = np.searchsorted(op_ids, rows["op"].to_numpy())
        rail = "core" if "core_power_w" in rows else "chip"
        top_mhz = device.max_freq_mhz if device is not None else float(profile.freqs_mhz.max())
        voltage = _voltage_curve(
            self.voltage, device, rows, train, op, len(op_ids), top_mhz, self.two_clocks
        )
        # On the chip rail alone gamma cannot be told apart from the per-op uncore constants and
        # can make T = T0 + k P run away: there the term needs a chip cool-down trace (eq. 16's
        # gamma_SoC, measured, not fitted).
        chip_trace = (
            calibration is not None
            and leakage_slope(calibration.cooldown, "chip_power_w", voltage) is not None
        )
        use_t = self.temperature and (rail == "core" or chip_trace) and "temp_c" in rows
        use_t = use_t and bool(rows["temp_c"].notna().all())
        ambient_c, k_c_per_w = fit_thermal(rows, calibration)
        design = _Design.from_rows(
            rows,
            op,
            len(op_ids),
            rail=rail,
            voltage=voltage,
            ambient_c=ambient_c if use_t else None,
            throughput=self.dynamic == "throughput",
        )
        if self.dynamic == "throughput":
            calibration = _idle_floor(calibration, device, voltage, rail, train)
            coef = _fit_throughput(design, rail, calibration, voltage, ambient_c)
        elif rail == "core" and calibration is not None:
            coef = _fit_paper_procedure(design, calibration, voltage, ambient_c)
        elif rail == "core":
            coef = _fit_clock_core(design)
        else:
            coef = _fit_chip(design, voltage, train, calibration)
        self.rail_, self.voltage_ = rail, voltage
        self.ambient_c_, self.k_c_per_w_ = ambient_c, k_c_per_w
        self.alpha_, self.gamma_, self.theta_ = coef.alpha, coef.gamma, coef.theta
        self.beta_ = coef.beta
        n_ops = len(op_ids)
        self.theta_op_ = np.zeros(n_ops) if coef.theta_op is None else coef.theta_op
        self.core_uj_per_v2_ = (
            np.zeros(n_ops) if coef.core_uj_per_v2 is None else coef.core_uj_per_v2
        )
        self.uncore_uj_ = np.zeros(n_ops) if coef.uncore_uj is None else coef.uncore_uj
        # what the chip rail measures beyond the core model: the op's uncore power, plus the
        # part of it that follows the core clock (paper eq. 16, alpha_SoC f V^2: non-AICore
        # logic on the AI cores' clock), one slope for every op, fitted across the clocks
        model = self._core(op, design.x, design.volt, design.dtemp, design.inv_t)
        measured = rows["chip_power_w"].to_numpy(dtype=float) if "chip_power_w" in rows else model
        rest = measured - model
        # the rest of the chip leaks too (eq. 16's gamma_SoC dT V): its slope is what a chip
        # cool-down shows beyond the core's; left in the rest, the profiles' cooler low clocks
        # would pass it for clock-coupled power
        self.uncore_gamma_ = 0.0
        if rail == "core" and design.dtemp is not None and calibration is not None:
            chip_gamma = leakage_slope(calibration.cooldown, "chip_power_w", voltage)
            self.uncore_gamma_ = max((chip_gamma or 0.0) - self.gamma_, 0.0)
            rest = rest - self.uncore_gamma_ * design.volt * design.dtemp
        x_op = mean_by(op, design.x, n_ops)
        dx = design.x - x_op[op]
        # the slope from the ops whose time does not follow the clock (collectives, waits,
        # load-bound kernels): their traffic power is the same at every clock, so it cannot
        # pass for clock-coupled power
        spread = pd.Series(rows["time_us"].to_numpy(dtype=float)).groupby(op).agg(["min", "max"])
        t_lo = spread["min"].reindex(range(n_ops)).to_numpy()
        t_hi = spread["max"].reindex(range(n_ops)).to_numpy()
        flat = (t_hi <= 1.02 * t_lo)[op]
        use = flat if (flat & (dx != 0)).any() else np.ones_like(flat)
        dr = (rest - mean_by(op, rest, n_ops)[op])[use]
        dxu = dx[use]
        slope = float(dxu @ dr) / float(dxu @ dxu) if dxu.any() else 0.0
        self.uncore_beta_ = max(slope, 0.0) if rail == "core" else 0.0
        self.uncore_w_ = mean_by(op, rest, n_ops) - self.uncore_beta_ * x_op
        self.use_temperature_ = bool(use_t)
        cooldown = calibration.cooldown if calibration is not None else None
        measured_gamma = leakage_slope(cooldown, f"{rail}_power_w", voltage) is not None
        self.gamma_from_ = "none" if not use_t else "cooldown" if measured_gamma else "fit"
        self.op_ids_ = op_ids
        times = profile.ops.groupby("op")["time_us"].median()
        self.time_weight_ = times.reindex(op_ids).fillna(0.0).to_numpy(dtype=float)
        self.train_freqs_mhz_ = train
        check_finite(
            self,
            op_ids,
            alpha_=self.alpha_,
            gamma_=self.gamma_,
            theta_=self.theta_,
            beta_=self.beta_,
            theta_op_=self.theta_op_,
            uncore_gamma_=self.uncore_gamma_,
            core_uj_per_v2_=self.core_uj_per_v2_,
            uncore_uj_=self.uncore_uj_,
            uncore_w_=self.uncore_w_,
            ambient_c_=self.ambient_c_,
            k_c_per_w_=self.k_c_per_w_,
        )
        return self

    def _core(
        self,
        op: np.ndarray | slice,
        x: np.ndarray | float,
        volt: np.ndarray | float,
        dtemp: np.ndarray | None,
        inv_t: np.ndarray | None = None,
    ) -> np.ndarray:
        """Core-rail power, eq. (11) (``alpha_`` includes ``beta``), plus the throughput term."""
        out = self.alpha_[op] * x + (self.theta_ + self.theta_op_[op]) * volt
        if inv_t is not None:
            out = out + (self.core_uj_per_v2_[op] * volt**2 + self.uncore_uj_[op]) * inv_t
        return out + (self.gamma_ * volt * dtemp if dtemp is not None else 0.0)

    # ----------------------------------------------------------------------------- predict
    def predict(
        self,
        freqs_mhz: Sequence[float] | np.ndarray,
        time_us: np.ndarray | None = None,
        *,
        die_at_mhz: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Predicted power of every op at each clock, with the temperature solved per clock.

        Parameters
        ----------
        freqs_mhz
            Clocks to predict at.
        time_us
            Each op's time at each clock, shape (n_ops, n_freqs) (e.g. ``PerfModel.predict``);
            needed by the throughput form, ignored by the clock form.
        die_at_mhz
            Hold the die at the temperature it reaches at this clock (one of ``freqs_mhz``), at
            every clock, instead of each clock's own steady temperature. A static-clock run
            reaches its own (a lower clock runs cooler and leaks less, ``gamma dT V``, eqs.
            11 and 15); a per-operator plan that keeps most of an iteration at the top clock
            keeps the die near the top clock's temperature, and the ops it slows leak at that
            temperature: plan with ``die_at_mhz`` = the top clock. No effect without the
            temperature term (``gamma_`` 0 or none fitted).

        Returns
        -------
        dict
            ``core_w`` and ``chip_w`` (n_ops, n_freqs), ``temp_c`` (n_ops, n_freqs) and
            ``iterations`` (n_freqs,): the fixed-point steps taken (paper: <= 4). ``core_w`` is
            NaN when the model was fitted on the chip rail (board power, e.g. NVML): the
            core's share of it is not measured.

        Raises
        ------
        ValidationError
            If ``die_at_mhz`` is not one of ``freqs_mhz``, or the throughput form has no or
            misshapen ``time_us``.
        """
        check_is_fitted(self, "alpha_")
        freqs = np.atleast_1d(np.asarray(freqs_mhz, dtype=float))
        n = len(self.op_ids_)
        core = np.empty((n, len(freqs)))
        temps = np.empty_like(core)
        steps = np.zeros(len(freqs), dtype=int)
        weight = self.time_weight_ / max(self.time_weight_.sum(), 1e-300)
        inv_t = self._inverse_times(time_us, n, len(freqs))
        use_t = self.use_temperature_

        def terms(j: int) -> tuple[Any, float, np.ndarray]:
            """Return ``freqs[j]``'s ``f V^2`` and ``V``, and :meth:`_core` there without ``dT``.

            Every op at the clock's scalars (views of the coefficients, no columns of one
            value), once per clock, not at every step of the temperature's fixed point (at 1M
            ops, ~10 full-length temporaries a step).
            """
            volt = float(self.voltage_.voltage_v(freqs[j]))
            x = freqs[j] / 1e3 * volt**2
            return (
                x,
                volt,
                self._core(np.s_[:], x, volt, None, None if inv_t is None else inv_t[:, j]),
            )

        def core_at(base: np.ndarray, volt: float, dt: np.ndarray | None) -> np.ndarray:
            """:meth:`_core` at one clock from its ``terms``."""
            return base + (self.gamma_ * volt * dt if dt is not None else 0.0)

        def rise(x: Any, volt: float, base: np.ndarray) -> tuple[np.ndarray, int]:
            """Return the rise at a clock's own steady state (eq. 15's fixed point)."""
            if not use_t or self.k_c_per_w_ <= 0:
                return np.zeros(n), 0

            def chip_at(dt: np.ndarray) -> np.ndarray:
                p = core_at(base, volt, dt) + self.uncore_w_ + self.uncore_beta_ * x
                p = p + self.uncore_gamma_ * volt * dt
                return np.asarray(weight @ p) if self.thermal == "workload" else p

            return solve_temperature(chip_at, self.k_c_per_w_, n)

        held = None if die_at_mhz is None else rise(*terms(self._die_column(freqs, die_at_mhz)))
        for j in range(len(freqs)):
            x, volt_j, base = terms(j)
            dtemp, steps[j] = rise(x, volt_j, base) if held is None else held
            core[:, j] = core_at(base, volt_j, dtemp if use_t else None)
            temps[:, j] = self.ambient_c_ + dtemp
        volt = self.voltage_.voltage_v(freqs)
        fv2 = freqs / 1e3 * volt**2
        chip = core + self.uncore_w_[:, None] + self.uncore_beta_ * fv2[None, :]
        if use_t and self.uncore_gamma_:
            chip = chip + self.uncore_gamma_ * volt[None, :] * (temps - self.ambient_c_)
        if self.rail_ == "chip":  # fitted on board power: the core's share is not identified
            core, chip = np.full_like(chip, np.nan), chip
        return {"core_w": core, "chip_w": chip, "temp_c": temps, "iterations": steps}

    @staticmethod
    def _die_column(freqs: np.ndarray, die_at_mhz: float) -> int:
        """Column of ``die_at_mhz`` among ``freqs``; a clock not predicted is refused."""
        near = np.flatnonzero(np.isclose(freqs, die_at_mhz, rtol=1e-9, atol=0.0))
        if not len(near):
            raise ValidationError(
                f"die_at_mhz {die_at_mhz:g} MHz is not one of the clocks predicted "
                f"({', '.join(f'{f:g}' for f in freqs)})",
                field="die_at_mhz",
            )
        return int(near[0])

    def temperature_shift_w(
        self, freqs_mhz: Sequence[float] | np.ndarray, from_temp_c: Any, to_temp_c: Any
    ) -> dict[str, np.ndarray]:
        """Return the power change of moving the die from ``from_temp_c`` to ``to_temp_c`` (W).

        The model's own temperature terms (eqs. 10-11 and 16): what a measurement taken on a
        die at ``from_temp_c`` would have read at ``to_temp_c``. Core: ``gamma dT V(f)``; chip:
        ``(gamma + gamma_uncore) dT V(f)`` (the core's leakage is part of the chip's; on a
        chip-rail model ``gamma_`` is the chip's). Zero without the temperature term.

        Parameters
        ----------
        freqs_mhz
            Clocks, shape (n_freqs,).
        from_temp_c, to_temp_c
            Die temperatures (C), broadcastable to (n_ops, n_freqs); a NaN (no temperature
            recorded) gives no shift.

        Returns
        -------
        dict
            ``core_w`` and ``chip_w``, shape (n_ops, n_freqs).
        """
        check_is_fitted(self, "alpha_")
        freqs = np.atleast_1d(np.asarray(freqs_mhz, dtype=float))
        shape = (len(self.op_ids_), len(freqs))
        if not self.use_temperature_:
            return {"core_w": np.zeros(shape), "chip_w": np.zeros(shape)}
        rise = np.asarray(to_temp_c, dtype=float) - np.asarray(from_temp_c, dtype=float)
        per_gamma = np.nan_to_num(self.voltage_.voltage_v(freqs)[None, :] * rise, nan=0.0)
        per_gamma = np.broadcast_to(per_gamma, shape)
        return {
            "core_w": self.gamma_ * per_gamma,
            "chip_w": (self.gamma_ + self.uncore_gamma_) * per_gamma,
        }

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
    def to_dict(self, *, arrays: bool = False) -> dict[str, Any]:
        """Return the fitted model as a JSON-ready dict.

        ``arrays``: the per-operator values stay numpy arrays, for a columnar file.
        """
        check_is_fitted(self, "alpha_")

        def out(values: np.ndarray) -> Any:
            return values if arrays else values.tolist()

        return {
            "format": "opdvfs.power-model",
            "version": 1,
            "rail": self.rail_,
            "temperature": self.use_temperature_,
            "thermal": self.thermal,
            "dynamic": self.dynamic,
            "voltage": self.voltage_.model_dump(),
            "gamma": self.gamma_,
            "gamma_from": self.gamma_from_,
            "theta": self.theta_,
            "beta": self.beta_,
            "ambient_c": self.ambient_c_,
            "k_c_per_w": self.k_c_per_w_,
            "train_freqs_mhz": out(self.train_freqs_mhz_),
            "op_ids": out(self.op_ids_),
            "alpha": out(self.alpha_),
            "theta_op": out(self.theta_op_),
            "core_uj_per_v2": out(self.core_uj_per_v2_),
            "uncore_uj": out(self.uncore_uj_),
            "uncore_w": out(self.uncore_w_),
            "uncore_beta": self.uncore_beta_,
            "uncore_gamma": self.uncore_gamma_,
            "time_weight": out(self.time_weight_),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, source: str = "<dict>") -> PowerModel:
        """Rebuild a fitted model from :meth:`to_dict` output."""
        check_format(doc, "opdvfs.power-model", source, what="a power model")
        try:
            model = cls(
                temperature=bool(doc["temperature"]),
                thermal=doc["thermal"],
                dynamic=doc.get("dynamic", "clock"),
            )
            if model.dynamic not in DYNAMIC_FORMS:
                raise ValidationError(f"unknown dynamic form {model.dynamic!r}", field="dynamic")
            model.rail_ = str(doc["rail"])
            model.use_temperature_ = bool(doc["temperature"])
            model.voltage_ = VoltageCurve.model_validate(doc["voltage"])
            model.gamma_, model.theta_ = float(doc["gamma"]), float(doc["theta"])
            model.gamma_from_ = str(
                doc.get("gamma_from", "fit" if model.use_temperature_ else "none")
            )
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
            model.uncore_beta_ = float(doc.get("uncore_beta", 0.0))
            model.uncore_gamma_ = float(doc.get("uncore_gamma", 0.0))
            model.time_weight_ = np.asarray(doc["time_weight"], dtype=float)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFormatError(f"{source}: malformed power model ({exc})") from None
        return model
