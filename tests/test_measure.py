"""``opdvfs.measure`` and ``Monitor``: a block's time and energy on each kind of device."""

import itertools

import pytest

import opdvfs
from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators import DryRunActuator


class CountingMeter:
    """A read-only meter whose energy counter moves 2.5 J per read (as NVML's, only faster)."""

    def __init__(self) -> None:
        self.energy = itertools.count(100.0, 2.5)
        self.closed = False

    def read_power_w(self) -> float:
        return 250.0

    def read_energy_j(self) -> float:
        return next(self.energy)

    def read_temperature_c(self) -> float:
        return 50.0

    def name(self) -> str:
        return "NVIDIA Fake"

    def close(self) -> None:
        self.closed = True


def test_a_meter_measures_the_counter_difference_and_the_callers_actuator_stays_open():
    meter = CountingMeter()
    act = DryRunActuator([1000.0, 1410.0], meter=meter)
    with opdvfs.measure(act, name="step") as m:
        pass
    w = m.window
    assert w is not None and w.name == "step" and w.device == "dry-run" and not w.virtual
    assert w.energy_j == pytest.approx(2.5)  # one read at each end
    assert w.time_s > 0 and w.power_w == pytest.approx(2.5 / w.time_s)
    assert not meter.closed and act.calls == []  # read, never set; the caller's to close


def test_a_dry_run_without_a_meter_measures_time_and_no_energy():
    with opdvfs.measure("dry-run", device="a100-like") as m:
        sum(range(1000))
    assert m.window is not None and m.window.energy_j is None and m.window.power_w is None


def test_windows_nest_and_overlap_and_names_are_checked():
    mon = opdvfs.Monitor(DryRunActuator([1410.0], meter=CountingMeter()))
    mon.begin_window("epoch")
    mon.begin_window("step")
    with pytest.raises(ValidationError, match="already open"):
        mon.begin_window("step")
    step = mon.end_window("step")
    epoch = mon.end_window("epoch")
    # reads: epoch 100, step 102.5, step end 105, epoch end 107.5
    assert step.energy_j == pytest.approx(2.5) and epoch.energy_j == pytest.approx(7.5)
    with pytest.raises(ValidationError, match="not open"):
        mon.end_window("step")


def test_a_simulated_gpu_measures_the_blocks_operators_on_its_own_clock():
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64)
    mon = opdvfs.Monitor("sim:a100-like", work_scale=1e3)
    gpu = mon.actuator.timeline
    assert gpu is not None
    layer(x).sum().backward()  # the first pass differs (gradients allocated)
    with opdvfs.measure(mon.actuator, name="one") as one:
        layer(x).sum().backward()
    with opdvfs.measure(mon.actuator, name="three") as three:
        for _ in range(3):
            layer(x).sum().backward()
    mon.close()
    a, b = one.window, three.window
    assert a is not None and b is not None and a.virtual and b.virtual
    assert a.energy_j and a.energy_j > 0 and a.time_s > 0
    # three times the work: about three times the time and energy on the device's clock
    assert b.time_s == pytest.approx(3 * a.time_s, rel=0.2)
    assert b.energy_j == pytest.approx(3 * a.energy_j, rel=0.2)
    assert a.power_w is not None and 30 < a.power_w < 500  # an a100-like's range (W)
