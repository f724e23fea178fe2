"""How ``opdvfs tune`` chooses: every decision the closed loop makes, in one file.

The loop (:class:`~opdvfs.tuner.loop.Tuner`) runs the phases; what it runs them *with* is
decided here, by pure functions over what the run has measured, so each decision can be
tested on recorded rounds without training anything:

- **which clocks to profile**: :func:`profile_clocks` (``auto``: :func:`auto_clocks`, the top,
  two clocks just below it, the middle and the bottom of the device's range), and one more
  where the plan would use it: :func:`added_clock` (active profiling);
- **which clocks to plan over**: :func:`clock_grid` (the device's own within the swept range,
  the models filling those not swept);
- **what to plan for**: :data:`OBJECTIVE` and :data:`INTERVAL_MS` (the planner's objective and
  shortest stage; :func:`~opdvfs.plan.planner.plan_schedule` raises the interval to the switch
  latency itself);
- **how long an A/B block is**: :func:`block_size` (enough counted iterations for the device's
  energy counter, :func:`~opdvfs.tuner.ab.ab_block`);
- **which budget to plan at next**: :func:`fit_budget` (and :func:`_next_budget`): the planner
  keeps a plan within ``(1 + target)`` of the top-clock time *as its models predict it*.
  Measured, the plan runs slower: the fitted models miss some of the device's physics (on the
  simulated ``a100-like``, a GPT-3 plan at 2% measures +3.2% with operator-exact switches), a
  switch landing inside an operator splits it, and a time-triggered switch lands where the
  clock says, not where the operators are. :func:`fit_budget` corrects for all of it by
  measurement: it plans at a budget ``b``, measures the slowdown ``s`` the plan really costs,
  and moves ``b`` until ``s`` is at most the target (a few rounds; each is one plan and one
  measured run). The planning and the measurement are the caller's
  (:func:`~opdvfs.experiments.bench.twin_measure` runs a plan on the twin the way either
  trigger mode applies it; A/B blocks of the real program serve as well);
- **which round applies for the rest of the run**: :func:`choose_round` (the highest lower
  bound of the saving's interval within the target) and :func:`applies` (only a measured
  saving);
- **the best static clock**: :func:`split_rounds` (the last of ``rounds`` measures it) and
  :func:`static_budget` (planned as one stage, :data:`STATIC_INTERVAL_MS`, at the budget whose
  per-operator plan measured within the target, so both contenders carry the same correction);
- **whether a cached schedule applies**: :func:`cached_applies`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import ValidationError
from opdvfs.plan.active import ClockToMeasure, next_clock_for
from opdvfs.plan.on_profile import auto_clocks, fit_profile, within_profiled
from opdvfs.schedule import Objective, Schedule
from opdvfs.tuner.ab import BLOCK_COUNTER_UPDATES, DEFAULT_BLOCK, ab_block
from opdvfs.tuner.result import TuneRound

if TYPE_CHECKING:
    from opdvfs.profile import Profile

__all__ = [
    "ADDED_CLOCKS",
    "ADDED_CLOCK_MIN_GAIN",
    "CHOSEN_BY_LOW",
    "CHOSEN_BY_MEAN",
    "CHOSEN_BY_SLOWDOWN",
    "INTERVAL_MS",
    "OBJECTIVE",
    "STATIC_INTERVAL_MS",
    "BudgetFit",
    "BudgetRound",
    "Measured",
    "added_clock",
    "applies",
    "auto_clocks",
    "block_size",
    "cached_applies",
    "choose_round",
    "clock_grid",
    "fit_budget",
    "profile_clocks",
    "same_plan",
    "split_rounds",
    "static_budget",
]

#: The planner's objective unless told otherwise (as ``opdvfs plan``).
OBJECTIVE: Objective = "energy"
#: The planner's shortest stage (ms) unless told otherwise; below the device's switch latency
#: :func:`~opdvfs.plan.planner.plan_schedule` raises it to that.
INTERVAL_MS = 20.0
#: The shortest stage (ms) that plans the best static clock: longer than any iteration, so the
#: planner merges every stage into one and picks the clock of least energy within the budget.
STATIC_INTERVAL_MS = 1e9


# ----------------------------------------------------------------------------- clocks
def profile_clocks(
    supported_mhz: Sequence[float], clocks: Sequence[float] | Literal["auto"] = "auto"
) -> tuple[float, ...]:
    """Return the clocks the sweep profiles (MHz): ``clocks`` as given, or :func:`auto_clocks`.

    ``auto``: the five clocks alone (``max_gap=None``), not the denser ``--freqs auto`` of a
    profile: every clock is a sweep step of the run's own iterations (on ``sim:a100-like``
    with the tiny GPT, ``benchmarks/tune_vs_offline.py``, profiling and planning take 10.5% of
    its 200 iterations with the five, within its 15%; with the 19 of ``--freqs auto``, 22.0%).
    The sweep adds the clock the plan would use instead (:func:`added_clock`). Checking them
    against the device is the actuator's (``check_freq_mhz``).
    """
    if isinstance(clocks, str):
        if clocks != "auto":
            raise ValidationError(f"clocks {clocks!r}: expected 'auto' or a list", field="clocks")
        return auto_clocks(supported_mhz, max_gap=None)
    return tuple(clocks)


def clock_grid(profile: Profile, supported_mhz: Sequence[float], name: str) -> DeviceSpec | None:
    """Return the clocks tune plans over on the swept ``profile``: the device's, within the sweep's.

    The models fill those the sweep did not measure, for active profiling's choice
    (:func:`added_clock`) and the plans alike. A simulated GPU's profile names its preset: the
    preset's clocks (and V-f curve) from the lowest swept clock to the highest
    (:func:`~opdvfs.plan.on_profile.within_profiled`). A real GPU has none: ``supported_mhz``
    (the actuator's clocks, NVML's list: an A100's 81 in 15 MHz steps against the sweep's five
    or six) within that range, with the swept ones, as the device ``name`` (unless the profile
    names its own): a plan may set 1170 MHz between swept 1110 and 1230 MHz, never a clock
    outside the swept range (the models would extrapolate). None without either: the planner
    takes the swept clocks alone.
    """
    preset = within_profiled(profile)
    if preset is not None or not len(supported_mhz):
        return preset
    grid = {float(f) for f in supported_mhz} | {float(f) for f in profile.freqs_mhz}
    device = str(profile.meta.get("device") or name)
    return within_profiled(profile, DeviceSpec(name=device, freqs_mhz=tuple(sorted(grid))))


#: Clocks active profiling may add to an ``auto`` sweep (:func:`added_clock`): each costs one
#: sweep step, and a run's profiling + planning stays within 15% of its iterations
#: (``benchmarks/tune_vs_offline.py`` on ``sim:a100-like``: 10.5% for the five ``auto`` clocks
#: of 200 iterations, 13.0-13.5% with the clock added).
ADDED_CLOCKS = 1
#: The least expected saving (share of the plan's energy per iteration) a clock added to the
#: sweep must promise. Higher than ``opdvfs plan``'s (:data:`~opdvfs.plan.active.MIN_GAIN_SHARE`):
#: tune plans on point values and its A/B rounds correct the budget, so the margins a clock
#: wins back are not all tune's to gain, and one sweep step is 2.5% of a 200-iteration run's
#: iterations. On the tiny GPT (``benchmarks/tune_vs_offline.py``) the best clock on
#: ``sim:a100-like`` promised 0.73% at 2% on the point values (1125 MHz added: steady saving
#: 18.08-18.11% against 17.91%), 0.71% at 10% (1065 MHz), and 1.32% at 2% by its expected
#: improvement (:mod:`opdvfs.plan.active`; the same clock, 18.11%); on ``sim:h100-like`` none
#: is worth it at 2% either way.
ADDED_CLOCK_MIN_GAIN = 0.005


def added_clock(
    profile: Profile,
    *,
    target: float,
    objective: Objective = OBJECTIVE,
    interval_ms: float = INTERVAL_MS,
    n_launches: int | None = None,
    spec: DeviceSpec | None = None,
) -> ClockToMeasure | None:
    """Return the clock the sweep should measure too, after its ``auto`` clocks, or None.

    The swept ``profile`` fitted as the planning thread fits it
    (:func:`~opdvfs.plan.on_profile.fit_profile`; the preset's clocks, or ``spec``'s, the
    models filling the others), then :func:`~opdvfs.plan.active.next_clock_for` at
    ``target``: the clock in a gap the plan would use whose measurement is expected to save
    the most energy, if that is at least :data:`ADDED_CLOCK_MIN_GAIN` of the plan's (the
    cost of one sweep step).
    """
    fitted = fit_profile(profile, objective=objective, n_launches=n_launches, spec=spec)
    return next_clock_for(
        fitted,
        target=target,
        objective=objective,
        interval_ms=interval_ms,
        min_gain_share=ADDED_CLOCK_MIN_GAIN,
    )


# ----------------------------------------------------------------------------- A/B blocks
def block_size(
    given: int | None,
    *,
    exact_counter: bool,
    counter_s: float | None,
    iteration_s: float | None,
) -> tuple[int, str]:
    """Return the iterations per A/B block (its first discarded) and why that many.

    ``given`` (``--block``) wins. A simulated GPU's energy counter is exact
    (``exact_counter``) and a device without one (``counter_s`` None) has nothing to size by:
    :data:`~opdvfs.tuner.ab.DEFAULT_BLOCK`. Otherwise the counted iterations span
    :data:`~opdvfs.tuner.ab.BLOCK_COUNTER_UPDATES` updates of the counter at the top clock's
    ``iteration_s`` (:func:`~opdvfs.tuner.ab.ab_block`).
    """
    if given is not None:
        return given, "given (--block)"
    if exact_counter:
        return DEFAULT_BLOCK, "the simulated GPU's energy counter is exact"
    if counter_s is None:
        return DEFAULT_BLOCK, "no energy counter to size it by"
    block = ab_block(iteration_s, counter_s)
    why = (
        f"{block - 1} counted iterations of {iteration_s:.4g} s at the top clock "
        f"span >= {BLOCK_COUNTER_UPDATES} updates of the {counter_s * 1e3:g} ms "
        "energy counter"
        if iteration_s
        else "no iteration time to size it by"
    )
    return block, why


# ----------------------------------------------------------------------------- budgets
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

    @classmethod
    def of(cls, measured: TuneRound) -> Measured:
        """Return what an A/B round measured, as the budget loop reads it: the two means.

        A round without an energy reading saved nothing the loop can count (0).
        """
        saving = measured.saving.mean if measured.saving is not None else 0.0
        return cls(slowdown=measured.slowdown.mean, saving=saving)


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
    same: Callable[[Schedule, Schedule], bool] | None = None,
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
    measured again), or after ``rounds`` rounds. While every round has measured over the
    target it never stops for want of a budget before 0 has been planned: a step below 0 plans
    at 0, and a budget or plan already measured gives way to half the budget (0 below an eighth
    of the target), re-planned without a round until the plan is a new one (it stopped after
    one round at +3.7% for a 2% target, the step from round 1 reaching below 0). When no round
    measures within the target, ``best`` is the least slow one and ``met`` is False; whether it
    applies is :func:`applies`' (only with a measured saving; the loop's caller may keep the top
    clock).

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
    same
        Whether two plans are the same plan (default: the same stages at the same clocks; a
        pipeline job's compares every stage's, not only the one ``plan_at`` returns).

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

        def measured(plan: Schedule) -> bool:
            return any((same or same_plan)(plan, r.schedule) for r in done)

        # a plan measured before tells nothing new: over the target, plan lower for another
        while measured(schedule) and (lower := _lower_budget(done, budget, target)) is not None:
            budget = lower
            schedule = plan_at(budget)
        if measured(schedule):
            break
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


def same_plan(a: Schedule, b: Schedule) -> bool:
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
        if lo is None:
            budget = max(budget, 0.0)  # every round over the target: down to 0 at most
        if budget >= 0 and fresh(budget):
            return budget
    return _lower_budget(done, edge.budget, target) if lo is None else None


def _lower_budget(done: list[BudgetRound], budget: float, target: float) -> float | None:
    """Return a budget below ``budget`` while every round so far ran over ``target``, or None.

    Half of it, or 0 (the top clock wherever the planner finds no slack) once half is below an
    eighth of the target; None when a round measured within the target or ``budget`` is 0.
    """
    if budget <= 0 or any(r.measured.slowdown <= target for r in done):
        return None
    return budget / 2 if budget / 2 > target / 8 else 0.0


# ----------------------------------------------------------------------------- static clock
def split_rounds(rounds: int, static: bool = True) -> tuple[int, bool]:
    """Return the per-operator plans :func:`fit_budget` may measure, and whether a static clock is.

    The best single static clock (what ``nvidia-smi -lgc`` would lock) is measured as the last
    of ``rounds`` when there are two or more and ``static`` is on, so a user sees what
    per-operator switching buys over it, measured the same way; with one round, the
    per-operator plan alone.
    """
    if rounds < 1:
        raise ValidationError(f"rounds {rounds}: expected at least 1", field="rounds")
    if static and rounds >= 2:
        return rounds - 1, True
    return rounds, False


def static_budget(fit: BudgetFit) -> float:
    """Return the budget to plan the best static clock at, after the per-operator rounds.

    The budget of the chosen per-operator round when it measured within the target: its
    models' error and the device's overhead are about the static clock's too, so the two
    contenders meet on equal terms; else the target itself.
    """
    return fit.best.budget if fit.met else fit.target


# ----------------------------------------------------------------------------- the round
#: How :func:`choose_round` chose (the result's ``chosen_by``).
CHOSEN_BY_LOW = (
    "the highest lower bound of the energy saving's 95% interval among the rounds whose "
    "measured slowdown is within the target"
)
CHOSEN_BY_MEAN = (
    "the highest mean energy saving among the rounds whose measured slowdown is within the "
    "target (fewer than 2 pairs: no interval)"
)
CHOSEN_BY_SLOWDOWN = "the least measured slowdown (no round within the target)"


def choose_round(rounds: Sequence[TuneRound], target: float) -> tuple[int, bool, str]:
    """Return the round to apply for the rest of the run, whether it met the target, and why.

    Among the rounds whose mean measured slowdown is within ``target``, the one whose saving
    has the highest lower confidence bound: over a few rounds of a few pairs the highest
    *mean* is mostly the luckiest draw (the winner's curse: on an H200 with the clocks never
    changed, a null contrast, it picked a round measuring 5.91% [-19.21%, 31.04%] over one
    measuring 0.53% [-0.86%, 1.92%]). Ties, and rounds without an interval (1 pair), go by the
    mean. No round within the target: the least measured slowdown. The rounds within the
    target are those :func:`fit_budget` counts, so ``met`` is its.

    Raises
    ------
    ValidationError
        If ``rounds`` is empty.
    """
    if not rounds:
        raise ValidationError("no round was measured", field="rounds")

    def finite(value: float | None) -> float:
        return value if value is not None and math.isfinite(value) else -math.inf

    within = [i for i, r in enumerate(rounds) if r.slowdown.mean <= target]
    if not within:
        index = min(range(len(rounds)), key=lambda i: -finite(-rounds[i].slowdown.mean))
        return index, False, CHOSEN_BY_SLOWDOWN

    def key(i: int) -> tuple[float, float]:
        saving = rounds[i].saving
        if saving is None:
            return -math.inf, -math.inf
        return finite(saving.low), finite(saving.mean)

    index = max(within, key=key)  # the first of equals
    bounded = any(math.isfinite(key(i)[0]) for i in within)
    return index, True, CHOSEN_BY_LOW if bounded else CHOSEN_BY_MEAN


def applies(chosen: TuneRound, met: bool) -> bool:
    """Whether the chosen round's schedule should run for the rest of the job.

    Only a schedule that measured a saving: its mean saving above 0 (within the target, or,
    with no round within it, the least slowdown). Within the target with no energy measured,
    it applies on the models' word. A round that measured more energy than the top clock never
    applies: a user's own small MLP on sim:h100-like met the target and measured -0.06%
    [-0.09%, -0.02%], and was applied for the rest of the run.
    """
    if chosen.saving is None or chosen.saving.n == 0:
        return met
    return chosen.saving.mean > 0


#: A/B pairs that re-measure a schedule from the cache before it applies for the run.
CACHE_CHECK_PAIRS = 2


def cached_applies(
    schedule: Schedule,
    *,
    by_time: bool,
    n_launches: int | None,
    supported_mhz: Sequence[float],
) -> bool:
    """Whether a schedule from the cache may apply to this run (then re-measured briefly).

    Every clock it sets must be one the device accepts (an entry edited past the device's
    range would abort the job mid-run); applied by operator (``by_time`` False), it must also
    plan the operators the executor counts (``n_launches``).
    """
    supported = set(supported_mhz)
    if not all(stage.freq_mhz in supported for stage in schedule.stages):
        return False
    return by_time or schedule.n_ops == n_launches


def cached_holds(measured: TuneRound, target: float) -> bool:
    """Whether a cached schedule's brief A/B check keeps it: its slowdown is within ``target``.

    Only a clear miss drops it: the mean and the whole 95% interval past the target (two pairs
    give a wide interval; a schedule the cache holds met the target over a full round before).
    """
    slow = measured.slowdown
    low = slow.low if math.isfinite(slow.low) else slow.mean
    return not (slow.mean > target and low > target)
