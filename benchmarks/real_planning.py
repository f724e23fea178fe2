"""Planning on real measurements: Perseus's GPT-3 / BLOOM stage chains on A100 and A40.

For every pipeline stage of every Perseus stage profile (the bundled, Apache-2.0 copy in
``opdvfs.datasets``; or the CSV files given as arguments), build the stage's 1F1B instruction
chain (8 microbatches: 16 instructions, each at its own clock) and plan it the way
``opdvfs plan CSV --interval-ms 0 --switch-latency-ms 0`` does (measurements first, one stage
per instruction, no switch cost) for slowdowns d in {0, 2, 5, 10}%. Scored on the measured
table against:

- the exact optimum of the same chain, a 0/1 programme solved by HiGHS (``opdvfs.plan.milp``);
- the best static clock within the deadline, and all instructions at the top clock (all-max).

``held-out`` plans from a profile with every other clock removed (the top clock kept): the
models, corrected through the kept clocks, fill the removed ones; the plan is scored on the
full measured table against the full optimum. Stages 0-6 of a file are identical copies.

    .venv/bin/python benchmarks/real_planning.py [CSV ...]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.datasets import DATASETS, dataset_path
from opdvfs.io import read_profile
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan import PlanInputs, plan_schedule
from opdvfs.plan.dp import StageTables
from opdvfs.plan.measured import MeasuredTables
from opdvfs.plan.milp import milp_solve
from opdvfs.plan.pipeline import stage_chain
from opdvfs.profile import Profile

TARGETS = (0.0, 0.02, 0.05, 0.10)
MICROBATCHES = 8


def held_out(chain: Profile) -> Profile:
    """Return the chain's profile without every other clock (the top clock kept)."""
    freqs = chain.freqs_mhz
    keep = freqs[::-2]  # from the top: the top clock, then every second one below it
    rows = chain.ops[chain.ops["freq_mhz"].isin(keep)]
    return Profile(rows, meta=chain.meta)


def score(table: MeasuredTables, schedule) -> tuple[float, float]:
    """Return the energy (J) and slowdown (fraction) of a schedule on the full measured table."""
    per_op = schedule.freq_per_op_mhz()
    cols = table.columns(per_op)
    ops = np.arange(len(per_op))
    base_t = table.time_us[:, -1].sum()
    return float(table.chip_energy_j[ops, cols].sum()), float(
        table.time_us[ops, cols].sum() / base_t - 1
    )


def rows_for(name: str, path: Path) -> list[dict]:
    """Return the rows of every stage x target of one Perseus file."""
    whole = read_profile([path])
    n_stages = int(whole.ops["name"].str.extract(r"stage(\d+)")[0].astype(int).max()) + 1
    rows = []
    for stage in range(n_stages):
        chain = stage_chain(whole, stage, MICROBATCHES)
        table = MeasuredTables.from_profile(chain, shrink=False)
        tables = StageTables(table.time_us * 1e-6, table.chip_energy_j)
        base_t, base_e = tables.time_s[:, -1].sum(), tables.energy_j[:, -1].sum()
        static_t, static_e = tables.time_s.sum(axis=0), tables.energy_j.sum(axis=0)
        part = held_out(chain)
        models = ModelBundle(PerfModel().fit(part), PowerModel().fit(part))
        part_inputs = replace(PlanInputs.from_profile(part), freqs_mhz=table.freqs_mhz)
        inputs = PlanInputs.from_profile(chain)
        for d in TARGETS:
            budget = (1 + d) * base_t
            optimum = milp_solve(tables, budget)
            plan = plan_schedule(
                None, inputs, target=d, interval_ms=0.0, switch_latency_ms=0.0, values="auto"
            )
            energy, slowdown = score(table, plan)
            other = plan_schedule(
                models, part_inputs, target=d, interval_ms=0.0, switch_latency_ms=0.0
            )
            held_e, held_slowdown = score(table, other)
            fits = static_t <= budget * (1 + 1e-12)
            rows.append(
                {
                    "data": name.removeprefix("perseus-"),
                    "stage": stage,
                    "d %": d * 100,
                    "opdvfs saving %": (1 - energy / base_e) * 100,
                    "optimum saving %": (1 - optimum.energy_j / base_e) * 100,
                    "static saving %": (1 - static_e[fits].min() / base_e) * 100,
                    "opdvfs - opt %": (energy / optimum.energy_j - 1) * 100,
                    "slowdown %": slowdown * 100,
                    "plan ms": (plan.plan_seconds or 0.0) * 1e3,
                    "held-out - opt %": (held_e / optimum.energy_j - 1) * 100,
                    "held-out slowdown %": held_slowdown * 100,
                }
            )
    return rows


def main(paths: list[str]) -> None:
    sources = (
        [(Path(p).stem, Path(p)) for p in paths]
        if paths
        else [(name, dataset_path(name)) for name in DATASETS]
    )
    rows = [row for name, path in sources for row in rows_for(name, path)]
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 240)
    print("all-max = 0% saving; energy and slowdown on the measured table; 1F1B x8 per stage")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        f"\nworst: opdvfs - optimum {table['opdvfs - opt %'].max():.4f}%, slowdown over d "
        f"{(table['slowdown %'] - table['d %']).max():+.4f} points, plan "
        f"{table['plan ms'].max():.1f} ms (median {table['plan ms'].median():.1f} ms); held-out "
        f"- optimum {table['held-out - opt %'].max():.3f}%, slowdown over d "
        f"{(table['held-out slowdown %'] - table['d %']).max():+.3f} points"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
