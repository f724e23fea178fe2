"""Why a per-operator plan saves less than predicted: the die is hotter than when it was profiled.

A profile at a static clock measures every operator with the die at *that clock's* steady
temperature: at a low clock the die is cooler and leaks less. A per-operator plan at a small
budget keeps most of the iteration near the top clock, so the die stays near the top clock's
temperature and the operators it runs at a low clock leak more than their profile said. Tables
taken at each clock's own die then over-state what a low clock saves.

Four plans per device (GPT-3 by default, 2% budget, chip energy), each measured on the twin:

* ``models, own die``: the models fitted on the demo's profile alone, each clock on its own die
  (static profiles do not identify the leakage's temperature slope: temperature and clock move
  together across them, and the fitted ``gamma`` is ~0, or none on a GPU's board rail);
* ``models, top die``: what ``opdvfs demo`` plans on: ``gamma`` from a cool-down trace
  (``bench.calibrate``, paper §5.2; the board's on a GPU), the tables taken with the die at the
  top clock's temperature (``PowerModel.predict(die_at_mhz=top)``, measured cells moved there
  by the model's own ``gamma dT V``: ``plan.measured.at_die``);
* ``oracle, static die``: the twin's own per-operator time and energy at every clock, each clock
  run alone (its die at that clock's steady state: a perfect static-clock profile);
* ``oracle, plan's die``: the same, the die held at the temperature the plan runs at.

The predicted saving of the third minus the fourth is the thermal bias a perfect static profile
still carries; what is left in the fourth is everything else (switch timing, the top-clock
baseline's own die). The first two rows show how much of the bias the models' correction takes
out; what they keep beyond the fourth is the models' own error (e.g. the time model between
a100-like's 1005 and 1395 MHz training clocks).

    .venv/bin/python benchmarks/thermal_bias.py [--devices ascend-910b-like,h100-like]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pandas as pd

from opdvfs.experiments.bench import Bench, measure, prepare
from opdvfs.experiments.suites import _plan
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.power import PowerModel
from opdvfs.plan.planner import Predictions, predict
from opdvfs.sim import SimulatedDevice


def oracle(bench: Bench, device: SimulatedDevice, temp_c: float | None) -> Predictions:
    """Return the twin's per-operator time and chip energy at every clock, each run alone."""
    p = bench.predictions
    n = len(bench.workload)
    time_us, energy_j = np.empty_like(p.time_us), np.empty_like(p.chip_energy_j)
    rng = np.random.default_rng(0)
    for j, f in enumerate(p.freqs_mhz):
        run = device._simulate_static(
            bench.workload,
            int(device.clock_index([f])[0]),
            iterations=1,
            rng=rng,
            start_temp_c=temp_c,
        )
        time_us[:, j], energy_j[:, j] = run.dur_us[:n], run.op_chip_energy_j[:n]
    return Predictions(p.names, p.freqs_mhz, time_us, energy_j, p.core_energy_j, p.values)


def rows(device_name: str, workload: str, target: float) -> list[dict[str, object]]:
    bench = prepare(workload, device_name)
    sim = bench.device
    out = []

    def plan_on(label: str, predictions: Predictions) -> float:
        schedule = _plan(dataclasses.replace(bench, predictions=predictions), target, "energy")
        outcome, run = measure(bench, schedule, label, target=target)
        out.append(
            {
                "device": device_name,
                "tables": label,
                "slowdown %": outcome.perf_loss_pct,
                "predicted %": outcome.predicted_perf_loss_pct,
                "energy saved %": outcome.chip_energy_saving_pct,
                "predicted saved %": outcome.predicted_chip_energy_saving_pct,
                "gap (points)": (outcome.predicted_chip_energy_saving_pct or 0.0)
                - outcome.chip_energy_saving_pct,
                "die under the plan (C)": float(np.mean(run.temp_start_c)),
            }
        )
        return float(np.mean(run.temp_start_c))

    own = ModelBundle(
        bench.models.perf,
        PowerModel().fit(bench.profile, device=sim.spec),  # no cool-down: each clock's own die
        device=sim.spec,
    )
    plan_on("models, own die", predict(own, bench.inputs))
    plan_on("models, top die", bench.predictions)
    plan_die = plan_on("oracle, static die", oracle(bench, sim, None))
    held = SimulatedDevice(sim.spec, sim.params.model_copy(update={"tau_s": 1e9}), seed=sim.seed)
    plan_on("oracle, plan's die", oracle(bench, held, plan_die))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="ascend-910b-like,a100-like,h100-like")
    parser.add_argument("--workload", default="gpt3")
    parser.add_argument("--target", type=float, default=0.02)
    args = parser.parse_args()
    started = time.perf_counter()
    table = pd.DataFrame(
        [r for d in args.devices.split(",") for r in rows(d, args.workload, args.target)]
    )
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
