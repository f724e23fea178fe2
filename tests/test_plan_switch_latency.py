"""Plans on a device with a slow clock switch run as planned (no stage shorter than the switch).

A user profiled GPT-3 on the h100-like twin (15 ms switch) at three clocks, planned a 2% target
with ``opdvfs plan``'s default 5 ms interval and measured 3.26% slower: a clock request issued
while the previous one is pending supersedes it (:mod:`opdvfs.sim.timeline`), so most 5 ms stages
never ran at their clock. The planner now plans no stage shorter than the switch latency.
"""

import dataclasses

import numpy as np
import pytest

from opdvfs.models.attribution import sensor_iterations
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan import PlanInputs, plan_schedule
from opdvfs.plan.planner import shortest_stage_ms
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads.library import GPT3
from opdvfs.workloads.transformer import transformer_training

TARGET = 0.02
#: Measured slowdown allowed over the target (points of %): the time model's own bias between
#: three far-apart profiled clocks (GPT-3 on h100-like from 210/1095/1980 MHz: +0.24 points,
#: from 1005/1395/1980: +0.07), not the superseded switches this guards (+1.3 to +51 points).
TOLERANCE_PCT = 0.25


@pytest.fixture(scope="module")
def sparse_h100_gpt3():
    """GPT-3 (2 layers, 4 microbatches: 410 ops) on h100-like, profiled at three clocks."""
    work = transformer_training(
        dataclasses.replace(GPT3, layers=2, microbatches=4), description="GPT-3, 2 layers"
    )
    dev = SimulatedDevice.from_preset("h100-like")
    first, _ = dev.run(work)
    repeats = sensor_iterations(first.iteration_time_s, **dev.sensor_ms)
    profile = dev.profile(work, [1005, 1395, 1980], iterations=repeats)
    models = ModelBundle(PerfModel().fit(profile), PowerModel().fit(profile, device=dev.spec))
    return dev, work, models, PlanInputs.from_profile(profile, dev.spec)


def test_shortest_stage_is_the_switch_latency_when_longer():
    assert shortest_stage_ms(5.0, 15.0) == 15.0
    assert shortest_stage_ms(5.0, 1.0) == 5.0
    assert shortest_stage_ms(0.0, 0.0) == 0.0


def test_sparse_profile_plan_meets_its_target_on_a_slow_switch(sparse_h100_gpt3):
    dev, work, models, inputs = sparse_h100_gpt3
    latency_ms = dev.spec.switch_latency_ms
    assert latency_ms == 15.0
    # the CLI's default interval, shorter than the switch
    plan = plan_schedule(
        models, inputs, target=TARGET, interval_ms=5.0, switch_latency_ms=latency_ms
    )
    assert plan.interval_ms == latency_ms
    # every stage but the last (which runs into the next iteration's first) lasts a switch
    starts = np.array([s.start_s for s in plan.stages])
    assert np.all(np.diff(starts) >= latency_ms * 1e-3 * (1 - 1e-9))
    base, _ = dev.run(work, iterations=3)
    result, sim = dev.run(work, plan, iterations=3)
    measured_pct = (result.iteration_time_s / base.iteration_time_s - 1) * 100
    assert measured_pct <= TARGET * 100 + TOLERANCE_PCT
    # the plan ran as planned: the last iteration's ops at their planned clocks
    n = len(work)
    planned = np.concatenate([np.full(s.last_op - s.first_op + 1, s.freq_mhz) for s in plan.stages])
    off = np.mean(sim.freq_mhz[-n:] != planned)
    assert off < 0.05, f"{off:.1%} of ops ran at another clock than planned"
