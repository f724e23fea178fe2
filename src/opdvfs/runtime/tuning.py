"""Closing the loop on the slowdown budget: plan at a budget, measure, re-plan until it fits.

The planner keeps a plan within ``(1 + target)`` of the top-clock time *as its models predict
it*. Measured, the plan runs slower: the fitted models miss some of the device's physics (on the
simulated ``a100-like``, a GPT-3 plan at 2% measures +3.2% with operator-exact switches), a
switch landing inside an operator splits it, and a time-triggered switch lands where the clock
says, not where the operators are. :func:`fit_budget` corrects for all of it by measurement: it
plans at a budget ``b``, measures the slowdown ``s`` the plan really costs, and moves ``b``
until ``s`` is at most the target (a few rounds; each is one plan and one measured run). The
planning and the measurement are the caller's -- :func:`twin_measure` runs a plan on the twin
the way either trigger mode applies it; iterations of the real program serve as well -- so the
same loop serves ``opdvfs tune`` (re-plan when the measured slowdown exceeds the target).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from opdvfs.exceptions import ValidationError
from opdvfs.schedule import Schedule

if TYPE_CHECKING:
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.workloads.workload import Workload

__all__ = [
    "BudgetFit",
    "BudgetRound",
    "Interval",
    "Measured",
    "fit_budget",
    "paired_interval",
    "twin_measure",
]


@dataclass(frozen=True)
class Measured:
    """What a plan really cost, against the top clock measured the same way.

    Attributes
    ----------
    slowdown
        Measured iteration time over the top clock's, minus 1 (0.02: 2% slower).
    saving
        1 minus measured chip energy over the top clock's (0.05: 5% saved).
    """

    slowdown: float
    saving: float


@dataclass(frozen=True)
class BudgetRound:
    """One round of the loop: the budget planned at, the plan, what it measured."""

    budget: float
    schedule: Schedule
    measured: Measured


@dataclass(frozen=True)
class BudgetFit:
    """The outcome of :func:`fit_budget`.

    Attributes
    ----------
    target
        The slowdown the measured run must stay within.
    rounds
        Every round, in order.
    best
        The round to use: the largest measured saving among those within the target, else
        (``met`` False) the one with the least measured slowdown.
    met
        Whether any round measured within the target.
    """

    target: float
    rounds: tuple[BudgetRound, ...]
    best: BudgetRound
    met: bool

    @property
    def schedule(self) -> Schedule:
        """The chosen round's plan."""
        return self.best.schedule


def fit_budget(
    plan_at: Callable[[float], Schedule],
    measure: Callable[[Schedule], Measured],
    *,
    target: float,
    rounds: int = 6,
    slack: float = 0.1,
    start: float | None = None,
) -> BudgetFit:
    """Find the planning budget whose plan measures within ``target``: a small closed loop.

    Round 1 plans at ``start`` (default: the target itself). The loop aims at the middle of
    the window ``[target * (1 - slack), target]``: the measured slowdown is not a smooth
    function of the budget (each plan is a different set of stages), so aiming at the
    target's edge lands above it half the time. Round 2 assumes the measured slowdown moves
    one for one with the budget (the overshoot is the models' error and the switches' cost,
    about the same for nearby budgets); later rounds interpolate between the two measured
    points nearest the aim, or, once the target is bracketed, between the largest budget
    that measured within it and the smallest larger one that measured above it (halving
    that bracket where the interpolation would repeat a budget). The loop stops when a
    round measures within the window, when the next budget is one already planned, when its
    plan is one already measured (the same stages at the same clocks: a plan saturated in the
    budget, e.g. every memory-bound stage already at its lowest useful clock, would only be
    measured again), or after ``rounds`` rounds.

    Parameters
    ----------
    plan_at
        Plans at a budget (a fraction: 0.02 = 2%); e.g. ``lambda b: plan_schedule(..., target=b)``.
    measure
        Runs a plan the way it will be applied and returns its :class:`Measured` cost.
    target
        The slowdown the measured run may cost (fraction, > 0).
    rounds
        Most plans to measure (>= 1).
    slack
        How far below the target a measured slowdown may stay and still end the loop (0.1:
        within 10% of the target), since every point below it gives up saving.
    start
        The budget of round 1, when a cheaper measurement (the twin) has already found
        one near the answer and the rounds now measure the real program.

    Raises
    ------
    ValidationError
        If ``target`` is not positive, ``rounds`` is less than 1 or ``start`` is negative.
    """
    if not target > 0:
        raise ValidationError(f"target {target}: expected a slowdown > 0", field="target")
    if rounds < 1:
        raise ValidationError(f"rounds {rounds}: expected at least 1", field="rounds")
    if start is not None and start < 0:
        raise ValidationError(f"start {start}: expected a budget >= 0", field="start")
    done: list[BudgetRound] = []
    budget = target if start is None else start
    for _ in range(rounds):
        schedule = plan_at(budget)
        if any(_same_plan(schedule, r.schedule) for r in done):
            break  # measuring it again tells nothing new
        done.append(BudgetRound(budget, schedule, measure(schedule)))
        slowdown = done[-1].measured.slowdown
        if target * (1 - slack) <= slowdown <= target:
            break
        following = _next_budget(done, target, aim=target * (1 - slack / 2))
        if following is None:
            break  # the loop would only repeat a plan it has measured
        budget = following
    within = [r for r in done if r.measured.slowdown <= target]
    if within:
        best = max(within, key=lambda r: r.measured.saving)
    else:
        best = min(done, key=lambda r: r.measured.slowdown)
    return BudgetFit(target, tuple(done), best, bool(within))


def _same_plan(a: Schedule, b: Schedule) -> bool:
    """Whether two schedules run the same stages at the same clocks."""
    return [(s.first_op, s.last_op, s.freq_mhz) for s in a.stages] == [
        (s.first_op, s.last_op, s.freq_mhz) for s in b.stages
    ]


def _next_budget(done: list[BudgetRound], target: float, *, aim: float) -> float | None:
    """Return the budget to plan at next from the rounds so far (>= 0), or None: stop."""

    def fresh(budget: float) -> bool:
        return all(abs(budget - r.budget) > 1e-4 * target for r in done)

    below = [r for r in done if r.measured.slowdown <= target]
    lo = max(below, key=lambda r: r.budget) if below else None
    above = [
        r for r in done if r.measured.slowdown > target and (lo is None or r.budget > lo.budget)
    ]
    hi = min(above, key=lambda r: r.budget) if above else None
    if lo is not None and hi is not None:
        # bracketed in budget: interpolate; the slowdown is not monotone in the budget (each
        # plan is another set of stages), so where that repeats a plan, halve the bracket
        ds = hi.measured.slowdown - lo.measured.slowdown
        budget = lo.budget + (aim - lo.measured.slowdown) * (hi.budget - lo.budget) / ds
        budget = min(max(budget, lo.budget), hi.budget)
        if not fresh(budget):
            budget = (lo.budget + hi.budget) / 2
        return budget if fresh(budget) else None
    # one side of the target: step from its edge (the smallest budget when every round ran
    # over, the largest within it otherwise) along the secant to the round nearest it; a
    # flat or inverted secant (noise, or the same plan twice) gives no slope: one for one
    ordered = sorted(done, key=lambda r: r.budget, reverse=lo is not None)
    edge = ordered[0]
    slope = 1.0
    if len(ordered) > 1:
        ds = edge.measured.slowdown - ordered[1].measured.slowdown
        db = edge.budget - ordered[1].budget
        if db != 0 and ds / db > 0.2:
            slope = ds / db
    step = (aim - edge.measured.slowdown) / slope
    for budget in (edge.budget + step, edge.budget + 2 * step):  # the same plan: go further
        if budget >= 0 and fresh(budget):
            return budget
    return None


def twin_measure(
    device: SimulatedDevice,
    workload: Workload,
    *,
    trigger: Literal["op", "time"],
    offsets: Literal["measured", "planned"] = "measured",
    iterations: int = 2,
) -> Callable[[Schedule], Measured]:
    """Return a ``measure`` for :func:`fit_budget`: a plan on the twin as ``trigger`` applies it.

    ``op``: each switch at its trigger op and delay (the operator-counting executor). ``time``:
    each switch at its due time from the iteration's start
    (:func:`~opdvfs.runtime.timed.issued_by_time`, the default guard included), the due times
    learned from a measured run of the plan (``offsets="measured"``: the plan run on the twin
    by its trigger ops, then once as time mode issues it,
    :func:`~opdvfs.runtime.timed.plan_timing`) or taken from the
    planner's predicted stage starts (``"planned"``). Both against the top clock over the same
    ``iterations``; each iteration draws its own noise, so a time-triggered switch meets an
    executed run that differs from the one its due time was learned on. The executor's own
    lateness (its worker thread, the host) is not in it: its real runs are what show that.
    """
    from opdvfs.runtime.timed import issued_by_time, plan_timing

    top, _ = device.run(workload, iterations=iterations, label="top clock")

    def measure(schedule: Schedule) -> Measured:
        applied = schedule
        if trigger == "time":
            timing = (
                plan_timing(schedule, device=device, workload=workload)
                if offsets == "measured"
                else plan_timing(schedule)
            )
            applied = issued_by_time(schedule, timing)
        run, _ = device.run(workload, applied, iterations=iterations, label=trigger)
        return Measured(
            slowdown=run.iteration_time_s / top.iteration_time_s - 1,
            saving=1 - run.chip_energy_j / top.chip_energy_j,
        )

    return measure


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided Student-t confidence interval.

    Attributes
    ----------
    mean, low, high
        The mean and the interval's ends (``nan`` with fewer than two values).
    n
        How many values.
    confidence
        The interval's level (0.95).
    """

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95


def paired_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Return the mean of paired differences and its t-interval (``mean +- t * s / sqrt(n)``).

    ``values``: one per A/B pair (e.g. tuned/reference ratio minus 1). The interval is the
    one-sample Student-t interval of the mean (n - 1 degrees of freedom).
    """
    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Interval(mean, mean - half, mean + half, int(x.size), confidence)
