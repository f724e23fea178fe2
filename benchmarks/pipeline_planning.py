"""Planning a whole pipeline: Perseus's GPT-3 / BLOOM 1F1B graphs on A100 and A40 (issue 20).

For each Perseus stage profile (the bundled, Apache-2.0 copies in ``opdvfs.datasets``), build
the 1F1B dependency graph of one iteration (8 stages x 8 microbatches = 128 instructions, each
at any measured clock: 38 on A100, 60 on A40) and minimise its energy within a makespan of
(1 + d) x all-max for d in {0, 2, 5, 10}%, on the measured tables:

- ``opdvfs``: :func:`opdvfs.plan.dag.solve_dag` with its default 0.9 s budget and 0.1% target
  gap (relaxation, rounding, neighbourhood search, then HiGHS branch and bound from the best
  plan); its certified gap is against its own lower bound;
- ``exact``: the same 0/1 programme solved by HiGHS to a 1e-6 gap from opdvfs's plan, within
  ``--exact-seconds`` per instance; ``exact bound`` is HiGHS's dual bound, so ``opdvfs - exact``
  is the distance to the best plan known and ``opdvfs - bound`` a certified distance to the
  optimum;
- ``static``: the best single clock for every instruction within the deadline;
- ``all-max``: every instruction at the top clock (the baseline; 0% saving).

The energy is Perseus's effective energy with ``--blocking-power-w`` (0 by default: the
computations' own energy; Perseus's default 70 W charges waiting ranks). ``frontier s`` plans 31
deadlines (d = 0-30%) on one prepared programme.

    .venv/bin/python benchmarks/pipeline_planning.py [--exact-seconds 60] [--blocking-power-w 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from opdvfs.datasets import DATASETS, dataset_path
from opdvfs.io import read_profile
from opdvfs.plan.dag import DagProblem, dag_frontier, solve_dag
from opdvfs.plan.pipeline import pipeline_dag

TARGETS = (0.0, 0.02, 0.05, 0.10)
STAGES_MICROBATCHES = 8
FRONTIER = np.arange(31) / 100


def best_static(problem: DagProblem, deadline_s: float) -> float:
    """Lowest energy of one clock for every node within the deadline (NaN if none fits)."""
    n_clocks = problem.time_s.shape[1]
    plans = np.repeat(np.arange(n_clocks)[:, None], problem.n_nodes, axis=1)
    makespan, energy, _ = problem.evaluate(plans)
    fits = makespan <= deadline_s * (1 + 1e-9)
    return float(energy[fits].min()) if fits.any() else float("nan")


def rows_for(name: str, exact_s: float, blocking_power_w: float) -> tuple[list[dict], dict]:
    """Rows of one Perseus file at every d, and its frontier timing."""
    problem = pipeline_dag(
        read_profile([dataset_path(name)]),
        STAGES_MICROBATCHES,
        blocking_power_w=blocking_power_w,
    )
    base_t, base_e, _ = (float(v) for v in problem.evaluate(problem.top_clock()))
    rows = []
    for d in TARGETS:
        plan = solve_dag(problem, d)
        exact = solve_dag(problem, d, rel_gap=1e-6, time_limit_s=exact_s)
        best = min(exact.energy_j, plan.energy_j)
        bound = max(exact.lower_bound_j, plan.lower_bound_j)
        static = best_static(problem, (1 + d) * base_t)
        rows.append(
            {
                "data": name.removeprefix("perseus-"),
                "d %": d * 100,
                "opdvfs saving %": (1 - plan.energy_j / base_e) * 100,
                "exact saving %": (1 - best / base_e) * 100,
                "static saving %": (1 - static / base_e) * 100,
                "opdvfs - exact %": (plan.energy_j / best - 1) * 100,
                "opdvfs - bound %": (plan.energy_j / bound - 1) * 100,
                "certified gap %": plan.gap_pct,
                "slowdown %": (plan.makespan_s / base_t - 1) * 100,
                "plan s": plan.plan_seconds,
                "exact s": exact.plan_seconds,
                "exact status": exact.status,
            }
        )
    started = time.perf_counter()
    frontier = dag_frontier(problem, FRONTIER)
    seconds = time.perf_counter() - started
    return rows, {
        "data": name.removeprefix("perseus-"),
        "deadlines": len(frontier),
        "frontier s": seconds,
        "worst certified gap %": float(frontier["gap_pct"].max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exact-seconds", type=float, default=60.0)
    parser.add_argument("--blocking-power-w", type=float, default=0.0)
    args = parser.parse_args()
    rows, fronts = [], []
    for name in DATASETS:
        if not name.startswith("perseus-"):
            continue
        got, front = rows_for(name, args.exact_seconds, args.blocking_power_w)
        rows += got
        fronts.append(front)
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    print(
        f"1F1B, {STAGES_MICROBATCHES} stages x {STAGES_MICROBATCHES} microbatches, every "
        f"measured clock; energy = computation + {args.blocking_power_w:g} W x waiting; "
        "savings vs all-max on the measured tables"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print()
    print(pd.DataFrame(fronts).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        f"\nworst: opdvfs - exact {table['opdvfs - exact %'].max():.4f}%, opdvfs - bound "
        f"{table['opdvfs - bound %'].max():.4f}%, certified gap "
        f"{table['certified gap %'].max():.4f}%, slowdown over d "
        f"{(table['slowdown %'] - table['d %']).max():+.5f} points; plan "
        f"{table['plan s'].max():.2f} s (median {table['plan s'].median():.3f} s); "
        f"certified within 0.1% in {(table['certified gap %'] <= 0.1).sum()} of {len(table)}"
    )


if __name__ == "__main__":
    main()
