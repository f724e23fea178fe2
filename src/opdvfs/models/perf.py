"""Performance models: execution time of every operator as a function of the core clock.

The paper (§4) shows that an operator's core cycles are a convex, piecewise-linear function of the
clock ``f`` (its eqs. 5-8), so ``T(f) = cycles(f) / f``, and fits per operator, from 2-3 profiled
clocks (paper Fig. 15):

* ``func2``: ``T = a f + c / f`` (cycles ``a f^2 + c``), the paper's choice, closed form from 2
  points (1.96% mean error on Ascend);
* ``func1``: ``T = a f + b + c / f`` (cycles ``a f^2 + b f + c``); the paper fitted it with scipy's
  ``curve_fit`` (24x slower), but it is linear in its parameters: here a weighted least-squares
  solve for all operators at once;
* ``func3``: ``T = (a e^{b f} + c) / f`` with ``b`` clamped to [0, 10] per GHz as in the paper;
* ``pwl``: cycles piecewise linear through the training clocks, projected to be non-decreasing
  and convex (the physics), extrapolated with the end slopes;
* ``roofline``: ``T = (alpha f^{-p} + beta)^{1/p}``, a smooth maximum of a compute term
  (``T ~ 1/f``) and a flat memory term; ``p`` is fitted per op from 3+ clocks and fixed at
  :data:`ROOFLINE_P_TWO_CLOCKS` from 2;
* ``knee``: ``T = max(b + c/f, m)`` (cycles ``max(c + b f, m f)``: the paper's convex
  piecewise-linear cycles with a last, flat-time piece), for ops that stop speeding up part-way
  up the range -- memory-bound above a knee (memory clock fixed), or a board at its power cap,
  which no longer delivers the clock asked for (Perseus A40 above ~1455 MHz, A100 above ~1365).
  A sharp corner where ``func1`` bends smoothly: from 3 clocks it scores 0.33 / 0.31% on the
  Perseus A100 stages against func1's 0.70 / 0.82%, but 0.38 / 0.51% on the V100 (>= 945 MHz)
  against 0.18 / 0.30%, whose kernels turn memory-bound gradually, so it is not the default
  (``benchmarks/model_generalisation.py``, section 2).

Every form keeps the physics: coefficients that would make cycles concave or decreasing are
constrained at zero (weighted least squares on relative error, active sets), so points that
violate the physics -- a slowdown faster than ``1/f``, as the V100 shows below ~945 MHz, or an op
slower at a higher clock, as the Perseus A40 stages at single clocks -- are *flagged*
(:attr:`PerfModel.violation_`; :func:`~opdvfs.models.validation.validate_perf` checks every
clock of the profile and scores the ops that break it apart) rather than absorbed. Clocks are
handled in GHz.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from opdvfs._files import JsonFile, check_format
from opdvfs.exceptions import InputFormatError, ValidationError
from opdvfs.models._estimator import check_finite, check_is_fitted, training_clocks
from opdvfs.models._lsq import constrained_wls, nonneg_wls2
from opdvfs.profile import Profile

__all__ = [
    "FORMS",
    "ROOFLINE_P_TWO_CLOCKS",
    "VIOLATION_CONCAVE",
    "VIOLATION_FASTER_THAN_1_OVER_F",
    "VIOLATION_LOW_CLOCK_OFF_TREND",
    "VIOLATION_SLOWER_AT_HIGHER_CLOCK",
    "PerfModel",
    "check_physics",
    "check_times",
    "default_form",
    "fit_times",
    "predict_times",
]

#: Flag: cycles fall as the clock rises (time falls faster than 1/f) between training clocks.
VIOLATION_FASTER_THAN_1_OVER_F = 1
#: Flag: cycles at an interior training clock lie above the chord of its neighbours.
VIOLATION_CONCAVE = 2
#: Flag: the lowest training clock is slower than the trend of the higher ones (4+ clocks): the
#: default form fitted on the other 3+, extrapolated down, under-predicts it by more than the
#: tolerance. Real boards do this at their lowest clocks (the V100 below ~945 MHz slows down more
#: than its cycles allow: a power-state or memory-clock artefact, not the kernel's physics).
VIOLATION_LOW_CLOCK_OFF_TREND = 4
#: Flag: the op ran slower at a higher clock than at a lower one, by more than the tolerance.
#: More clock never slows a kernel down (its cycles grow at most in proportion to ``f``: the
#: memory-bound limit, time flat), so the clock asked for was not the one delivered (a power or
#: thermal cap, throttling) or the op did not run the same way at both clocks (another kernel,
#: another memory clock). The Perseus A40 stages do it: GPT-3 backward 3.6% slower at 975 MHz
#: than at 960 and 6% at 990; BLOOM forward 6.6% at 1065 MHz and 10.5% at 1080 than at 1050,
#: where the scatter between neighbouring clocks is ~0.1%.
VIOLATION_SLOWER_AT_HIGHER_CLOCK = 8
#: Relative tolerance of the physics checks: measurement noise is ~0.5-1% per point, and an
#: interior-point check compares three noisy points (3% keeps false flags near 1%).
PHYSICS_TOL = 0.03
#: Exponent of the roofline form when only two clocks are given (then it cannot be fitted).
#: Chosen as 4 on the real V100/A100/A40 data of ``benchmarks/perf_models.py`` (the same data
#: it is evaluated on: see that benchmark's note).
ROOFLINE_P_TWO_CLOCKS = 4.0
_ROOFLINE_P_GRID = np.linspace(0.5, 12.0, 24)
_FUNC3_B_GRID = np.linspace(0.0, 10.0, 41)  # paper: b clamped to [0, 10]


@dataclass(frozen=True)
class _Form:
    name: str
    n_params: int
    min_clocks: int
    description: str


FORMS: dict[str, _Form] = {
    f.name: f
    for f in (
        _Form("func2", 2, 2, "T = a f + c/f (paper's choice)"),
        _Form("func1", 3, 3, "T = a f + b + c/f"),
        _Form("func3", 3, 3, "T = (a exp(b f) + c)/f, b in [0, 10]"),
        _Form("pwl", 0, 2, "convex piecewise-linear cycles through the training clocks"),
        _Form("roofline", 3, 2, "T = (alpha f^-p + beta)^(1/p)"),
        _Form("knee", 3, 3, "T = max(b + c/f, m): flat above a knee (memory-bound, power cap)"),
    )
}


def default_form(n_clocks: int) -> str:
    """Return the most accurate form for ``n_clocks`` clocks (``benchmarks/perf_models.py``)."""
    return "roofline" if n_clocks <= 2 else "func1"


# --------------------------------------------------------------------------------- fitting
def _weights(t_us: np.ndarray) -> np.ndarray:
    """Weights that make squared residuals relative errors; a missing point weighs 0."""
    ok = np.isfinite(t_us) & (t_us > 0)
    return np.where(ok, 1.0 / np.where(ok, t_us, 1.0) ** 2, 0.0)


def _relative_sse(pred: np.ndarray, t_us: np.ndarray) -> np.ndarray:
    ok = np.isfinite(t_us) & (t_us > 0)
    err = np.where(ok, pred / np.where(ok, t_us, 1.0) - 1.0, 0.0)
    return np.nansum(err**2, axis=1) + np.where(np.isfinite(pred).all(axis=1), 0.0, np.inf)


def fit_times(form: str, f_ghz: np.ndarray, t_us: np.ndarray) -> np.ndarray:
    """Fit ``form`` to every operator's times at the training clocks, vectorised.

    Parameters
    ----------
    form
        One of :data:`FORMS`.
    f_ghz
        Training clocks, shape (k,), ascending.
    t_us
        Times, shape (n_ops, k); NaN where an op was not measured.

    Returns
    -------
    ndarray, shape (n_ops, n_params)
        Coefficients (``pwl``: the projected cycles at the training clocks).
    """
    w = _weights(t_us)
    if form == "func2":
        return nonneg_wls2(f_ghz, 1.0 / f_ghz, t_us, w)[0]
    if form == "func1":
        # a >= 0 keeps cycles convex; requiring them non-decreasing at the lowest clock as well
        # (2 a f_lo + b >= 0) was tried and costs accuracy on real GPUs, whose cycles dip a
        # little near the low end (check_physics flags the points that dip beyond noise).
        design = np.stack([f_ghz, np.ones_like(f_ghz), 1.0 / f_ghz], axis=1)
        return constrained_wls(design, t_us, w, nonneg=(0, 2))[0]
    if form == "func3":
        return _fit_func3(f_ghz, t_us, w)
    if form == "roofline":
        return _fit_roofline(f_ghz, t_us)
    if form == "knee":
        return _fit_knee(f_ghz, t_us, w)
    if form == "pwl":
        return _project_cycles(t_us * f_ghz)
    raise ValidationError(
        f"unknown form {form!r}; expected one of {', '.join(FORMS)}", field="form"
    )


def _fit_func3(f_ghz: np.ndarray, t_us: np.ndarray, w: np.ndarray) -> np.ndarray:
    best = np.full((len(t_us), 3), np.nan)
    best_sse = np.full(len(t_us), np.inf)
    for b in _FUNC3_B_GRID:
        coef, sse = nonneg_wls2(np.exp(b * f_ghz) / f_ghz, 1.0 / f_ghz, t_us, w)
        better = sse < best_sse
        best[better] = np.c_[coef[better, 0], np.full(better.sum(), b), coef[better, 1]]
        best_sse[better] = sse[better]
    return best


def _fit_roofline(f_ghz: np.ndarray, t_us: np.ndarray) -> np.ndarray:
    grid = _ROOFLINE_P_GRID if t_us.shape[1] >= 3 else np.array([ROOFLINE_P_TWO_CLOCKS])
    best = np.full((len(t_us), 3), np.nan)
    best_sse = np.full(len(t_us), np.inf)
    for p in grid:
        # T^p = alpha f^-p + beta is linear in (alpha, beta); weight so residuals are ~ dT/T.
        y = t_us**p
        w = np.where(np.isfinite(y) & (y > 0), 1.0 / np.where(y > 0, y, 1.0) ** 2, 0.0)
        coef, _ = nonneg_wls2(f_ghz**-p, np.ones_like(f_ghz), y, w)
        cand = np.c_[coef, np.full(len(coef), p)]
        sse = _relative_sse(predict_times("roofline", cand, f_ghz, f_ghz), t_us)
        better = sse < best_sse
        best[better], best_sse[better] = cand[better], sse[better]
    return best


def _fit_knee(f_ghz: np.ndarray, t_us: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Fit ``T = max(b + c/f, m)`` with ``b, c >= 0`` (cycles non-decreasing and convex).

    For each count ``s`` of top training clocks on the flat part (0 to k - 2): ``b, c`` by
    weighted least squares on the others, ``m`` the relative-error optimum of the top ``s``
    (``sum(1/T) / sum(1/T^2)``; 0 when ``s = 0``: no knee in the range); per op the candidate with
    the least relative error over every training point. From 3 clocks with the top above the
    lower two's trend, that is exact: the knee where ``b + c/f`` meets the top clock's time.
    """
    k = len(f_ghz)
    ok = w > 0
    best = np.full((len(t_us), 3), np.nan)
    best_sse = np.full(len(t_us), np.inf)
    for flat in range(k - 1):
        lower = np.arange(k) < k - flat
        coef, _ = nonneg_wls2(np.ones_like(f_ghz), 1.0 / f_ghz, t_us, w * lower)
        if flat:
            top = ok[:, ~lower]
            inv = np.where(top, 1.0 / np.where(top, t_us[:, ~lower], 1.0), 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                level = inv.sum(axis=1) / (inv**2).sum(axis=1)
        else:
            level = np.zeros(len(t_us))
        cand = np.c_[coef, level]
        sse = _relative_sse(predict_times("knee", cand, f_ghz, f_ghz), t_us)
        better = sse < best_sse
        best[better], best_sse[better] = cand[better], sse[better]
    return best


def _project_cycles(cycles: np.ndarray) -> np.ndarray:
    """Project cycles at ascending clocks onto non-decreasing sequences (per op, L2, PAVA).

    Convexity is imposed at prediction (:func:`_pwl_cycles`): segment slopes are made
    non-decreasing, so the curve is the max of lines and never concave.
    """
    c = cycles.copy()
    k = c.shape[1]
    # non-decreasing: pool adjacent violators (k is small, so sweep k times)
    for _ in range(k):
        for j in range(k - 1):
            bad = c[:, j] > c[:, j + 1]
            mean = 0.5 * (c[:, j] + c[:, j + 1])
            c[bad, j] = c[bad, j + 1] = mean[bad]
    return c


# --------------------------------------------------------------------------------- prediction
def predict_times(
    form: str, coef: np.ndarray, f_ghz: np.ndarray, train_f_ghz: np.ndarray
) -> np.ndarray:
    """Predict times (us) of every op at clocks ``f_ghz``, shape (n_ops, len(f_ghz))."""
    f = np.asarray(f_ghz, dtype=float)[None, :]
    if form == "func2":
        return coef[:, :1] * f + coef[:, 1:2] / f
    if form == "func1":
        return coef[:, :1] * f + coef[:, 1:2] + coef[:, 2:3] / f
    if form == "func3":
        return (coef[:, :1] * np.exp(coef[:, 1:2] * f) + coef[:, 2:3]) / f
    if form == "roofline":
        p = coef[:, 2:3]
        with np.errstate(over="ignore", invalid="ignore"):
            return (coef[:, :1] * f**-p + coef[:, 1:2]) ** (1.0 / p)
    if form == "knee":
        return np.maximum(coef[:, :1] + coef[:, 1:2] / f, coef[:, 2:3])
    if form == "pwl":
        return _pwl_cycles(coef, train_f_ghz, f[0]) / f
    raise ValidationError(f"unknown form {form!r}", field="form")


def _pwl_cycles(cycles: np.ndarray, xs: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Convex piecewise-linear cycles through ``(xs, cycles)``, shared knots, all ops at once."""
    # the lower convex envelope: at each query, the max over segment lines is convex, and
    # through convex data it passes through every point.
    if len(xs) == 1:
        return np.repeat(cycles, len(f), axis=1)
    slopes = np.diff(cycles, axis=1) / np.diff(xs)
    slopes = np.maximum(np.maximum.accumulate(np.maximum(slopes, 0.0), axis=1), 0.0)
    lines = cycles[:, :-1, None] + slopes[:, :, None] * (f[None, None, :] - xs[None, :-1, None])
    return lines.max(axis=1)


# --------------------------------------------------------------------------------- physics
def check_physics(f_mhz: np.ndarray, t_us: np.ndarray, tol: float = PHYSICS_TOL) -> np.ndarray:
    """Flag ops whose measured points violate the cycle physics, as a bitmask per op.

    Bit :data:`VIOLATION_FASTER_THAN_1_OVER_F`: between two consecutive clocks the cycles
    ``T f`` fall by more than ``tol`` (the op slowed down faster than the clock did).
    Bit :data:`VIOLATION_CONCAVE`: an interior point's cycles exceed the chord of its
    neighbours by more than ``tol``.
    Bit :data:`VIOLATION_SLOWER_AT_HIGHER_CLOCK`: the time at a clock exceeds the least time at
    any lower clock by more than ``tol`` (the op slowed down when the clock rose).
    """
    cycles = t_us * f_mhz[None, :]
    flags = np.zeros(len(t_us), dtype=np.int64)
    with np.errstate(invalid="ignore"):
        falls = cycles[:, 1:] < cycles[:, :-1] * (1.0 - tol)
        flags |= np.where(falls.any(axis=1), VIOLATION_FASTER_THAN_1_OVER_F, 0)
        if cycles.shape[1] >= 3:
            x = f_mhz
            w = (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
            chord = cycles[:, :-2] * (1 - w) + cycles[:, 2:] * w
            above = cycles[:, 1:-1] > chord * (1.0 + tol)
            flags |= np.where(above.any(axis=1), VIOLATION_CONCAVE, 0)
        least = np.fmin.accumulate(t_us, axis=1)  # fmin: a missing point is skipped
        slower = t_us[:, 1:] > least[:, :-1] * (1.0 + tol)
        flags |= np.where(slower.any(axis=1), VIOLATION_SLOWER_AT_HIGHER_CLOCK, 0)
    return flags


def low_clock_off_trend(
    f_ghz: np.ndarray, t_us: np.ndarray, tol: float = PHYSICS_TOL
) -> np.ndarray:
    """Flag ops whose time at the lowest clock is off the trend of the higher ones (4+ clocks).

    The default form for the other clocks (:func:`default_form`) is fitted on them and
    extrapolated to the lowest; an op measured slower than that by more than ``tol`` gets
    :data:`VIOLATION_LOW_CLOCK_OFF_TREND`. Faster is not flagged (a memory-bound op's time
    extrapolated down is an over-estimate). With 3 clocks the trend would rest on two points,
    one of them the top, where a board at its power cap (the A40 above ~1455 MHz) no longer runs
    the clock asked for: every A40 stage came out flagged, so 4 clocks are needed (the better
    profiling plan, :func:`~opdvfs.models.validation.training_plan`). Returns the bitmask per op.
    """
    if len(f_ghz) < 4:
        return np.zeros(len(t_us), dtype=np.int64)
    form = default_form(len(f_ghz) - 1)
    coef = fit_times(form, f_ghz[1:], t_us[:, 1:])
    trend = predict_times(form, coef, f_ghz[:1], f_ghz[1:])[:, 0]
    with np.errstate(invalid="ignore"):
        slow = t_us[:, 0] > trend * (1.0 + tol)
    return np.where(slow, VIOLATION_LOW_CLOCK_OFF_TREND, 0).astype(np.int64)


def op_names(profile: Profile, op_ids: np.ndarray) -> np.ndarray:
    """Name of each op in ``op_ids`` (its first row's), without copying the profile's rows."""
    ops = profile.ops
    first = ~ops["op"].duplicated().to_numpy()
    names = ops["name"][first].set_axis(ops["op"].to_numpy()[first])
    return names.loc[op_ids].to_numpy()


def check_times(
    op_ids: np.ndarray, names: np.ndarray, train_mhz: np.ndarray, t_us: np.ndarray
) -> None:
    """Refuse training times a time-vs-clock model cannot be fitted on, naming the first.

    Every operator needs a positive time at every training clock: a missing one leaves a 2-clock
    form one point (its fit is NaN), and a zero time has no relative error (weights are
    ``1 / T^2``), so an all-zero profile made the solve singular.

    Parameters
    ----------
    op_ids, names
        Operator positions and names, shape (n_ops,).
    train_mhz
        Training clocks, shape (k,).
    t_us
        Median times at the training clocks, shape (n_ops, k); NaN where not measured.

    Raises
    ------
    ValidationError
        Naming the operator, the clock and what was expected.
    """
    for bad, what in ((np.isnan(t_us), "has no time"), (~(t_us > 0), "has a time <= 0 us")):
        if bad.any():
            i, j = np.argwhere(bad)[0]
            count = int(bad.any(axis=1).sum())
            raise ValidationError(
                f"operator {int(op_ids[i])} ({names[i]}) {what} at {train_mhz[j]:g} MHz "
                f"({count} operator(s) like it); every operator needs a positive time at every "
                "training clock",
                field="time_us",
            )


def _json_floats(values: np.ndarray) -> list[Any]:
    """Nested lists of floats with None for NaN (JSON has no NaN)."""
    out = values.astype(object)
    out[~np.isfinite(values)] = None
    result: list[Any] = out.tolist()
    return result


# --------------------------------------------------------------------------------- estimator
class PerfModel(JsonFile):
    """Per-operator time-vs-clock model, fitted on a profile's training clocks.

    Parameters
    ----------
    form
        ``"auto"`` (the most accurate form for the number of training clocks: ``roofline``
        from 2, ``func1`` from 3 or more) or one of :data:`FORMS`.

    Attributes
    ----------
    form_ : str
        The form fitted.
    op_ids_ : ndarray, shape (n_ops,)
        Operator positions, ascending.
    names_ : ndarray, shape (n_ops,)
        Operator names.
    train_freqs_mhz_ : ndarray, shape (k,)
        Training clocks.
    coef_ : ndarray, shape (n_ops, n_params)
        Fitted coefficients (clocks in GHz, times in us).
    residual_ : ndarray, shape (n_ops,)
        RMS relative error on the training points.
    violation_ : ndarray, shape (n_ops,)
        Physics flags of the training points (:func:`check_physics`); 0 = consistent.
    """

    def __init__(self, *, form: str = "auto") -> None:
        self.form = form

    def fit(self, profile: Profile, train_freqs_mhz: Sequence[float] | None = None) -> Self:
        """Fit every operator on ``train_freqs_mhz`` (default: every clock of the profile).

        Times are the median over iterations. The input profile is not modified.

        Raises
        ------
        ValidationError
            If a training clock repeats or is not in the profile, an operator has no time at a
            training clock or a time that is not positive (:func:`check_times`), or the fit
            produced a non-finite coefficient.
        """
        op_ids, freqs, times = profile.time_matrix_us()
        train = training_clocks(train_freqs_mhz, freqs, "is not in the profile")
        cols = [int(np.flatnonzero(np.isclose(freqs, f))[0]) for f in train]
        form = default_form(len(train)) if self.form == "auto" else self.form
        if form not in FORMS:
            raise ValidationError(
                f"unknown form {form!r}; expected auto or one of {', '.join(FORMS)}",
                field="form",
            )
        if len(train) < FORMS[form].min_clocks:
            raise ValidationError(
                f"form {form!r} needs at least {FORMS[form].min_clocks} training clocks, got "
                f"{len(train)}",
                field="train_freqs_mhz",
            )
        names = op_names(profile, op_ids)
        check_times(op_ids, names, train, times[:, cols])
        t_train = times[:, cols]
        f_ghz = train / 1e3
        self.form_ = form
        self.op_ids_ = op_ids
        self.names_ = names
        self.train_freqs_mhz_ = train
        from threadpoolctl import threadpool_limits  # here: `opdvfs --help` loads this module

        # one BLAS thread: the batched (ops x 2 x 2) products and solves are too small to
        # split, and waking a pool for each costs more than it saves on a busy machine
        # (1M ops x 3 clocks: 3.5 -> 2.0 s CPU, the same coefficients bit for bit)
        with threadpool_limits(limits=1, user_api="blas"):
            self.coef_ = fit_times(form, f_ghz, t_train)
        fitted = predict_times(form, self.coef_, f_ghz, f_ghz)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.residual_ = np.sqrt(np.nanmean((fitted / t_train - 1.0) ** 2, axis=1))
        self.violation_ = check_physics(train, t_train) | low_clock_off_trend(f_ghz, t_train)
        check_finite(self, op_ids, coef_=self.coef_, residual_=self.residual_)
        return self

    def predict(
        self, freqs_mhz: Sequence[float] | np.ndarray, op_ids: np.ndarray | None = None
    ) -> np.ndarray:
        """Predicted time (us) of the ops ``op_ids`` (default all) at each clock.

        Returns
        -------
        ndarray, shape (n_ops, n_freqs)
        """
        check_is_fitted(self, "coef_")
        rows = slice(None) if op_ids is None else np.searchsorted(self.op_ids_, op_ids)
        f = np.atleast_1d(np.asarray(freqs_mhz, dtype=float)) / 1e3
        return predict_times(self.form_, self.coef_[rows], f, self.train_freqs_mhz_ / 1e3)

    # ----------------------------------------------------------------------------- files
    def to_dict(self, *, arrays: bool = False) -> dict[str, Any]:
        """Return the fitted model as a JSON-ready dict (lossless: floats round-trip).

        ``arrays``: the per-operator values stay numpy arrays (NaN as NaN), for a columnar file.
        """
        check_is_fitted(self, "coef_")
        head = {"format": "opdvfs.perf-model", "version": 1, "form": self.form_}
        if arrays:
            return {
                **head,
                "train_freqs_mhz": self.train_freqs_mhz_,
                "op_ids": self.op_ids_,
                "names": self.names_,
                "coef": self.coef_,
                "residual": self.residual_,
                "violation": self.violation_,
            }
        return {
            **head,
            "train_freqs_mhz": self.train_freqs_mhz_.tolist(),
            "op_ids": self.op_ids_.tolist(),
            "names": self.names_.tolist(),
            "coef": _json_floats(self.coef_),
            "residual": _json_floats(self.residual_),
            "violation": self.violation_.tolist(),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, source: str = "<dict>") -> PerfModel:
        """Rebuild a fitted model from :meth:`to_dict` output."""
        check_format(doc, "opdvfs.perf-model", source, what="a performance model")
        try:
            model = cls(form=doc["form"])
            model.form_ = doc["form"]
            model.train_freqs_mhz_ = np.asarray(doc["train_freqs_mhz"], dtype=float)
            model.op_ids_ = np.asarray(doc["op_ids"], dtype=np.int64)
            model.names_ = np.asarray(doc["names"], dtype=object)
            model.coef_ = np.asarray(doc["coef"], dtype=float).reshape(len(model.op_ids_), -1)
            model.residual_ = np.asarray(doc["residual"], dtype=float)
            model.violation_ = np.asarray(doc["violation"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFormatError(f"{source}: malformed perf model ({exc})") from None
        if model.form_ not in FORMS:
            raise InputFormatError(f"{source}: field 'form': unknown form {model.form_!r}")
        return model
