"""From fitted models to a ``Schedule``: tables per op, stages, the exact solver, dispatch leads.

``plan_schedule`` predicts every operator's time and energy at every device clock from the
models, classifies and segments the sequence (the paper's preprocessing), sums the tables per
stage (:func:`stage_problem`), solves for the clocks within ``(1 + target)`` of the all-top-clock
time, and places each switch's trigger ``switch_latency`` ahead of its stage when dispatch is
predictive. :class:`PlanInputs` carries what the planner needs besides the models, built from a
workload (:meth:`PlanInputs.from_workload`) or from a profile (:meth:`PlanInputs.from_profile`).

Measurements first (DESIGN §4, :mod:`opdvfs.plan.measured`): inputs from a profile carry its
measured medians, and ``values="auto"`` plans on them wherever they exist, the models filling
only the unmeasured clocks (corrected to pass through the measured points). With a power model
whose leakage slope was measured (a cool-down trace) both are taken on the top clock's die (the
model's ``die_at_mhz``; measured cells moved there by its temperature term,
:func:`~opdvfs.plan.measured.at_die`): a static profile's low clocks ran on a cooler die than a
plan's slowed ops do. With every op measured at every clock no
model is needed. ``interval_ms=0`` plans one stage per operator; with
an interval, the classes only guide which neighbours merge (a prior for merging, not a
constraint on the optimum: every stage still gets the clock that is best for it).
:func:`plan_schedule` plans no stage shorter than the switch latency
(:func:`shortest_stage_ms`): a shorter one's clock request is superseded before it lands.

Objectives: ``energy`` (chip, default) and ``core-energy`` (exact, certified), ``power`` (mean chip
power, Dinkelbach), ``paper`` (eq. 17's score, best frontier plan; the GA searches with it too).
Energies in the schedule are operator energies (idle time between ops costs the same at every
clock); ``lower_bound_energy_j`` and ``gap_pct`` are on the objective's rail. The latency a
reactive dispatch cannot hide is charged: the stage's first ``switch_latency`` at the previous
clock (``StageTables.lag_s``).

Predict once, plan many: :func:`predict` returns every op's time and energy at every clock
(:class:`Predictions`), and every planner here takes it in place of the models, so a sweep of
targets, objectives or dispatches pays for the models' prediction once.
"""

from __future__ import annotations

import itertools
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import InfeasibleError, ValidationError
from opdvfs.models.bundle import ModelBundle
from opdvfs.plan.classify import classify_by_ratios, classify_by_sensitivity, sensitivity
from opdvfs.plan.dp import (
    EXACT_CELLS,
    StageTables,
    exact_frontier,
    frontier,
    frontier_plans,
    solve,
    solve_min_power,
    stage_tables,
)
from opdvfs.plan.ga import genetic_plan
from opdvfs.plan.measured import (
    MeasuredTables,
    at_die,
    correct_to_measurements,
    log_uncertainty,
    missing_measurement,
)
from opdvfs.plan.segment import segment
from opdvfs.profile import Profile
from opdvfs.schedule import Dispatch, Objective, Schedule, Solver, Values, op_signature
from opdvfs.sim.presets import preset_spec
from opdvfs.workloads.workload import Workload

__all__ = [
    "EXACT_CELLS",
    "MEASURED_NOISE_Z",
    "MEASURED_SUM_Z",
    "TIME_QUANTILE_Z",
    "PlanInputs",
    "Predictions",
    "StageProblem",
    "plan_frontier",
    "plan_grouped",
    "plan_schedule",
    "predict",
    "shortest_stage_ms",
    "stage_problem",
]

#: The plan meets its budget on each model-filled cell's time at this many standard deviations
#: of its uncertainty above the point value (:func:`~opdvfs.plan.measured.log_uncertainty`).
#: Model errors at the clocks a plan picks are correlated across ops (one bend of the clock
#: curve they all miss), so the quantile is taken per cell, not on the sum; and they are
#: heavier-tailed than normal. On real kernels filled from the ``auto`` clocks (27 sets,
#: ``benchmarks/few_clock_plans.py``), 3 sigma covered 60-100% of a set's filled cells' errors
#: (median set 97%), 2 sigma 50-100% (median 90%); at 2, 7 of 81 plans ran late (worst by 0.45
#: points), at 3 one (by 0.011), at 4 none. ``opdvfs tune`` plans without margins
#: (``conservative=False``: its A/B rounds measure each plan and re-plan); with them its saving
#: on ``sim:a100-like`` (``tune_vs_offline.py``) was 16.9% at 2, 16.4% at 3, against 17.9%.
TIME_QUANTILE_Z = 3.0
#: A measured cell's time is taken this many standard errors of its median above it (the
#: standard error from the cell's own iterations; a cell measured once has none and no margin:
#: measured means measured). Its noise is independent across ops, so a plan's sum averages it
#: out and what is left is the winner's curse (the plan picks the cells whose noise happened to
#: be low), about one standard error per cell picked.
MEASURED_NOISE_Z = 1.0
#: Where every cell was measured once (no cell has its own noise), the plan leaves this many
#: standard deviations of its sum's noise as slack in its budget: the standard deviation of one
#: measurement pooled over the profile (:func:`~opdvfs.plan.measured.pooled_noise`) times
#: ``sqrt(sum t_i^2)`` over the ops' top-clock times ``t_i`` (independent across ops). The
#: noise of the cells a plan picks is not independent of the choice (the winner's curse picks
#: the low ones), so the slack is on the sum, not a margin on each cell: a cell's margin of
#: one measurement's noise (0.56% on ``sim:a100-like``) would take a quarter of a 2% budget.
#: On ``sim:a100-like``'s every-clock profile (``tune_vs_offline.py``) the sum's standard
#: deviation is 0.048 points; the plan at 2% ran +2.06% without slack, +2.00% at 1 and +1.94%
#: at 2 (saving 18.10% either way). Perseus's tables are smooth (noise < 3e-6): no cost there.
#: It is the one thing a plan on a profile of every clock it may use pays against the optimum
#: on the same measurements (the solver is exact there, :data:`EXACT_CELLS`), and the promise
#: needs it: on the GTX 980's 30 kernels at 6 clocks measured once (legacy NV-DVFS set at
#: 1000 MHz memory, ``benchmarks/few_clock_plans.py``) at 2% it holds back 0.0021 points and
#: costs 0.00075% of energy, where the optimum on the measurements runs 1.99901%, 0.95 of the
#: sum's standard deviations (0.00104 points) under the deadline: late on about one re-run in
#: six from the noise alone, more with the winner's curse.
MEASURED_SUM_Z = 2.0


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs besides the models: the device's clocks and the op sequence.

    Parameters
    ----------
    freqs_mhz
        Clocks the planner may choose (MHz), any order.
    streams
        Stream of each op (``compute``, ``comm``, ...), shape (n_ops,); only ``compute`` ops can
        be frequency-sensitive.
    idle_before_us
        Idle time before each op (us), shape (n_ops,). It lasts the same at every clock, so it
        enters the time budget but not the choice of clocks.
    device
        Device name, recorded in the schedule.
    workload
        Workload name, recorded in the schedule.
    classes
        LOW/HIGH per op from the profiler's pipeline ratios (paper Fig. 12), when it gives them;
        otherwise the fitted sensitivity decides.
    phases
        Training phase per op (forward / backward / optimizer / other), for per-phase plans.
    measured
        The profile's measured medians (:meth:`from_profile`), planned on first; None for
        inputs from a workload (the models alone).
    """

    freqs_mhz: np.ndarray
    streams: np.ndarray
    idle_before_us: np.ndarray
    device: str | None = None
    workload: str | None = None
    classes: np.ndarray | None = None
    phases: np.ndarray | None = None
    measured: MeasuredTables | None = None

    @classmethod
    def from_workload(
        cls,
        workload: Workload,
        freqs_mhz: Sequence[float] | np.ndarray,
        *,
        device: str | None = None,
    ) -> PlanInputs:
        """Return the streams, idle gaps and phases of ``workload``, planned over ``freqs_mhz``.

        Parameters
        ----------
        workload
            The op sequence of one iteration.
        freqs_mhz
            Clocks the planner may choose (MHz).
        device
            Device name, recorded in the schedule.
        """
        ops = workload.ops
        return cls(
            np.asarray(freqs_mhz, dtype=float),
            ops["stream"].to_numpy(),
            ops["gap_before_us"].to_numpy(dtype=float),
            device=device,
            workload=workload.name,
            phases=ops["phase"].to_numpy(),
        )

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        spec: DeviceSpec | None = None,
        *,
        workload: Workload | None = None,
        shrink: bool = True,
    ) -> PlanInputs:
        """Return the planner's inputs for the ops of ``profile``, over its device's clocks.

        The streams and the idle time before each op (from ``start_us``, when every op has one)
        come from the profile's first iteration at its top clock, the LOW/HIGH classes from
        its pipeline ratios (``ratio_*`` columns), when it has them, and the measured medians
        of every op at every profiled clock (``measured``) from all its rows.

        Parameters
        ----------
        profile
            The profile the models were fitted on.
        spec
            The device to plan for (its clocks and name). By default the preset named by the
            profile's ``device``; for a device without a preset, the clocks the profile was taken
            at (and no device name).
        workload
            Take the streams, idle gaps and phases from this workload instead (e.g. a profile
            without start times); the classes still come from the profile's ratios.
        shrink
            Smooth the measured medians across clocks (:func:`~opdvfs.plan.measured.
            shrink_across_clocks`, against the winner's curse); False keeps the raw medians.
        """
        if spec is None:
            spec = preset_spec(profile.meta.get("device"))
        freqs_mhz = np.asarray(spec.freqs_mhz if spec is not None else profile.freqs_mhz, float)
        device = spec.name if spec is not None else None
        first = _first_iteration_at_top_clock(profile)
        classes = None
        if any(c.startswith("ratio_") for c in first.columns):
            classes = classify_by_ratios(first)[0]
        measured = MeasuredTables.from_profile(profile, shrink=shrink)
        if workload is not None:
            inputs = cls.from_workload(workload, freqs_mhz, device=device)
            return replace(inputs, classes=classes, measured=measured)
        idle_before_us = np.zeros(len(first))
        if "start_us" in first and first["start_us"].notna().all():
            start_us = first["start_us"].to_numpy()
            end_us = start_us + first["time_us"].to_numpy()
            idle_before_us[1:] = np.maximum(start_us[1:] - end_us[:-1], 0.0)
        return cls(
            freqs_mhz,
            first["stream"].to_numpy(),
            idle_before_us,
            device=device,
            workload=profile.meta.get("workload"),
            classes=classes,
            measured=measured,
        )


def _first_iteration_at_top_clock(profile: Profile) -> pd.DataFrame:
    """Return the profile's rows of its first iteration at its top clock, in op order."""
    rows = profile.ops
    top = rows[rows["freq_mhz"] == rows["freq_mhz"].max()]
    return top[top["iteration"] == top["iteration"].min()].sort_values("op").reset_index(drop=True)


@dataclass(frozen=True)
class StageProblem:
    """The planning problem over stages: per-op tables, the stages and their summed tables.

    Attributes
    ----------
    freqs_mhz
        The device's clocks, ascending (MHz), shape (n_clocks,).
    time_us, chip_energy_j, core_energy_j
        Time (us) and chip and core energy (J) of every op at every clock, shape
        (n_ops, n_clocks): measured where the values say so, else predicted; core energy NaN
        where nothing gives it.
    starts
        First op of each stage, ascending from 0, shape (n_stages,).
    stage_class
        LOW/HIGH class of each stage, shape (n_stages,).
    tables
        Time and energy of every stage at every clock, on the objective's rail (core energy for
        ``core-energy``, chip energy otherwise); no reactive lag (``plan_schedule`` adds it).
    names
        Operator names, shape (n_ops,) (the schedule's ``op_signature``).
    time_margin
        Each cell's time margin in log units: :data:`TIME_QUANTILE_Z` standard deviations of a
        model-filled cell's uncertainty, :data:`MEASURED_NOISE_Z` standard errors of a measured
        cell's median (:func:`~opdvfs.plan.measured.log_uncertainty`), shape
        (n_ops, n_clocks), 0 at the top clock (the baseline the budget is relative to); None
        where unknown. ``tables`` hold the stages' conservative times,
        ``time_us * exp(time_margin)``.
    energy_margin
        Each model-filled cell's chip-energy margin in log units (:data:`TIME_QUANTILE_Z`
        standard deviations of the same estimate on the energy table; 0 at measured cells),
        shape (n_ops, n_clocks); None where unknown. ``tables`` hold the stages' energies at
        ``exp(energy_margin)`` over their point values (either rail): a clock the models fill
        is chosen only where its saving holds at
        its upper quantile, so the models add to the measurements, never cost (the solvers'
        bound and gap are on these energies).
    model_filled
        Whether the models filled each cell (the profile did not measure it), shape
        (n_ops, n_clocks); None where not planned on a profile.
    """

    freqs_mhz: np.ndarray
    time_us: np.ndarray
    chip_energy_j: np.ndarray
    core_energy_j: np.ndarray
    starts: np.ndarray
    stage_class: np.ndarray
    tables: StageTables
    names: np.ndarray
    time_margin: np.ndarray | None = None
    model_filled: np.ndarray | None = None
    energy_margin: np.ndarray | None = None

    @property
    def op_tables(self) -> _OpTables:
        """Return the per-op clocks and tables, for building a schedule."""
        return self.freqs_mhz, self.time_us, self.chip_energy_j, self.core_energy_j


#: Clocks (ascending, MHz) and per-op time (us), chip and core energy (J) at each clock.
_OpTables = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: Each cell's time uncertainty (log standard deviation), whether the models filled it, and
#: its chip-energy uncertainty.
_Uncertainty = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True)
class Predictions:
    """Every op's time and energy at every clock, as the planners use them (:func:`predict`).

    Attributes
    ----------
    names
        Operator names, shape (n_ops,).
    freqs_mhz
        The clocks, ascending (MHz), shape (n_clocks,).
    time_us, chip_energy_j, core_energy_j
        Time (us) and chip and core energy (J) of every op at every clock, shape
        (n_ops, n_clocks); core energy NaN where nothing gives it.
    values
        What they were made from (``auto``, ``measured`` or ``model``, as in
        :func:`plan_schedule`); a planner asked for other values refuses them.
    time_margin, model_filled, energy_margin
        Each cell's time margin, whether the models filled it, and its energy margin (as in
        :class:`StageProblem`); None where unknown.
    """

    names: np.ndarray
    freqs_mhz: np.ndarray
    time_us: np.ndarray
    chip_energy_j: np.ndarray
    core_energy_j: np.ndarray
    values: Values = "auto"
    time_margin: np.ndarray | None = None
    model_filled: np.ndarray | None = None
    energy_margin: np.ndarray | None = None


#: What the planners plan on: fitted models, their predictions, or nothing (all measured).
Planned = ModelBundle | Predictions | None


def predict(models: ModelBundle | None, inputs: PlanInputs, values: Values = "auto") -> Predictions:
    """Predict every op at every clock once, for any number of plans over the same inputs.

    Pass the result to :func:`plan_schedule`, :func:`stage_problem`, :func:`plan_frontier` or
    :func:`plan_grouped` in place of the models, with the same ``inputs`` and ``values``.

    Parameters
    ----------
    models
        Fitted time and power models of the ops, or None when ``inputs`` measured every op at
        every clock.
    inputs
        The device's clocks and the op sequence (and the profile's measurements).
    values
        ``auto``, ``measured`` or ``model``: see :func:`plan_schedule`.

    Raises
    ------
    ValidationError
        As :func:`plan_schedule` does for the same arguments.
    """
    names, (freqs, time_us, chip_j, core_j), (sigma, filled, e_sigma) = _op_tables(
        models, inputs, values
    )
    return Predictions(names, freqs, time_us, chip_j, core_j, values, sigma, filled, e_sigma)


def shortest_stage_ms(interval_ms: float, switch_latency_ms: float) -> float:
    """Return the shortest stage a plan may have: the interval, or the switch latency if longer.

    A clock request issued while the previous one is still pending supersedes it (SetFreq
    semantics, :mod:`opdvfs.sim.timeline`; one target register on hardware): with predictive
    dispatch the request of a stage shorter than the latency is issued before the previous
    stage's has landed, so the previous stage never runs at its clock, and with reactive dispatch
    its own request lands after it ends. Such stages are planned but not executed: GPT-3 on the
    h100-like twin (15 ms switch) planned in 5 ms stages at a 2% target ran 24% of its time at
    other clocks than planned and measured 3.26% slower (5.1% from a profile of every clock);
    in stages of at least 15 ms it runs as planned, 2.07%.
    """
    return max(float(interval_ms), float(switch_latency_ms))


def plan_schedule(
    models: Planned,
    inputs: PlanInputs,
    *,
    target: float,
    objective: Objective = "energy",
    interval_ms: float = 5.0,
    switch_latency_ms: float = 1.0,
    dispatch: Dispatch = "predictive",
    solver: Solver = "dp",
    seed: int = 0,
    values: Values = "auto",
    conservative: bool = True,
) -> Schedule:
    """Plan per-stage clocks that minimise the objective within ``(1 + target)`` x top-clock time.

    Parameters
    ----------
    models
        Fitted time and power models of the workload's ops (a power model is required), their
        :func:`predict` for these inputs (predict once, plan many), or None when ``inputs``
        measured every op at every clock.
    inputs
        The device's clocks and the op sequence (streams, idle time, classes, measurements).
    target
        Allowed slowdown as a fraction of the all-top-clock iteration time (0.02 = 2% slower).
    objective
        What to minimise: ``energy`` (chip), ``core-energy``, ``power`` (mean chip power) or
        ``paper`` (eq. 17's score on the frontier; no certificate).
    interval_ms
        Frequency-adjustment interval (ms): the shortest stage the segmentation keeps; 0 plans
        one stage per operator. Raised to ``switch_latency_ms`` where shorter
        (:func:`shortest_stage_ms`; the schedule records the interval planned with).
    switch_latency_ms
        Time from issuing a clock switch to its taking effect (ms).
    dispatch
        ``predictive`` issues each switch ``switch_latency_ms`` ahead of its stage; ``reactive``
        issues it when the stage starts, and the plan pays for the lag.
    solver
        ``dp``: the exact solver, certified by its bound; ``ga``: the paper's genetic algorithm.
    seed
        Seed of the GA's random generator.
    values
        ``auto``: the profile's measurements where present, the models (corrected through
        them) elsewhere; ``measured``: the measurements only; ``model``: the models only.
    conservative
        Meet the budget on each cell's conservative time and take a model-filled cell's energy
        at its upper quantile (:class:`StageProblem`'s margins; ``opdvfs plan``, which promises
        the budget once). False plans on the point values: for a closed loop that measures
        each plan's real slowdown and re-plans at another budget (``opdvfs tune``), where the
        margins would only stack on the budget it corrects.

    Returns
    -------
    Schedule
        The plan with its predicted time and energy (on the values planned on), on the
        profile's measurements too where it measured the planned clocks, and for the exact
        solver its certified bound (``lower_bound_energy_j``, or ``lower_bound_power_w`` for
        ``power``) and ``gap_pct``.

    Raises
    ------
    ValidationError
        If the models hold no power model (energy cannot be planned from time alone) and the
        measurements do not cover every op at every clock, ``values="measured"`` finds an op
        unmeasured at a clock (the message names both), or the inputs and the models count
        different ops.
    InfeasibleError
        If no plan fits the budget.
    """
    started = _time.perf_counter()
    interval_ms = shortest_stage_ms(interval_ms, switch_latency_ms)
    problem = stage_problem(
        models,
        inputs,
        objective=objective,
        interval_ms=interval_ms,
        values=values,
        conservative=conservative,
    )
    tables = problem.tables
    if dispatch == "reactive":
        # a switch issued when its stage starts lands switch_latency later: the DP charges the
        # stage's first switch_latency at the previous clock
        tables = replace(tables, lag_s=switch_latency_ms * 1e-3)
    top = len(problem.freqs_mhz) - 1
    # Idle time takes as long at every clock: it enters the budget, not the choice.
    idle_s = float(inputs.idle_before_us.sum() * 1e-6)
    baseline_s = float(tables.time_s[:, top].sum()) + idle_s
    # the models' values are smooth: no noise to pick from
    slack_s = _noise_slack_s(problem, inputs) if conservative and values != "model" else 0.0
    # the slack never takes the top clock's own time: all at the top clock always fits
    slack_s = min(slack_s, max(target, 0.0) * baseline_s)
    budget_s = (1.0 + target) * baseline_s - idle_s - slack_s
    lower_bound_j: float | None
    lower_bound_w: float | None = None
    gap_pct: float | None
    if solver == "ga":
        found = genetic_plan(tables, budget_s, problem.stage_class, rng=np.random.default_rng(seed))
        clock, plan_time_s, lower_bound_j, gap_pct = found.clock, found.time_s, None, None
    elif objective == "paper":
        # eq. 17 on the frontier: the feasible plan with the best 2 Per^2 / Power, i.e. the
        # least E * T (no certificate: the score is not an energy)
        plans, points = frontier_plans(tables)
        fits = points[:, 0] <= budget_s * (1 + 1e-12)
        if not fits.any():
            raise InfeasibleError(f"no plan fits a {target:.1%} slowdown")
        j = int(np.flatnonzero(fits)[np.argmin((points[:, 0] * points[:, 1])[fits])])
        clock, plan_time_s, lower_bound_j, gap_pct = plans[j], float(points[j, 0]), None, None
    else:
        result = (
            solve_min_power(tables, budget_s)
            if objective == "power"
            else solve(tables, budget_s, **_exactness(tables))
        )
        if result.status == "infeasible":
            raise InfeasibleError(f"no plan fits a {target:.1%} slowdown")
        clock, plan_time_s = result.clock, result.time_s
        lower_bound_j, lower_bound_w = result.lower_bound_j, result.lower_bound_power_w
        gap_pct = result.gap_pct
    # the solvers met the budget on the conservative times: the prediction is the point one
    margin_s = _margin_s(problem, clock)
    model_share = _model_share(problem, clock)
    conservative_time_s = (
        None if problem.time_margin is None and slack_s == 0 else plan_time_s + slack_s + idle_s
    )
    names, op_tables, starts = problem.names, problem.op_tables, problem.starts
    # the cells' margins and which the models filled (~150 MB at 1M ops x 9 clocks) are not
    # needed past here: freed before the schedule is built, the planner's peak
    del problem
    return _schedule(
        names,
        op_tables,
        starts,
        clock,
        inputs,
        predictive=dispatch == "predictive",
        switch_latency_ms=switch_latency_ms,
        baseline_time_s=baseline_s,
        predicted_time_s=plan_time_s - margin_s + idle_s,
        started=started,
        target=target,
        objective=objective,
        solver=solver,
        dispatch=dispatch,
        interval_ms=interval_ms,
        values=values,
        conservative_time_s=conservative_time_s,
        model_share=model_share,
        lower_bound_energy_j=lower_bound_j,
        lower_bound_power_w=lower_bound_w,
        gap_pct=gap_pct,
    )


def _exactness(tables: StageTables) -> dict:
    """Return :func:`~opdvfs.plan.dp.solve`'s tolerance for these tables: exact where cheap.

    On at most :data:`~opdvfs.plan.dp.EXACT_CELLS` stage-clock cells the optimum itself
    (``tol=0``: the exact Pareto programme closes any gap the multiplier search leaves);
    beyond, the solver's defaults (a certified gap of at most 0.01%). Within that gap, plans
    on profiles of every clock they may use were up to 0.0023% above the exact optimum on the
    same measurements (the GTX 980's 30 kernels at 6 clocks at 2%, the V100's 138
    micro-benchmarks at 10 clocks; ``benchmarks/few_clock_plans.py``): the models must add, not
    cost. The price there: up to 35 ms more per plan on 80 of its 81 plans, 0.02 -> 0.9 s CPU
    on the V100's at 10% (the exact programme's front reaches 34k states).
    """
    n_stages, n_clocks = tables.shape
    # (dp.solve closes the gap with its exact programme at this size by default)
    return {"tol": 0.0} if n_stages * n_clocks <= EXACT_CELLS else {}


def _noise_slack_s(problem: StageProblem, inputs: PlanInputs) -> float:
    """Return the slack (s) a plan on cells each measured once leaves for its sum's noise.

    :data:`MEASURED_SUM_Z` standard deviations of the noise of the ops' summed times, from the
    noise of one measurement pooled over the profile
    (:attr:`~opdvfs.plan.measured.MeasuredTables.pooled_time_noise`); 0 where unknown.
    """
    measured = inputs.measured
    if measured is None or not measured.pooled_time_noise:
        return 0.0
    top_us = problem.time_us[:, -1]
    return MEASURED_SUM_Z * measured.pooled_time_noise * float(np.sqrt(np.sum(top_us**2))) * 1e-6


def _per_op(problem: StageProblem, stage_clock: np.ndarray) -> np.ndarray:
    """Return each op's clock column from a plan's clock per stage."""
    n_ops = len(problem.time_us)
    return np.repeat(np.asarray(stage_clock), np.diff(np.r_[problem.starts, n_ops]))


def _upper_quantile(values: np.ndarray, margin: np.ndarray | None) -> np.ndarray:
    """Return each cell's upper quantile (time or energy): ``values exp(margin)``."""
    if margin is None:
        return values
    return values * np.exp(margin)


#: Ops per block of :func:`_conservative_stage_tables` (whole stages: a block ends on a stage).
_STAGE_BLOCK_OPS = 1 << 17


def _conservative_stage_tables(
    time_us: np.ndarray,
    time_margin: np.ndarray | None,
    energy_j: np.ndarray,
    energy_margin: np.ndarray | None,
    starts: np.ndarray,
) -> StageTables:
    """:func:`stage_tables` of the cells' upper quantiles (:func:`_upper_quantile`).

    A block of whole stages at a time: the two (ops x clocks) tables of upper quantiles were
    the planner's peak (144 MB at 1M ops x 9 clocks). Each stage's sum is the same, being
    summed over the same rows in the same order.
    """
    starts = np.asarray(starts, dtype=int)
    n_ops = len(time_us)
    if n_ops <= _STAGE_BLOCK_OPS or not len(starts):
        return stage_tables(
            _upper_quantile(time_us, time_margin), _upper_quantile(energy_j, energy_margin), starts
        )
    cuts = np.unique(np.r_[np.searchsorted(starts, np.arange(0, n_ops, _STAGE_BLOCK_OPS)), 0])
    cuts = np.r_[cuts[cuts < len(starts)], len(starts)]
    parts = []
    for a, b in itertools.pairwise(cuts):
        rows = slice(starts[a], starts[b] if b < len(starts) else n_ops)
        time_m = None if time_margin is None else time_margin[rows]
        energy_m = None if energy_margin is None else energy_margin[rows]
        parts.append(
            stage_tables(
                _upper_quantile(time_us[rows], time_m),
                _upper_quantile(energy_j[rows], energy_m),
                starts[a:b] - starts[a],
            )
        )
    return StageTables(
        time_s=np.concatenate([p.time_s for p in parts]),
        energy_j=np.concatenate([p.energy_j for p in parts]),
    )


def _margin_s(problem: StageProblem, stage_clock: np.ndarray) -> float:
    """Return how much longer (s) the plan is on the conservative times than on the point ones."""
    if problem.time_margin is None:
        return 0.0
    ops, per_op = np.arange(len(problem.time_us)), _per_op(problem, stage_clock)
    point = problem.time_us[ops, per_op]
    return float((_upper_quantile(point, problem.time_margin[ops, per_op]) - point).sum() * 1e-6)


def _model_share(problem: StageProblem, stage_clock: np.ndarray) -> float | None:
    """Return the share of the plan's predicted op time on model-filled cells (0-1)."""
    if problem.model_filled is None:
        return None
    ops, per_op = np.arange(len(problem.time_us)), _per_op(problem, stage_clock)
    point = problem.time_us[ops, per_op]
    total = float(point.sum())
    return float(point[problem.model_filled[ops, per_op]].sum()) / total if total > 0 else 0.0


def _schedule(
    names: np.ndarray,
    op_tables: _OpTables,
    stage_starts: np.ndarray,
    stage_clock: np.ndarray,
    inputs: PlanInputs,
    *,
    predictive: bool,
    switch_latency_ms: float,
    baseline_time_s: float,
    predicted_time_s: float,
    started: float,
    **fields: object,
) -> Schedule:
    """Build the Schedule of a plan (a clock per stage) with its switch leads and predictions.

    Neighbouring stages at one clock become one schedule stage. Leads are measured in the
    planned run's own op times (ops before a switch run at their own clock); energies are the
    ops' at the planned and at the top clock, on the values planned on and, where the profile
    measured them, on its measurements.
    """
    freqs, time_us, chip_j, core_j = op_tables
    ops = np.arange(len(time_us))
    per_op = np.repeat(stage_clock, np.diff(np.r_[stage_starts, len(time_us)]))
    starts = np.flatnonzero(np.r_[True, per_op[1:] != per_op[:-1]])
    planned_us = time_us[ops, per_op] + inputs.idle_before_us
    lead, delay = _lead_ops(starts, planned_us, switch_latency_ms * 1e3)
    if not predictive:
        lead, delay = np.zeros_like(lead), np.zeros_like(delay)
    top = len(freqs) - 1
    return Schedule.from_stage_freqs(
        starts,
        freqs[per_op[starts]],
        n_ops=len(names),
        lead_ops=lead,
        delay_us=delay,
        # each stage's start in the planned run: the time-anchored executor's offsets
        start_s=(np.cumsum(planned_us) - planned_us)[starts] * 1e-6,
        switch_latency_ms=switch_latency_ms,
        device=inputs.device,
        workload=inputs.workload,
        op_signature=op_signature(names.tolist()),
        baseline_time_s=baseline_time_s,
        predicted_time_s=predicted_time_s,
        baseline_energy_j=float(chip_j[:, top].sum()),
        predicted_energy_j=float(chip_j[ops, per_op].sum()),
        baseline_core_energy_j=_finite_sum(core_j[:, top]),
        predicted_core_energy_j=_finite_sum(core_j[ops, per_op]),
        **_on_measurements(inputs, freqs, per_op),
        plan_seconds=_time.perf_counter() - started,
        **fields,
    )


def _finite_sum(values: np.ndarray) -> float | None:
    """Sum of ``values``, or None when any is unknown (NaN: neither measured nor modelled)."""
    return float(values.sum()) if np.isfinite(values).all() else None


def _on_measurements(inputs: PlanInputs, freqs: np.ndarray, per_op: np.ndarray) -> dict:
    """Return the plan's and the top clock's time and energy on the profile's measurements.

    Only where the profile measured every op at its planned clock and at the top clock (the
    ``measured_*`` fields of :class:`Schedule`); idle time counts as in the prediction. On the
    raw medians (:meth:`~opdvfs.plan.measured.MeasuredTables.raw`), not on the cells smoothed
    across clocks that the plan chose among: measured means measured.
    """
    if inputs.measured is None:
        return {}
    raw = inputs.measured.raw()
    cols = raw.columns(freqs)  # each clock's column in the measured tables, -1: not profiled
    ops, top = np.arange(len(per_op)), np.full(len(per_op), len(freqs) - 1)

    def cells(table: np.ndarray, clock: np.ndarray) -> np.ndarray:
        """Each op's measured cell at its clock (an index into ``freqs``); NaN: not profiled."""
        col = cols[clock]
        return np.where(col >= 0, table[ops, np.maximum(col, 0)], np.nan)

    idle_s = float(inputs.idle_before_us.sum() * 1e-6)
    fields = {}
    for name, table, unit, extra in (
        ("time_s", raw.time_us, 1e-6, idle_s),
        ("energy_j", raw.chip_energy_j, 1.0, 0.0),
        ("core_energy_j", raw.core_energy_j, 1.0, 0.0),
    ):
        # the op's cells only, not the (ops x clocks) tables at every clock
        base, plan = _finite_sum(cells(table, top)), _finite_sum(cells(table, per_op))
        if base is not None and plan is not None:
            fields[f"measured_baseline_{name}"] = base * unit + extra
            fields[f"measured_{name}"] = plan * unit + extra
    return fields


def _op_tables(
    models: Planned, inputs: PlanInputs, values: Values = "auto"
) -> tuple[np.ndarray, _OpTables, _Uncertainty]:
    """Op names, and clocks (ascending) with per-op time (us), chip and core energy (J) at each.

    Measurements first (:mod:`opdvfs.plan.measured`): with ``auto`` the measured medians where
    the profile has them and the models, corrected through them, elsewhere (no model is needed
    when every op was measured at every clock); ``measured`` only the measurements; ``model``
    only the models. With ``auto`` and a power model whose leakage slope was measured, all on
    the top clock's die (:func:`_die_mhz`; measured cells moved there by the model's temperature
    term, :func:`at_die`). Core energy is NaN where nothing gives it.

    Also each cell's time uncertainty and whether the models filled it (:data:`_Uncertainty`):
    a measured cell's own noise, a filled cell's from :func:`log_uncertainty`; (None, None)
    without measurements.
    """
    if isinstance(models, Predictions):
        return _predicted(models, inputs, values)
    measured = None if values == "model" else inputs.measured
    if values == "measured" and measured is None:
        raise ValidationError(
            "values 'measured' plans on a profile's measurements, and these inputs have none "
            "(they come from a workload or a MODELS file)",
            field="values",
        )
    n_ops = len(models.perf.names_) if models is not None else None
    if n_ops is None and measured is not None:
        n_ops = len(measured.op_ids)
    if n_ops is None:
        raise ValidationError("no models and no measurements to plan on", field="models")
    if len(inputs.streams) != n_ops:
        raise ValidationError(
            f"the plan inputs (workload {inputs.workload!r}) have {len(inputs.streams)} ops but "
            f"the {'models' if models is not None else 'measurements'} {n_ops}",
            field="streams",
        )
    freqs = np.sort(np.asarray(inputs.freqs_mhz, dtype=float))
    names = models.perf.names_ if models is not None else None
    if measured is not None:
        if len(measured.op_ids) != n_ops:
            raise ValidationError(
                f"the profile measured {len(measured.op_ids)} ops but the models hold {n_ops}",
                field="op",
            )
        names = measured.names if names is None else names
        # every op's time and chip energy measured at every clock: checked on the profiled
        # columns, not on (ops x clocks) copies that the model path would drop (~210 MB and
        # ~0.3 s at 1M ops x 9 clocks, 3 of them profiled)
        complete = measured.covers(freqs)
        no_power = models is None or models.power is None
        if values == "measured" or complete or no_power:
            time_m, chip_m, core_m = measured.at(freqs)
            if values == "measured" or (complete and (no_power or np.isfinite(core_m).all())):
                for table, what in ((time_m, "time"), (chip_m, "energy")):
                    gap = missing_measurement(measured, table, freqs, what)
                    if gap is not None:
                        raise gap
                if values == "auto" and _die_mhz(models, freqs) is not None:
                    assert models is not None
                    assert models.power is not None
                    # every cell measured, each on its own clock's die: moved to the top clock's
                    die_c = models.power.predict(freqs[-1:], time_us=time_m[:, -1:])["temp_c"]
                    temp_m = measured.temp_at(freqs)
                    chip_m = at_die(models.power, freqs, time_m, chip_m, temp_m, die_c, rail="chip")
                    core_m = at_die(models.power, freqs, time_m, core_m, temp_m, die_c, rail="core")
                sigma = _measured_margin(measured, freqs, time_m)
                filled = np.zeros(time_m.shape, bool)
                return names, (freqs, time_m, chip_m, core_m), (sigma, filled, None)
            if no_power:
                gap = missing_measurement(measured, time_m, freqs, "time")
                gap = gap or missing_measurement(measured, chip_m, freqs, "energy")
                if gap is not None and models is None:
                    raise gap
            del time_m, chip_m, core_m  # the model path takes the grid's own (~210 MB at 1M ops)
    if models is None or models.power is None:
        raise ValidationError(
            "the models hold no power model: profile with power to plan energy", field="power"
        )
    assert names is not None
    grid = freqs if measured is None else np.union1d(freqs, measured.freqs_mhz)
    # The power model's temperature fixed point takes a dot product over all ops per step:
    # OpenBLAS splits one that long across threads, and waking them on a busy machine costs
    # milliseconds per product where one thread takes microseconds (6x the gpt3 plan).
    # The die runs at the top clock's temperature: a plan within a small budget keeps most of
    # the iteration there, and the ops it slows leak at that temperature, not at the cooler
    # one of a static run at their clock (eqs. 11, 15; benchmarks/thermal_bias.py).
    with threadpool_limits(limits=1, user_api="blas"):
        time_us = models.perf.predict(grid)
        die_mhz = _die_mhz(models, freqs)
        power = models.power.predict(grid, time_us=time_us, die_at_mhz=die_mhz)
    # in place, in the same order as power * time * 1e-6: at 1M ops x 9 clocks each
    # (ops x clocks) table is 72 MB, and these are the planner's largest
    chip_j, core_j = power["chip_w"], power["core_w"]
    for energy in (chip_j, core_j):
        energy *= time_us
        energy *= 1e-6
    # the die's temperature, where it moves the measured cells (72 MB not held otherwise)
    grid_die_c = power["temp_c"] if measured is not None and die_mhz is not None else None
    del power
    if measured is not None:
        # the core energies are picked when they correct the model's (72 MB less held until
        # then at 1M ops x 9 clocks), unless they move to the top clock's die with the others
        time_g, chip_g = measured.time_at(grid), measured.chip_at(grid)
        core_g = None if die_mhz is None else measured.core_at(grid)
        if die_mhz is not None:
            # measured at each clock's own die: moved to the plan's before they correct the models
            temp_g = measured.temp_at(grid)
            assert core_g is not None
            assert grid_die_c is not None
            chip_g = at_die(models.power, grid, time_g, chip_g, temp_g, grid_die_c, rail="chip")
            core_g = at_die(models.power, grid, time_g, core_g, temp_g, grid_die_c, rail="core")
            del temp_g
        del grid_die_c
        filled_g = ~np.isfinite(time_g)
        # no noise measured: None, not a table of zeros (72 MB at 1M ops x 9 clocks)
        time_noise = None if measured.time_noise_us is None else measured.time_noise_at(grid)
        sigma_g = log_uncertainty(grid, time_us, time_g, time_noise)
        del time_noise
        # the margin, in place
        np.multiply(sigma_g, TIME_QUANTILE_Z, out=sigma_g, where=filled_g)
        np.multiply(sigma_g, MEASURED_NOISE_Z, out=sigma_g, where=~filled_g)
        # each table corrected once its uncertainty is known, its measurements then dropped
        # (72 MB apiece at 1M ops x 9 clocks)
        time_us = correct_to_measurements(grid, time_us, time_g, out=time_us)
        del time_g
        chip_noise = None if measured.chip_noise_j is None else measured.noise_at(grid, rail="chip")
        e_sigma_g = log_uncertainty(grid, chip_j, chip_g, chip_noise)
        del chip_noise
        e_sigma_g[~filled_g] = 0.0  # measured energies: as measured
        e_sigma_g *= TIME_QUANTILE_Z
        chip_j = correct_to_measurements(grid, chip_j, chip_g, out=chip_j)
        del chip_g
        core_g = measured.core_at(grid) if core_g is None else core_g
        core_j = correct_to_measurements(grid, core_j, core_g, out=core_j)
        del core_g
        cols = np.searchsorted(grid, freqs)
        if not np.array_equal(cols, np.arange(len(grid))):  # else the grid is the clocks
            time_us, chip_j, core_j = time_us[:, cols], chip_j[:, cols], core_j[:, cols]
            sigma_g, filled_g, e_sigma_g = sigma_g[:, cols], filled_g[:, cols], e_sigma_g[:, cols]
        sigma_g[:, -1] = 0.0  # the baseline: the budget is relative to it
        e_sigma_g[:, -1] = 0.0
        return names, (freqs, time_us, chip_j, core_j), (sigma_g, filled_g, e_sigma_g)
    return names, (freqs, time_us, chip_j, core_j), (None, None, None)


def _measured_margin(
    measured: MeasuredTables, freqs: np.ndarray, time_us: np.ndarray
) -> np.ndarray | None:
    """Return each measured cell's time margin (log; the top clock's 0); None if unknown."""
    if measured.time_noise_us is None:
        return None
    margin = MEASURED_NOISE_Z * measured.time_noise_at(freqs) / time_us
    margin[:, -1] = 0.0  # the baseline: the budget is relative to it
    return margin


def _die_mhz(models: ModelBundle | None, freqs: np.ndarray) -> float | None:
    """Return the clock whose die the tables are on: the top one, if the leakage was measured.

    Only a ``gamma`` from a cool-down trace (``gamma_from_ == "cooldown"``) moves power between
    dies: one fitted on static profiles is not identified (their temperature follows the clock)
    and would move the measured cells by an arbitrary amount. None: each clock on its own die.
    """
    power = models.power if models is not None else None
    if power is None or power.gamma_from_ != "cooldown":
        return None
    return float(freqs[-1])


def _predicted(
    predictions: Predictions, inputs: PlanInputs, values: Values
) -> tuple[np.ndarray, _OpTables, _Uncertainty]:
    """Return the tables of :func:`predict`, checked against the inputs and values asked for."""
    if predictions.values != values:
        raise ValidationError(
            f"the predictions were made for values {predictions.values!r}, not {values!r}: "
            "predict again with the values to plan on",
            field="values",
        )
    freqs = np.sort(np.asarray(inputs.freqs_mhz, dtype=float))
    if len(inputs.streams) != len(predictions.names) or not np.array_equal(
        freqs, predictions.freqs_mhz
    ):
        raise ValidationError(
            f"the predictions cover {len(predictions.names)} ops at "
            f"{predictions.freqs_mhz.tolist()} MHz, the inputs {len(inputs.streams)} ops at "
            f"{freqs.tolist()} MHz: predict again with these inputs",
            field="freqs_mhz",
        )
    p = predictions
    tables = (p.freqs_mhz, p.time_us, p.chip_energy_j, p.core_energy_j)
    return p.names, tables, (p.time_margin, p.model_filled, p.energy_margin)


def stage_problem(
    models: Planned,
    inputs: PlanInputs,
    *,
    objective: Objective = "energy",
    interval_ms: float = 5.0,
    values: Values = "auto",
    conservative: bool = True,
) -> StageProblem:
    """Build the planning problem: per-op tables, classes, stages and the stage tables.

    This is the planner's preprocessing (paper §6.3): take every op's time and energy at every
    clock (measurements first, the models filling in; ``values``), classify the ops (by
    ``inputs.classes`` or the sensitivity of their time to the clock), merge them into stages
    of at least ``interval_ms``, and sum the tables per stage. The classes only decide which
    neighbours merge; ``interval_ms=0`` keeps one stage per operator. A solver from
    :mod:`opdvfs.plan.dp` then picks a clock per stage.

    Parameters
    ----------
    models
        Fitted time and power models of the ops (a power model is required), their
        :func:`predict` for these inputs, or None when ``inputs`` measured every op at every
        clock.
    inputs
        The device's clocks and the op sequence.
    objective
        Selects the stage tables' energy rail: core energy for ``core-energy``, chip energy
        otherwise.
    interval_ms
        Frequency-adjustment interval (ms): the shortest stage the segmentation keeps; 0 plans
        one stage per operator.
    values
        ``auto``, ``measured`` or ``model``: see :func:`plan_schedule`.
    conservative
        Whether the stage tables hold the cells' conservative times and energies (True) or
        their point values (False; ``time_margin`` and ``energy_margin`` are then None): see
        :func:`plan_schedule`.

    Raises
    ------
    ValidationError
        If nothing gives an op's time or energy at a clock (no power model, or an unmeasured
        cell with ``values="measured"``), the core rail is unknown for ``core-energy``, or the
        inputs and the models count different ops.
    """
    names, (freqs, time_us, chip_j, core_j), (sigma, filled, e_sigma) = _op_tables(
        models, inputs, values
    )
    if not conservative:  # the point values: whether the models filled a cell still counts
        sigma = e_sigma = None
    if objective == "core-energy" and not np.isfinite(core_j).all():
        gap = None
        if inputs.measured is not None and np.isfinite(core_j).any():
            gap = missing_measurement(inputs.measured, core_j, freqs, "core energy")
        raise gap or ValidationError(
            "core energy is neither measured (core_power_w) nor modelled: the profile has "
            "board (chip) power only, as a GPU's sensor gives; plan --objective energy",
            field="core_power_w",
        )
    top = len(freqs) - 1
    if inputs.classes is not None:
        classes = inputs.classes
    else:
        sens = sensitivity(time_us[:, 0], time_us[:, top], freqs[0], freqs[top])
        classes = classify_by_sensitivity(sens, inputs.streams)
    if interval_ms > 0:
        starts, stage_class = segment(
            classes, time_us[:, top] + inputs.idle_before_us, interval_us=interval_ms * 1e3
        )
    else:
        starts, stage_class = np.arange(len(time_us)), np.asarray(classes)
    # the budget is met on each cell's conservative time (its margin above), and
    # a model-filled cell's energy is taken at its upper quantile too
    energy = core_j if objective == "core-energy" else chip_j
    tables = _conservative_stage_tables(time_us, sigma, energy, e_sigma, starts)
    return StageProblem(
        freqs, time_us, chip_j, core_j, starts, stage_class, tables, names, sigma, filled, e_sigma
    )


def plan_frontier(
    models: Planned,
    inputs: PlanInputs,
    *,
    objective: Objective = "energy",
    interval_ms: float = 5.0,
    values: Values = "auto",
    max_cells: int = 4000,
) -> pd.DataFrame:
    """Return the time-energy frontier of per-stage plans, one row per Pareto-optimal plan.

    For a problem of at most ``max_cells`` stage-clock cells it is the exact frontier
    (:func:`~opdvfs.plan.dp.exact_frontier`): every plan that no other plan beats in both
    time and energy, so for any budget the least energy within it is the slowest row that
    fits. Beyond that (or if the staircase grows too large) it is the lower convex hull a
    sweep of the multiplier reaches; every hull row is still optimal for its own time.

    Parameters
    ----------
    models
        Fitted time and power models of the ops (a power model is required), their
        :func:`predict` for these inputs, or None when ``inputs`` measured every op at every
        clock.
    inputs
        The device's clocks and the op sequence.
    objective
        The energy rail of the frontier: core energy for ``core-energy``, chip energy
        otherwise.
    interval_ms
        Frequency-adjustment interval (ms): the shortest stage the segmentation keeps; 0 plans
        one stage per operator.
    values
        ``auto``, ``measured`` or ``model``: see :func:`plan_schedule`.
    max_cells
        Largest stages x clocks for which the exact staircase is computed.

    Returns
    -------
    pandas.DataFrame
        ``slowdown_pct`` and ``saving_pct`` against the all-top-clock plan (percent),
        ``time_s`` (operator time plus idle time) and ``energy_j`` (operators only, on the
        objective's rail) per iteration, and ``lambda`` (W), the price of time that selects
        the plan (NaN for a staircase row off the convex hull); ascending in time.
    """
    problem = stage_problem(
        models, inputs, objective=objective, interval_ms=interval_ms, values=values
    )
    idle_s = float(inputs.idle_before_us.sum() * 1e-6)
    top = len(problem.freqs_mhz) - 1
    base_time_s = float(problem.tables.time_s[:, top].sum()) + idle_s
    base_energy_j = float(problem.tables.energy_j[:, top].sum())
    points = frontier(problem.tables)
    n_stages, n_clocks = problem.tables.shape
    staircase = exact_frontier(problem.tables) if n_stages * n_clocks <= max_cells else None
    if staircase is not None:
        rows = staircase[1]
        # the multiplier of a staircase row that is also a hull vertex (NaN for the others)
        same = np.isclose(rows[:, None, 0], points[None, :, 0], rtol=1e-12, atol=0.0)
        same &= np.isclose(rows[:, None, 1], points[None, :, 1], rtol=1e-12, atol=0.0)
        lams = np.where(same.any(axis=1), points[same.argmax(axis=1), 2], np.nan)
        points = np.column_stack([rows, lams])
    time_s = points[:, 0] + idle_s
    return pd.DataFrame(
        {
            "slowdown_pct": (time_s / base_time_s - 1) * 100,
            "saving_pct": (1 - points[:, 1] / base_energy_j) * 100,
            "time_s": time_s,
            "energy_j": points[:, 1],
            "lambda": points[:, 2],
        }
    )


def _lead_ops(
    starts: np.ndarray, duration_us: np.ndarray, latency_us: float
) -> tuple[np.ndarray, np.ndarray]:
    """Trigger of each stage's switch (ops before its start) and the delay after it (us).

    The switch is issued ``latency_us`` before its stage begins in the planned run: from the
    last op boundary before that moment, after a delay, so it lands on time even when the
    moment falls inside a long op (a bubble's ``Recv``, a long matmul). A stage that begins
    less than ``latency_us`` into the iteration is triggered in the previous iteration (a lead
    beyond its first op; training repeats its iterations).
    """
    n = len(duration_us)
    begin = np.r_[0.0, np.cumsum(duration_us)[:-1]]  # op start times in the planned run
    total = float(np.sum(duration_us))
    want = begin[starts] - latency_us
    back = want < 0
    want = np.maximum(np.where(back, want + total, want), 0.0)
    trigger = np.searchsorted(begin, want, side="right") - 1
    trigger = np.where(back, trigger, np.minimum(trigger, starts))
    lead = np.where(back, starts + n - trigger, starts - trigger)
    return lead, want - begin[trigger]


def plan_grouped(
    models: Planned,
    inputs: PlanInputs,
    groups: np.ndarray | None,
    *,
    target: float,
    objective: Objective = "energy",
    switch_latency_ms: float = 1.0,
    values: Values = "auto",
) -> Schedule:
    """Best plan that runs every op of a group at one clock: the coarse baselines.

    Every combination of clocks is evaluated at once (``n_clocks ** n_groups`` of them, so a
    handful of groups), which makes the answer exact for the models. Switches are dispatched
    predictively.

    Parameters
    ----------
    models
        Fitted time and power models of the ops (a power model is required), their
        :func:`predict` for these inputs, or None when ``inputs`` measured every op at every
        clock.
    inputs
        The device's clocks and the op sequence.
    groups
        A group label per op, shape (n_ops,), at most 4 distinct labels; ``inputs.phases``
        gives the per-phase plan (one clock for all forward ops, one for backward, one for the
        optimizer). None: one static clock for the whole iteration.
    target
        Allowed slowdown as a fraction of the all-top-clock iteration time (0.02 = 2% slower).
    objective
        The energy rail minimised: core energy for ``core-energy``, chip energy otherwise.
    switch_latency_ms
        Time from issuing a clock switch to its taking effect (ms).
    values
        ``auto``, ``measured`` or ``model``: see :func:`plan_schedule`.

    Returns
    -------
    Schedule
        The best plan (solver ``static`` or ``per-group``), without a certificate.

    Raises
    ------
    ValidationError
        If there are more than 4 groups, the models hold no power model, or the inputs and the
        models count different ops.
    """
    started = _time.perf_counter()
    names, op_tables, _ = _op_tables(models, inputs, values)
    _, time_us, chip_j, core_j = op_tables
    energy = core_j if objective == "core-energy" else chip_j
    n_ops, n_clocks = time_us.shape
    labels, member = np.unique(
        np.zeros(n_ops, dtype=int) if groups is None else np.asarray(groups), return_inverse=True
    )
    if len(labels) > 4:
        raise ValidationError(
            f"{len(labels)} groups: plan_grouped enumerates clocks^groups, keep <= 4",
            field="groups",
        )
    group_t = np.zeros((len(labels), n_clocks))
    group_e = np.zeros((len(labels), n_clocks))
    np.add.at(group_t, member, time_us)
    np.add.at(group_e, member, energy)
    # every combination of one clock per group: (n_clocks ** n_groups, n_groups)
    combos = np.stack(
        np.meshgrid(*[np.arange(n_clocks)] * len(labels), indexing="ij"), axis=-1
    ).reshape(-1, len(labels))
    rows = np.arange(len(labels))
    idle_s = float(inputs.idle_before_us.sum() * 1e-6)
    top = n_clocks - 1
    total_t = group_t[rows, combos].sum(axis=1) * 1e-6
    total_e = group_e[rows, combos].sum(axis=1)
    baseline_s = float(group_t[:, top].sum()) * 1e-6 + idle_s
    fits = total_t + idle_s <= (1.0 + target) * baseline_s * (1 + 1e-12)
    best = int(np.flatnonzero(fits)[np.argmin(total_e[fits])])  # all-top always fits
    per_op = combos[best][member]
    starts = np.flatnonzero(np.r_[True, per_op[1:] != per_op[:-1]])
    return _schedule(
        names,
        op_tables,
        starts,
        per_op[starts],
        inputs,
        predictive=True,
        switch_latency_ms=switch_latency_ms,
        baseline_time_s=baseline_s,
        predicted_time_s=float(total_t[best]) + idle_s,
        started=started,
        target=target,
        objective=objective,
        solver="static" if groups is None else "per-group",
        values=values,
    )
