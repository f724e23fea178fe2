"""Exact DP vs the paper's GA on the simulator: predicted saving, plan time, certified gap.

Profiles each workload on ascend-910b-like at 1000/1400/1800 MHz, fits the models (perf on all
three, power on 1000+1800 as in the paper), then plans with both solvers (objective: AICore
energy, the paper's headline rail; the chip-energy column is for the same plan) and measures
the DP plan on the simulator. GA at the paper's settings (population 200, mutation 0.15, 600
generations), seed 0.

    .venv/bin/python benchmarks/planners.py
"""

from __future__ import annotations

import pandas as pd

from opdvfs.devices.presets import get_preset
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.planner import PlanInputs, plan_schedule
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads.library import BUILDERS

CASES = [("gpt3", t) for t in (0.02, 0.04, 0.06, 0.08, 0.10)] + [
    ("bert", 0.02),
    ("resnet50", 0.02),
    ("resnet152", 0.02),
]


def saving(schedule, key: str) -> float:
    return (1 - getattr(schedule, f"predicted_{key}") / getattr(schedule, f"baseline_{key}")) * 100


def main() -> None:
    preset = get_preset("ascend-910b-like")
    dev = SimulatedDevice(preset.spec, preset.twin)
    rows, cache = [], {}
    for name, target in CASES:
        if name not in cache:
            w = BUILDERS[name]()
            profile = dev.profile(w, [1000, 1400, 1800])
            models = ModelBundle(
                PerfModel().fit(profile),
                PowerModel().fit(profile, [1000, 1800], device=preset.spec),
            )
            inputs = PlanInputs.from_workload(w, preset.spec.freqs_mhz, device=preset.spec.name)
            base, _ = dev.run(w)
            cache[name] = (w, models, inputs, base)
        w, models, inputs, base = cache[name]
        dp = plan_schedule(models, inputs, target=target, objective="core-energy")
        ga = plan_schedule(models, inputs, target=target, objective="core-energy", solver="ga")
        run, _ = dev.run(w, dp)
        rows.append(
            {
                "workload": name,
                "target %": target * 100,
                "stages": len(dp.stages),
                "DP core saving %": saving(dp, "core_energy_j"),
                "GA core saving %": saving(ga, "core_energy_j"),
                "DP gap %": dp.gap_pct,
                "DP s": dp.plan_seconds,
                "GA s": ga.plan_seconds,
                "DP switches": dp.n_switches,
                "DP chip saving %": saving(dp, "energy_j"),
                "measured loss %": (run.iteration_time_s / base.iteration_time_s - 1) * 100,
                "measured core saving %": (1 - run.core_energy_j / base.core_energy_j) * 100,
            }
        )
    pd.set_option("display.width", 240)
    print("ascend-910b-like (simulated); paper GPT-3 at 2%: AICore power -15.27%, loss 1.59%")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
