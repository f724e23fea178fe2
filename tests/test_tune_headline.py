"""tune's headline: steady state, the whole run with its tuning, break-even, the static clock."""

import itertools
import json
import math
from pathlib import Path

import pytest

from opdvfs.exceptions import ValidationError
from opdvfs.tuner.policy import BudgetFit, BudgetRound, Measured, split_rounds, static_budget
from opdvfs.tuner.result import TuneIteration, TuneResult, whole_run


def _rows(
    phases_energy: list[tuple[str, float | None]], time_s: float = 1.0
) -> list[TuneIteration]:
    return [
        TuneIteration(i, phase, 1410.0, time_s, energy)
        for i, (phase, energy) in enumerate(phases_energy)
    ]


# ----------------------------------------------------------------------------- the whole run
def test_break_even_is_the_iteration_from_which_the_running_excess_stays_at_or_below_zero():
    rows = _rows(
        [("warmup", 150.0)]  # an outlier first iteration: the top clock's too, no excess
        + [("counted", 130.0)] * 2  # profiling: +30 J each
        + [("reference", 100.0), ("tuned", 80.0)] * 2
        + [("steady", 80.0)] * 4  # -20 J each
    )
    run = whole_run(rows)
    assert run is not None
    # excess after each row: 0, 30, 60, 60, 40, 40, 20, 0, -20, -40, -60
    assert run.break_even == 7 and not run.projected
    assert run.tuning_cost_j == pytest.approx(60.0)
    assert run.steady_saving_j == pytest.approx(20.0)
    assert run.reference_iterations == 2
    assert run.energy_j == pytest.approx(150 + 260 + 360 + 320)
    assert run.top_energy_j == pytest.approx(150 + 100 * 10)
    assert run.saving == pytest.approx(1 - run.energy_j / run.top_energy_j)
    assert run.slowdown == pytest.approx(0.0)  # every row took 1 s


def test_a_run_that_ends_before_break_even_projects_it_at_the_steady_saving():
    rows = _rows([("warmup", 100.0), ("counted", 200.0), ("reference", 100.0), ("steady", 90.0)])
    run = whole_run(rows)
    assert run is not None and run.projected
    # excess at the end: 100 - 10 = 90 J; 10 J per steady iteration: 9 iterations more
    assert run.break_even == 3 + 9


def test_no_break_even_without_a_steady_saving():
    rows = _rows([("warmup", 100.0), ("counted", 200.0), ("reference", 100.0), ("steady", 101.0)])
    run = whole_run(rows)
    assert run is not None and run.break_even is None and not run.projected


def test_no_whole_run_without_reference_iterations_and_no_energy_without_a_counter():
    assert whole_run(_rows([("warmup", 1.0), ("steady", 1.0)])) is None
    run = whole_run(_rows([("warmup", None), ("reference", None), ("steady", None)]))
    assert run is not None and run.energy_j is None and run.saving is None
    assert run.break_even is None and math.isfinite(run.slowdown)


# ----------------------------------------------------------------------------- the policy
def test_the_static_clock_is_the_last_of_two_rounds_or_more():
    assert split_rounds(4) == (3, True)
    assert split_rounds(2) == (1, True)
    assert split_rounds(1) == (1, False)
    assert split_rounds(4, static=False) == (4, False)
    with pytest.raises(ValidationError):
        split_rounds(0)


def test_the_static_clock_is_planned_at_the_budget_of_the_per_operator_round_that_met():
    from opdvfs.schedule import Schedule

    plan = Schedule.from_stage_freqs([0], [1200.0], n_ops=1, target=0.04, solver="manual")
    met = BudgetRound(0.04, plan, Measured(slowdown=0.01, saving=0.1))
    fit = BudgetFit(0.02, (met,), met, True)
    assert static_budget(fit) == 0.04
    over = BudgetRound(0.02, plan, Measured(slowdown=0.05, saving=0.1))
    assert static_budget(BudgetFit(0.02, (over,), over, False)) == 0.02


# ----------------------------------------------------------------------------- one run
@pytest.mark.slow
def test_a_run_measures_the_static_clock_and_leads_with_the_headline(tmp_path):
    torch = pytest.importorskip("torch")
    import sys

    import opdvfs
    from opdvfs.tuner.report import summary_lines

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_gpt import TinyGPT, train_step

    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 40
    data = torch.randint(0, 64, (steps, 2, 17))
    with opdvfs.tune(
        target=0.02,
        actuator="sim:a100-like",
        work_scale=1e6,
        out=tmp_path,
        cache=False,
        clocks=[1410.0, 1380.0, 210.0],
        iterations_per_clock=1,
        block=2,
        pairs=2,
        rounds=2,
        command=["train", "--steps", "40"],
    ) as t:
        for batch in data:
            train_step(model, opt, batch)
    r: TuneResult = t.result
    assert r.error is None, r.error
    assert len(r.rounds) == 2 and r.rounds[0].static_mhz is None
    static = r.static
    assert static is r.rounds[1] and static.stages == 1
    assert static.freqs_mhz == (static.static_mhz,) and static.static_mhz < 1410.0
    # the applied schedule is the chosen round's: one stage at its clock when the static won
    assert r.best is not None and r.schedule is not None
    if r.best is static:
        assert [s.freq_mhz for s in r.schedule.stages] == [static.static_mhz]
    else:
        assert len(r.schedule.stages) == r.best.stages
    lines = summary_lines(r)
    assert lines[0].startswith("steady state (round ")
    assert lines[1].startswith("whole run, tuning included (40 iterations)")
    assert lines[2].startswith("break-even: ")
    assert lines[3].startswith(f"best static clock (nvidia-smi -lgc {static.static_mhz:g})")
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["command"] == ["train", "--steps", "40"] and "version" in doc
    assert doc["static_round"] == 1 and doc["range_mhz"] == [210.0, 1410.0]
    run = doc["whole_run"]
    assert run["iterations"] == steps and run["top_energy_j"] > 0
    assert run["saving"] == pytest.approx(1 - run["energy_j"] / run["top_energy_j"])
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    counters = {e["name"] for e in trace if e["ph"] == "C"}
    assert counters == {"clock_mhz", "power_w"}
    slices = [e for e in trace if e["ph"] == "X"]
    assert len(slices) == steps and {e["name"] for e in slices} >= {"warmup", "tuned", "steady"}
    assert all(a["ts"] + a["dur"] == pytest.approx(b["ts"]) for a, b in itertools.pairwise(slices))
    report = (tmp_path / "report.md").read_text()
    assert "![run.png](run.png)" in report and (tmp_path / "run.png").stat().st_size > 5000
