"""`opdvfs tune`: the closed loop on a running training job, in one run (#21)."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from scipy import stats
from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app
from opdvfs.plan.on_profile import auto_clocks
from opdvfs.sim.presets import preset_spec
from opdvfs.tuner.ab import applied_iterations, paired_interval
from opdvfs.tuner.cache import TuneCache, cache_key
from opdvfs.tuner.policy import profile_clocks

from conftest import read_log
from tiny_gpt import write_train_script

#: Each operator does 10^6 times its work: a ~1.5 s iteration spans the 100 ms power sensor.
SIM = ("--actuator", "sim:a100-like", "--work-scale", "1e6")
#: Small enough for the tests: 3 clocks, 1 iteration each, one round of 2 pairs of 2-blocks.
FAST = (
    *("--clocks", "1410,1380,210", "--iterations-per-clock", "1"),
    *("--block", "2", "--pairs", "2", "--rounds", "1"),
)
#: Enough for planning, whose wall time spans ~5 iterations of the tiny GPT here (~70 ms each).
STEPS = 40


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    return write_train_script(tmp_path_factory.mktemp("tune"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _tune(out: Path, script: Path, cache: Path, *args: str, extra: tuple[str, ...] = ()):
    argv = [
        "tune",
        *("--target", "0.02", *SIM, *FAST, "--out", str(out), "--log", str(out / "calls.jsonl")),
        *extra,
        *("--", "python", str(script), *args),
    ]
    return CliRunner().invoke(app, argv, env={"OPDVFS_CACHE_DIR": str(cache)})


@pytest.fixture(scope="module")
def tuned(script, cache_dir, tmp_path_factory):
    """One tuning run of the tiny GPT on sim:a100-like, from an empty cache."""
    out = tmp_path_factory.mktemp("tuned")
    res = _tune(out, script, cache_dir, str(STEPS))
    assert res.exit_code == 0, res.output
    return out, res, json.loads((out / "tune.json").read_text())


def _kinds(path: Path) -> list[str]:
    return [c["kind"] for c in read_log(path)]


# ----------------------------------------------------------------------------- pure parts
def test_auto_clocks_are_the_top_two_below_it_mid_and_min():
    grid = preset_spec("a100-like").freqs_mhz
    assert auto_clocks(grid, max_gap=None) == (1410.0, 1305.0, 1200.0, 810.0, 210.0)
    assert auto_clocks(preset_spec("h100-like").freqs_mhz, max_gap=None) == (
        1980,
        1830,
        1680,
        1095,
        210,
    )
    # tune sweeps the five (and adds the clock active profiling names), not --freqs auto's
    assert profile_clocks(grid) == auto_clocks(grid, max_gap=None)
    assert auto_clocks([300.0, 600.0]) == (600.0, 300.0)  # a small grid: no duplicates


def test_paired_interval_is_students_t_on_the_pairs():
    x = [0.010, 0.014, 0.008, 0.012]
    got = paired_interval(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert got.mean == pytest.approx(np.mean(x))
    assert (got.low, got.high) == pytest.approx(ref)
    assert got.n == 4
    one = paired_interval([0.01])
    assert one.n == 1 and np.isnan(one.low)


def test_the_cache_key_follows_the_operators_the_device_and_the_target(tmp_path):
    ops = ["aten::mm", "aten::add"]
    key = cache_key(ops, device="a100-like", target=0.02)
    assert key == cache_key(list(ops), device="a100-like", target=0.02)
    assert key != cache_key(ops[::-1], device="a100-like", target=0.02)
    assert key != cache_key(ops, device="h100-like", target=0.02)
    assert key != cache_key(ops, device="a100-like", target=0.03)
    cache = TuneCache(tmp_path)
    assert cache.get(key) is None
    plan = Schedule.from_stage_freqs([0, 1], [1410.0, 810.0], n_ops=2, target=0.02, solver="manual")
    cache.put(key, plan, {"budget": 0.02})
    got, measured = cache.get(key)  # type: ignore[misc]
    assert got.n_ops == 2 and measured == {"budget": 0.02}
    cache.path(key).write_text("{not json")
    assert cache.get(key) is None  # a broken entry is a miss, not a crash


# ----------------------------------------------------------------------------- one run
def test_one_run_profiles_plans_measures_and_applies(tuned):
    _out, res, result = tuned
    phases = [it["phase"] for it in result["per_iteration"]]
    assert len(phases) == STEPS
    # warm-up, then the sweep, then planning at the top clock, then A/B, then steady
    assert phases[:2] == ["warmup", "warmup"]
    assert phases.count("counted") == 3  # 3 clocks x 1 iteration
    assert "planning" in phases and phases.count("steady") >= 1
    first = {p: phases.index(p) for p in ("counted", "planning", "tuned", "steady")}
    assert first["counted"] < first["planning"] < first["tuned"] < first["steady"]
    assert phases.count("reference") == phases.count("tuned") == 2  # 2 pairs x (2 - 1)
    assert result["profiling_iterations"] + result["planning_iterations"] < STEPS / 2
    (rnd,) = result["rounds"]
    assert rnd["pairs"] == 2 and rnd["budget"] == pytest.approx(0.02)
    # the A/B pairs measured a saving on the device's energy counter, within the target
    assert rnd["saving"]["mean"] > 0.03
    assert rnd["slowdown"]["mean"] <= 0.02
    assert rnd["saving"]["low"] <= rnd["saving"]["mean"] <= rnd["saving"]["high"]
    assert result["best_round"] == 0 and result["met"] is True
    assert result["block"] == 2 and result["block_by"] == "given (--block)"
    assert result["chosen_by"] and "lower bound" in result["chosen_by"]
    # steady iterations use less energy than the top clock's reference ones
    means = result["phases"]
    assert means["steady"]["energy_j"] < means["reference"]["energy_j"]
    assert "round 1: planned at 2.00%" in res.stdout and "energy saved" in res.stdout


def test_the_outputs_are_written_and_read_back(tuned):
    out, _res, _result = tuned
    for name in ("profile.parquet", "models.json", "schedule.json", "report.md", "clock.png"):
        assert (out / name).is_file(), name
    assert (out / "phases.png").stat().st_size > 1000
    schedule = Schedule.read(out / "schedule.json")
    assert len(schedule.stages) > 1
    report = (out / "report.md").read_text()
    assert "| steady |" in report and "![clock.png](clock.png)" in report
    assert not list(out.glob("*.tmp*")) and not list(out.glob(".*"))  # no temporary left


def test_the_clock_log_ends_with_exactly_one_restore(tuned):
    out, _, _ = tuned
    kinds = _kinds(out / "calls.jsonl")
    assert kinds[0] == "run" and kinds[-1] == "restore" and kinds.count("restore") == 1
    sets = [c["freq_mhz"] for c in read_log(out / "calls.jsonl") if c["kind"] == "set"]
    assert sets[:4] == [1410.0, 1380.0, 210.0, 1410.0]  # the sweep, then back to the top


def test_a_second_run_starts_from_the_cache(tuned, script, cache_dir, tmp_path):
    _, _, first = tuned
    res = _tune(tmp_path, script, cache_dir, "14")
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "tune.json").read_text())
    assert result["cache_hit"] is True and result["cache_key"] == first["cache_key"]
    phases = [it["phase"] for it in result["per_iteration"]]
    # applied at once, and re-measured in one brief A/B round (2 pairs of 2-blocks) before
    # it holds for the run (#33)
    assert phases[:2] == ["warmup", "warmup"] and phases[-4:] == ["steady"] * 4
    assert set(phases[2:-4]) == {"switch", "reference", "tuned"} and len(phases[2:-4]) == 8
    assert len(result["rounds"]) == 1 and result["error"] is None
    assert "started from the cache" in res.stdout and "re-measured in 8 A/B" in res.stdout
    means = result["phases"]
    assert means["steady"]["energy_j"] < first["phases"]["reference"]["energy_j"]
    kinds = _kinds(tmp_path / "calls.jsonl")
    assert kinds[-1] == "restore" and kinds.count("restore") == 1


# ----------------------------------------------------------------------------- failures
def test_a_script_ending_during_profiling_exits_2_in_one_line_and_restores_once(script, tmp_path):
    res = _tune(tmp_path, script, tmp_path / "cache", str(STEPS), "4", "exit")
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "before tuning was done" in lines[0], res.stderr
    assert "profiling alone needs" in lines[0] and "nothing was written" in lines[0]
    # bad input: as capture --freqs, no half-written output (the clock log is the actuator's)
    assert {p.name for p in tmp_path.iterdir()} <= {"cache", "calls.jsonl"}
    kinds = _kinds(tmp_path / "calls.jsonl")
    assert kinds[-1] == "restore" and kinds.count("restore") == 1


@pytest.mark.parametrize(("how", "status"), [("raise", None), ("term", 128 + 15)])
def test_an_exception_or_sigterm_during_profiling_restores_once(script, tmp_path, how, status):
    res = _tune(tmp_path, script, tmp_path / "cache", str(STEPS), "4", how)
    if status is None:
        assert isinstance(res.exception, RuntimeError) and "boom at step 4" in str(res.exception)
    else:
        assert res.exit_code == status
    kinds = _kinds(tmp_path / "calls.jsonl")
    assert kinds[-1] == "restore" and kinds.count("restore") == 1
    assert "set" in kinds  # a clock below the top was set before it stopped


def test_a_script_whose_operators_change_falls_back_and_restores_once(
    tuned, script, cache_dir, tmp_path
):
    # from the cache the schedule applies at iteration 2; from step 4 the ops differ
    res = _tune(tmp_path, script, cache_dir, "8", "4", "diverge")
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "tune.json").read_text())
    assert result["cache_hit"] is True
    assert "operators changed" in result["error"] and "abandoned" in result["error"]
    phases = [it["phase"] for it in result["per_iteration"]]
    assert phases[-1] == "top"
    calls = read_log(tmp_path / "calls.jsonl")
    assert calls[-1]["kind"] == "restore" and [c["kind"] for c in calls].count("restore") == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--clocks", "333"), "333 MHz is not a supported clock"),
        (("--actuator", "twin"), "--actuator twin"),
        (("--actuator", "sim:nope"), "no such simulated GPU"),
        (("--target", "0"), "--target 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(script, tmp_path, extra, needle):
    res = _tune(tmp_path, script, tmp_path / "cache", "3", extra=extra)
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_the_python_api_tunes_the_block_and_starts_from_the_cache(
    tuned, cache_dir, tmp_path, monkeypatch
):
    import sys

    import torch

    import opdvfs
    from opdvfs.tuner.cache import CACHE_ENV

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_gpt import TinyGPT

    monkeypatch.setenv(CACHE_ENV, str(cache_dir))
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (5, 2, 17))
    with opdvfs.tune(target=0.02, actuator="sim:a100-like", work_scale=1e6, out=tmp_path) as t:
        for i in range(5):  # the operators of TRAIN_SCRIPT's loop, one by one: its cache key
            logits = model(data[i, :, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, 64), data[i, :, 1:].reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    assert t.result.cache_hit and t.result.cache_key == tuned[2]["cache_key"]
    phases = [it.phase for it in t.result.iterations]
    assert phases[:2] == ["warmup"] * 2 and set(phases[2:]) <= {"switch", "reference", "tuned"}
    assert t.tuner.guard.restored
    assert (tmp_path / "tune.json").is_file() and (tmp_path / "report.md").is_file()


def test_through_nvml_the_sweep_is_traced_and_closed_mid_run_and_the_clock_reset_once(
    fake_nvml, script, cpu_only
):
    import runpy
    import sys

    from opdvfs.runtime.actuators import NvmlActuator
    from opdvfs.tuner.loop import Tuner

    # enough iterations for the 0.1 s a real switch settles, however fast the CPU runs them
    steps = 100
    argv = sys.argv
    sys.argv = [str(script), str(steps)]
    act = NvmlActuator()
    tuner = Tuner(act, target=0.02, clocks=[1410.0, 1005.0], iterations_per_clock=2)
    try:
        with act, tuner:
            runpy.run_path(str(script))
    finally:
        sys.argv = argv
    result = tuner.result
    # the trace ended at the step after the sweep and its profile has both clocks
    assert result.profile is not None and list(result.profile.freqs_mhz) == [1005.0, 1410.0]
    # the CPU trace has no power: nothing to plan on, said in the result (the planning thread
    # is joined at the end), and training went on at the top clock
    assert "measures no power" in (result.error or "")
    assert len(result.iterations) == steps
    assert {it.phase for it in result.iterations[-3:]} <= {"planning", "top"}
    locks = [c.args[1:] for c in fake_nvml.nvmlDeviceSetGpuLockedClocks.call_args_list]
    assert locks == [(1410, 1410), (1005, 1005), (1410, 1410)]
    assert fake_nvml.nvmlDeviceResetGpuLockedClocks.call_count == 1


def test_an_out_that_is_a_file_is_one_line(script, tmp_path):
    out = tmp_path / "taken"
    out.write_text("")
    res = _tune(tmp_path, script, tmp_path / "cache", "3", extra=("--out", str(out)))
    assert res.exit_code == 2 and "not a folder" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "calls.jsonl").exists()


def _linear_steps(steps: int) -> None:
    """A tiny training loop: ``steps`` optimizer steps of a linear layer (~1 ms each)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)
    for _ in range(steps):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def test_on_nvml_tunes_sweep_checks_the_temperature_and_sizes_clocks_by_the_counter(
    fake_nvml, cpu_only, monkeypatch
):
    """Off the simulator the sweep is sweep_run's: NVML's temperature and counter period (#21)."""
    import itertools

    from opdvfs.models.attribution import sensor_iterations
    from opdvfs.runtime.actuators import NvmlActuator
    from opdvfs.runtime.sweep import NVML_COUNTER_S, SWEEP_WINDOWS
    from opdvfs.tuner.ab import ab_block
    from opdvfs.tuner.drive import DeviceDrive
    from opdvfs.tuner.loop import Tuner

    # the die warms by 3 degC per read for eight reads, then holds: the top clock's counted
    # iterations slide past the warming ones until their temperature trend is within 1 degC
    fake_nvml.nvmlDeviceGetTemperature.side_effect = itertools.chain(
        range(50, 75, 3), itertools.repeat(74)
    )
    clock = itertools.count(0.0, 0.0625)  # the device's clock: 62.5 ms per read
    monkeypatch.setattr(DeviceDrive, "now_s", lambda self: next(clock))
    act = NvmlActuator()
    tuner = Tuner(act, target=0.02, clocks=[1410.0, 1005.0])
    with act, tuner:
        _linear_steps(40)
    sweep = tuner.sweep
    assert sweep.sensor_s == (NVML_COUNTER_S, NVML_COUNTER_S)
    assert sweep.iteration_s == pytest.approx(0.125)  # the sweep's and the tuner's reads
    want = sensor_iterations(0.125, period_ms=100.0, window_ms=100.0, windows=SWEEP_WINDOWS)
    assert sweep.per_clock == want and want != 5  # not DEFAULT_PER_CLOCK
    # no --block: the A/B blocks sized for the counter at the top clock's 125 ms iterations,
    # 8 counted iterations (1 s: 10 counter updates) and the discarded one
    assert tuner.block == ab_block(0.125, NVML_COUNTER_S) == 9
    assert tuner.result.block == 9 and "10 updates of the 100 ms" in tuner.result.block_by
    phases = [r.phase for r in sweep.records]
    assert phases.count("counted") == 2 * want
    first = phases.index("counted")
    assert first > 2 and phases[2:first] == ["unsteady"] * (first - 2)
    top = [r.temp_delta_c for r in sweep.records if r.phase == "counted" and r.freq_mhz == 1410.0]
    trend = np.polyfit(np.arange(len(top) + 1), np.r_[0.0, np.cumsum(top)], 1)[0]
    assert len(top) == want and trend <= 1.0 + 1e-9
    # the tuner's record of each iteration follows the sweep's (dropped ones turn unsteady)
    assert [it.phase for it in tuner.result.iterations[: len(phases)]] == phases
    assert all(r.temp_delta_c is not None for r in sweep.records)
    assert sweep.done and fake_nvml.nvmlDeviceResetGpuLockedClocks.call_count == 1


def _nvml_writes(fake) -> list[str]:
    """The names of every NVML set/reset function the fake was called through."""
    return [c[0] for c in fake.mock_calls if c[0].startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]


def test_dry_run_on_an_nvml_machine_measures_read_only_and_never_sets(
    fake_nvml, cpu_only, script, tmp_path, monkeypatch
):
    """``--actuator dry-run``, no --device: the GPU's clocks and counter; clocks only logged.

    The sweep's trace is imported in the planning thread: read in the optimizer hook that ends
    it, a GPT sweep's trace stalled an H200's training for 6.4 s.
    """
    import itertools
    import threading

    from opdvfs.io import torch_trace

    fake_nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = itertools.count(0, 50_000)
    readers: list[str] = []
    read = torch_trace.read

    def read_noting_the_thread(*args, **kwargs):
        readers.append(threading.current_thread().name)
        return read(*args, **kwargs)

    monkeypatch.setattr(torch_trace, "read", read_noting_the_thread)
    argv = [
        "tune",
        *("--target", "0.02", "--actuator", "dry-run", *FAST, "--no-cache"),
        *("--out", str(tmp_path), "--log", str(tmp_path / "calls.jsonl")),
        *("--", "python", str(script), "120"),  # the 0.1 s settles span many CPU iterations
    ]
    res = CliRunner().invoke(app, argv)
    assert _nvml_writes(fake_nvml) == []  # not one set or reset in the whole run
    result = json.loads((tmp_path / "tune.json").read_text())
    rows = result["per_iteration"]
    assert len(rows) == 120 and all(it["energy_j"] > 0 for it in rows)  # the GPU's counter
    calls = read_log(tmp_path / "calls.jsonl")
    assert calls[0]["meter"] == "nvml" and calls[0]["freqs_mhz"] == [210, 1005, 1380, 1395, 1410]
    sets = [c["freq_mhz"] for c in calls if c["kind"] == "set"]
    assert sets[:4] == [1410.0, 1380.0, 210.0, 1410.0]  # the sweep, logged
    assert calls[-1]["kind"] == "restore" and _kinds(tmp_path / "calls.jsonl").count("restore") == 1
    # a CPU trace has no power samples: planning stops there, and says why
    assert res.exit_code == 2 and "measures no power" in res.stderr
    assert not (tmp_path / "clock.png").exists()  # no schedule: no clock figure, not an empty one
    assert readers == ["opdvfs-tune-plan"]


def _fixed_two_stage_plan(monkeypatch, fake_nvml) -> None:
    """Plan a fixed two-stage schedule on the trace's operators (the CPU trace has no power).

    Low clock, then the top, halfway through the measured iteration: what is tested is how tune
    applies and measures a plan, not the planner. The energy counter advances 50 J per read.
    """
    import itertools
    from types import SimpleNamespace

    from opdvfs.tuner import drive as drive_module
    from opdvfs.tuner import planning as planning_module

    fake_nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = itertools.count(0, 50_000)
    iteration_s: list[float] = []

    def fit(profile, **_):
        ops = profile.ops  # an iteration's length: first op to the next iteration's first op
        first = ops.groupby("iteration")["wall_s"].min()
        steps = first.diff()[np.diff(first.index, prepend=-1) == 1]
        iteration_s.append(float(steps.median()))
        return SimpleNamespace(
            models=None,
            n_ops=int(ops.groupby("iteration").size().iloc[0]),
            inputs=SimpleNamespace(freqs_mhz=(1005.0, 1410.0)),  # (the static round's top)
        )

    def plan(fitted, *, target, conservative=True, **_):
        # tune's rounds measure each plan and re-plan: on point values, no margins
        assert conservative is False, "tune plans on point values"
        t, n_ops = iteration_s[-1], fitted.n_ops
        return Schedule.from_stage_freqs(
            [0, n_ops // 2], [1005.0, 1410.0], n_ops=n_ops, start_s=[0.0, t / 2],
            predicted_time_s=t, baseline_time_s=t, target=target, solver="manual",
        )  # fmt: skip

    monkeypatch.setattr(planning_module, "fit_profile", fit)
    monkeypatch.setattr(planning_module, "plan_fitted", plan)
    # a shared CPU's iterations vary by tens of %: keep the schedule applied through them
    timed = drive_module._timed_executor
    monkeypatch.setattr(drive_module, "_timed_executor", lambda act: timed(act, tolerance=0.95))


def _check_applied_by_time(result: dict, log: Path, stderr: str) -> None:
    """One measured round; sets by time only in tuned/steady iterations; one restore, last."""
    assert "trigger time" not in (result["error"] or ""), result["error"]
    (rnd,) = result["rounds"]  # measured: two pairs of blocks, time and energy
    # (a shared CPU's iteration can run so long the executor falls back: its tuned iterations
    # are dropped, and a tuned block of 2 they empty takes its pair with it)
    assert rnd["pairs"] == 2 or rnd["dropped"] > 0
    # every pair left measured both time and energy (on a machine loaded enough that the
    # executor fell back in every tuned iteration, none is left: that is load, not a bug)
    assert rnd["slowdown"]["n"] == rnd["pairs"]
    assert (rnd["saving"] or {"n": 0})["n"] == rnd["pairs"]
    rows = result["per_iteration"]
    phases = [it["phase"] for it in rows]
    tuned = applied_iterations(rows)
    calls = read_log(log)
    # (the first record, iteration None, is the top clock locked before the program starts)
    by_time = [c for c in calls[2:] if c["kind"] == "set" and c["op_index"] is None]
    assert by_time, (stderr, phases)
    assert {c["iteration"] for c in by_time} <= tuned
    assert 1005.0 in {c["freq_mhz"] for c in by_time}  # the plan's low stage, set by time
    assert calls[-1]["kind"] == "restore" and _kinds(log).count("restore") == 1


def test_off_the_simulator_the_ab_blocks_apply_the_plan_by_time(
    fake_nvml, cpu_only, script, tmp_path, monkeypatch
):
    """dry-run on (fake) NVML: the tuned blocks apply the plan by time, as run --trigger time."""
    _fixed_two_stage_plan(monkeypatch, fake_nvml)
    log = tmp_path / "calls.jsonl"
    argv = [
        "tune",
        *("--target", "0.02", "--actuator", "dry-run", *FAST, "--no-cache"),
        *("--block", "3", "--iterations-per-clock", "2"),  # consecutive counted iterations
        *("--out", str(tmp_path), "--log", str(log)),
        # no dispatch mode: a CPU iteration is ~4 ms, each 0.1 s settle ~25 of them
        *("--", "python", str(script), "240"),
    ]
    res = CliRunner().invoke(app, argv)
    assert _nvml_writes(fake_nvml) == []
    _check_applied_by_time(json.loads((tmp_path / "tune.json").read_text()), log, res.stderr)
    assert res.exit_code in (0, 2), res.output


#: A training script whose model is ``torch.compile``d (``COMPILED.py STEPS OUT``): 10 ms steps;
#: after each step it appends Dynamo's counters and the compiled graph's calls to OUT (JSON).
COMPILED_SCRIPT = """
import json, os, sys, time
import torch
from torch._dynamo.utils import counters

class Counting:  # the backend, counting each call of the compiled graph (never eager)
    calls = 0
    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend
        compiled = lookup_backend(os.environ.get("OPDVFS_TEST_BACKEND", "inductor"))(
            gm, example_inputs
        )
        def run(*args):
            self.calls += 1
            return compiled(*args)
        return run

steps, out = int(sys.argv[1]), sys.argv[2]
torch._dynamo.reset()
counters.clear()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
backend = Counting()
compiled = torch.compile(model, backend=backend)
rows = []
for i in range(steps):
    t0 = time.perf_counter()
    loss = compiled(torch.ones(2, 8)).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    time.sleep(max(0.01 - (time.perf_counter() - t0), 0.0))
    opt.step()
    rows.append({
        "calls": backend.calls,
        "frames": counters["frames"]["total"],
        "ok": counters["frames"]["ok"],
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
    })
with open(out, "w") as f:
    json.dump(rows, f)
"""


def test_off_the_simulator_a_compiled_model_stays_compiled_while_tuned(
    fake_nvml, cpu_only, tmp_path, monkeypatch
):
    """dry-run on (fake) NVML: no dispatch mode, so the model runs compiled the whole run (#21).

    The sweep, the A/B round and the time-triggered sets are those of the eager script's run.
    """
    _fixed_two_stage_plan(monkeypatch, fake_nvml)
    train = tmp_path / "compiled.py"
    train.write_text(COMPILED_SCRIPT)
    counted, log, steps = tmp_path / "counters.json", tmp_path / "calls.jsonl", 90
    argv = [
        "tune",
        *("--target", "0.02", "--actuator", "dry-run", *FAST, "--no-cache"),
        *("--block", "3", "--iterations-per-clock", "2"),
        *("--out", str(tmp_path / "out"), "--log", str(log)),
        *("--", "python", str(train), str(steps), str(counted)),
    ]
    res = CliRunner().invoke(app, argv)
    assert _nvml_writes(fake_nvml) == []
    rows = json.loads(counted.read_text())
    assert len(rows) == steps
    # compiled once, at the first step; no graph break; nothing compiled again after the
    # warm-up (no recompile), and every step ran the compiled graph: never eagerly
    assert rows[0]["frames"] > 0 and rows[0]["ok"] > 0 and rows[0]["graphs"] > 0
    assert all(r["breaks"] == 0 for r in rows)
    assert {(r["frames"], r["ok"], r["graphs"]) for r in rows[1:]} == {
        (rows[1]["frames"], rows[1]["ok"], rows[1]["graphs"])
    }
    assert [r["calls"] for r in rows] == list(range(1, steps + 1))
    assert "runs eagerly" not in res.stderr and "--trigger" not in res.stderr
    result = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert len(result["per_iteration"]) == steps
    _check_applied_by_time(result, log, res.stderr)
    assert res.exit_code in (0, 2), res.output


def test_the_python_api_writes_nothing_when_the_block_ends_before_the_sweep(tmp_path):
    import torch

    import opdvfs

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = tmp_path / "out"
    with opdvfs.tune(actuator="sim:a100-like", out=out, cache=False) as t:
        for _ in range(2):  # the warm-up alone
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    assert "before tuning was done" in (t.result.error or "")
    assert not out.exists() and t.tuner.guard.restored


def test_on_a_simulated_gpu_the_compile_warning_is_tunes_own():
    """sim:PRESET keeps the dispatch mode (it drives the simulator): tune says so, no flag named."""
    import warnings

    import torch

    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner.drive import SIM_COMPILED_HINT
    from opdvfs.tuner.loop import Tuner

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    tuner = Tuner(make_actuator("sim:a100-like", work_scale=1e6), target=0.02)
    with warnings.catch_warnings(record=True) as seen, tuner:
        warnings.simplefilter("always")
        compiled = torch.compile(model, backend="eager")
        for _ in range(2):
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
    lines = [str(w.message) for w in seen if "torch.compile" in str(w.message)]
    assert lines == [f"opdvfs: {SIM_COMPILED_HINT}"]
    assert "--trigger" not in lines[0] and "simulated GPU" in lines[0]
    assert tuner.guard.restored


def test_off_the_simulator_the_cache_key_names_the_gpu_and_the_step_not_a_dispatch_mode(
    fake_nvml, cpu_only
):
    """The key on a real device: the actuator's kind, NVML's GPU name, the optimizer's step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from opdvfs.runtime.actuators import NvmlActuator, make_actuator
    from opdvfs.tuner.drive import step_signature
    from opdvfs.tuner.loop import Tuner

    def key(name: str, kind: str = "nvml", width: int = 8) -> Tuner:
        fake_nvml.nvmlDeviceGetName.return_value = name
        act = NvmlActuator() if kind == "nvml" else make_actuator("dry-run")
        tuner = Tuner(act, target=0.02, clocks=[1410.0, 1005.0])
        with act, tuner:
            model = torch.nn.Linear(width, 8)
            opt = torch.optim.SGD(model.parameters(), lr=1e-2)
            for _ in range(3):
                model(torch.randn(4, width)).sum().backward()
                opt.step()
        assert tuner.result.device == name and tuner.drive.gpu_name == name
        assert not isinstance(tuner.executor, TorchDispatchMode)  # a compiled model stays so
        return tuner

    h200 = key("NVIDIA H200")
    assert h200.result.cache_key is not None
    assert h200.op_names[0] == "torch.optim.sgd.SGD" and "torch.float32 (8, 8) cpu" in h200.op_names
    assert h200.result.cache_key == key("NVIDIA H200").result.cache_key  # the same job
    assert h200.result.cache_key != key("NVIDIA A100-SXM4-80GB").result.cache_key
    assert h200.result.cache_key != key("NVIDIA H200", kind="dry-run").result.cache_key
    assert h200.result.cache_key != key("NVIDIA H200", width=16).result.cache_key
    opt = torch.optim.AdamW(torch.nn.Linear(2, 3).parameters())
    assert step_signature(opt)[1:3] == ["torch.float32 (3, 2) cpu", "torch.float32 (3,) cpu"]
    # the name is read through the read-only NVML reader, as bytes from an older pynvml too
    fake_nvml.nvmlDeviceGetName.return_value = b"NVIDIA H200"
    with NvmlActuator() as act:
        assert act.meter.name() == "NVIDIA H200"


def test_off_the_simulator_a_cached_plan_applies_by_time_from_the_warm_up(
    fake_nvml, cpu_only, tmp_path, monkeypatch
):
    """The cache off the simulator: the step signature's key hits, the plan applies by time."""
    import time

    import torch

    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.tuner import drive as drive_module
    from opdvfs.tuner.loop import Tuner

    timed = drive_module._timed_executor
    monkeypatch.setattr(drive_module, "_timed_executor", lambda act: timed(act, tolerance=0.95))
    fake_nvml.nvmlDeviceGetName.return_value = "NVIDIA H200"

    def run(steps: int, log: Path) -> Tuner:
        tuner = Tuner(
            make_actuator("dry-run", log=log), target=0.02, cache=TuneCache(tmp_path / "cache")
        )
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        with tuner:
            for _ in range(steps):
                t0 = time.perf_counter()
                model(torch.randn(4, 8)).sum().backward()
                time.sleep(max(0.02 - (time.perf_counter() - t0), 0.0))
                opt.step()
        return tuner

    first = run(3, tmp_path / "first.jsonl")  # ends in the sweep: the key, nothing cached
    key = first.result.cache_key
    assert key is not None and TuneCache(tmp_path / "cache").get(key) is None
    plan = Schedule.from_stage_freqs(
        [0, 1], [1005.0, 1410.0], n_ops=2, start_s=[0.0, 0.01], predicted_time_s=0.02,
        baseline_time_s=0.02, target=0.02, solver="manual",
    )  # fmt: skip
    TuneCache(tmp_path / "cache").put(key, plan, {"budget": 0.02})
    log = tmp_path / "calls.jsonl"
    second = run(8, log)
    assert second.result.cache_hit and second.result.cache_key == key
    phases = [it.phase for it in second.result.iterations]  # re-measured from the warm-up on
    assert phases[:2] == ["warmup"] * 2 and set(phases[2:]) <= {"switch", "reference", "tuned"}
    calls = read_log(log)
    by_time = [c for c in calls[2:] if c["kind"] == "set" and c["op_index"] is None]
    assert by_time and {c["iteration"] for c in by_time} <= set(range(2, 9))
    assert 1005.0 in {c["freq_mhz"] for c in by_time}
    assert calls[-1]["kind"] == "restore" and _kinds(log).count("restore") == 1


# ----------------------------------------------------------------------------- A/B statistics
def test_ab_block_spans_ten_counter_updates_and_keeps_the_default_without_a_counter():
    from opdvfs.models.attribution import sensor_iterations
    from opdvfs.tuner.ab import BLOCK_COUNTER_UPDATES, DEFAULT_BLOCK, ab_block

    assert BLOCK_COUNTER_UPDATES == 10 and DEFAULT_BLOCK == 3
    # H200's GPT step: ~100 ms per iteration against the 100 ms counter: 10 counted + 1
    assert ab_block(0.1003, 0.1) == 1 + 10
    assert ab_block(0.0099, 0.1) == 1 + sensor_iterations(
        0.0099, period_ms=100.0, window_ms=100.0, windows=10
    )  # 102: 1 s of 9.9 ms iterations
    assert ab_block(1.5, 0.1) == DEFAULT_BLOCK  # long iterations: never fewer than the default
    assert ab_block(0.1, None) == ab_block(None, 0.1) == DEFAULT_BLOCK


def _rows(
    round_: int,
    start: int,
    *,
    block: int,
    pairs: int,
    saving: float,
    rng,
    outlier: tuple[int, float, float] | None = None,
    top_in: frozenset[int] = frozenset(),
):
    """Synthetic A/B iterations (ABBA): ~100 ms, ~67 J per reference iteration, with noise.

    Tuned iterations use ``1 - saving`` of the energy; ``outlier``: (iteration, s, J) put in
    place of one; ``top_in``: tuned iterations run at the top clock (reference-like).
    """
    from opdvfs.tuner.result import TuneIteration

    rows, i = [], start
    for p in range(pairs):
        for kind in ("reference", "tuned") if p % 2 == 0 else ("tuned", "reference"):
            for k in range(block):
                phase = "switch" if k == 0 else kind
                scale = 1 - saving if phase == "tuned" and i not in top_in else 1.0
                time_s = 0.1 * (1 + rng.normal(0, 0.003))
                energy_j = 67.0 * scale * (1 + rng.normal(0, 0.01))
                if outlier is not None and i == outlier[0]:
                    time_s, energy_j = outlier[1], outlier[2]
                rows.append(TuneIteration(i, phase, 1980.0, time_s, energy_j, round_))
                i += 1
    return rows


def _result(rows_by_round, *, target=0.02, block=4, pairs=3):
    """A TuneResult whose rounds are measured by ab_pairs and chosen by choose_round."""
    from opdvfs.tuner.ab import ab_pairs
    from opdvfs.tuner.policy import choose_round
    from opdvfs.tuner.result import TuneResult, TuneRound

    rounds = []
    for rows in rows_by_round:
        ab = ab_pairs(rows)
        rounds.append(TuneRound(target, 1, 0.0, 0.15, ab.slowdown, ab.saving, ab.pairs, ab.dropped))
    index, met, why = choose_round(rounds, target)
    result = TuneResult(
        target, "dry-run", "NVIDIA H200", (1980.0,), [r for rows in rows_by_round for r in rows],
        rounds, index, met, chosen_by=why, block=block, block_by="given (--block)", pairs=pairs,
        schedule=Schedule.from_stage_freqs([0], [1980.0], n_ops=1, target=target, solver="manual"),
    )  # fmt: skip
    return result


def test_a_null_contrast_with_one_outlier_claims_no_saving_and_is_not_chosen_by_its_mean():
    """The H200 dry run's case: clocks never changed, one slow, hungry reference iteration."""
    from opdvfs.tuner.report import summary_lines

    rng = np.random.default_rng(3)
    # round 1: iteration 2 (a reference block) took 137 ms and 115 J among ~100 ms / 67 J
    first = _rows(0, 0, block=4, pairs=3, saving=0.0, rng=rng, outlier=(2, 0.137, 115.0))
    second = _rows(1, 24, block=4, pairs=3, saving=0.0, rng=rng)
    result = _result([first, second])
    one, two = result.rounds
    # the outlier: a large mean saving from nothing, with an interval holding 0
    assert one.saving.mean > 0.05 and one.saving.low < 0 < one.saving.high
    assert one.saving.mean > two.saving.mean and two.saving.low > one.saving.low
    # chosen by the saving's lower bound, not its (lucky) mean
    assert result.best_round == 1 and result.met is True
    assert result.saving_resolved is False
    line = summary_lines(result)[-1]
    assert line.startswith("applied round 2 for the rest of the run")
    assert "not distinguishable from no saving at 3 pairs of blocks of 3 counted" in line
    assert "--pairs" in line and "--block" in line
    assert "vs the top clock" not in line  # no saving claimed
    doc = result.to_dict()
    assert doc["best_round"] == 1 and doc["saving_resolved"] is False
    assert "lower bound" in doc["chosen_by"]
    # a single round of it is applied (within the target) but still claims nothing
    alone = _result([first])
    assert alone.best_round == 0 and alone.saving_resolved is False
    assert "not distinguishable" in summary_lines(alone)[-1]


def test_a_real_saving_with_tight_intervals_is_chosen_and_claimed():
    from opdvfs.tuner.report import _markdown, summary_lines

    rng = np.random.default_rng(4)
    tight = _rows(0, 0, block=11, pairs=3, saving=0.15, rng=rng)
    # a round with a higher mean but a wide interval (a noisy block): not the surer one
    wide = _rows(1, 66, block=11, pairs=3, saving=0.15, rng=rng, outlier=(80, 0.1, 10.0))
    result = _result([tight, wide], block=11)
    best = result.best
    assert result.best_round == 0 and result.met is True and result.saving_resolved is True
    assert best.saving.mean == pytest.approx(0.15, abs=0.01) and best.saving.low > 0.13
    assert result.rounds[1].saving.mean > best.saving.mean
    line = summary_lines(result)[-1]
    assert line.startswith("applied round 1 for the rest of the run: measured slowdown ")
    assert "(within the 2.00% target), energy saved 15." in line and "vs the top clock" in line
    assert "not distinguishable" not in line
    md = _markdown(result, [])
    assert "The applied round was chosen by the highest lower bound" in md
    assert "| dropped (fallback) | applied |" in md


def test_no_round_within_the_target_takes_the_least_slowdown():
    from opdvfs.tuner.policy import CHOSEN_BY_SLOWDOWN, choose_round
    from opdvfs.tuner.result import Interval, TuneRound

    def rnd(slow: float, save: float) -> TuneRound:
        return TuneRound(
            0.02, 1, None, None, Interval(slow, slow - 0.01, slow + 0.01, 3),
            Interval(save, save - 0.01, save + 0.01, 3), 3,
        )  # fmt: skip

    assert choose_round([rnd(0.05, 0.3), rnd(0.03, 0.1)], 0.02) == (1, False, CHOSEN_BY_SLOWDOWN)
    assert choose_round([rnd(0.05, 0.3), rnd(0.01, 0.1), rnd(0.02, 0.2)], 0.02)[:2] == (2, True)


def test_fallback_iterations_are_dropped_from_their_tuned_block():
    """Iterations the time-triggered executor fell back in (top clock) do not measure the plan."""
    from types import SimpleNamespace

    from opdvfs.tuner.ab import ab_pairs
    from opdvfs.tuner.drive import DeviceDrive, SimulatedGpuDrive

    rng = np.random.default_rng(5)
    # pair 1's tuned block is iterations 5-7 (4 is its switch); 6 and 7 ran at the top clock
    rows = _rows(0, 0, block=4, pairs=3, saving=0.15, rng=rng, top_in=frozenset({6, 7}))
    kept = ab_pairs(rows)
    assert kept.dropped == 0 and kept.saving.mean < 0.13  # diluted by the top-clock iterations
    # the executor marked 6 (its watchdog or its length); the next, 7, starts at the top clock
    fell = DeviceDrive.fell_back(SimpleNamespace(timed=SimpleNamespace(diverged_iterations=[6])))
    assert fell == {6, 7}
    dropped = ab_pairs(rows, drop=fell)
    assert dropped.dropped == 2 and dropped.pairs == 3
    assert dropped.saving.mean == pytest.approx(0.15, abs=0.01)
    # a reference iteration is never dropped (the executor applies nothing there)
    assert ab_pairs(rows, drop={1, 2}).dropped == 0
    # a tuned block emptied by the drops: its pair is skipped
    assert ab_pairs(rows, drop={5, 6, 7}).pairs == 2
    assert SimulatedGpuDrive.fell_back(SimpleNamespace()) == set()  # a simulated GPU: none


def test_a_cache_hit_repeats_the_tuned_intervals_and_claims_no_unresolved_saving():
    from dataclasses import asdict

    from opdvfs.tuner.report import summary_lines
    from opdvfs.tuner.result import Interval, TuneResult

    def hit(low: float, high: float) -> str:
        result = TuneResult(0.02, "dry-run", None, (1980.0,), [], cache_hit=True, cache_key="k")
        result.cached = {
            "budget": 0.02,
            "slowdown": asdict(Interval(-0.001, -0.008, 0.006, 3)),
            "saving": asdict(Interval((low + high) / 2, low, high, 3)),
        }
        return summary_lines(result)[0]

    null = hit(-0.0086, 0.0192)
    assert "energy saved 0.53% [-0.86%, 1.92%]: not distinguishable from no saving" in null
    real = hit(0.14, 0.16)
    assert "energy saved 15.00% [14.00%, 16.00%])" in real and "not distinguishable" not in real


# ---------------------------------------------------------------------------- real H200 data
H200_NULL_AB = Path(__file__).parent / "fixtures" / "h200_tune_null_ab.json"


@pytest.mark.parametrize("run", ["eager_block4", "compiled_block4", "eager_block11"])
def test_a_real_h200_null_contrast_claims_no_saving(run):
    """Real A/B iterations of ``tune --actuator dry-run`` on an H200: no clock ever changed.

    The rounds' intervals are recomputed from the iterations as they ran; the applied round is
    the one whose saving's lower bound is highest, and its saving is not told apart from none.
    """
    from opdvfs.tuner.ab import ab_pairs
    from opdvfs.tuner.policy import choose_round
    from opdvfs.tuner.result import TuneIteration, TuneRound

    doc = json.loads(H200_NULL_AB.read_text())["runs"][run]
    rows = [TuneIteration(freq_mhz=None, **r) for r in doc["ab_iterations"]]
    rounds = []
    for k, recorded in enumerate(doc["rounds"]):
        pairs = ab_pairs([r for r in rows if r.round == k])
        assert pairs.saving is not None
        got = [pairs.slowdown.mean, pairs.slowdown.low, pairs.slowdown.high]
        assert got == pytest.approx(recorded["slowdown"], abs=1e-9)
        got = [pairs.saving.mean, pairs.saving.low, pairs.saving.high]
        assert got == pytest.approx(recorded["saving"], abs=1e-9)
        rounds.append(TuneRound(0.02, 1, None, None, pairs.slowdown, pairs.saving, pairs.pairs))
    index, met, _ = choose_round(rounds, 0.02)
    within = [i for i, r in enumerate(rounds) if r.slowdown.mean <= 0.02]
    assert met and index == max(within, key=lambda i: rounds[i].saving.low)
    chosen = rounds[index].saving
    assert chosen.low <= 0.0 <= chosen.high  # nothing changed: no saving to claim
    if run == "eager_block4":  # the winner's curse the point estimate fell for on this run
        luckiest = max(within, key=lambda i: rounds[i].saving.mean)
        assert luckiest != index and rounds[luckiest].saving.mean > 0.05


def test_applied_iterations_are_the_tuned_blocks_their_switch_and_the_steady_phase():
    phases = ["warmup", "switch", "tuned", "switch", "reference", "planning", "steady", "steady"]
    rows = [{"iteration": i, "phase": p} for i, p in enumerate(phases)]
    # the switch opening a tuned block is armed; one opening a reference block is not; the
    # iteration after the last steady one was armed as the script ended
    assert applied_iterations(rows) == {1, 2, 6, 7, 8}
    assert applied_iterations(rows[:6]) == {1, 2}


def test_only_a_round_that_measured_a_saving_applies():
    from opdvfs.tuner.policy import applies
    from opdvfs.tuner.result import Interval, TuneRound

    def rnd(saving: Interval | None) -> TuneRound:
        return TuneRound(0.02, 2, None, None, Interval(0.0004, -0.0001, 0.001, 3), saving, 3)

    cost = Interval(-0.0006, -0.0009, -0.0002, 3)  # a user's MLP on sim:h100-like
    assert not applies(rnd(cost), met=True)
    assert not applies(rnd(Interval(-0.0104, -0.0217, 0.0009, 3)), met=True)  # H200 null
    assert applies(rnd(Interval(0.15, 0.14, 0.16, 3)), met=True)
    assert applies(rnd(Interval(0.15, 0.14, 0.16, 3)), met=False)  # the least slowdown saves
    assert applies(rnd(None), met=True) and not applies(rnd(None), met=False)
