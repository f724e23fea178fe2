import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.classify import HIGH, LOW, classify_by_ratios, classify_by_sensitivity, sensitivity
from opdvfs.plan.planner import PlanInputs, plan_schedule
from opdvfs.plan.segment import segment
from opdvfs.sim import SimulatedDevice
from opdvfs.sim.presets import get_preset
from opdvfs.workloads.library import BUILDERS

ASCEND = get_preset("ascend-910b-like")


def test_sensitivity_and_classes():
    s = sensitivity(
        np.array([180.0, 100.0, 140.0]), np.array([100.0, 100.0, 100.0]), 1000.0, 1800.0
    )
    np.testing.assert_allclose(s, [1.0, 0.0, np.log(1.4) / np.log(1.8)])
    classes = classify_by_sensitivity(s, np.array(["compute", "compute", "comm"]))
    assert classes.tolist() == [HIGH, LOW, LOW]


def test_paper_classification_rules():
    ops = pd.DataFrame(
        {
            "stream": ["compute"] * 5,
            "ratio_mac": [0.90, 0.30, 0.10, 0.50, np.nan],
            "ratio_vec": [0.05, 0.20, 0.10, 0.50, np.nan],
            "ratio_mte2": [0.30, 0.85, 0.20, 0.30, np.nan],
            "ratio_mte3": [0.10, 0.20, 0.10, 0.10, np.nan],
        }
    )
    classes, bound = classify_by_ratios(ops)
    assert bound.tolist() == ["core:mac", "uncore:mte2", "no-pipeline", "latency", "off-core"]
    assert classes.tolist() == [HIGH, LOW, LOW, HIGH, LOW]


def test_segment_respects_the_interval_and_keeps_long_runs():
    rng = np.random.default_rng(0)
    classes = np.repeat(rng.integers(0, 2, 400), rng.integers(1, 6, 400))
    dur = rng.uniform(50, 2000, len(classes))
    starts, stage_class = segment(classes, dur, interval_us=5000.0)
    assert starts[0] == 0 and (np.diff(starts) > 0).all()
    stage_time = np.add.reduceat(dur, starts)
    assert (stage_time >= 5000.0).all()
    # a single long run of one class is never cut or swallowed
    classes = np.r_[np.ones(10), np.zeros(50), np.ones(10)].astype(int)
    dur = np.r_[np.full(10, 100.0), np.full(50, 1000.0), np.full(10, 100.0)]
    starts, stage_class = segment(classes, dur, interval_us=5000.0)
    lfc = np.flatnonzero(stage_class == LOW)
    assert len(lfc) == 1
    assert np.add.reduceat(dur, starts)[lfc[0]] >= 50 * 1000.0


@pytest.fixture(scope="module")
def bert_models():
    dev = SimulatedDevice.from_preset("ascend-910b-like")
    w = BUILDERS["bert"]()
    profile = dev.profile(w, [1000, 1400, 1800])
    models = ModelBundle(
        PerfModel().fit(profile), PowerModel().fit(profile, [1000, 1800], device=ASCEND.spec)
    )
    inputs = PlanInputs.from_workload(w, ASCEND.spec.freqs_mhz, device=ASCEND.spec.name)
    return dev, w, models, inputs


def test_plan_meets_the_budget_when_executed(bert_models):
    dev, w, models, inputs = bert_models
    schedule = plan_schedule(models, inputs, target=0.02, objective="core-energy")
    assert schedule.predicted_time_s <= 1.02 * schedule.baseline_time_s * (1 + 1e-9)
    assert schedule.gap_pct is not None and schedule.gap_pct <= 0.1
    base, _ = dev.run(w)
    planned, _ = dev.run(w, schedule)
    assert planned.iteration_time_s <= 1.025 * base.iteration_time_s  # measured on the twin
    assert planned.core_energy_j < 0.97 * base.core_energy_j
    predicted = schedule.predicted_core_energy_j / schedule.baseline_core_energy_j
    measured = planned.core_energy_j / base.core_energy_j
    assert predicted == pytest.approx(measured, abs=0.01)


def test_plan_with_the_throughput_power_form(bert_models):
    """The planner hands the power model its predicted times; the plan's energy holds up."""
    dev, w, models, inputs = bert_models
    profile = dev.profile(w, [1000, 1800])
    power = PowerModel(dynamic="throughput").fit(
        profile, device=ASCEND.spec, calibration=dev.calibration_runs()
    )
    schedule = plan_schedule(
        ModelBundle(models.perf, power), inputs, target=0.02, objective="core-energy"
    )
    base, _ = dev.run(w)
    planned, _ = dev.run(w, schedule)
    predicted = schedule.predicted_core_energy_j / schedule.baseline_core_energy_j
    measured = planned.core_energy_j / base.core_energy_j
    assert measured < 0.97
    assert predicted == pytest.approx(measured, abs=0.01)


def test_predictive_dispatch_issues_switches_early(bert_models):
    _, _, models, inputs = bert_models
    early = plan_schedule(
        models, inputs, target=0.05, objective="core-energy", switch_latency_ms=2.0
    )
    late = plan_schedule(
        models,
        inputs,
        target=0.05,
        objective="core-energy",
        switch_latency_ms=2.0,
        dispatch="reactive",
    )
    lead = [early.stages[w.stage].first_op - w.trigger_op for w in early.switches[1:]]
    assert max(lead) > 0
    assert all(late.stages[w.stage].first_op == w.trigger_op for w in late.switches)
    assert all(w.delay_us == 0 for w in late.switches)


def test_predictive_switches_land_when_their_stage_starts():
    """Trigger op + delay + latency = the stage's start in the planned run, on the twin too."""
    dev = SimulatedDevice(ASCEND.spec.model_copy(update={"switch_latency_ms": 15.0}), ASCEND.twin)
    w = BUILDERS["bert"]()
    profile = dev.profile(w, [1000, 1400, 1800])
    models = ModelBundle(
        PerfModel().fit(profile), PowerModel().fit(profile, [1000, 1800], device=ASCEND.spec)
    )
    inputs = PlanInputs.from_workload(w, ASCEND.spec.freqs_mhz, device=ASCEND.spec.name)
    plan = plan_schedule(
        models, inputs, target=0.05, objective="core-energy", switch_latency_ms=15.0
    )
    assert plan.n_switches > 2 and any(s.delay_us > 0 for s in plan.switches)
    # the stages that begin < 15 ms into the iteration are triggered in the previous one
    wrapped = [s for s in plan.switches if s.previous_iteration]
    assert wrapped and all(plan.stages[s.stage].first_op < s.trigger_op for s in wrapped)
    _, sim = dev.run(w, plan, iterations=2)
    exe, n = sim.execution, len(w)
    landed = {}  # (iteration, stage) -> landing time, from the events in time order
    events = iter(exe.switches)
    for it in range(2):
        for sw in plan.switches:
            landed[(it, sw.stage)] = next(events).land_us
    for sw in plan.switches:
        # second iteration: every stage, the first ones included, within the model's error
        stage_start = exe.start_us[n + plan.stages[sw.stage].first_op]
        assert landed[(1, sw.stage)] == pytest.approx(stage_start, abs=150.0), sw


def test_cli_plan_then_simulate(tmp_path, bert_models):
    dev, w, _, _ = bert_models
    profile = dev.profile(w, [1000, 1400, 1800])
    path = tmp_path / "bert.parquet"
    profile.write(path)
    out = tmp_path / "schedule.json"
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "plan",
            str(path),
            "--target",
            "0.02",
            "--objective",
            "core-energy",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert {
        "solver",
        "target",
        "baseline_time_s",
        "predicted_time_s",
        "baseline_energy_j",
        "predicted_energy_j",
        "lower_bound_energy_j",
        "lower_bound_power_w",
        "gap_pct",
        "stages",
        "switches",
        "plan_seconds",
    } == set(payload)
    schedule = Schedule.read(out)
    assert schedule.n_ops == len(w) and schedule.device == ASCEND.spec.name
    front = tmp_path / "frontier.csv"
    res = runner.invoke(
        app,
        [
            "plan",
            str(path),
            "--target",
            "0.05",
            "--objective",
            "core-energy",
            "--out",
            str(out),
            "--frontier",
            str(front),
        ],
    )
    assert res.exit_code == 0, res.output
    table = pd.read_csv(front)
    assert {"slowdown_pct", "saving_pct", "time_s", "energy_j", "lambda"} == set(table.columns)
    assert len(table) > 3 and table["slowdown_pct"].is_monotonic_increasing
    res = runner.invoke(
        app, ["simulate", str(out), "--device", ASCEND.spec.name, "--workload", "bert", "--json"]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app, ["plan", str(path), "--target", "0.02", "--solver", "milp", "--out", str(out)]
    )
    assert res.exit_code == 2 and "expected dp or ga" in res.stderr


def test_ga_never_beats_the_dp_lower_bound(bert_models):
    _, _, models, inputs = bert_models
    exact = plan_schedule(models, inputs, target=0.05, objective="core-energy")
    ga = plan_schedule(models, inputs, target=0.05, objective="core-energy", solver="ga")
    assert ga.solver == "ga" and ga.lower_bound_energy_j is None and ga.gap_pct is None
    assert ga.predicted_time_s <= 1.05 * ga.baseline_time_s * (1 + 1e-9)
    assert ga.predicted_core_energy_j >= exact.lower_bound_energy_j * (1 - 1e-9)


@pytest.mark.parametrize("switch_latency_ms", [1.0, 15.0])
@pytest.mark.parametrize("dispatch", ["predictive", "reactive"])
@pytest.mark.parametrize("objective", ["energy", "core-energy", "power", "paper"])
def test_every_objective_plans_within_the_budget(
    bert_models, objective, dispatch, switch_latency_ms
):
    """Every objective x dispatch (power + reactive once planned as if switches were on time)."""
    _, _, models, inputs = bert_models
    schedule = plan_schedule(
        models,
        inputs,
        target=0.02,
        objective=objective,
        dispatch=dispatch,
        switch_latency_ms=switch_latency_ms,
    )
    assert schedule.objective == objective and schedule.dispatch == dispatch
    assert schedule.predicted_time_s <= 1.02 * schedule.baseline_time_s * (1 + 1e-9)
    assert (schedule.gap_pct is None) == (objective == "paper")
    # a power plan bounds power, not energy
    assert (schedule.lower_bound_power_w is not None) == (objective == "power")
    if objective == "power":
        assert schedule.lower_bound_energy_j is None


def test_cli_plan_budget_scale_plans_for_a_smaller_slowdown(tmp_path, bert_models):
    dev, w, _, _ = bert_models
    path = tmp_path / "bert.parquet"
    dev.profile(w, [1000, 1400, 1800]).write(path)
    runner = CliRunner()
    got = {}
    for scale in ("1", "0.5"):
        out = tmp_path / f"s{scale}.json"
        res = runner.invoke(
            app,
            [
                "plan",
                str(path),
                "--target",
                "0.04",
                "--objective",
                "core-energy",
                "--budget-scale",
                scale,
                "--out",
                str(out),
                "--json",
            ],
        )
        assert res.exit_code == 0, res.output
        got[scale] = json.loads(res.stdout)

    def loss(p):
        return p["predicted_time_s"] / p["baseline_time_s"] - 1

    assert loss(got["0.5"]) <= 0.02 + 1e-9 < loss(got["1"]) + 1e-9
    assert got["0.5"]["target"] == pytest.approx(0.02)
    res = runner.invoke(
        app,
        [
            "plan",
            str(path),
            "--target",
            "0.04",
            "--budget-scale",
            "2",
            "--out",
            str(tmp_path / "x.json"),
        ],
    )
    assert res.exit_code == 2
