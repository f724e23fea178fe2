"""One capture or run of the user's program, the same in opdvfs's process and in a launched one.

A :class:`Session` is built from plain settings (the options of ``opdvfs capture`` / ``opdvfs
run``), checks everything it can *before* the program starts (the schedule's clocks, device and
length; the ``--iteration-at`` target's syntax), and is then entered around the program: the
actuator, its :class:`~opdvfs.runtime.actuators.ClockGuard`, the recorder or the executor, and the
iteration marker. After the program, :meth:`Session.outcome` gives the lines to print and the
error to end with, so the CLI prints the same whether the program ran in its own process or was
started by ``accelerate launch`` (:func:`~opdvfs.runtime.launch.activate_from_env`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from opdvfs._files import write_text_atomic
from opdvfs.exceptions import CaptureError, ScheduleMismatchError, ValidationError
from opdvfs.runtime.actuators import ClockGuard, make_actuator
from opdvfs.runtime.checks import check_schedule
from opdvfs.runtime.iterations import IterationMarker
from opdvfs.schedule import PipelineSchedule, Schedule, read_any_schedule
from opdvfs.sim.presets import preset_spec
from opdvfs.workloads.library import load_workload

if TYPE_CHECKING:  # these import torch, which the session's callers may not have loaded
    from opdvfs.runtime.applier import ScheduleApplier

__all__ = ["TRIGGERS", "Outcome", "Session"]

#: How ``opdvfs run`` triggers switches: by time from each iteration's anchor, by counting
#: operators, or whichever suits the device and the schedule.
TRIGGERS = ("time", "op", "auto")


def local_device(schedule: Schedule | None) -> str | None:
    """Return the device a schedule was planned for, if it says."""
    return schedule.device if schedule is not None else None


@dataclass(frozen=True)
class Outcome:
    """What a session ended with: lines for stdout, and the error to exit with, if any."""

    lines: tuple[str, ...]
    error: str | None = None
    #: ``"capture"`` errors are a :class:`CaptureError`, ``"run"`` ones a schedule mismatch.
    mode: str = "run"
    #: What the lines say, as JSON-able fields (``--json``).
    data: dict[str, Any] = field(default_factory=dict)

    def raise_error(self) -> None:
        """Raise the session's error as its typed opdvfs error (no-op without one)."""
        if self.error is not None:
            raise (CaptureError if self.mode == "capture" else ScheduleMismatchError)(self.error)


def parse_rank_map(text: str | None) -> tuple[int, ...] | None:
    """Parse ``--rank-map`` (the pipeline stage of each rank, comma-separated: ``0,0,1,1``)."""
    if text is None or not text.strip():
        return None
    try:
        stages = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValidationError(
            f"--rank-map {text!r}: expected the stage of each rank, comma-separated (0,0,1,1)",
            field="rank_map",
        ) from None
    if min(stages) < 0:
        raise ValidationError(f"--rank-map {text!r}: a stage is negative", field="rank_map")
    return stages


class Session:
    """Capture a workload from, or apply a schedule to, the program run inside the block.

    Parameters
    ----------
    mode
        ``"capture"`` or ``"run"``.
    out, name
        Capture: the workload file to write (rank 0 only) and its name.
    schedule
        Run: the schedule's file. Under ``torchrun`` in opdvfs's own process (``share``), only
        rank 0 reads it and the others receive it when the script makes its process group.
    actuator, device, log, workload
        Run: as ``opdvfs run``'s options. ``log`` gets ``.rankN`` before its suffix when the job
        has more than one rank, and one header line per run.
    iteration_at
        ``MODULE:QUALNAME`` whose every call ends an iteration (instead of optimizer steps).
    trigger
        Run: ``"op"`` (count operators under a dispatch mode), ``"time"`` (issue each switch by
        time from each iteration's anchor, :class:`~opdvfs.runtime.timed.TimedExecutor`) or
        ``"auto"`` (:func:`~opdvfs.runtime.timed.choose_trigger`; the choice is the outcome's
        first line).
    share
        Run: ranks other than 0 take rank 0's schedule over the process group.
    rank_map
        Run with a pipeline schedule (one schedule per pipeline stage): the stage of each rank,
        comma-separated; without it rank r of W runs stage ``r * n_stages // W``. Each rank
        applies its own stage's schedule (data-parallel replicas share one).
    gpu
        ``--gpu``: the NVIDIA GPU of ``nvml``, ``zeusd`` and a measuring dry run
        (:func:`~opdvfs.runtime.actuators.make_actuator`); default this process's own.
    report_dir
        Launched processes write their :class:`Outcome` there (one JSON file per process).

    Raises
    ------
    OpdvfsError
        From the constructor, for anything wrong before the program starts: an unreadable or
        mismatched schedule, an unsupported clock, a bad actuator, a malformed ``iteration_at``.
    """

    def __init__(
        self,
        mode: str,
        *,
        out: str | None = None,
        name: str = "captured",
        schedule: str | None = None,
        actuator: str = "dry-run",
        device: str | None = None,
        log: str | None = None,
        workload: str | None = None,
        iteration_at: str | None = None,
        trigger: str = "auto",
        share: bool = False,
        report_dir: str | None = None,
        rank_map: str | None = None,
        work_scale: float | None = None,
        gpu: str | None = None,
    ) -> None:
        from opdvfs.runtime.dispatch import ScheduleExecutor
        from opdvfs.runtime.recorder import WorkloadRecorder
        from opdvfs.runtime.timed import TimedExecutor, choose_trigger, plan_timing

        self.mode, self.out, self.name, self.report_dir = mode, out, name, report_dir
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.marker = IterationMarker(iteration_at) if iteration_at else None
        optimizer_steps = self.marker is None
        self._stack = ExitStack()
        #: The clock guard of a run (None for a capture): which signals it took.
        self.guard: ClockGuard | None = None
        self.recorder: WorkloadRecorder | None = None
        self.executor: ScheduleApplier | None = None
        self.trigger_line: str | None = None
        if mode == "capture":
            self.recorder = WorkloadRecorder(optimizer_steps=optimizer_steps)
            return
        self.share = share and self.world > 1
        if trigger not in TRIGGERS:
            raise ValidationError(
                f"--trigger {trigger!r}: expected {', '.join(TRIGGERS[:-1])} or {TRIGGERS[-1]}",
                field="trigger",
            )
        self.rank_map = parse_rank_map(rank_map)
        #: The file as read (a pipeline schedule holds every stage's); rank 0's is shared.
        self.document = (
            read_any_schedule(schedule) if schedule and (self.rank == 0 or not share) else None
        )
        plan = self._own(self.document)
        if log is not None and self.world > 1:
            path = Path(log)
            log = str(path.with_name(f"{path.stem}.rank{self.rank}{path.suffix}"))
        self.work = load_workload(workload) if workload else None
        seen = self.document
        if seen is None and schedule and Path(schedule).is_file():
            # this rank's clocks and checks; the plan it runs arrives from rank 0
            seen = read_any_schedule(schedule)
        local = self._own(seen)
        header: dict[str, Any] = {
            "command": mode,
            "schedule": schedule,
            "actuator": actuator,
            "rank": self.rank,
        }
        if isinstance(seen, PipelineSchedule):
            header["pipeline_stage"] = seen.stage_of(self.rank, self.world, self.rank_map)
        self.actuator = make_actuator(
            actuator,
            device=device,
            schedule=local,
            log=log,
            header=header,
            work_scale=work_scale,
            optimizer_steps=optimizer_steps,
            gpu=gpu,
        )
        #: The simulated GPU the program runs on (its time is virtual), or None: wall time.
        timeline = self.actuator.timeline
        try:
            if timeline is not None and trigger == "time":
                raise ValidationError(
                    f"--trigger time follows the host's clock, and {actuator}'s time is "
                    "virtual: use --trigger op (or auto)",
                    field="trigger",
                )
            if actuator == "twin" and self.work is None:
                raise ValidationError(
                    "--actuator twin needs --workload (the captured workload to simulate)",
                    field="workload",
                )
            if local is not None:
                preset = self.actuator.preset  # a simulated device's own, else --device's
                check_schedule(
                    local,
                    freqs_mhz=self.actuator.supported_freqs_mhz(),
                    device=preset if preset is not None else device,
                    n_ops=len(self.work) if self.work is not None else None,
                    source=str(schedule),
                )
            twin = self.actuator.twin
            timing = None
            if timeline is not None and trigger == "auto":
                trigger = "op"
                self.trigger_line = (
                    f"trigger: op (auto: {actuator} runs on virtual time, which only the "
                    "operators advance)"
                )
            if local is not None and trigger != "op":
                try:
                    timing = plan_timing(local, device=twin, workload=self.work)
                except ValidationError:
                    if trigger == "time":
                        raise
            if trigger == "auto":
                spec = twin.spec if twin is not None else preset_spec(device or local_device(local))
                latency_ms = (
                    spec.switch_latency_ms
                    if spec is not None
                    else (local.switch_latency_ms if local is not None else 0.0)
                )
                trigger, why = choose_trigger(timing, latency_ms * 1e-3)
                self.trigger_line = f"trigger: {trigger} (auto: {why})"
            elif self.trigger_line is None:
                self.trigger_line = f"trigger: {trigger}"
            if trigger == "time":
                self.executor = TimedExecutor(
                    plan,
                    self.actuator,
                    timing=timing if plan is not None else None,
                    device=twin,
                    workload=self.work,
                    optimizer_steps=optimizer_steps,
                )
            else:
                names = self.work.ops["name"].tolist() if self.work is not None else None
                self.executor = ScheduleExecutor(
                    plan, self.actuator, names=names, optimizer_steps=optimizer_steps
                )
        except BaseException:
            self.actuator.close()
            raise

    def _own(self, document: Schedule | PipelineSchedule | None) -> Schedule | None:
        """Return this rank's schedule: the file's, or its pipeline stage's (``--rank-map``)."""
        if isinstance(document, PipelineSchedule):
            return document.for_rank(self.rank, self.world, self.rank_map)
        return document

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Session:
        """Build a session from :func:`~opdvfs.runtime.launch.activation_env`'s settings."""
        return cls(**settings)

    @property
    def mode_object(self) -> Any:
        """The dispatch mode in use: the recorder (capture) or the executor (run)."""
        return self.recorder if self.recorder is not None else self.executor

    def __enter__(self) -> Self:
        """Enter the actuator, its clock guard, the recorder/executor and the marker."""
        stack = self._stack
        try:
            if self.executor is not None:
                stack.enter_context(self.actuator)
                if self.share:
                    from opdvfs.runtime.distributed import share_schedule_on_group_init

                    stack.enter_context(
                        share_schedule_on_group_init(
                            self.executor, self.document, rank_map=self.rank_map
                        )
                    )
                self.guard = ClockGuard(self.actuator, before_restore=self.executor.halt)
                stack.enter_context(self.guard)
            mode = self.mode_object
            stack.enter_context(mode)
            if self.marker is not None:
                stack.enter_context(self.marker.calling(self._iteration_end(mode)))
        except BaseException:
            stack.close()
            raise
        return self

    def _iteration_end(self, mode: Any) -> Callable[[], None]:
        """Return what ends an iteration at ``--iteration-at``: a simulated GPU's, then mode's."""
        if self.executor is None or self.actuator.timeline is None:
            return mode.mark_iteration
        actuator = self.actuator

        def both() -> None:
            actuator.mark_iteration()
            mode.mark_iteration()

        return both

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave everything in reverse order: the clock is restored last.

        The program's exception reaches the guard, so a refused restore never replaces it.
        """
        self._stack.__exit__(exc_type, exc, tb)

    # ------------------------------------------------------------------------------ outcome
    def outcome(self) -> Outcome:
        """Return what to print after the program, and the error to end with (if any)."""
        if self.recorder is not None:
            return self._capture_outcome()
        return self._run_outcome()

    def _capture_outcome(self) -> Outcome:
        assert self.recorder is not None
        if self.world > 1 and self.rank != 0:
            return Outcome((), mode="capture")  # rank 0 writes the workload
        try:
            work = self.recorder.workload(self.name)
        except CaptureError as exc:
            hint = "" if self.marker is None else f" and {self.marker.spec} was never called"
            return Outcome((), f"{exc}{hint}", mode="capture")
        if self.out is not None:
            work.write(self.out)
        lines = [
            f"wrote {self.out}: {len(work)} operators per iteration "
            f"({work.meta['iterations_seen']} iterations seen)"
        ]
        data = {
            "out": None if self.out is None else str(self.out),
            "operators": len(work),
            "iterations_seen": work.meta["iterations_seen"],
            "compiled": bool(self.recorder.compile_seen),
        }
        if self.recorder.compile_seen:
            lines.append(
                "the model uses torch.compile: these are its eager operators (Dynamo does not "
                "compile under capture's dispatch mode, so the model ran uncompiled); "
                "`run --trigger op` counts the same ones, `--trigger time` keeps it compiled"
            )
        return Outcome(tuple(lines), mode="capture", data=data)

    def _run_outcome(self) -> Outcome:
        from opdvfs.runtime.dispatch import COMPILED_HINT
        from opdvfs.runtime.timed import TimedExecutor

        executor = self.executor
        assert executor is not None
        lines: list[str] = [self.trigger_line] if self.trigger_line else []
        data: dict[str, Any] = {"actuator": self.actuator.kind}
        steady = executor.per_iteration()
        clock, time_f, energy_f = "host clock", ".4f", ".2f"
        timeline = self.actuator.timeline
        if timeline is not None:
            # the simulated GPU's own timeline; the energy is the same counter the executor read
            steady = {**steady, "time_s": timeline.per_iteration()["time_s"]}
            clock = f"virtual time of the simulated GPU {self.actuator.kind}"
            time_f = energy_f = ".6g"
        data.update(
            time_s=steady["time_s"], energy_j=steady["energy_j"], virtual=timeline is not None
        )
        if steady["time_s"] is not None:
            energy = steady["energy_j"]
            lines.append(
                f"iterations after the first: {steady['time_s']:{time_f}} s each ({clock})"
                + (
                    f", {energy:{energy_f}} J each (the device's energy counter)"
                    if energy is not None
                    else ""
                )
            )
        if executor.schedule is None:
            lines.append(
                f"rank {self.rank}: the script never created a process group, so no schedule "
                "arrived from rank 0 and nothing was applied"
            )
            return Outcome(tuple(lines), data=data)
        data.update(
            iterations=executor.iteration,
            diverged=len(executor.diverged_iterations),
            abandoned=bool(executor.abandoned),
            applied_iterations=executor.applied_iterations,
        )
        lines.append(
            f"ran {executor.iteration} iterations; diverged in {len(executor.diverged_iterations)}"
            + (", schedule abandoned" if executor.abandoned else "")
        )
        if isinstance(executor, TimedExecutor) and executor.timing is not None:
            scales = executor.scales or [1.0]
            lines.append(
                f"time mode: {len(executor.timing.issue_s)} switches per iteration issued by time "
                f"from each iteration's anchor (stage starts from the {executor.timing.source}, "
                f"{executor.timing.iteration_s:.4g} s planned; offsets scaled by "
                f"{min(scales):.3f}-{max(scales):.3f})"
            )
        elif getattr(executor, "compile_seen", 0):
            lines.append(COMPILED_HINT)
        twin = self.actuator.twin
        if twin is not None and self.work is not None:
            issued, top = self.actuator.replay(self.work)
            data["twin"] = {
                "device": twin.spec.name,
                "slowdown": issued.iteration_time_s / top.iteration_time_s - 1,
                "chip_energy_change": issued.chip_energy_j / top.chip_energy_j - 1,
                "switches": issued.switches,
            }
            lines.append(
                f"on the twin ({twin.spec.name}, simulated, "
                f"{twin.spec.switch_latency_ms:g} ms switches): the switches as "
                f"issued take {issued.iteration_time_s / top.iteration_time_s - 1:+.2%} time, "
                f"{issued.chip_energy_j / top.chip_energy_j - 1:+.2%} chip energy, "
                f"{(issued.core_energy_j or 0) / (top.core_energy_j or 1) - 1:+.2%} core energy "
                f"vs the top clock ({issued.switches} switches/iteration)"
            )
        error = None
        if executor.applied_iterations == 0:
            if executor.iteration == 0:
                how = (
                    f"{self.marker.spec} was never called"
                    if self.marker is not None
                    else "no optimizer step was seen; mark iterations with --iteration-at "
                    "MODULE:FUNCTION"
                )
                error = f"the schedule was never applied: no iteration ended ({how})"
            elif isinstance(executor, TimedExecutor):
                error = "the schedule was never applied: " + (
                    f"no iteration's length matched the plan ({executor.first_divergence})"
                    if executor.first_divergence
                    else f"--trigger time anchors iterations at their ends, so it applies "
                    f"from the second one, and {executor.iteration} ended"
                )
            elif executor.abandoned:
                error = (
                    f"the schedule was abandoned: none of the {executor.iteration} iterations "
                    f"matched it ({executor.first_divergence}); the clock stayed at the maximum"
                )
        if error is not None and self.guard is not None and self.guard.signals:
            # the program caught a signal and ended by itself (a preemption handler): its
            # own exit status stands, and a line says what the run did not do
            name = signal.Signals(self.guard.signals[0]).name
            lines.append(f"{name} received and the program ended by itself: {error}")
            error = None
        return Outcome(tuple(lines), error, data=data)

    def write_report(self) -> None:
        """Write this process's :class:`Outcome` into ``report_dir`` (launched processes)."""
        if self.report_dir is None:
            return
        try:
            outcome = self.outcome()
            record: dict[str, Any] = {
                "lines": list(outcome.lines),
                "error": outcome.error,
                "mode": outcome.mode,
                "data": outcome.data,
            }
        except Exception as exc:  # the parent reports it; the program's own status stands
            record = {"lines": [], "error": str(exc), "mode": self.mode}
        record.update(rank=self.rank, pid=os.getpid())
        path = Path(self.report_dir) / f"{self.rank:05d}-{os.getpid()}.json"
        write_text_atomic(path, json.dumps(record))
        sys.stdout.flush()
