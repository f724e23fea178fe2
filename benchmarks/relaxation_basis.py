"""First bases for the large-graph relaxation: simplex iterations and CPU s to its optimum.

:func:`opdvfs.plan.dag.solve_dag` solves the relaxation of a graph of 2048 nodes or more
(HiGHS's dual simplex, presolve off) from the all-slowest basis
(:meth:`~opdvfs.plan._dag_lp._Programme.start_slowest`); at 16 stages x 128 microbatches that
takes 0.6-1.0 s, the whole default budget. This script measures whether another first basis
reaches the same optimum in fewer iterations, per Perseus file and deadline d, in CPU seconds
of this thread (``lp s``: the relaxation; ``pre s``: what the start costs before it, the
smaller relaxation and the mapping; ``total s`` both):

- ``slowest``: the planner's start (every node at its slowest hull option, starts basic, each
  node's latest-finishing predecessor's row tight, the latest sink's row tight);
- ``stretched``: the same construction on the all-max plan stretched to the deadline
  (:func:`opdvfs.plan.dag._first_plan`'s rule) rounded down onto the hull
  (:meth:`~opdvfs.plan._dag_lp._Programme.start_from`);
- ``basis<M>``: the optimal basis of the same pipeline's relaxation at M microbatches mapped
  onto the large one (:func:`mapped_basis`): the first and last M/2 microbatches to their
  own, every steady-state microbatch to the small model's middle one; each edge's row takes
  the status of the edge shifted by its source's shift; the basic count is evened (surplus
  basic thresholds in the steady state to their nearest bound, missing basics from tight
  steady-state rows); HiGHS repairs what is left singular.

Every start reached the same optimum (relative difference <= 1.2e-15). The result, per start:
simplex iterations, ``lp s`` and ``total s`` (``slowest``: no ``pre s``). 16 stages x 128
microbatches (load average 2.5-2.8 on the 2-core machine)::

    data d%      slowest           basis32               basis48               basis64
                   it      s      it   lp s  tot s      it   lp s  tot s      it   lp s  tot s
    gpt3-a100   0   6435  0.910    4307  0.474  0.554    2869  0.332  0.475     993  0.150  0.447
    gpt3-a100   2   5949  1.021    5030  0.707  0.783    4923  0.776  0.937    3490  0.548  0.816
    gpt3-a100   5   3388  0.434    1924  0.226  0.317    3169  0.413  0.509    2503  0.297  0.453
    gpt3-a100  10   2583  0.332    2065  0.243  0.284     801  0.147  0.226    1259  0.164  0.309
    gpt3-a40    0   6077  0.694    4707  0.546  0.627    1417  0.153  0.335     953  0.182  0.416
    gpt3-a40    2   4350  0.629    3468  0.419  0.468    2224  0.344  0.419    1933  0.244  0.384
    gpt3-a40    5   2344  0.269    1044  0.155  0.197    2523  0.330  0.402    1082  0.142  0.225
    gpt3-a40   10   1931  0.217    1096  0.133  0.162     463  0.095  0.149     630  0.091  0.178
    bloom-a100  0   4558  0.667    4410  0.656  0.729    4183  0.544  0.667    2832  0.399  0.636
    bloom-a100  2   3812  0.553    3878  0.511  0.598    3450  0.436  0.578    2287  0.338  0.586
    bloom-a100  5   4853  1.000    5729  0.981  1.052    5349  1.204  1.352    4027  0.844  1.092
    bloom-a100 10   3313  0.620    3544  0.615  0.658    3369  0.655  0.718    4151  0.796  0.873
    bloom-a40   0   4209  0.648    4349  0.566  0.642    1548  0.177  0.300    5395  0.670  0.913
    bloom-a40   2   3821  0.739    4235  0.822  0.859    3178  0.544  0.630    2228  0.411  0.577
    bloom-a40   5    253  0.071     444  0.080  0.109     128  0.056  0.096     150  0.060  0.107
    bloom-a40  10    188  0.059     343  0.077  0.100     241  0.092  0.125     447  0.088  0.169
    median          3817  0.624    3711  0.493  0.576    2696  0.338  0.447    2081  0.270  0.450
    worst                 1.021                 1.052                 1.352                 1.092

``stretched``: median 3879 iterations, 0.612 s (worst 1.020 s); within 2.3% of ``slowest``'s
iterations in the 14 cases over 1000 (exactly as many in 3), 394 and 231 against 253 and 188
in the other two; at 8 stages exactly as many in 8 of 16, within 5.2% in all. 8 stages x 128::

    data d%      slowest           basis32               basis48               basis64
                   it      s      it   lp s  tot s      it   lp s  tot s      it   lp s  tot s
    gpt3-a100   0   3098  0.286     295  0.036  0.066    1952  0.114  0.169     118  0.021  0.109
    gpt3-a100   2   2906  0.321    2746  0.299  0.330    2755  0.248  0.296    2248  0.221  0.294
    gpt3-a100   5   2657  0.279    2632  0.222  0.251    2263  0.201  0.250    1510  0.122  0.212
    gpt3-a100  10   2606  0.240    3003  0.263  0.295    2637  0.203  0.251    2221  0.185  0.257
    gpt3-a40    0   2722  0.158      53  0.019  0.049       0  0.008  0.054     585  0.048  0.117
    gpt3-a40    2   2805  0.247    2961  0.239  0.313     396  0.034  0.092     525  0.044  0.134
    gpt3-a40    5   2477  0.289    2451  0.210  0.239    1235  0.141  0.186    1319  0.137  0.213
    gpt3-a40   10   2354  0.167    2262  0.180  0.200    2113  0.167  0.198    1850  0.127  0.174
    bloom-a100  0   2285  0.226     528  0.057  0.091    1247  0.104  0.163    1432  0.116  0.207
    bloom-a100  2   2303  0.253    2158  0.200  0.241    1178  0.101  0.163     931  0.087  0.239
    bloom-a100  5   2773  0.287    1953  0.139  0.179    1522  0.146  0.211    1151  0.070  0.181
    bloom-a100 10   2046  0.252    2199  0.192  0.225    2054  0.164  0.218     849  0.064  0.150
    bloom-a40   0   2509  0.204     731  0.056  0.084    1263  0.080  0.134    1272  0.091  0.172
    bloom-a40   2   2108  0.188    1228  0.087  0.113      23  0.021  0.069     357  0.037  0.106
    bloom-a40   5   1939  0.224    1166  0.139  0.159    1620  0.168  0.211    1466  0.151  0.214
    bloom-a40  10   2309  0.230    2722  0.253  0.274    2096  0.193  0.226    2125  0.196  0.240
    median          2493  0.244    2179  0.186  0.213    1571  0.144  0.192    1296  0.103  0.194
    worst                 0.321                 0.330                 0.296                 0.294

So no start pays where it is needed: at 16 stages the best, the 48- and 64-microbatch bases,
cut the median by 1.4x (0.62 -> 0.45 s) with the smaller relaxation counted, case by case from
2.2x faster to 2.1x slower (``basis48``) and 2.0x faster to 2.9x slower (``basis64``), and the
worst case grows (1.02 s from ``slowest``, 1.35 and 1.09 s from them; cases past 0.75 s: 3 from
``slowest``, 2 and 4 from them). At 8 stages (already well inside the budget) they cut the
median by 1.3x (0.8-4.3x case by case); at d = 0 the 32-microbatch basis is near the large
optimum (53-731 iterations, against 2285-3098). Why the vertex starts change nothing (our
reading of the basis; the equal counts agree): in such a tree basis the makespan column and
every start are basic at cost 0, so every row's dual is 0; each threshold's reduced cost is
then its step's cost (negative: a slower option is cheaper), and HiGHS's dual simplex moves
every boxed threshold to the bound its reduced cost asks for, the slowest option, before its
first iteration. Whatever plan the thresholds were set from, the dual simplex starts from the
all-slowest point; only the tree differs, and a uniform stretch keeps it nearly the same. A
start that carries a plan's prices needs basic thresholds and more tight rows than a tree (the
``basis<M>`` rows), and at 16 stages the pipeline's optimal basis does not repeat across the
steady-state microbatches closely enough for the mapped one to sit near the large optimum.

Also measured, on gpt3-175b-a40 at d = 2% only, with an earlier revision of this script:
HiGHS's primal simplex (``--primal``: ``simplex_strategy`` 4) took 20300-25300 iterations and
3.7-4.9 s from every start (``slowest``; ``stretched``, primal feasible: its plan meets the
deadline; and the vertex starts of the 16- and 32-microbatch relaxations mapped), against 4350
and 0.55 s for the dual; the vertex starts of the 16- and 32-microbatch relaxations under the
dual, 4098 and 4595 iterations (0.59, 0.71 s with the small solve); the small relaxations'
primal points (durations scaled into the deadline) given to HiGHS as a solution
(``setSolution``, from which it builds its own basis), 5900 and 8545 iterations (0.63, 0.85 s);
and with their mapped duals through ``Highs.crossover``, 4226 and 4842 (0.67, 0.73 s).
(``Highs.crossover`` on a model that HiGHS has not run yet crashes the process with a
segmentation fault in highspy 1.16; it was run after a zero-iteration solve.)

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/relaxation_basis.py [--stages 16]
        [--microbatches 128] [--smalls 32,48,64] [--targets 0,0.02,0.05,0.1] [--data ...]
        [--primal]
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pandas as pd

from opdvfs.plan._dag_lp import _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _deadline, _Options
from pipeline_planning import scale_problem, show
from relaxation_at_scale import case_parser, each_case

_NAME = re.compile(r"(forward|backward)(\d+)")


def programme(problem: DagProblem, deadline_s: float, *, primal: bool = False) -> _Programme:
    """Return the planner's relaxation of ``problem`` at ``deadline_s``, with no basis yet."""
    options = _Options.build(problem)
    lp = _Programme(problem, options.hull(), nested=False, round_to=options)
    lp.h.setOptionValue("presolve", "off")
    if primal:
        lp.h.setOptionValue("simplex_strategy", 4)
    lp.set_deadline(deadline_s * (1 + _TIME_RTOL))
    return lp


def stretched_slots(problem: DagProblem, lp: _Programme, deadline_s: float) -> np.ndarray:
    """Return the all-max plan stretched to the deadline, rounded down onto ``lp``'s hull."""
    top = problem.top_clock()
    rows = np.arange(problem.n_nodes)
    stretch = deadline_s / float(problem.evaluate(top)[0])
    full = lp.round_to
    at_or_below = (
        full.time_s <= (stretch * problem.time_s[rows, top])[:, None] * (1 + _TIME_RTOL) + 1e-15
    )
    duration = full.time_s[rows, np.maximum(at_or_below.sum(axis=1) - 1, 0)]
    on_hull = lp.options.time_s <= duration[:, None] * (1 + _TIME_RTOL) + 1e-15
    return np.maximum(on_hull.sum(axis=1) - 1, 0)


def keys(problem: DagProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each node's stage, pass (1: backward) and microbatch, from its name."""
    parsed = [_NAME.fullmatch(str(n)) for n in problem.names]
    kind = np.array([m is not None and m.group(1) == "backward" for m in parsed], dtype=int)
    micro = np.array([int(m.group(2)) if m is not None else -1 for m in parsed])
    return problem.rank.astype(int), kind, micro


def mapped_basis(large: _Programme, small: _Programme, m_large: int, m_small: int) -> object:
    """Return the small relaxation's optimal basis mapped onto the large one (see above)."""
    stat = large.highspy.HighsBasisStatus
    rank, kind, micro = keys(large.problem)
    s_rank, s_kind, s_micro = keys(small.problem)
    index = np.full((rank.max() + 1, 2, m_small), -1)
    index[s_rank, s_kind, s_micro] = np.arange(small.n)
    half = m_small // 2
    late = micro - (m_large - m_small)
    to = np.where(micro < half, micro, np.where(micro >= m_large - half, late, half))
    shift = to - micro
    node = index[rank, kind, to]
    steady = (micro >= half) & (micro < m_large - half)
    basis = small.h.getBasis()
    codes = {stat.kLower: 0, stat.kBasic: 1, stat.kUpper: 2, stat.kZero: 3, stat.kNonbasic: 4}
    s_col = np.array([codes[c] for c in basis.col_status])
    s_row = np.array([codes[c] for c in basis.row_status])
    ptr = np.searchsorted(large.node_of, np.arange(large.n + 1))
    s_ptr = np.searchsorted(small.node_of, np.arange(small.n + 1))
    y_small = s_ptr[node[large.node_of]] + np.arange(large.nx) - ptr[large.node_of]
    y_value = np.asarray(small.h.getSolution().col_value)[y_small]
    col = np.r_[s_col[y_small], s_col[small.nx + node], s_col[-1]]
    # rows: each edge shifted by its source's shift, looked up among the small edges
    s_src, s_dst = small.problem.edges[:, 0], small.problem.edges[:, 1]
    s_sinks = np.flatnonzero(np.bincount(s_src, minlength=small.n) == 0)
    src, dst = large.problem.edges[:, 0], large.problem.edges[:, 1]
    sinks = np.flatnonzero(np.bincount(src, minlength=large.n) == 0)
    s_key = s_src * small.n + s_dst
    order = np.argsort(s_key)
    shifted = micro[dst] + shift[src]
    ok = (shifted >= 0) & (shifted < m_small)
    key = node[src] * small.n + index[rank[dst], kind[dst], np.clip(shifted, 0, m_small - 1)]
    at = np.minimum(np.searchsorted(s_key[order], key), len(order) - 1)
    found = ok & (s_key[order][at] == key)
    row = np.ones(len(src) + len(sinks), dtype=np.int64)
    row[: len(src)][found] = s_row[order[at[found]]]
    sink_at = np.minimum(np.searchsorted(s_sinks, node[sinks]), len(s_sinks) - 1)
    sink_found = s_sinks[sink_at] == node[sinks]
    row[len(src) :][sink_found] = s_row[len(s_src) + sink_at[sink_found]]
    excess = int((col == 1).sum() + (row == 1).sum() - len(row))
    if excess > 0:  # surplus basic thresholds in the steady state to their nearest bound
        pick = np.flatnonzero((col[: large.nx] == 1) & steady[large.node_of])
        pick = pick[np.argsort(-np.abs(y_value[pick] - 0.5), kind="stable")][:excess]
        col[pick] = np.where(y_value[pick] >= 0.5, 2, 0)
        excess -= len(pick)
        pick = np.flatnonzero(col[: large.nx] == 1)[:excess]
        col[pick] = 0
    elif excess < 0:  # missing basics from tight rows in the steady state
        in_steady = np.r_[steady[src], steady[sinks]]
        pick = np.flatnonzero((row != 1) & in_steady)[:-excess]
        row[pick] = 1
        excess += len(pick)
        row[np.flatnonzero(row != 1)[: max(-excess, 0)]] = 1
    named = np.array(
        [stat.kLower, stat.kBasic, stat.kUpper, stat.kZero, stat.kNonbasic], dtype=object
    )
    out = large.highspy.HighsBasis()
    out.col_status, out.row_status = list(named[col]), list(named[row])
    out.valid = True
    return out


def solve(lp: _Programme) -> tuple[float, int, float]:
    """Solve ``lp`` from the basis it holds: optimum (J), iterations, CPU s of this thread."""
    started = time.thread_time()
    got = lp.relax()
    seconds = time.thread_time() - started
    assert got is not None, "an infeasible relaxation"
    return got[0], int(lp.h.getInfo().simplex_iteration_count), seconds


def case(
    name: str, stages: int, microbatches: int, target: float, smalls: list[int], primal: bool
) -> list[dict]:
    """Every start on one instance (see the module's docstring)."""
    problem = scale_problem(name, stages, microbatches)
    deadline, _ = _deadline(problem, target)
    rows: list[dict] = []
    optimum = None

    def record(label: str, lp: _Programme, pre_s: float) -> None:
        nonlocal optimum
        value, iterations, seconds = solve(lp)
        optimum = value if optimum is None else optimum
        rows.append(
            {
                "data": name.removeprefix("perseus-"),
                "d %": target * 100,
                "start": label,
                "it": iterations,
                "lp s": seconds,
                "pre s": pre_s,
                "total s": seconds + pre_s,
                "rel diff": value / optimum - 1,
            }
        )

    lp = programme(problem, deadline, primal=primal)
    lp.start_slowest()
    record("slowest", lp, 0.0)
    lp = programme(problem, deadline, primal=primal)
    started = time.thread_time()
    lp.start_from(stretched_slots(problem, lp, deadline))
    record("stretched", lp, time.thread_time() - started)
    for m_small in smalls:
        small_problem = scale_problem(name, stages, m_small)
        small = programme(small_problem, _deadline(small_problem, target)[0])
        small.start_slowest()
        lp = programme(problem, deadline, primal=primal)
        started = time.thread_time()
        small.relax()
        lp.h.setBasis(mapped_basis(lp, small, microbatches, m_small))
        record(f"basis{m_small}", lp, time.thread_time() - started)
    return rows


def main() -> None:
    parser = case_parser(__doc__)
    parser.add_argument("--smalls", default="32,48,64")
    parser.add_argument("--primal", action="store_true", help="HiGHS's primal simplex")
    args = parser.parse_args()
    smalls = [int(v) for v in args.smalls.split(",") if v]
    rows: list[dict] = []
    for name, target in each_case(args, "CPU s of one thread"):
        got = case(name, args.stages, args.microbatches, target, smalls, args.primal)
        print(show(pd.DataFrame(got)), flush=True)
        rows += got
    table = pd.DataFrame(rows)
    by = table.groupby("start", sort=False)
    summary = by[["it", "lp s", "pre s", "total s"]].median()
    summary["worst total s"] = by["total s"].max()
    summary["max |rel diff|"] = by["rel diff"].apply(lambda v: v.abs().max())
    print(summary.to_string())
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
