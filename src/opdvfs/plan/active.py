"""Active profiling: the next clock worth measuring for a plan, or none (issue 31 item 2).

A profile of a few clocks leaves the models to fill the others, and the planner holds back
for their error: a model-filled cell's time is taken at its upper quantile, its energy too
(:data:`~opdvfs.plan.planner.TIME_QUANTILE_Z` standard deviations of
:func:`~opdvfs.plan.measured.log_uncertainty`). That error grows with the square of the gap
between the measured clocks around the cell (:func:`~opdvfs.plan.measured.gap_reach`), so one
more measured clock inside a gap the plan uses shrinks the margins of every cell in it (to 0 at
the clock itself, a quarter mid-gap at the gap's middle) and the plan can spend the time it
held back. Measuring a clock costs one sweep step; it is only worth it where the plan would
use what it buys.

:func:`clock_gains` values each clock not yet measured by the energy the plan is expected to
save per iteration once it is measured: the Lagrangian relaxation of the plan (each op at the
clock that minimises ``energy + lambda time`` on the conservative tables, ``lambda`` the
budget's price in J/s, found by bisection so that the relaxed plan meets the budget), before
and after, at the same price. The price turns time held back into energy (time at risk). After
the measurement the cells around the clock keep their point values with smaller margins, and
the clock's own cells take their true cost, which the models know only to within their
error: the gain counts the *expected improvement* (as in Bayesian optimisation) of a cost
normal about the point value, so a clock is worth what the plan would win in the cases where
the truth makes it use the clock, weighted by how likely they are. Every gap inside the
measured range holds candidates: a gap the point-value plan does not use is worth measuring
only as far as the truth may turn out cheaper there.

How far the truth may be off: the size of the errors the models made bridging the profile's
own gaps, the same leave-one-clock-out residuals :func:`~opdvfs.plan.measured.log_uncertainty`
takes its curvature from (:func:`loo_reach`), anywhere in a gap. ``log_uncertainty`` scales
them down by the square of the distance to the measured clocks, which suits a smooth curve but
not real tables, which step: on Perseus's four stage sets at the ``auto`` clocks the
model-filled cells' log errors (time; energy) are 2.7-5.9 (3.0-11) of its standard deviations
rms, and 0.5-1.3 (0.6-2.1) of these (``--max-gap none``: 2.3-5.3, 0.7-1.5). :data:`SPREAD`
scales them (0: the point values only, where a clock is worth only the margins it wins back,
and only the gaps the point-value plan uses on model-filled cells are candidates).

Steps further out than these errors are unlikely under a smooth model, but a measured table
can show one: an operator's time does not rise with its clock on one program, so where the
time measured above a gap exceeds the one below it (by more than two standard deviations of
their noise), the program changed inside the gap (:func:`lower_regime`). A clock there runs the
lower clock's program with the chance that the step is above it (its place uniform over the
gap), at the values the lower clocks' trend gives; the gain then counts that chance times what
the plan would win there, the rest of the time the expected improvement above (``steps``,
:data:`STEPS`). Perseus's BLOOM A40 forward stages are the case: 6% faster at 1035-1050 MHz
than at 1065 (4.2 of the leave-one-clock-out deviations in time, 2.2 in energy; about 15 of
``log_uncertainty``'s), and their time measured at 1065 MHz is 0.6% above the one at 960.
Without steps the criterion ranked 1035 MHz 38th of 50 and its plans at 5 and 10% stayed
2.91% and 2.13% above the every-clock optimum with 8 clocks added; with them it measures 1005
MHz first and they reach 0.20% and 0.11% (``benchmarks/few_clock_plans.py --active``). What
no criterion reading the profile can rank is a cell that is lucky: the same stages' forward
times scatter by 1.7% (sd) about a line over the 20 clocks from 1455 MHz up, where the A40
is at its power cap, and the plan at 2% needs the one at 1560 MHz, 1.9% faster than the top
clock (the benchmark's docstring has the figures).

:func:`next_clock` names the best clock when its gain is above the cost of measuring it
(:data:`MIN_GAIN_SHARE` of the plan's energy by default), else None: stop. Pure functions of
the tables, vectorised over ops and clocks (a Python loop over the candidate clocks only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from opdvfs.exceptions import ValidationError
from opdvfs.plan.measured import gap_reach
from opdvfs.plan.on_profile import PlanOnProfile
from opdvfs.plan.planner import TIME_QUANTILE_Z, Predictions, plan_schedule, predict
from opdvfs.schedule import Objective

__all__ = [
    "MIN_GAIN_SHARE",
    "SPREAD",
    "STEPS",
    "ClockToMeasure",
    "budget_price",
    "clock_gains",
    "loo_reach",
    "lower_regime",
    "next_clock",
    "next_clock_for",
]

#: A clock is worth measuring when the energy it is expected to save per iteration is at least
#: this share of the plan's (the default cost of one sweep step, :func:`next_clock`). On the 27
#: real sets of ``benchmarks/few_clock_plans.py --active`` (81 plans on the ``auto`` clocks, at
#: most 8 added each; only the 12 on Perseus's stages have clocks to add): this default adds
#: 81 clocks and leaves 1 plan more than 0.5% above the every-clock optimum (7 plans stop at
#: the 8). Measured before :data:`STEPS` (the same 81 clocks at this default, 3 plans): a cost
#: of 1% of the top clock's energy added 9 clocks (7 plans), 0.3% 40 (5), 0.1% 68 (3), 0.01%
#: of the top's 86 (3). On the point values (:data:`SPREAD` 0, where steps do not apply): 0.3%
#: of the top adds none (7), 0.1% of the plan's 4 (6), 0.03% of the top's 7 and of the plan's 9
#: (4), 0.01% or 0.003% of the top's 12-13 (the same 4).
MIN_GAIN_SHARE = 3e-4

#: How far :func:`clock_gains` lets a measurement surprise: the standard deviation of a
#: clock's true cost around the models' point value, in units of the errors the models made
#: bridging the profile's own gaps (leave one clock out, :func:`loo_reach`). 1: those errors
#: as they are (calibrated on Perseus's stages: the module's docstring); 0: the point values
#: only (a clock is worth only the margins it wins back).
SPREAD = 1.0

#: Whether :func:`clock_gains` lets a gap hold a step where the measured time rises with the
#: clock across it (``steps``, :func:`lower_regime`; only with a :data:`SPREAD` above 0):
#: False, the models' spread alone. Changes nothing on tables whose measured times fall with
#: the clock (the simulator's: ``tune`` adds the same 1125 MHz on ``sim:a100-like``).
STEPS = True

#: Bisection steps on the budget's price (relative precision 2^-60 of its bracket).
_BISECT = 60


@dataclass(frozen=True)
class ClockToMeasure:
    """The clock :func:`next_clock` names, and why.

    Attributes
    ----------
    freq_mhz
        The clock to measure (MHz).
    gain_j
        Energy per iteration the plan is expected to save once it is measured (J).
    cost_j
        What measuring it was weighed against (J per iteration).
    plan_energy_j
        The relaxed plan's energy per iteration before (J; ``gain_j`` relative to it).
    ops_in_gap
        Operators the point-value plan puts in the gap around the clock.
    gap_mhz
        The measured clocks around it (MHz): the gap it splits.
    """

    freq_mhz: float
    gain_j: float
    cost_j: float
    plan_energy_j: float
    ops_in_gap: int
    gap_mhz: tuple[float, float]

    def why(self) -> str:
        """One line: which clock, what it splits, what it is expected to save."""
        where = (
            f"where the plan puts {self.ops_in_gap} op(s) on model-filled clocks"
            if self.ops_in_gap
            else "where the plan puts no op unless the truth is better than the models say"
        )
        return (
            f"{self.freq_mhz:g} MHz splits the {self.gap_mhz[0]:g}-{self.gap_mhz[1]:g} MHz gap "
            f"{where}: expected to save {self.gain_j / self.plan_energy_j:.2%} of the plan's "
            f"energy (cost {self.cost_j / self.plan_energy_j:.2%})"
        )


def _relaxed(
    time_s: np.ndarray, energy_j: np.ndarray, price: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's best column on ``energy + price time`` and that minimum."""
    cost = energy_j + price * time_s
    col = np.argmin(cost, axis=1)
    return col, np.take_along_axis(cost, col[:, None], axis=1)[:, 0]


def budget_price(time_s: np.ndarray, energy_j: np.ndarray, budget_s: float) -> float:
    """Return the budget's price (J/s): the least ``lambda`` whose relaxed plan meets it.

    Each row (op or stage) at the column minimising ``energy + lambda time``; the plan's time
    falls as ``lambda`` rises. 0 when the least-energy plan already fits; :class:`ValidationError`
    when not even the fastest plan does.
    """
    rows = np.arange(len(time_s))
    if time_s[rows, _relaxed(time_s, energy_j, 0.0)[0]].sum() <= budget_s:
        return 0.0
    if time_s.min(axis=1).sum() > budget_s * (1 + 1e-12):
        fastest_s = float(time_s.min(axis=1).sum())
        raise ValidationError(
            f"no plan fits the budget of {budget_s:.6g} s (the fastest takes {fastest_s:.6g} s)",
            field="budget_s",
        )
    high = max(float(energy_j.sum() / max(time_s.sum(), 1e-300)), 1e-12)
    while time_s[rows, _relaxed(time_s, energy_j, high)[0]].sum() > budget_s and high < 1e300:
        high *= 4.0
    low = 0.0
    for _ in range(_BISECT):
        mid = 0.5 * (low + high)
        if time_s[rows, _relaxed(time_s, energy_j, mid)[0]].sum() > budget_s:
            low = mid
        else:
            high = mid
    return high


def _gaps(measured_cols: np.ndarray, n_clocks: int) -> np.ndarray:
    """Each column's gap: the index of the measured column at or below it (-1: below all)."""
    marks = np.full(n_clocks, -1)
    marks[measured_cols] = measured_cols
    return np.maximum.accumulate(marks)


def _expected_improvement(margin: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """``E[max(margin + sd Z, 0)]`` for a standard normal ``Z``; ``max(margin, 0)`` where sd is 0.

    What a cell whose cost is ``margin`` below the rest's, give or take ``sd``, is expected to
    save once its true cost is known (the expected improvement of Bayesian optimisation).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, margin / sd, 0.0)
    ei = margin * ndtr(z) + sd * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    return np.where(sd > 0, np.maximum(ei, 0.0), np.maximum(margin, 0.0))


def lower_regime(
    freqs_mhz: np.ndarray,
    time_s: np.ndarray,
    energy_j: np.ndarray,
    measured: np.ndarray,
    time_margin: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each cell's chance of lying in a step's lower regime, and its values there.

    An operator's time does not rise with its clock on one program: where the measured time
    at the clock above a gap, ``t(f_R)``, exceeds the one below, ``t(f_L)``, by more than two
    standard deviations of their difference (their margins: their noise), the program changed
    between them (a kernel, the power cap), and a clock inside the gap may still run the
    lower clock's program. Which one it runs is
    unknown: with the step's place uniform over the gap, a clock ``f`` runs the lower one with
    chance ``(f_R - f) / (f_R - f_L)``, at the time and energy the lower clocks' trend gives
    there (log-linear through ``f_LL < f_L``, the two measured clocks below the gap). Smooth
    tables, which fall with the clock, have no such gap: the chances are 0 everywhere.

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    time_s, energy_j
        The tables (their measured cells are read), shape (n_rows, n_clocks).
    measured
        Whether each cell was measured, same shape (or one row shared by every row).
    time_margin
        Each cell's margin in log units (a measured cell's: its noise); None: 0.

    Returns
    -------
    chance, time_s, energy_j
        Each cell's chance of the lower regime (0 where no step), and its time and energy
        there (the point values where the chance is 0); shape (n_rows, n_clocks).
    """
    f = np.asarray(freqs_mhz, dtype=float)
    t = np.asarray(time_s, dtype=float)
    e = np.asarray(energy_j, dtype=float)
    m = np.broadcast_to(np.asarray(measured, dtype=bool), t.shape)
    n_clocks = len(f)
    cols = np.arange(n_clocks)
    left = np.maximum.accumulate(np.where(m, cols, -1), axis=1)
    right = np.minimum.accumulate(np.where(m, cols, n_clocks)[:, ::-1], axis=1)[:, ::-1]
    lc, rc = np.clip(left, 0, n_clocks - 1), np.clip(right, 0, n_clocks - 1)
    below = np.concatenate([np.full((len(m), 1), -1), left[:, :-1]], axis=1)  # strictly left
    llc = np.take_along_axis(below, lc, axis=1)  # the measured clock below f_L (-1: none)
    ll = np.clip(llc, 0, n_clocks - 1)
    inside = ~m & (left >= 0) & (right < n_clocks) & (llc >= 0)
    t_l, t_r, t_ll = (np.take_along_axis(t, i, axis=1) for i in (lc, rc, ll))
    e_l, e_ll = np.take_along_axis(e, lc, axis=1), np.take_along_axis(e, ll, axis=1)
    noise = np.zeros_like(t) if time_margin is None else np.asarray(time_margin, dtype=float)
    noise_l, noise_r = np.take_along_axis(noise, lc, axis=1), np.take_along_axis(noise, rc, axis=1)
    tol = 2.0 * np.hypot(noise_l, noise_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = inside & (np.log(t_r / t_l) > tol)
        chance = np.where(step, (f[rc] - f[None, :]) / (f[rc] - f[lc]), 0.0)
        reach = (f[None, :] - f[lc]) / (f[lc] - f[ll])
        low_t = np.where(step, t_l * np.exp(np.log(t_l / t_ll) * reach), t)
        low_e = np.where(step, e_l * np.exp(np.log(e_l / e_ll) * reach), e)
    return chance, low_t, low_e


def loo_reach(freqs_mhz: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Return each row's mean leave-one-clock-out reach (MHz^2), shape (n_rows, 1).

    Over the measured clocks with a measured clock on both sides, the
    :func:`~opdvfs.plan.measured.gap_reach` each has when it is left out,
    ``(f - f_L) (f_R - f)``: the reach at which :func:`~opdvfs.plan.measured.log_uncertainty`
    saw its op's models err (its curvature is their errors over these reaches). A filled cell
    whose uncertainty is ``curvature x reach / 2`` has ``curvature x loo_reach / 2`` as the
    size of those errors themselves. Where a row has no such clock: its largest reach (the
    widest gap's middle).
    """
    f = np.asarray(freqs_mhz, dtype=float)
    m = np.asarray(measured, dtype=bool)
    seen = np.cumsum(m, axis=1)
    inner = m & (seen > 1) & (seen < seen[:, -1:])  # a measured clock on each side
    total = np.zeros(len(m))
    for j in np.flatnonzero(inner.any(axis=0)):  # the measured clocks: a few tens at most
        without = m.copy()
        without[:, j] = False
        total += np.where(inner[:, j], gap_reach(f, without)[:, j], 0.0)
    count = inner.sum(axis=1)
    widest = gap_reach(f, m).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, total / count, widest)[:, None]


def clock_gains(
    tables: Predictions,
    *,
    budget_s: float,
    plan_cols: np.ndarray,
    objective: Objective = "energy",
    spread: float = SPREAD,
    steps: bool = STEPS,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Return the clocks worth considering, each one's expected gain (J), and the plan's energy.

    Parameters
    ----------
    tables
        Every op's point time and energy at every clock of the device, each cell's margin in
        log units (its conservative value is ``value * exp(margin)``; the energy's None: none)
        and whether the models filled it: :func:`~opdvfs.plan.planner.predict` of a profile's
        models (None margins or fills: nothing to gain).
    budget_s
        The time the ops may take (s).
    plan_cols
        Each op's clock column in the plan the clock would serve (the point-value plan: where
        the plan goes if the models are right), shape (n_ops,).
    objective
        ``core-energy`` values the core rail, anything else the chip's.
    spread
        The standard deviation of a clock's true cost about the models' point value, in units
        of the size of the models' leave-one-clock-out errors (the margins over
        :data:`~opdvfs.plan.planner.TIME_QUANTILE_Z`, times :func:`loo_reach` over the cell's
        reach; a time error moves the energy with it); 0: the point values only.
    steps
        Whether a gap where the measured time rises with the clock may hold a step
        (:func:`lower_regime`: a clock in it may run the lower clocks' program); only with a
        ``spread`` above 0.

    Returns
    -------
    candidates
        Columns of the clocks no op was measured at that lie between measured clocks,
        ascending; with ``spread=0`` only in the gaps where ``plan_cols`` puts some op at a
        model-filled cell.
    gains_j
        Each candidate's expected saving per iteration (J): the relaxed conservative plan's
        energy plus ``price x time`` before, less its expectation after (the margins around the
        clock shrunk, the clock's own cost its true value: normal about the point value, with
        ``spread`` times the size of the models' leave-one-clock-out errors; with ``steps``,
        in a gap where the measured time rises with the clock, the lower clocks' program with
        :func:`lower_regime`'s chance), at the budget's price (:func:`budget_price`). >= 0.
    plan_energy_j
        The relaxed conservative plan's energy before (J).
    """
    f = np.asarray(tables.freqs_mhz, dtype=float)
    time_s = np.asarray(tables.time_us, dtype=float) * 1e-6
    energy = tables.core_energy_j if objective == "core-energy" else tables.chip_energy_j
    if tables.time_margin is None or tables.model_filled is None:
        return np.zeros(0, dtype=int), np.zeros(0), float(np.min(energy, axis=1).sum())
    t_margin = np.asarray(tables.time_margin, dtype=float)
    em = tables.energy_margin
    e_margin = np.zeros_like(t_margin) if em is None else np.asarray(em, dtype=float)
    filled = np.asarray(tables.model_filled, dtype=bool)
    cols = np.asarray(plan_cols, dtype=int)
    n_ops, n_clocks = time_s.shape
    rows = np.arange(n_ops)
    t_up, e_up = time_s * np.exp(t_margin), energy * np.exp(e_margin)
    price = budget_price(t_up, e_up, budget_s)
    chosen, before = _relaxed(t_up, e_up, price)
    plan_energy_j = float(e_up[rows, chosen].sum())
    measured = ~filled
    measured_cols = np.flatnonzero(measured.any(axis=0))
    if measured_cols.size == 0:
        return np.zeros(0, dtype=int), np.zeros(0), plan_energy_j
    open_cols = np.flatnonzero(filled.all(axis=0))  # no op measured there
    gaps = _gaps(measured_cols, n_clocks)
    top_measured = int(measured_cols[-1])
    if spread > 0:  # the plan may go to any clock the truth makes worth it: every gap
        candidates = open_cols[(gaps[open_cols] >= 0) & (open_cols < top_measured)]
    else:
        used = np.unique(gaps[cols[filled[rows, cols]]])
        candidates = open_cols[np.isin(gaps[open_cols], used)]
    if candidates.size == 0:
        return candidates, np.zeros(0), plan_energy_j
    # ops measured at the same clocks (a sweep's profile) share their reaches: one row
    pattern = measured[:1] if (measured == measured[:1]).all() else measured
    reach = gap_reach(f, pattern)
    gains = np.empty(len(candidates))
    # a clock changes the margins of its own gap only: with a shared pattern, each row's best
    # outside the gap is computed once per gap, and each candidate recomputes the gap's columns
    shared = len(pattern) == 1
    cost_up = e_up + price * t_up
    # the spread of the cost ``energy + price time`` the measurement reveals at each cell: the
    # error the models made bridging the profile's own gaps, wherever in its gap (a time
    # error moves the energy with it)
    with np.errstate(divide="ignore", invalid="ignore"):
        bridge = np.where(reach > 0, loo_reach(f, pattern) / reach, 0.0)
    cost_sd = spread * bridge * (energy * e_margin + price * time_s * t_margin) / TIME_QUANTILE_Z
    if steps and spread > 0:
        chance, low_t, low_e = lower_regime(f, time_s, energy, measured, t_margin)
        low_cost = low_e + price * low_t
    else:
        chance = np.zeros_like(time_s)
        low_cost = cost_up
    outside: dict[int, np.ndarray] = {}
    for k, c in enumerate(candidates.tolist()):  # the candidate clocks: a few tens at most
        now = pattern.copy()
        now[:, c] = True
        # a filled cell's sigma is its op's curvature x reach / 2: the margins scale with it
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(~pattern & (reach > 0), gap_reach(f, now) / reach, 1.0)
        cols_in = np.flatnonzero(gaps == gaps[c]) if shared else np.arange(n_clocks)
        others = cols_in[cols_in != c]
        sc = scale[:, others]
        rest = (
            energy[:, others] * np.exp(e_margin[:, others] * sc)
            + price * time_s[:, others] * np.exp(t_margin[:, others] * sc)
        ).min(axis=1, initial=np.inf)
        if shared and len(cols_in) < n_clocks:
            g = int(gaps[c])
            if g not in outside:
                outside[g] = np.delete(cost_up, cols_in, axis=1).min(axis=1)
            rest = np.minimum(rest, outside[g])
        # measured, clock c costs its true value: the point value, give or take the models'
        # error; the plan takes it where it beats the rest (expected improvement)
        point = energy[:, c] + price * time_s[:, c]
        p = chance[:, c]
        won = (1.0 - p) * _expected_improvement(rest - point, cost_sd[:, c])
        after = rest - won - p * np.maximum(rest - low_cost[:, c], 0.0)
        gains[k] = float((before - after).sum())
    return candidates, np.maximum(gains, 0.0), plan_energy_j


def next_clock(
    tables: Predictions,
    *,
    budget_s: float,
    plan_cols: np.ndarray,
    objective: Objective = "energy",
    cost_j: float | None = None,
    min_gain_share: float = MIN_GAIN_SHARE,
    spread: float = SPREAD,
    steps: bool = STEPS,
) -> ClockToMeasure | None:
    """Return the clock most worth measuring next for this plan, or None (stop).

    The candidate of :func:`clock_gains` with the largest expected gain, if that gain is at
    least ``cost_j`` (the cost of measuring it, J per iteration over the run the plan serves;
    default ``min_gain_share`` of the plan's energy). The other arguments are
    :func:`clock_gains`'.
    """
    candidates, gains, plan_energy_j = clock_gains(
        tables,
        budget_s=budget_s,
        plan_cols=plan_cols,
        objective=objective,
        spread=spread,
        steps=steps,
    )
    cost = min_gain_share * plan_energy_j if cost_j is None else float(cost_j)
    if gains.size == 0 or gains.max() <= 0.0 or gains.max() < cost:
        return None
    assert tables.model_filled is not None  # (candidates only where the models filled)
    best = int(candidates[np.argmax(gains)])
    f = np.asarray(tables.freqs_mhz, dtype=float)
    filled = np.asarray(tables.model_filled, dtype=bool)
    measured = np.flatnonzero(~filled.all(axis=0))
    gaps = _gaps(measured, len(f))
    low = int(gaps[best])
    above = measured[measured > best]
    high = int(above[0]) if above.size else len(f) - 1
    cols = np.asarray(plan_cols, dtype=int)
    in_gap = (gaps[cols] == low) & filled[np.arange(len(cols)), cols]
    return ClockToMeasure(
        freq_mhz=float(f[best]),
        gain_j=float(gains.max()),
        cost_j=cost,
        plan_energy_j=plan_energy_j,
        ops_in_gap=int(in_gap.sum()),
        gap_mhz=(float(f[max(low, 0)]), float(f[high])),
    )


def next_clock_for(
    fitted: PlanOnProfile,
    *,
    target: float,
    objective: Objective = "energy",
    interval_ms: float = 0.0,
    cost_j: float | None = None,
    min_gain_share: float = MIN_GAIN_SHARE,
    spread: float = SPREAD,
    steps: bool = STEPS,
) -> ClockToMeasure | None:
    """Return the clock most worth measuring next for a profile's plan at ``target``, or None.

    :func:`next_clock` on the tables ``opdvfs plan`` plans on
    (:func:`~opdvfs.plan.planner.predict` of :func:`~opdvfs.plan.on_profile.fit_profile`'s
    models, with their margins) and on the point-value plan at ``target``
    (``conservative=False``: where the plan goes if the models are right). None where the
    models filled nothing (every clock measured) or the profile gave no measurements.
    ``objective``: ``core-energy`` values the core rail, anything else the chip's;
    ``cost_j``, ``min_gain_share``, ``spread`` and ``steps``: :func:`next_clock`'s.
    """
    inputs = fitted.inputs
    if fitted.models is None or inputs.measured is None:
        return None
    tables = predict(fitted.models, inputs, "auto")
    point = plan_schedule(
        tables,
        inputs,
        target=target,
        objective="core-energy" if objective == "core-energy" else "energy",
        interval_ms=interval_ms,
        switch_latency_ms=fitted.switch_latency_ms if interval_ms > 0 else 0.0,
        conservative=False,
    )
    plan_cols = np.searchsorted(tables.freqs_mhz, point.freq_per_op_mhz())
    idle_s = float(inputs.idle_before_us.sum() * 1e-6)
    baseline_s = float(tables.time_us[:, -1].sum() * 1e-6) + idle_s
    return next_clock(
        tables,
        budget_s=(1.0 + target) * baseline_s - idle_s,
        plan_cols=plan_cols,
        objective=objective,
        cost_j=cost_j,
        min_gain_share=min_gain_share,
        spread=spread,
        steps=steps,
    )
