"""A 16 x 128 pipeline's plan from a smaller pipeline's relaxation, when the large one runs out.

Where the large graph's relaxation does not finish in the budget (4-5 of 16 cases at 16 x 128
and 0.85 s), :func:`opdvfs.plan.dag._first_plan` returns the interrupted simplex iterate scaled
into the deadline, or the all-max plan stretched, greedy-filled for what is left
(:data:`opdvfs.plan.dag._FALLBACK_S`, 0.08 s): 1.3-6.8% above its certified bound in the
default-budget runs of ``benchmarks/pipeline_planning.py --scale 128 --scale-stages 16``. This
script measures whether the same pipeline with M = 32 or 48 microbatches, solved to
optimality (tenths of a second), gives a closer plan, per Perseus file and deadline d: two
plain mappings (``mid``, ``per``: no), and the plan the planner now makes from a reduced
relaxation of the 32-microbatch pipeline (``steady``: :mod:`opdvfs.plan._dag_steady`). Every
gap is against the large relaxation's optimum (solved here with no limit; the interrupted
duals the planner certifies with are up to 0.24% below it at half its iterations, so a gap
to them is larger by as much). CPU seconds of this process; the planner's clock is its CPU
time (``pipeline_planning.planner_on_cpu_clock``):

- ``lp s``: the large relaxation from the all-slowest basis (the planner's);
- ``now %``: :func:`~opdvfs.plan.dag._first_plan` on the relaxation stopped at half of ``lp
  s``, greedy-filled for 0.08 s (as the planner does); ``dual %``: how far below the optimum
  that stopped relaxation's certified bound is;
- ``mid<M>``: the M-microbatch relaxation at the same relative deadline; each large node given
  its counterpart's relaxed duration (the first M/2 microbatches their own, the last M/2
  theirs shifted, every one between the small pipeline's middle microbatch of the same stage
  and pass: ``relaxation_basis.mapped_basis``'s mapping); scaled into the deadline and
  rounded down (``_scaled_iterate``), then greedy-filled (``_greedy_fill(batched=True)``);
- ``per<M>``: the M-microbatch relaxation with its deadline moved (secant steps, up to 6
  warm re-solves) until its durations so mapped fit the large deadline, rounded in time
  order (``_Programme.roll``) and greedy-filled on the small graph, then mapped as option
  choices: warm-up and cool-down microbatches to their own, the steady state (microbatches
  S-1 .. M-S, where every stage runs one forward and one backward a microbatch) repeated
  with its period, so the small plan's mix of options in step across the stages repeats;
  scaled into the deadline where it misses, then greedy-filled;
- ``steady``: :func:`opdvfs.plan._dag_steady._steady_plan` (M = 2 x stages): the
  32-microbatch relaxation with its middle microbatch's costs weighted by the 97 steady-state
  microbatches it stands for and its makespan plus 96 cycles (each stage's middle forward
  plus backward, the slowest) within the deadline; mapped as ``mid``; rounded down and by
  error diffusion along each stage's pass, each at 29 scale factors, the cheapest that fits
  kept; then greedy-filled;
- ``pre s``: the small pipeline's CPU (its programme, relaxation(s), the mapping; ``per``: its
  rounding too; not the graph's build from the profile); ``+.15 %``: the plan after 0.15 s of
  the large greedy pass; ``conv %``: after the greedy pass to convergence, which took
  ``greedy s``.

16 stages x 128 microbatches, load average 2.2-3.3 on the 2-core machine (``M``: ``mid<M>``,
``P``: ``per<M>``; ``gr s``: ``greedy s``)::

    M = 32
          data d % lp s now % dual % M pre M +.15 M conv M gr s P pre P +.15 P conv P gr s
     gpt3-a100   0 0.92  9.64   0.28  0.09   4.61   0.91   0.85  0.24   3.92   0.77   0.62
     gpt3-a100   2 0.88  3.33   0.34  0.08   4.91   1.18   0.69  0.27   4.11   1.41   0.94
     gpt3-a100   5 0.42  4.71   0.20  0.06   3.94   1.11   0.73  0.27   3.06   1.17   1.25
     gpt3-a100  10 0.31  3.11   0.27  0.05   2.21   0.93   0.88  0.25   2.08   0.60   0.75
      gpt3-a40   0 0.62  9.93   0.55  0.08   2.54   1.00   0.93  0.24   3.17   1.18   0.92
      gpt3-a40   2 0.58  3.40   0.07  0.06   3.89   1.71   0.93  0.26   5.14   1.33   1.50
      gpt3-a40   5 0.26  9.14   0.58  0.05   4.48   1.89   0.90  0.33   4.54   0.96   1.73
      gpt3-a40  10 0.21  0.11   0.02  0.04   0.40   0.17   0.46  0.14   0.07   0.03   0.89
    bloom-a100   0 0.61  3.68   0.04  0.08  10.84   1.69   0.91  0.27  10.64   1.50   1.12
    bloom-a100   2 0.54  4.83   0.55  0.09   8.34   1.56   1.18  0.31   6.86   1.29   1.34
    bloom-a100   5 0.96  3.33   0.20  0.09   6.04   1.49   0.82  0.34   4.29   1.42   1.55
    bloom-a100  10 0.59  0.99   0.01  0.04   4.37   1.16   1.23  0.36   3.49   0.79   1.14
     bloom-a40   0 0.65  8.14   0.70  0.08   8.46   2.00   0.51  0.28   8.46   1.87   0.49
     bloom-a40   2 0.74  5.66   0.18  0.05  10.24   3.16   0.58  0.23   9.44   3.11   0.64
     bloom-a40   5 0.06 13.50   0.98  0.03  10.58   2.29   0.53  0.24   3.05   1.03   0.94
     bloom-a40  10 0.06  0.44   0.02  0.03   1.53   0.59   0.32  0.20   0.47   0.16   1.19
        median     0.59  4.20   0.23  0.06   4.54   1.34   0.84  0.27   4.01   1.17   1.03

    M = 48
          data d % lp s now % dual % M pre M +.15 M conv M gr s P pre P +.15 P conv P gr s
     gpt3-a100   0 0.92  9.64   0.28  0.16   2.29   0.44   0.54  0.43   2.44   0.52   0.78
     gpt3-a100   2 0.88  3.33   0.34  0.15   3.82   1.02   0.70  0.62   3.54   1.27   1.11
     gpt3-a100   5 0.42  4.71   0.20  0.11   2.77   0.84   0.63  0.53   1.66   0.59   0.82
     gpt3-a100  10 0.31  3.11   0.27  0.08   2.10   0.56   0.83  0.33   1.34   0.58   0.62
      gpt3-a40   0 0.62  9.93   0.55  0.14   1.01   0.78   0.94  0.44   2.62   1.08   1.05
      gpt3-a40   2 0.58  3.40   0.07  0.09   4.05   1.15   0.69  0.51   2.69   1.08   1.43
      gpt3-a40   5 0.26  9.14   0.58  0.10   2.54   1.17   0.59  0.46   0.91   0.36   0.78
      gpt3-a40  10 0.21  0.11   0.02  0.07   0.40   0.13   0.42  0.21   0.04   0.02   0.40
    bloom-a100   0 0.61  3.68   0.04  0.12   5.64   0.95   0.89  0.50   6.34   0.94   0.96
    bloom-a100   2 0.54  4.83   0.55  0.15   3.58   0.96   0.66  0.60   4.62   1.07   1.58
    bloom-a100   5 0.96  3.33   0.20  0.14   3.65   1.07   1.07  0.60   2.27   0.57   1.11
    bloom-a100  10 0.59  0.99   0.01  0.10   2.13   0.76   0.44  0.57   1.22   0.55   0.75
     bloom-a40   0 0.65  8.14   0.70  0.14   8.16   1.72   1.01  0.45   7.25   1.30   0.68
     bloom-a40   2 0.74  5.66   0.18  0.09   6.81   3.03   0.65  0.46   1.76   1.13   0.79
     bloom-a40   5 0.06 13.50   0.98  0.06   9.24   1.90   0.69  0.36   0.45   0.14   0.62
     bloom-a40  10 0.06  0.44   0.02  0.05   1.48   0.51   0.27  0.19   0.10   0.05   0.28
        median     0.59  4.20   0.23  0.11   3.17   0.96   0.68  0.46   2.01   0.58   0.79

The plain mappings come within 1% of the optimum in no case within the budget. Where the
relaxation ran out in a default-budget run of ``pipeline_planning.py --scale 128
--scale-limits 2 --repeats 1 --scale-only --scale-stages 16 --cpu-clock`` (GPT-3 A100 at d =
0 and 2%, BLOOM A100 at 5%, BLOOM A40 at 2%: plans 6.79, 1.92, 2.54 and 1.26% above their
bounds), after 0.15 s of the greedy pass they are 2.3-10.2% above the optimum (the best,
``per48``: 2.4, 3.5, 2.3, 1.8%, for 0.43-0.62 s of CPU first); only the greedy pass to
convergence, 0.3-1.6 s of CPU more, brings them to 0.02-3.0%. Why: at 16 stages a 32- or
48-microbatch pipeline is mostly warm-up and cool-down (at M = 32 only microbatches 15 and 16
are in the steady state on every stage), and its optimum gives its middle microbatch slack
that the large pipeline's steady state does not have: its durations so mapped overshoot the
large deadline at the same relative deadline (GPT-3 A100, d = 0 and 2%: by 5.6 and 4.4% at M
= 32, 2.2 and 2.0% at M = 48), at d = 0 with no tighter small deadline to move to; scaled
into the deadline and rounded down node by node, the steady state also loses the mix of hull
options the large optimum runs.

The reduced relaxation (``steady``) fixes the first: its optimum was within 0.03% of the
large relaxation's at M = 32 and 0.01% at M = 48 in all 16 cases, its mapped durations
within 0.3% of the deadline (measured with an earlier revision of this script, load 1.5-1.8),
in 0.04-0.19 s of CPU at M = 32 (0.06-0.35 s at 48). Rounded down alone its plans were
0.1-2.2% above the optimum after 0.15 s of the greedy pass (median 1.16%); by error diffusion
in step by microbatch, 0.01-5.1% (median 0.93%; it overshoots where the two options around
a duration are far apart, hence both roundings). With both, each at 29 factors (the
planner's), load 1.5::

    M = 32, steady
          data d % lp s now % dual % S pre S +.15 S conv S gr s
     gpt3-a100   0 0.71  5.98   0.30  0.11   1.46   0.36   0.56
     gpt3-a100   2 0.70  2.97   0.32  0.11   0.38   0.35   0.20
     gpt3-a100   5 0.32  4.82   0.28  0.10   0.25   0.12   0.23
     gpt3-a100  10 0.25  2.74   0.31  0.09   0.28   0.08   0.22
      gpt3-a40   0 0.50  9.84   0.49  0.11   1.48   1.13   0.67
      gpt3-a40   2 0.44  3.43   0.09  0.10   2.02   1.84   0.42
      gpt3-a40   5 0.21  8.63   0.52  0.09   0.31   0.29   0.28
      gpt3-a40  10 0.17  0.35   0.02  0.07   0.01   0.01   0.10
    bloom-a100   0 0.51  3.65   0.04  0.14   1.39   0.46   0.63
    bloom-a100   2 0.44  4.83   0.52  0.18   1.18   0.46   0.44
    bloom-a100   5 0.76  3.31   0.14  0.18   0.71   0.68   0.30
    bloom-a100  10 0.47  0.95   0.01  0.13   0.65   0.41   0.61
     bloom-a40   0 0.50  8.22   0.73  0.10   0.84   0.73   0.24
     bloom-a40   2 0.59  5.75   0.17  0.11   0.93   0.91   0.21
     bloom-a40   5 0.06 13.00   1.46  0.07   0.31   0.23   0.18
     bloom-a40  10 0.05  1.04   0.03  0.07   0.01   0.01   0.06
        median     0.46  4.24   0.29  0.10   0.68   0.38   0.26

``S pre`` 0.07-0.18 s; after 0.15 s of the greedy pass 0.01-2.0% above the optimum (median
0.68%), in the four cases above 1.46, 0.38, 0.71 and 0.93%. In the planner
(:func:`opdvfs.plan.dag._first_plan`) it runs after the relaxation stops, up to 0.12 s past
the budget, and the cheapest candidate takes the greedy pass until then: see
``docs/guide/pipeline-planning-at-scale.md`` for the planner's figures.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fallback_small_pipeline.py [--stages 16]
        [--microbatches 128] [--smalls 32,48] [--targets 0,0.02,0.05,0.1] [--data ...]
        [--variants mid,per,steady]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from opdvfs.datasets import DATASETS
from opdvfs.plan import dag
from opdvfs.plan._dag_lp import _OutOfTime
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _deadline, _Options
from opdvfs.plan._dag_search import _greedy_fill
from opdvfs.plan._dag_steady import _steady_plan
from pipeline_planning import TARGETS, planner_on_cpu_clock, scale_problem, show
from relaxation_basis import keys, programme

#: CPU seconds of the large greedy pass the planner could still give a mapped plan.
GREEDY_S = 0.15


def counterparts(
    large: DagProblem, small: DagProblem, m_small: int, *, periodic: bool
) -> np.ndarray:
    """Return each large node's counterpart in the small pipeline (see the docstring)."""
    rank, kind, micro = keys(large)
    s_rank, s_kind, s_micro = keys(small)
    index = np.full((rank.max() + 1, 2, m_small), -1)
    index[s_rank, s_kind, s_micro] = np.arange(small.n_nodes)
    m_large = int(micro.max()) + 1
    if periodic:  # the steady state S-1 .. M-S repeated
        first, last = large.n_ranks - 1, m_small - large.n_ranks
        period = last - first + 1
        tail = m_large - (m_small - last)
        inner = first + (micro - first) % period
    else:  # the middle microbatch
        first, tail = m_small // 2, m_large - m_small // 2
        inner = np.full_like(micro, m_small // 2)
    to = np.where(micro < first, micro, np.where(micro >= tail, micro - (m_large - m_small), inner))
    return index[rank, kind, to]


def energy(problem: DagProblem, options: _Options, slot: np.ndarray) -> float:
    """Energy (J) of a plan given as option slots."""
    return float(problem.evaluate(options.clock[np.arange(problem.n_nodes), slot])[1])


def greedy(
    problem: DagProblem, options: _Options, slot: np.ndarray, deadline_s: float
) -> tuple[float, float, float]:
    """Energy after GREEDY_S of the greedy pass, to convergence, and its CPU seconds."""
    short = _greedy_fill(
        problem, options, slot, deadline_s, time.process_time() + GREEDY_S, batched=True
    )
    started = time.process_time()
    full = _greedy_fill(problem, options, slot, deadline_s, batched=True)
    seconds = time.process_time() - started
    makespan = problem.evaluate(options.clock[np.arange(problem.n_nodes), full])[0]
    assert makespan <= deadline_s * (1 + 1e-6), "a mapped plan misses the deadline"
    return energy(problem, options, short), energy(problem, options, full), seconds


def small_plan(
    problem: DagProblem,
    options: _Options,
    name: str,
    m_small: int,
    deadline_s: float,
    variant: str,
) -> tuple[np.ndarray, float]:
    """Return the large plan (option slots) from the small pipeline, and its CPU seconds."""
    started = time.process_time()
    if variant == "steady":  # the planner's (opdvfs.plan._dag_steady), 2 x stages microbatches
        slot = _steady_plan(problem, options, deadline_s, None)
        assert slot is not None, "no steady-state plan"
        return slot, time.process_time() - started
    small = scale_problem(name, problem.n_ranks, m_small)
    started = time.process_time()
    periodic = variant == "per"
    to = counterparts(problem, small, m_small, periodic=periodic)
    base = float(problem.evaluate(problem.top_clock())[0])
    small_s = deadline_s / base * float(small.evaluate(small.top_clock())[0])
    lp = programme(small, small_s)
    lp.start_slowest()
    tried: list[tuple[float, float]] = []
    for _ in range(6 if periodic else 1):
        lp.set_deadline(small_s * (1 + _TIME_RTOL))
        got = lp.relax()
        if got is None:  # too tight: halfway back to the last that held
            small_s = (small_s + tried[-1][0]) / 2 if tried else small_s * 1.01
            continue
        duration = got[1][to]
        late = float((problem._passes.heads(duration) + duration).max())
        tried.append((small_s, late))
        if abs(late / deadline_s - 1) < 2e-4:
            break
        if len(tried) == 1:
            small_s -= late - deadline_s
        else:
            (a0, l0), (a1, l1) = tried[-2:]
            small_s = a1 + (deadline_s - l1) * (a1 - a0) / (l1 - l0) if l1 != l0 else a1
    if periodic:
        small_s = tried[-1][0]
        lp.set_deadline(small_s * (1 + _TIME_RTOL))
        lp.relax()
        s_options = lp.round_to
        s_slot = _greedy_fill(small, s_options, lp.roll(np.inf), small_s, batched=True)
        clock = s_options.clock[np.arange(small.n_nodes), s_slot][to]
        slot = np.argmax(options.clock == clock[:, None], axis=1)
        rows = np.arange(problem.n_nodes)
        if problem.evaluate(options.clock[rows, slot])[0] > deadline_s * (1 + _TIME_RTOL):
            slot = dag._scaled_iterate(problem, options, options.time_s[rows, slot], deadline_s)
    else:
        slot = dag._scaled_iterate(problem, options, duration, deadline_s)
    return slot, time.process_time() - started


def case(
    name: str,
    stages: int,
    microbatches: int,
    target: float,
    smalls: list[int],
    variants: list[str],
) -> dict:
    """One instance: the planner's fallback now and every small-pipeline plan."""
    problem = scale_problem(name, stages, microbatches)
    deadline, top = _deadline(problem, target)
    prepared = dag._prepare(problem)
    options, relaxation = prepared.options, prepared.relaxation
    relaxation.set_deadline(deadline * (1 + _TIME_RTOL))
    relaxation.start_slowest()
    started = time.process_time()
    optimum = relaxation.relax()[0]
    lp_s = time.process_time() - started
    row: dict = {"data": name.removeprefix("perseus-"), "d %": target * 100, "lp s": lp_s}
    prepared = dag._prepare(problem)
    options, stopped = prepared.options, prepared.relaxation
    stopped.set_deadline(deadline * (1 + _TIME_RTOL))
    stopped.start_slowest()
    try:
        stopped.relax(lp_s / 2)
        row["now %"] = row["dual %"] = 0.0  # finished within half its time
    except _OutOfTime:
        now = dag._first_plan(
            problem,
            options,
            top,
            deadline,
            time.process_time(),
            stopped,
            time.process_time() + dag._FALLBACK_S,
        )
        row["now %"] = 100 * (now.energy_j / optimum - 1)
        row["dual %"] = 100 * (1 - now.lower_bound_j / optimum)
    for m_small in smalls:
        for variant in variants:
            if variant == "steady" and m_small != 2 * stages:
                continue
            label = f"{variant}{m_small}"
            slot, pre_s = small_plan(problem, options, name, m_small, deadline, variant)
            short, full, seconds = greedy(problem, options, slot, deadline)
            row[f"{label} pre s"] = pre_s
            row[f"{label} +.15 %"] = 100 * (short / optimum - 1)
            row[f"{label} conv %"] = 100 * (full / optimum - 1)
            row[f"{label} greedy s"] = seconds
    return row


def compact(table: pd.DataFrame, m_small: int, pair: tuple[str, ...]) -> str:
    """Return one or two variants' rows as the docstring's table (each named by its initial)."""
    cols = ["pre s", "+.15 %", "conv %", "greedy s"]
    head = ["data", "d %", "lp s", "now %", "dual %"]
    picked = table[head + [f"{v}{m_small} {c}" for v in pair for c in cols]].copy()
    picked.columns = head + [
        f"{v[0].upper()} {c}" for v in pair for c in ("pre", "+.15", "conv", "gr s")
    ]
    picked["data"] = picked["data"].str.replace("175b-", "")
    median = picked.drop(columns=["data", "d %"]).median()
    median = median.astype(object)
    median["data"], median["d %"] = "median", np.nan
    picked = pd.concat([picked, median.to_frame().T], ignore_index=True)
    picked["d %"] = picked["d %"].map(lambda v: "" if pd.isna(v) else f"{v:g}")
    text = picked.to_string(index=False, float_format=lambda v: f"{v:.2f}")
    return f"M = {m_small}, {' and '.join(pair)}\n{text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=16, choices=(8, 16))
    parser.add_argument("--microbatches", type=int, default=128)
    parser.add_argument("--targets", default=",".join(f"{d:g}" for d in TARGETS))
    parser.add_argument("--data", default=",".join(n for n in DATASETS if n.startswith("perseus-")))
    parser.add_argument("--smalls", default="32,48")
    parser.add_argument("--variants", default="mid,per,steady")
    args = parser.parse_args()
    planner_on_cpu_clock()
    pd.set_option("display.width", 250)
    smalls = [int(v) for v in args.smalls.split(",") if v]
    variants = [v for v in args.variants.split(",") if v]
    print(
        f"{args.stages} stages x {args.microbatches} microbatches; CPU s; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    for name in args.data.split(","):
        for target in (float(v) for v in args.targets.split(",")):
            rows.append(case(name, args.stages, args.microbatches, target, smalls, variants))
            print(show(pd.DataFrame(rows[-1:])), flush=True)
    table = pd.DataFrame(rows)
    for m_small in smalls:
        if {"mid", "per"} <= set(variants):
            print(compact(table, m_small, ("mid", "per")))
    if "steady" in variants:
        print(compact(table, 2 * args.stages, ("steady",)))
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
