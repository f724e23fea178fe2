"""A whole pipeline on the twin: gpt3-pp8 planned on every rank's profile, run on every rank (#20).

The simulated GPT-3 175B pipeline (``gpt3-pp8``: TP8 x PP8, 8 stages of 12 layers, 32
microbatches, 1F1B) as a user runs it with the CLI:

1. each rank's workload (``gpt3-pp8@s``) profiled on the twin at every clock
   (``opdvfs profile``, seed 0; ``--iterations`` per clock, the planner takes the medians);
2. the job's graph from the ranks' own sends and receives, planned with the DAG planner at
   each deadline d (``opdvfs plan rank*.parquet --pipeline ranks --target d``), with the
   waiting rank's power either 0 (the computations' energy alone) or the twin's own, measured
   on the all-max run (``--blocking-power-w``);
3. every rank run on the twin under its own schedule, the ranks composed on the graph
   (``opdvfs simulate PIPE.json --workload gpt3-pp8``).

Columns: ``makespan %`` and ``energy %`` measured on the twin against its all-max run;
``predicted %`` the plan's own (on the profiles' measurements, waiting at the blocking power);
``met`` whether the measured makespan is within (1 + d) x all-max.

    .venv/bin/python benchmarks/pipeline_twin.py [--device ascend-910b-like] [--targets 0.02,0.05]
        [--iterations 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opdvfs.experiments.pipeline import layout_of, run_pipeline
from opdvfs.plan.dag import solve_dag
from opdvfs.plan.ranks import rank_schedule, rank_tables
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.library import load_pipeline


def main() -> None:
    """Print one row per (blocking power, deadline)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="ascend-910b-like")
    parser.add_argument("--pipeline", default="gpt3-pp8")
    parser.add_argument("--targets", default="0.02,0.05")
    parser.add_argument("--iterations", type=int, default=1, help="profiled per clock")
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",")]
    device = SimulatedDevice.from_preset(args.device)
    stages = load_pipeline(args.pipeline)
    layout = layout_of(stages)
    started = time.perf_counter()
    tables = [
        rank_tables(
            device.profile(w, device.spec.freqs_mhz, iterations=args.iterations), source=w.name
        )
        for w in stages
    ]
    profiled_s = time.perf_counter() - started
    base = run_pipeline(device, stages, layout=layout)
    print(
        f"{args.pipeline} on {args.device} (simulated): {len(stages)} ranks, {layout.n_nodes} "
        f"nodes, {layout.n_messages} messages; profiled in {profiled_s:.1f} s; all-max "
        f"{base.makespan_s:.4f} s, {base.energy_j:.1f} J (waiting at {base.wait_power_w:.1f} W)"
    )
    header = (
        f"{'block W':>8} {'d':>5} {'makespan %':>11} {'met':>4} {'energy %':>9} "
        f"{'pred mk %':>10} {'pred E %':>9} {'gap %':>6} {'switches':>9} {'plan s':>7}"
    )
    print(header)
    for power in (0.0, round(base.wait_power_w, 1)):
        problem = layout.problem(
            [t.time_s for t in tables],
            [t.energy_j for t in tables],
            tables[0].freqs_mhz,
            idle_before_s=[t.idle_before_s for t in tables],
            blocking_power_w=power,
        )
        for target in targets:
            plan = solve_dag(problem, target)
            pipe = rank_schedule(
                layout,
                problem,
                plan,
                target=target,
                switch_latency_s=device.spec.switch_latency_ms * 1e-3,
            )
            got = run_pipeline(device, stages, pipe, layout=layout)
            makespan = got.makespan_s / base.makespan_s - 1
            pred_mk = (pipe.predicted_makespan_s or np.nan) / (pipe.baseline_makespan_s or 1) - 1
            pred_e = (pipe.predicted_energy_j or np.nan) / (pipe.baseline_energy_j or 1) - 1
            print(
                f"{power:8.1f} {target:5.0%} {makespan:+11.2%} "
                f"{'yes' if makespan <= target * (1 + 1e-9) else 'NO':>4} "
                f"{got.energy_j / base.energy_j - 1:+9.2%} {pred_mk:+10.2%} {pred_e:+9.2%} "
                f"{plan.gap_pct:6.3f} {int(got.switches.sum()):9d} {plan.plan_seconds:7.2f}"
            )


if __name__ == "__main__":
    main()
