"""The time-anchored executor (``--trigger time``): no per-operator hook at all (DESIGN §5).

Each iteration is anchored where the host sees it cheaply -- the optimizer step (or the
``--iteration-at`` function's return) that ends the previous one; on a GPU a CUDA event recorded
there, so the anchor is when the device gets there -- and the
:class:`~opdvfs.runtime.issuer.SwitchIssuer` issues each switch at its stage's offset from the
anchor minus the switch latency and a small guard (:data:`GUARD_S`). The offsets are the stages'
start times in a measured run of the plan where there is one (the twin: :func:`plan_timing`;
any measured :class:`~opdvfs.result.RunResult`: :func:`measured_timing`), else the planner's
prediction (:attr:`Stage.start_s <opdvfs.schedule.Stage.start_s>`), which drifts from the
executed run along the iteration; a switch due less than the latency into the iteration is
issued that long before the next anchor, in the iteration before (training repeats).
:func:`issued_by_time` writes what the executor sends as a schedule the twin can run, so a plan
can be measured the way time mode applies it (:func:`opdvfs.experiments.bench.twin_measure`).

Drift: each iteration's measured anchor-to-anchor time rescales the next one's offsets. An
iteration whose length departs from the plan's by more than ``tolerance`` -- or that runs past
``(1 + tolerance)`` times it before its anchor comes -- falls back to the maximum clock with one
warning, and the schedule resumes once an iteration's length is within the tolerance again.

Works unchanged under ``torch.compile`` and CUDA graphs: nothing here sees an operator.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.runtime.applier import ScheduleApplier
from opdvfs.runtime.clock import SYSTEM_CLOCK, Clock
from opdvfs.runtime.issuer import Marker, immediate_marker
from opdvfs.schedule import Schedule

if TYPE_CHECKING:
    from opdvfs.result import RunResult
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.workloads.workload import Workload

__all__ = [
    "GUARD_S",
    "PlanTiming",
    "TimedExecutor",
    "choose_trigger",
    "issued_by_time",
    "measured_timing",
    "plan_timing",
]


#: How much earlier than the latency a time-triggered switch is issued (s). A switch issued by
#: time lands where the clock says, and the executed run is never exactly the run its offsets
#: were measured on: on the simulated a100-like, a GPT-3 plan's stages start up to 1.5 ms
#: earlier when its switches are issued by time than in the operator-triggered run they were
#: learned from (:func:`plan_timing` now learns them again from time mode's own run: the
#: drift left is one run's noise against another's), and the worker thread wakes 0.1-0.5 ms
#: late on this CPU. A switch landing after its stage's first op has started leaves that op
#: at the previous clock -- a long one (a pipeline ``Send`` waiting 0.85 s, planned at a low
#: clock) costs 0.25% of the iteration's energy on that plan -- while one landing a
#: millisecond early moves a sliver of the previous stage: measured there (20 ms stages), a
#: 1 ms guard keeps time mode's saving at op mode's for +0.005 points of slowdown; 2 ms costs
#: +0.1 points, 5 ms +0.3.
GUARD_S = 1e-3
#: Anchors kept on a GPU to time iterations on the device: the host may run this many ahead.
ANCHORS_KEPT = 8


@dataclass(frozen=True)
class PlanTiming:
    """When each switch is due in the planned run, relative to the iteration's start.

    Attributes
    ----------
    iteration_s
        The planned iteration's length (s).
    issue_s
        Per switch of the schedule, in its order: its stage's start minus the switch latency
        and the guard (s); negative for a switch issued in the iteration before.
    freqs_mhz
        Per switch, the clock it sets.
    stage_s
        Per stage, its start in the planned run (s), shape (n_stages,).
    switch_stage
        Per switch, the stage it serves.
    latency_s
        The switch latency the switches lead by (s).
    source
        Where the start times came from: ``"schedule"`` (the planner's prediction),
        ``"twin"`` or ``"measured"``.
    guard_s
        How much earlier than the latency the switches are issued (:data:`GUARD_S`).
    """

    iteration_s: float
    issue_s: np.ndarray
    freqs_mhz: np.ndarray
    stage_s: np.ndarray
    switch_stage: tuple[int, ...]
    latency_s: float
    source: str
    guard_s: float = 0.0

    def held_s(self) -> np.ndarray:
        """How long each clock is held in the planned run (s), switch by switch."""
        starts = self.stage_s[list(self.switch_stage)]
        return np.diff(np.r_[starts, self.iteration_s])


def plan_timing(
    schedule: Schedule,
    *,
    latency_s: float | None = None,
    device: SimulatedDevice | None = None,
    workload: Workload | None = None,
    guard_s: float = GUARD_S,
    relearn: int = 1,
) -> PlanTiming:
    """Return when each switch of ``schedule`` is due, from the iteration's start.

    A measured run beats the planner's prediction: given the simulated device and the
    workload, the schedule is run on the twin (switches at their trigger ops, as the
    operator-counting executor issues them) and the stages' start times are read from that
    run (:func:`measured_timing`); then, ``relearn`` times, the schedule is run as time mode
    issues it at those times (:func:`issued_by_time`) and they are read from that run. The
    operator-triggered run is not the run time mode executes: its switches land where their
    trigger ops put them, late where the planner predicted an op short. A GPT-3[:4000] plan on
    the simulated ``a100-like``: by its trigger op the clock after the first 1 s Recv lands
    4.4 ms into the next stage, issued by time 1 ms before it, so every later stage starts
    3-4 ms earlier in time mode than in the run the offsets were learned from; the switch
    after a 210 MHz ``Send`` then landed 3 ms into its stage, whose first matmul ran at
    210 MHz (+13 ms): time mode measured +2.35% where op mode measured +1.92% for the same
    plan. Learned once more from time mode's own run: +1.83% (a second pass: < 0.01 points
    more). Where an early landing moves many ops to another clock (a 210 MHz stage's end) the
    passes converge slowly: each one leaves most of the error to the next.

    Without a device, the stages' ``start_s`` that the planner wrote are used -- sums of its
    fitted models' op times, which drift from the executed run along the iteration (a 2%
    GPT-3 plan on the simulated ``a100-like``: its last stage starts 136-148 ms later than
    predicted, 1% of the iteration, ten switch latencies).

    Parameters
    ----------
    schedule
        The plan. Without a device: its stages' ``start_s`` (all of them) and
        ``predicted_time_s`` give the timing.
    latency_s
        The switch latency to lead by (s); default the schedule's ``switch_latency_ms``.
    device, workload
        The twin to measure the planned run on (both, or neither).
    guard_s
        How much earlier than the latency to issue each switch (:data:`GUARD_S`).
    relearn
        How many times to learn the start times again from a twin run of the schedule as
        time mode issues it (>= 0; 0: the operator-triggered run's).

    Raises
    ------
    ValidationError
        If the schedule carries no stage start times and there is no simulated device and
        workload to measure them with, or ``relearn`` is negative.
    """
    if relearn < 0:
        raise ValidationError(f"relearn {relearn}: expected >= 0", field="relearn")
    if device is not None and workload is not None:
        result, _ = device.run(workload, schedule, iterations=2)
        timing = measured_timing(
            schedule, result, latency_s=latency_s, source="twin", guard_s=guard_s
        )
        for _ in range(relearn):
            issued = issued_by_time(schedule, timing)
            result, _ = device.run(workload, issued, iterations=2)
            timing = measured_timing(
                schedule, result, latency_s=latency_s, source="twin", guard_s=guard_s
            )
        return timing
    known = [st.start_s for st in schedule.stages]
    if not (all(s is not None for s in known) and schedule.predicted_time_s):
        raise ValidationError(
            "--trigger time needs each stage's start time in the planned run: this schedule has "
            "no stages[].start_s (and no predicted_time_s); re-plan with an opdvfs that writes "
            "them, run on the twin, or use --trigger op",
            field="trigger",
        )
    return _timing(
        schedule,
        np.asarray(known, dtype=float),
        float(schedule.predicted_time_s),
        latency_s=latency_s,
        source="schedule",
        guard_s=guard_s,
    )


def measured_timing(
    schedule: Schedule,
    run: RunResult,
    *,
    latency_s: float | None = None,
    source: str = "measured",
    guard_s: float = GUARD_S,
) -> PlanTiming:
    """Return the timing of ``schedule`` learned from a run of it that was measured.

    ``run`` is an iteration (or the mean of several) with ``schedule`` applied, whose
    :attr:`~opdvfs.result.RunResult.timeline` has one record per stage of the schedule, as
    :meth:`SimulatedDevice.run <opdvfs.sim.twin.SimulatedDevice.run>` returns it: the switches
    are then due where the stages really began, not where the planner predicted them
    (``latency_s`` and ``guard_s`` as :func:`plan_timing`).

    Raises
    ------
    ValidationError
        If the run's timeline does not have one record per stage of the schedule.
    """
    if len(run.timeline) != len(schedule.stages):
        raise ValidationError(
            f"the measured run has {len(run.timeline)} stage records; the schedule has "
            f"{len(schedule.stages)} stages (measure the run with this schedule applied)",
            field="timeline",
        )
    stage_s = np.asarray([rec.start_s for rec in run.timeline], dtype=float)
    return _timing(
        schedule,
        stage_s,
        float(run.iteration_time_s),
        latency_s=latency_s,
        source=source,
        guard_s=guard_s,
    )


def _timing(
    schedule: Schedule,
    stage_s: np.ndarray,
    iteration_s: float,
    *,
    latency_s: float | None,
    source: str,
    guard_s: float,
) -> PlanTiming:
    if guard_s < 0:
        raise ValidationError(f"guard {guard_s} s: expected >= 0", field="guard_s")
    lead_s = schedule.switch_latency_ms * 1e-3 if latency_s is None else latency_s
    stages = tuple(sw.stage for sw in schedule.switches)
    return PlanTiming(
        iteration_s=iteration_s,
        issue_s=stage_s[list(stages)] - lead_s - guard_s,
        freqs_mhz=np.asarray([sw.freq_mhz for sw in schedule.switches], dtype=float),
        stage_s=stage_s,
        switch_stage=stages,
        latency_s=lead_s,
        source=source,
        guard_s=guard_s,
    )


def issued_by_time(schedule: Schedule, timing: PlanTiming) -> Schedule:
    """Return ``schedule`` as the time-anchored executor issues it, for the twin to run.

    Every switch is issued from the iteration's start (trigger op 0) after its due time
    (``delay_us``); one due before the iteration starts is issued in the previous
    iteration, ``iteration_s`` plus its (negative) due time after that iteration's start.
    That is what :class:`TimedExecutor` sends when each iteration lasts ``timing``'s length
    (the offsets' scale is 1) and the worker thread is never late; the stages are the
    schedule's, so a run of it on the twin has a record per planned stage.
    """
    wrapped = timing.issue_s < 0  # the earliest stages' switches: a prefix, as required
    due_s = np.where(wrapped, timing.iteration_s + timing.issue_s, timing.issue_s)
    doc = schedule.model_dump()
    for sw, due, back in zip(doc["switches"], due_s, wrapped, strict=True):
        sw.update(trigger_op=0, delay_us=max(float(due), 0.0) * 1e6, previous_iteration=bool(back))
    return Schedule.model_validate(doc)  # checked like any schedule


def choose_trigger(timing: PlanTiming | None, latency_s: float) -> tuple[str, str]:
    """``--trigger auto``: ``"time"`` where switches are slow and stages long, else ``"op"``.

    Time where the device's switch latency is at least 1 ms and the median clock is held at
    least 5x the latency (operator-exact triggering buys nothing there); else op.

    Returns
    -------
    tuple of str
        The mode and the reason, for the line ``run`` prints.
    """
    if timing is None:
        return "op", "the schedule has no stage start times"
    if latency_s < 1e-3:
        return "op", f"the switch latency {latency_s * 1e3:g} ms is under 1 ms"
    held = timing.held_s()
    median_s = float(np.median(held)) if len(held) else timing.iteration_s
    if median_s < 5 * latency_s:
        return "op", (
            f"stages hold a clock {median_s * 1e3:.1f} ms (median), under 5x the "
            f"{latency_s * 1e3:g} ms switch latency"
        )
    return "time", (
        f"a {latency_s * 1e3:g} ms switch latency and stages of {median_s * 1e3:.1f} ms (median)"
    )


class TimedExecutor(ScheduleApplier):
    """Apply a schedule by time from each iteration's anchor: no per-operator hook.

    Use as a context manager around the training loop (like the op-counting
    :class:`~opdvfs.runtime.dispatch.ScheduleExecutor`). The first iteration only starts the
    clock: it runs at the clock in effect, and the schedule applies from the first optimizer
    step (or ``--iteration-at`` return) on.

    Parameters
    ----------
    schedule
        The plan, or None to wait for :meth:`use_schedule` (``torchrun``: rank 0's).
    actuator
        Where the switches go.
    timing
        When each switch is due; default :func:`plan_timing` of the schedule (measured on the
        twin when ``device`` and ``workload`` are given, else the planner's start times).
    latency_s
        The switch latency to lead by (s); default the schedule's.
    guard_s
        How much earlier than the latency to issue each switch (:data:`GUARD_S`).
    tolerance
        Largest relative departure of an iteration's length from the plan's that still counts
        as in step (0.2: 20%). Keep it above the plan's slowdown target: an iteration at the top
        clock is that much shorter.
    device, workload
        For :func:`plan_timing`.
    optimizer_steps
        As :class:`~opdvfs.runtime.recorder.IterationCounter`.
    clock
        What the anchors and the switch worker read the time from (default the system's; a
        test passes one it moves by hand).
    """

    trigger = "time"

    def __init__(
        self,
        schedule: Schedule | None,
        actuator: Actuator,
        *,
        timing: PlanTiming | None = None,
        latency_s: float | None = None,
        guard_s: float = GUARD_S,
        tolerance: float = 0.2,
        device: SimulatedDevice | None = None,
        workload: Workload | None = None,
        optimizer_steps: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(actuator, max_diverged=None, optimizer_steps=optimizer_steps, clock=clock)
        if not 0 < tolerance < 1:
            raise ValidationError(f"tolerance {tolerance}: expected 0 < tolerance < 1")
        self.tolerance = tolerance
        self.latency_s, self.guard_s = latency_s, guard_s
        self._device, self._workload = device, workload
        self.timing: PlanTiming | None = timing
        self._cuda = torch.cuda.is_available()
        self._anchor_s: float | None = None  # clock.now() at the current iteration's anchor
        # on a GPU, the anchors as timing events: iterations are timed where they run
        self._anchors: deque[Any] = deque(maxlen=ANCHORS_KEPT)
        self._armed = False  # the current iteration runs the schedule
        self._wrapped_issued = 0  # of the next iteration's early switches, issued in this one
        #: The scale applied to each iteration's offsets (measured / planned length).
        self.scales: list[float] = []
        if schedule is not None:
            self.use_schedule(schedule)

    def use_schedule(self, schedule: Schedule) -> None:
        """Apply ``schedule`` from the next anchor on.

        Raises
        ------
        ValidationError
            If its timing cannot be known (see :func:`plan_timing`).
        """
        timing = self.timing
        if timing is None or self.schedule is not None:
            timing = plan_timing(
                schedule,
                latency_s=self.latency_s,
                device=self._device,
                workload=self._workload,
                guard_s=self.guard_s,
            )
        with self._lock:
            self._start_issuer()
            self.schedule, self.timing = schedule, timing

    def pause(self) -> None:
        """Apply nothing from now until the next :meth:`use_schedule`; the clock is left as is.

        Every switch still pending is dropped (one the worker is issuing lands first), the next
        iteration is not armed, and a fallback in progress ends: what runs next is the caller's
        (``opdvfs tune`` sets the top clock for a reference block between its tuned ones). The
        iterations go on being counted and anchored, so a later :meth:`use_schedule` applies
        from the next anchor, its offsets scaled by the iteration before it.
        """
        with self._lock:
            if self._issuer is not None:
                self._issuer.cancel()
            self.schedule = self.timing = None
            self._armed, self._wrapped_issued, self._off = False, 0, False

    def _anchor(self) -> Marker:
        """Mark this iteration's end where the work runs: a CUDA event on a GPU, else now."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # the device reaches the step after the host: anchor there
            self._anchors.append(event)
            return event
        return immediate_marker()

    def _passed_next_anchor(self, marker: Marker) -> bool:
        """Whether the GPU has reached the anchor after ``marker`` (its switches are too late)."""
        events = list(self._anchors)
        for earlier, later in pairwise(events):
            if earlier is marker:
                return bool(later.query())
        return all(e is not marker for e in events)  # dropped out of the kept anchors: old

    def _device_length_s(self) -> float | None:
        """Return the length (s) of the latest iteration the GPU has finished, timed on it.

        The host runs ahead of the GPU (kernels are queued): on an H200 the host reached the
        second optimizer step 14 ms after the first while the step took 126 ms on the device,
        so host-timed iterations looked 90% short and time mode never applied. Between two
        anchor events the device's own clock gives the length; the newest pair it has passed
        is the latest known (None before it has finished one).
        """
        events = list(self._anchors)
        for earlier, later in zip(events[-2::-1], events[::-1], strict=False):
            if later.query():
                return float(earlier.elapsed_time(later)) / 1e3
        return None

    def end_iteration(self, n_ops: int) -> None:
        """At an anchor: judge the iteration that ended by its length, arm the next one."""
        self._read_energy()
        now = self.clock.now()
        marker = self._anchor()
        if self._cuda:
            length_s = self._device_length_s()
        else:
            length_s = None if self._anchor_s is None else now - self._anchor_s
        self._anchor_s = now
        if self.schedule is None or self.timing is None or self._halted:
            return
        planned_s = self.timing.iteration_s
        issuer = self._start_issuer()
        if not self._cuda:
            # the next anchor came: whatever is still pending is too late. On a GPU the host
            # reaches it long before the device does; there each switch is dropped only once
            # the device has passed the anchor after its own (``_passed_next_anchor``).
            issuer.cancel()
        in_step = length_s is None or abs(length_s / planned_s - 1) <= self.tolerance
        if self._armed and in_step and not self._off:
            self.applied_iterations += 1
        if not in_step:
            assert length_s is not None
            issuer.cancel()
            if not self._off:
                self._fall_back(
                    f"iteration {self.iteration} took {length_s:.4g} s, the schedule plans "
                    f"{planned_s:.4g} s (more than {self.tolerance:.0%} apart)",
                    stacklevel=4,
                )
            self._armed, self._wrapped_issued = False, 0
            self._off = True  # the next iteration runs at the top clock; it is measured
            return
        scale = 1.0 if length_s is None else length_s / planned_s
        self._arm(issuer, marker, scale, catch_up=not self._armed)
        self._off = False

    def _arm(self, issuer: Any, marker: Marker, scale: float, *, catch_up: bool) -> None:
        """Queue the next iteration's switches, offsets scaled by ``scale``, from ``marker``."""
        assert self.timing is not None
        timing = self.timing
        # the switches lead their stages by the latency and the guard: neither scales
        lead_s = timing.latency_s + timing.guard_s
        iteration, planned_s = self.iteration + 1, timing.iteration_s
        wrapped = np.flatnonzero(timing.issue_s < 0)
        missed = wrapped if catch_up else wrapped[self._wrapped_issued :]
        for k in missed:  # the previous iteration did not issue them: set them now
            issuer.submit(
                marker, 0.0, timing.freqs_mhz[k], iteration, None, offset_s=timing.issue_s[k]
            )

        stale = (lambda: self._passed_next_anchor(marker)) if self._cuda else None

        def at_scaled(k: np.integer, offset_s: float, then: Any = None) -> None:
            # the stage's start moves with the iteration's length; the lead does not
            due_s = scale * (offset_s + lead_s) - lead_s
            issuer.submit(
                marker, max(due_s, 0.0), timing.freqs_mhz[k], iteration, None,
                offset_s=offset_s, then=then, stale=stale,
            )  # fmt: skip

        for k in np.flatnonzero(timing.issue_s >= 0):
            at_scaled(k, timing.issue_s[k])
        self._wrapped_issued = 0

        def issued() -> None:
            self._wrapped_issued += 1

        for k in wrapped:  # the next iteration's earliest stages, from this anchor
            at_scaled(k, planned_s + timing.issue_s[k], then=issued)
        # a watchdog: past (1 + tolerance) of the expected length without an anchor, the
        # iteration no longer matches the plan (a pause, an evaluation): the top clock
        overrun_s = (1 + self.tolerance) * scale * planned_s
        issuer.submit(
            marker,
            overrun_s,
            max(self.actuator.supported_freqs_mhz()),
            iteration,
            None,
            offset_s=overrun_s / scale,
            then=lambda: self._overran(iteration, overrun_s),
            stale=stale,
        )
        self._armed = True
        self.scales.append(scale)

    def _overran(self, iteration: int, overrun_s: float) -> None:
        """Mark the iteration that ran too long (the watchdog fired; on the worker thread)."""
        self._armed, self._off = False, True
        if not self.diverged_iterations or self.diverged_iterations[-1] != iteration:
            self.diverged_iterations.append(iteration)
        if self.first_divergence is None:
            self.first_divergence = (
                f"iteration {iteration} ran past {overrun_s:.4g} s without ending"
            )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"opdvfs: {self.first_divergence}; falling back to the maximum clock",
                stacklevel=2,
            )
