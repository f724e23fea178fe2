"""Measured cells shrunk across clocks, so that a planner does not pick their noise.

GPT-3 on a100-like profiled at all 81 clocks and planned at 2% on the raw medians ran 2.24% slower:
among many noisy cells the planner picks those whose noise happened to be low.
:func:`~opdvfs.plan.measured.shrink_across_clocks` smooths each op across its clocks (GCV), keeping
what many ops share at a clock (a throttled clock, copies of one op).
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from opdvfs.datasets import DATASETS, dataset_path
from opdvfs.io import read_profile
from opdvfs.plan import PlanInputs, plan_profile, plan_schedule
from opdvfs.plan.measured import MeasuredTables, median_noise, shrink_across_clocks
from opdvfs.plan.pipeline import stage_chain
from opdvfs.profile import Profile
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
    """Perseus's chains measure each cell once: no noise estimate, so no cell moves (issue 31).

    Smoothed per op alone (GCV, without the shared patterns) these cells moved by up to 0.9%
    (GPT-3 on A100, energy at 1335 MHz); with them, by at most 0.01%; bounded by each cell's
    noise, not at all.
    """
    chain = stage_chain(read_profile([dataset_path(name)]), 0, 8)
    raw = MeasuredTables.from_profile(chain, shrink=False)
    shrunk = MeasuredTables.from_profile(chain)
    np.testing.assert_array_equal(shrunk.time_us, raw.time_us)
    np.testing.assert_array_equal(shrunk.chip_energy_j, raw.chip_energy_j)


def test_a_plan_on_every_clock_meets_its_target_on_another_seed():
    """Plan on a seed-0 profile of every clock; judge it on the noise-free times and other seeds.

    One iteration per clock, planned on the raw medians, the plan was 2.084% slower on the
    simulator's noise-free times at its clocks and 2.075-2.079% run with seeds 1-3; smoothed
    without bound, 2.013% and 1.907-2.011%. A cell measured once is no longer smoothed (issue 31:
    no noise estimate, so left alone), so the profile measures three iterations: on their raw
    medians 1.996% and 1.940-2.002% (mean 1.977%), smoothed within each cell's noise 1.969% and
    1.914-1.977% (mean 1.952%). Tolerances: 0.05 point on the noise-free times (a 9-clock profile
    leaves some of each cell's noise in the shrunk cells); 0.05 point on the mean of three seeds
    (one plan's measured slowdown moves by up to 0.1 point between seeds).
    """
    work = transformer_training(
        dataclasses.replace(GPT3, layers=2, microbatches=4), description="GPT-3, 2 layers"
    )
    dev = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    profile = dev.profile(work, dev.spec.freqs_mhz, iterations=3)
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


def noisy_profile(rng: np.random.Generator, iterations: int, sigma: float = 0.01) -> Profile:
    """Forty ops at five clocks (power laws), op 0 with a 15% kink at 1300 MHz; noise ``sigma``.

    Each (iteration, op, clock) row's time and power carry independent relative noise.
    """
    freqs = np.array([800.0, 1050.0, 1300.0, 1550.0, 1800.0])
    n_ops = 40
    time_us = 100.0 * (freqs[None, :] / 1800.0) ** -rng.uniform(0.2, 1.0, (n_ops, 1))
    power_w = 80.0 * (freqs[None, :] / 1800.0) ** rng.uniform(1.0, 2.5, (n_ops, 1))
    time_us[0, 2] *= 1.15
    rows = [
        {
            "iteration": it,
            "op": op,
            "name": f"op{op}",
            "freq_mhz": f,
            "time_us": time_us[op, k] * rng.normal(1.0, sigma),
            "chip_power_w": power_w[op, k] * rng.normal(1.0, sigma),
        }
        for it in range(iterations)
        for op in range(n_ops)
        for k, f in enumerate(freqs)
    ]
    return Profile(pd.DataFrame(rows))


def test_smoothing_moves_no_median_by_more_than_its_noise():
    """Issue 31: measured means measured. Unbounded, the kinked cell moves far beyond its noise."""
    rng = np.random.default_rng(3)
    profile = noisy_profile(rng, iterations=4)
    raw = MeasuredTables.from_profile(profile, shrink=False)
    shrunk = MeasuredTables.from_profile(profile)
    assert shrunk.raw() is shrunk.unsmoothed
    np.testing.assert_array_equal(shrunk.raw().time_us, raw.time_us)
    rows = profile.ops.assign(chip_j=lambda d: d["time_us"] * d["chip_power_w"] * 1e-6)
    cells = rows.groupby(["op", "freq_mhz"])
    for column, got, want in (
        ("time_us", shrunk.time_us, raw.time_us),
        ("chip_j", shrunk.chip_energy_j, raw.chip_energy_j),
    ):
        # the median's standard error from the four iterations: sqrt(pi/2) s / sqrt(4)
        se = (np.sqrt(np.pi / 2) * cells[column].std(ddof=1) / 2.0).to_numpy().reshape(got.shape)
        np.testing.assert_array_less(np.abs(got - want), se * (1 + 1e-9) + 1e-15)
        assert np.any(got != want)  # the smoothing did act
    unbounded = shrink_across_clocks(raw.freqs_mhz, raw.time_us)
    se_time = np.sqrt(np.pi / 2) * cells["time_us"].std(ddof=1).to_numpy().reshape(
        raw.time_us.shape
    )
    assert abs(unbounded[0, 2] / raw.time_us[0, 2] - 1) > 0.03  # the kink pulled towards its curve
    assert abs(unbounded[0, 2] - raw.time_us[0, 2]) > 2 * se_time[0, 2] / 2.0
    assert abs(shrunk.time_us[0, 2] - raw.time_us[0, 2]) <= se_time[0, 2] / 2.0 * (1 + 1e-9)


def test_a_cell_measured_once_is_left_alone():
    """One sample per cell: no noise estimate, so no cell moves (unbounded, the kink moved)."""
    profile = noisy_profile(np.random.default_rng(4), iterations=1)
    raw = MeasuredTables.from_profile(profile, shrink=False)
    shrunk = MeasuredTables.from_profile(profile)
    np.testing.assert_array_equal(shrunk.time_us, raw.time_us)
    np.testing.assert_array_equal(shrunk.chip_energy_j, raw.chip_energy_j)
    assert np.max(np.abs(shrink_across_clocks(raw.freqs_mhz, raw.time_us) / raw.time_us - 1)) > 0.03
    np.testing.assert_array_equal(median_noise(np.array([0.1, np.nan]), np.array([1, 3])), [0, 0])


def test_measured_figures_are_on_the_raw_medians():
    """A schedule's measured_* fields sum the raw medians, not the smoothed cells planned on."""
    profile = noisy_profile(np.random.default_rng(5), iterations=4)
    inputs = PlanInputs.from_profile(profile)
    assert inputs.measured is not None
    plan = plan_schedule(None, inputs, target=0.05, interval_ms=0.0, switch_latency_ms=0.0)
    raw = inputs.measured.raw()
    assert not np.array_equal(inputs.measured.time_us, raw.time_us)
    cols = raw.columns(plan.freq_per_op_mhz())
    ops = np.arange(len(cols))
    idle_s = inputs.idle_before_us.sum() * 1e-6
    assert plan.measured_time_s == pytest.approx(raw.time_us[ops, cols].sum() * 1e-6 + idle_s)
    assert plan.measured_baseline_time_s == pytest.approx(raw.time_us[:, -1].sum() * 1e-6 + idle_s)
    assert plan.measured_energy_j == pytest.approx(raw.chip_energy_j[ops, cols].sum())
    # the predictions are on the smoothed cells the plan chose among
    smoothed = inputs.measured.time_us[ops, cols].sum() * 1e-6 + idle_s
    assert plan.predicted_time_s == pytest.approx(smoothed)


def _raw_slowdown(result):
    raw = result.fitted.inputs.measured.raw()
    cols = raw.columns(result.schedule.freq_per_op_mhz())
    planned = raw.time_us[np.arange(len(cols)), cols].sum()
    return planned / raw.time_us[:, -1].sum() - 1


def test_the_over_budget_warning_is_on_the_raw_medians(monkeypatch):
    """plan_profile warns exactly when the plan is late on the raw medians, not the smoothed."""
    profile = noisy_profile(np.random.default_rng(3), iterations=3, sigma=0.02)
    late = []
    # planned on the point values (no margin for the cells' noise), at 1% the plan is 0.991%
    # slower on the smoothed cells, 1.011% on the raw medians
    with monkeypatch.context() as patch:
        patch.setattr("opdvfs.plan.planner.TIME_QUANTILE_Z", 0.0)
        patch.setattr("opdvfs.plan.planner.MEASURED_NOISE_Z", 0.0)
        for target in (0.01, 0.02, 0.05):
            result = plan_profile(profile, target, interval_ms=0.0, switch_latency_ms=0.0)
            slowdown = _raw_slowdown(result)
            warned = any("over its" in w for w in result.warnings)
            assert warned == (slowdown > target * (1 + 1e-9) + 1e-12), (target, slowdown)
            late.append(warned)
    assert late == [True, False, False]  # the smoothed cells hid the late plan at 1%
    # with the cells' own noise as margin (issue 31 item 1), the 1% plan keeps its promise
    result = plan_profile(profile, 0.01, interval_ms=0.0, switch_latency_ms=0.0)
    assert _raw_slowdown(result) <= 0.01
    assert not any("over its" in w for w in result.warnings)
    assert result.schedule.conservative_time_s > result.schedule.predicted_time_s
