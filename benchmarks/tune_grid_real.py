"""tune's first plan on real per-kernel data: the swept clocks alone, or the device's clocks.

``opdvfs tune`` off the simulator sweeps the five ``auto`` clocks and plans on point values
(``plan_fitted(..., conservative=False)``; its A/B rounds measure each plan and re-plan). It
plans over :func:`opdvfs.tuner.policy.clock_grid`: the device's supported clocks within the
swept range, the models filling those not swept (before: the swept clocks alone). For every
set of ``benchmarks/few_clock_plans.py`` (real per-kernel time and power at every clock), the
profile is the five ``auto`` clocks' rows; the first plan at d = 2, 5, 10% (no switch latency,
one clock per operator) is scored on the full measured table (raw medians): its slowdown
against the top clock, and its energy against the exact every-clock optimum within (1 + d)
(HiGHS). The last lines: per grid, the plans' mean / median / worst energy above the optimum,
how many run more than 0.5 points past d (the A/B rounds then plan lower), and the fit and
plan CPU time.

    .venv/bin/python benchmarks/tune_grid_real.py [DATA_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from few_clock_plans import DEFAULT_DATA, MIN_CLOCKS, find_sets, optimum, restrict
from opdvfs.io import read_profile
from opdvfs.plan.measured import MeasuredTables
from opdvfs.plan.on_profile import auto_clocks, fit_profile, plan_fitted
from opdvfs.tuner.policy import clock_grid

TARGETS = (0.02, 0.05, 0.10)
#: How far past d a plan may measure before it counts as late here (points).
LATE_PTS = 0.5


def rows_for(name: str, path: Path) -> list[dict]:
    """Plan one set's five-clock profile at every target on both grids; score on the truth."""
    full = read_profile([path])
    truth = MeasuredTables.from_profile(full, shrink=False)  # raw medians
    freqs = truth.freqs_mhz
    if len(freqs) < MIN_CLOCKS or not np.isfinite(truth.chip_energy_j).all():
        return []
    part = restrict(full, auto_clocks(freqs, max_gap=None))  # tune's sweep
    top_s = float(truth.time_us[:, -1].sum()) * 1e-6
    ops = np.arange(len(truth.op_ids))
    rows = []
    for grid, spec in (("swept", None), ("device", clock_grid(part, freqs, name))):
        started = time.process_time()
        fitted = fit_profile(part, spec=spec, switch_latency_ms=0.0)
        for d in TARGETS:
            schedule = plan_fitted(fitted, target=d, interval_ms=0.0, conservative=False)
            cols = truth.columns(schedule.freq_per_op_mhz())
            plan_s = float(truth.time_us[ops, cols].sum()) * 1e-6
            plan_j = float(truth.chip_energy_j[ops, cols].sum())
            best_j = optimum(truth.time_us, truth.chip_energy_j, (1 + d) * top_s)
            rows.append(
                {
                    "set": name,
                    "grid": grid,
                    "d %": d * 100,
                    "slow %": (plan_s / top_s - 1) * 100,
                    "vs opt %": (plan_j / best_j - 1) * 100,
                    "cpu s": time.process_time() - started if d == TARGETS[-1] else 0.0,
                }
            )
    return rows


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA
    with tempfile.TemporaryDirectory() as work:
        rows = [r for name, path in find_sets(data, Path(work)) for r in rows_for(name, path)]
    df = pd.DataFrame(rows)
    table = df.pivot_table(index=["set", "d %"], columns="grid", values=["slow %", "vs opt %"])
    print(table.round(3).to_string())
    for grid, x in df.groupby("grid", sort=False):
        over = x["slow %"] - x["d %"]
        on_time = x["vs opt %"][over <= LATE_PTS]  # (a late plan may use less than the optimum)
        print(
            f"{grid}: {len(x)} plans; energy above the every-clock optimum: mean "
            f"{x['vs opt %'].mean():.3f}%, median {x['vs opt %'].median():.3f}%, worst "
            f"{x['vs opt %'].max():.2f}% (the {len(on_time)} within d + {LATE_PTS} pts: mean "
            f"{on_time.mean():.3f}%); {int((over > LATE_PTS).sum())} more than {LATE_PTS} pts "
            f"past d (worst {over.max():+.2f} pts); fit + plans {x['cpu s'].sum():.2f} CPU s"
        )


if __name__ == "__main__":
    main()
