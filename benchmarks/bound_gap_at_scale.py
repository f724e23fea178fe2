"""Where the last 0.5% of a 128-microbatch pipeline's gap lies: in the plan or in the bound.

Issue 35 asks the DAG planner for a plan within 0.5% of its own certified bound at 128
microbatches. That bound is the linear relaxation on each instruction's convex-hull options
(:mod:`opdvfs.plan.dag`). In a long pipeline's steady state the relaxation runs a stage's pass
at a duration between two hull options, each microbatch alike, at the cost of the line between
them; a plan has to choose one option per instruction. This script measures, per Perseus file,
stage count and deadline d:

- ``plan %``, ``long %``: the planner's gap above its bound with the default budget and with
  ``--long-seconds`` (wall time);
- ``mixed over %``, ``mixed E %``: the relaxation's durations realised on the options as it
  prices them: each steady-state instruction takes one of the two hull options around its
  relaxed duration, by error diffusion along its stage's pass in microbatch order (every stage
  in step), so each (stage, pass) averages its relaxed duration; how far its makespan runs past
  the deadline (%) and its energy above the bound (%);
- ``uniform %``: the cheapest steady state that runs every microbatch alike (one option per
  stage and pass, as a cyclic schedule of period one microbatch) at the relaxation's own cycle
  (the slowest stage's forward plus backward per microbatch), exact by HiGHS: its energy per
  microbatch above the relaxation's middle microbatch's (%);
- ``bnb +%``, ``bnb s``: HiGHS's branch and bound on the whole 0/1 programme (the bound
  worker's settings, from the long run's plan) for ``--bnb-seconds``: how far it raises the
  certified bound above the relaxation, and the long plan's gap to that bound (``long vs bnb %``).

If ``mixed over %`` is large, the plans that match the relaxation's energy miss the deadline;
if ``uniform %`` is large, the plans that keep the cycle without mixing cost more; and if
``bnb +%`` stays small, the certified bound cannot follow the plans up. Minutes per instance:
a measurement of where the gap is, not of speed.

    .venv/bin/python benchmarks/bound_gap_at_scale.py [--stages 16] [--microbatches 128]
        [--targets 0,0.02] [--data perseus-gpt3-175b-a40,perseus-bloom-a40]
        [--long-seconds 30] [--bnb-seconds 120] [--cpu-clock]
"""

from __future__ import annotations

import time

import highspy
import numpy as np
import pandas as pd

from opdvfs.plan._dag_lp import _BOUND_ONLY, _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _deadline, _Options
from opdvfs.plan._dag_steady import _diffused, _pipeline_keys
from opdvfs.plan.dag import _prepare, solve_dag
from pipeline_planning import planner_on_cpu_clock, scale_problem, show
from relaxation_at_scale import case_parser, each_case


def _hull_neighbours(hull: _Options, duration_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each node's hull option times (s) at and above its relaxed duration."""
    times = np.where(hull.valid, hull.time_s, np.inf)
    below = (times <= duration_s[:, None] * (1 + 1e-9)).sum(axis=1) - 1
    lo = np.clip(below, 0, None)
    hi = np.minimum(lo + 1, hull.valid.sum(axis=1) - 1)
    rows = np.arange(len(duration_s))
    return times[rows, lo], times[rows, hi]


def mixed_in_step(
    problem: DagProblem, options: _Options, duration_s: np.ndarray, series: np.ndarray
) -> tuple[float, float]:
    """Return the makespan (s) and energy (J) of the relaxation's durations mixed in step.

    Each node takes the hull option at or below its relaxed duration, or the next one up, by
    error diffusion along its ``series`` (a stage's pass in microbatch order:
    :func:`~opdvfs.plan._dag_steady._diffused`), so each series averages its relaxed durations.
    """
    t_lo, t_hi = _hull_neighbours(options.hull(), duration_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(t_hi > t_lo, (duration_s - t_lo) / (t_hi - t_lo), 0.0)
    chosen = np.where(_diffused(share, series), t_hi, t_lo)
    slot = np.argmin(np.abs(np.where(options.valid, options.time_s, np.inf) - chosen[:, None]), 1)
    makespan, energy, _ = problem.evaluate(options.clock[np.arange(problem.n_nodes), slot])
    return float(makespan), float(energy)


def uniform_steady_j(
    problem: DagProblem, options: _Options, keys: tuple, cycle_ms: float
) -> float | None:
    """Return the least energy (J) of one steady microbatch run alike by all, within the cycle.

    The cyclic schedule of period one microbatch: a (stage, pass) node per steady instruction
    kind, start times free, and each edge between steady microbatches ``m -> m + k`` a row
    ``start_u + duration_u <= start_v + k x cycle_ms``; one option per node (HiGHS, exact).
    None if no such schedule keeps the cycle.
    """
    rank, kind, micro = keys
    stages, total = problem.n_ranks, int(micro.max()) + 1
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    steady = (micro >= stages) & (micro < total - stages)
    inner = steady[src] & steady[dst]
    node_of = rank * 2 + kind
    rows = np.unique(
        np.c_[node_of[src[inner]], node_of[dst[inner]], micro[dst[inner]] - micro[src[inner]]],
        axis=0,
    )
    example = np.full(2 * stages, -1)
    one = np.flatnonzero(micro == total // 2)
    example[node_of[one]] = one
    t_ms, cost = options.time_s[example] * 1e3, options.cost_j[example]
    node, opt = np.nonzero(options.valid[example])
    n, nx = len(example), len(node)
    h = getattr(highspy, "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    h.addVars(nx, np.zeros(nx), np.ones(nx))
    h.changeColsCost(nx, np.arange(nx, dtype=np.int32), cost[node, opt])
    h.changeColsIntegrality(
        nx, np.arange(nx, dtype=np.int32), np.full(nx, highspy.HighsVarType.kInteger)
    )
    h.addVars(n, np.full(n, -1e9), np.full(n, 1e9))
    ptr = np.searchsorted(node, np.arange(n + 1))
    for i in range(n):  # one option each: a few dozen rows
        cols = np.arange(ptr[i], ptr[i + 1], dtype=np.int32)
        h.addRow(1, 1, len(cols), cols, np.ones(len(cols)))
    for u, v, k in rows:  # start_u + duration_u - start_v <= k cycle
        cols = np.arange(ptr[u], ptr[u + 1])
        index, value = cols, t_ms[node[cols], opt[cols]]
        if u != v:
            index, value = np.r_[nx + u, nx + v, cols], np.r_[1.0, -1.0, value]
        h.addRow(-highspy.kHighsInf, k * cycle_ms, len(index), index.astype(np.int32), value)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value)


def branch_and_bound_j(
    problem: DagProblem, options: _Options, deadline_s: float, slot: np.ndarray, seconds: float
) -> float:
    """Return the bound (J) HiGHS's branch and bound certifies in ``seconds`` from ``slot``."""
    programme = _Programme(problem, options)
    programme.set_deadline(deadline_s * (1 + _TIME_RTOL))
    for name, value in _BOUND_ONLY.items():
        programme.h.setOptionValue(name, value)
    _, bound, _ = programme.exact(slot, rel_gap=1e-4, time_limit_s=seconds)
    return bound


def case(
    name: str, n_stages: int, microbatches: int, target: float, long_s: float, bnb_s: float
) -> dict:
    """Measure one instance (see the module's docstring)."""
    problem = scale_problem(name, n_stages, microbatches)
    keys = _pipeline_keys(problem)
    assert keys is not None  # pipeline_graph's names
    rank, kind, micro = keys
    deadline, _ = _deadline(problem, target)
    plan = solve_dag(problem, target)
    long = solve_dag(problem, target, time_limit_s=long_s)
    prepared = _prepare(problem, deadline)
    options, relaxation = prepared.options, prepared.relaxation
    relaxation.set_deadline(deadline * (1 + _TIME_RTOL))
    relaxed = relaxation.relax()
    assert relaxed is not None  # the deadline is the planner's own: it fits
    bound, duration = relaxed
    grid = np.full((n_stages, 2, microbatches), -1)
    grid[rank, kind, micro] = np.arange(problem.n_nodes)
    mixed_s, mixed_j = mixed_in_step(
        problem, options, duration, grid.reshape(2 * n_stages, microbatches)
    )
    middle = micro == microbatches // 2
    hull = options.hull()
    middle_j = sum(
        float(np.interp(duration[i], hull.time_s[i][hull.valid[i]], hull.cost_j[i][hull.valid[i]]))
        for i in np.flatnonzero(middle)
    )
    cycle_ms = max(duration[middle & (rank == s)].sum() for s in range(n_stages)) * 1e3
    uniform_j = uniform_steady_j(problem, options, keys, cycle_ms)
    slot = np.argmax(options.clock == long.clock[:, None], axis=1)
    started = time.perf_counter()
    bnb_j = max(branch_and_bound_j(problem, options, deadline, slot, bnb_s), bound)
    return {
        "data": name.removeprefix("perseus-"),
        "stages": n_stages,
        "microbatches": microbatches,
        "d %": 100 * target,
        "plan %": plan.gap_pct,
        "long %": long.gap_pct,
        "mixed over %": 100 * (mixed_s / deadline - 1),
        "mixed E %": 100 * (mixed_j / bound - 1),
        "uniform %": np.nan if uniform_j is None else 100 * (uniform_j / middle_j - 1),
        "bnb +%": 100 * (bnb_j / bound - 1),
        "bnb s": time.perf_counter() - started,
        "long vs bnb %": 100 * (1 - bnb_j / long.energy_j),
    }


def main() -> None:
    parser = case_parser(__doc__)
    parser.set_defaults(targets="0,0.02", data="perseus-gpt3-175b-a40,perseus-bloom-a40")
    parser.add_argument("--long-seconds", type=float, default=30.0)
    parser.add_argument("--bnb-seconds", type=float, default=120.0)
    parser.add_argument(
        "--cpu-clock", action="store_true", help="the planner's budgets in CPU seconds"
    )
    args = parser.parse_args()
    if args.cpu_clock:
        planner_on_cpu_clock()
    rows = []
    for name, target in each_case(args, "CPU s" if args.cpu_clock else "wall s"):
        rows.append(
            case(
                name,
                args.stages,
                args.microbatches,
                target,
                args.long_seconds,
                args.bnb_seconds,
            )
        )
        print(show(pd.DataFrame(rows[-1:])), flush=True)
    table = pd.DataFrame(rows)
    print(show(table))
    print(
        f"mixed in step: {table['mixed over %'].min():.2f}-{table['mixed over %'].max():.2f}% "
        f"past the deadline; uniform steady state {table['uniform %'].min():.2f}-"
        f"{table['uniform %'].max():.2f}% above the relaxation's; branch and bound raised the "
        f"bound {table['bnb +%'].min():.3f}-{table['bnb +%'].max():.3f}%; long plans "
        f"{table['long %'].min():.3f}-{table['long %'].max():.3f}% above the relaxation, "
        f"{table['long vs bnb %'].min():.3f}-{table['long vs bnb %'].max():.3f}% above that bound"
    )


if __name__ == "__main__":
    main()
