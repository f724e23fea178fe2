import numpy as np
import pytest

from opdvfs.plan import dp
from opdvfs.plan.dp import StageTables, solve, stage_tables, viterbi
from opdvfs.plan.milp import milp_solve


def random_tables(rng, n_stages, n_clocks=5, switch=True):
    f = np.linspace(1.0, 1.8, n_clocks)
    a = rng.uniform(0, 1, n_stages)
    c = rng.uniform(0.2, 2, n_stages)
    time = (a[:, None] * f * 0.1 + c[:, None] / f) * 1e-3
    power = rng.uniform(50, 100, (n_stages, 1)) + rng.uniform(5, 40, (n_stages, 1)) * f**3
    return StageTables(
        time,
        power * time,
        switch_time_s=rng.uniform(0, 2e-4) if switch else 0.0,
        switch_energy_j=rng.uniform(0, 0.02) if switch else 0.0,
    )


def milp_optimum(tab: StageTables, budget: float) -> float:
    """The reference optimum: the same problem as a 0/1 programme for HiGHS."""
    result = milp_solve(tab, budget)
    assert result.status == "optimal" and result.gap_pct <= 1e-6
    return result.energy_j


@pytest.mark.parametrize("seed", range(12))
def test_dp_optimum_equals_the_milp_optimum(seed):
    rng = np.random.default_rng(seed)
    tab = random_tables(rng, int(rng.integers(2, 41)))
    budget = tab.time_s[:, -1].sum() * (1 + rng.uniform(0.01, 0.1))
    result = solve(tab, budget)
    optimum = milp_optimum(tab, budget)
    assert result.time_s <= budget * (1 + 1e-9)
    assert result.energy_j == pytest.approx(optimum, rel=1e-9)
    assert result.lower_bound_j <= optimum * (1 + 1e-9)
    assert result.status == "optimal"


@pytest.mark.parametrize("seed", range(4))
def test_certificate_is_a_valid_bound_and_matches_its_definition(seed):
    rng = np.random.default_rng(100 + seed)
    tab = random_tables(rng, 30)
    budget = tab.time_s[:, -1].sum() * 1.03
    result = solve(tab, budget, exact=False)
    assert result.lower_bound_j <= milp_optimum(tab, budget) * (1 + 1e-9)
    expected = (result.energy_j - result.lower_bound_j) / result.energy_j * 100
    assert result.gap_pct == pytest.approx(max(expected, 0.0), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_large_problem_gap_is_small_when_switch_latency_is_hidden(seed):
    """Predictive dispatch hides the switch latency: switches cost energy, not time."""
    rng = np.random.default_rng(7 + seed)
    base = random_tables(rng, 1000, n_clocks=9)
    tab = StageTables(base.time_s, base.energy_j, switch_time_s=0.0, switch_energy_j=1e-3)
    budget = tab.time_s[:, -1].sum() * 1.02
    result = solve(tab, budget)
    assert result.gap_pct <= 0.1
    assert result.time_s <= budget * (1 + 1e-12)


def test_no_slack_means_everything_at_the_top_clock():
    tab = random_tables(np.random.default_rng(3), 20, switch=False)
    result = solve(tab, tab.time_s[:, -1].sum())
    assert (result.clock == tab.shape[1] - 1).all()


def test_infeasible_budget():
    tab = random_tables(np.random.default_rng(4), 10)
    result = solve(tab, tab.time_s.min(axis=1).sum() * 0.5)
    assert result.status == "infeasible"


def test_vectorised_viterbi_equals_one_multiplier_at_a_time():
    tab = random_tables(np.random.default_rng(5), 50)
    lams = np.array([0.0, 10.0, 1e3, 1e5])
    together = viterbi(tab, lams)
    for k, lam in enumerate(lams):
        np.testing.assert_array_equal(together[k], viterbi(tab, float(lam)))


def test_stage_tables_sum_ops():
    ops_t = np.arange(12, dtype=float).reshape(6, 2)
    tab = stage_tables(ops_t, ops_t * 2, np.array([0, 2, 5]))
    np.testing.assert_allclose(tab.time_s, np.array([[2, 4], [18, 21], [10, 11]]) * 1e-6)
    np.testing.assert_allclose(tab.energy_j, np.array([[4, 8], [36, 42], [20, 22]]))


def brute_force(tab: StageTables, budget: float):
    import itertools

    plans = np.array(list(itertools.product(range(tab.shape[1]), repeat=tab.shape[0])))
    from opdvfs.plan.dp import evaluate_plans

    time, energy = evaluate_plans(tab, plans)
    return plans, time, energy


@pytest.mark.parametrize("lag_s", [0.0, 3e-4])
@pytest.mark.parametrize("seed", range(4))
def test_min_power_objective_matches_brute_force(seed, lag_s):
    """Within the budget, with reactive lag too (the shifted tables once dropped ``lag_s``)."""
    from dataclasses import replace

    from opdvfs.plan.dp import solve_min_power

    tab = replace(random_tables(np.random.default_rng(200 + seed), 7, n_clocks=3), lag_s=lag_s)
    budget = tab.time_s[:, -1].sum() * 1.05
    _, time, energy = brute_force(tab, budget)
    ok = time <= budget
    best_w = (energy[ok] / time[ok]).min()
    result = solve_min_power(tab, budget)
    assert result.time_s <= budget * (1 + 1e-12)
    assert result.energy_j / result.time_s == pytest.approx(best_w, rel=1e-9)
    # the certificate is on power: a valid bound, and the gap is its definition
    assert result.lower_bound_j is None
    assert result.lower_bound_power_w is not None
    assert result.lower_bound_power_w <= best_w * (1 + 1e-9)
    power_w = result.energy_j / result.time_s
    assert result.gap_pct == pytest.approx((power_w - result.lower_bound_power_w) / power_w * 100)
    assert result.status == "optimal" and result.gap_pct <= 1e-2


def test_frontier_is_pareto_and_spans_both_ends():
    from opdvfs.plan.dp import frontier

    tab = random_tables(np.random.default_rng(11), 7, n_clocks=3)
    points = frontier(tab)
    assert (np.diff(points[:, 0]) > 0).all() and (np.diff(points[:, 1]) < 0).all()
    _, time, energy = brute_force(tab, np.inf)
    assert points[:, 1].min() == pytest.approx(energy.min())  # least-energy plan
    assert points[:, 0].min() == pytest.approx(time.min())  # fastest plan
    # no frontier point is dominated by any plan
    for t, e, _ in points:
        assert not ((time < t - 1e-15) & (energy < e - 1e-12)).any()


@pytest.mark.parametrize("seed", range(4))
def test_lagging_switches_are_charged_exactly(seed):
    """Reactive dispatch: each stage's first lag_s runs at the previous clock."""
    base = random_tables(np.random.default_rng(300 + seed), 7, n_clocks=3)
    tab = StageTables(
        base.time_s, base.energy_j, base.switch_time_s, base.switch_energy_j, lag_s=3e-4
    )
    _, time, energy = brute_force(tab, np.inf)
    for lam in (0.0, 50.0, 500.0):
        plan = viterbi(tab, lam)
        t, e, _ = tab.evaluate(plan)
        assert e + lam * t == pytest.approx((energy + lam * time).min(), rel=1e-12)
    budget = tab.time_s[:, -1].sum() * 1.05
    result = solve(tab, budget)
    ok = time <= budget
    assert result.energy_j == pytest.approx(energy[ok].min(), rel=1e-12)
    # and the charge itself: a switch into stage 1 costs phi (T_old - T_new)
    two = StageTables(tab.time_s[:2], tab.energy_j[:2], lag_s=3e-4)
    t, _, _ = two.evaluate(np.array([2, 0]))
    phi = min(3e-4 / tab.time_s[1, 2], 1.0)
    expected = tab.time_s[0, 2] + tab.time_s[1, 0] + phi * (tab.time_s[1, 2] - tab.time_s[1, 0])
    assert t == pytest.approx(expected)


def nonconvex_tables(rng, n_stages, n_clocks=40):
    """Energy not convex in the clock (a static-power dent): hull plans miss the optimum."""
    f = np.linspace(1.0, 1.8, n_clocks)
    c = rng.uniform(0.5, 2, n_stages)
    time = (c[:, None] / f**0.6) * 1e-3
    power = 60 + 30 * f**3 + 25 * np.sin(9 * f + rng.uniform(0, 6, (n_stages, 1)))
    return StageTables(time, power * time)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_fill_closes_most_of_a_nonconvex_gap_without_the_exact_programme(seed):
    rng = np.random.default_rng(seed)
    tab = nonconvex_tables(rng, 14)
    budget = tab.time_s[:, -1].sum() * 1.06
    exact = solve(tab, budget, exact=True)
    optimum = milp_optimum(tab, budget)
    assert exact.energy_j == pytest.approx(optimum, rel=1e-9)
    quick = solve(tab, budget, exact=False)  # Lagrangian + greedy fill only
    assert quick.time_s <= budget * (1 + 1e-9)
    assert quick.lower_bound_j <= optimum * (1 + 1e-9)  # still a valid certificate
    assert quick.energy_j <= optimum * 1.01  # within 1% of the optimum


def _viterbi_reference(tables: StageTables, lam: float) -> np.ndarray:
    """The recursion one stage at a time, one multiplier, no reactive lag: the readable form."""
    cost = tables.energy_j + lam * tables.time_s
    jump = tables.switch_energy_j + lam * tables.switch_time_s
    best = cost[0].copy()
    back = []
    for s in range(1, tables.shape[0]):
        origin = int(np.argmin(best))
        switch = best[origin] + jump
        keep = best <= switch  # staying wins a tie
        back.append(np.where(keep, np.arange(len(best)), origin))
        best = np.where(keep, best, switch) + cost[s]
    clock = [int(np.argmin(best))]
    for pointers in reversed(back):
        clock.append(int(pointers[clock[-1]]))
    return np.asarray(clock[::-1])


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("block", [3, 16384])
def test_viterbi_equals_the_stage_by_stage_recursion(seed, block, monkeypatch):
    # same plans, ties included (rounded tables, clocks that cost the same), in blocks or not
    monkeypatch.setattr(dp, "_BLOCK_STAGES", block)
    rng = np.random.default_rng(seed)
    n_stages, n_clocks = int(rng.integers(1, 40)), int(rng.integers(1, 7))
    time_s, energy_j = rng.random((n_stages, n_clocks)), rng.random((n_stages, n_clocks))
    if seed % 2:
        time_s, energy_j = np.round(time_s, 1), np.round(energy_j, 1)
    if seed % 3 == 0:
        energy_j[: n_stages // 2] = energy_j[: n_stages // 2, :1]
    switch = (0.0, 0.0) if seed % 4 else (0.05, 0.2)
    tables = StageTables(time_s, energy_j, switch_time_s=switch[0], switch_energy_j=switch[1])
    lams = np.r_[0.0, 0.5, 1.0, rng.random(3) * 4]
    expected = np.stack([_viterbi_reference(tables, lam) for lam in lams])
    np.testing.assert_array_equal(viterbi(tables, lams), expected)
