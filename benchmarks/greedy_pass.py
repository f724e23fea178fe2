"""The DAG planner's batched greedy pass at 128 microbatches, against another checkout's.

:func:`opdvfs.plan._dag_search._greedy_fill` (``batched=True``) spends the slack of a large
graph's rounded relaxation (:mod:`opdvfs.plan.dag`'s "Large graphs"). For each case this
script solves the relaxation once, rounds it two ways (each node down alone, and rolled in
time order), and runs this checkout's greedy pass and the one of ``--against`` (another
checkout's ``src``) on the same starts, alternately, ``--repeats`` times each, in this
process: their CPU seconds (median) and the plans' energy above the relaxation. Run both in
one process so that the load is the same for both.

    .venv/bin/python benchmarks/greedy_pass.py --against /work/main/src
        [--cases perseus-gpt3-175b-a100:16:128:0.02,perseus-gpt3-175b-a40:8:128:0]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import numpy as np

from opdvfs.plan import _dag_search
from opdvfs.plan._dag_lp import _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, _deadline, _Options
from pipeline_planning import scale_problem

CASES = (
    "perseus-gpt3-175b-a100:16:128:0.02,perseus-gpt3-175b-a40:8:128:0,"
    "perseus-bloom-a40:16:128:0.02,perseus-bloom-a100:8:128:0.05,perseus-gpt3-175b-a40:16:128:0"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout's src")
    parser.add_argument("--cases", default=CASES, help="file:stages:microbatches:d, ...")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = args.against / "opdvfs" / "plan" / "_dag_search.py"
    spec = importlib.util.spec_from_file_location("other_dag_search", path)
    assert spec is not None
    assert spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    passes = {"other": other._greedy_fill, "this": _dag_search._greedy_fill}
    total = dict.fromkeys(passes, 0.0)
    print(f"load average {os.getloadavg()[0]:.2f}; CPU s of this thread, median of {args.repeats}")
    for case in args.cases.split(","):
        name, stages, microbatches, d = case.split(":")
        problem = scale_problem(name, int(stages), int(microbatches))
        deadline, _ = _deadline(problem, float(d))
        options = _Options.build(problem)
        relaxation = _Programme(problem, options.hull(), nested=False, round_to=options)
        relaxation.h.setOptionValue("presolve", "off")
        relaxation.set_deadline(deadline * (1 + _TIME_RTOL))
        relaxation.start_slowest()
        bound_j, _ = relaxation.relax()
        rows = np.arange(problem.n_nodes)
        y = np.asarray(relaxation.h.getSolution().col_value[: relaxation.nx])
        starts = {"plain": relaxation.round_down(y), "rolled": relaxation.roll(np.inf)}
        line = [f"{name.removeprefix('perseus-')} {stages} x {microbatches} d = {float(d):g}:"]
        for label, start in starts.items():
            seconds: dict[str, list[float]] = {tag: [] for tag in passes}
            above: dict[str, float] = {}
            for _ in range(args.repeats):
                for tag, fill in passes.items():
                    began = time.thread_time()
                    slot = fill(problem, options, start, deadline, batched=True)
                    seconds[tag].append(time.thread_time() - began)
                    makespan, energy, _ = problem.evaluate(options.clock[rows, slot])
                    assert makespan <= deadline * (1 + 1e-6), "a plan past its deadline"
                    above[tag] = (float(energy) / bound_j - 1) * 100
            for tag in passes:
                total[tag] += float(np.median(seconds[tag]))
            line.append(
                f"{label}: other {above['other']:.3f}% {np.median(seconds['other']):.3f} s, "
                f"this {above['this']:.3f}% {np.median(seconds['this']):.3f} s;"
            )
        print(" ".join(line), flush=True)
    print(
        f"total CPU s: other {total['other']:.3f}, this {total['this']:.3f} "
        f"({(1 - total['this'] / total['other']) * 100:.0f}% less); load average now "
        f"{os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
