"""One contract, every actuator: the checks the executor relies on, run over each implementation.

In the manner of scikit-learn's ``test_common.py``: a list of checks crossed with a list of
actuators, so a new actuator is covered by adding one line to :data:`CASES`. NVML runs against
the autospecced fake of ``conftest.fake_nvml``, zeusd against that and ``conftest.FakeZeusd``;
Ascend without DCMI (nothing here reads it). The checks cover the methods every caller uses and
the capabilities an actuator declares (:attr:`~Actuator.kind`, :attr:`~Actuator.current_mhz`,
:attr:`~Actuator.meter`, :attr:`~Actuator.timeline`, :attr:`~Actuator.preset`,
:attr:`~Actuator.twin`), so no caller needs to probe for a type.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest

from opdvfs.exceptions import NotSupportedError, UnsupportedClockError, ValidationError
from opdvfs.runtime.actuators import (
    Actuator,
    AscendActuator,
    DryRunActuator,
    NvmlActuator,
    SimGpuActuator,
    TwinActuator,
    ZeusdActuator,
    make_actuator,
)
from opdvfs.schedule import Schedule
from opdvfs.sim import PRESETS, SimulatedDevice, SimulatedGpu, preset_spec
from opdvfs.workloads.library import load_workload


@dataclass
class Case:
    """An actuator under test and how to see what reached its device."""

    actuator: Actuator
    #: How many clock changes reached the device (NVML's setter; a recorder's "set" records).
    sets: Callable[[], int]
    #: Whether the device has an energy counter (``read_energy_j`` returns a number).
    has_energy_counter: bool = False
    #: Whether it reads the device through a :class:`~opdvfs.runtime.actuators.base.Meter`.
    has_meter: bool = False
    #: The preset it simulates (its :attr:`~Actuator.preset`), if any.
    preset: str | None = None
    #: Whether the program runs on its simulated GPU's clock (:attr:`~Actuator.timeline`).
    has_timeline: bool = False
    #: Whether it replays its switches on a simulated device (:attr:`~Actuator.twin`).
    has_twin: bool = False


def _recorded(act: DryRunActuator, **declared: Any) -> Case:
    return Case(act, lambda: sum(c["kind"] == "set" for c in act.calls), **declared)


def _nvml(request: pytest.FixtureRequest) -> Case:
    fake = request.getfixturevalue("fake_nvml")
    return Case(
        NvmlActuator(),
        lambda: fake.nvmlDeviceSetGpuLockedClocks.call_count,
        has_energy_counter=True,
        has_meter=True,
    )


def _zeusd(request: pytest.FixtureRequest) -> Case:
    request.getfixturevalue("fake_nvml")  # its reads go through NVML, its writes to the daemon
    daemon = request.getfixturevalue("zeusd")
    return Case(
        ZeusdActuator(),
        lambda: sum(r[1] == "/gpu/set_gpu_locked_clocks" for r in daemon.requests),
        has_energy_counter=True,
        has_meter=True,
    )


def _sim(_: pytest.FixtureRequest) -> Case:
    act = make_actuator("sim:a100-like")
    assert isinstance(act, SimGpuActuator)
    return _recorded(act, has_energy_counter=True, preset="a100-like", has_timeline=True)


#: Actuator kind (:attr:`Actuator.kind`) -> how to build it (with the test's fixtures at hand).
CASES: dict[str, Callable[[pytest.FixtureRequest], Case]] = {
    "dry-run": lambda _: _recorded(DryRunActuator([1800.0, 1000.0, 1400.0])),
    "ascend": lambda _: _recorded(AscendActuator([1000.0, 1400.0, 1800.0])),
    "twin": lambda _: _recorded(
        TwinActuator(SimulatedDevice.from_preset("a100-like")), preset="a100-like", has_twin=True
    ),
    "nvml": _nvml,
    "zeusd": _zeusd,
    "sim:a100-like": _sim,
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest):
    built = CASES[request.param](request)
    assert built.actuator.kind == request.param  # the name make_actuator builds it by
    with warnings.catch_warnings():
        # Ascend warns once that nothing is applied: not what these checks are about
        warnings.filterwarnings("ignore", "opdvfs: Ascend has no public", UserWarning)
        yield built
    built.actuator.close()


def check_supported_clocks_are_ascending(case: Case) -> None:
    freqs = list(case.actuator.supported_freqs_mhz())
    assert freqs and freqs == sorted(set(freqs))
    assert all(isinstance(f, float) for f in freqs)


def check_an_unsupported_clock_raises_and_reaches_nothing(case: Case) -> None:
    freqs = case.actuator.supported_freqs_mhz()
    for bad in (min(freqs) - 1.0, max(freqs) + 1.0, (freqs[0] + freqs[1]) / 2):
        with pytest.raises(UnsupportedClockError, match="not a supported clock"):
            case.actuator.set_freq_mhz(bad)
    with pytest.raises(ValueError, match="not a supported clock"):  # a ValueError, too
        case.actuator.set_freq_mhz(-1.0)
    assert case.sets() == 0


def check_an_unchanged_clock_reaches_the_device_once(case: Case) -> None:
    low, high = case.actuator.supported_freqs_mhz()[0], case.actuator.supported_freqs_mhz()[-1]
    case.actuator.set_freq_mhz(low)
    case.actuator.set_freq_mhz(low)
    assert case.sets() == 1
    case.actuator.set_freq_mhz(high)
    case.actuator.set_freq_mhz(high)
    assert case.sets() == 2


def check_reset_is_idempotent_and_forgets_the_clock(case: Case) -> None:
    low = case.actuator.supported_freqs_mhz()[0]
    case.actuator.set_freq_mhz(low)
    case.actuator.reset()
    case.actuator.reset()
    # after a reset the driver manages the clock: setting it again must reach the device
    case.actuator.set_freq_mhz(low)
    assert case.sets() == 2


def check_at_and_the_energy_counter(case: Case) -> None:
    assert case.actuator.at(3, 17) is None
    case.actuator.set_freq_mhz(case.actuator.supported_freqs_mhz()[-1])
    energy_j = case.actuator.read_energy_j()
    if case.has_energy_counter:
        assert isinstance(energy_j, float) and energy_j >= 0
    else:
        assert energy_j is None


def check_close_and_the_context_manager(case: Case) -> None:
    act = case.actuator
    with mock.patch.object(act, "close", wraps=act.close) as close:
        with act as entered:
            assert entered is act
        close.assert_called_once_with()
        with pytest.raises(RuntimeError, match="boom"), act:
            raise RuntimeError("boom")  # the block's error propagates; the actuator is closed
        assert close.call_count == 2
    act.close()  # once more: closing is idempotent


def check_current_mhz_follows_set_and_reset(case: Case) -> None:
    act = case.actuator
    assert act.current_mhz is None  # nothing locked yet: the driver's clock
    low, high = act.supported_freqs_mhz()[0], act.supported_freqs_mhz()[-1]
    act.set_freq_mhz(low)
    assert act.current_mhz == low and isinstance(act.current_mhz, float)
    act.set_freq_mhz(high)
    assert act.current_mhz == high
    with pytest.raises(UnsupportedClockError):
        act.set_freq_mhz(low - 1.0)
    assert act.current_mhz == high  # a refused clock changes nothing
    act.reset()
    assert act.current_mhz is None


def check_the_meter_reads_or_is_none(case: Case) -> None:
    meter = case.actuator.meter
    assert (meter is not None) == case.has_meter
    if meter is not None:
        assert isinstance(meter.read_power_w(), float)
        assert isinstance(meter.read_energy_j(), float)
        assert isinstance(meter.read_temperature_c(), float)
        assert isinstance(meter.name(), str) and meter.name()


def check_the_timeline_is_a_simulated_gpus_only(case: Case) -> None:
    act = case.actuator
    timeline = act.timeline
    assert (timeline is not None) == case.has_timeline
    if timeline is not None:
        assert isinstance(timeline, SimulatedGpu)
        assert tuple(timeline.supported_freqs_mhz()) == tuple(act.supported_freqs_mhz())
        before_s = timeline.now_s()
        assert isinstance(before_s, float)
        act.set_freq_mhz(act.supported_freqs_mhz()[0])
        assert timeline.now_s() == before_s  # a clock request alone does not advance its time


def check_the_preset_and_the_twin(case: Case) -> None:
    act = case.actuator
    assert act.preset == case.preset
    assert act.preset is None or act.preset in PRESETS
    twin = act.twin
    assert (twin is not None) == case.has_twin
    if twin is None:
        with pytest.raises(NotSupportedError, match="no twin"):
            act.replay(load_workload("gpt3"))
        return
    assert isinstance(twin, SimulatedDevice) and twin.spec.name == act.preset
    assert tuple(act.supported_freqs_mhz()) == tuple(twin.spec.freqs_mhz)
    work = load_workload("gpt3")
    act.at(0, 0)
    act.set_freq_mhz(act.supported_freqs_mhz()[0])
    issued, top = act.replay(work, iterations=1)
    assert issued.iteration_time_s > top.iteration_time_s  # the lowest clock is slower


def check_mark_iteration_and_cancel_pending(case: Case) -> None:
    act = case.actuator
    low = act.supported_freqs_mhz()[0]
    act.set_freq_mhz(low)
    assert act.mark_iteration() is None
    assert act.cancel_pending() is None
    assert act.current_mhz == low  # nothing waited: the clock set is the clock


CHECKS = [
    check_supported_clocks_are_ascending,
    check_an_unsupported_clock_raises_and_reaches_nothing,
    check_an_unchanged_clock_reaches_the_device_once,
    check_reset_is_idempotent_and_forgets_the_clock,
    check_at_and_the_energy_counter,
    check_close_and_the_context_manager,
    check_current_mhz_follows_set_and_reset,
    check_the_meter_reads_or_is_none,
    check_the_timeline_is_a_simulated_gpus_only,
    check_the_preset_and_the_twin,
    check_mark_iteration_and_cancel_pending,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_actuator_contract(case: Case, check: Callable[[Case], None]) -> None:
    check(case)


def test_recorders_store_where_each_call_happens():
    """``at`` is a no-op by default; the recorders write it into the next call's record."""
    act = DryRunActuator([1000.0, 1800.0])
    act.at(2, 40)
    assert act.where == (2, 40)
    act.set_freq_mhz(1000.0)
    assert (act.calls[-1]["iteration"], act.calls[-1]["op_index"]) == (2, 40)


@pytest.mark.parametrize(
    ("kind", "device", "expected"),
    [
        ("dry-run", "a100-like", DryRunActuator),
        ("ascend", None, AscendActuator),
        ("twin", "ascend-910b-like", TwinActuator),
    ],
)
def test_make_actuator_builds_each_kind_with_the_presets_clocks(kind, device, expected, tmp_path):
    with make_actuator(kind, device=device, log=tmp_path / "calls.jsonl") as act:
        assert type(act) is expected
        spec = preset_spec(device or "ascend-910b-like")
        assert spec is not None and tuple(act.supported_freqs_mhz()) == spec.freqs_mhz


def test_make_actuator_takes_the_device_and_clocks_from_the_schedule():
    plan = Schedule.from_stage_freqs(
        [0, 4], [1410.0, 1005.0], n_ops=8, target=0.0, solver="manual", device="a100-like"
    )
    act = make_actuator("dry-run", schedule=plan)
    assert act.supported_freqs_mhz() == preset_spec("a100-like").freqs_mhz
    # a device opdvfs has no preset for: a dry run accepts the clocks the schedule uses
    unknown = plan.model_copy(update={"device": "some-real-gpu"})
    assert make_actuator("dry-run", schedule=unknown).supported_freqs_mhz() == (1005.0, 1410.0)


@pytest.mark.parametrize("optimizer_steps", [True, False])
def test_make_actuator_tells_a_simulated_gpu_where_iterations_end(optimizer_steps):
    act = make_actuator("sim:a100-like", optimizer_steps=optimizer_steps)
    assert isinstance(act, SimGpuActuator) and act.optimizer_steps is optimizer_steps
    # the other kinds count no iterations: the option changes nothing for them
    assert make_actuator("dry-run", device="a100-like", optimizer_steps=False).kind == "dry-run"


def test_make_actuator_nvml_opens_the_gpu(fake_nvml):
    with make_actuator("nvml") as act:
        assert isinstance(act, NvmlActuator)
    # the node's one GPU, listed by index and opened by its UUID (the process's CUDA device 0)
    fake_nvml.nvmlDeviceGetHandleByIndex.assert_called_once_with(0)
    fake_nvml.nvmlDeviceGetHandleByUUID.assert_called_once_with(
        fake_nvml.nvmlDeviceGetUUID.return_value
    )


@pytest.mark.parametrize(
    ("kind", "kwargs", "needle"),
    [
        ("bogus", {}, "expected nvml, zeusd, ascend, dry-run or twin"),
        ("twin", {}, "twin actuator simulates a preset"),
        ("twin", {"device": "some-real-gpu"}, "twin actuator simulates a preset"),
        ("dry-run", {}, "a dry run needs the clocks"),
    ],
)
def test_make_actuator_says_what_is_missing(kind, kwargs, needle, monkeypatch):
    # no GPU for NVML to find (on a machine with one, a dry run would measure it instead)
    monkeypatch.setattr("opdvfs.runtime.actuators._nvml_meter", lambda gpu=None: None)
    with pytest.raises(ValidationError, match=needle):
        make_actuator(kind, **kwargs)


def test_importing_the_runtime_does_not_import_torch():
    """torch is an optional extra: ``import opdvfs.runtime`` and its actuators do not load it."""
    code = (
        "import sys\n"
        "import opdvfs.runtime as rt\n"
        "rt.make_actuator('dry-run', device='a100-like')\n"
        "rt.ClockGuard, rt.DryRunActuator, rt.NvmlActuator, rt.TwinActuator\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert set(rt.__all__) <= set(dir(rt))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
