"""From fitted models to a ``Schedule``: tables per op, stages, the exact solver, dispatch leads.

``plan_schedule`` predicts every operator's time and energy at every device clock from the
models, classifies and segments the sequence (the paper's preprocessing), sums the tables per
stage, solves for the clocks within ``(1 + target)`` of the all-top-clock time, and places each
switch's trigger ``switch_latency`` ahead of its stage when dispatch is predictive.

Objectives: ``energy`` (chip, default) and ``core-energy`` (exact, certified), ``power`` (mean chip
power, Dinkelbach), ``paper`` (eq. 17's score, best frontier plan; the GA searches with it too).
Energies in the schedule are operator energies (idle gaps cost the same at every clock);
``lower_bound_energy_j`` and ``gap_pct`` are on the objective's rail. The latency
a reactive dispatch cannot hide is charged: the stage's first ``switch_latency`` at the
previous clock (``StageTables.lag_s``).
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pandas as pd

from opdvfs.models.bundle import ModelBundle
from opdvfs.plan.classify import classify_by_sensitivity, sensitivity
from opdvfs.plan.dp import (
    StageTables,
    frontier,
    frontier_plans,
    solve,
    solve_min_power,
    stage_tables,
)
from opdvfs.plan.ga import genetic_plan
from opdvfs.plan.segment import segment
from opdvfs.schedule import Schedule, op_signature
from opdvfs.workloads.workload import Workload

__all__ = ["PlanInputs", "plan_frontier", "plan_grouped", "plan_schedule"]

Objective = Literal["energy", "core-energy", "power", "paper"]


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs besides the models: the device's clocks and the op sequence."""

    freqs_mhz: np.ndarray
    streams: np.ndarray
    gap_us: np.ndarray
    device: str | None = None
    workload: str | None = None
    #: LOW/HIGH per op from the profiler's pipeline ratios (paper Fig. 12), when it gives them;
    #: otherwise the fitted sensitivity decides.
    classes: np.ndarray | None = None
    #: Training phase per op (forward / backward / optimizer / other), for per-phase plans.
    phases: np.ndarray | None = None

    @classmethod
    def from_workload(
        cls, workload: Workload, freqs_mhz: Sequence[float], *, device: str | None = None
    ) -> PlanInputs:
        """Streams and idle gaps from a workload, planned over ``freqs_mhz``."""
        ops = workload.ops
        return cls(
            np.asarray(freqs_mhz, dtype=float),
            ops["stream"].to_numpy(),
            ops["gap_before_us"].to_numpy(dtype=float),
            device=device,
            workload=workload.name,
            phases=ops["phase"].to_numpy(),
        )


def plan_schedule(
    models: ModelBundle,
    inputs: PlanInputs,
    *,
    target: float,
    objective: Objective = "energy",
    interval_ms: float = 5.0,
    switch_latency_ms: float = 1.0,
    dispatch: Literal["predictive", "reactive"] = "predictive",
    solver: Literal["dp", "ga"] = "dp",
    seed: int = 0,
) -> Schedule:
    """Plan per-stage clocks that minimise energy within ``(1 + target)`` x the top-clock time.

    Raises
    ------
    ValueError
        If the models hold no power model (energy cannot be planned from time alone).
    """
    started = _time.perf_counter()
    st = _stages(models, inputs, objective, interval_ms)
    freqs, time_us, starts, tables = st.freqs, st.time_us, st.starts, st.tables
    if dispatch == "reactive":
        # a switch issued when its stage starts lands switch_latency later: the DP charges the
        # stage's first switch_latency at the previous clock
        tables = replace(tables, lag_s=switch_latency_ms * 1e-3)
    chip_j, core_j, stage_class = st.chip_j, st.core_j, st.stage_class
    top = len(freqs) - 1
    # Idle gaps take the same time at every clock: they enter the budget, not the choice.
    gaps_s = float(inputs.gap_us.sum() * 1e-6)
    baseline_s = float(tables.time_s[:, top].sum()) + gaps_s
    budget = (1.0 + target) * baseline_s - gaps_s
    lower: float | None
    lower_w: float | None = None
    gap: float | None
    if solver == "ga":
        found = genetic_plan(tables, budget, stage_class, rng=np.random.default_rng(seed))
        clock, plan_time, lower, gap = found.clock, found.time_s, None, None
    elif objective == "paper":
        # eq. 17 on the frontier: the feasible plan with the best 2 Per^2 / Power, i.e. the
        # least E * T (no certificate: the score is not an energy)
        plans, points = frontier_plans(tables)
        fits = points[:, 0] <= budget * (1 + 1e-12)
        if not fits.any():
            raise ValueError(f"no plan fits a {target:.1%} slowdown")
        j = int(np.flatnonzero(fits)[np.argmin((points[:, 0] * points[:, 1])[fits])])
        clock, plan_time, lower, gap = plans[j], float(points[j, 0]), None, None
    else:
        result = solve_min_power(tables, budget) if objective == "power" else solve(tables, budget)
        if result.status == "infeasible":
            raise ValueError(f"no plan fits a {target:.1%} slowdown")
        clock, plan_time = result.clock, result.time_s
        lower, lower_w, gap = result.lower_bound_j, result.lower_bound_power_w, result.gap_pct
    return _schedule(
        models,
        inputs,
        starts,
        clock,
        (freqs, time_us, chip_j, core_j),
        predictive=dispatch == "predictive",
        switch_latency_ms=switch_latency_ms,
        baseline_time_s=baseline_s,
        predicted_time_s=plan_time + gaps_s,
        started=started,
        target=target,
        objective=objective,
        solver=solver,
        dispatch=dispatch,
        interval_ms=interval_ms,
        lower_bound_energy_j=lower,
        lower_bound_power_w=lower_w,
        gap_pct=gap,
    )


def _schedule(
    models: ModelBundle,
    inputs: PlanInputs,
    starts: np.ndarray,
    stage_clock: np.ndarray,
    op_tables: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    predictive: bool,
    switch_latency_ms: float,
    baseline_time_s: float,
    predicted_time_s: float,
    started: float,
    **fields: object,
) -> Schedule:
    """Build the Schedule of a plan (a clock per stage) with its switch leads and predictions.

    Leads are measured in the planned run's own op times (ops before a switch run at their own
    clock); energies are the ops' at the planned and at the top clock.
    """
    freqs, time_us, chip_j, core_j = op_tables
    ops = np.arange(len(time_us))
    per_op = np.repeat(stage_clock, np.diff(np.r_[starts, len(time_us)]))
    planned_us = time_us[ops, per_op] + inputs.gap_us
    lead, delay = _lead_ops(starts, planned_us, switch_latency_ms * 1e3)
    if not predictive:
        lead, delay = np.zeros_like(lead), np.zeros_like(delay)
    top = len(freqs) - 1
    names = models.perf.names_.tolist()
    return Schedule.from_stage_freqs(
        starts,
        freqs[stage_clock],
        n_ops=len(names),
        lead_ops=lead,
        delay_us=delay,
        switch_latency_ms=switch_latency_ms,
        device=inputs.device,
        workload=inputs.workload,
        op_signature=op_signature(names),
        baseline_time_s=baseline_time_s,
        predicted_time_s=predicted_time_s,
        baseline_energy_j=float(chip_j[:, top].sum()),
        predicted_energy_j=float(chip_j[ops, per_op].sum()),
        baseline_core_energy_j=float(core_j[:, top].sum()),
        predicted_core_energy_j=float(core_j[ops, per_op].sum()),
        plan_seconds=_time.perf_counter() - started,
        **fields,
    )


@dataclass(frozen=True)
class _Staged:
    freqs: np.ndarray
    time_us: np.ndarray
    chip_j: np.ndarray
    core_j: np.ndarray
    starts: np.ndarray
    stage_class: np.ndarray
    tables: StageTables


def _op_tables(
    models: ModelBundle, inputs: PlanInputs
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Clocks (ascending) and per-op predicted time (us), chip and core energy (J) at each."""
    if models.power is None:
        raise ValueError("the models hold no power model: profile with power to plan energy")
    freqs = np.sort(np.asarray(inputs.freqs_mhz, dtype=float))
    time_us = models.perf.predict(freqs)
    power = models.power.predict(freqs, time_us=time_us)
    return freqs, time_us, power["chip_w"] * time_us * 1e-6, power["core_w"] * time_us * 1e-6


def _stages(models: ModelBundle, inputs: PlanInputs, objective: str, interval_ms: float) -> _Staged:
    """Per-op tables at the device clocks, the classes, the stages and the stage tables."""
    freqs, time_us, chip_j, core_j = _op_tables(models, inputs)
    top = len(freqs) - 1
    if inputs.classes is not None:
        classes = inputs.classes
    else:
        sens = sensitivity(time_us[:, 0], time_us[:, top], freqs[0], freqs[top])
        classes = classify_by_sensitivity(sens, inputs.streams)
    starts, stage_class = segment(
        classes, time_us[:, top] + inputs.gap_us, interval_us=interval_ms * 1e3
    )
    tables = stage_tables(time_us, core_j if objective == "core-energy" else chip_j, starts)
    return _Staged(freqs, time_us, chip_j, core_j, starts, stage_class, tables)


def plan_frontier(
    models: ModelBundle,
    inputs: PlanInputs,
    *,
    objective: Objective = "energy",
    interval_ms: float = 5.0,
) -> pd.DataFrame:
    """Return the whole time-energy frontier of per-stage plans, one row per reachable plan.

    Columns: ``slowdown_pct`` and ``saving_pct`` against the all-top-clock plan, ``time_s`` and
    ``energy_j`` (operator time with idle gaps; energy on the objective's rail) and ``lambda``.
    """
    st = _stages(models, inputs, objective, interval_ms)
    gaps_s = float(inputs.gap_us.sum() * 1e-6)
    top = len(st.freqs) - 1
    base_t = float(st.tables.time_s[:, top].sum()) + gaps_s
    base_e = float(st.tables.energy_j[:, top].sum())
    points = frontier(st.tables)
    time_s = points[:, 0] + gaps_s
    return pd.DataFrame(
        {
            "slowdown_pct": (time_s / base_t - 1) * 100,
            "saving_pct": (1 - points[:, 1] / base_e) * 100,
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
    models: ModelBundle,
    inputs: PlanInputs,
    groups: np.ndarray | None,
    *,
    target: float,
    objective: Objective = "energy",
    switch_latency_ms: float = 1.0,
) -> Schedule:
    """Best plan that runs every op of a group at one clock: the coarse baselines.

    ``groups=None`` is one static clock for the whole iteration; ``inputs.phases`` gives the
    per-phase plan (one clock for all forward ops, one for backward, one for the optimizer).
    Every combination of clocks is evaluated at once (``n_clocks ** n_groups`` of them, so a
    handful of groups), which makes the answer exact for the models.
    """
    started = _time.perf_counter()
    freqs, time_us, chip_j, core_j = _op_tables(models, inputs)
    energy = core_j if objective == "core-energy" else chip_j
    n_ops, n_clocks = time_us.shape
    labels, member = np.unique(
        np.zeros(n_ops, dtype=int) if groups is None else np.asarray(groups), return_inverse=True
    )
    if len(labels) > 4:
        raise ValueError(f"{len(labels)} groups: plan_grouped enumerates clocks^groups, keep <= 4")
    group_t = np.zeros((len(labels), n_clocks))
    group_e = np.zeros((len(labels), n_clocks))
    np.add.at(group_t, member, time_us)
    np.add.at(group_e, member, energy)
    # every combination of one clock per group: (n_clocks ** n_groups, n_groups)
    combos = np.stack(
        np.meshgrid(*[np.arange(n_clocks)] * len(labels), indexing="ij"), axis=-1
    ).reshape(-1, len(labels))
    rows = np.arange(len(labels))
    gaps_s = float(inputs.gap_us.sum() * 1e-6)
    top = n_clocks - 1
    total_t = group_t[rows, combos].sum(axis=1) * 1e-6
    total_e = group_e[rows, combos].sum(axis=1)
    baseline_s = float(group_t[:, top].sum()) * 1e-6 + gaps_s
    fits = total_t + gaps_s <= (1.0 + target) * baseline_s * (1 + 1e-12)
    best = int(np.flatnonzero(fits)[np.argmin(total_e[fits])])  # all-top always fits
    per_op = combos[best][member]
    starts = np.flatnonzero(np.r_[True, per_op[1:] != per_op[:-1]])
    return _schedule(
        models,
        inputs,
        starts,
        per_op[starts],
        (freqs, time_us, chip_j, core_j),
        predictive=True,
        switch_latency_ms=switch_latency_ms,
        baseline_time_s=baseline_s,
        predicted_time_s=float(total_t[best]) + gaps_s,
        started=started,
        target=target,
        objective=objective,
        solver="static" if groups is None else "per-group",
    )
