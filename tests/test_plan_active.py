"""Active profiling: the next clock worth measuring for a plan (issue 31 item 2).

:func:`opdvfs.plan.active.next_clock` on synthetic tables whose answer is known by hand, and
:func:`~opdvfs.plan.active.next_clock_for` on a profile of a simulated GPU at its ``auto``
clocks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opdvfs.exceptions import ValidationError
from opdvfs.plan.active import (
    _expected_improvement,
    budget_price,
    clock_gains,
    loo_reach,
    lower_regime,
    next_clock,
    next_clock_for,
)
from opdvfs.plan.dp import StageTables
from opdvfs.plan.measured import gap_reach
from opdvfs.plan.milp import milp_solve
from opdvfs.plan.on_profile import auto_clocks, fit_profile
from opdvfs.plan.planner import Predictions
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads.library import load_workload

F = np.arange(1000.0, 1401.0, 50.0)  # 9 clocks, 1000..1400
MEASURED = np.isin(F, [1000.0, 1200.0, 1400.0])


def tables(curv: float = 4e-6, n_ops: int = 4) -> Predictions:
    """Ops whose time ~ 1/f (compute-bound) and energy falls with the clock, 3 measured clocks.

    The margins are what the planner uses: 3 x curvature x reach / 2 at filled cells.
    """
    time_us = 100.0 * (F[-1] / F)[None, :] * np.ones((n_ops, 1))
    energy_j = 1e-3 * (F / F[-1])[None, :] ** 2 * np.ones((n_ops, 1))
    filled = np.broadcast_to(~MEASURED, time_us.shape).copy()
    reach = gap_reach(F, ~filled)
    margin = np.where(filled, 3.0 * 0.5 * curv * reach, 0.0)
    names = np.array([f"op{i}" for i in range(n_ops)])
    core = np.full(time_us.shape, np.nan)
    return Predictions(names, F, time_us, energy_j, core, time_margin=margin, model_filled=filled)


def budget(t: Predictions, slowdown: float = 0.10) -> float:
    return (1 + slowdown) * t.time_us[:, -1].sum() * 1e-6


AT_1300 = np.full(4, int(np.flatnonzero(F == 1300.0)[0]))  # filled, in the 1200-1400 gap


def test_gap_reach_is_zero_at_measured_clocks_and_the_product_of_distances_between():
    reach = gap_reach(F, MEASURED[None, :])[0]
    np.testing.assert_array_equal(reach[MEASURED], 0.0)
    assert reach[F == 1100.0][0] == pytest.approx(100.0 * 100.0)
    assert reach[F == 1250.0][0] == pytest.approx(50.0 * 150.0)


def test_the_budget_price_is_the_least_that_meets_the_budget():
    t = tables()
    time_s, energy_j = t.time_us * 1e-6, t.chip_energy_j
    limit = budget(t, 0.05)
    price = budget_price(time_s, energy_j, limit)
    cols = np.argmin(energy_j + price * time_s, axis=1)
    assert time_s[np.arange(4), cols].sum() <= limit
    cheaper = np.argmin(energy_j + 0.99 * price * time_s, axis=1)
    assert time_s[np.arange(4), cheaper].sum() > limit  # the least price: any less misses it
    assert budget_price(time_s, energy_j, 10 * time_s.sum()) == 0.0  # least energy fits
    with pytest.raises(ValidationError, match="no plan fits"):
        budget_price(time_s, energy_j, 0.5 * time_s[:, -1].sum())


def test_the_clock_named_splits_the_gap_the_plan_uses_and_its_gain_is_the_relaxed_saving():
    """On the point values (``spread=0``): a clock is worth the margins it wins back."""
    t = tables()
    candidates, gains, plan_j = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=0.0)
    # only the gap the plan uses: 1250, 1300, 1350 (not 1050-1150, where it puts nothing)
    np.testing.assert_array_equal(F[candidates], [1250.0, 1300.0, 1350.0])
    assert (gains > 0).all()
    assert gains.max() < 0.1 * plan_j  # a share of the plan's energy, not more
    # the gain by hand: the relaxed plan on the conservative tables at the budget's price,
    # before and after the candidate's own margin is gone and its neighbours' shrink
    assert t.time_margin is not None and t.model_filled is not None
    t_up = t.time_us * 1e-6 * np.exp(t.time_margin)
    price = budget_price(t_up, t.chip_energy_j, budget(t))
    before = (t.chip_energy_j + price * t_up).min(axis=1).sum()
    k = int(np.argmax(gains))
    c = candidates[k]
    now = ~t.model_filled
    now[:, c] = True
    after_margin = np.where(now, 0.0, 3.0 * 0.5 * 4e-6 * gap_reach(F, now))
    after = (t.chip_energy_j + price * t.time_us * 1e-6 * np.exp(after_margin)).min(axis=1).sum()
    assert gains[k] == pytest.approx(before - after, rel=1e-9)
    choice = next_clock(t, budget_s=budget(t), plan_cols=AT_1300, spread=0.0)
    assert choice is not None
    assert choice.freq_mhz == F[c]
    assert choice.gap_mhz == (1200.0, 1400.0)
    assert choice.ops_in_gap == 4
    assert choice.gain_j == pytest.approx(gains.max())
    assert "1200-1400 MHz gap" in choice.why()


def test_no_clock_when_the_gain_is_below_its_cost_or_nothing_is_filled_where_the_plan_goes():
    t = tables()
    choice = next_clock(t, budget_s=budget(t), plan_cols=AT_1300)
    assert choice is not None
    assert next_clock(t, budget_s=budget(t), plan_cols=AT_1300, cost_j=2 * choice.gain_j) is None
    # on the point values, the plan on measured clocks only relies on nothing filled: nothing
    # to measure (with the models' uncertainty, see the next test)
    on_measured = np.full(4, int(np.flatnonzero(F == 1200.0)[0]))
    assert next_clock(t, budget_s=budget(t), plan_cols=on_measured, spread=0.0) is None
    # models that are sure (no curvature), or no margins at all: nothing to win back
    flat = dataclasses.replace(t, time_margin=np.zeros_like(t.time_us))
    assert next_clock(flat, budget_s=budget(t), plan_cols=AT_1300) is None
    none = dataclasses.replace(t, time_margin=None)
    assert next_clock(none, budget_s=budget(t), plan_cols=AT_1300) is None


def test_a_step_the_point_values_miss_is_worth_measuring_under_the_models_uncertainty():
    """A plateau inside a gap, faster and cheaper than the models say (Perseus's A40 stages run
    6% faster at 1035-1050 MHz than at 1065): the point values see nothing to gain where the plan
    sits on measured clocks; the expected improvement under the models' own uncertainty names a
    clock in the gap, and measuring it lets the plan save energy within the same budget."""
    t = tables()
    at_1200 = np.full(4, int(np.flatnonzero(F == 1200.0)[0]))
    limit = budget(t, 0.17)  # the point-value plan: every op at the measured 1200 MHz
    assert next_clock(t, budget_s=limit, plan_cols=at_1200, spread=0.0) is None
    choice = next_clock(t, budget_s=limit, plan_cols=at_1200)
    assert choice is not None and 1000.0 < choice.freq_mhz < 1200.0
    assert choice.gap_mhz == (1000.0, 1200.0)
    # the truth: 1050-1150 MHz 5% faster and 3% cheaper than the models' point values (2.5
    # and 0 of their standard deviations at the gap's middle); measure the named clock
    step = (F > 1000.0) & (F < 1200.0)
    true_t = t.time_us * np.where(step, 0.95, 1.0)
    true_e = t.chip_energy_j * np.where(step, 0.97, 1.0)
    assert t.time_margin is not None and t.model_filled is not None
    c = int(np.flatnonzero(F == choice.freq_mhz)[0])

    def plan_energy(time_us: np.ndarray, energy_j: np.ndarray, margin: np.ndarray) -> float:
        """The exact plan's energy on the conservative times (HiGHS)."""
        return milp_solve(StageTables(time_us * 1e-6 * np.exp(margin), energy_j), limit).energy_j

    before = plan_energy(t.time_us, t.chip_energy_j, t.time_margin)
    now = ~t.model_filled
    now[:, c] = True
    time_us = np.where(now, true_t, t.time_us)  # the models keep their values elsewhere
    energy_j = np.where(now, true_e, t.chip_energy_j)
    margin = np.where(now, 0.0, 3.0 * 0.5 * 4e-6 * gap_reach(F, now))
    after = plan_energy(time_us, energy_j, margin)
    assert after < before * (1 - 1e-3)
    # the expected improvement is never below the point value's gain, and grows with the spread
    point = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=0.0)
    spread = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=1.0)
    wider = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=2.0)
    common = np.isin(spread[0], point[0])
    np.testing.assert_array_equal(spread[0][common], point[0])
    assert (spread[1][common] >= point[1] - 1e-15).all()
    assert (wider[1] >= spread[1] - 1e-15).all() and wider[1].sum() > spread[1].sum()


def test_a_clock_is_worth_what_the_models_uncertainty_holds_back():
    """Near-sure models hold back almost nothing: measuring buys almost nothing."""
    low = clock_gains(tables(curv=1e-9), budget_s=budget(tables()), plan_cols=AT_1300)
    high = clock_gains(tables(curv=8e-6), budget_s=budget(tables()), plan_cols=AT_1300)
    assert 0 < low[1].max() < 0.05 * high[1].max()


def test_next_clock_for_a_simulated_profile_names_an_unprofiled_clock_in_a_gap(sim_profile_auto):
    profile, spec = sim_profile_auto
    fitted = fit_profile(profile, spec=spec)
    choice = next_clock_for(fitted, target=0.10, cost_j=0.0)
    profiled = set(profile.freqs_mhz)
    assert choice is not None
    assert choice.freq_mhz in spec.freqs_mhz and choice.freq_mhz not in profiled
    low, high = choice.gap_mhz
    assert low in profiled and high in profiled and low < choice.freq_mhz < high
    # every clock profiled: the models fill nothing, nothing to add
    assert next_clock_for(fit_profile(profile, spec=spec, values="measured"), target=0.1) is None


@pytest.fixture(scope="module")
def sim_profile_auto():
    """A simulated GPU's profile of a small workload at its ``auto`` clocks, and its device."""
    dev = SimulatedDevice.from_preset("ascend-910b-like", seed=0)
    clocks = auto_clocks(dev.spec.freqs_mhz, max_gap=None)  # four filled
    return dev.profile(load_workload("resnet50"), clocks, iterations=3), dev.spec


def test_ops_measured_at_other_clocks_give_the_same_gains_by_the_full_path():
    """A sweep's shared pattern takes a shortcut (the gap's columns); one op apart takes none.

    On the point values: with the models' uncertainty, op 0's own clocks would also change its
    leave-one-clock-out reach (:func:`test_the_leave_one_clock_out_reach`).
    """
    t = tables()
    assert t.model_filled is not None
    fast = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=0.0)
    apart = t.model_filled.copy()
    apart[0, 0] = True  # op 0 not measured at 1000 MHz (its margin there stays 0)
    full = clock_gains(
        dataclasses.replace(t, model_filled=apart),
        budget_s=budget(t),
        plan_cols=AT_1300,
        spread=0.0,
    )
    np.testing.assert_array_equal(fast[0], full[0])
    np.testing.assert_allclose(fast[1], full[1], rtol=1e-12)


def test_the_leave_one_clock_out_reach():
    """The mean reach of the interior measured clocks left out; the widest reach without one."""
    rows = np.stack([MEASURED, MEASURED | (F == 1100.0), MEASURED & (F > 1000.0)])
    reach = loo_reach(F, rows)[:, 0]
    assert reach[0] == pytest.approx(200.0 * 200.0)  # 1200 between 1000 and 1400
    # 1100 between 1000 and 1200, 1200 between 1100 and 1400
    assert reach[1] == pytest.approx((100.0 * 100.0 + 100.0 * 200.0) / 2)
    # 1200 and 1400 only: no interior clock, the widest reach (1000 MHz, beyond the range)
    assert reach[2] == pytest.approx(gap_reach(F, rows[2:]).max())


def test_the_expected_improvement_is_the_mean_saving_of_a_normal_cost():
    """``E[max(m + s Z, 0)]`` in closed form against a sample; ``max(m, 0)`` where s is 0."""
    margin = np.array([-2.0, -0.5, 0.0, 0.3, 1.5, 0.7, -0.7])
    sd = np.array([1.0, 0.5, 2.0, 0.1, 1.0, 0.0, 0.0])
    z = np.random.default_rng(0).standard_normal((200_000, 1))
    sample = np.maximum(margin + sd * z, 0.0).mean(axis=0)
    got = _expected_improvement(margin, sd)
    assert (np.abs(got - sample) <= 4e-3 * np.maximum(sd, 0.1)).all(), (got, sample)
    np.testing.assert_array_equal(got[-2:], [0.7, 0.0])


# A program change inside a gap (Perseus's BLOOM A40 forward stages: 6% faster at 1035-1050 MHz
# than at 1065): below 1200 MHz the ops run a faster program than from 1200 up, so the time
# measured at 1300 is above the one at 1100 although the clock is higher.
F_STEP = np.arange(1000.0, 1401.0, 25.0)
MEASURED_STEP = np.isin(F_STEP, [1000.0, 1100.0, 1300.0, 1400.0])


def step_truth(n_ops: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Time (us) and energy (J): compute-bound, the program 20% faster below 1250 MHz."""
    time_us = 100.0 * (F_STEP[-1] / F_STEP) * np.where(F_STEP < 1250.0, 0.8, 1.0)
    energy_j = 1e-3 * time_us / 100.0 * (F_STEP / F_STEP[-1]) ** 2
    return np.tile(time_us, (n_ops, 1)), np.tile(energy_j, (n_ops, 1))


def step_tables(n_ops: int = 4, curv: float = 1e-7) -> Predictions:
    """The truth at the measured clocks; between them the models' log-linear interpolation."""
    true_t, true_e = step_truth(n_ops)
    filled = np.broadcast_to(~MEASURED_STEP, true_t.shape).copy()
    m = np.flatnonzero(MEASURED_STEP)
    time_us = np.exp([np.interp(F_STEP, F_STEP[m], np.log(row[m])) for row in true_t])
    energy_j = np.exp([np.interp(F_STEP, F_STEP[m], np.log(row[m])) for row in true_e])
    margin = np.where(filled, 3.0 * 0.5 * curv * gap_reach(F_STEP, ~filled), 0.0)
    names = np.array([f"op{i}" for i in range(n_ops)])
    core = np.full(time_us.shape, np.nan)
    return Predictions(
        names, F_STEP, time_us, energy_j, core, time_margin=margin, model_filled=filled
    )


def test_a_gap_where_the_measured_time_rises_with_the_clock_holds_a_step():
    """The chance that a clock runs the lower clocks' program, and its values there."""
    t = step_tables()
    time_s, energy_j = t.time_us * 1e-6, t.chip_energy_j
    chance, low_t, low_e = lower_regime(F_STEP, time_s, energy_j, MEASURED_STEP[None, :])
    in_gap = (F_STEP > 1100.0) & (F_STEP < 1300.0)
    # the step's place uniform over 1100-1300: a clock runs the lower program if it is above
    np.testing.assert_allclose(chance[0, in_gap], (1300.0 - F_STEP[in_gap]) / 200.0)
    np.testing.assert_array_equal(chance[:, ~in_gap], 0.0)  # measured, no clock below, falls
    # there: the lower clocks' trend, log-linear through 1000 and 1100 MHz
    i_ll, i_l = (int(np.flatnonzero(F_STEP == f)[0]) for f in (1000.0, 1100.0))
    share = (F_STEP[in_gap] - 1100.0) / 100.0
    for table, low in ((time_s, low_t), (energy_j, low_e)):
        expect = table[0, i_l] * (table[0, i_l] / table[0, i_ll]) ** share
        np.testing.assert_allclose(low[0, in_gap], expect, rtol=1e-12)
        np.testing.assert_array_equal(low[:, ~in_gap], table[:, ~in_gap])
    # the lower program's trend is what the truth does there (the truth is log-linear-ish)
    true_t = step_truth()[0][0] * 1e-6
    below = in_gap & (F_STEP < 1200.0)
    np.testing.assert_allclose(low_t[0, below], true_t[below], rtol=0.01)
    # a table that falls with the clock (no program change) holds no step; nor a rise within
    # two standard deviations of the measured cells' noise (their margins)
    smooth = tables()
    chance_smooth = lower_regime(
        F, smooth.time_us, smooth.chip_energy_j, MEASURED[None, :] | (F == 1100.0)
    )[0]
    np.testing.assert_array_equal(chance_smooth, 0.0)
    i_r = int(np.flatnonzero(F_STEP == 1300.0)[0])
    rise = np.log(time_s[0, i_r] / time_s[0, i_l])
    noisy = np.zeros_like(time_s)
    noisy[:, [i_l, i_r]] = rise / (2.0 * np.sqrt(2.0)) * 1.01  # 2 sd of the difference: above it
    assert not lower_regime(F_STEP, time_s, energy_j, MEASURED_STEP[None, :], noisy)[0].any()
    noisy[:, [i_l, i_r]] *= 0.98 / 1.01
    assert lower_regime(F_STEP, time_s, energy_j, MEASURED_STEP[None, :], noisy)[0].any()


def test_a_step_where_the_measured_time_rises_is_worth_measuring_and_pays():
    """The models' spread (leave-one-clock-out errors, near 0 on these smooth-looking clocks)
    does not reach a program 20% faster; the rise across 1100-1300 MHz is evidence of it, and
    the clock named there lets the exact plan save energy within the same budget."""
    t = step_tables()
    limit = t.time_us[:, -1].sum() * 1e-6  # 0%: the point-value plan stays at the top clock
    on_top = np.full(4, len(F_STEP) - 1)
    # without the step: the models' spread sees nothing worth a sweep step
    assert next_clock(t, budget_s=limit, plan_cols=on_top, steps=False) is None
    choice = next_clock(t, budget_s=limit, plan_cols=on_top)  # steps: the default
    assert choice is not None and choice.gap_mhz == (1100.0, 1300.0)
    assert t.time_margin is not None and t.model_filled is not None
    true_t, true_e = step_truth()

    def plan_energy(cols_known: np.ndarray) -> float:
        """The exact plan on the conservative tables with ``cols_known`` measured (HiGHS)."""
        now = ~t.model_filled
        now[:, cols_known] = True
        time_us = np.where(now, true_t, t.time_us)
        energy_j = np.where(now, true_e, t.chip_energy_j)
        margin = np.where(now, 0.0, 3.0 * 0.5 * 1e-7 * gap_reach(F_STEP, now))
        tables_ = StageTables(time_us * 1e-6 * np.exp(margin), energy_j)
        return milp_solve(tables_, limit).energy_j

    c = int(np.flatnonzero(F_STEP == choice.freq_mhz)[0])
    before = plan_energy(np.zeros(0, dtype=int))
    assert plan_energy(np.array([c])) < 0.9 * before


def test_tables_without_a_rise_give_the_same_gains_with_or_without_steps():
    t = tables()
    for spread in (0.0, 1.0):
        with_steps = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=spread)
        plain = clock_gains(t, budget_s=budget(t), plan_cols=AT_1300, spread=spread, steps=False)
        np.testing.assert_array_equal(with_steps[0], plain[0])
        np.testing.assert_array_equal(with_steps[1], plain[1])
