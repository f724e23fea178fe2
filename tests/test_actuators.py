import signal
import subprocess
import sys
import textwrap
from unittest import mock

import pytest

pynvml = pytest.importorskip("pynvml")

from opdvfs.exceptions import (  # noqa: E402
    ActuatorError,
    DeviceNotFoundError,
    NotSupportedError,
    PermissionDeniedError,
    UnsupportedClockError,
)
from opdvfs.runtime.actuators import ClockGuard, DryRunActuator, NvmlActuator  # noqa: E402

from conftest import NVML_CLOCKS_MHZ, read_log  # noqa: E402


def test_nvml_locks_min_equals_max_and_only_on_change(fake_nvml):
    with NvmlActuator() as act:
        assert act.supported_freqs_mhz() == (210.0, 1005.0, 1380.0, 1395.0, 1410.0)
        fake_nvml.nvmlDeviceGetSupportedGraphicsClocks.assert_called_once_with("handle0", 1593)
        act.set_freq_mhz(1005.0)
        act.set_freq_mhz(1005.0)
        act.set_freq_mhz(1410.0)
        calls = fake_nvml.nvmlDeviceSetGpuLockedClocks.call_args_list
        assert calls == [mock.call("handle0", 1005, 1005), mock.call("handle0", 1410, 1410)]
        act.reset()
        fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_called_once_with("handle0")
        assert act.read_power_w() == pytest.approx(312.5)
        with pytest.raises(UnsupportedClockError, match="1000 MHz is not a supported clock"):
            act.set_freq_mhz(1000.0)
        assert len(calls) == 2
        assert sorted(NVML_CLOCKS_MHZ) == list(act.supported_freqs_mhz())


def test_nvml_energy_counter_in_joules(fake_nvml):
    fake_nvml.nvmlDeviceGetTotalEnergyConsumption.return_value = 123_456_789  # mJ
    with NvmlActuator() as act:
        assert act.read_energy_j() == pytest.approx(123_456.789)
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_not_called()  # reading never sets


def test_nvml_device_by_uuid(fake_nvml):
    NvmlActuator(uuid="GPU-123").close()
    fake_nvml.nvmlDeviceGetHandleByUUID.assert_called_once_with("GPU-123")


@pytest.mark.parametrize(
    ("code", "error", "needle"),
    [
        (pynvml.NVML_ERROR_NO_PERMISSION, PermissionDeniedError, "needs root"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupportedError, "Volta or newer"),
        (pynvml.NVML_ERROR_NOT_FOUND, DeviceNotFoundError, "no such GPU"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, DeviceNotFoundError, "no such GPU"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, ActuatorError, "NVML failed to lock the SM clock"),
    ],
)
def test_nvml_errors_are_translated_by_code_with_advice(fake_nvml, code, error, needle):
    vendor = pynvml.NVMLError(code)
    fake_nvml.nvmlDeviceSetGpuLockedClocks.side_effect = vendor
    with NvmlActuator() as act:
        with pytest.raises(error, match=needle) as info:
            act.set_freq_mhz(1005.0)
        assert info.value.__cause__ is vendor  # chained: the library user still sees NVML's error
        fake_nvml.nvmlDeviceSetGpuLockedClocks.side_effect = None
        act.set_freq_mhz(1005.0)  # the failed call did not count as set
    assert fake_nvml.nvmlDeviceSetGpuLockedClocks.call_count == 2


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_nvml_without_a_driver(fake_nvml, code):
    fake_nvml.nvmlInit.side_effect = pynvml.NVMLError(code)
    with pytest.raises(
        DeviceNotFoundError, match="no NVIDIA driver.*without a GPU, --actuator sim:a100-like"
    ):
        NvmlActuator()


def test_nvml_without_that_gpu_gives_its_initialisation_back(fake_nvml):
    fake_nvml.nvmlDeviceGetHandleByUUID.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    with pytest.raises(DeviceNotFoundError, match="no such GPU while trying to find the GPU"):
        NvmlActuator(uuid="GPU-nope")
    fake_nvml.nvmlShutdown.assert_called_once_with()  # NVML counts inits: none left behind


def test_nvml_close_shuts_down_once(fake_nvml):
    with NvmlActuator() as act:
        act.set_freq_mhz(1410.0)
    act.close()
    # each initialisation given back once (finding the process's GPU opens NVML once more)
    assert fake_nvml.nvmlShutdown.call_count == fake_nvml.nvmlInit.call_count == 2
    fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_not_called()  # closing leaves the clock


def _writes(fake) -> list[str]:
    """The names of every NVML set/reset function the fake was called through."""
    return [c[0] for c in fake.mock_calls if c[0].startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]


def test_the_nvml_reader_has_no_write_at_all():
    import ast
    import inspect

    from opdvfs.runtime.actuators import NvmlReader

    tree = ast.parse(textwrap.dedent(inspect.getsource(NvmlReader)))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "nvmlDeviceGetPowerUsage" in names  # the walk sees its NVML calls
    assert not [n for n in names if n.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]


def test_a_dry_run_with_no_preset_measures_the_gpu_read_only(fake_nvml, tmp_path):
    import itertools

    from opdvfs.runtime.actuators import NvmlReader, make_actuator

    fake_nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = itertools.count(1_000, 2_500)
    fake_nvml.nvmlDeviceGetTemperature.side_effect = itertools.count(60)
    with make_actuator("dry-run", log=tmp_path / "calls.jsonl") as act:
        assert isinstance(act, DryRunActuator) and isinstance(act.meter, NvmlReader)
        assert list(act.supported_freqs_mhz()) == sorted(NVML_CLOCKS_MHZ)  # the GPU's clocks
        assert act.read_power_w() == pytest.approx(312.5)
        assert act.read_energy_j() == pytest.approx(1.0)  # mJ -> J, the GPU's counter
        assert act.read_energy_j() == pytest.approx(3.5)
        assert (act.read_temperature_c(), act.read_temperature_c()) == (60.0, 61.0)
        with ClockGuard(act):
            act.set_freq_mhz(1005.0)
            act.set_freq_mhz(210.0)
    assert _writes(fake_nvml) == []  # recorded, never set
    calls = read_log(tmp_path / "calls.jsonl")
    assert [c["kind"] for c in calls] == ["run", "set", "set", "restore"]
    assert calls[0]["meter"] == "nvml"
    # the meter closes with the actuator (finding the process's GPU opened NVML once more)
    assert fake_nvml.nvmlShutdown.call_count == fake_nvml.nvmlInit.call_count == 2
    with NvmlActuator() as gpu:
        gpu.set_freq_mhz(1005.0)  # the check sees a real write
    assert _writes(fake_nvml) == ["nvmlDeviceSetGpuLockedClocks"]


def test_a_dry_run_with_a_preset_keeps_its_clocks_and_measures_nothing(fake_nvml):
    from opdvfs.runtime.actuators import make_actuator
    from opdvfs.sim.presets import preset_spec

    act = make_actuator("dry-run", device="a100-like")
    assert act.meter is None and act.read_energy_j() is None and act.read_power_w() == 0.0
    assert tuple(act.supported_freqs_mhz()) == tuple(preset_spec("a100-like").freqs_mhz)
    fake_nvml.nvmlInit.assert_not_called()


def test_a_dry_run_without_a_gpu_still_asks_for_its_clocks(fake_nvml):
    from opdvfs.exceptions import ValidationError
    from opdvfs.runtime.actuators import make_actuator

    fake_nvml.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(ValidationError, match="a dry run needs the clocks"):
        make_actuator("dry-run")


def test_guard_restores_on_exception():
    act = DryRunActuator([1000.0, 1800.0])

    def crashing_training() -> None:
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            raise RuntimeError("training crashed")

    with pytest.raises(RuntimeError, match="training crashed"):
        crashing_training()
    assert [c["kind"] for c in act.calls] == ["set", "restore"]


def test_guard_restores_once_and_puts_handlers_back():
    act = DryRunActuator([1000.0, 1800.0])
    before = signal.getsignal(signal.SIGTERM)
    with ClockGuard(act) as guard:
        act.set_freq_mhz(1800.0)
        guard.restore()
    assert [c["kind"] for c in act.calls] == ["set", "restore"]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_guard_restores_when_the_process_is_signalled(tmp_path, sig):
    log = tmp_path / "calls.jsonl"
    script = textwrap.dedent(f"""
        import os, signal, time
        from opdvfs.runtime.actuators import ClockGuard, DryRunActuator
        act = DryRunActuator([1000.0, 1800.0], log={str(log)!r})
        with ClockGuard(act):
            act.set_freq_mhz(1000.0)
            os.kill(os.getpid(), {int(sig)})
            time.sleep(5)
            act.set_freq_mhz(1800.0)  # never reached
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode != 0
    calls = read_log(log)
    assert [c["kind"] for c in calls] == ["run", "set", "restore"]
    assert calls[1]["freq_mhz"] == 1000.0


def _wait_for_samples(sampler, n: int, limit_s: float = 60.0) -> None:
    """Let the sampler's thread take ``n`` samples, however long a busy machine makes that.

    (A fixed 30 ms sleep gave a 1 ms sampler fewer than 3 samples when the thread was not
    scheduled; a sampler that stops sampling still fails, at the limit.)
    """
    import time

    give_up = time.monotonic() + limit_s
    while len(sampler.samples) < n and time.monotonic() < give_up:
        time.sleep(0.005)


def test_nvml_sampler_reads_units_on_the_unix_clock(fake_nvml):
    import time

    from opdvfs.runtime.sampler import NvmlSampler

    fake_nvml.nvmlDeviceGetPowerUsage.return_value = 250_500  # mW
    fake_nvml.nvmlDeviceGetTotalEnergyConsumption.return_value = 1_234_000  # mJ
    before = time.time()
    with NvmlSampler(index=1, interval_ms=1.0) as sampler:
        assert sampler.read_freq_mhz() == 1410.0
        _wait_for_samples(sampler, 3)
    smp = sampler.samples
    assert len(smp) >= 3
    fake_nvml.nvmlInit.assert_called_once_with()
    fake_nvml.nvmlDeviceGetHandleByIndex.assert_called_once_with(1)
    fake_nvml.nvmlShutdown.assert_called_once_with()
    assert smp["power_w"].iloc[0] == 250.5 and smp["energy_j"].iloc[0] == 1234.0
    assert smp["freq_mhz"].iloc[0] == 1410.0 and smp["temp_c"].iloc[0] == 61.0
    assert before <= smp["t_s"].iloc[0] <= time.time()
    # it only reads: no setter of the real module is ever called
    fake_nvml.nvmlDeviceSetGpuLockedClocks.assert_not_called()
    fake_nvml.nvmlDeviceResetGpuLockedClocks.assert_not_called()


def test_nvml_sampler_skips_a_failed_read(fake_nvml):
    import itertools

    from opdvfs.runtime.sampler import NvmlSampler

    reads = itertools.count()

    def power_mw(handle):
        if next(reads) == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return 200_000

    fake_nvml.nvmlDeviceGetPowerUsage.side_effect = power_mw
    with NvmlSampler(interval_ms=1.0) as sampler:
        _wait_for_samples(sampler, 2)
    smp = sampler.samples
    assert len(smp) >= 2 and (smp["power_w"] == 200.0).all()  # the first read left no row


def test_nvml_sampler_errors_are_translated(fake_nvml):
    from opdvfs.runtime.sampler import NvmlSampler

    fake_nvml.nvmlDeviceGetHandleByIndex.side_effect = pynvml.NVMLError(
        pynvml.NVML_ERROR_INVALID_ARGUMENT
    )
    with pytest.raises(DeviceNotFoundError, match="no such GPU"):
        NvmlSampler(index=7)


def test_nvml_sampler_without_a_gpu_is_one_clear_error():
    from opdvfs.runtime.sampler import NvmlSampler

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    with pytest.raises(DeviceNotFoundError, match="no NVIDIA driver"):
        NvmlSampler()


def test_sampled_power_is_the_energy_counters_mean_over_each_interval():
    pytest.importorskip("torch")
    import pandas as pd

    from opdvfs.io.samples import counter_windows

    smp = pd.DataFrame(
        {
            "t_s": [10.0, 10.1, 10.3, 10.4],
            "power_w": [300.0, 300.0, 300.0, 300.0],  # NVML's 1 s average: flat
            "temp_c": 60.0,
            "freq_mhz": 1980.0,
            "energy_j": [1000.0, 1020.0, 1080.0, 1100.0],
        }
    )
    got = counter_windows(smp)
    assert got["t_s"].tolist() == [10.1, 10.3, 10.4]
    assert got["power_w"].tolist() == pytest.approx([200.0, 300.0, 200.0])
    broken = smp.assign(energy_j=[1000.0, 990.0, 1080.0, 1100.0])  # a counter reset
    assert counter_windows(broken).equals(broken)


def test_twin_replays_with_the_devices_real_switch_latency():
    """A plan made as if switches were instant (--switch-latency-ms 0) on a 15 ms device: the
    twin replays the issued switches with the device's 15 ms, so it shows the slowdown they
    cause, the same as `simulate` measures, not +0.00%."""
    from opdvfs.runtime.actuators import TwinActuator
    from opdvfs.schedule import Schedule
    from opdvfs.sim import SimulatedDevice
    from opdvfs.workloads.library import load_workload

    device = SimulatedDevice.from_preset("a100-like")
    work = load_workload("bert")
    n = len(work)
    starts = list(range(0, n, n // 8))[:8]
    plan = Schedule.from_stage_freqs(
        starts,
        [1410.0 if k % 2 == 0 else 810.0 for k in range(8)],
        n_ops=n,
        target=0.02,
        solver="manual",
        switch_latency_ms=0.0,
    )
    assert device.spec.switch_latency_ms == 15.0
    top, _ = device.run(work, iterations=2)
    simulated, _ = device.run(work, plan, iterations=2)
    act = TwinActuator(SimulatedDevice.from_preset("a100-like"))
    for iteration in range(3):  # as the executor issues them, op by op
        for sw in plan.switches:
            act.at(iteration, sw.trigger_op)
            act.set_freq_mhz(sw.freq_mhz)
    issued, twin_top = act.replay(work)
    slowdown = issued.iteration_time_s / twin_top.iteration_time_s - 1
    assert slowdown > 0.05  # the late switches leave matmul stages at 810 MHz
    assert slowdown == pytest.approx(simulated.iteration_time_s / top.iteration_time_s - 1)
