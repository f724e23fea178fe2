"""Capture a tiny GPT's workload, plan it on the simulator, run it under the executor (CPU)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opdvfs import Schedule  # noqa: E402
from opdvfs.exceptions import CaptureError, ScheduleMismatchError  # noqa: E402
from opdvfs.runtime.actuators import Actuator, ClockGuard, DryRunActuator  # noqa: E402
from opdvfs.runtime.dispatch import ScheduleExecutor  # noqa: E402
from opdvfs.runtime.recorder import WorkloadRecorder  # noqa: E402
from opdvfs.sim import SimulatedDevice  # noqa: E402
from opdvfs.sim.presets import get_preset  # noqa: E402

from tiny_gpt import TinyGPT, train_step  # noqa: E402

A100 = get_preset("a100-like")


def train(steps: int, mode=None, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (steps, 2, 17))

    def loop() -> None:
        for i in range(steps):
            train_step(model, opt, data[i])

    if mode is None:
        loop()
    else:
        with mode:
            loop()


@pytest.fixture(scope="module")
def captured():
    recorder = WorkloadRecorder()
    train(3, recorder)
    return recorder.workload("tinygpt")


def test_capture_records_the_aten_sequence_with_work(captured):
    ops = captured.ops
    assert len(ops) > 300
    assert {"aten::mm", "aten::native_layer_norm"} & set(ops["name"])
    mm = ops[ops["name"].isin(["aten::mm", "aten::addmm", "aten::bmm"])]
    assert (mm["flops"] > 0).all()
    assert (ops["bytes_loaded"] >= 0).all() and ops["bytes_stored"].sum() > 0
    assert captured.meta["iterations_seen"] == 3


def test_executor_applies_the_planned_switches_every_iteration(tmp_path, captured):
    n = len(captured)
    # the captured workload runs on the simulator (profile -> plan would pick these stages)
    profile = SimulatedDevice.from_preset("a100-like").profile(captured, [1005.0, 1410.0])
    assert profile.n_ops == n
    plan = Schedule.from_stage_freqs(
        [0, n // 3, 2 * n // 3], [1410.0, 1005.0, 1410.0], n_ops=n, target=0.05, solver="manual"
    )
    log = tmp_path / "calls.jsonl"
    act = DryRunActuator(A100.spec.freqs_mhz, log=log)
    executor = ScheduleExecutor(plan, act, names=captured.ops["name"].tolist())
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back to the maximum clock"):
        train(4, executor)
    # the first iteration differs (AdamW creates its state): it falls back, the rest match
    assert executor.diverged_iterations == [0] and not executor.abandoned
    sets = [(c["iteration"], c["op_index"], c["freq_mhz"]) for c in act.calls if c["kind"] == "set"]
    steady = [s for s in sets if s[0] >= 1]
    expected = []
    for it in (1, 2, 3):
        expected += [(it, 0, 1410.0)] if it == 1 else []
        expected += [(it, n // 3, 1005.0), (it, 2 * n // 3, 1410.0)]
    assert [s for s in steady if s != (1, 0, 1410.0)] == [
        e for e in expected if e != (1, 0, 1410.0)
    ]
    assert act.calls[-1]["kind"] == "restore"
    assert log.read_text().count('"restore"') == 1


def test_wrong_model_falls_back_to_the_maximum_clock(captured):
    n = len(captured)
    names = captured.ops["name"].tolist()
    names[n // 2] = "aten::not_this_op"
    plan = Schedule.from_stage_freqs(
        [0, n // 4], [1005.0, 1005.0 + 0], n_ops=n, target=0.05, solver="manual"
    )
    act = DryRunActuator(A100.spec.freqs_mhz)
    executor = ScheduleExecutor(plan, act, names=names)
    with pytest.warns(UserWarning, match="falling back to the maximum clock"):
        train(4, executor)
    assert executor.abandoned  # every iteration diverges: given up after two
    assert act.current_mhz == max(A100.spec.freqs_mhz)
    assert np.isclose(act.calls[-1]["freq_mhz"], 1410.0)


def test_delayed_switches_are_issued_by_the_worker_after_their_delay(captured):
    import time

    n = len(captured)
    base = Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.05, solver="manual"
    )
    doc = base.model_dump()
    doc["switches"][1]["delay_us"] = 5_000.0  # 5 ms after the trigger op is dispatched
    plan = Schedule.model_validate(doc)
    act = DryRunActuator(A100.spec.freqs_mhz)
    executor = ScheduleExecutor(plan, act)
    assert executor.issuer is not None
    submitted: dict[tuple[int, int], float] = {}
    issued: dict[tuple[int, int], float] = {}
    real_submit, real_set = executor.issuer.submit, act.set_freq_mhz

    def submit(marker, delay_s, freq, iteration, op_index):
        submitted[(iteration, op_index)] = time.monotonic()
        real_submit(marker, delay_s, freq, iteration, op_index)

    def timed_set(freq: float) -> None:
        issued[act.where] = time.monotonic()  # where the worker says the switch belongs
        real_set(freq)

    executor.issuer.submit = submit  # type: ignore[method-assign]
    act.set_freq_mhz = timed_set  # type: ignore[method-assign]
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back"):
        train(4, executor)
    # logged at the trigger op, issued by the worker no sooner than the delay after dispatch
    for it in (1, 2):
        assert issued[(it, n // 2)] - submitted[(it, n // 2)] >= 0.005
        assert issued[(it, 0)] >= submitted[(it, 0)]
    sets = [(c["iteration"], c["op_index"]) for c in act.calls if c["kind"] == "set"]
    assert sets == sorted(sets)  # in order
    assert act.calls[-1]["kind"] == "restore"


def test_pending_switches_are_dropped_before_the_clock_is_restored(captured):
    n = len(captured)
    base = Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.05, solver="manual"
    )
    doc = base.model_dump()
    doc["switches"][1]["delay_us"] = 30e6  # 30 s: still pending when the program ends
    plan = Schedule.model_validate(doc)
    act = DryRunActuator(A100.spec.freqs_mhz)
    executor = ScheduleExecutor(plan, act)
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back"):
        train(3, executor)
    assert executor.issuer is not None and not executor.issuer.is_alive()
    assert all(c["freq_mhz"] != 1005.0 for c in act.calls)  # never issued
    assert act.calls[-1]["kind"] == "restore"


def test_previous_iteration_switches_fire_at_the_end_of_the_iteration_before(captured):
    n = len(captured)
    plan = Schedule.from_stage_freqs(
        [0, n // 2], [1005.0, 1410.0], n_ops=n, lead_ops=[5, 0], target=0.05, solver="manual"
    )
    assert plan.switches[0].previous_iteration and plan.switches[0].trigger_op == n - 5
    act = DryRunActuator(A100.spec.freqs_mhz)
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back"):
        train(4, ScheduleExecutor(plan, act))
    sets = [(c["iteration"], c["op_index"], c["freq_mhz"]) for c in act.calls if c["kind"] == "set"]
    assert sets[0] == (0, 0, 1005.0)  # no iteration before the first: issued at its op 0
    # iteration 0 diverges (AdamW's state); from iteration 1 on, stage 0 of the next iteration
    # is switched 5 ops before this one ends
    for it in (1, 2):
        assert (it, n - 5, 1005.0) in sets
    assert (2, n // 2, 1410.0) in sets


def test_executor_measures_each_iteration_with_the_energy_counter(captured):
    class Counting(DryRunActuator):
        """A dry run whose device 'uses' 2 J per counter read: a stand-in for NVML's counter."""

        joules = 0.0

        def read_energy_j(self) -> float:
            self.joules += 2.0
            return self.joules

    n = len(captured)
    plan = Schedule.from_stage_freqs([0], [1410.0], n_ops=n, target=0.0, solver="manual")
    act = Counting(A100.spec.freqs_mhz)
    executor = ScheduleExecutor(plan, act)
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back"):
        train(5, executor)
    steady = executor.per_iteration()
    assert steady["iterations"] == 3  # ends of iterations 1..4: three iterations between
    assert steady["energy_j"] == pytest.approx(2.0)
    assert steady["time_s"] > 0


def test_a_recorder_without_a_complete_iteration_is_a_capture_error():
    recorder = WorkloadRecorder()
    with recorder:
        torch.ones(3) + 1  # operators, but no optimizer step
    with pytest.raises(CaptureError, match="no complete iteration recorded"):
        recorder.workload()


def test_names_that_do_not_fit_the_schedule_are_a_mismatch(captured):
    n = len(captured)
    plan = Schedule.from_stage_freqs([0], [1410.0], n_ops=n, target=0.0, solver="manual")
    act = DryRunActuator(A100.spec.freqs_mhz)
    with pytest.raises(ScheduleMismatchError, match=f"schedule plans {n} ops, names give {n - 1}"):
        ScheduleExecutor(plan, act, names=captured.ops["name"].tolist()[:-1])


def test_an_actuator_with_only_the_abstract_methods_runs_a_schedule(captured):
    """The interface's defaults (``at``, no energy counter) are all the executor needs."""

    class Minimal(Actuator):
        def __init__(self) -> None:
            self.clock_mhz: float | None = None
            self.history: list[float | None] = []

        def supported_freqs_mhz(self):
            return A100.spec.freqs_mhz

        def set_freq_mhz(self, freq_mhz: float) -> None:
            self.clock_mhz = self.check_freq_mhz(freq_mhz)
            self.history.append(self.clock_mhz)

        def reset(self) -> None:
            self.clock_mhz = None
            self.history.append(None)

        def read_power_w(self) -> float:
            return 100.0

    n = len(captured)
    plan = Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.05, solver="manual"
    )
    act = Minimal()
    executor = ScheduleExecutor(plan, act, names=captured.ops["name"].tolist())
    with ClockGuard(act), pytest.warns(UserWarning, match="falling back"):
        train(3, executor)
    assert act.clock_mhz is None and act.history[-1] is None  # restored
    assert 1005.0 in act.history  # the planned switch of a steady iteration
    assert executor.iteration_energy_j == []  # no counter: nothing read
    assert executor.per_iteration()["energy_j"] is None
