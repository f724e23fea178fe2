"""How far a stronger relaxation closes the pipeline planner's bound gap (issue 20).

:func:`opdvfs.plan.dag.solve_dag` certifies its plans with the linear relaxation of its 0/1
programme (each instruction's options relaxed to their lower convex hull) and, given time, with
HiGHS's branch and bound. On the hard Perseus instances (A40 and BLOOM at d = 0-2%) the root
relaxation sits 0.1-0.2% below the optimum, so a 0.1% certificate needs seconds of branch and
bound. This script measures one candidate that was not in the planner: a Dantzig-Wolfe bound
over the ranks. Each rank's chain of instructions (its own order, its earliest starts and latest
ends from the graph at the fastest options) is kept integral; the edges between ranks are
priced by column generation (a master LP over convex combinations of whole rank schedules,
each rank's pricing problem a small exact MILP solved by HiGHS). Its value is the best
Lagrangian bound seen, valid at every iteration:

    L(pi) = sum over ranks of min over the rank's integral schedules of
            [energy + sum over its cross edges e of pi_e x (sender's end - receiver's start)]

It prints, per instance, the root relaxation, the Dantzig-Wolfe bound, the best plan and bound
from ``--exact-seconds`` of :func:`solve_dag`, and the share of the gap from the root to the best
plan that the new bound closes.
Blocking power 0 W (the benchmark's default energy). Minutes per instance: a measurement of
strength, not of speed.

    .venv/bin/python benchmarks/pipeline_bounds.py [--exact-seconds 60]
        [--instances perseus-gpt3-175b-a40:0,perseus-gpt3-175b-a40:0.02]
"""

from __future__ import annotations

import argparse
import time

import highspy
import numpy as np
import pandas as pd

from opdvfs.datasets import dataset_path
from opdvfs.io import read_profile
from opdvfs.plan.dag import DagProblem, solve_dag
from opdvfs.plan.pipeline import pipeline_dag

DEFAULT_INSTANCES = (
    "perseus-gpt3-175b-a40:0",
    "perseus-gpt3-175b-a40:0.02",
    "perseus-bloom-a100:0",
    "perseus-bloom-a100:0.02",
    "perseus-bloom-a40:0",
)
INF = highspy.kHighsInf


def _highs() -> highspy.Highs:
    h = getattr(highspy, "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    return h


class RankPricing:
    """One rank's pricing problem: its chain of instructions as a small exact MILP (times in ms).

    Variables: a one-hot option per instruction and its start. Rows: one option each; the
    rank's own order; every start at or after its earliest start and every end at or before
    the deadline minus its shortest tail (both from the graph at the fastest options: valid
    for every plan, and what makes the relaxation of the other ranks' timing useful).
    """

    def __init__(self, problem: DagProblem, rank: int, deadline_s: float) -> None:
        self.nodes = np.flatnonzero(problem.rank == rank)
        t_ms = np.where(np.isnan(problem.time_s), np.inf, problem.time_s)[self.nodes] * 1e3
        fastest = np.nanmin(problem.time_s, axis=1)
        head = problem._passes.heads(fastest)[self.nodes] * 1e3
        tail = problem._passes.tails(fastest)[self.nodes] * 1e3
        owner, clock = np.nonzero(np.isfinite(t_ms))
        self.owner, self.clock = owner, clock
        self.t_ms = t_ms[owner, clock]
        self.energy_j = problem.energy_j[self.nodes][owner, clock]
        m, nx = self.nodes.size, owner.size
        self.nx, self.m = nx, m
        h = _highs()
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.addVars(nx + m, np.r_[np.zeros(nx), head], np.r_[np.ones(nx), np.full(m, INF)])
        h.changeColsIntegrality(
            nx, np.arange(nx, dtype=np.int32), np.full(nx, highspy.HighsVarType.kInteger)
        )
        for j in range(m):  # a few dozen rows: a loop is clear and costs nothing here
            opts = np.flatnonzero(owner == j).astype(np.int32)
            h.addRow(1.0, 1.0, opts.size, opts, np.ones(opts.size))
            idx = np.r_[opts, nx + j].astype(np.int32)
            h.addRow(-INF, deadline_s * 1e3 - tail[j], idx.size, idx, np.r_[self.t_ms[opts], 1.0])
            if j + 1 < m:  # start[j + 1] - start[j] - duration[j] >= 0
                idx = np.r_[opts, nx + j, nx + j + 1].astype(np.int32)
                h.addRow(0.0, INF, idx.size, idx, np.r_[-self.t_ms[opts], -1.0, 1.0])
        self.h = h

    def solve(self, out_w: np.ndarray, in_w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Price the rank: its optimum, and its schedule's starts and durations (ms)."""
        send, recv = out_w[self.nodes], in_w[self.nodes]
        cost = np.r_[self.energy_j + send[self.owner] * self.t_ms, send - recv]
        self.h.changeColsCost(cost.size, np.arange(cost.size, dtype=np.int32), cost)
        self.h.run()
        x = np.asarray(self.h.getSolution().col_value)
        duration = np.bincount(self.owner, weights=x[: self.nx] * self.t_ms, minlength=self.m)
        return float(self.h.getInfo().mip_dual_bound), x[self.nx :], duration


def dantzig_wolfe_bound(
    problem: DagProblem, deadline_s: float, seed_clocks: list[np.ndarray], max_iterations: int
) -> tuple[float, int]:
    """Column generation over rank schedules; the best Lagrangian bound and the iterations."""
    edges = problem.edges
    cross = np.flatnonzero(problem.rank[edges[:, 0]] != problem.rank[edges[:, 1]])
    src, dst = edges[cross, 0], edges[cross, 1]
    n_ranks, n = problem.n_ranks, problem.n_nodes
    pricing = [RankPricing(problem, r, deadline_s) for r in range(n_ranks)]
    master = _highs()
    nc = cross.size
    empty_i, empty_v = np.array([], dtype=np.int32), np.array([])
    master.addRows(nc, np.full(nc, -INF), np.zeros(nc), 0, empty_i, empty_i, empty_v)
    master.addRows(n_ranks, np.ones(n_ranks), np.ones(n_ranks), 0, empty_i, empty_i, empty_v)

    def add_column(rank: int, start_ms: np.ndarray, duration_ms: np.ndarray, energy: float) -> None:
        # the rank's share of each cross edge's row: its sends' ends, minus its receives' starts
        coef = np.where(problem.rank[src] == rank, start_ms[src] + duration_ms[src], 0.0)
        coef -= np.where(problem.rank[dst] == rank, start_ms[dst], 0.0)
        nz = np.flatnonzero(coef)
        idx = np.r_[nz, nc + rank].astype(np.int32)
        master.addCol(energy, 0.0, INF, idx.size, idx, np.r_[coef[nz], 1.0])

    rows = np.arange(n)
    for clock in seed_clocks:  # feasible plans: the master starts feasible
        duration = problem.time_s[rows, clock] * 1e3
        start = problem._passes.heads(duration)
        energy = problem.energy_j[rows, clock]
        for r in range(n_ranks):
            add_column(r, start, duration, float(energy[problem.rank == r].sum()))
    best, iteration = -np.inf, 0
    while iteration < max_iterations:
        iteration += 1
        master.run()
        dual = np.asarray(master.getSolution().row_dual)
        price = np.maximum(-dual[:nc], 0.0)  # "<= 0" rows of a minimisation: duals <= 0
        convexity = dual[nc:]
        out_w = np.bincount(src, weights=price, minlength=n)
        in_w = np.bincount(dst, weights=price, minlength=n)
        total, added = 0.0, 0
        for r, rank in enumerate(pricing):
            value, start_r, duration_r = rank.solve(out_w, in_w)
            total += value
            if value - convexity[r] < -1e-6:
                start, duration = np.zeros(n), np.zeros(n)
                start[rank.nodes], duration[rank.nodes] = start_r, duration_r
                # the column's energy: the options its durations are (snapped to the table)
                t_ms = problem.time_s[rank.nodes] * 1e3
                pick = np.nanargmin(np.abs(t_ms - duration_r[:, None]), axis=1)
                energy = float(problem.energy_j[rank.nodes, pick].sum())
                add_column(r, start, duration, energy)
                added += 1
        best = max(best, total)
        if not added:
            break
    return best, iteration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exact-seconds", type=float, default=60.0)
    parser.add_argument("--max-iterations", type=int, default=400)
    parser.add_argument("--instances", default=",".join(DEFAULT_INSTANCES))
    args = parser.parse_args()
    rows = []
    for item in args.instances.split(","):
        name, d = item.rsplit(":", 1)
        problem = pipeline_dag(read_profile([dataset_path(name)]), 8)
        target = float(d)
        root = solve_dag(problem, target, time_limit_s=0.0)  # the rounded relaxation, its bound
        best = solve_dag(problem, target, rel_gap=1e-5, time_limit_s=args.exact_seconds)
        started = time.perf_counter()
        bound, iterations = dantzig_wolfe_bound(
            problem, best.deadline_s, [problem.top_clock(), best.clock], args.max_iterations
        )
        seconds = time.perf_counter() - started
        rows.append(
            {
                "instance": f"{name.removeprefix('perseus-')} d={target:.0%}",
                "root LP J": root.lower_bound_j,
                "Dantzig-Wolfe J": bound,
                "best bound J": best.lower_bound_j,
                "best plan J": best.energy_j,
                # of the gap from the root to the best plan (the optimum lies in it)
                "root gap closed %": (bound - root.lower_bound_j)
                / (best.energy_j - root.lower_bound_j)
                * 100,
                "0.1% needs J": best.energy_j / 1.001,
                "DW s": seconds,
                "DW iterations": iterations,
            }
        )
        print(pd.DataFrame(rows[-1:]).to_string(index=False, float_format="%.3f"), flush=True)
    print()
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))


if __name__ == "__main__":
    main()
