"""Speed of the simulator: whole iterations, and the switch-aware timeline vs an op-by-op loop.

Part 1 times one full simulated iteration of every workload (physics at the clocks used,
timeline, three thermal passes, sensors); the issue's goal is a gpt3 iteration in < 0.2 s.
Part 2 times the timeline alone on gpt3 under a schedule with ~800 switches per iteration (the
paper's GPT-3 plan issues 821), vectorised :func:`execute` against the readable op-by-op
:func:`execute_loop`, measured in the same run.

    .venv/bin/python benchmarks/sim_speed.py [--device ascend-910b-like]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opdvfs.schedule import Schedule
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.physics import op_arrays, op_timing
from opdvfs.sim.presets import get_preset
from opdvfs.sim.timeline import execute, execute_loop
from opdvfs.workloads.library import BUILDERS


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="ascend-910b-like")
    args = parser.parse_args()
    preset = get_preset(args.device)
    spec = preset.spec
    dev = SimulatedDevice(spec, preset.twin)
    print(f"1. one simulated iteration on {args.device} (best of 3)")
    print(f"{'workload':14s} {'ops':>6s} {'static run s':>13s} {'profile 1 clock s':>18s}")
    for name, build in BUILDERS.items():
        w = build()
        run_s = best_of(lambda w=w: dev.run(w))
        prof_s = best_of(lambda w=w: dev.profile(w, [spec.max_freq_mhz]))
        print(f"{name:14s} {len(w):6d} {run_s:13.4f} {prof_s:18.4f}")

    w = BUILDERS["gpt3"]()
    n = len(w)
    starts = np.r_[0, np.sort(np.random.default_rng(0).choice(np.arange(1, n), 800, False))]
    freqs = np.where(np.arange(len(starts)) % 2 == 0, spec.max_freq_mhz, spec.min_freq_mhz)
    plan = Schedule.from_stage_freqs(starts, freqs, n_ops=n, target=0.02, solver="bench")
    sched_s = best_of(lambda: dev.run(w, plan))
    clocks = np.array([spec.min_freq_mhz, spec.max_freq_mhz])
    dur = op_timing(op_arrays(w.ops), clocks, preset.twin).time_us
    trig = np.array([s.trigger_op for s in plan.switches])
    idx = np.array([int(s.freq_mhz == spec.max_freq_mhz) for s in plan.switches])
    kwargs = {
        "initial_clock": 1,
        "triggers": trig,
        "clocks": idx,
        "latency_us": spec.switch_latency_ms * 1e3,
        "gap_us": w.ops["gap_before_us"].to_numpy(),
    }
    vec_s = best_of(lambda: execute(dur, **kwargs))
    loop_s = best_of(lambda: execute_loop(dur, **kwargs))
    print(f"\n2. gpt3 ({n} ops) under a schedule with {plan.n_switches} switches")
    print(f"   full run (physics, timeline, thermal, sensors): {sched_s:.4f} s")
    print(
        f"   timeline: execute {vec_s:.4f} s, op-by-op loop {loop_s:.4f} s, "
        f"loop / execute = {loop_s / vec_s:.1f}x"
    )


if __name__ == "__main__":
    main()
