"""Every decision ``opdvfs tune`` makes, replayed on recorded rounds (``opdvfs.tuner.policy``).

No training runs here: each test feeds the policy what a run measured (docs/guide/tune.md's run on
sim:a100-like, a real H200's null contrast, a saturated plan) and checks the decision the live
run took, as Zeus's ``test_power_limit_optimizer.py`` replays profiles through its optimiser.
"""

import math

import pytest

from opdvfs import Schedule
from opdvfs.exceptions import ValidationError
from opdvfs.sim.presets import preset_spec
from opdvfs.tuner.ab import BLOCK_COUNTER_UPDATES, DEFAULT_BLOCK
from opdvfs.tuner.policy import (
    CHOSEN_BY_LOW,
    CHOSEN_BY_MEAN,
    CHOSEN_BY_SLOWDOWN,
    Measured,
    applies,
    block_size,
    cached_applies,
    choose_round,
    fit_budget,
    profile_clocks,
)
from opdvfs.tuner.result import Interval, TuneRound

TARGET = 0.02


def stand_in_plan(budget: float) -> Schedule:
    """A plan that remembers its budget (``target``); each budget plans another clock."""
    return Schedule.from_stage_freqs(
        [0], [1000.0 - 1e4 * budget], n_ops=1, target=budget, solver="stand-in"
    )


def tuned_round(budget: float, slowdown: Interval, saving: Interval | None) -> TuneRound:
    return TuneRound(budget, 5, None, None, slowdown, saving, slowdown.n)


#: docs/guide/tune.md's run on sim:a100-like (tiny GPT, 200 steps, --target 0.02), as it was
#: before active profiling added a clock to its sweep: what each round's A/B blocks measured,
#: by the budget it was planned at (3 pairs each).
RECORDED = {
    0.0200: (Interval(-0.0002, -0.0005, 0.0000, 3), Interval(0.1486, 0.1483, 0.1489, 3)),
    0.0392: (Interval(-0.00004, -0.0002, 0.0002, 3), Interval(0.1655, 0.1654, 0.1657, 3)),
    0.0582: (Interval(0.0027, 0.0006, 0.0048, 3), Interval(0.1791, 0.1775, 0.1808, 3)),
}


def replay(recorded):
    """A ``measure`` answering each plan with the round recorded nearest its budget."""
    rounds: list[TuneRound] = []

    def measure(schedule: Schedule) -> Measured:
        budget = min(recorded, key=lambda b: abs(b - schedule.target))
        assert abs(budget - schedule.target) < 5e-5, f"no round was recorded at {schedule.target}"
        slowdown, saving = recorded[budget]
        rounds.append(tuned_round(schedule.target, slowdown, saving))
        return Measured.of(rounds[-1])

    return rounds, measure


def test_the_recorded_run_replays_to_the_same_clocks_budgets_and_round():
    """The guide's run: clocks, then budgets 2.00 -> 3.92 -> 5.82%, then round 3 applied."""
    spec = preset_spec("a100-like")
    assert profile_clocks(spec.freqs_mhz) == (1410.0, 1305.0, 1200.0, 810.0, 210.0)
    rounds, measure = replay(RECORDED)
    fit = fit_budget(stand_in_plan, measure, target=TARGET, rounds=3)
    assert [round(r.budget, 4) for r in fit.rounds] == [0.02, 0.0392, 0.0582]
    index, met, chosen_by = choose_round(rounds, TARGET)
    assert (index, met, chosen_by) == (2, True, CHOSEN_BY_LOW)
    assert applies(rounds[index], met)
    # the same choice fit_budget's mean would make here; the rule differs on noisy rounds below
    assert fit.best is fit.rounds[index]


def test_a_noisy_lucky_round_loses_to_a_sure_one():
    """The H200 null contrast: the highest mean is the luckiest draw, the lower bound is not."""
    lucky = tuned_round(
        0.02, Interval(0.004, -0.01, 0.018, 3), Interval(0.0591, -0.1921, 0.3104, 3)
    )
    sure = tuned_round(0.03, Interval(0.006, 0.001, 0.011, 3), Interval(0.0053, -0.0086, 0.0192, 3))
    index, met, chosen_by = choose_round([lucky, sure], TARGET)
    assert (index, met, chosen_by) == (1, True, CHOSEN_BY_LOW)
    # neither interval excludes no saving, yet the chosen one's mean is above 0: it applies
    assert applies(sure, met)


def test_rounds_over_the_target_keep_the_least_slowdown_and_a_loss_never_applies():
    over = [
        tuned_round(0.02, Interval(0.031, 0.02, 0.04, 3), Interval(0.12, 0.1, 0.14, 3)),
        tuned_round(0.01, Interval(0.024, 0.02, 0.03, 3), Interval(0.08, 0.07, 0.09, 3)),
    ]
    assert choose_round(over, TARGET) == (1, False, CHOSEN_BY_SLOWDOWN)
    assert applies(over[1], False)  # it still saved energy: the least slowdown applies
    loss = tuned_round(
        0.02, Interval(0.0, -0.001, 0.001, 3), Interval(-0.0006, -0.0009, -0.0002, 3)
    )
    assert choose_round([loss], TARGET)[:2] == (0, True)
    assert not applies(loss, True)  # measured more energy than the top clock
    one_pair = tuned_round(
        0.02, Interval(0.01, math.nan, math.nan, 1), Interval(0.1, math.nan, math.nan, 1)
    )
    assert choose_round([one_pair], TARGET)[2] == CHOSEN_BY_MEAN
    with pytest.raises(ValidationError):
        choose_round([], TARGET)


def test_a_saturated_plan_is_measured_once():
    """Every stage at its lowest useful clock already: a larger budget plans the same stages."""
    rounds, measure = replay({0.02: RECORDED[0.02]})
    same = Schedule.from_stage_freqs([0], [810.0], n_ops=1, target=0.02, solver="stand-in")
    fit = fit_budget(lambda b: same.model_copy(update={"target": b}), measure, target=TARGET)
    assert len(fit.rounds) == len(rounds) == 1


@pytest.mark.parametrize(
    ("given", "exact", "counter_s", "iteration_s", "block", "why"),
    [
        (5, True, 0.1, 0.125, 5, "given"),
        (None, True, 0.1, 0.125, DEFAULT_BLOCK, "exact"),
        (None, False, None, 0.125, DEFAULT_BLOCK, "no energy counter"),
        # NVML's 100 ms counter, 125 ms iterations: 8 counted iterations span 10 updates
        (None, False, 0.1, 0.125, 9, f"{BLOCK_COUNTER_UPDATES} updates of the 100 ms"),
        # iterations longer than the counter's window: the floor
        (None, False, 0.1, 5.0, DEFAULT_BLOCK, "span >="),
        (None, False, 0.1, None, DEFAULT_BLOCK, "no iteration time"),
    ],
)
def test_the_block_length_follows_the_energy_counter(
    given, exact, counter_s, iteration_s, block, why
):
    got, reason = block_size(
        given, exact_counter=exact, counter_s=counter_s, iteration_s=iteration_s
    )
    assert got == block
    assert why in reason


def test_given_clocks_are_kept_and_a_word_other_than_auto_is_refused():
    assert profile_clocks([210.0, 1410.0], [1410.0, 810.0]) == (1410.0, 810.0)
    with pytest.raises(ValidationError):
        profile_clocks([210.0, 1410.0], "max")


def test_a_cached_schedule_applies_only_where_it_fits_this_run():
    plan = Schedule.from_stage_freqs([0, 4], [1410.0, 810.0], n_ops=8, target=0.02, solver="x")
    supported = (210.0, 810.0, 1410.0)
    assert cached_applies(plan, by_time=False, n_launches=8, supported_mhz=supported)
    # by operator: another operator count is another job's plan
    assert not cached_applies(plan, by_time=False, n_launches=9, supported_mhz=supported)
    # by time the operators do not matter, the clocks do: an edited entry off the device's list
    assert cached_applies(plan, by_time=True, n_launches=0, supported_mhz=supported)
    assert not cached_applies(plan, by_time=True, n_launches=0, supported_mhz=(210.0, 1410.0))
