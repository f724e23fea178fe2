"""The closed budget loop (issue 19, reused by `opdvfs tune`): plan at a budget, measure the
slowdown the plan really costs, re-plan until it is within the target -- on synthetic
responses (the loop's arithmetic) and on the twin in both trigger modes (needs torch for the
time mode's offsets)."""

import math

import pytest

from opdvfs import Schedule
from opdvfs.exceptions import ValidationError
from opdvfs.tuner.policy import Measured, fit_budget

TARGET = 0.02


def plan_at(budget: float) -> Schedule:
    """A stand-in plan that remembers the budget it was planned at (its ``target``).

    Each budget plans another clock (a plan moves with its budget), so no two rounds repeat one.
    """
    freq_mhz = 1000.0 - 1e4 * budget
    return Schedule.from_stage_freqs([0], [freq_mhz], n_ops=1, target=budget, solver="stand-in")


def responding(slowdown) -> tuple[list[float], object]:
    """A measure whose slowdown is ``slowdown(budget)`` (saving grows with it); and its log."""
    seen: list[float] = []

    def measure(schedule: Schedule) -> Measured:
        seen.append(schedule.target)
        s = slowdown(schedule.target)
        return Measured(slowdown=s, saving=2 * s)

    return seen, measure


def test_an_overshoot_the_models_miss_is_planned_away_in_one_step():
    seen, measure = responding(lambda b: b + 0.012)  # the twin is 1.2 points slower
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert seen[0] == TARGET  # round 1 plans at the target itself
    assert len(fit.rounds) == 2 and fit.met
    # aimed at the middle of [0.018, 0.02]
    assert fit.best.budget == pytest.approx(0.019 - 0.012)
    assert fit.best.measured.slowdown == pytest.approx(0.019)
    assert fit.schedule.target == fit.best.budget


def test_a_steeper_response_converges_by_interpolation():
    _seen, measure = responding(lambda b: 1.6 * b + 0.004)
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert fit.met and 0.9 * TARGET <= fit.best.measured.slowdown <= TARGET
    assert len(fit.rounds) <= 4


def test_an_undershooting_plan_gets_more_budget():
    _seen, measure = responding(lambda b: 0.5 * b)  # the device hides half the slowdown
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert fit.met and fit.best.budget > TARGET
    assert 0.9 * TARGET <= fit.best.measured.slowdown <= TARGET


def test_a_bumpy_response_still_ends_within_the_target():
    # each plan is another set of stages: the slowdown is not monotone in the budget
    seen, measure = responding(lambda b: b + 0.011 + 0.002 * math.sin(b * 4000))
    fit = fit_budget(plan_at, measure, target=TARGET, rounds=8)
    assert fit.met and fit.best.measured.slowdown <= TARGET
    assert len(set(seen)) == len(seen)  # never the same budget twice


def test_an_unreachable_target_says_so_and_keeps_the_least_slowdown():
    seen, measure = responding(lambda b: 0.03 + 0.1 * b)
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert not fit.met
    assert fit.best.measured.slowdown == min(r.measured.slowdown for r in fit.rounds)
    assert all(b >= 0 for b in seen) and len(seen) <= 6


def test_a_plan_saturated_in_the_budget_is_measured_once():
    # past 2.5% every budget plans the same stages (all at their lowest useful clock): the
    # undershooting plan is not measured again at a larger budget
    def saturated(budget: float) -> Schedule:
        return plan_at(min(budget, 0.025))

    seen, measure = responding(lambda b: 0.5 * min(b, 0.025))
    fit = fit_budget(saturated, measure, target=TARGET)
    assert seen == [TARGET, 0.025]  # the third budget planned the 2.5% plan again: stop
    assert len(fit.rounds) == 2 and fit.best.schedule.target == 0.025


def test_a_budget_found_on_the_twin_starts_the_real_rounds():
    seen, measure = responding(lambda b: b + 0.012)
    fit = fit_budget(plan_at, measure, target=TARGET, start=0.0075)
    assert seen == [0.0075] and fit.met and len(fit.rounds) == 1  # already within


def test_bad_arguments():
    _seen, measure = responding(lambda b: b)
    with pytest.raises(ValidationError, match="target 0"):
        fit_budget(plan_at, measure, target=0.0)
    with pytest.raises(ValidationError, match="rounds 0"):
        fit_budget(plan_at, measure, target=TARGET, rounds=0)
    with pytest.raises(ValidationError, match="start -0.01"):
        fit_budget(plan_at, measure, target=TARGET, start=-0.01)


def test_on_the_twin_the_closed_loop_brings_both_modes_within_the_target():
    pytest.importorskip("torch")
    from opdvfs.experiments.bench import prepare, twin_measure
    from opdvfs.plan.planner import plan_schedule
    from opdvfs.workloads.library import load_workload
    from opdvfs.workloads.workload import Workload

    # the first 4000 ops of GPT-3 (4 micro-batches forward, the start of the backward)
    ops = load_workload("gpt3").ops.iloc[:4000].reset_index(drop=True)
    work = Workload(ops, name="gpt3[:4000]")
    bench = prepare(work, "a100-like")
    device = bench.device

    def plan(budget: float) -> Schedule:
        return plan_schedule(
            bench.predictions,
            bench.inputs,
            target=budget,
            switch_latency_ms=device.spec.switch_latency_ms,
            interval_ms=75.0,
        )

    fits = {}
    for trigger in ("op", "time"):
        measure = twin_measure(device, work, trigger=trigger)
        open_loop = measure(plan(TARGET))
        assert open_loop.slowdown > TARGET  # the fitted models miss some of the twin's physics
        fit = fit_budget(plan, measure, target=TARGET)
        assert fit.rounds[0].measured == open_loop
        assert fit.met and fit.best.measured.slowdown <= TARGET
        assert fit.best.budget < TARGET
        fits[trigger] = fit
    # within the same budget, time mode keeps op mode's saving (issue 19's acceptance)
    kept = fits["time"].best.measured.saving / fits["op"].best.measured.saving
    assert kept >= 0.95
    # its offsets learned from a measured run: the planner's predicted ones overshoot more
    planned = twin_measure(device, work, trigger="time", offsets="planned")
    learned = twin_measure(device, work, trigger="time")
    assert planned(plan(TARGET)).slowdown > learned(plan(TARGET)).slowdown


def test_over_the_target_the_loop_goes_down_to_budget_0_before_it_stops():
    # round 1 (2%) measures 4.5%: the one-for-one step (to -0.6%) reached below 0 and the loop
    # stopped over the target; budget 0 measures within it (then interpolated up)
    seen, measure = responding(lambda b: 1.5 * b + 0.015)
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert seen[:2] == [TARGET, 0.0] and fit.met
    # a lower budget that plans a plan already measured is not the end: lower still
    same_above = 0.005

    def saturated(budget: float) -> Schedule:
        return plan_at(TARGET if budget >= same_above else budget)  # from 0.5% up: alike

    seen, measure = responding(lambda b: 0.03 if b >= same_above else 0.01)
    fit = fit_budget(saturated, measure, target=TARGET)
    assert seen[0] == TARGET and seen[-1] < same_above and fit.met
    # nothing within the target at any budget: measured down to 0, then the least slow
    seen, measure = responding(lambda b: 0.03 + b)
    fit = fit_budget(plan_at, measure, target=TARGET)
    assert not fit.met and seen[-1] == 0.0 and fit.best.budget == 0.0
