"""Measured cells shrunk across clocks, so that a planner does not pick their noise.

GPT-3 on a100-like profiled at all 81 clocks and planned at 2% on the raw medians ran 2.24% slower:
among many noisy cells the planner picks those whose noise happened to be low.
:func:`~opdvfs.plan.measured.shrink_across_clocks` smooths each op across its clocks (GCV), keeping
what many ops share at a clock (a throttled clock, copies of one op).
"""

import dataclasses

import numpy as np
import pytest

from opdvfs.datasets import DATASETS, dataset_path
from opdvfs.io import read_profile
from opdvfs.plan import PlanInputs, plan_schedule
from opdvfs.plan.measured import MeasuredTables, shrink_across_clocks
from opdvfs.plan.pipeline import stage_chain
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.physics import op_arrays, op_timing
from opdvfs.workloads.library import GPT3
from opdvfs.workloads.transformer import transformer_training

FREQS = np.linspace(800.0, 1800.0, 21)


def curves(rng: np.random.Generator, n_ops: int) -> np.ndarray:
    """Noise-free op times (us): a compute part ~ 1/f and a memory part, clock-independent."""
    compute = rng.uniform(50, 500, n_ops)[:, None] * 1800.0 / FREQS[None, :]
    return compute + rng.uniform(10, 300, n_ops)[:, None]


def test_a_power_law_and_short_tables_are_left_alone():
    law = 3.0 * FREQS[None, :] ** -0.7 * np.array([[1.0], [5.0]])
    np.testing.assert_allclose(shrink_across_clocks(FREQS, law), law, rtol=1e-9)
    three = np.array([[1.0, 1.3, 0.9]])  # 3 clocks: noise and curvature cannot be told apart
    np.testing.assert_array_equal(shrink_across_clocks(FREQS[:3], three), three)
    gap = law.copy()
    gap[0, 4] = np.nan
    out = shrink_across_clocks(FREQS, gap)
    np.testing.assert_array_equal(out[0], gap[0])  # a row with a gap: unchanged


def test_noisy_cells_move_towards_their_curve():
    rng = np.random.default_rng(0)
    truth = curves(rng, 400)
    noisy = truth * np.exp(rng.normal(0.0, 0.01, truth.shape))
    raw_err = np.sqrt(np.mean(np.log(noisy / truth) ** 2))
    err = np.sqrt(np.mean(np.log(shrink_across_clocks(FREQS, noisy) / truth) ** 2))
    assert err < 0.6 * raw_err, (err, raw_err)


def test_what_every_op_shows_at_a_clock_is_kept():
    """A clock the board throttles (every op 4% slower there) is measured behaviour, not noise."""
    rng = np.random.default_rng(1)
    truth = curves(rng, 400)
    truth[:, 10] *= 1.04
    noisy = truth * np.exp(rng.normal(0.0, 0.01, truth.shape))
    out = shrink_across_clocks(FREQS, noisy)
    step = np.log(out[:, 10] / np.sqrt(out[:, 9] * out[:, 11]))
    true_step = np.log(truth[:, 10] / np.sqrt(truth[:, 9] * truth[:, 11]))
    assert abs(np.mean(step - true_step)) < 0.002
    assert np.sqrt(np.mean(np.log(out / truth) ** 2)) < np.sqrt(np.mean(np.log(noisy / truth) ** 2))


@pytest.mark.parametrize("name", [n for n in DATASETS if n.startswith("perseus-")])
def test_real_stage_chains_are_planned_on_their_own_measurements(name):
    """Perseus's chains repeat each stage's two rows: their wiggles are shared, so kept.

    Smoothed per op alone (GCV, without the shared patterns) these cells moved by up to 0.9%
    (GPT-3 on A100, energy at 1335 MHz); with them, by at most 0.01%.
    """
    chain = stage_chain(read_profile([dataset_path(name)]), 0, 8)
    raw = MeasuredTables.from_profile(chain, shrink=False)
    shrunk = MeasuredTables.from_profile(chain)
    np.testing.assert_allclose(shrunk.time_us, raw.time_us, rtol=2e-4)
    np.testing.assert_allclose(shrunk.chip_energy_j, raw.chip_energy_j, rtol=2e-4)


def test_a_plan_on_every_clock_meets_its_target_on_another_seed():
    """Plan on a seed-0 profile of every clock; judge it on the noise-free times and other seeds.

    Planned on the raw medians, the plan is 2.084% slower on the simulator's noise-free times at
    its clocks and 2.075-2.079% slower run with seeds 1-3 (mean 2.077%); on the shrunk cells
    2.013% and 1.907-2.011% (mean 1.953%). Tolerances: 0.05 point on the noise-free times (a
    9-clock profile leaves some of each cell's 0.6% noise in the shrunk cells); 0.05 point on the
    mean of three seeds (one plan's measured slowdown moves by up to 0.1 point between seeds).
    """
    work = transformer_training(
        dataclasses.replace(GPT3, layers=2, microbatches=4), description="GPT-3, 2 layers"
    )
    dev = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    profile = dev.profile(work, dev.spec.freqs_mhz)
    inputs = PlanInputs.from_profile(profile, dev.spec)
    assert inputs.measured is not None and inputs.measured.covers(inputs.freqs_mhz)
    plan = plan_schedule(
        None, inputs, target=0.02, interval_ms=5.0, switch_latency_ms=dev.spec.switch_latency_ms
    )
    freqs = np.asarray(dev.spec.freqs_mhz, dtype=float)
    exact_us = op_timing(op_arrays(work.ops), freqs, dev.params).time_us
    cols = np.searchsorted(freqs, plan.freq_per_op_mhz())
    idle_us = inputs.idle_before_us.sum()
    planned_us = exact_us[np.arange(len(cols)), cols].sum() + idle_us
    exact_pct = (planned_us / (exact_us[:, -1].sum() + idle_us) - 1) * 100
    assert exact_pct <= 2.0 + 0.05, exact_pct
    runs_pct = []
    for seed in (1, 2, 3):
        other = SimulatedDevice.from_preset("ascend-910b-like", seed=seed)
        base, _ = other.run(work, iterations=3)
        result, _ = other.run(work, plan, iterations=3)
        runs_pct.append((result.iteration_time_s / base.iteration_time_s - 1) * 100)
        assert result.chip_energy_j < base.chip_energy_j
    assert np.mean(runs_pct) <= 2.0 + 0.05, runs_pct
