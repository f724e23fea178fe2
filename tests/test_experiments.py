"""End to end on the simulator: demo, evaluate, report (issue 7)."""

import json

import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.experiments import SuiteResult, measure, prepare
from opdvfs.experiments.suites import plan_and_measure

DEMO_KEYS = {
    "perf_loss_pct",
    "core_power_saving_pct",
    "chip_power_saving_pct",
    "core_energy_saving_pct",
    "chip_energy_saving_pct",
    "predicted_perf_loss_pct",
    "predicted_chip_energy_saving_pct",
    "switches",
}


@pytest.fixture(scope="module")
def bert_bench():
    return prepare("bert", "ascend-910b-like")


@pytest.fixture(scope="module")
def paper_report(tmp_path_factory):
    """The paper suite, run once for the module through ``opdvfs evaluate --json``.

    It is the suite's slowest part (about 20 plans, each measured on the simulator), so the
    CLI's test and the suite's own checks share one run: the CLI's payload and report folder.
    """
    out = tmp_path_factory.mktemp("evaluate") / "eval"
    res = CliRunner().invoke(app, ["evaluate", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_measured_outcome_is_against_the_measured_top_clock(bert_bench):
    top, _ = measure(bert_bench, None, "top", target=0.02)
    assert top.perf_loss_pct == pytest.approx(0.0, abs=1e-9)
    assert top.core_energy_saving_pct == pytest.approx(0.0, abs=1e-9)
    low, _ = measure(bert_bench, None, "low", target=0.02, freq_mhz=1000.0)
    assert low.perf_loss_pct > 10  # bert's matmuls follow the clock
    assert low.core_power_saving_pct > 0


def test_planned_run_meets_the_budget_and_its_prediction(bert_bench):
    outcome, _, schedule = plan_and_measure(bert_bench, 0.02, "core-energy", "plan")
    assert outcome.perf_loss_pct <= 2.0 + 1e-9 or outcome.budget_scale < 1
    assert outcome.perf_loss_pct <= 2.05
    assert outcome.core_energy_saving_pct > 2.0
    # the twin also counts the change into the first stage (from the top clock, or the wrap)
    assert outcome.switches in (schedule.n_switches, schedule.n_switches + 1)
    assert outcome.predicted_chip_energy_saving_pct == pytest.approx(
        outcome.chip_energy_saving_pct, abs=1.0
    )


def test_late_switches_lose_part_of_the_saving(bert_bench):
    """Paper Fig. 18: the same plan with its switches landing 14 ms late keeps less saving.

    A request still pending when the next is issued is superseded (SetFreq semantics), so
    stages shorter than the delay lose their clock and the rest land 14 ms into the wrong ops.
    """
    outcome, _, schedule = plan_and_measure(bert_bench, 0.02, "core-energy", "plan")
    late = bert_bench.with_latency(bert_bench.device.spec.switch_latency_ms + 14.0)
    delayed, run = measure(bert_bench, schedule, "late", target=0.02, device=late)
    assert delayed.core_power_saving_pct < outcome.core_power_saving_pct
    assert delayed.core_energy_saving_pct < outcome.core_energy_saving_pct
    assert not all(e.landed for e in run.execution.switches)


@pytest.mark.slow
def test_paper_suite_rows_and_goals(paper_report):
    _, out = paper_report
    result = SuiteResult.read(out / "results.json")  # what run_paper_suite returned
    table = result.sections["table3"]
    assert [(o.workload, o.target_pct) for o in table] == [
        ("gpt3", 2.0),
        ("gpt3", 4.0),
        ("gpt3", 6.0),
        ("gpt3", 8.0),
        ("gpt3", 10.0),
        ("bert", 2.0),
        ("resnet50", 2.0),
        ("resnet152", 2.0),
    ]
    gpt3 = [o for o in table if o.workload == "gpt3"]
    # a looser budget saves more core energy
    savings = [o.core_energy_saving_pct for o in gpt3]
    assert savings == sorted(savings)
    labels = [o.label for o in result.sections["ablations"]]
    assert labels[1] == "switch lands 14 ms late"  # left out of the budget goal, by design
    assert "switch lands 14 ms late, budget re-met" in labels
    assert "15 ms switch, reactive" in labels
    late = {o.label: o for o in result.sections["ablations"]}
    # late switches cost time; meeting the budget again costs saving
    assert late["switch lands 14 ms late"].perf_loss_pct > 2.0
    assert late["switch lands 14 ms late, budget re-met"].perf_loss_pct <= 2.05
    assert (
        late["switch lands 14 ms late, budget re-met"].core_energy_saving_pct
        < result.sections["ablations"][0].core_energy_saving_pct
    )
    goals = {g.goal: g for g in result.goals}
    # the four suite goals and issue 18's five validation bands (Table 3, the drop ratio, GPT-3
    # SoC energy, Fig. 18, switches per iteration)
    assert len(goals) == 9
    # (Table 3's bands: the test below)
    # where the GPT-3 saving comes from, printed beside the paper (docs/twin-calibration.md)
    assert any("AICore energy saved by op family" in n for n in result.notes)
    assert any("by frequency-adjustment interval" in n for n in result.notes)
    ratio = next(g for g in result.goals if "non-AICore / AICore" in g.goal)
    assert ratio.met, ratio.detail
    soc_energy = next(g for g in result.goals if g.goal.startswith("GPT-3: SoC energy falls"))
    assert soc_energy.met, soc_energy.detail
    beats = next(g for g in result.goals if g.goal.startswith("per-operator plan beats"))
    assert beats.met, beats.detail
    host = result.sections["inference"]
    assert all(o.perf_loss_pct < 0.5 for o in host)  # host-bound: the clock barely matters
    # paper §8: all ops at 1300 MHz cost 2.48% and saved 25% of AICore power. The planner has
    # no model of host-bound dispatch (it takes the device's own slowdown at face value), so
    # its plan is more careful than the uniform clock; both save core energy
    assert host[0].core_energy_saving_pct > 20
    assert host[1].core_energy_saving_pct > 10


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 18's Table 3 band is missed by 0.02 points: gpt3 4% SoC power -8.50% vs the "
    "paper's -6.98% (band 1.5) since the twin books each clock landing inside a wait at its own "
    "clock (6090470); every other row and the AICore bands are met",
)
def test_paper_suite_table3_within_the_bands(paper_report):
    _, out = paper_report
    result = SuiteResult.read(out / "results.json")
    table3 = next(g for g in result.goals if g.goal.startswith("Table 3: AICore power change"))
    assert table3.met, table3.detail  # every row within +-3 / +-1.5 points of the paper


@pytest.mark.slow
def test_demo_cli_json_report_and_rerender(tmp_path):
    runner = CliRunner()
    out = tmp_path / "demo"
    res = runner.invoke(
        app, ["demo", "--workload", "bert", "--out", str(out), "--json"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert DEMO_KEYS <= set(payload)
    assert payload["perf_loss_pct"] <= 2.05
    for name in ("report.md", "results.json", "schedule.json", "timeline.png", "savings.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "model_error_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    assert "per-operator plan" in text and "simulated" in text
    (out / "report.md").unlink()
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report.md").read_text().startswith("# opdvfs demo report")


def test_report_of_a_folder_without_results_is_one_error_line(tmp_path):
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2
    assert "results.json" in res.output and "Traceback" not in res.output
    (tmp_path / "results.json").write_text('{"suite": "paper"}')  # valid JSON, not a result
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "results.json: field 'device'" in res.stderr


def test_demo_on_a_gpu_preset_plans_board_energy_and_predicts_no_core(tmp_path):
    # a GPU's sensor reads board power: the default objective is the chip's energy, and the
    # report predicts no core saving it cannot know
    out = tmp_path / "demo"
    res = CliRunner().invoke(
        app,
        ["demo", "--workload", "resnet50", "--device", "a100-like", "--out", str(out)],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert "objective energy" in res.stdout
    core_row = next(line for line in res.stdout.splitlines() if "core energy (J)" in line)
    assert "%" not in core_row.split("│")[4]  # the predicted column is blank
    results = json.loads((out / "results.json").read_text())
    assert results["objective"] == "energy"
    plan = results["sections"]["plan"][0]
    assert plan["predicted_core_energy_saving_pct"] is None
    assert plan["predicted_chip_energy_saving_pct"] > 0


def test_demo_rejects_a_bad_objective(tmp_path):
    res = CliRunner().invoke(app, ["demo", "--objective", "speed", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "--objective" in res.stderr and "'speed' is not one of" in res.stderr


@pytest.mark.slow
def test_evaluate_cli_writes_the_report_and_its_figure(paper_report):
    payload, out = paper_report
    assert payload["report"] == str(out / "report.md")
    assert set(payload["sections"]) == {
        "table3",
        "ablations",
        "baselines",
        "short iteration",
        "inference",
    }
    report = (out / "report.md").read_text()
    assert "[15.27%]" in report  # the paper's GPT-3 2% AICore figure beside ours
    assert (out / "table3.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_gpu_like_device_with_a_coarse_sensor_plans_from_attributed_power():
    bench = prepare("bert", "a100-like")  # 100 ms NVML-like windows: power only from samples
    assert "chip_power_w" not in bench.profile.ops and bench.profile.n_iterations > 1
    outcome, _, _ = plan_and_measure(bench, 0.02, "energy", "plan")
    assert outcome.perf_loss_pct <= 2.05
    assert outcome.predicted_chip_energy_saving_pct is not None
    assert abs(outcome.predicted_chip_energy_saving_pct - outcome.chip_energy_saving_pct) <= 1.5
