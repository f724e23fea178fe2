"""`opdvfs capture --profile P --freqs LIST`: every clock profiled in one run (#21)."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app
from opdvfs.models.attribution import power_rows, sensor_span_s
from opdvfs.profile import Profile
from opdvfs.runtime.actuators import DryRunActuator, NvmlActuator
from opdvfs.runtime.sweep import SWEEP_WINDOWS, ClockSweep, SweepResult, sweep_run
from opdvfs.sim import SimulatedDevice
from opdvfs.workloads.workload import Workload

from conftest import read_log
from tiny_gpt import write_train_script

#: The tiny GPT's iteration is ~2 ms on sim:a100-like, under its 100 ms power sensor; at this
#: scale of its work it is ~160 ms, so a clock's few iterations span the sensor's windows.
WORK_SCALE = "1e5"
STEPS = 30
TOP, MID, MIN = 1410.0, 810.0, 210.0  # a100-like: min, mid (nearest the middle), max


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    return write_train_script(tmp_path_factory.mktemp("sweep"))


def _sweep_argv(out: Path, script: Path, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        "capture",
        "--out",
        str(out / "w.json"),
        "--profile",
        str(out / "p.parquet"),
        "--freqs",
        "min,mid,max",
        "--actuator",
        "sim:a100-like",
        "--work-scale",
        WORK_SCALE,
        "--log",
        str(out / "calls.jsonl"),
        *extra,
        "--",
        "python",
        str(script),
        *args,
    ]


@pytest.fixture(scope="module")
def swept(script, tmp_path_factory):
    """The tiny GPT swept over min, mid and max of sim:a100-like in one CLI run."""
    out = tmp_path_factory.mktemp("swept")
    res = CliRunner().invoke(app, _sweep_argv(out, script, str(STEPS)))
    assert res.exit_code == 0, res.output
    return out, res


def test_one_run_profiles_every_op_at_every_clock(swept):
    out, res = swept
    profile = Profile.read(out / "p.parquet")
    assert list(profile.freqs_mhz) == [MIN, MID, TOP]
    op_ids, _, time_us = profile.time_matrix_us()
    assert not np.isnan(time_us).any()  # every op at every clock
    per_clock = profile.meta["sweep"]["iterations_per_clock"]
    counts = profile.ops.groupby("freq_mhz")["iteration"].nunique()
    # each clock counts as many of its own iterations as span the sensor's windows: the top
    # clock's estimate there, fewer at the slower clocks, one fewer would not span them
    assert counts[TOP] == per_clock >= 2 and counts[MIN] < counts[MID] < counts[TOP]
    sensor = profile.meta["sensor"]
    span_s = sensor_span_s(
        period_ms=sensor["period_ms"], window_ms=sensor["window_ms"], windows=SWEEP_WINDOWS
    )
    ends = profile.ops["wall_s"] + profile.ops["time_us"] * 1e-6
    by = profile.ops.assign(end_s=ends).groupby(["freq_mhz", "iteration"])
    lengths = (by["end_s"].max() - by["wall_s"].min()).groupby("freq_mhz")
    assert (lengths.sum() >= span_s).all()
    assert (lengths.sum() - lengths.last() < span_s).all()
    rows = profile.ops.groupby(["freq_mhz", "iteration"]).size()
    assert (rows == len(op_ids)).all()
    # each clock's iterations are its own: none measured at two clocks
    assert profile.ops.groupby("iteration")["freq_mhz"].nunique().max() == 1
    assert f"wrote {out / 'p.parquet'}: {len(op_ids)} operators" in res.stdout
    assert "swept 3 clocks on sim:a100-like in one run" in res.stdout
    # the line reports each clock's own count
    said = ", ".join(f"{counts[f]} at {f:g}" for f in (TOP, MID, MIN))
    assert f"{said} MHz counted" in res.stdout
    # the workload is written as by a plain capture
    assert (out / "w.json").is_file()


def test_the_clock_log_sets_each_clock_once_and_ends_with_one_restore(swept):
    out, _ = swept
    calls = read_log(out / "calls.jsonl")
    assert [(c["kind"], c.get("freq_mhz")) for c in calls] == [
        ("run", None),
        ("set", TOP),
        ("set", MID),
        ("set", MIN),
        ("restore", None),
    ]


def test_matmul_times_follow_the_clock_as_the_twin_says(swept):
    out, _ = swept
    profile = Profile.read(out / "p.parquet")
    ops = profile.ops
    work = json.loads((out / "w.json").read_text())["ops"]
    workload = pd.DataFrame(work)
    mm = ops[ops["type"] == "mm"]
    assert mm["op"].nunique() >= 8
    median = mm.groupby(["op", "freq_mhz"])["time_us"].median().unstack()
    # the twin on the same operators (the capture's rows at the launch positions, scaled)
    rows = workload.loc[median.index.to_numpy()].copy()
    for col in ("flops", "bytes_loaded", "bytes_stored"):
        rows[col] = rows[col].astype(float) * float(WORK_SCALE)
    twin = SimulatedDevice.from_preset("a100-like")
    w = Workload(rows.reset_index(drop=True), name="mm")
    twin_us = {f: twin.run(w, freq_mhz=f)[1].dur_us for f in (MIN, MID, TOP)}
    for f in (MIN, MID):
        assert (median[f] >= median[TOP]).all()
        ratio = median[f].to_numpy() / median[TOP].to_numpy()
        assert ratio == pytest.approx(twin_us[f] / twin_us[TOP], rel=0.03)
    assert (median[MIN] / median[TOP]).min() > 2.0  # clearly clock-bound at 210 MHz


def test_power_attributed_from_the_samples_is_lower_at_lower_clocks(swept):
    out, _ = swept
    profile = Profile.read(out / "p.parquet")
    assert profile.meta["sensor"] == {"period_ms": 100.0, "window_ms": 100.0}
    rows = power_rows(profile)  # the window attribution of the sensor's samples
    iteration_j = (
        (rows["time_us"] * 1e-6 * rows["chip_power_w"])
        .groupby([rows["freq_mhz"], rows["iteration"]])
        .sum()
    )
    iteration_s = (rows["time_us"] * 1e-6).groupby([rows["freq_mhz"], rows["iteration"]]).sum()
    power_w = (iteration_j / iteration_s).groupby(level=0).mean()
    assert power_w[MIN] < power_w[MID] < power_w[TOP]
    # the attributed power accounts for what the sensor measured over each clock's iterations
    samples = profile.samples
    assert samples is not None
    for f in (MIN, MID, TOP):
        mine = profile.ops[profile.ops["freq_mhz"] == f]
        lo = mine["wall_s"].min() + 0.1
        hi = (mine["wall_s"] + mine["time_us"] * 1e-6).max()
        inside = samples[(samples["t_s"] >= lo) & (samples["t_s"] <= hi)]
        assert len(inside) >= 10
        assert power_w[f] == pytest.approx(inside["power_w"].mean(), rel=0.03)


def test_fit_and_plan_accept_the_swept_profile(swept):
    out, _ = swept
    runner = CliRunner()
    res = runner.invoke(app, ["fit", str(out / "p.parquet"), "--out", str(out / "m.json")])
    assert res.exit_code == 0, res.output
    schedule = out / "s.json"
    res = runner.invoke(
        app,
        [
            "plan",
            str(out / "m.json"),
            "--target",
            "0.05",
            "--interval-ms",
            "20",
            "--switch-latency-ms",
            "15",
            "--out",
            str(schedule),
        ],
    )
    assert res.exit_code == 0, res.output
    plan = Schedule.read(schedule)
    assert plan.n_ops == Profile.read(out / "p.parquet").n_ops
    assert min(s.freq_mhz for s in plan.stages) < TOP  # lower clocks are worth using


def test_too_few_iterations_exit_2_naming_how_many_and_write_nothing(script, swept, tmp_path):
    res = CliRunner().invoke(app, _sweep_argv(tmp_path, script, "14"))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output
    # at most what the full run used (warm-up, the iterations each switch discarded, the
    # counted): the lower clocks' count is estimated at their longest possible iterations
    used = json.loads(json.dumps(Profile.read(swept[0] / "p.parquet").meta["sweep"]))
    needed = int(lines[0].split("needs at least ")[1].split()[0])
    assert sum(used["iterations"].values()) - 2 <= needed <= sum(used["iterations"].values())
    assert "clocks done: 1410; missing: 810, 210 MHz" in lines[0]
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "w.json").exists()
    kinds = [c["kind"] for c in read_log(tmp_path / "calls.jsonl")]
    assert kinds[-1] == "restore" and kinds.count("restore") == 1


@pytest.mark.parametrize(("how", "status"), [("raise", None), ("term", 128 + 15)])
def test_a_script_stopping_mid_sweep_restores_the_clock_once_and_writes_nothing(
    script, tmp_path, how, status
):
    res = CliRunner().invoke(app, _sweep_argv(tmp_path, script, str(STEPS), "13", how))
    if status is None:
        assert isinstance(res.exception, RuntimeError) and "boom at step 13" in str(res.exception)
    else:  # SIGTERM: the guard restores, then the process would end with 128 + 15
        assert res.exit_code == status
    calls = read_log(tmp_path / "calls.jsonl")
    # the mid clock was set (iteration 10) before the script stopped: the restore follows it
    assert [(c["kind"], c.get("freq_mhz")) for c in calls][1:] == [
        ("set", TOP),
        ("set", MID),
        ("restore", None),
    ]
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "w.json").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--freqs", "min,bogus"), "bogus"),
        (("--freqs", "333"), "333 MHz is not a supported clock"),
        (("--iteration-at", "tiny_gpt:TinyGPT.forward"), "--iteration-at"),
        (("--actuator", "twin"), "--actuator twin"),
        (("--actuator", "dry-run"), "scales a simulated GPU's work"),
    ],
)
def test_bad_sweep_options_are_one_line(script, tmp_path, extra, needle):
    res = CliRunner().invoke(app, _sweep_argv(tmp_path, script, "3", extra=extra))
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "calls.jsonl").exists()


def test_freqs_without_profile_is_one_line(script, tmp_path):
    argv = ["capture", "--out", str(tmp_path / "w.json"), "--freqs", "min,max"]
    res = CliRunner().invoke(app, [*argv, "--", "python", str(script), "3"])
    assert res.exit_code == 2 and "--profile" in res.stderr


# ---------------------------------------------------------------------------- the sweep's logic
def _drive(sweep: ClockSweep, clock: list[float], lengths_s) -> None:
    """End iterations of the given lengths on a fake device clock."""
    with sweep:
        for length in lengths_s:
            clock[0] += length
            sweep.mark_iteration()


def test_a_switch_longer_than_an_iteration_discards_by_time_not_count():
    act = DryRunActuator([510.0, 1410.0])
    clock = [0.0]
    sweep = ClockSweep(
        act,
        [510.0, 1410.0],
        warmup=2,
        iterations_per_clock=3,
        settle_s=0.015,
        now_s=lambda: clock[0],
        on_done=act.reset,  # sweep_run passes the clock guard's restore
    )
    _drive(sweep, clock, [0.002] * 40)
    phases = [r.phase for r in sweep.records]
    # 2 warm-up, 3 at the top (no switch), 8 discarded (8 x 2 ms >= 15 ms), 3 at 510 MHz
    assert phases[:16] == ["warmup"] * 2 + ["counted"] * 3 + ["settle"] * 8 + ["counted"] * 3
    assert len(phases) == 16 and sweep.done and sweep.iterations_after == 24
    assert sweep.needed_iterations() == 16
    assert [c["kind"] for c in act.calls] == ["set", "set", "restore"]
    counted_at_510 = [r for r in sweep.records if r.phase == "counted" and r.freq_mhz == 510.0]
    assert min(r.start_s for r in counted_at_510) >= 5 * 0.002 + 0.015 - 1e-12


def _temp_sweep(temps, per_clock=3, **options) -> tuple[ClockSweep, list[float]]:
    """A one-clock sweep, ``per_clock`` iterations counted, reading the die temperatures."""
    act = DryRunActuator([510.0, 1410.0])
    clock, reads = [0.0], iter(temps)
    sweep = ClockSweep(
        act,
        [1410.0],
        warmup=1,
        iterations_per_clock=per_clock,
        settle_s=0.0,
        now_s=lambda: clock[0],
        temp_c=lambda: next(reads),
        max_temp_delta_c=1.0,
        **options,
    )
    return sweep, clock


def test_a_clock_counts_once_the_temperature_trend_over_its_iterations_is_steady():
    # deltas 3 (the warm-up), 2, 1.5, 0.5, 0.2, 0.1: the first window of three (2, 1.5, 0.5)
    # rises 1.35 deg C per iteration (least squares), the next (1.5, 0.5, 0.2) 0.71
    sweep, clock = _temp_sweep([50.0, 53.0, 55.0, 56.5, 57.0, 57.2, 57.3, 57.4, 57.4, 57.5])
    _drive(sweep, clock, [0.1] * 5)
    phases = [r.phase for r in sweep.records]
    assert phases == ["warmup", "unsteady", "counted", "counted", "counted"]
    assert sweep.done and sweep.window_trend_c() == pytest.approx(0.71)


def test_a_whole_degree_sensor_rising_faster_than_the_limit_is_not_steady():
    # the die warms 1.4 deg C per iteration for five, read in whole degrees (NVML): the
    # iterations read 1, 2, 1, 2, then 0. One at a time, those reading 1 (iterations 1 and 3)
    # would have counted while it warmed; the trend over three (1.4, 1.6, 1.1 deg C per
    # iteration) keeps sliding until the window holds mostly the flat part (0.6)
    true_c = [50.0 + 1.4 * min(k, 5) for k in range(12)]
    sweep, clock = _temp_sweep([float(int(t)) for t in true_c])
    _drive(sweep, clock, [0.1] * 7)
    phases = [r.phase for r in sweep.records]
    assert sweep.done
    assert phases == ["warmup"] + ["unsteady"] * 3 + ["counted"] * 3
    assert sweep.window_trend_c() == pytest.approx(0.6)


def test_a_die_that_keeps_warming_counts_after_twice_the_count_with_one_warning():
    sweep, clock = _temp_sweep([50.0 + 2.0 * k for k in range(20)])
    with pytest.warns(UserWarning, match="temperature still moved more than 1 deg C"):
        _drive(sweep, clock, [0.1] * 12)
    phases = [r.phase for r in sweep.records]
    assert sweep.done and phases == ["warmup"] + ["unsteady"] * 6 + ["counted"] * 3


def test_one_counted_iteration_per_clock_still_waits_for_a_warming_die():
    # one long iteration spans the sensor's windows: twice the count would give up after two
    # unsteady ones, while this die warms 2 deg C per iteration for five more, then holds
    warming = [50.0 + 2.0 * min(k, 6) for k in range(16)]
    sweep, clock = _temp_sweep(warming, per_clock=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # steady before the patience runs out: no warning
        _drive(sweep, clock, [0.1] * 7)
    phases = [r.phase for r in sweep.records]
    assert sweep.done and phases == ["warmup"] + ["unsteady"] * 5 + ["counted"]
    assert sweep.window_trend_c() == pytest.approx(0.0)


def _sensor_sweep(clock: list[float], **options) -> ClockSweep:
    """A two-clock sweep on a fake device clock with a 100 ms / 100 ms power sensor."""
    act = DryRunActuator([510.0, 1410.0])
    return ClockSweep(
        act,
        [510.0, 1410.0],
        warmup=1,
        settle_s=0.0,
        now_s=lambda: clock[0],
        sensor_s=(0.1, 0.1),
        **options,
    )


def test_the_default_count_spans_the_sensor_windows():
    clock = [0.0]
    sweep = _sensor_sweep(clock)
    _drive(sweep, clock, [0.05])
    # 12 complete 100 ms windows read every 100 ms take 1.2 s: 24 iterations of 50 ms
    assert sweep.per_clock == 24


def test_a_clock_sized_for_the_sensor_counts_until_its_iterations_span_the_windows():
    # the warm-up's last iteration (120 ms) runs slower than the steady ones (100 ms), as a
    # GPT step on an H200 did: 10 iterations sized from it span 1.0 s, too few windows
    clock = [0.0]
    sweep = _sensor_sweep(clock)
    _drive(sweep, clock, [0.12] + [0.1] * 40)
    assert sweep.per_clock == 10  # ceil(1.2 s / 0.12 s)
    counted = [r for r in sweep.records if r.phase == "counted"]
    per_clock = {f: sum(r.freq_mhz == f for r in counted) for f in (510.0, 1410.0)}
    assert per_clock == {510.0: 12, 1410.0: 12}  # 1.2 s of 100 ms iterations each
    assert sweep.done


def test_a_slower_clock_counts_fewer_of_its_longer_iterations_for_the_same_windows():
    # 100 ms iterations at the top clock, 250 ms at 510 MHz: 1.2 s of windows is 12 and 5
    clock = [0.0]
    sweep = _sensor_sweep(clock)
    with sweep:
        for _ in range(40):
            clock[0] += 0.1 if act_mhz(sweep) == 1410.0 else 0.25
            sweep.mark_iteration()
    assert sweep.per_clock == 12 and sweep.done
    counted = [r for r in sweep.records if r.phase == "counted"]
    per_clock = {f: sum(r.freq_mhz == f for r in counted) for f in (510.0, 1410.0)}
    assert per_clock == {510.0: 5, 1410.0: 12}
    result = SweepResult(None, sweep.records, sweep.freqs_mhz, sweep.freqs_mhz, 0, 12, 1)
    assert result.counted_per_clock == {1410.0: 12, 510.0: 5}
    # the estimate: 510 MHz's iterations at most 1410 / 510 x 100 ms long (ceil(4.3)), and
    # at least one discarded after the switch
    assert sweep.needed_iterations() == 1 + 12 + 5 + 1


def act_mhz(sweep: ClockSweep) -> float:
    """The clock the sweep's dry-run actuator set last (MHz)."""
    return float(sweep.actuator.current_mhz or sweep.top_mhz)


def test_a_given_count_per_clock_is_kept_with_a_sensor():
    clock = [0.0]
    sweep = _sensor_sweep(clock, iterations_per_clock=3)
    _drive(sweep, clock, [0.1] * 10)
    assert sum(r.phase == "counted" for r in sweep.records) == 6 and sweep.done


def test_the_nvml_path_traces_the_script_and_locks_each_clock_through_nvml(fake_nvml, script):
    import runpy
    import sys

    argv = sys.argv
    sys.argv = [str(script), "12"]
    try:
        result = sweep_run(
            lambda: runpy.run_path(str(script)),
            NvmlActuator(),
            [1005.0, 1410.0],
            iterations_per_clock=3,
            settle_s=0.0,
            cuda=False,  # the CPU's op times from the trace: the sweep's own logic
        )
    finally:
        sys.argv = argv
    profile = result.profile
    assert profile is not None and list(profile.freqs_mhz) == [1005.0, 1410.0]
    _, _, time_us = profile.time_matrix_us()
    assert not np.isnan(time_us).any()
    assert profile.ops.groupby("freq_mhz")["iteration"].nunique().tolist() == [3, 3]
    locks = [c.args[1:] for c in fake_nvml.nvmlDeviceSetGpuLockedClocks.call_args_list]
    assert locks == [(1410, 1410), (1005, 1005)]
    assert fake_nvml.nvmlDeviceResetGpuLockedClocks.call_count == 1


def test_a_counter_that_moves_every_100_ms_gives_100_ms_windows_not_zeros():
    # as read on an H200: reads every 25 ms, the energy counter moving every 100 ms at 400 W
    from opdvfs.io.samples import counter_windows, window_ms

    t = 100.0 + 0.025 * np.arange(41)
    updates = np.floor((t - 100.0 - 0.01) / 0.1)  # the counter moves at 100.01 + k x 0.1 s
    smp = pd.DataFrame(
        {"t_s": t, "power_w": 300.0, "temp_c": 60.0, "freq_mhz": 1980.0, "energy_j": 40 * updates}
    )
    got = counter_windows(smp)
    assert len(got) == 9 and got["power_w"].to_numpy() == pytest.approx(400.0)
    assert window_ms(got, 25.0) == pytest.approx(100.0)
    # each sample sits half-way between the read before the move and the read that saw it
    assert got["t_s"].to_numpy() == pytest.approx(100.0125 + 0.1 * np.arange(1, 10))


def test_a_sampled_run_is_labelled_with_the_clock_it_ran_at_not_the_idle_one():
    # an H200 read 345 MHz idle before a run that then ran at 1980 MHz (capture --profile)
    from opdvfs.io.samples import run_clock_mhz

    smp = pd.DataFrame({"t_s": [0.0, 0.1, 0.2, 0.3], "freq_mhz": [345.0, 1980.0, 1980.0, 1980.0]})
    assert run_clock_mhz(smp) == 1980.0
    assert run_clock_mhz(smp.iloc[:0]) is None


def test_the_dry_run_sweep_traces_the_cpu_and_records_each_clock(script, tmp_path, cpu_only):
    # the path a real GPU takes (torch.profiler trace, rows placed by time), on the CPU
    argv = [
        "capture",
        "--out",
        str(tmp_path / "w.json"),
        "--profile",
        str(tmp_path / "p.parquet"),
        "--freqs",
        "510,max",
        "--actuator",
        "dry-run",
        "--device",
        "a100-like",
        "--iterations-per-clock",
        "3",
        "--log",
        str(tmp_path / "calls.jsonl"),
        "--",
        "python",
        str(script),
        "60",
    ]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    profile = Profile.read(tmp_path / "p.parquet")
    assert list(profile.freqs_mhz) == [510.0, TOP] and profile.samples is None
    assert profile.ops.groupby("freq_mhz")["iteration"].nunique().tolist() == [3, 3]
    _, _, time_us = profile.time_matrix_us()
    assert not np.isnan(time_us).any()
    calls = [(c["kind"], c.get("freq_mhz")) for c in read_log(tmp_path / "calls.jsonl")]
    assert calls[1:] == [("set", TOP), ("set", 510.0), ("restore", None)]
    # 2 warm-up, 3 at the top, those in the 0.1 s after the switch discarded, 3 at 510 MHz
    phases = profile.meta["sweep"]["iterations"]
    assert phases["warmup"] == 2 and phases["counted"] == 6 and phases["settle"] >= 1
    first_at_510 = profile.ops.loc[profile.ops["freq_mhz"] == 510.0, "wall_s"].min()
    last_at_top = profile.ops.loc[profile.ops["freq_mhz"] == TOP, "wall_s"].max()
    assert first_at_510 - last_at_top >= 0.1


def _run_on_sim(script: Path, schedule, names, steps: int = 12):
    """Run the script on sim:a100-like at the sweep's work scale, under ``schedule`` (or none)."""
    import runpy
    import sys
    import warnings

    from opdvfs.runtime.actuators import SimGpuActuator
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.sim.gpu import SimulatedGpu

    act = SimGpuActuator(SimulatedGpu("a100-like", work_scale=float(WORK_SCALE)))
    argv, sys.argv = sys.argv, [str(script), str(steps)]
    executor = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the first iteration differs: AdamW's state
            with act:
                if schedule is None:
                    runpy.run_path(str(script))
                else:
                    with ScheduleExecutor(schedule, act, names=names) as executor:
                        runpy.run_path(str(script))
    finally:
        sys.argv = argv
    return act.per_iteration(skip=2), executor


def test_a_plan_on_the_swept_profile_runs_on_the_launches_and_saves_energy(swept, script):
    out, _ = swept
    schedule_path = out / "s-profile.json"
    argv = ["plan", str(out / "p.parquet"), "--target", "0.05", "--interval-ms", "20"]
    res = CliRunner().invoke(app, [*argv, "--out", str(schedule_path)])
    assert res.exit_code == 0, res.output
    schedule = Schedule.read(schedule_path)
    profile = Profile.read(out / "p.parquet")
    op_ids = profile.time_matrix_us()[0]
    names = json.loads((out / "w.json").read_text())["ops"]["name"]
    assert len(op_ids) < len(names)  # kernels only; views run no kernel
    assert profile.meta["sweep"]["launches_per_iteration"] == len(names)
    # `plan` maps the plan on the kernels onto every launched operator, as the executor counts
    assert schedule.n_ops == len(names) and len(schedule.stages) > 1
    assert {s.first_op for s in schedule.stages[1:]} <= set(op_ids.tolist())
    top, _ = _run_on_sim(script, None, names)
    run, executor = _run_on_sim(script, schedule, names)
    assert executor.diverged_iterations == [0]  # only AdamW's first iteration differs
    assert run["energy_j"] < 0.9 * top["energy_j"]
    assert run["time_s"] <= (1 + schedule.target) * top["time_s"]


def test_on_launches_maps_stages_and_triggers_and_refuses_a_foreign_profile():
    from opdvfs.exceptions import ValidationError
    from opdvfs.schedule import on_launches

    plan = Schedule.from_stage_freqs([0, 2], [1410.0, 810.0], n_ops=4, target=0.0, solver="manual")
    mapped = on_launches(plan, [1, 3, 6, 7], 9)  # kernels at launches 1, 3, 6, 7 of 9
    assert [(s.first_op, s.last_op) for s in mapped.stages] == [(0, 5), (6, 8)]
    assert [sw.trigger_op for sw in plan.switches] == [0, 2]
    assert [sw.trigger_op for sw in mapped.switches] == [0, 6]
    with pytest.raises(ValidationError, match="plans 4 operators"):
        on_launches(plan, [1, 3, 6], 9)
    with pytest.raises(ValidationError, match="ascend"):
        on_launches(plan, [1, 3, 6, 9], 9)


def test_the_plan_runs_from_the_cli_on_the_simulated_gpu_it_was_swept_on(swept, script):
    out, _ = swept
    runner = CliRunner()
    schedule = out / "s-cli.json"
    argv = ["plan", str(out / "p.parquet"), "--target", "0.05", "--interval-ms", "20"]
    assert runner.invoke(app, [*argv, "--out", str(schedule)]).exit_code == 0
    log = out / "run.jsonl"
    res = runner.invoke(
        app,
        [
            *("run", str(schedule), "--actuator", "sim:a100-like", "--work-scale", WORK_SCALE),
            *("--workload", str(out / "w.json"), "--log", str(log), "--"),
            *("python", str(script), "8"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "virtual time of the simulated GPU sim:a100-like" in res.stdout
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(c["kind"] == "set" and c["iteration"] == 3 for c in calls) >= 2  # applied
    assert calls[-1]["kind"] == "restore"
    res = runner.invoke(
        app, ["run", str(schedule), "--actuator", "dry-run", "--work-scale", "10", "--", "true"]
    )
    assert res.exit_code == 2 and "simulated GPU" in res.output
