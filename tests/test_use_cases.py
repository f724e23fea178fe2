"""The use cases as library calls (issue 30): plan a measured profile, plan a job from one
profile per rank, plan a pipeline. Each gives the schedule ``opdvfs plan`` writes."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.datasets import dataset_path
from opdvfs.exceptions import ValidationError
from opdvfs.io import read_profile
from opdvfs.models.bundle import ModelBundle
from opdvfs.plan import plan_pipeline, plan_profile, plan_ranks
from opdvfs.plan.on_profile import fit_profile, plan_fitted
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, Schedule
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads import BUILDERS

DEVICE = "ascend-910b-like"  # 1000-1800 MHz in 100 MHz steps, 1 ms switch latency


@pytest.fixture(scope="module")
def twin():
    return SimulatedDevice.from_preset(DEVICE)


@pytest.fixture(scope="module")
def partial(twin):
    """VGG-19 measured at three of the device's nine clocks: models fill the other six."""
    return twin.profile(BUILDERS["vgg19"](), [1000, 1400, 1800])


def plan_cli(*args) -> None:
    res = CliRunner().invoke(app, ["plan", *map(str, args)])
    assert res.exit_code == 0, res.output


def without_timing(schedule: Schedule | PipelineSchedule) -> dict:
    doc = schedule.model_dump()
    doc.pop("plan_seconds")
    for stage in doc.get("stages", []):
        if isinstance(stage, dict):
            stage.pop("plan_seconds", None)
    return doc


def test_plan_profile_is_the_schedule_plan_writes_within_the_deadline(tmp_path, partial):
    path, out = tmp_path / "vgg.parquet", tmp_path / "plan.json"
    partial.write(path)
    plan_cli(path, "--target", "0.02", "--out", out)
    planned = plan_profile(partial, 0.02)
    assert without_timing(planned.schedule) == without_timing(Schedule.read(out))
    assert planned.fitted.models is not None  # six clocks were not measured
    s = planned.schedule
    assert s.predicted_time_s is not None and s.baseline_time_s is not None
    assert s.predicted_time_s <= 1.02 * s.baseline_time_s * (1 + 1e-9)
    assert s.predicted_energy_j is not None and s.baseline_energy_j is not None
    assert s.predicted_energy_j < s.baseline_energy_j
    assert planned.warnings == ()


def test_fit_profile_then_plan_fitted_is_plan_profile(partial):
    """tune's two steps and the plan command are one implementation: the same plan."""
    fitted = fit_profile(partial)
    schedule = plan_fitted(fitted, target=0.02, interval_ms=5.0)
    assert without_timing(schedule) == without_timing(plan_profile(partial, 0.02).schedule)


def test_plan_profile_frees_a_handed_over_profile_before_planning(monkeypatch, twin):
    """A caller's only reference (as ``opdvfs plan`` hands it) is gone by the time it plans."""
    import gc
    import weakref

    from opdvfs.plan import on_profile

    profile = twin.profile(BUILDERS["vgg19"](), [1000, 1400, 1800])
    assert profile.samples is not None  # the samples go too (power per op)
    alive = (weakref.ref(profile), weakref.ref(profile._ops))  # the profile and its rows
    seen = []

    def spy(*args, **kwargs):
        gc.collect()
        seen.append(any(ref() is not None for ref in alive))
        return plan_fitted(*args, **kwargs)

    monkeypatch.setattr(on_profile, "plan_fitted", spy)
    handed = [profile]
    del profile
    planned = plan_profile(handed.pop(), 0.02)
    assert seen == [False]
    assert planned.schedule.predicted_time_s is not None


def test_a_profile_of_every_clock_fits_no_models(twin):
    full = twin.profile(BUILDERS["vgg19"](), twin.spec.freqs_mhz)
    planned = plan_profile(full, 0.05)
    assert planned.fitted.models is None
    s = planned.schedule
    assert s.measured_time_s is not None and s.measured_baseline_time_s is not None
    assert s.measured_time_s <= 1.05 * s.measured_baseline_time_s * (1 + 1e-9)
    assert plan_profile(full, 0.05, values="model").fitted.models is not None
    with pytest.raises(ValidationError, match="--values measured plans without them"):
        plan_profile(full, 0.05, values="measured", train_freqs_mhz=[1000.0, 1800.0])


def test_plan_profile_refuses_what_plan_refuses_and_warns_as_it_goes(partial):
    with pytest.raises(ValidationError, match="below ascend-910b-like's switch latency"):
        plan_profile(partial, 0.02, switch_latency_ms=0.5)
    assert (
        plan_profile(partial, 0.02, switch_latency_ms=0.5, force=True).fitted.switch_latency_ms
        == 0.5
    )
    seen: list[str] = []
    planned = plan_profile(partial, 0.02, interval_ms=0.0, warn=seen.append)
    assert len(seen) == 1 and "shorter than the 1 ms switch latency" in seen[0]
    assert planned.warnings == tuple(seen)


def test_plan_profile_maps_a_swept_profile_onto_every_launch(partial):
    """A simulated GPU's sweep: its rows are kernels at launch positions among 200 launches."""
    launches = np.sort(np.random.default_rng(0).choice(200, size=129, replace=False))
    ops = partial.ops.copy()
    ops["op"] = launches[ops["op"].to_numpy()]
    meta = {**partial.meta, "sweep": {"launches_per_iteration": 200}}
    swept = Profile(ops, partial.samples, meta=meta)
    mapped = plan_profile(swept, 0.02).schedule
    dense = plan_profile(partial, 0.02).schedule
    assert mapped.n_ops == 200
    # each kernel runs at the clock the dense plan gave it
    assert mapped.freq_per_op_mhz()[launches].tolist() == dense.freq_per_op_mhz().tolist()


def test_plan_profile_of_a_models_file_is_what_plan_writes(tmp_path, partial):
    path, models, out = tmp_path / "vgg.parquet", tmp_path / "models.json", tmp_path / "p.json"
    partial.write(path)
    res = CliRunner().invoke(app, ["fit", str(path), "--out", str(models)])
    assert res.exit_code == 0, res.output
    plan_cli(models, "--target", "0.03", "--workload", "vgg19", "--out", out)
    planned = plan_profile(ModelBundle.read(models), 0.03, workload="vgg19")
    assert without_timing(planned.schedule) == without_timing(Schedule.read(out))
    assert planned.fitted.inputs.measured is None  # models alone: nothing measured to judge


def test_plan_pipeline_is_what_plan_writes_within_the_deadline(tmp_path):
    source = dataset_path("perseus-gpt3-175b-a100")
    out = tmp_path / "pipe.json"
    limit = ("--time-limit-s", "5")
    plan_cli(source, "--pipeline", "1f1b", "--microbatches", "4", "--target", "0.05", *limit,
             "--out", out)  # fmt: skip
    planned = plan_pipeline(
        read_profile([source]), 0.05, microbatches=4, time_limit_s=5.0, source=str(source)
    )
    s = planned.schedule
    assert without_timing(s) == without_timing(PipelineSchedule.read(out))
    assert s.predicted_makespan_s is not None and s.baseline_makespan_s is not None
    assert s.predicted_makespan_s <= 1.05 * s.baseline_makespan_s * (1 + 1e-9)
    assert s.predicted_energy_j is not None and s.baseline_energy_j is not None
    assert s.predicted_energy_j < s.baseline_energy_j
    assert s.workload == source.name and len(s.stages) == planned.problem.n_ranks


FREQS = (1000.0, 1400.0, 1800.0)


def rank_profile(names: list[str], compute_s: float, freqs=FREQS) -> Profile:
    """One rank's ops at every clock: compute slows as 1800/f, a message takes 1 us."""
    rows = []
    for op, name in enumerate(names):
        base = 0.0 if "send" in name or "recv" in name else compute_s
        for f in freqs:
            time_s = base * 1800.0 / f
            power = 10.0 + 100.0 * (f / 1800.0) ** 3 if base else 50.0
            rows.append(
                {
                    "iteration": 0,
                    "op": op,
                    "name": name,
                    "type": name,
                    "freq_mhz": f,
                    "time_us": max(time_s * 1e6, 1.0),
                    "chip_power_w": power,
                }
            )
    return Profile(pd.DataFrame(rows))


RANK0 = ["fwd", "send_act", "recv_grad", "bwd"]
RANK1 = ["recv_act", "fwd", "bwd", "send_grad"]


def test_plan_ranks_is_what_plan_writes_within_the_deadline(tmp_path):
    paths = [tmp_path / "rank0.parquet", tmp_path / "rank1.parquet"]
    rank_profile(RANK0, 0.01).write(paths[0])
    rank_profile(RANK1, 0.03).write(paths[1])
    out = tmp_path / "pipe.json"
    plan_cli(*paths, "--pipeline", "ranks", "--target", "0.05", "--blocking-power-w", "10",
             "--out", out)  # fmt: skip
    profiles = [read_profile([p]) for p in paths]
    planned = plan_ranks(profiles, 0.05, sources=[str(p) for p in paths], blocking_power_w=10.0)
    s = planned.schedule
    assert without_timing(s) == without_timing(PipelineSchedule.read(out))
    assert s.pipeline == "ranks" and s.workload == "rank0.parquet, rank1.parquet"
    assert planned.values == "measured" and planned.layout.n_messages == 2
    assert s.predicted_makespan_s is not None and s.baseline_makespan_s is not None
    assert s.predicted_makespan_s <= 1.05 * s.baseline_makespan_s * (1 + 1e-9)
    assert s.predicted_energy_j is not None and s.baseline_energy_j is not None
    assert s.predicted_energy_j < s.baseline_energy_j
    # the ranks' stages differ in length: each rank gets its own clocks
    assert s.stages[0].freq_per_op_mhz().tolist() != s.stages[1].freq_per_op_mhz().tolist()


def test_plan_ranks_refuses_ranks_on_other_clocks():
    profiles = [rank_profile(RANK0, 0.01), rank_profile(RANK1, 0.01, freqs=(1000.0, 1800.0))]
    with pytest.raises(ValidationError, match=r"rank1: planned over \[1000.0, 1800.0\] MHz"):
        plan_ranks(profiles, 0.05)
