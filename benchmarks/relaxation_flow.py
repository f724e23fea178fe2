"""The pipeline planner's relaxation as a min-cost flow (OR-Tools) against HiGHS (issue 35).

The relaxation of :func:`opdvfs.plan.dag.solve_dag` on a large graph (the programme on each
node's convex-hull options, :class:`~opdvfs.plan._dag_lp._Programme` with ``nested=False``) is
the convex-cost project time/cost trade-off (Fulkerson 1961, Kelley 1961): node ``i`` takes a
duration ``d_i`` on its hull, convex and decreasing cost ``c_i(d_i)``, starts respect the
edges, every sink ends by the makespan ``<= D``, and the objective is
``sum c_i(d_i) + B x makespan`` with ``B = n_ranks x blocking_power_w``. Its LP dual is a
min-cost circulation on the event graph (each node split into a start ``S_i`` and an end
``E_i``, an origin ``O`` and the makespan ``M``):

- node ``i``'s hull options ``t_0 < ... < t_K`` with segment slopes ``-u_1 < ... < -u_K < 0``
  become parallel arcs ``S_i -> E_i``, option ``k`` of capacity ``u_k - u_{k+1}`` (``u_0 =
  inf``, ``u_{K+1} = 0``) and cost ``-t_k``: a flow ``g`` through the node earns
  ``h_i(g) = min_k (c_k + g t_k) - c_K`` (the conjugate of its cost);
- every edge ``E_i -> S_j``, ``O -> S_i`` for the sources and ``E_i -> M`` for the sinks:
  uncapacitated, cost 0;
- ``M -> O``: capacity ``B`` at cost 0, and uncapacitated at cost ``D`` (the deadline's
  multiplier is the flow past ``B``).

For any circulation ``g`` the value ``sum_i min_k (c_ik + g_i t_ik) - D max(0, F - B)``
(``F`` the flow on ``M -> O``) is a lower bound on the relaxation (weak duality), and it equals
the relaxation at the optimal flow; the optimal durations are the potentials, the shortest
distances from ``O`` on the optimal flow's residual graph (with an arc ``E_i -> S_i`` of cost
``t_K``: no node slower than its slowest option). This script solves the flow with OR-Tools'
``SimpleMinCostFlow`` (cost scaling, integers: times in ns, flows in 1e-7 of the largest
slope), recovers the durations with SciPy's Bellman-Ford, and compares with HiGHS's dual
simplex from the all-slowest basis as the planner runs it, on the graphs of
``benchmarks/pipeline_planning.py --scale`` (CPU seconds of this thread, each to the end):

- ``highs s``: HiGHS's relaxation; ``flow s``: OR-Tools' solve (the arcs built and added
  included); ``potentials s``: the durations recovered from its flow;
- ``speed-up``: ``highs s`` over ``flow s`` + ``potentials s``;
- ``priced s``: OR-Tools' solve from the prices of the all-max plan stretched to the deadline
  (each node's earliest start and end; the arcs' costs reduced by them: the same optimal
  flows), ``priced ppb`` its bound (as ``bound ppb``);
- ``bound ppb``: the flow's lower bound (above, in floats on the unscaled data) over HiGHS's
  optimum, minus 1, in parts per billion; ``primal ppb``: the objective at the recovered
  durations over HiGHS's optimum, and ``late ppb`` their makespan over the deadline (both
  minus 1, ppb); ``durations ms``: the largest difference of a node's duration from HiGHS's
  (where the optimum is not unique).

Measured (load 2.4-2.9 on the shared 2-core machine; OR-Tools 9.15, highspy 1.16), median
(worst) CPU seconds of the 16 instances:

=================  ============  ============  ============  ===========  ==========
graph              HiGHS         flow          from prices   potentials   speed-up
=================  ============  ============  ============  ===========  ==========
16 x 128           0.642 (1.02)  0.856 (4.69)  0.593 (4.43)  0.352        0.38x
8 x 128            0.232 (0.30)  0.292 (0.81)  0.192 (0.66)  0.087        0.60x
=================  ============  ============  ============  ===========  ==========

(speed-up: HiGHS over flow + potentials, median; at best 0.82x and 0.84x). The flow is exact:
its bound within 15 ppb below HiGHS's optimum and the recovered durations' objective within 7
ppb of it, their makespan within the deadline (at 16 x 32 with ``--blocking-power-w 70``: 19
ppb). Also tried on GPT-3 A40 at 16 x 128, d = 2%: time units of 1 ns to 10 us, flow units of
1e-7 to 1e-3 of the largest slope, the uncapacitated arcs at 2^50 or 4x the total capacity
(0.64-0.83 s); the relaxation's own optimal prices (0.65 s; 0.50 s with ``B`` as supplies
instead of an arc); HiGHS on the flow problem itself, arcs as columns (3.5 s dual, 5.2 s primal
simplex). OR-Tools' cost scaling is no faster than HiGHS's dual simplex here, so the planner
does not use it.
``pip install ortools`` to run it (not an opdvfs dependency).

    .venv/bin/python benchmarks/relaxation_flow.py [--stages 16] [--microbatches 128]
        [--targets 0,0.02,0.05,0.1] [--data perseus-gpt3-175b-a40,perseus-bloom-a100]
        [--blocking-power-w 0]
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import bellman_ford

from opdvfs.plan._dag_lp import _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _deadline, _Options
from pipeline_planning import scale_problem, show
from relaxation_at_scale import case_parser, each_case

#: Integer units of the flow problem: seconds per cost unit, and share of the largest slope
#: (W) per flow unit.
_TIME_UNIT_S, _FLOW_SHARE = 1e-9, 1e-7


class FlowRelaxation:
    """The relaxation's dual min-cost circulation, solved by OR-Tools (see the docstring)."""

    def __init__(self, problem: DagProblem, hull: _Options, deadline_s: float) -> None:
        from ortools.graph.python import min_cost_flow

        n = problem.n_nodes
        self.problem, self.hull, self.deadline_s, self.n = problem, hull, deadline_s, n
        t, c, valid = hull.time_s, hull.cost_j, hull.valid
        width = valid.shape[1]
        with np.errstate(invalid="ignore", divide="ignore"):  # padding
            slope = -(c[:, 1:] - c[:, :-1]) / (t[:, 1:] - t[:, :-1])  # u_1..u_{k-1} (W)
        slope = np.where(valid[:, 1:], slope, 0.0)
        self.block_w = problem.n_ranks * problem.blocking_power_w
        self.flow_unit_w = max(float(slope.max(initial=0.0)), self.block_w, 1.0) * _FLOW_SHARE
        u = np.round(slope / self.flow_unit_w).astype(np.int64)
        padded = np.c_[np.zeros((n, 1), np.int64), u, np.zeros((n, 1), np.int64)]
        band = padded[:, :width] - padded[:, 1 : width + 1]  # option k: u_k - u_{k+1}
        node, slot = np.nonzero(valid)
        self.big = np.int64(1) << 50
        cap = np.where(slot == 0, self.big, band[node, slot])
        used = cap > 0
        node, slot, cap = node[used], slot[used], cap[used]
        ticks = np.round(np.where(valid, t, 0.0) / _TIME_UNIT_S).astype(np.int64)
        src, dst = problem.edges[:, 0], problem.edges[:, 1]
        sources = np.flatnonzero(np.bincount(dst, minlength=n) == 0)
        sinks = np.flatnonzero(np.bincount(src, minlength=n) == 0)
        s_of, e_of = 2 + np.arange(n), 2 + n + np.arange(n)  # O = 0, M = 1
        zeros = np.zeros(len(src) + len(sources) + len(sinks), np.int64)
        self.tails = np.r_[s_of[node], e_of[src], np.zeros(len(sources), int), e_of[sinks], 1, 1]
        self.heads = np.r_[e_of[node], s_of[dst], s_of[sources], np.ones(len(sinks), int), 0, 0]
        self.caps = np.r_[cap, zeros + self.big, round(self.block_w / self.flow_unit_w), self.big]
        deadline_ticks = int(np.floor(deadline_s / _TIME_UNIT_S))
        self.costs = np.r_[-ticks[node, slot], zeros, 0, deadline_ticks]
        self.n_band = len(node)
        self.band_node = node
        self.slowest_ticks = ticks[np.arange(n), valid.sum(axis=1) - 1]
        self.min_cost_flow = min_cost_flow

    def solve(self, start_s: np.ndarray | None = None) -> np.ndarray:
        """Return the optimal flow on every arc (integer units).

        ``start_s`` (each node's start, s) and the stretched durations (:meth:`stretched_s`)
        give the solver prices to start from: the arcs' costs reduced by those potentials
        (the same optimal flows; OR-Tools takes no prices).
        """
        costs = self.costs
        if start_s is not None:
            duration_s = self.stretched_s()
            potential = np.r_[0.0, self.deadline_s, start_s, start_s + duration_s]
            ticks = np.round(potential / _TIME_UNIT_S).astype(np.int64)
            costs = costs - ticks[self.tails] + ticks[self.heads]
        solver = self.min_cost_flow.SimpleMinCostFlow()
        solver.add_arcs_with_capacity_and_unit_cost(self.tails, self.heads, self.caps, costs)
        status = solver.solve()
        if status != solver.OPTIMAL:
            raise RuntimeError(f"min-cost flow: {status}")
        return np.asarray(solver.flows(np.arange(len(self.tails))))

    def stretched_s(self) -> np.ndarray:
        """Each node's all-max time stretched by the deadline over the all-max makespan (s)."""
        top = self.problem.top_clock()
        rows = np.arange(self.n)
        top_s = self.problem.time_s[rows, top]
        stretch = self.deadline_s / float(self.problem.evaluate(top)[0])
        slowest = self.hull.time_s[rows, self.hull.valid.sum(axis=1) - 1]
        return np.clip(top_s * stretch, self.hull.time_s[:, 0], slowest)

    def bound_j(self, flow: np.ndarray) -> float:
        """Return the dual value of ``flow`` on the exact data: a lower bound (J)."""
        g = np.bincount(self.band_node, weights=flow[: self.n_band], minlength=self.n)
        g_w = g * self.flow_unit_w
        t = np.where(self.hull.valid, self.hull.time_s, 0.0)
        c = np.where(self.hull.valid, self.hull.cost_j, np.inf)
        h = (c + g_w[:, None] * t).min(axis=1)
        # the flow back M -> O past B (exact B: its arc's capacity is rounded)
        over_w = max((flow[-2] + flow[-1]) * self.flow_unit_w - self.block_w, 0.0)
        return float(h.sum() - self.deadline_s * over_w)

    def cost_j(self, duration_s: np.ndarray) -> tuple[float, float]:
        """Return the relaxation's objective at ``duration_s`` (J) and its makespan (s)."""
        t = np.where(self.hull.valid, self.hull.time_s, np.inf)
        c = np.where(self.hull.valid, self.hull.cost_j, np.nan)
        k = np.clip((t <= duration_s[:, None]).sum(axis=1), 1, max(t.shape[1] - 1, 1))
        rows = np.arange(self.n)
        lo, hi = t[rows, k - 1], np.where(np.isfinite(t[rows, k]), t[rows, k], t[rows, k - 1])
        share = np.where(hi > lo, (duration_s - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
        c_hi = np.where(np.isfinite(t[rows, k]), c[rows, k], c[rows, k - 1])
        cost = c[rows, k - 1] + share * (c_hi - c[rows, k - 1])
        makespan = float((self.problem._passes.heads(duration_s) + duration_s).max())
        return float(cost.sum() + self.block_w * makespan), makespan

    def durations_s(self, flow: np.ndarray) -> np.ndarray:
        """Return each node's duration (s): potentials on the residual graph of ``flow``."""
        forward, backward = flow < self.caps, flow > 0
        s_of, e_of = 2 + np.arange(self.n), 2 + self.n + np.arange(self.n)
        a = np.r_[self.tails[forward], self.heads[backward], e_of]
        b = np.r_[self.heads[forward], self.tails[backward], s_of]
        w = np.r_[self.costs[forward], -self.costs[backward], self.slowest_ticks].astype(float)
        order = np.lexsort((w, b, a))  # the cheapest of parallel arcs
        a, b, w = a[order], b[order], w[order]
        first = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])]
        size = 2 * self.n + 2
        # SciPy drops explicit zeros of a sparse matrix: a tiny weight stands for 0
        weight = np.where(w[first] == 0, 1e-300, w[first])
        graph = csr_matrix((weight, (a[first], b[first])), shape=(size, size))
        distance = bellman_ford(graph, indices=0)
        return (distance[s_of] - distance[e_of]) * _TIME_UNIT_S


def cpu(call, *args):
    """Return ``call(*args)`` and the CPU seconds of this thread it took."""
    started = time.thread_time()
    got = call(*args)
    return got, time.thread_time() - started


def case(
    name: str, stages: int, microbatches: int, target: float, blocking_power_w: float = 0.0
) -> dict:
    """Solve one instance's relaxation both ways (see the module's docstring)."""
    problem = replace(scale_problem(name, stages, microbatches), blocking_power_w=blocking_power_w)
    deadline, _ = _deadline(problem, target)
    deadline *= 1 + _TIME_RTOL
    options = _Options.build(problem)
    hull = options.hull()
    programme = _Programme(problem, hull, nested=False, round_to=options)
    programme.h.setOptionValue("presolve", "off")
    programme.set_deadline(deadline)
    programme.start_slowest()
    relaxed, highs_s = cpu(programme.relax)
    assert relaxed is not None
    optimum_j, duration_s = relaxed
    started = time.thread_time()
    flow_problem = FlowRelaxation(problem, hull, deadline)
    flow = flow_problem.solve()
    flow_s = time.thread_time() - started
    recovered, potentials_s = cpu(flow_problem.durations_s, flow)
    started = time.thread_time()
    priced = flow_problem.solve(problem._passes.heads(flow_problem.stretched_s()))
    priced_s = time.thread_time() - started
    return {
        "data": name.removeprefix("perseus-"),
        "stages": stages,
        "d %": target * 100,
        "highs s": highs_s,
        "flow s": flow_s,
        "potentials s": potentials_s,
        "speed-up": highs_s / (flow_s + potentials_s),
        "priced s": priced_s,
        "priced ppb": (flow_problem.bound_j(priced) / optimum_j - 1) * 1e9,
        "bound ppb": (flow_problem.bound_j(flow) / optimum_j - 1) * 1e9,
        "primal ppb": (flow_problem.cost_j(recovered)[0] / optimum_j - 1) * 1e9,
        "late ppb": (flow_problem.cost_j(recovered)[1] / deadline - 1) * 1e9,
        "durations ms": float(np.abs(recovered - duration_s).max() * 1e3),
    }


def main() -> None:
    parser = case_parser(__doc__)
    parser.add_argument("--blocking-power-w", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import ortools  # noqa: F401
    except ImportError:
        sys.exit("relaxation_flow.py: needs OR-Tools (pip install ortools)")
    rows = []
    for name, target in each_case(args, "CPU s of one thread"):
        rows.append(case(name, args.stages, args.microbatches, target, args.blocking_power_w))
        print(show(pd.DataFrame(rows[-1:])), flush=True)
    table = pd.DataFrame(rows)
    print(show(table))
    print(
        f"HiGHS {table['highs s'].median():.3f} s median (worst {table['highs s'].max():.3f}); "
        f"flow {table['flow s'].median():.3f} s (worst {table['flow s'].max():.3f}) + "
        f"potentials {table['potentials s'].median():.3f} s; from prices "
        f"{table['priced s'].median():.3f} s (worst {table['priced s'].max():.3f}); speed-up "
        f"{table['speed-up'].median():.2f}x median (best {table['speed-up'].max():.2f}); bound and "
        f"primal within {table[['bound ppb', 'primal ppb']].abs().max().max():.1f} ppb of "
        f"HiGHS's optimum; load average now "
        f"{os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
