"""tune's planning thread: fit and plan while the program trains on, hand rounds to measure.

After the sweep the program trains on at the top clock while :class:`PlanningThread` fits the
models on the swept profile and plans, by the same functions ``opdvfs plan`` uses on a swept
profile (:func:`~opdvfs.plan.on_profile.fit_profile`,
:func:`~opdvfs.plan.on_profile.plan_fitted`), over the device's clocks within the swept range,
the models filling those not swept (:func:`~opdvfs.tuner.policy.clock_grid`). Each plan is
measured by the training thread: :func:`~opdvfs.tuner.policy.fit_budget`'s ``measure`` hands
a :class:`RoundToMeasure` over (its A/B blocks, :func:`~opdvfs.tuner.ab.abba_blocks`) and
waits until the training thread has run them and closed the round. When the budget loop ends,
the best static clock is planned on the same models (one stage:
:data:`~opdvfs.tuner.policy.STATIC_INTERVAL_MS`, at :func:`~opdvfs.tuner.policy.static_budget`)
and measured as one more round, the ``nvidia-smi -lgc`` contender
(:func:`~opdvfs.tuner.policy.split_rounds`); then the policy chooses the round that applies
for the rest of the run (:func:`~opdvfs.tuner.policy.choose_round`,
:func:`~opdvfs.tuner.policy.applies`), and the choice goes into the cache.

Threading: the two threads share only this object's events, its lock-guarded hand-over
(:meth:`PlanningThread.take`) and the run's result, which the planning thread writes before it
sets :attr:`~PlanningThread.finished`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from opdvfs.exceptions import OpdvfsError
from opdvfs.plan.on_profile import fit_profile, plan_fitted
from opdvfs.schedule import Objective, PipelineSchedule, Schedule
from opdvfs.tuner.ab import Block
from opdvfs.tuner.cache import TuneCache
from opdvfs.tuner.policy import (
    STATIC_INTERVAL_MS,
    BudgetFit,
    Measured,
    applies,
    choose_round,
    clock_grid,
    fit_budget,
    same_plan,
    split_rounds,
    static_budget,
)
from opdvfs.tuner.result import TuneResult

if TYPE_CHECKING:
    from opdvfs.devices.spec import DeviceSpec
    from opdvfs.profile import Profile
    from opdvfs.runtime.profiling import Traced
    from opdvfs.runtime.sweep import ClockSweep

__all__ = ["PlanningThread", "RoundToMeasure"]

log = logging.getLogger("opdvfs")


# ----------------------------------------------------------------------------- the thread
class Aborted(Exception):
    """The run ended before a measurement the planning thread waits for."""


#: What a planning thread plans with: the planner at a budget, the top clock (None: no static
#: round).
_Prepared = tuple[Callable[..., Schedule], float | None]


#: Every stage's profile and operators launched (None: a plan applied by time), stage 0 first.
_Stages = tuple[list["Profile"], list[int | None]]


class _NoProfile(Exception):
    """The sweep's profile could not be had (the message is the result's error)."""


@dataclass
class RoundToMeasure:
    """A plan handed to the training thread: its A/B blocks, and what they measured."""

    schedule: Schedule
    round: int
    blocks: list[Block]
    done: threading.Event = field(default_factory=threading.Event)
    measured: Measured | None = None
    #: The clock of the best static clock's round (MHz); None: a per-operator plan.
    static_mhz: float | None = None


class PlanningThread:
    """Fit, plan and re-plan in a background thread; the training thread measures each plan.

    Parameters
    ----------
    result
        The run's result: the thread writes the profile, models, planning time, the rounds'
        choice and any error into it.
    target, rounds, objective, interval_ms, static
        As :class:`~opdvfs.tuner.loop.Tuner` (``rounds`` counts the static clock's, when
        ``static`` is on: :func:`~opdvfs.tuner.policy.split_rounds`).
    blocks
        Returns the A/B blocks of the next round (the block length is known after the sweep).
    cache, cache_key
        Where the chosen schedule is kept (None: nowhere); the key is read when it is written.
    kind
        The actuator's name, for the error when its profile has no power.
    supported_mhz, device
        The clocks the device supports (the actuator's) and its name (None: ``kind``), planned
        over within the swept range (:meth:`clock_grid`).
    """

    def __init__(
        self,
        result: TuneResult,
        *,
        target: float,
        rounds: int,
        objective: Objective,
        interval_ms: float,
        blocks: Callable[[], list[Block]],
        cache: Callable[[], TuneCache | None],
        kind: str,
        static: bool = True,
        supported_mhz: Sequence[float] = (),
        device: str | None = None,
    ) -> None:
        self.result = result
        self.target = target
        self.rounds, self.static = split_rounds(rounds, static)
        #: Plans measured in all (a pipeline job's budget rounds: it has no static round).
        self.rounds_in_all = rounds
        self.objective: Objective = objective
        self.interval_ms = interval_ms
        self._blocks = blocks
        self._cache = cache
        self.kind = kind
        self.supported_mhz = tuple(float(f) for f in supported_mhz)
        self.device = device
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: RoundToMeasure | None = None
        self._rounds_started = 0
        self._steady: Schedule | None = None
        #: A pipeline job's planned schedules, by the id of their rank-0 stage's.
        self._pipelines: dict[int, PipelineSchedule] = {}
        #: A pipeline job's measured iteration at the top clock (s), for the stages applied by
        #: time (:func:`~opdvfs.tuner.stages.plan_stages`); None: not known.
        self.iteration_s: float | None = None
        #: Set when the run ended: a waiting ``measure`` gives up.
        self.aborted = threading.Event()
        #: Set once the thread has ended (planned, failed or aborted).
        self.finished = threading.Event()
        #: Set once the thread has a round for the training thread, or has ended.
        self.ready = threading.Event()

    # ------------------------------------------------------------------------- the training thread
    def start(self, sweep: ClockSweep, trace: Traced | None, n_launches: int | None) -> None:
        """Start planning on ``sweep``'s profile (``trace``: a real device's, loaded here)."""
        self._spawn(lambda: self._one_sequence(sweep, trace, n_launches))

    def start_stages(self, gather: Callable[[], _Stages | None], rank_map: list[int]) -> None:
        """Start planning a pipeline job's stages together (:mod:`opdvfs.tuner.stages`).

        ``gather``, called in the thread, returns each stage's profile and operators launched
        (None: applied by time), stage 0 (this rank's) first, or None once the run ended;
        ``rank_map``: the stage of each rank. Each round's schedule is this rank's stage's; the
        whole job's is :meth:`pipeline_of` it. No static-clock round: all ``rounds`` are
        budgets' (one clock for every stage is a plan the budget rounds can choose too).
        """
        self._spawn(lambda: self._stages(gather, rank_map))

    def pipeline_of(self, schedule: Schedule | None) -> PipelineSchedule | None:
        """Return the pipeline schedule whose rank-0 stage ``schedule`` is (None: not one)."""
        with self._lock:
            return self._pipelines.get(id(schedule)) if schedule is not None else None

    def adopt(self, pipeline: PipelineSchedule, rank_map: list[int]) -> Schedule:
        """Return rank 0's stage of ``pipeline`` (a cached one), known to :meth:`pipeline_of`."""
        lead = pipeline.for_rank(0, len(rank_map), rank_map)
        with self._lock:
            self._pipelines[id(lead)] = pipeline
        return lead

    def _spawn(self, prepare: Callable[[], _Prepared]) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(prepare,), name="opdvfs-tune-plan", daemon=True
        )
        self._thread.start()

    def take(self) -> RoundToMeasure | None:
        """Return the round the thread waits to have measured, once (None: none waits)."""
        with self._lock:
            job, self._pending = self._pending, None
            self.ready.clear()  # (set again when the thread has the next round)
        return job

    @property
    def waiting(self) -> bool:
        """Whether a round waits to be measured."""
        return self._pending is not None

    @property
    def steady(self) -> Schedule | None:
        """The schedule chosen for the rest of the run (None: none, or not yet)."""
        with self._lock:
            return self._steady

    def stop(self) -> None:
        """End the thread: a waiting ``measure`` gives up (30 s at most)."""
        self.aborted.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    def clock_grid(self, profile: Profile) -> DeviceSpec | None:
        """Return the clocks planned over on the swept ``profile``: the device's, within its range.

        :func:`~opdvfs.tuner.policy.clock_grid` on this run's device; safe in any thread
        (active profiling chooses on the same clocks).
        """
        return clock_grid(profile, self.supported_mhz, self.device or self.kind)

    # ------------------------------------------------------------------------- the thread
    def _one_sequence(
        self, sweep: ClockSweep, trace: Traced | None, n_launches: int | None
    ) -> _Prepared:
        """Profile and fit this rank's sweep; return the planner at a budget and the top clock.

        A real device's sweep trace is imported here (:meth:`Traced.load`), while the program
        trains on at the top clock.
        """
        from opdvfs.runtime.sweep import sweep_profile

        result = self.result
        try:
            measured = trace.load() if trace is not None else None
        except Exception as exc:
            raise _NoProfile(f"the sweep's trace could not be read: {exc}") from exc
        profile = sweep_profile(sweep, measured)
        result.profile = profile
        # the device's clocks within the swept range (the models fill those not swept): no
        # plan on extrapolated ones
        fitted = fit_profile(
            profile,
            objective=self.objective,
            n_launches=n_launches,
            spec=self.clock_grid(profile),
        )
        result.models = fitted.models

        def plan_at(budget: float, interval_ms: float = self.interval_ms) -> Schedule:
            t0 = time.perf_counter()
            # point values: each round's A/B measures the plan and the next re-plans
            schedule = plan_fitted(
                fitted,
                target=budget,
                objective=self.objective,
                interval_ms=interval_ms,
                conservative=False,  # (tune's A/B measures: it plans on point values)
            )
            result.plan_seconds += time.perf_counter() - t0
            return schedule

        return plan_at, float(max(fitted.inputs.freqs_mhz))

    def _stages(self, gather: Callable[[], _Stages | None], rank_map: list[int]) -> _Prepared:
        """Return the planner of every stage together at a budget (no static round)."""
        from opdvfs.tuner.stages import plan_stages

        gathered = gather()
        if gathered is None:
            raise Aborted
        profiles, n_launches = gathered
        result = self.result
        result.profile = profiles[0]
        self.rounds = self.rounds_in_all  # every round a budget's (no static-clock round)
        grid = self.clock_grid(profiles[0])  # (every stage swept the same clocks)

        def plan_at(budget: float) -> Schedule:
            t0 = time.perf_counter()
            pipeline = plan_stages(
                profiles,
                n_launches,
                budget,
                rank_map=rank_map,
                iteration_s=self.iteration_s,
                spec=grid,
            )
            lead = pipeline.for_rank(0, len(rank_map), rank_map)
            with self._lock:
                self._pipelines[id(lead)] = pipeline
            result.plan_seconds += time.perf_counter() - t0
            return lead

        return plan_at, None

    def _run(self, prepare: Callable[[], _Prepared]) -> None:
        """Prepare the planner (``prepare``), then :func:`fit_budget` over measured rounds.

        ``prepare`` returns the planner at a budget and, for the best static clock's round,
        the top clock (None: no static round).
        """
        result = self.result
        start = time.perf_counter()
        try:
            try:
                plan_at, top_mhz = prepare()
            except _NoProfile as exc:
                result.error = str(exc)
                return
            result.plan_seconds += time.perf_counter() - start
            fit = fit_budget(
                plan_at, self._measure, target=self.target, rounds=self.rounds, same=self._same
            )
            schedules = [r.schedule for r in fit.rounds]
            if self.static and top_mhz is not None:
                plan = plan_at(static_budget(fit), STATIC_INTERVAL_MS)
                clock = plan.stages[0].freq_mhz
                same = [
                    i
                    for i, r in enumerate(fit.rounds)
                    if [st.freq_mhz for st in r.schedule.stages] == [clock]
                ]
                if same:  # a per-operator plan of one clock is the static clock: not twice
                    result.rounds[same[0]].static_mhz = clock
                    log.info("tune: round %d is the best static clock, %g MHz", same[0] + 1, clock)
                elif len(plan.stages) == 1 and clock < top_mhz:
                    self._measure(plan, static_mhz=clock)
                    schedules.append(plan)
                else:
                    log.info("tune: the best static clock planned is the top clock: not measured")
        except Aborted:
            return
        except Exception as exc:  # the tuner's own failure never reaches the program
            hint = ""
            if result.profile is not None and result.profile.samples is None:
                hint = (
                    f" ({self.kind} measures no power: tune with nvml, zeusd or sim:PRESET, or "
                    "dry-run without --device where NVML finds the GPU CUDA trains on)"
                )
            what = "" if isinstance(exc, OpdvfsError | ValueError) else f"{type(exc).__name__}: "
            result.error = f"planning failed: {what}{exc}{hint}"
        else:
            self._finish(fit, schedules)
        finally:
            self.finished.set()
            self.ready.set()

    def _same(self, a: Schedule, b: Schedule) -> bool:
        """Whether two plans are the same: every stage's, for a pipeline job's."""
        pa, pb = self.pipeline_of(a), self.pipeline_of(b)
        if pa is None or pb is None:
            return same_plan(a, b)
        return len(pa.stages) == len(pb.stages) and all(
            same_plan(x, y) for x, y in zip(pa.stages, pb.stages, strict=True)
        )

    def _measure(self, schedule: Schedule, static_mhz: float | None = None) -> Measured:
        """:func:`fit_budget`'s ``measure``: wait for the training thread's A/B blocks."""
        job = RoundToMeasure(schedule, self._rounds_started, self._blocks(), static_mhz=static_mhz)
        self._rounds_started += 1
        with self._lock:
            self._pending = job
            self.ready.set()
        while not job.done.wait(0.05):
            if self.aborted.is_set():
                raise Aborted
        assert job.measured is not None
        return job.measured

    def _finish(self, fit: BudgetFit, schedules: list[Schedule]) -> None:
        """Apply the policy's choice among the measured rounds; keep it in the cache.

        ``schedules``: every measured round's, in order (fit_budget's, then the static clock's).
        """
        result = self.result
        # every measure closed one round, in order; the choice is the policy's (by the
        # saving's lower bound, not fit_budget's mean), the static clock a contender like any
        assert len(result.rounds) == len(schedules) >= len(fit.rounds)
        index, met, result.chosen_by = choose_round(result.rounds, self.target)
        schedule = schedules[index]
        result.best_round = index
        result.met = met
        chosen = result.rounds[index]
        if applies(chosen, met):
            result.schedule = schedule
            result.pipeline = self.pipeline_of(schedule)
            with self._lock:
                self._steady = schedule
        cache = self._cache()
        if cache is not None and result.cache_key and self._steady is not None:
            try:
                cache.put(
                    result.cache_key,
                    self.pipeline_of(schedule) or schedule,  # a pipeline job's: every stage's
                    {
                        "budget": chosen.budget,
                        "block": result.block,
                        "slowdown": asdict(chosen.slowdown),
                        "saving": asdict(chosen.saving) if chosen.saving else None,
                    },
                )
            except OSError as exc:
                # a diagnostic, not a safety fallback: the run itself is as measured
                log.warning("tune: could not write the tune cache: %s", exc)
