"""Active profiling: the next clock worth measuring for a plan (issue 31 item 2).

:func:`opdvfs.plan.active.next_clock` on synthetic tables whose answer is known by hand, and
:func:`~opdvfs.plan.active.next_clock_for` on a profile of a simulated GPU at its ``auto``
clocks.
"""

from __future__ import annotations

import numpy as np
import pytest

from opdvfs.exceptions import ValidationError
from opdvfs.plan.active import budget_price, clock_gains, next_clock, next_clock_for
from opdvfs.plan.measured import gap_reach
from opdvfs.plan.on_profile import auto_clocks, fit_profile
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads.library import load_workload

F = np.arange(1000.0, 1401.0, 50.0)  # 9 clocks, 1000..1400
MEASURED = np.isin(F, [1000.0, 1200.0, 1400.0])


def tables(curv: float = 4e-6, n_ops: int = 4):
    """Ops whose time ~ 1/f (compute-bound) and energy falls with the clock, 3 measured clocks.

    The margins are what the planner uses: 3 x curvature x reach / 2 at filled cells.
    """
    time_us = 100.0 * (F[-1] / F)[None, :] * np.ones((n_ops, 1))
    energy_j = 1e-3 * (F / F[-1])[None, :] ** 2 * np.ones((n_ops, 1))
    filled = np.broadcast_to(~MEASURED, time_us.shape).copy()
    reach = gap_reach(F, ~filled)
    margin = np.where(filled, 3.0 * 0.5 * curv * reach, 0.0)
    return time_us, energy_j, margin, filled


def test_gap_reach_is_zero_at_measured_clocks_and_the_product_of_distances_between():
    reach = gap_reach(F, MEASURED[None, :])[0]
    np.testing.assert_array_equal(reach[MEASURED], 0.0)
    assert reach[F == 1100.0][0] == pytest.approx(100.0 * 100.0)
    assert reach[F == 1250.0][0] == pytest.approx(50.0 * 150.0)


def test_the_budget_price_is_the_least_that_meets_the_budget():
    time_us, energy_j, _, _ = tables()
    time_s = time_us * 1e-6
    budget = 1.05 * time_s[:, -1].sum()
    price = budget_price(time_s, energy_j, budget)
    cols = np.argmin(energy_j + price * time_s, axis=1)
    assert time_s[np.arange(4), cols].sum() <= budget
    cheaper = np.argmin(energy_j + 0.99 * price * time_s, axis=1)
    assert time_s[np.arange(4), cheaper].sum() > budget  # the least price: any less misses it
    assert budget_price(time_s, energy_j, 10 * time_s.sum()) == 0.0  # least energy fits
    with pytest.raises(ValidationError, match="no plan fits"):
        budget_price(time_s, energy_j, 0.5 * time_s[:, -1].sum())


def test_the_clock_named_splits_the_gap_the_plan_uses_and_its_gain_is_the_relaxed_saving():
    time_us, energy_j, margin, filled = tables()
    budget_s = 1.10 * time_us[:, -1].sum() * 1e-6
    plan_cols = np.full(4, int(np.flatnonzero(F == 1300.0)[0]))  # filled, in the 1200-1400 gap
    candidates, gains, plan_j = clock_gains(
        F, time_us, energy_j, margin, None, filled, budget_s=budget_s, plan_cols=plan_cols
    )
    # only the gap the plan uses: 1250, 1300, 1350 (not 1050-1150, where it puts nothing)
    np.testing.assert_array_equal(F[candidates], [1250.0, 1300.0, 1350.0])
    assert (gains > 0).all()
    assert gains.max() < 0.1 * plan_j  # a share of the plan's energy, not more
    # the gain by hand: the relaxed plan on the conservative tables at the budget's price,
    # before and after the candidate's own margin is gone and its neighbours' shrink
    t_up = time_us * 1e-6 * np.exp(margin)
    price = budget_price(t_up, energy_j, budget_s)
    before = (energy_j + price * t_up).min(axis=1).sum()
    k = int(np.argmax(gains))
    c = candidates[k]
    now = ~filled
    now[:, c] = True
    after_margin = np.where(now, 0.0, 3.0 * 0.5 * 4e-6 * gap_reach(F, now))
    after = (energy_j + price * time_us * 1e-6 * np.exp(after_margin)).min(axis=1).sum()
    assert gains[k] == pytest.approx(before - after, rel=1e-9)
    choice = next_clock(
        F, time_us, energy_j, margin, None, filled, budget_s=budget_s, plan_cols=plan_cols
    )
    assert choice is not None
    assert choice.freq_mhz == F[c]
    assert choice.gap_mhz == (1200.0, 1400.0)
    assert choice.ops_in_gap == 4
    assert choice.gain_j == pytest.approx(gains.max())
    assert "1200-1400 MHz gap" in choice.why()


def test_no_clock_when_the_gain_is_below_its_cost_or_nothing_is_filled_where_the_plan_goes():
    time_us, energy_j, margin, filled = tables()
    budget_s = 1.10 * time_us[:, -1].sum() * 1e-6
    plan_cols = np.full(4, int(np.flatnonzero(F == 1300.0)[0]))
    args = (F, time_us, energy_j, margin, None, filled)
    choice = next_clock(*args, budget_s=budget_s, plan_cols=plan_cols)
    assert choice is not None
    assert (
        next_clock(*args, budget_s=budget_s, plan_cols=plan_cols, cost_j=2 * choice.gain_j) is None
    )
    # the plan on measured clocks only: nothing filled it relies on, nothing to measure
    on_measured = np.full(4, int(np.flatnonzero(F == 1200.0)[0]))
    assert next_clock(*args, budget_s=budget_s, plan_cols=on_measured) is None
    # models that are sure (no curvature): no margin to win back
    flat = np.zeros_like(margin)
    assert (
        next_clock(F, time_us, energy_j, flat, None, filled, budget_s=budget_s, plan_cols=plan_cols)
        is None
    )


def test_a_clock_is_worth_what_the_models_uncertainty_holds_back():
    """Near-sure models hold back almost nothing: measuring buys almost nothing."""
    time_us, energy_j, margin, filled = tables(curv=1e-9)
    budget_s = 1.10 * time_us[:, -1].sum() * 1e-6
    plan_cols = np.full(4, int(np.flatnonzero(F == 1300.0)[0]))
    low = clock_gains(
        F, time_us, energy_j, margin, None, filled, budget_s=budget_s, plan_cols=plan_cols
    )
    _, _, margin2, _ = tables(curv=8e-6)
    high = clock_gains(
        F, time_us, energy_j, margin2, None, filled, budget_s=budget_s, plan_cols=plan_cols
    )
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
