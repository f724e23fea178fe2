"""A long pipeline's plan from a short one whose steady state stands for the long one's.

Where the relaxation of a large pipeline graph (16 stages x 128 microbatches) does not finish
in its budget, :func:`opdvfs.plan.dag._first_plan` plans without it. In a 1F1B (or GPipe)
pipeline the steady-state microbatches all run alike, so the same pipeline with ``2 x
stages`` microbatches stands for it (:func:`_steady_plan`): its middle microbatch, in the
steady state on every stage, is weighted by the long pipeline's steady state (its options'
costs times the steady-state microbatches it stands for), and its makespan plus the other
steady-state microbatches' cycles (the slowest stage's forward plus backward, each) must
keep the long pipeline's deadline. This reduced relaxation (:func:`_reduced`) has a sixth of
the columns; measured at 16 x 128 (``benchmarks/fallback_small_pipeline.py``) its optimum is
within 0.03% of the long relaxation's, and it takes 0.04-0.19 s of CPU where that took
0.06-1.0 s. Its durations, each long node given its counterpart's (:func:`_counterparts`), keep
the long deadline within 0.3%; they are rounded onto the options in step across the
microbatches (:func:`_rounded`), which a rounding of each node alone loses.

A graph is taken for a pipeline where every node is named ``forward{m}`` or ``backward{m}``
(:func:`opdvfs.plan.pipeline.pipeline_graph`'s names, read by
:func:`~opdvfs.plan._dag_problem._parse_pass_names`), runs on a rank, and each (rank, pass,
microbatch) is one node; the short pipeline is its subgraph of the first microbatches, each
rank's nodes chained in their order (:func:`_shrunk`): the graph ``pipeline_graph`` builds for
that many microbatches.
"""

from __future__ import annotations

import numpy as np

from opdvfs.plan._dag_lp import _OutOfTime, _Programme
from opdvfs.plan._dag_problem import (
    _TIME_RTOL,
    DagProblem,
    _Options,
    _parse_pass_names,
    topological_levels,
)

#: The scale factors of each node's time over its fastest option that :func:`_rounded` tries
#: (the plan of the largest that keeps the deadline costs least, about): 0 to 0.8 coarsely,
#: finely above, where the rounded plans land.
_FACTORS = np.r_[np.linspace(0.0, 0.8, 9), np.linspace(0.81, 1.0, 20)]

_Keys = tuple[np.ndarray, np.ndarray, np.ndarray]


def _pipeline_keys(problem: DagProblem) -> _Keys | None:
    """Return each node's stage, pass (1: backward) and microbatch; None if not a pipeline.

    A pipeline: every node named ``forward{m}`` / ``backward{m}`` on a rank, each (rank,
    pass, microbatch) of ``ranks x 2 x microbatches`` exactly once.
    """
    parsed = _parse_pass_names(problem.names)
    if parsed is None or (problem.rank < 0).any():
        return None
    kind, micro = parsed
    key = (problem.rank * 2 + kind) * (int(micro.max()) + 1) + micro
    if len(np.unique(key)) != problem.n_nodes or problem.n_nodes != 2 * problem.n_ranks * (
        int(micro.max()) + 1
    ):
        return None
    return problem.rank, kind, micro


def _shrunk(problem: DagProblem, keys: _Keys, microbatches: int) -> tuple[DagProblem, np.ndarray]:
    """Return the pipeline of the first ``microbatches`` microbatches, and its nodes' indices.

    Its edges: the graph's edges between kept nodes on different ranks (the sends) and, on
    each rank, its kept nodes chained in topological order (the rank's own order with the
    later microbatches left out: 1F1B's and GPipe's orders for fewer microbatches).
    """
    rank, _kind, micro = keys
    kept = np.flatnonzero(micro < microbatches)
    new = np.full(problem.n_nodes, -1)
    new[kept] = np.arange(len(kept))
    src, dst = problem.edges[:, 0], problem.edges[:, 1]
    sends = (new[src] >= 0) & (new[dst] >= 0) & (rank[src] != rank[dst])
    level = topological_levels(problem.n_nodes, problem.edges)
    order = kept[np.lexsort((level[kept], rank[kept]))]
    chained = rank[order[1:]] == rank[order[:-1]]
    edges = np.r_[
        np.c_[new[src[sends]], new[dst[sends]]],
        np.c_[new[order[:-1][chained]], new[order[1:][chained]]],
    ]
    small = DagProblem(
        problem.time_s[kept],
        problem.energy_j[kept],
        problem.freqs_mhz,
        edges,
        problem.rank[kept],
        problem.names[kept],
        problem.blocking_power_w,
    )
    return small, kept


def _counterparts(keys: _Keys, kept: np.ndarray, microbatches: int) -> np.ndarray:
    """Return each long node's counterpart in the short pipeline (its node index there).

    The short pipeline's first and last ``microbatches / 2`` microbatches (the warm-up and
    the cool-down) stand for their own, the last ones shifted to the long pipeline's end;
    its middle one for every microbatch between them, on the same stage and pass.
    """
    rank, kind, micro = keys
    index = np.full((int(rank.max()) + 1, 2, microbatches), -1)
    index[rank[kept], kind[kept], micro[kept]] = np.arange(len(kept))
    half, total = microbatches // 2, int(micro.max()) + 1
    to = np.where(
        micro < half, micro, np.where(micro >= total - half, micro - (total - microbatches), half)
    )
    return index[rank, kind, to]


def _reduced(
    small: DagProblem, options: _Options, middle: np.ndarray, copies: int, deadline_s: float
) -> _Programme:
    """Return the short pipeline's relaxation with its ``middle`` nodes standing for ``copies``.

    The middle nodes' costs count ``copies`` times; a column, the cycle (ms), is at least
    each stage's middle forward plus backward; the makespan has no bound of its own, but the
    makespan plus ``copies - 1`` cycles keeps ``deadline_s``.
    """
    lp = _Programme(small, options.hull(), nested=False, round_to=options)
    lp.h.setOptionValue("presolve", "off")
    lp.start_slowest()  # HiGHS extends the basis to the rows and column added below
    h, inf = lp.h, lp.highspy.kHighsInf
    ys = np.flatnonzero(middle[lp.node_of])
    cost = np.asarray(h.getLp().col_cost_)
    h.changeColsCost(len(ys), ys.astype(np.int32), cost[ys] * copies)
    offset = float(lp.options.cost_j[middle, 0].sum()) * (copies - 1)
    h.changeObjectiveOffset(float(h.getLp().offset_) + offset)
    cycle = lp.cols
    h.addVar(0.0, inf)
    h.changeColCost(cycle, (copies - 1) * small.n_ranks * small.blocking_power_w * 1e-3)
    h.changeColBounds(lp.makespan_col, 0.0, inf)
    ptr = np.searchsorted(lp.node_of, np.arange(lp.n + 1))
    for stage in range(small.n_ranks):  # a few rows: one per stage
        nodes = np.flatnonzero(middle & (small.rank == stage))
        cols = np.concatenate([np.arange(ptr[i], ptr[i + 1]) for i in nodes])
        h.addRow(
            float(lp.fastest_ms[nodes].sum()),
            inf,
            len(cols) + 1,
            np.r_[cycle, cols].astype(np.int32),
            np.r_[1.0, -lp.step_ms[cols]],
        )
    h.addRow(
        -inf,
        deadline_s * 1e3 * (1 + _TIME_RTOL),
        2,
        np.array([lp.makespan_col, cycle], dtype=np.int32),
        np.array([1.0, copies - 1.0]),
    )
    return lp


def _rounded(
    problem: DagProblem,
    options: _Options,
    series: np.ndarray,
    duration_s: np.ndarray,
    deadline_s: float,
) -> np.ndarray | None:
    """Return relaxed durations rounded onto the options within the deadline (None: none fit).

    Each node's time over its fastest option is scaled by each of :data:`_FACTORS`; each
    scaled duration lies between two options (the slowest not slower, and the next), and is
    rounded two ways: down, and by error diffusion along its ``series`` (a stage's pass, in
    microbatch order: the slower option where the running sum of the fractions, from 0.5,
    crosses an integer; every stage then runs each pass at its relaxed durations on average,
    in step by microbatch). Of all these plans the cheapest that keeps the deadline is kept.
    """
    nodes = np.arange(problem.n_nodes)
    fastest = options.time_s[:, 0]
    tried = fastest + _FACTORS[:, None] * np.maximum(duration_s - fastest, 0.0)
    below = (options.time_s[None] <= tried[..., None] * (1 + _TIME_RTOL) + 1e-15).sum(axis=-1)
    lo = np.maximum(below - 1, 0)
    hi = np.minimum(lo + 1, options.valid.sum(axis=1) - 1)
    t_lo, t_hi = options.time_s[nodes, lo], options.time_s[nodes, hi]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(t_hi > t_lo, (tried - t_lo) / (t_hi - t_lo), 0.0)
    plans = np.r_[lo, np.where(_diffused(share, series), hi, lo)]
    makespan, energy_j, _ = problem.evaluate(options.clock[nodes, plans])
    fits = makespan <= deadline_s * (1 + _TIME_RTOL)
    return plans[int(np.argmin(np.where(fits, energy_j, np.inf)))] if fits.any() else None


def _diffused(share: np.ndarray, series: np.ndarray) -> np.ndarray:
    """Return where each node takes the slower of its two options, by error diffusion.

    ``share`` (..., n_nodes) is each node's fraction of the way to its slower option;
    ``series`` (rows, length) holds node indices, each row a stage's pass in microbatch order.
    Along each row the slower option goes where the running sum of the fractions, from 0.5,
    crosses an integer: every row then averages its fractions, the rows in step.
    """
    total = np.cumsum(np.clip(share, 0.0, 1.0)[..., series], axis=-1) + 0.5
    before = np.concatenate([np.full((*total.shape[:-1], 1), 0.5), total[..., :-1]], axis=-1)
    slower = np.zeros(share.shape, dtype=bool)
    slower[..., series] = np.floor(total) > np.floor(before)
    return slower


def _steady_plan(
    problem: DagProblem, options: _Options, deadline_s: float, time_limit_s: float | None
) -> np.ndarray | None:
    """Return a pipeline's plan from its short pipeline's reduced relaxation, as option slots.

    None where the graph is no pipeline (:func:`_pipeline_keys`) of at least four times as
    many microbatches as stages, where the reduced relaxation is infeasible or not solved
    within ``time_limit_s`` (None: no limit), or where no rounding keeps the deadline.
    """
    keys = _pipeline_keys(problem)
    if keys is None:
        return None
    rank, kind, micro = keys
    stages, total = problem.n_ranks, int(micro.max()) + 1
    short = 2 * stages  # its middle microbatch is in the steady state on every stage
    if total < 2 * short:
        return None
    small, kept = _shrunk(problem, keys, short)
    small_options = options._take(kept)
    middle = micro[kept] == short // 2
    lp = _reduced(small, small_options, middle, total - short + 1, deadline_s)
    try:
        relaxed = lp.relax(time_limit_s)
    except _OutOfTime:
        return None
    if relaxed is None:
        return None
    duration = relaxed[1][_counterparts(keys, kept, short)]
    grid = np.full((stages, 2, total), -1)
    grid[rank, kind, micro] = np.arange(problem.n_nodes)
    return _rounded(problem, options, grid.reshape(2 * stages, total), duration, deadline_s)
