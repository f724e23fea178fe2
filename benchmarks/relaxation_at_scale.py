"""What limits the pipeline planner at 128 microbatches x 16 stages: the relaxation or the plan.

:func:`opdvfs.plan.dag.solve_dag` plans a graph of 2048 instructions or more from the linear
relaxation on each instruction's convex-hull options (HiGHS's dual simplex from the all-slowest
basis), a rounding of it (plain, or rolling in time order) and a greedy pass
(:mod:`opdvfs.plan.dag`'s "Large graphs"). Issue 35 asks for a plan within 0.5% of its own
certified bound in under a second; this script measures, per Perseus file, stage count and
deadline d, each ingredient on its own, to the end (no time limit), in CPU seconds of this
thread:

- ``lp s``, ``lp it``: the relaxation, and its simplex iterations;
- ``bound -% at 30/50/70%``: the certified bound of the relaxation stopped after that share of
  its iterations (:meth:`~opdvfs.plan._dag_lp._Programme.dual_bound`, the Lagrangian of its
  duals so far), % below the optimum;
- ``warm +0.5% it``, ``warm +2% it``: iterations to re-solve from the optimal basis at a
  deadline looser by 0.5 and 2 points (a frontier's warm start);
- ``quarter lp s``: the relaxation of the same pipeline at a quarter of the microbatches (a
  smaller first model);
- ``rank chains -%``: a decomposition per stage, the relaxation that keeps only each rank's
  own chain, between its earliest start and latest end at the fastest options (a valid
  lower bound), % below the relaxation;
- ``rolled %``, ``plain %``, ``stopped %``: plans after the batched greedy pass, % above the
  relaxation: rolled in time order (:meth:`~opdvfs.plan._dag_lp._Programme.roll`), each node
  rounded down alone, and the iterate of the relaxation stopped at 50% scaled into the
  deadline; ``rolled s``, ``greedy s`` their CPU seconds.

The relaxation's optimum is a lower bound on every plan, so ``rolled %`` and ``plain %`` are
upper limits on what rounding it reaches before any search. Every run uses the problem as
``benchmarks/pipeline_planning.py --scale`` builds it (16 stages: each Perseus stage split in two).

    .venv/bin/python benchmarks/relaxation_at_scale.py [--stages 16] [--microbatches 128]
        [--targets 0,0.02,0.05,0.1] [--data perseus-gpt3-175b-a40,perseus-bloom-a100]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator

import highspy
import numpy as np
import pandas as pd

from opdvfs.datasets import DATASETS
from opdvfs.plan._dag_lp import _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _deadline, _Options
from opdvfs.plan._dag_search import _greedy_fill
from opdvfs.plan.dag import _scaled_iterate
from pipeline_planning import TARGETS, scale_problem, show


def relaxation(problem: DagProblem, deadline_s: float) -> tuple[_Options, _Programme]:
    """Return the planner's relaxation of ``problem`` at ``deadline_s``, all-slowest basis."""
    options = _Options.build(problem)
    programme = _Programme(problem, options.hull(), nested=False, round_to=options)
    programme.h.setOptionValue("presolve", "off")
    programme.set_deadline(deadline_s * (1 + _TIME_RTOL))
    programme.start_slowest()
    return options, programme


def cpu(call, *args):
    """Return ``call(*args)`` and the CPU seconds of this thread it took."""
    started = time.thread_time()
    got = call(*args)
    return got, time.thread_time() - started


def rank_chain_bound(problem: DagProblem, programme: _Programme) -> float:
    """Return the relaxation keeping only each rank's chain, at the programme's deadline (J).

    Rank r's instructions run one after another between the earliest start of its first and
    the latest end of its last (the rest of the graph at its fastest options): one row each,
    sum of its durations <= deadline - that head - that tail. Every plan within the deadline
    meets these rows, so their relaxation's optimum is a lower bound.
    """
    fast_s = programme.fastest_ms / 1e3
    head = problem._passes.heads(fast_s) * 1e3
    tail = problem._passes.tails(fast_s) * 1e3
    deadline_ms = programme.h.getLp().col_upper_[programme.makespan_col]
    ranks = np.unique(problem.rank[problem.rank >= 0])
    on = problem.rank[None, :] == ranks[:, None]  # (ranks, nodes)
    first = np.where(on, head, np.inf).argmin(axis=1)
    last = np.where(on, head, -np.inf).argmax(axis=1)
    room = deadline_ms - head[first] - tail[last] - on.astype(float) @ programme.fastest_ms
    h = getattr(highspy, "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    nx = programme.nx
    cost = np.asarray(programme.h.getLp().col_cost_)[:nx]
    h.addVars(nx, np.zeros(nx), np.ones(nx))
    h.changeColsCost(nx, np.arange(nx, dtype=np.int32), cost)
    h.changeObjectiveOffset(float(programme.options.cost_j[:, 0].sum()))
    row, col = np.nonzero(on[:, programme.node_of])
    starts = np.searchsorted(row, np.arange(len(ranks))).astype(np.int32)
    h.addRows(
        len(ranks),
        np.full(len(ranks), -highspy.kHighsInf),
        room,
        len(col),
        starts,
        col.astype(np.int32),
        programme.step_ms[col],
    )
    h.run()
    return float(h.getInfo().objective_function_value)


def case(name: str, stages: int, microbatches: int, target: float) -> dict:
    """Measure every ingredient on one instance (see the module's docstring)."""
    problem = scale_problem(name, stages, microbatches)
    rows = np.arange(problem.n_nodes)
    deadline, _ = _deadline(problem, target)
    options, programme = relaxation(problem, deadline)
    (optimum_j, _), lp_s = cpu(programme.relax)
    iterations = int(programme.h.getInfo().simplex_iteration_count)

    def above(slot: np.ndarray) -> float:
        makespan, energy, _ = problem.evaluate(options.clock[rows, slot])
        assert makespan <= deadline * (1 + 1e-6), "a plan past its deadline"
        return (float(energy) / optimum_j - 1) * 100

    row: dict = {
        "data": name.removeprefix("perseus-"),
        "stages": stages,
        "d %": target * 100,
        "lp s": lp_s,
        "lp it": iterations,
    }
    stopped_at_half = None
    for share in (0.3, 0.5, 0.7):
        _, stopped = relaxation(problem, deadline)
        stopped.h.setOptionValue("simplex_iteration_limit", max(int(share * iterations), 1))
        stopped.h.run()
        row[f"bound -% at {share:.0%}"] = (1 - stopped.dual_bound() / optimum_j) * 100
        if share == 0.5:
            stopped_at_half = stopped.durations_now()
    for looser in (0.005, 0.02):
        programme.set_deadline(deadline * (1 + looser / (1 + target)) * (1 + _TIME_RTOL))
        programme.relax()
        row[f"warm +{looser:.1%} it"] = int(programme.h.getInfo().simplex_iteration_count)
        programme.set_deadline(deadline * (1 + _TIME_RTOL))
        programme.relax()
    quarter = scale_problem(name, stages, max(microbatches // 4, 1))
    _, small = relaxation(quarter, _deadline(quarter, target)[0])
    row["quarter lp s"] = cpu(small.relax)[1]
    row["rank chains -%"] = (1 - rank_chain_bound(problem, programme) / optimum_j) * 100
    plain = programme.round_down(np.asarray(programme.h.getSolution().col_value[: programme.nx]))
    rolled, row["rolled s"] = cpu(programme.roll, np.inf)
    scaled = _scaled_iterate(problem, options, stopped_at_half, deadline)
    for label, start in (("rolled", rolled), ("plain", plain), ("stopped", scaled)):
        filled, greedy_s = cpu(
            lambda s: _greedy_fill(problem, options, s, deadline, batched=True), start
        )
        row[f"{label} %"] = above(filled)
        if label == "rolled":
            row["greedy s"] = greedy_s
    return row


def case_parser(doc: str) -> argparse.ArgumentParser:
    """Return the arguments of the relaxation_*.py benchmarks: the graphs and deadlines."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--stages", type=int, default=16, choices=(8, 16))
    parser.add_argument("--microbatches", type=int, default=128)
    parser.add_argument("--targets", default=",".join(f"{d:g}" for d in TARGETS))
    parser.add_argument("--data", default=",".join(n for n in DATASETS if n.startswith("perseus-")))
    return parser


def each_case(args: argparse.Namespace, what: str) -> Iterator[tuple[str, float]]:
    """Print the run's header (``what`` its clock); yield each (Perseus file, target)."""
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    print(
        f"{args.stages} stages x {args.microbatches} microbatches; {what}; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    for name in args.data.split(","):
        for target in (float(v) for v in args.targets.split(",")):
            yield name, target


def main() -> None:
    args = case_parser(__doc__).parse_args()
    rows = []
    for name, target in each_case(args, "CPU s of one thread, each step to the end"):
        rows.append(case(name, args.stages, args.microbatches, target))
        print(show(pd.DataFrame(rows[-1:])), flush=True)
    table = pd.DataFrame(rows)
    print(show(table))
    print(
        f"relaxation {table['lp s'].median():.3f} s median (worst {table['lp s'].max():.3f}); "
        f"bound at 50% of its iterations {table['bound -% at 50%'].median():.3f}% below "
        f"(worst {table['bound -% at 50%'].max():.3f}); rolled + greedy "
        f"{table['rolled %'].median():.3f}% above the relaxation (worst "
        f"{table['rolled %'].max():.3f}, within 0.5% in {(table['rolled %'] <= 0.5).sum()} of "
        f"{len(table)}), plain + greedy {table['plain %'].median():.3f}% (within 0.5% in "
        f"{(table['plain %'] <= 0.5).sum()}); rank chains {table['rank chains -%'].median():.2f}%"
        f" below; load average now {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
