"""The time-anchored executor (`--trigger time`, issue 19): switches at their planned offsets from
each iteration's anchor, drift rescaling, fallback and recovery by iteration length, a compiled
model that stays compiled, `--trigger auto`, and clocks restored on exit, exception, SIGINT and
SIGTERM in both trigger modes (needs torch)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("torch")

import torch
from typer.testing import CliRunner

from opdvfs import Schedule
from opdvfs.cli import app
from opdvfs.runtime.actuators import DryRunActuator
from opdvfs.runtime.dispatch import ScheduleExecutor
from opdvfs.runtime.timed import (
    GUARD_S,
    TimedExecutor,
    choose_trigger,
    issued_by_time,
    measured_timing,
    plan_timing,
)

from conftest import ManualClock, read_log

FREQS = [1000.0, 1400.0, 1800.0]
#: How far a switch may be off its planned offset on the manual clock (s): float rounding only.
EXACT_S = 1e-9


def timed_plan(
    length_s: float,
    starts_s=(0.0, 0.4, 0.7),
    freqs=(1000.0, 1400.0, 1800.0),
    latency_ms: float = 5.0,
    n_ops: int = 30,
) -> Schedule:
    """A 3-stage plan whose stages start at ``starts_s`` (fractions of ``length_s``)."""
    k = len(freqs)
    plan = Schedule.from_stage_freqs(
        [i * n_ops // k for i in range(k)],
        list(freqs),
        n_ops=n_ops,
        target=0.1,
        solver="manual",
        switch_latency_ms=latency_ms,
        predicted_time_s=length_s,
    )
    stages = tuple(
        st.model_copy(update={"start_s": f * length_s})
        for st, f in zip(plan.stages, starts_s, strict=True)
    )
    return plan.model_copy(update={"stages": stages})


class StampedDryRun(DryRunActuator):
    """A dry run that stamps each recorded set with the manual clock's time (``clock_s``)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(FREQS)
        self.clock = clock

    def set_freq_mhz(self, freq_mhz: float) -> None:
        n = len(self.calls)
        super().set_freq_mhz(freq_mhz)
        if len(self.calls) > n:  # recorded (the clock changed)
            self.calls[-1]["clock_s"] = self.clock.now()


def on_manual_clock(plan, actuator=None, **kwargs):
    """A :class:`TimedExecutor` on a :class:`ManualClock`: (executor, its actuator, the clock).

    The actuator defaults to a :class:`StampedDryRun` on that clock.
    """
    clock = ManualClock()
    act = StampedDryRun(clock) if actuator is None else actuator
    ex = TimedExecutor(plan, act, optimizer_steps=False, clock=clock, **kwargs)
    clock.settled = lambda: ex.issuer is None or ex.issuer.idle()
    return ex, act, clock


def run_loop(executor, lengths_s, work=None):
    """Iterations of the given lengths (s), each ended by hand; returns the anchors.

    On a :class:`ManualClock` the iterations last exactly that long on it; on the system clock
    the loop sleeps out what ``work`` left of each.
    """
    clock = executor.clock
    with executor:
        for length in lengths_s:
            t0 = time.perf_counter()
            if work is not None:
                work()
            if isinstance(clock, ManualClock):
                clock.sleep(length)
            else:
                time.sleep(max(length - (time.perf_counter() - t0), 0.0))
            executor.mark_iteration()
    return executor.iteration_ends_s


def set_calls(act):
    return [c for c in act.calls if c["kind"] == "set"]


def test_switches_land_at_their_planned_offsets_from_each_anchor():
    length = 0.2
    plan = timed_plan(length)
    ex, act, _ = on_manual_clock(plan)
    anchors = run_loop(ex, [length] * 4)
    sets = set_calls(act)
    lead = 0.005 + GUARD_S  # the latency and the guard
    planned = {1400.0: 0.4 * length - lead, 1800.0: 0.7 * length - lead}
    checked = 0
    for c in sets:
        if c["iteration"] in (1, 2, 3) and c["freq_mhz"] in planned:
            got = c["clock_s"] - anchors[c["iteration"] - 1]
            assert got == pytest.approx(planned[c["freq_mhz"]], abs=EXACT_S), c
            assert c["op_index"] is None  # issued by time, not at an operator
            assert c["offset_s"] == pytest.approx(planned[c["freq_mhz"]], abs=EXACT_S)
            checked += 1
    assert checked == 6
    # stage 0 (1000 MHz) is due 6 ms before each anchor: issued in the iteration before, at
    # the plan's length less the lead after its anchor
    wrapped = [c for c in sets if c["freq_mhz"] == 1000.0 and c["iteration"] >= 1]
    # (iteration 1's is also set at once at the first anchor: nothing issued it before)
    assert [c["iteration"] for c in wrapped] == [1, 1, 2, 3]
    assert wrapped[0]["offset_s"] == pytest.approx(-lead)
    for c in wrapped[1:]:
        assert c["offset_s"] == pytest.approx(length - lead, abs=EXACT_S)
        assert c["clock_s"] - anchors[c["iteration"] - 1] == pytest.approx(length - lead)
    assert ex.scales == pytest.approx([1.0] * 4)
    assert ex.applied_iterations == 3 and not ex.diverged


def test_on_the_system_clock_no_switch_goes_out_early():
    """The real clock and thread: every switch goes out at its offset or later, never before.

    How much later depends on what else the machine runs (0.1-0.5 ms idle, 14 ms once beside
    two CPU-bound jobs), so only the early side is asserted; the tolerance is wide so that an
    oversleeping loop does not fall back.
    """
    length = 0.2
    plan = timed_plan(length)
    act = DryRunActuator(FREQS)
    ex = TimedExecutor(plan, act, tolerance=0.9, optimizer_steps=False)
    # perf_counter read after time(): the shift errs small, which makes a switch look later
    shift = time.time() - time.perf_counter()
    anchors = run_loop(ex, [length] * 4)
    lead = 0.005 + GUARD_S
    planned = {1400.0: 0.4 * length - lead, 1800.0: 0.7 * length - lead}
    timed = [c for c in set_calls(act) if c["offset_s"] is not None]
    assert {c["freq_mhz"] for c in timed} == set(FREQS)
    for c in timed:
        offset = c["offset_s"]
        if c["freq_mhz"] in planned:
            assert offset >= planned[c["freq_mhz"]]  # the lateness is added, never taken
            scale = ex.scales[c["iteration"] - 1]
            want = scale * (planned[c["freq_mhz"]] + lead) - lead
            assert c["t_s"] - shift - anchors[c["iteration"] - 1] >= want - 1e-4, c


def test_drift_rescales_the_offsets():
    length = 0.2
    plan = timed_plan(length)
    ex, act, _ = on_manual_clock(plan)
    anchors = run_loop(ex, [length, 1.1 * length, 1.1 * length])
    assert ex.scales == pytest.approx([1.0, 1.1, 1.1])  # each by the iteration before
    # the stages move with the iteration's length; the switches' lead does not
    lead = 0.005 + GUARD_S
    last = [c for c in set_calls(act) if c["iteration"] == 2 and c["freq_mhz"] != 1000.0]
    assert [c["clock_s"] - anchors[1] for c in last] == pytest.approx(
        [1.1 * 0.4 * length - lead, 1.1 * 0.7 * length - lead]
    )
    assert not ex.diverged


def test_a_drifting_iteration_falls_back_with_one_warning_and_recovers():
    length = 0.15
    plan = timed_plan(length)
    ex, act, _ = on_manual_clock(plan, tolerance=0.2)
    with pytest.warns(UserWarning, match="falling back to the maximum clock") as caught:
        run_loop(ex, [length, length, 0.5 * length, length, length, length])
    assert len([w for w in caught if "opdvfs" in str(w.message)]) == 1
    assert ex.diverged_iterations == [2]
    sets = set_calls(act)
    # the short iteration 2 ends at the top clock; iteration 3 runs there (and is measured);
    # the schedule applies again from iteration 4 on
    assert [c["freq_mhz"] for c in sets if c["iteration"] == 2][-1] == 1800.0
    assert not [c for c in sets if c["iteration"] == 3]
    assert {c["freq_mhz"] for c in sets if c["iteration"] == 5} >= {1400.0}
    assert ex.applied_iterations == 3  # iterations 1, 4 and 5


def test_an_iteration_that_never_ends_goes_to_the_top_clock():
    length = 0.1
    plan = timed_plan(length)
    ex, act, _ = on_manual_clock(plan)
    with pytest.warns(UserWarning, match="ran past"):
        anchors = run_loop(ex, [length, length, 4 * length])  # the last: an evaluation
    sets = set_calls(act)
    top = [c for c in sets if c["iteration"] == 2][-1]
    assert top["freq_mhz"] == 1800.0
    # the watchdog: (1 + tolerance) of the expected length after the anchor
    assert top["clock_s"] - anchors[1] == pytest.approx(1.2 * length)
    assert ex.diverged_iterations == [2]


def test_time_mode_has_no_dispatch_mode_and_restores_on_exit_and_exception():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    plan = timed_plan(0.05)
    act = DryRunActuator(FREQS)
    from opdvfs.runtime.actuators import ClockGuard

    ex = TimedExecutor(plan, act)

    def crashing_training() -> None:
        with ClockGuard(act, before_restore=ex.halt), ex:
            assert _get_current_dispatch_mode() is None  # nothing sees an operator
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.ones(2, 4)).sum().backward()
                opt.step()  # the anchors
                time.sleep(0.05)
            raise RuntimeError("crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        crashing_training()
    assert act.calls[-1]["kind"] == "restore"
    assert ex.iteration == 3 and not ex.issuer.is_alive()


def test_pause_applies_nothing_until_the_next_schedule():
    """pause(): pending switches dropped, no iteration armed, until use_schedule (tune's A/B)."""
    length = 0.1
    plan = timed_plan(length)
    ex, act, clock = on_manual_clock(plan)
    with ex:
        for i in range(7):
            if i == 1:
                ex.pause()  # iteration 1 was armed at iteration 0's end: its switches dropped
                assert ex.schedule is None and ex.timing is None
            if i == 4:
                ex.use_schedule(plan)  # from the next anchor: iteration 5 on
            clock.sleep(length)
            ex.mark_iteration()
    sets = set_calls(act)
    # (iteration 1's first stage is due at once as iteration 0 ends: the worker may set it
    # before the pause drops it)
    paused = {c["iteration"] for c in sets if c["freq_mhz"] != 1000.0 or c["iteration"] != 1}
    assert not paused & {1, 2, 3, 4}, sets
    assert {1400.0, 1800.0} <= {c["freq_mhz"] for c in sets if c["iteration"] == 5}
    assert {1400.0, 1800.0} <= {c["freq_mhz"] for c in sets if c["iteration"] == 6}
    assert not ex.diverged


def test_plan_timing_and_auto():
    plan = timed_plan(1.0, latency_ms=15.0)
    timing = plan_timing(plan)
    assert timing.source == "schedule"
    assert timing.guard_s == GUARD_S
    assert timing.issue_s.tolist() == pytest.approx(
        [-0.015 - GUARD_S, 0.385 - GUARD_S, 0.685 - GUARD_S]
    )
    assert plan_timing(plan, guard_s=0.0).issue_s.tolist() == pytest.approx([-0.015, 0.385, 0.685])
    assert choose_trigger(timing, 0.015)[0] == "time"  # stages of 300-400 ms, 15 ms switches
    assert choose_trigger(timing, 0.0005)[0] == "op"  # a fast switch: count operators
    assert choose_trigger(plan_timing(timed_plan(0.05, latency_ms=15.0)), 0.015)[0] == "op"
    assert choose_trigger(None, 0.015) == ("op", "the schedule has no stage start times")
    bare = Schedule.from_stage_freqs([0, 5], [1000.0, 1800.0], n_ops=10, target=0.1, solver="m")
    from opdvfs.exceptions import ValidationError

    with pytest.raises(ValidationError, match="needs each stage's start time"):
        plan_timing(bare)


def test_the_twin_gives_start_times_when_the_schedule_has_none():
    from opdvfs.sim import SimulatedDevice
    from opdvfs.workloads.library import load_workload

    dev, work = SimulatedDevice.from_preset("a100-like"), load_workload("bert")
    n = len(work)
    plan = Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.1, solver="m", switch_latency_ms=15.0
    )
    timing = plan_timing(plan, device=dev, workload=work)
    assert timing.source == "twin" and 0 < timing.stage_s[1] < timing.iteration_s


def _bert_on_twin():
    from opdvfs.sim import SimulatedDevice
    from opdvfs.workloads.library import load_workload

    return SimulatedDevice.from_preset("a100-like"), load_workload("bert")


def _three_stages(n: int, **planned) -> Schedule:
    """Three stages on the a100-like (15 ms switches), the first one at op 0."""
    return Schedule.from_stage_freqs(
        [0, n // 3, 2 * n // 3],
        [1005.0, 1410.0, 1095.0],
        n_ops=n,
        target=0.1,
        solver="m",
        switch_latency_ms=15.0,
        **planned,
    )


def test_a_measured_run_beats_the_planned_start_times():
    dev, work = _bert_on_twin()
    n = len(work)
    # start times the planner got wrong (its models drift from the executed run)
    plan = _three_stages(n, start_s=[0.0, 0.01, 0.02], predicted_time_s=0.05)
    run, _ = dev.run(work, plan, iterations=2)
    measured = [rec.start_s for rec in run.timeline]
    timing = plan_timing(plan, device=dev, workload=work, relearn=0)  # the op-triggered run's
    assert timing.source == "twin"  # the twin measures even where the plan has start times
    assert timing.stage_s.tolist() == pytest.approx(measured)
    assert timing.iteration_s == pytest.approx(run.iteration_time_s)
    assert timing.issue_s.tolist() == pytest.approx(
        [t - 0.015 - GUARD_S for t in measured]  # each switch leads its stage
    )
    assert measured[1] > 0.03  # not where the plan said
    planned = plan_timing(plan)
    assert planned.source == "schedule"
    assert planned.stage_s.tolist() == pytest.approx([0.0, 0.01, 0.02])
    # the same run handed over as a measurement gives the same timing
    learned = measured_timing(plan, run)
    assert learned.source == "measured"
    assert learned.issue_s.tolist() == pytest.approx(timing.issue_s.tolist())
    from opdvfs.exceptions import ValidationError

    other = Schedule.from_stage_freqs(
        [0, n // 2], [1410.0, 1005.0], n_ops=n, target=0.1, solver="m"
    )
    with pytest.raises(ValidationError, match="3 stage records; the schedule has 2"):
        measured_timing(other, run)


def test_the_start_times_are_learned_again_from_the_run_as_time_mode_issues_it():
    """Switches issued by time land before their stages when learned from time mode's run.

    The plan's switches fire at their stages' first ops, so by its trigger ops each clock lands
    one latency (15 ms) into its stage: the stages after a low clock start later than when
    time mode lands that clock a latency earlier. Learned from that run, the last switch lands
    after its stage's first op in time mode's own run; learned again from time mode's run,
    every switch lands before its stage.
    """
    import numpy as np

    dev, work = _bert_on_twin()
    n = len(work)
    plan = _three_stages(n)

    def lateness_ms(timing):  # each switch's landing minus its stage's start, time mode's run
        _, sim = dev.run(work, issued_by_time(plan, timing), iterations=2)
        exe = sim.execution
        lands = np.array([e.land_us for e in exe.landed if e.land_us > exe.start_us[n] - 50e3])
        starts = np.array([exe.start_us[n + st.first_op] for st in plan.stages])
        return (lands[-2:] - starts[1:]) / 1e3, sim

    from_op_run = plan_timing(plan, device=dev, workload=work, relearn=0)
    late, time_run = lateness_ms(from_op_run)
    assert late.max() > 0.5  # the last switch lands inside its stage
    relearned = plan_timing(plan, device=dev, workload=work)  # relearn=1
    # the start times of time mode's run at the op-triggered run's offsets
    stage_us = np.array([time_run.execution.start_us[n + st.first_op] for st in plan.stages])
    assert relearned.stage_s == pytest.approx((stage_us - stage_us[0]) * 1e-6)
    assert (lateness_ms(relearned)[0] < 0).all()
    from opdvfs.exceptions import ValidationError

    with pytest.raises(ValidationError, match="relearn"):
        plan_timing(plan, device=dev, workload=work, relearn=-1)


def test_issued_by_time_is_what_the_executor_sends():
    from opdvfs.runtime.actuators import TwinActuator

    dev, work = _bert_on_twin()
    n = len(work)
    plan = _three_stages(n)
    ex, act, _ = on_manual_clock(plan, TwinActuator(dev), device=dev, workload=work)
    timing = ex.timing
    assert timing is not None and timing.issue_s[0] < 0 <= timing.issue_s[1]
    run_loop(ex, [timing.iteration_s] * 4)
    sent = issued_by_time(plan, timing)
    # stage 0's switch is due before the iteration starts: sent in the one before
    assert [sw.previous_iteration for sw in sent.switches] == [True, False, False]
    assert all(sw.trigger_op == 0 for sw in sent.switches)
    want_s = sorted(sw.delay_us * 1e-6 for sw in sent.switches)
    assert want_s[-1] == pytest.approx(timing.iteration_s + timing.issue_s[0])
    # what the executor issued in iteration 2, as the twin replays it: the clock stage 0's
    # switch set at the end of iteration 1, then each switch at its offset
    replay = act.issued_schedule(n, iteration=2)
    got = replay.switches
    assert [sw.freq_mhz for sw in got] == [1005.0, 1410.0, 1095.0, 1005.0]
    for sw, want in zip(got[1:], want_s, strict=True):
        assert sw.delay_us * 1e-6 == pytest.approx(want, abs=EXACT_S)
    # on the twin, the two take the same time (4e-4 apart: the replay sets stage 0's clock at
    # the end of the same iteration, the schedule in the iteration before)
    issued, _ = act.replay(work, iteration=2)
    simulated, _ = dev.run(work, sent, iterations=2)
    assert issued.iteration_time_s == pytest.approx(simulated.iteration_time_s, rel=1e-3)


class _CountingBackend:
    """Inductor, counting each call of the compiled graph (it runs only if not eager)."""

    def __init__(self, backend: str) -> None:
        self.backend, self.calls = backend, 0

    def __call__(self, gm, example_inputs):
        compiled = torch._dynamo.backends.registry.lookup_backend(self.backend)(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


def _compiled_training(executor, steps: int, length_s: float, clock: ManualClock | None = None):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    backend = _CountingBackend(os.environ.get("OPDVFS_TEST_BACKEND", "inductor"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with executor:  # as under `opdvfs run`: the script compiles inside the run
        compiled = torch.compile(model, backend=backend)
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = compiled(torch.ones(2, 8)).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clock is not None:  # each step lasts length_s on it, compiling or not
                clock.sleep(length_s)
            else:
                time.sleep(max(length_s - (time.perf_counter() - t0), 0.0))
            opt.step()
    return backend, dict(torch._dynamo.utils.counters)


def test_a_compiled_model_stays_compiled_and_switches_land_on_time():
    length = 0.15
    plan = timed_plan(length)
    clock = ManualClock()
    act = StampedDryRun(clock)
    # the optimizer steps are the anchors; compiling takes seconds of real time, none on the
    # manual clock (each step lasts its length there)
    ex = TimedExecutor(plan, act, tolerance=0.5, clock=clock)
    clock.settled = lambda: ex.issuer is None or ex.issuer.idle()
    backend, counters = _compiled_training(ex, 5, length, clock)
    assert counters["frames"]["total"] == 1 and counters["frames"]["ok"] == 1  # no recompile
    assert not counters.get("graph_break")
    assert backend.calls == 5  # every step ran the compiled graph: never eager
    anchors = ex.iteration_ends_s
    landed = [
        c["clock_s"] - anchors[c["iteration"] - 1]
        for c in set_calls(act)
        if c["iteration"] in (1, 2, 3, 4) and c["freq_mhz"] == 1400.0
    ]
    # at 40% of each step less the latency and the guard: the hooks Dynamo runs under do not
    # delay a switch
    assert landed == pytest.approx([0.4 * length - 0.005 - GUARD_S] * 4, abs=EXACT_S)


def test_op_mode_says_a_compiled_model_runs_eagerly_under_it():
    plan = timed_plan(0.01, n_ops=34)
    ex = ScheduleExecutor(plan, DryRunActuator(FREQS))
    with pytest.warns(UserWarning, match="--trigger time"):
        backend, _ = _compiled_training(ex, 2, 0.0)
    assert backend.calls == 0  # Dynamo skipped the model under the dispatch mode
    assert ex.compile_seen


# -------------------------------------------------------------------------------- the CLI
SCRIPT = textwrap.dedent("""
    import sys, time, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(int(sys.argv[1])):
        t0 = time.perf_counter()
        loss = model(torch.ones(2, 8)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        time.sleep(max(0.1 - (time.perf_counter() - t0), 0.0))
        opt.step()
    if len(sys.argv) > 2 and sys.argv[2] == "crash":
        raise RuntimeError("training crashed")
    if len(sys.argv) > 2 and sys.argv[2] == "wait":
        print("ready", flush=True)
        time.sleep(60)
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    timed_plan(0.1, n_ops=34).model_copy(update={"device": "ascend-910b-like"}).write(
        tmp_path / "s.json"
    )
    return path


@pytest.mark.parametrize("trigger", ["op", "time"])
def test_an_eager_model_runs_in_both_modes(script, tmp_path, trigger):
    log = tmp_path / f"{trigger}.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(tmp_path / "s.json"),
            "--trigger",
            trigger,
            "--log",
            str(log),
            "--",
            "python",
            str(script),
            "5",
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"trigger: {trigger}" in res.stdout
    calls = read_log(log)
    sets = [c for c in calls if c["kind"] == "set"]
    assert {c["freq_mhz"] for c in sets} >= {1000.0, 1400.0, 1800.0}
    assert calls[-1]["kind"] == "restore"
    if trigger == "time":
        assert all(c["op_index"] is None for c in sets) and "time mode:" in res.stdout
    else:
        assert all(c["op_index"] is not None for c in sets)


def test_auto_picks_and_prints_the_trigger(script, tmp_path):
    res = CliRunner().invoke(
        app, ["run", str(tmp_path / "s.json"), "--", "python", str(script), "3"]
    )
    assert res.exit_code == 0, res.output
    # ascend-910b-like switches in 1 ms and the stages hold a clock 30-40 ms: time
    assert "trigger: time (auto: a 1 ms switch latency" in res.stdout


def test_a_bad_trigger_is_one_line(script, tmp_path):
    res = CliRunner().invoke(
        app, ["run", str(tmp_path / "s.json"), "--trigger", "soon", "--", "python", str(script)]
    )
    assert res.exit_code == 2
    assert "--trigger 'soon': expected time, op or auto" in res.stderr


def _run_argv(tmp_path: Path, trigger: str, log: Path, script: Path, mode: str) -> list[str]:
    """``opdvfs run`` of the test schedule on ``script`` (3 steps, then ``mode``)."""
    return [
        *[sys.executable, "-m", "opdvfs", "run", str(tmp_path / "s.json")],
        *["--trigger", trigger, "--log", str(log), "--", "python", str(script), "3", mode],
    ]


@pytest.mark.slow  # `opdvfs run` in a subprocess
@pytest.mark.parametrize("trigger", ["op", "time"])
def test_an_exception_restores_the_clock(script, tmp_path, trigger):
    log = tmp_path / "calls.jsonl"
    proc = subprocess.run(
        _run_argv(tmp_path, trigger, log, script, "crash"),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode != 0 and "training crashed" in proc.stderr
    calls = read_log(log)
    assert "set" in [c["kind"] for c in calls] and calls[-1]["kind"] == "restore"


@pytest.mark.slow  # `opdvfs run` in a subprocess
@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("trigger", ["op", "time"])
def test_a_signal_restores_the_clock(script, tmp_path, trigger, sig):
    log = tmp_path / "calls.jsonl"
    proc = subprocess.Popen(
        _run_argv(tmp_path, trigger, log, script, "wait"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    try:
        status = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert status != 0
    if sig == signal.SIGTERM:
        assert status == 128 + signal.SIGTERM
    calls = read_log(log)
    assert "set" in [c["kind"] for c in calls] and calls[-1]["kind"] == "restore"


class _DeviceEvent:
    """A CUDA event on a scripted device clock: the GPU reaches anchor k at ``device_s[k]``."""

    device_s: ClassVar[list] = []
    recorded: ClassVar[list] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing  # iterations are timed on the device
        self.at_s = None

    def record(self) -> None:
        self.at_s = self.device_s[len(self.recorded)]
        self.recorded.append(self)

    def query(self) -> bool:  # the GPU is one iteration behind the host
        return self is not self.recorded[-1]

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, later: "_DeviceEvent") -> float:
        return (later.at_s - self.at_s) * 1e3


def test_on_a_gpu_iterations_are_timed_on_the_device_not_the_host(monkeypatch):
    """The host runs ahead of the GPU: its optimizer steps come 10 ms apart for 0.2 s steps.

    Timed on the host (as on a real H200 before), every iteration looked 95% short of the plan
    and the schedule never applied; timed between anchor events on the device, it applies.
    """
    length = 0.2
    monkeypatch.setattr(_DeviceEvent, "device_s", [length * k for k in range(10)])
    monkeypatch.setattr(_DeviceEvent, "recorded", [])
    monkeypatch.setattr(torch.cuda, "Event", _DeviceEvent)
    act = DryRunActuator(FREQS)
    ex = TimedExecutor(timed_plan(length), act, optimizer_steps=False)
    ex._cuda = True  # as on a GPU
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_loop(ex, [0.01] * 6)  # the host's view: 10 ms per iteration
    assert not [w for w in caught if "falling back" in str(w.message)]
    assert not ex.diverged and ex.applied_iterations >= 4
    assert ex.scales[-1] == pytest.approx(1.0)  # the device's 0.2 s, not the host's 0.01 s


class _LaggingEvent:
    """A CUDA event the GPU reaches ``lag_s`` after the host records it (the host runs ahead).

    Timed on the test's manual ``clock`` (the worker waits for it there).
    """

    lag_s: ClassVar[float] = 0.15
    clock: ClassVar[ManualClock]

    def __init__(self, enable_timing: bool = False) -> None:
        self.at_s = 0.0

    def record(self) -> None:
        self.at_s = self.clock.now() + self.lag_s

    def query(self) -> bool:
        return self.clock.now() >= self.at_s

    def synchronize(self) -> None:
        self.clock.wait(threading.Event(), self.at_s - self.clock.now())

    def elapsed_time(self, later: "_LaggingEvent") -> float:
        return (later.at_s - self.at_s) * 1e3


def test_on_a_gpu_the_hosts_next_anchor_does_not_cancel_the_switches_still_due(monkeypatch):
    """On an H200 the host reached each optimizer step well before the GPU did.

    Cancelling the pending switches at the host's next anchor then dropped every switch before
    its moment on the device (one set in 30 iterations); they are dropped only once the device
    passes the next anchor.
    """
    length = 0.2
    monkeypatch.setattr(torch.cuda, "Event", _LaggingEvent)
    ex, act, clock = on_manual_clock(timed_plan(length))
    monkeypatch.setattr(_LaggingEvent, "clock", clock, raising=False)
    ex._cuda = True  # as on a GPU
    anchors = run_loop(ex, [length] * 6)
    late = [c for c in set_calls(act) if c["freq_mhz"] in (1400.0, 1800.0)]
    # stages at 0.4 and 0.7 of each 0.2 s iteration, due after the host's next anchor: each
    # lands its offset after the device reaches the anchor (the host's plus the lag; the
    # last iteration's are still due when the loop ends)
    assert [c["iteration"] for c in late] == [1, 1, 2, 2, 3, 3, 4, 4], set_calls(act)
    lead = 0.005 + GUARD_S
    for c in late:
        want = _LaggingEvent.lag_s + (0.4 if c["freq_mhz"] == 1400.0 else 0.7) * length - lead
        assert c["clock_s"] - anchors[c["iteration"] - 1] == pytest.approx(want, abs=EXACT_S)
    assert not ex.diverged
