"""The closed loop's phase machine: :class:`Tuner`, entered around the user's program.

One run of the user's unchanged script goes through these phases, each between two of its
iterations (an iteration ends at an optimizer step; :mod:`opdvfs.tuner` has the whole story):
**warm-up** at the top clock, which identifies the job for the cache
(:func:`~opdvfs.tuner.cache.cache_key`; a cached schedule applies at once, phase ``steady``);
**profiling** at a few clocks (the sweep of :mod:`opdvfs.runtime.sweep`; with ``auto`` clocks,
one more where active profiling names one: :meth:`Tuner._may_add`); **planning** in a
background thread while the program trains at the top clock (:mod:`opdvfs.tuner.planning`);
**A/B measurement** of each plan in blocks alternating with top-clock blocks
(:mod:`opdvfs.tuner.ab`); **re-plan** at another budget when the measured slowdown misses the
target; **steady**: the chosen round applies for the rest of the run. Every choice among these
is the policy's (:mod:`opdvfs.tuner.policy`); how the program is reached, timed and applied to
is the drive's, chosen once (:mod:`opdvfs.tuner.drive`: a simulated GPU or a device); under
torchrun rank 0 leads and the others follow (:mod:`opdvfs.tuner.ranks`).

A failure of the tuner's own never reaches the program: it becomes the result's error and the
program trains on at the top clock. Every exit path ends with exactly one restore of the clock
(:class:`~opdvfs.runtime.actuators.ClockGuard`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

import opdvfs.tuner.policy as policy
from opdvfs.exceptions import ValidationError
from opdvfs.runtime.actuators import Actuator, ClockGuard
from opdvfs.runtime.checks import check_counts
from opdvfs.runtime.sweep import SweepTraces, sweep_profile
from opdvfs.schedule import Objective, PipelineSchedule, Schedule
from opdvfs.tuner.ab import DEFAULT_BLOCK, abba_blocks, measured_round
from opdvfs.tuner.cache import TuneCache, cache_key
from opdvfs.tuner.drive import make_drive
from opdvfs.tuner.planning import PlanningThread, RoundToMeasure
from opdvfs.tuner.ranks import Decision, Measurement, Ranks
from opdvfs.tuner.report import round_line
from opdvfs.tuner.result import TuneIteration, TuneResult

if TYPE_CHECKING:
    from opdvfs.plan.active import ClockToMeasure
    from opdvfs.runtime.profiling import Traced

__all__ = ["Tuner"]

#: The library's diagnostics (``logging.getLogger("opdvfs")``): a line per phase change and
#: per measured round at INFO; silent unless the application configures logging.
log = logging.getLogger("opdvfs")


def _version() -> str | None:
    """Return the installed opdvfs's version (None: not installed as a distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opdvfs")
    except PackageNotFoundError:
        return None


class Tuner:
    """Tune a running program's clocks (see :mod:`opdvfs.tuner`): enter it around the program.

    Build it through :class:`opdvfs.tune` (Python) or ``opdvfs tune`` (the command), which
    choose the actuator and the cache; build it directly to hand it an actuator of your own.

    Parameters
    ----------
    actuator
        A :class:`~opdvfs.runtime.actuators.SimGpuActuator` (the program runs on the simulated
        GPU) or a real device's (NVML, zeusd: traced with torch.profiler and NVML during the
        sweep; the plans applied by time) or a dry run (clocks only recorded: measuring the GPU
        through its NVML ``meter`` like a real device, or without one the CPU's op times and
        no energy counter, so nothing to plan on: the run ends in the planning phase with an
        error in the result). Entered and closed here.
    target
        Allowed measured slowdown (0.02 = 2%).
    clocks
        Clocks to profile (MHz), or ``"auto"`` (:func:`~opdvfs.tuner.policy.profile_clocks`),
        to which active profiling may add one where the plan would use it
        (:func:`~opdvfs.tuner.policy.added_clock`; a single program or a data-parallel job,
        on a simulated GPU or a device; not a pipeline job: :meth:`_may_add`).
    warmup, iterations_per_clock
        As :class:`~opdvfs.runtime.sweep.ClockSweep`.
    block
        Iterations per A/B block (its first one discarded: >= 2); None: sized when the sweep
        ends (:func:`~opdvfs.tuner.policy.block_size`).
    pairs
        Reference/tuned block pairs per round (>= 2 for an interval).
    rounds
        Most plans measured: :func:`~opdvfs.tuner.policy.fit_budget`'s, and the best static
        clock's as the last of them when ``static`` (:func:`~opdvfs.tuner.policy.split_rounds`).
    static
        Measure the best single static clock (``nvidia-smi -lgc``) as a contender, applied when
        it wins.
    objective, interval_ms
        As ``opdvfs plan``.
    cache
        Where measured schedules are kept (None: no cache).
    on_iteration
        Called after each iteration with :meth:`status` (a progress display).
    label
        The actuator's name in the result (default: its kind).
    command
        The command recorded in the result (default: ``sys.argv``).
    """

    def __init__(
        self,
        actuator: Actuator,
        *,
        target: float,
        clocks: Sequence[float] | Literal["auto"] = "auto",
        warmup: int = 2,
        iterations_per_clock: int | None = None,
        block: int | None = None,
        pairs: int = 3,
        rounds: int = 4,
        static: bool = True,
        objective: Objective = policy.OBJECTIVE,
        interval_ms: float = policy.INTERVAL_MS,
        cache: TuneCache | None = None,
        on_iteration: Callable[[dict[str, Any]], None] | None = None,
        label: str | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        if not 0 < target <= 1:
            raise ValidationError(
                f"target {target}: expected a slowdown budget as a fraction in (0, 1] (0.02 = 2%)",
                field="target",
            )
        check_counts(
            pairs=pairs,
            rounds=rounds,
            block=block,
            warmup=warmup,
            iterations_per_clock=iterations_per_clock,
        )
        if block is not None and block < 2:
            raise ValidationError(f"block {block}: expected at least 2", field="block")
        if pairs < 1:
            raise ValidationError(f"pairs {pairs}: expected at least 1", field="pairs")
        if warmup < 1:
            raise ValidationError(f"warmup {warmup}: expected at least 1", field="warmup")
        self.actuator = actuator
        self.target, self.pairs = target, pairs
        #: Iterations per A/B block; None: sized when the sweep ends (:meth:`_sweep_done`).
        self.block_given = block
        self.block = block if block is not None else DEFAULT_BLOCK
        self.cache = cache
        self.on_iteration = on_iteration
        chosen = policy.profile_clocks(actuator.supported_freqs_mhz(), clocks)
        self._auto_clocks = tuple(chosen)  # (active profiling may add to them)
        #: Whether active profiling may add clocks to the sweep (:meth:`_may_add`).
        self._active = clocks == "auto"
        #: Off the simulated GPU, once the sweep was extended: its traces so far, in order.
        self._sweep_traces: list[Traced] = []
        #: Off the simulated GPU: active profiling's choice, being made on the sweep's trace.
        self._deciding: _AddedClockChoice | None = None
        #: Rank 0: the clock active profiling added and why, sent once to the others.
        self._added_to_send: tuple[float, str] | None = None
        for f in chosen:
            actuator.check_freq_mhz(float(f))
        self.kind = label or actuator.kind
        self.warmup = warmup
        self.op_names: list[str] = []
        self._stack = ExitStack()
        try:
            #: How the loop reaches the program: a simulated GPU or a device, chosen once.
            self.drive = make_drive(actuator, self, stack=self._stack)
            self.sweep = self.drive.make_sweep(
                chosen,
                warmup=warmup,
                iterations_per_clock=iterations_per_clock,
                on_done=self._sweep_done,
                more=self._added_clock if clocks == "auto" else None,
            )
        except BaseException:
            self._stack.close()
            raise
        self.top_mhz = self.drive.top_mhz
        self.executor = self.drive.executor
        self.guard = ClockGuard(actuator, before_restore=self.drive.halt)
        self.sweep.optimizer_steps = False  # driven from the executor's iteration ends
        self.phase: str = "warmup"
        self.result = TuneResult(
            target, self.kind, self.drive.device, self.sweep.freqs_mhz, iterations=[], pairs=pairs
        )
        supported = actuator.supported_freqs_mhz()
        self.result.range_mhz = (float(min(supported)), float(max(supported)))
        self.result.version = _version()
        self.result.command = list(sys.argv if command is None else command)
        self.planning = PlanningThread(
            self.result,
            target=target,
            rounds=rounds,
            objective=objective,
            interval_ms=interval_ms,
            blocks=lambda: abba_blocks(self.pairs, self.block),
            cache=lambda: self.cache,
            kind=self.kind,
            static=static,
            supported_mhz=supported,
            device=self.drive.device,
        )
        self.ranks = Ranks()
        self._last_end_s = 0.0
        self._last_energy_j: float | None = None
        self._measurement: RoundToMeasure | None = None
        self._cache_check: RoundToMeasure | None = None  # the round re-measuring a cached plan
        self._followed: Schedule | None = None
        #: A pipeline job whose stages are planned together (:mod:`opdvfs.tuner.stages`).
        self.stages = False
        #: Rank 0, once its sweep is done: the swept iterations' clocks, sent once to the others.
        self._counted_to_send: dict[int, float] | None = None
        #: Rank 0: the stages' profiles are to be gathered at the next iteration end.
        self._gather_stages = False
        #: Another rank, until the sweep is done: each iteration's (start, end) on its clock.
        self._spans: dict[int, tuple[float, float]] = {}

    @property
    def rank(self) -> int:
        """Return this process's rank in the job (0 without a process group)."""
        return self.ranks.rank

    @property
    def n_launches(self) -> int | None:
        """Operators the executor counted in the last warm-up or profiled iteration."""
        return self.drive.n_launches

    def _energy_j(self) -> float | None:
        try:
            energy = self.actuator.read_energy_j()
        except Exception:  # a failed read leaves a gap
            return None
        return None if energy is None else float(energy)

    # ------------------------------------------------------------------------- entering
    def __enter__(self) -> Tuner:
        """Enter the actuator, its guard, the executor and the sweep (top clock locked)."""
        stack = self._stack
        # the planner's rounds need scipy.stats (their t-intervals): imported before the first
        # iteration, not in the planning phase, where its load (0.5 s on an H200's host, 2.4 s
        # on a loaded CPU) kept the job at the top clock for iterations that planned nothing
        importlib.import_module("scipy.stats")
        try:
            stack.enter_context(self.actuator)
            stack.enter_context(self.guard)
            stack.callback(self.planning.stop)  # before the guard restores: no switch after it
            self.drive.enter(stack)
            stack.enter_context(self.sweep)
            self._last_end_s = self.drive.now_s()
            self._last_energy_j = self._energy_j()
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        """Stop the planning thread, leave the executor, restore the clock once.

        Raises
        ------
        ClockNotRestoredError
            If the final restore was refused and the program raised nothing of its own.
        """
        try:
            self._stack.__exit__(*exc)  # the guard sees the program's exception: it wins
        finally:
            if exc and exc[0] is not None and self.ranks.job is not None:
                self.ranks.job.leave()  # the others stop waiting for this rank
            self._conclude()

    def _conclude(self) -> None:
        self.result.timeline = self.drive.timeline(self.result.iterations)
        if self.result.error is not None or self.result.schedule is not None:
            return
        if self.ranks.job is None and self.ranks.waits_for_group():
            self.result.error = (
                f"rank {self.rank}: the script never created a process group, so this rank "
                "could not follow rank 0's tuning: it ran at the top clock"
            )
            return
        if self.phase in ("warmup", "profiling"):
            self.result.error = self.sweep_incomplete()
        elif self.phase != "top" and not (self.phase == "steady" and self.ranks.job is not None):
            # (a rank whose operators are not rank 0's runs the steady phase at the top clock)
            self.result.error = (
                f"the script ended after {len(self.result.iterations)} iterations, while "
                f"tuning was {self.phase} (round {len(self.result.rounds) + 1}): no schedule "
                "was chosen; run it longer"
            )

    @property
    def sweep_unfinished(self) -> bool:
        """Whether the run ended before its clock sweep was done: no profile, nothing to write.

        (A run from the cache skips the sweep: it is not unfinished.)
        """
        return self.phase in ("warmup", "profiling") and self.result.schedule is None

    def sweep_incomplete(self) -> str:
        """One line: the iterations the script had and those the sweep needs."""
        done = len(self.result.iterations)
        return (
            f"the script ended after {done} iterations, before tuning was done: profiling "
            f"alone needs {self.sweep.needed_iterations()} ({self.warmup} warm-up, "
            f"{self.sweep.per_clock or '?'} per clock at {len(self.sweep.freqs_mhz)} clocks and "
            "those a switch discards); run it longer or lower --iterations-per-clock"
        )

    # ------------------------------------------------------------------------- per iteration
    def recording(self, iteration: int) -> bool:
        """Whether the operators of ``iteration`` make the cache key (the last warm-up one)."""
        return iteration == self.warmup - 1 and self.result.cache_key is None

    def iteration_ended(self, iteration: int, n_ops: int) -> None:
        """Record the iteration that ended and move the run on (the executor's hook).

        A failure of the tuner's own never reaches the program: it is the result's error,
        and the program trains on at the top clock. Under torchrun every rank calls this at
        the same iteration end: the job's time and energy are reduced, rank 0 moves the run
        on and the others follow what it broadcasts (:mod:`opdvfs.tuner.ranks`).
        """
        try:
            self._iteration_end(iteration, n_ops)
        finally:
            try:
                self.drive.iteration_done()
            except Exception as exc:
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.result.error = f"tuning stopped: {type(exc).__name__}: {exc}"
        self._stop_tuning()

    def _iteration_end(self, iteration: int, n_ops: int) -> None:
        ranks = self.ranks
        if ranks.join():
            self.result.world_size = ranks.job.world_size  # type: ignore[union-attr]
            if ranks.rank != 0:
                self.cache = None  # rank 0 alone reads and writes it
        job = ranks.job
        start_s = self._last_end_s
        measured = self._measure_iteration()
        if self.phase in ("warmup", "profiling") and job is not None and not job.leader:
            # a stage's first rank places its trace's operators in the swept iterations
            self._spans[iteration] = (start_s, self._last_end_s)
        if job is not None:
            try:
                measured, same = ranks.measure(
                    job,
                    iteration,
                    measured,
                    abandoned=self.executor.abandoned,
                    op_names=self.op_names,
                    compare_at=self.warmup - 1,
                    work_s=self.drive.work_s(iteration) if iteration == self.warmup - 1 else None,
                )
                if same is not None:
                    self.result.same_sequence = same
                    if not same:
                        # pipeline stages: every rank follows the sweep, applies its stage's plan
                        # (the cache keys every stage's sequence: _from_cache)
                        self.stages = job.follows_plan = True
                        assert job.view is not None  # (set by the comparison)
                        self.result.pipeline_stages = len(job.view.stage_leads)
                    leads = job.view.stage_leads if job.view is not None else [0]
                    if not job.leader and not (self.stages and self.rank in leads):
                        self.drive.follower()  # rank 0's sweep (or its stage lead's) is profiled
            except Exception as exc:
                self._lost_job(exc)
                job = None
        if job is not None and not job.leader:
            try:
                self._follow(job, iteration, n_ops, measured)
            except Exception as exc:
                self._lost_job(exc)
            self._report()
            return
        if job is None and ranks.waits_for_group():
            self.result.iterations.append(
                TuneIteration(iteration, self.phase, None, measured[0], measured[1])
            )
            return
        try:
            if self._gather_stages and job is not None:
                self._plan_stages(job)
            self._iteration_ended(iteration, n_ops, measured)
        except Exception as exc:
            self._fail(exc)
        if job is not None:
            try:
                self._lead(job, iteration)
            except Exception as exc:
                self._lost_job(exc)
        self._report()

    def _measure_iteration(self) -> Measurement:
        """Return this iteration's time and energy on this device (job-wide: see ranks)."""
        now = self.drive.now_s()
        energy = self._energy_j()
        used_j = (
            energy - self._last_energy_j
            if energy is not None and self._last_energy_j is not None
            else None
        )
        time_s = now - self._last_end_s
        self._last_end_s, self._last_energy_j = now, energy
        return time_s, used_j, None, None

    # ------------------------------------------------------------------------- torchrun
    def _plan_stages(self, job: Any) -> None:
        """Rank 0: gather every stage's profile and start planning the stages together.

        The other stages' first ranks posted theirs before this iteration's exchange.
        """
        from opdvfs.tuner.stages import gather_stage_profiles

        self._gather_stages = False
        counted = {r.iteration: r.freq_mhz for r in self.sweep.records if r.phase == "counted"}
        own = self.drive.stage_profile(counted)
        gathered = gather_stage_profiles(job, own, self.drive.plan_launches())
        assert gathered is not None  # (no stop: it waited in the store)
        self.planning.start_stages(lambda: gathered, job.view.rank_map)

    def _traced_stages(self, job: Any, trace: Any) -> Any:
        """Rank 0 off the simulated GPU, in the planning thread: every stage's traced profile.

        Its own from its sweep's trace; the others' as their first ranks post them (each
        imports its own trace of the sweep: :meth:`DeviceDrive.build_stage_profile`).
        """
        from opdvfs.runtime.sweep import sweep_profile
        from opdvfs.tuner.stages import gather_stage_profiles

        own = sweep_profile(self.sweep, trace.load() if trace is not None else None)
        return gather_stage_profiles(job, own, None, stop=self.planning.aborted.is_set)

    def _send_stage_profile(self, job: Any, counted: dict[int, float]) -> None:
        """Post this stage's profile of the sweep for rank 0 (a stage's first rank, not 0).

        One that cannot be built is posted as its error line: rank 0's planning fails with
        it, and every rank goes on at the top clock.
        """
        from opdvfs.tuner.stages import send_stage_failure, send_stage_profile

        def done(profile: Any, error: str | None) -> None:
            try:
                if profile is None:
                    send_stage_failure(job, f"rank {self.rank}: {error}")
                    return
                self.result.profile = profile
                send_stage_profile(job, profile, self.drive.plan_launches())
            except Exception as exc:  # (from a thread off the simulator) the job was lost
                log.warning("tune: rank %d could not post its stage's profile: %s", self.rank, exc)

        spans, self._spans = self._spans, {}
        self.drive.build_stage_profile(counted, spans, done)

    def _lost_job(self, exc: BaseException) -> None:
        self.result.error = self.ranks.lose(exc)
        self._stop_tuning()
        if self.rank != 0:
            with contextlib.suppress(Exception):
                self.drive.follower()  # a trace kept for a stage's profile: no longer needed

    def _lead(self, job: Any, iteration: int) -> None:
        """Rank 0: send what this iteration end decided (phase, clock, schedule) to the others."""
        record = self.result.iterations[-1]
        this = record.iteration == iteration
        sweeping = self.phase in ("warmup", "profiling") and not self.sweep.done
        self.ranks.lead(
            job,
            Decision(
                iteration=iteration,
                phase=record.phase if this else self.phase,
                round=record.round if this else None,
                next=self.phase,
                freq_mhz=None,
                schedule=self.drive.applied_schedule(),
                error=self.result.error,
                cache_key=self.result.cache_key,
                cache_hit=self.result.cache_hit,
                counted=self._counted_to_send,
                added=self._added_to_send,
            ),
            top_mhz=self.top_mhz,
            sweeping_mhz=self.sweep.set_mhz if sweeping else None,
            pipeline=self.planning.pipeline_of(self.drive.applied_schedule()),
        )
        self._counted_to_send = self._added_to_send = None

    def _follow(self, job: Any, iteration: int, n_ops: int, measured: Measurement) -> None:
        """Take rank 0's decision for this iteration end, and apply it (the other ranks)."""
        self.drive.n_launches = n_ops  # (if the ranks lose each other: the top clock by operator)
        d = self.ranks.follow(job, iteration)
        self.result.iterations.append(
            TuneIteration(
                iteration,
                d.phase,
                self.actuator.current_mhz,
                measured[0],
                measured[1],
                d.round,
                measured[2],
                measured[3],
                *self._ranks_figures(job),
            )
        )
        if d.added is not None:  # the clock rank 0 added to the sweep, which this rank follows
            self.result.clocks_mhz = (*self.result.clocks_mhz, d.added[0])
            self.result.added_clock = d.added[1]
        if self.stages and d.counted is not None and job.rank in job.view.stage_leads:
            self._send_stage_profile(job, d.counted)
        elif d.counted is None and d.next not in ("warmup", "profiling"):
            self.drive.follower()  # no sweep of rank 0's to profile (a cached plan, an error)
        if self.stages and d.schedule is not None and not d.staged:
            self.drive.apply_top()  # rank 0's reference block: the top clock on this stage's ops
        elif job.follows_plan:
            if d.schedule is not None:
                self._followed = d.schedule
                self.drive.apply(d.schedule)
            elif d.freq_mhz is not None:
                self.drive.follow_clock(iteration, float(d.freq_mhz))
        self.phase = d.next
        self.result.error = self.result.error or d.error
        self.result.cache_key, self.result.cache_hit = d.cache_key, d.cache_hit
        # rank 0's choice: steady, or a cached plan under its brief re-measure (and not dropped)
        if job.follows_plan and (self.phase == "steady" or (d.cache_hit and d.error is None)):
            self.result.schedule = self._followed

    @staticmethod
    def _ranks_figures(job: Any) -> tuple[list[float] | None, list[float | None] | None]:
        """Every rank's time and energy of the iteration just exchanged (None off torchrun)."""
        if job is None or not job.ranks_time_s:
            return None, None
        return list(job.ranks_time_s), list(job.ranks_energy_j)

    # ------------------------------------------------------------------------- the phases
    def _stop_tuning(self) -> None:
        self._measurement = None
        self.planning.aborted.set()
        self.drive.to_top()
        self.phase = "top"

    def _iteration_ended(self, iteration: int, n_ops: int, measured: Measurement) -> None:
        job = self._measurement
        record = TuneIteration(
            iteration,
            self.phase,
            self.actuator.current_mhz,
            measured[0],
            measured[1],
            job.round if job is not None else None,
            measured[2],
            measured[3],
            *self._ranks_figures(self.ranks.job),
        )
        self.result.iterations.append(record)
        if self.phase == "top":
            return
        abandoned = self.executor.abandoned or self.ranks.peer_abandoned
        if abandoned and self.phase in ("switch", "reference", "tuned", "steady"):
            where = self.executor.first_divergence if self.executor.abandoned else "on another rank"
            self.result.error = (
                f"the program's operators changed ({where}): the "
                "schedule was abandoned and the run went on at the top clock"
            )
            self._stop_tuning()
            return
        if self.phase == "warmup" and iteration == self.warmup - 1:
            self.drive.n_launches = n_ops
            if self._from_cache():
                return
        if self.phase in ("warmup", "profiling"):
            # the operators per iteration the plan maps onto: the last profiled iteration's
            # (with --warmup 1 the first iteration, which often differs, is not the one)
            self.drive.n_launches = n_ops
            self.sweep.mark_iteration()
            # the sweep may have dropped a clock's oldest counted iterations as unsteady
            # (its window's temperature trend): their records follow
            phases = {r.iteration: r.phase for r in self.sweep.records}
            for row in reversed(self.result.iterations):
                if row.iteration not in phases:
                    break
                row.phase = phases[row.iteration]
            if not self.sweep.done:
                self.phase = "warmup" if self.sweep.iteration_s is None else "profiling"
            return
        if self.phase == "planning":
            self.drive.pace_planning(self.planning.ready.wait)
            if self._deciding is not None:
                self._take_added_clock(iteration)
                return
        if job is not None:
            self._advance_block(job)
        elif self.planning.waiting:
            self._start_measurement()
        elif self.planning.finished.is_set() and self.phase == "planning":
            steady = self.planning.steady
            if steady is not None:
                self._go_steady(steady)
            else:
                self._stop_tuning()

    def _report(self) -> None:
        if self.on_iteration is not None:
            with contextlib.suppress(Exception):  # a display never breaks the run
                self.on_iteration(self.status())

    def status(self) -> dict[str, Any]:
        """Return the run's state now: phase, clock, iterations left in the phase, saving."""
        left: int | None = None
        if self.phase in ("warmup", "profiling"):
            # an estimate: discards for an unsteady temperature come on top of it
            left = max(self.sweep.needed_iterations() - len(self.result.iterations), 1)
        elif self._measurement is not None:
            left = sum(b.left for b in self._measurement.blocks)
        saving = None
        for r in reversed(self.result.rounds):
            if r.saving is not None:
                saving = r.saving.mean
                break
        return {
            "phase": self.phase,
            "iteration": len(self.result.iterations),
            "freq_mhz": self.actuator.current_mhz,
            "left": left,
            "round": len(self.result.rounds),
            "saving": saving,
        }

    def _from_cache(self) -> bool:
        if self.n_launches is None:
            return False
        ranks: dict[str, Any] = (
            {"world_size": self.result.world_size} if self.result.world_size > 1 else {}
        )
        store = self.ranks.job
        view = store.view if store is not None else None
        if self.stages and view is not None:
            ranks["stages"] = list(view.keys)  # every rank's sequence: the whole job
        key = cache_key(
            self.op_names,
            target=self.target,
            objective=self.planning.objective,
            **self.drive.cache_identity(self.kind),
            **ranks,
        )
        self.result.cache_key = key
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None:
            return False
        schedule, measured = hit
        if isinstance(schedule, PipelineSchedule):
            if not self.stages or view is None:
                return False
            # this rank's stage's; the whole pipeline goes to the others (planning.pipeline_of)
            schedule = self.planning.adopt(schedule, view.rank_map)
        elif self.stages:
            return False
        if not policy.cached_applies(
            schedule,
            by_time=self.drive.by_time,
            n_launches=self.n_launches,
            supported_mhz=self.actuator.supported_freqs_mhz(),
        ):
            return False
        self.result.cache_hit = True
        self.result.cached = measured
        self.result.schedule = schedule
        # re-measured before it applies for the run: a brief A/B round (it was measured on
        # another run; an entry edited to the lowest clock would run +427% slower unseen)
        given = measured.get("block")
        if self.block_given is None and isinstance(given, int) and given >= 2:
            self.block = self.result.block = given
        job = RoundToMeasure(
            schedule, round=0, blocks=abba_blocks(policy.CACHE_CHECK_PAIRS, self.block)
        )
        self._cache_check = job
        self._measurement = job
        self._enter_block()
        return True

    def _top_iteration_s(self) -> float | None:
        """Return the top clock's iteration time (s): the median of its counted sweep iterations.

        Else the last warm-up iteration's (which often runs slower than the steady ones).
        """
        times = [
            r.end_s - r.start_s
            for r in self.sweep.records
            if r.phase == "counted" and r.freq_mhz == self.top_mhz
        ]
        return float(np.median(times)) if times else self.sweep.iteration_s

    def _may_add(self) -> bool:
        """Whether active profiling may add a clock to the sweep now.

        With ``auto`` clocks, up to :data:`~opdvfs.tuner.policy.ADDED_CLOCKS`, in a single
        program or a data-parallel job (rank 0 chooses on its profile, every rank follows its
        clock through the sweep, as through the ``auto`` clocks). Not in a pipeline job (ranks
        of other operators or work, :mod:`opdvfs.tuner.stages`): a clock is worth adding where
        one profile's plan would use it, and a pipeline's plan is the whole job's, made on every
        stage's profile, which rank 0 gathers only after the sweep.
        """
        added = len(self.sweep.freqs_mhz) - len(self._auto_clocks)
        if not self._active or added >= policy.ADDED_CLOCKS or self.stages:
            return False
        job = self.ranks.job
        if job is None:
            return not self.ranks.waits_for_group()
        return job.leader and job.view is not None and job.view.same_sequence

    def _choose_clock(self, profile: Any) -> ClockToMeasure | None:
        """Return active profiling's clock to add on the swept ``profile`` (None: none is worth it).

        :func:`~opdvfs.tuner.policy.added_clock` at the run's target; safe in another thread.
        """
        return policy.added_clock(
            profile,
            target=self.target,
            objective=self.planning.objective,
            interval_ms=self.planning.interval_ms,
            n_launches=self.drive.plan_launches(),
            spec=self.planning.clock_grid(profile),
        )

    def _added(self, choice: ClockToMeasure) -> float:
        """Record the clock added to the sweep (the result, the others' next decision)."""
        self.result.added_clock = choice.why()
        self.result.clocks_mhz = (*self.result.clocks_mhz, choice.freq_mhz)
        self._added_to_send = (choice.freq_mhz, choice.why())
        log.info("tune: also profiling %s", choice.why())
        return choice.freq_mhz

    def _added_clock(self) -> float | None:
        """Return one more clock for the sweep (its last is done) where active profiling names one.

        On a simulated GPU, whose records are the profile at once: chosen here, between two
        iterations. A real device's profile is its trace, read after the sweep: the clock is
        chosen in a thread while the program trains on, and the sweep extended then
        (:meth:`_take_added_clock`).
        """
        if self.drive.by_time or not self._may_add():
            return None
        counted = {r.iteration: r.freq_mhz for r in self.sweep.records if r.phase == "counted"}
        try:
            choice = self._choose_clock(self.drive.stage_profile(counted))
        except Exception as exc:  # the sweep goes on without it: the plan is as before
            log.warning("tune: active profiling found no clock to add: %s", exc)
            return None
        return None if choice is None else self._added(choice)

    def _choose_on_trace(self, trace: Traced | None) -> None:
        """Off the simulated GPU: choose a clock to add on the sweep's trace, in a thread.

        The program trains on at the top clock (phase ``planning``) until the choice is taken
        (:meth:`_take_added_clock`).
        """
        if trace is None:  # (a drive that read no trace: plan as it is)
            self._start_planning(None)
            return
        self._sweep_traces.append(trace)
        whole = SweepTraces(self._sweep_traces)

        def choose(choice: _AddedClockChoice) -> ClockToMeasure | None:
            try:
                measured = whole.load()
            except Exception as exc:  # as the planning thread says it (no plan without it)
                choice.unread = f"the sweep's trace could not be read: {exc}"
                raise
            if measured is None:
                raise ValueError("the sweep's trace holds no profile")
            return self._choose_clock(sweep_profile(self.sweep, measured))

        self._deciding = _AddedClockChoice(choose)

    def _take_added_clock(self, iteration: int) -> None:
        """Take active profiling's choice, once made: sweep the clock, or plan on the trace."""
        choice = self._deciding
        assert choice is not None
        if not choice.done.is_set():
            return
        self._deciding = None
        traces = self._sweep_traces
        if choice.unread is not None:
            self.result.error = choice.unread
            self._stop_tuning()
            return
        if choice.error is not None:  # the sweep goes on without it: the plan is as before
            log.warning("tune: active profiling found no clock to add: %s", choice.error)
        if choice.clock is None:
            self._sweep_traces = []
            self._start_planning(traces[0] if len(traces) == 1 else SweepTraces(traces))
            return
        # the clock set for the next iteration, as the sweep sets each (under the run's guard)
        self.sweep.extend(choice.clock.freq_mhz, iteration=iteration)
        self.drive.trace_more()  # from the next step's start: the added clock's first is settling
        self._added(choice.clock)
        self.phase = "profiling"

    def _start_planning(self, trace: Traced | None) -> None:
        """Plan on the sweep's profile in the planning thread (``trace``: a real device's)."""
        self.planning.start(self.sweep, trace, self.drive.plan_launches())

    def _sweep_done(self) -> None:
        """End the sweep (its last clock is done): train at the top clock, plan in a thread."""
        counter_s = self.sweep.sensor_s[0] if self.sweep.sensor_s is not None else None
        self.block, self.result.block_by = policy.block_size(
            self.block_given,
            exact_counter=self.drive.exact_counter,
            counter_s=counter_s,
            iteration_s=self._top_iteration_s() if counter_s is not None else None,
        )
        self.result.block = self.block
        self.actuator.set_freq_mhz(self.top_mhz)
        self.phase = "planning"
        log.info(
            "tune: profiled %s MHz in %d iterations; planning at the top clock",
            ", ".join(f"{f:g}" for f in self.sweep.freqs_mhz),
            len(self.result.iterations),
        )
        self.drive.planning_began()
        if self.stages:
            # every stage's profile first: its first rank builds it from these iterations
            self._counted_to_send = {
                r.iteration: r.freq_mhz for r in self.sweep.records if r.phase == "counted"
            }
            job = self.ranks.job
            if not self.drive.by_time or job is None:
                self._gather_stages = True
                return

            self.planning.iteration_s = self._top_iteration_s()  # (the stages' time by time)

            assert job.view is not None  # (the ranks' sequences were compared)
            rank_map = job.view.rank_map

            def traced(trace: Any) -> None:  # off the simulated GPU: read in the planning thread
                self.planning.start_stages(lambda: self._traced_stages(job, trace), rank_map)

            self.drive.after_sweep(traced, self._trace_failed)
            return
        if self.drive.by_time and self._may_add():
            # the trace read, a clock may be added (a further sweep step, traced anew)
            self.drive.after_sweep(self._choose_on_trace, self._trace_failed)
            return
        earlier, self._sweep_traces = self._sweep_traces, []

        def start(trace: Traced | None) -> None:  # (the traces before it: an extended sweep's)
            whole = SweepTraces([*earlier, trace]) if earlier and trace is not None else trace
            self._start_planning(whole)

        self.drive.after_sweep(start, self._trace_failed)

    def _trace_failed(self, error: str) -> None:
        """Record that the sweep's trace could not be had: the run's error (one line)."""
        self.result.error = error

    # ------------------------------------------------------------------------- A/B
    def _start_measurement(self) -> None:
        job = self.planning.take()
        if job is None:
            return
        if not self.drive.can_apply(job.schedule):
            # a schedule of other operators than the executor counts cannot apply by operator
            self.result.schedule = job.schedule
            self.result.error = (
                f"the schedule plans the trace's {job.schedule.n_ops} operators but the "
                f"executor counts {self.n_launches} per iteration, so it cannot apply it by "
                "operator: it was written, for `opdvfs run --trigger time`; the run went on at "
                "the top clock"
            )
            self._stop_tuning()
            return
        self._measurement = job
        self._enter_block()

    def _enter_block(self) -> None:
        job = self._measurement
        assert job is not None
        block = job.blocks[0]
        if block.kind == "tuned":
            self.drive.apply(job.schedule)
        else:
            self.drive.apply_top()
        self.phase = "switch"

    def _advance_block(self, job: RoundToMeasure) -> None:
        block = job.blocks[0]
        block.left -= 1
        if block.left <= 0:
            job.blocks.pop(0)
            if job.blocks:
                self._enter_block()
                return
            self._measurement = None
            self._close_round(job)
            return
        self.phase = block.kind

    def _close_round(self, job: RoundToMeasure) -> None:
        rows = [it for it in self.result.iterations if it.round == job.round]
        measured = measured_round(job.schedule, rows, drop=self.drive.fell_back())
        measured.static_mhz = job.static_mhz
        pipeline = self.planning.pipeline_of(job.schedule)
        if pipeline is not None:  # the job's prediction, as the A/B blocks measure the job
            from opdvfs.tuner.stages import job_saving

            measured.predicted_saving = job_saving(pipeline)
        self.result.rounds.append(measured)
        log.info("tune: %s", round_line(len(self.result.rounds) - 1, measured))
        job.measured = policy.Measured.of(measured)
        if job is self._cache_check:
            self._cache_check = None
            if policy.cached_holds(measured, self.target):
                self._go_steady(job.schedule)
            else:
                self._drop_cached(measured)
            return
        # until the next plan or the result: the top clock
        self.phase = "planning"
        self.drive.planning_began()
        self.drive.apply_top()
        job.done.set()

    def _drop_cached(self, measured: Any) -> None:
        """Drop the cached schedule that missed the target when re-measured; train at the top."""
        slow = measured.slowdown
        if self.cache is not None and self.result.cache_key:
            with contextlib.suppress(OSError):
                self.cache.path(self.result.cache_key).unlink()
        self.result.schedule = None
        self.result.error = (
            f"the cached schedule measured {slow.mean:+.1%} time (95% interval "
            f"{slow.low:+.1%} to {slow.high:+.1%}), past the {self.target:.1%} target: it was "
            "dropped from the cache and the run went on at the top clock (the next run tunes "
            "afresh)"
        )
        self._stop_tuning()

    def _go_steady(self, schedule: Schedule) -> None:
        self.drive.apply(schedule)
        self.phase = "steady"
        log.info(
            "tune: applying round %d from iteration %d for the rest of the run",
            (self.result.best_round or 0) + 1,
            len(self.result.iterations),
        )


class _AddedClockChoice:
    """Active profiling's choice off the simulated GPU, made in a thread (the trace is read).

    ``clock`` (None: none is worth adding), ``error`` (one line, or None) and ``unread`` (the
    trace could not be read: the run's error) are set before ``done``.
    """

    def __init__(self, choose: Callable[[_AddedClockChoice], ClockToMeasure | None]) -> None:
        self.clock: ClockToMeasure | None = None
        self.error: str | None = None
        self.unread: str | None = None
        self.done = threading.Event()
        threading.Thread(
            target=self._run, args=(choose,), name="opdvfs-tune-active", daemon=True
        ).start()

    def _run(self, choose: Callable[[_AddedClockChoice], ClockToMeasure | None]) -> None:
        try:
            self.clock = choose(self)
        except Exception as exc:  # the sweep goes on without it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()
