"""The simulated GPU (``sim:PRESET``): the twin applied online to a script's operators (#21)."""

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from opdvfs import Schedule
from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators import ClockGuard, SimGpuActuator, make_actuator
from opdvfs.sim import PRESETS, SimulatedDevice, get_preset
from opdvfs.sim.gpu import SimulatedGpu
from opdvfs.sim.physics import CUBE, op_arrays
from opdvfs.workloads.workload import Workload

from conftest import captured_op_count, read_log

LATENCY_S = 15e-3  # a100-like's switch (the preset's spec; checked below)
#: The lower clock the tiny GPT runs at: its matrix multiplies are clearly slower there.
LOW_MHZ = 510.0
#: A matrix multiply of ~0.6-1.6 ms on the a100-like preset: compute-bound, follows the clock.
BIG: dict[str, Any] = {
    "name": "aten::mm",
    "type": "MatMul",
    "stream": "compute",
    "flops": 2e11,
    "bytes_loaded": 4e7,
    "bytes_stored": 2e7,
}


def launch(gpu: SimulatedGpu, until_s: float, op: dict = BIG) -> None:
    """Launch ``op`` until the device's virtual time passes ``until_s``."""
    while gpu.now_s() < until_s:
        for _ in range(8):
            gpu.launch(op)


def test_the_preset_is_the_one_the_tests_assume():
    assert get_preset("a100-like").spec.switch_latency_ms * 1e-3 == LATENCY_S
    assert SimulatedGpu("a100-like").switch_latency_s == LATENCY_S


def test_a_clock_request_lands_after_the_latency_and_the_op_in_flight_keeps_its_clock():
    gpu = SimulatedGpu("a100-like")
    launch(gpu, 0.01)
    t0 = gpu.now_s()
    gpu.request_freq_mhz(810.0)
    launch(gpu, t0 + 0.05)
    k = gpu.kernels()
    start_s = k["start_us"].to_numpy() * 1e-6
    at_low = k["freq_mhz"].to_numpy() == 810.0
    # every kernel that started before the request landed ran at the top clock, every later one
    # at the new clock: the one running as it landed kept the top clock to its end
    land_s = t0 + LATENCY_S
    assert (k["freq_mhz"][start_s < land_s] == 1410.0).all()
    assert at_low[start_s >= land_s].all() and at_low.any()
    straddling = (start_s < land_s) & (start_s + k["time_us"].to_numpy() * 1e-6 > land_s)
    assert straddling.sum() == 1 and not at_low[straddling].any()
    # a compute-bound kernel is slower at 810 MHz, by what the twin says for that operator
    twin = SimulatedDevice.from_preset("a100-like")
    one = Workload(pd.DataFrame([BIG]), name="mm")
    ratio_twin = twin.run(one, freq_mhz=810.0)[1].dur_us[0] / twin.run(one)[1].dur_us[0]
    times = k["time_us"].to_numpy()
    ratio = np.median(times[at_low]) / np.median(times[start_s < land_s])
    assert ratio_twin > 1.3
    assert ratio == pytest.approx(ratio_twin, rel=0.02)


def test_a_newer_request_replaces_the_pending_clock_and_lands_when_that_was_due():
    gpu = SimulatedGpu("a100-like")
    launch(gpu, 0.01)
    t0 = gpu.now_s()
    gpu.request_freq_mhz(510.0)
    launch(gpu, t0 + 0.005)
    gpu.request_freq_mhz(1005.0)  # 5 ms later: the 510 MHz request is still pending
    launch(gpu, t0 + 0.06)
    k = gpu.kernels()
    assert 510.0 not in set(k["freq_mhz"])
    start_s = k["start_us"].to_numpy() * 1e-6
    assert (k["freq_mhz"][start_s < t0 + LATENCY_S] == 1410.0).all()
    assert (k["freq_mhz"][start_s >= t0 + LATENCY_S] == 1005.0).all()


def test_a_switch_issued_after_its_trigger_op_is_issued_that_long_after_it_on_the_device():
    act = SimGpuActuator(SimulatedGpu("a100-like"))
    gpu = act.gpu
    for _ in range(5):
        gpu.launch(BIG)
    start_s = gpu.op_start_s(0, 3)
    assert start_s is not None and 0 < start_s < gpu.now_s() < start_s + 0.004
    act.at(0, 3, 0.004)  # the executor's worker: 4 ms after op 3 started
    act.set_freq_mhz(1005.0)
    launch(gpu, start_s + 0.004 + LATENCY_S + 0.01)
    k = gpu.kernels()
    first_low = k.loc[k["freq_mhz"] == 1005.0, "start_us"].min() * 1e-6
    before = k.loc[k["freq_mhz"] == 1410.0, "start_us"].max() * 1e-6
    assert before < start_s + 0.004 + LATENCY_S <= first_low


def test_energy_counter_is_monotone_and_the_integral_of_the_power_samples():
    gpu = SimulatedGpu("a100-like")
    small = {**BIG, "name": "aten::add", "type": "Add", "flops": 1e6}
    counter = []
    for k in range(30):
        launch(gpu, 0.04 * (k + 1), small if k % 3 else BIG)
        if k == 10:
            gpu.request_freq_mhz(705.0)
        counter.append(gpu.energy_j())
    assert (np.diff(counter) > 0).all()
    samples = gpu.power_samples()
    period_s, window_s = gpu.sensor_s
    assert (period_s, window_s) == (0.1, 0.1)  # NVML on A100: 100 ms, averaged over 100 ms
    assert np.allclose(np.diff(samples["t_s"]), period_s)
    assert samples["t_s"].iloc[0] == pytest.approx(window_s)
    # the windows tile the timeline: power x period sums to the counter at the last sample
    integral_j = float((samples["power_w"] * period_s).sum())
    assert integral_j == pytest.approx(samples["energy_j"].iloc[-1], rel=2e-3)
    assert samples["energy_j"].is_monotonic_increasing
    assert set(samples["freq_mhz"]) == {1410.0, 705.0}
    # the counter is each kernel's time at its clock times the twin's power for that operator
    twin = SimulatedDevice.from_preset("a100-like")
    kernels = gpu.kernels()
    expected_j = 0.0
    for name, op in (("aten::mm", BIG), ("aten::add", small)):
        for f in (1410.0, 705.0):
            run = twin.run(Workload(pd.DataFrame([op]), name="op"), freq_mhz=f)[1]
            power_w = run.op_chip_energy_j[0] / (run.dur_us[0] * 1e-6)
            mine = (kernels["name"] == name) & (kernels["freq_mhz"] == f)
            expected_j += power_w * kernels.loc[mine, "time_us"].sum() * 1e-6
    assert gpu.energy_j() == pytest.approx(expected_j, rel=2e-3)
    assert gpu.power_w() == pytest.approx(samples["power_w"].iloc[-1], rel=0.05)


def test_hopper_power_is_a_one_second_average_sampled_every_100_ms():
    gpu = SimulatedGpu("h100-like")
    launch(gpu, 1.5)
    samples = gpu.power_samples()
    assert gpu.sensor_s == (0.1, 1.0)
    assert samples["t_s"].iloc[0] == pytest.approx(1.0)
    assert np.allclose(np.diff(samples["t_s"]), 0.1)


def test_work_scale_runs_each_launch_as_that_many_times_its_work():
    gpu = SimulatedGpu("a100-like", work_scale=4.0)
    launch(gpu, 0.02)
    twin = SimulatedDevice.from_preset("a100-like")
    scaled = {**BIG, **{k: 4 * BIG[k] for k in ("flops", "bytes_loaded", "bytes_stored")}}
    run = twin.run(Workload(pd.DataFrame([scaled]), name="mm"))[1]
    assert gpu.kernels()["time_us"].median() == pytest.approx(run.dur_us[0], rel=0.01)
    with pytest.raises(ValidationError, match="work_scale"):
        SimulatedGpu("a100-like", work_scale=0.0)


def test_the_die_warms_under_load_and_less_at_a_lower_clock():
    temps = {}
    for f in (1410.0, 510.0):
        gpu = SimulatedGpu("a100-like", freq_mhz=f)
        start_c = gpu.temperature_c()
        launch(gpu, 3.0)
        samples = gpu.power_samples()
        assert samples["temp_c"].is_monotonic_increasing and gpu.temperature_c() > start_c + 1
        temps[f] = gpu.temperature_c()
    assert temps[510.0] < temps[1410.0] - 1


def test_make_actuator_builds_a_simulated_gpu_and_names_the_presets():
    act = make_actuator("sim:a100-like")
    assert isinstance(act, SimGpuActuator) and act.kind == "sim:a100-like"
    assert tuple(act.supported_freqs_mhz()) == get_preset("a100-like").spec.freqs_mhz
    idle_w = act.read_power_w()
    assert act.read_energy_j() == 0.0 and idle_w > 0  # nothing launched yet: idle
    launch(act.gpu, 0.2)
    assert act.read_power_w() > 1.2 * idle_w and act.read_energy_j() > 0
    act.close()
    with pytest.raises(ValidationError, match="sim:bogus.*" + ", ".join(PRESETS)):
        make_actuator("sim:bogus")
    with pytest.raises(ValidationError, match="sim:PRESET"):
        make_actuator("bogus")


# ------------------------------------------------------------------------ a real script (torch)
torch = pytest.importorskip("torch")
from opdvfs.runtime.simgpu_feed import SimGpuFeed  # noqa: E402

from tiny_gpt import LaunchLog  # noqa: E402

#: A TinyGPT wide enough for its matrix multiplies to follow the clock; a script and a function.
TRAIN = f"""
import sys
import torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from tiny_gpt import TinyGPT


def train_tiny_gpt(steps):
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, dim=256, heads=4, layers=2, seq=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 256, (steps, 8, 65))
    for i in range(steps):
        logits = model(data[i, :, :-1])
        target = data[i, :, 1:].reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    train_tiny_gpt(int(sys.argv[1]))
"""
_namespace: dict = {}
exec(TRAIN, _namespace)
train_tiny_gpt = _namespace["train_tiny_gpt"]


def test_tiny_gpt_at_a_lower_clock_takes_the_time_and_energy_the_twin_gives_its_operators():
    launches = LaunchLog()
    with SimGpuFeed(cast(Any, launches)):
        train_tiny_gpt(2)
    ops = pd.DataFrame(launches.iterations[1])
    # the twin runs the aten names on the units of their kind: matmuls on the matrix units
    unit = op_arrays(ops).unit
    matmul = ops["type"].isin(["mm", "addmm", "bmm"]).to_numpy()
    assert matmul.any() and (unit[matmul] == CUBE).all() and (unit[~matmul] != CUBE).all()
    twin = SimulatedDevice.from_preset("a100-like")
    steps = 5
    measured: dict[float, Any] = {}
    expected: dict[float, Any] = {}
    for f in (1410.0, LOW_MHZ):
        with SimGpuActuator(SimulatedGpu("a100-like", freq_mhz=f)) as act:
            train_tiny_gpt(steps)
        measured[f] = act.per_iteration()
        assert measured[f]["iterations"] == steps - 2
        kernels = act.gpu.kernels()
        assert (kernels["freq_mhz"] == f).all()
        assert len(kernels[kernels["iteration"] == 1]) == len(ops)
        result, _ = twin.run(Workload(ops, name="tiny"), freq_mhz=f, iterations=steps - 2)
        expected[f] = result
    for f in measured:
        assert measured[f]["time_s"] == pytest.approx(expected[f].iteration_time_s, rel=0.01)
        assert measured[f]["energy_j"] == pytest.approx(expected[f].chip_energy_j, rel=0.01)
    slower = measured[LOW_MHZ]["time_s"] / measured[1410.0]["time_s"]
    cheaper = measured[LOW_MHZ]["energy_j"] / measured[1410.0]["energy_j"]
    twin_slower = expected[LOW_MHZ].iteration_time_s / expected[1410.0].iteration_time_s
    twin_cheaper = expected[LOW_MHZ].chip_energy_j / expected[1410.0].chip_energy_j
    assert slower > 1.05 and cheaper < 0.9
    assert slower == pytest.approx(twin_slower, rel=0.005)
    assert cheaper == pytest.approx(twin_cheaper, rel=0.005)


def test_the_clock_guard_restores_the_simulated_gpu_on_an_exception():
    act = SimGpuActuator(SimulatedGpu("a100-like"))

    def crash() -> None:
        with act, ClockGuard(act):
            act.set_freq_mhz(510.0)
            train_tiny_gpt(1)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        crash()
    assert [c["kind"] for c in act.calls] == ["set", "restore"]
    launch(act.gpu, act.gpu.now_s() + 2 * LATENCY_S)
    assert act.gpu.clock_mhz() == 1410.0


# ------------------------------------------------------------------------------------- the CLI
from typer.testing import CliRunner  # noqa: E402

from opdvfs.cli import app  # noqa: E402


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """The wide TinyGPT script and its operator count per iteration."""
    tmp = tmp_path_factory.mktemp("simgpu")
    path = tmp / "train.py"
    path.write_text(TRAIN)
    return path, captured_op_count(path)


#: Steps of the CLI runs: the first switch lands ~7 iterations (15 ms) after it is issued.
STEPS = 30


def _run(script, tmp_path, freq_mhz: float, *extra: str):
    path, n = script
    schedule = tmp_path / f"s{freq_mhz:g}.json"
    Schedule.from_stage_freqs(
        [0], [freq_mhz], n_ops=n, target=0.0, solver="manual", device="a100-like"
    ).write(schedule)
    log = tmp_path / f"calls{freq_mhz:g}.jsonl"
    options = ["--actuator", "sim:a100-like", "--log", str(log), *extra]
    argv = ["run", str(schedule), *options, "--", "python", str(path), str(STEPS)]
    return CliRunner().invoke(app, argv), log


def _per_iteration(stdout: str) -> tuple[float, float]:
    line = next(x for x in stdout.splitlines() if x.startswith("iterations after the first"))
    assert "virtual time of the simulated GPU sim:a100-like" in line
    assert "J each (the device's energy counter)" in line
    return float(line.split(": ")[1].split(" s each")[0]), float(line.split("), ")[1].split()[0])


def test_run_on_a_simulated_gpu_reports_its_virtual_time_and_energy(script, tmp_path):
    # the first iteration runs more ops than the others (AdamW creates its state): top clock
    with pytest.warns(UserWarning, match="falling back to the maximum clock"):
        top, top_log = _run(script, tmp_path, 1410.0)
    with pytest.warns(UserWarning, match="falling back to the maximum clock"):
        low, low_log = _run(script, tmp_path, 510.0)
    for res, log in ((top, top_log), (low, low_log)):
        assert res.exit_code == 0, res.output
        assert "trigger: op (auto: sim:a100-like runs on virtual time" in res.stdout
        kinds = [r["kind"] for r in read_log(log)]
        assert kinds[0] == "run" and kinds[-1] == "restore" and kinds.count("restore") == 1
    time_top, energy_top = _per_iteration(top.stdout)
    time_low, energy_low = _per_iteration(low.stdout)
    # virtual: a few ms per iteration on the A100-like device, far from the host's time
    assert 1e-4 < time_top < 0.05
    # 510 MHz from the second iteration's first op (it lands 15 ms later, after the first
    # iteration's fallback), then slower and, for these ops, cheaper
    assert time_low > 1.03 * time_top and energy_low < 0.85 * energy_top


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--actuator", "sim:bogus"], "sim:bogus"),
        (["--actuator", "sim:a100-like", "--trigger", "time"], "--trigger time"),
    ],
)
def test_a_bad_simulated_gpu_choice_is_one_line(script, tmp_path, options, needle):
    path, n = script
    schedule = tmp_path / "s.json"
    Schedule.from_stage_freqs(
        [0], [1410.0], n_ops=n, target=0.0, solver="manual", device="a100-like"
    ).write(schedule)
    res = CliRunner().invoke(app, ["run", str(schedule), *options, "--", "python", str(path), "2"])
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output


INFER = f"""
import sys
import torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from tiny_gpt import TinyGPT
torch.manual_seed(0)
model = TinyGPT()
with torch.no_grad():
    for _ in range(int(sys.argv[1])):
        model(torch.randint(0, 64, (2, 16)))
"""


def test_iterations_marked_by_a_function_end_on_the_simulated_gpu_too(tmp_path):
    path = tmp_path / "infer.py"
    path.write_text(INFER)
    at = ["--iteration-at", "tiny_gpt:TinyGPT.forward"]
    workload = tmp_path / "w.json"
    res = CliRunner().invoke(
        app, ["capture", "--out", str(workload), *at, "--", "python", str(path), "3"]
    )
    assert res.exit_code == 0, res.output
    n = len(json.loads(workload.read_text())["ops"]["name"])
    schedule = tmp_path / "s.json"
    Schedule.from_stage_freqs(
        [0], [1410.0], n_ops=n, target=0.0, solver="manual", device="a100-like"
    ).write(schedule)
    argv = ["run", str(schedule), "--actuator", "sim:a100-like", *at]
    with pytest.warns(UserWarning, match="iteration 0 has more than"):  # the first call differs
        res = CliRunner().invoke(app, [*argv, "--", "python", str(path), "5"])
    assert res.exit_code == 0, res.output
    assert "ran 5 iterations;" in res.stdout
    time_s, energy_j = _per_iteration(res.stdout)  # the device counted the iterations itself
    assert 0 < time_s < 0.01 and energy_j > 0
