"""``opdvfs tune``: the closed loop on a running training job, in one run of its script (#21).

One run of the user's unchanged script goes through these phases, each between two of its
iterations (an iteration ends at an optimizer step):

1. **warm-up** at the top clock (the first iteration differs: allocations, optimizer state);
   the last warm-up iteration identifies the job for the
   :func:`~opdvfs.runtime.schedule_cache.cache_key`: on a simulated GPU its operator sequence,
   off it the optimizer step's :func:`step_signature` (its parameters) with the GPU's name. A
   cached schedule for it starts applying at once (phase ``steady``), skipping 2-4.
2. **profiling** at K clocks (:func:`auto_clocks`), through the clock sweep of
   :mod:`opdvfs.runtime.sweep` (:class:`~opdvfs.runtime.sweep.ClockSweep`: the iterations a
   switch disturbs discarded, thermal steadiness checked), into one profile
   (:func:`~opdvfs.runtime.sweep.sweep_profile`).
3. **planning** in a background thread while training goes on at the top clock: the models
   are fitted and the schedule planned by the same functions ``opdvfs plan`` uses on a swept
   profile (:func:`fit_profile`, :func:`plan_fitted`).
4. **A/B measurement**: the schedule is applied by the executor ``opdvfs run`` uses, in
   blocks that alternate with top-clock reference blocks: on a simulated GPU operator-triggered
   (:class:`~opdvfs.runtime.dispatch.ScheduleExecutor`: the swept profile's kernels map back
   onto the operators it counts, :func:`~opdvfs.runtime.sweep.on_launches`); on a real device
   (nvml, zeusd, a dry run measuring the GPU) time-triggered, as ``opdvfs run --trigger time``
   (:class:`~opdvfs.runtime.timed.TimedExecutor`: the trace's operators are CUDA kernels the
   operator count cannot match, and the stages' planned start times place the switches),
   paused between the blocks. The blocks alternate in ABBA order, so a linear drift such as a
   warming die cancels; each block's first iteration is discarded (a switch in flight), and so
   are the tuned iterations the time-triggered executor fell back to the top clock in (they do
   not measure the plan). Each pair of blocks gives one paired ratio of time and of energy
   (:func:`ab_pairs`); their mean and Student-t interval
   (:func:`~opdvfs.runtime.tuning.paired_interval`) are the measured slowdown and saving. Off
   the simulated GPU a block spans enough iterations for the energy counter's updates
   (:func:`ab_block`).
5. **re-plan** when the measured slowdown is not within the target:
   :func:`opdvfs.runtime.tuning.fit_budget` plans at another budget and measures again (it runs
   in the planning thread; each ``measure`` waits for the training thread's A/B blocks).
6. **steady**: the round with the surest saving (:func:`choose_round`: the highest lower
   bound of the saving's interval among the rounds within the target, not the highest mean,
   which over a few noisy rounds is the luckiest) applies for the rest of the run, and is
   cached.

Under ``torchrun`` (a process group exists when an iteration ends) every rank measures and
rank 0 leads: at each iteration end the ranks exchange the iteration's time and energy
through the group's key-value store (no tensor operator the executor or a trace would see),
and each takes the job's: the slowest rank's time and every rank's energy; rank 0
alone runs the phases above on those job-wide figures (its sweep, its planning thread, its
A/B blocks) and broadcasts what it decided: the phase, the clock it set, the schedule it
applies. So every rank moves through the same phases at the same iterations, the A/B blocks
start and end together, and data-parallel ranks share rank 0's plan. Rank 0's operator
sequence is the one profiled and planned: when the ranks' sequences differ (pipeline
stages; :class:`~opdvfs.runtime.distributed.JobView`) rank 0 warns in one line that the job
is planned as data-parallel on its sequence, and the ranks whose sequence differs stay at
the top clock (still measured). Only rank 0 reads and writes the cache.

What holds the program. On a simulated GPU the operator-counting executor, a dispatch mode,
drives the simulator: every aten operator becomes a launch, so a ``torch.compile``d model runs
eagerly there (:data:`SIM_COMPILED_HINT`). Off it tune holds no dispatch mode: iterations end
at the optimizer step (a global step hook, as ``opdvfs run --trigger time``), the sweep is
traced by torch.profiler (which sees compiled kernels), and the plans apply by time, so a
compiled model stays compiled through the whole run and what is profiled, planned and measured
is the job the user runs.

Layering: the runtime may not import the planner, so the orchestration that fits and plans
lives here, in ``experiments`` (which may import models, plan and runtime); the runtime keeps
only what runs between iterations (the sweep, the executor, the guard). Every exit path ends
with exactly one restore of the clock (:class:`~opdvfs.runtime.actuators.ClockGuard`).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from opdvfs.exceptions import OpdvfsError, ValidationError
from opdvfs.experiments.ab import (
    BLOCK_COUNTER_UPDATES,
    DEFAULT_BLOCK,
    TuneIteration,
    TuneRound,
    ab_block,
    ab_pairs,
    applies,
    choose_round,
)
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.on_profile import auto_clocks
from opdvfs.plan.planner import PlanInputs, plan_schedule
from opdvfs.profile import Profile
from opdvfs.runtime.actuators import Actuator, ClockGuard, SimGpuActuator
from opdvfs.runtime.schedule_cache import TuneCache, cache_key
from opdvfs.runtime.sweep import ClockSweep, device_meter, on_launches, sweep_profile
from opdvfs.runtime.tuning import BudgetFit, Measured, fit_budget
from opdvfs.schedule import Objective, Schedule
from opdvfs.sim.presets import preset_spec

if TYPE_CHECKING:
    from opdvfs.runtime.distributed import StoreJob
    from opdvfs.runtime.profiling import Traced

__all__ = [
    "PHASES",
    "SIM_COMPILED_HINT",
    "PlanOnProfile",
    "TuneResult",
    "Tuner",
    "auto_clocks",
    "fit_profile",
    "plan_fitted",
    "step_signature",
]


Phase = Literal[
    "warmup",
    "settle",
    "unsteady",
    "counted",
    "planning",
    "switch",
    "reference",
    "tuned",
    "steady",
    "top",
]
#: Every phase an iteration can be in, in the order a run goes through them.
PHASES: tuple[str, ...] = get_args(Phase)
#: Phases that cost the job profiling (the sweep after the warm-up) or planning.
PROFILING = ("settle", "unsteady", "counted")
#: How often the sweep's power sampler reads NVML on a real GPU (ms).
_SAMPLE_MS = 20.0


# ----------------------------------------------------------------------------- fit and plan
@dataclass(frozen=True)
class PlanOnProfile:
    """The models fitted on a swept profile and the planner's inputs, as ``opdvfs plan`` has them.

    Attributes
    ----------
    models
        The fitted time and power models (None when the profile measured every clock).
    inputs
        The planner's inputs (the device's clocks, streams, measurements).
    switch_latency_ms
        The device's switch latency (ms), the planner's default.
    n_launches
        Operators the executor counts per iteration (a simulated GPU's sweep: its rows are the
        kernels, mapped back with :func:`~opdvfs.runtime.sweep.on_launches`); None: the
        profile's operators are those the executor counts.
    """

    models: ModelBundle | None
    inputs: PlanInputs
    switch_latency_ms: float
    n_launches: int | None = None


def fit_profile(
    profile: Profile, *, objective: Objective = "energy", n_launches: int | None = None
) -> PlanOnProfile:
    """Fit the models on a swept profile, as ``opdvfs plan PROFILE`` does (``--values auto``).

    The same calls as the plan command: the planner's inputs from the profile over its
    device's clocks (:meth:`PlanInputs.from_profile`), and models fitted only when some
    operator was not measured at some clock the device offers.
    """
    inputs = PlanInputs.from_profile(profile)
    spec = preset_spec(inputs.device)
    models = None
    assert inputs.measured is not None
    if not inputs.measured.covers(inputs.freqs_mhz, core=objective == "core-energy"):
        models = ModelBundle(PerfModel().fit(profile), PowerModel().fit(profile, device=spec))
    latency = spec.switch_latency_ms if spec is not None else 1.0
    return PlanOnProfile(models, inputs, latency, n_launches)


def plan_fitted(
    fitted: PlanOnProfile,
    *,
    target: float,
    objective: Objective = "energy",
    interval_ms: float = 20.0,
) -> Schedule:
    """Plan at ``target`` on :func:`fit_profile`'s models, as ``opdvfs plan`` does; map to launches.

    ``interval_ms`` below the device's switch latency is raised to it by
    :func:`~opdvfs.plan.planner.plan_schedule` (shorter stages' switches would be superseded).
    """
    schedule = plan_schedule(
        fitted.models,
        fitted.inputs,
        target=target,
        objective=objective,
        interval_ms=interval_ms,
        switch_latency_ms=fitted.switch_latency_ms,
    )
    if fitted.n_launches is not None:
        assert fitted.inputs.measured is not None
        schedule = on_launches(schedule, fitted.inputs.measured.op_ids, fitted.n_launches)
    return schedule


# ----------------------------------------------------------------------------- the run
@dataclass
class TuneResult:
    """What a tuning run did and measured (the JSON result's content)."""

    target: float
    actuator: str
    device: str | None
    clocks_mhz: tuple[float, ...]
    iterations: list[TuneIteration]
    rounds: list[TuneRound] = field(default_factory=list)
    best_round: int | None = None
    met: bool | None = None
    cache_key: str | None = None
    cache_hit: bool = False
    schedule: Schedule | None = None
    profile: Profile | None = None
    models: ModelBundle | None = None
    error: str | None = None
    plan_seconds: float = 0.0
    timeline: dict[str, list[float]] | None = None
    #: What the cached schedule measured when it was tuned (a cache hit).
    cached: dict[str, Any] | None = None
    #: Ranks of the job (torchrun); time is the slowest rank's, energy every rank's.
    world_size: int = 1
    #: Under torchrun: whether every rank ran rank 0's operator sequence (None: not compared).
    same_sequence: bool | None = None
    #: How the applied round was chosen (:func:`choose_round`; None: no round measured).
    chosen_by: str | None = None
    #: Iterations per A/B block (the first discarded), and why that many (:func:`ab_block`).
    block: int | None = None
    block_by: str | None = None
    #: A/B block pairs per round.
    pairs: int | None = None

    def count(self, *phases: str) -> int:
        """Return how many iterations were in any of ``phases``."""
        return sum(1 for it in self.iterations if it.phase in phases)

    @property
    def profiling_iterations(self) -> int:
        """Iterations the sweep took after the warm-up (switch settling, unsteady, counted)."""
        return self.count(*PROFILING)

    @property
    def planning_iterations(self) -> int:
        """Iterations run at the top clock while the models were fitted and plans made."""
        return self.count("planning")

    @property
    def overhead_fraction(self) -> float:
        """Profiling and planning iterations over all the run's iterations."""
        n = len(self.iterations)
        return (self.profiling_iterations + self.planning_iterations) / n if n else math.nan

    def phase_means(self) -> dict[str, dict[str, float | int | None]]:
        """Return per phase: iterations, mean time (s) and mean energy (J) per iteration."""
        out: dict[str, dict[str, float | int | None]] = {}
        for phase in PHASES:
            rows = [it for it in self.iterations if it.phase == phase]
            if not rows:
                continue
            energy = [it.energy_j for it in rows if it.energy_j is not None]
            out[phase] = {
                "iterations": len(rows),
                "time_s": float(np.mean([it.time_s for it in rows])),
                "energy_j": float(np.mean(energy)) if energy else None,
            }
        return out

    @property
    def best(self) -> TuneRound | None:
        """The round whose schedule runs in the steady phase."""
        return self.rounds[self.best_round] if self.best_round is not None else None

    @property
    def saving_resolved(self) -> bool | None:
        """Whether the applied round's saving interval excludes 0 (None: no interval).

        False: at this many pairs the measured saving is not told apart from none (or the
        interval lies wholly below 0).
        """
        best = self.best
        if best is None or best.saving is None or best.saving.n < 2:
            return None
        low, high = best.saving.low, best.saving.high
        if not (math.isfinite(low) and math.isfinite(high)):
            return None
        return bool(low > 0 or high < 0)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able result (no profile, models or schedule: they have their files)."""
        best = self.best
        return {
            "target": self.target,
            "actuator": self.actuator,
            "device": self.device,
            "clocks_mhz": list(self.clocks_mhz),
            "iterations": len(self.iterations),
            "profiling_iterations": self.profiling_iterations,
            "planning_iterations": self.planning_iterations,
            "overhead_fraction": self.overhead_fraction,
            "phases": self.phase_means(),
            "rounds": [asdict(r) for r in self.rounds],
            "best_round": self.best_round,
            "chosen_by": self.chosen_by,
            "met": self.met,
            "saving_resolved": self.saving_resolved,
            "block": self.block,
            "block_by": self.block_by,
            "pairs": self.pairs,
            "measured_slowdown": asdict(best.slowdown) if best else None,
            "measured_saving": asdict(best.saving) if best and best.saving else None,
            "cache_key": self.cache_key,
            "cache_hit": self.cache_hit,
            "cached": self.cached,
            "world_size": self.world_size,
            "same_sequence": self.same_sequence,
            "plan_seconds": self.plan_seconds,
            "error": self.error,
            "per_iteration": [asdict(it) for it in self.iterations],
        }


class _Aborted(Exception):
    """The run ended before a measurement the planning thread waits for."""


@dataclass
class _Block:
    kind: Literal["reference", "tuned"]
    left: int  # iterations still to run in it (its first one discarded)
    pair: int


@dataclass
class _Measurement:
    schedule: Schedule
    round: int
    blocks: list[_Block]
    done: threading.Event = field(default_factory=threading.Event)
    measured: Measured | None = None


@contextlib.contextmanager
def _no_modes() -> Any:
    """Run the block outside the dispatch modes: the executor must not count its operators."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _gpu_name(meter: Any) -> str | None:
    """Return the name of the GPU ``meter`` reads (NVML's, e.g. "NVIDIA H200"), or None."""
    read = getattr(meter, "name", None)
    if read is None:
        return None
    try:
        name = read()
    except Exception:  # a name NVML cannot read: the key and the report go without it
        return None
    return name if isinstance(name, str) and name else None


#: The compile warning on a simulated GPU (:attr:`ScheduleExecutor.compiled_hint`): there the
#: model must run eagerly, and no flag of tune's changes that.
SIM_COMPILED_HINT = (
    "the script uses torch.compile, and tune runs it eagerly on a simulated GPU (sim:PRESET): "
    "the simulator times each operator the dispatch mode sees, and Dynamo does not compile "
    "while one is active; on a real device (nvml, zeusd, dry-run measuring the GPU) tune keeps "
    "the model compiled"
)


def _make_executor(actuator: SimGpuActuator, tuner: Tuner) -> Any:
    """Return the executor ``opdvfs run`` uses, with the tuner called at each iteration end.

    The simulated GPU's: the operator-counting dispatch mode that drives the simulator, so a
    compiled model runs eagerly under it (:data:`SIM_COMPILED_HINT`). Its switches go onto the
    simulated GPU's own timeline as their trigger operator is dispatched (as every
    :class:`ScheduleExecutor`'s on a simulated GPU), never through a worker thread that waits
    out a switch's delay in host time.
    """
    from opdvfs.runtime.dispatch import ScheduleExecutor

    class TuneExecutor(ScheduleExecutor):
        """:class:`ScheduleExecutor`, recording one iteration's names; the tuner runs after it."""

        compiled_hint = SIM_COMPILED_HINT

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if tuner.recording(self.iteration):
                tuner.op_names.append(func._schema.name)
            return super().__torch_dispatch__(func, types, args, kwargs)

        def mark_iteration(self) -> None:
            iteration, n_ops = self.iteration, self.op_index
            super().mark_iteration()
            tuner.iteration_ended(iteration, n_ops)

    return TuneExecutor(None, actuator, max_diverged=2)


def step_signature(optimizer: Any) -> list[str]:
    """Return what identifies a job at an optimizer step, with no operator seen: its parameters.

    The optimizer's class, then each parameter it steps (dtype, shape, device type) in its
    groups' order, and whether ``torch.compile`` has compiled anything in this process (a
    compiled job runs other kernels at other times than its eager form). Cheap (read once a
    run) and the same whether the model is compiled or not: off the simulated GPU tune holds
    no dispatch mode, so the operators themselves are not seen (:class:`_StepCounter`).
    Not in it: the batch (neither is it in the operator names a simulated GPU's key hashes).
    """
    from opdvfs.runtime.dispatch import compile_in_use

    kind = type(optimizer)
    params = [
        f"{p.dtype} {tuple(p.shape)} {p.device.type}"
        for group in getattr(optimizer, "param_groups", ())
        for p in group.get("params", ())
    ]
    return [f"{kind.__module__}.{kind.__qualname__}", *params, f"compiled={compile_in_use()}"]


def _make_counter(tuner: Tuner) -> Any:
    """Return the iteration counter tune uses off the simulated GPU: no dispatch mode at all.

    Iterations end at the optimizer step (PyTorch's global step hook, as
    :class:`~opdvfs.runtime.applier.IterationCounter` and ``opdvfs run --trigger time``), so a
    ``torch.compile``d model stays compiled: Dynamo skips every frame under a dispatch mode.
    The job's identity for the cache and the ranks' comparison is :func:`step_signature`,
    taken at the step that ends the last warm-up iteration.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from opdvfs.runtime.applier import IterationCounter

    class _StepCounter(IterationCounter):
        """Counts optimizer steps; the tuner runs at each. Applies nothing (TimedExecutor does)."""

        #: What the tuner reads of the operator-counting executor: it never diverges.
        abandoned = False
        first_divergence: str | None = None
        schedule: Schedule | None = None

        def __init__(self) -> None:
            super().__init__(optimizer_steps=False)  # the hook below, which sees the optimizer

        def __enter__(self) -> Any:
            def step(optimizer: Any, *_: object) -> None:
                if tuner.recording(self.iteration):
                    tuner.op_names[:] = step_signature(optimizer)
                self.mark_iteration()

            self._hook = register_optimizer_step_post_hook(step)
            return super().__enter__()

        def mark_iteration(self) -> None:
            iteration = self.iteration
            super().mark_iteration()
            tuner.iteration_ended(iteration, 0)

        def halt(self) -> None:
            """Nothing to stop: the time-anchored executor issues the switches."""

    return _StepCounter()


def _make_timed(actuator: Actuator, *, tolerance: float = 0.2) -> Any:
    """Return the time-anchored executor ``opdvfs run --trigger time`` uses, driven by the tuner.

    Its iterations end where the tuner's do (no optimizer hook of its own);
    :meth:`~opdvfs.runtime.timed.TimedExecutor.pause` stops it applying between the A/B
    blocks. ``tolerance`` as :class:`~opdvfs.runtime.timed.TimedExecutor` (its default).
    """
    from opdvfs.runtime.timed import TimedExecutor

    return TimedExecutor(None, actuator, tolerance=tolerance, optimizer_steps=False)


class Tuner:
    """Tune a running program's clocks (see the module): enter it around the program.

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
        Clocks to profile (MHz), or ``"auto"`` (:func:`auto_clocks`).
    warmup, iterations_per_clock
        As :class:`~opdvfs.runtime.sweep.ClockSweep`.
    block
        Iterations per A/B block (its first one discarded: >= 2); None: :data:`DEFAULT_BLOCK`
        on a simulated GPU (its energy counter is exact) or without an energy counter, else
        sized for NVML's counter at the top clock's iteration time (:func:`ab_block`, decided
        when the sweep ends).
    pairs
        Reference/tuned block pairs per round (>= 2 for an interval).
    rounds
        Most plans :func:`~opdvfs.runtime.tuning.fit_budget` measures.
    objective, interval_ms
        As ``opdvfs plan``.
    cache
        Where measured schedules are kept (None: no cache).
    on_iteration
        Called after each iteration with :meth:`status` (a progress display).
    label
        The actuator's name in the result (default: its kind).
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
        rounds: int = 3,
        objective: Objective = "energy",
        interval_ms: float = 20.0,
        cache: TuneCache | None = None,
        on_iteration: Callable[[dict[str, Any]], None] | None = None,
        label: str | None = None,
    ) -> None:
        if not target > 0:
            raise ValidationError(f"target {target}: expected a slowdown > 0", field="target")
        if block is not None and block < 2:
            raise ValidationError(f"block {block}: expected at least 2", field="block")
        if pairs < 1:
            raise ValidationError(f"pairs {pairs}: expected at least 1", field="pairs")
        if warmup < 1:
            raise ValidationError(f"warmup {warmup}: expected at least 1", field="warmup")
        self.actuator = actuator
        self.target, self.pairs, self.rounds = target, pairs, rounds
        #: Iterations per A/B block; None: sized when the sweep ends (:meth:`_size_block`).
        self.block_given = block
        self.block = block if block is not None else DEFAULT_BLOCK
        self.objective: Objective = objective
        self.interval_ms = interval_ms
        self.cache = cache
        self.on_iteration = on_iteration
        freqs = actuator.supported_freqs_mhz()
        chosen = auto_clocks(freqs) if clocks == "auto" else tuple(clocks)
        for f in chosen:
            actuator.check_freq_mhz(float(f))
        self.top_mhz = float(max(freqs))
        self.sim = actuator if isinstance(actuator, SimGpuActuator) else None
        self.device = self.sim.gpu.name if self.sim is not None else None
        self.gpu_name: str | None = None
        self.kind = label or str(getattr(actuator, "kind", type(actuator).__name__))
        self.warmup = warmup
        self.op_names: list[str] = []
        self.n_launches: int | None = None
        self._stack = ExitStack()
        self._lock = threading.Lock()
        self._trace: Any = None
        self._trace_stack: ExitStack | None = None
        self._pre_hook: Any = None
        self._cuda = False
        #: What ends the iterations and calls the tuner: on a simulated GPU the operator-counting
        #: executor (a dispatch mode: the simulator runs the operators it sees); off it a counter
        #: of optimizer steps, no dispatch mode, so a compiled model stays compiled.
        self.executor = (
            _make_executor(self.sim, self) if self.sim is not None else _make_counter(self)
        )
        #: Off the simulated GPU: the time-anchored executor that applies the tuned schedules
        #: (the trace's operators are not those the operator-counting executor counts).
        self.timed: Any = _make_timed(actuator) if self.sim is None else None
        self._applied: Schedule | None = None  # what the time-anchored executor applies now
        self.guard = ClockGuard(actuator, before_restore=self._halt)
        sweep_kw: dict[str, Any] = {
            "warmup": warmup,
            "iterations_per_clock": iterations_per_clock,
            "on_done": self._sweep_done,
        }
        if self.sim is not None:
            self.sweep = ClockSweep.on_simulated_gpu(self.sim, chosen, **sweep_kw)
        else:
            import torch

            self._cuda = torch.cuda.is_available()
            try:  # as sweep_run: the die temperature and the energy counter's period, via NVML
                meter = device_meter(actuator, cuda=self._cuda, stack=self._stack)
                #: The GPU's own name (NVML's, read-only), for the cache key and the result.
                self.gpu_name = _gpu_name(meter)
                self.device = self.gpu_name
                self.sweep = ClockSweep.on_device(
                    actuator,
                    chosen,
                    now_s=self._device_now,
                    meter=meter,
                    interval_ms=_SAMPLE_MS,
                    **sweep_kw,
                )
            except BaseException:
                self._stack.close()
                raise
        self.sweep.optimizer_steps = False  # driven from the executor's iteration ends
        self.phase: str = "warmup"
        self.result = TuneResult(
            target, self.kind, self.device, self.sweep.freqs_mhz, iterations=[], pairs=pairs
        )
        self._last_end_s = 0.0
        self._last_energy_j: float | None = None
        self._measurement: _Measurement | None = None
        self._pending: _Measurement | None = None
        self._thread: threading.Thread | None = None
        self._aborted = threading.Event()
        self._finished = threading.Event()
        #: Set once the planning thread has a round for the training thread or has ended.
        self._plan_ready = threading.Event()
        #: On a simulated GPU: (device s, wall s) when the current planning phase began.
        self._planning_since: tuple[float, float] | None = None
        self._rounds_started = 0
        self._steady: Schedule | None = None
        self._reference: Schedule | None = None
        self._fitted: PlanOnProfile | None = None
        self._timeline_at: int | None = None
        self._job: StoreJob | None = None
        self._job_lost = False
        self._peer_abandoned = False
        self._followed: Schedule | None = None

    @property
    def rank(self) -> int:
        """Return this process's rank in the job (0 without a process group)."""
        if self._job is not None:
            return self._job.rank
        return int(os.environ.get("RANK", "0") or 0)

    # ------------------------------------------------------------------------- device time
    def _device_now(self) -> float:
        if self._cuda:
            import torch

            torch.cuda.synchronize()
        return time.time()

    def _now_s(self) -> float:
        return self.sim.gpu.now_s() if self.sim is not None else self._device_now()

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
            stack.callback(self._stop_thread)  # before the guard restores: no switch after it
            if self.sim is None:
                self._start_trace()
            stack.enter_context(self.executor)
            if self.timed is not None:  # its issuer closes before the guard restores the clock
                stack.enter_context(self.timed)
            stack.enter_context(self.sweep)
            self._last_end_s = self._now_s()
            self._last_energy_j = self._energy_j()
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the planning thread, leave the executor, restore the clock once."""
        self._stack.close()
        self._timeline()
        if self.result.error is not None or self.result.schedule is not None:
            return
        if self._job is None and self._waits_for_group():
            self.result.error = (
                f"rank {self.rank}: the script never created a process group, so this rank "
                "could not follow rank 0's tuning: it ran at the top clock"
            )
            return
        if self.phase in ("warmup", "profiling"):
            self.result.error = self.sweep_incomplete()
        elif self.phase != "top" and not (self.phase == "steady" and self._job is not None):
            # (a rank whose operators are not rank 0's runs the steady phase at the top clock)
            self.result.error = (
                f"the script ended after {len(self.result.iterations)} iterations, while "
                f"tuning was {self.phase} (round {len(self.result.rounds) + 1}): no schedule "
                "was chosen; run it longer"
            )

    def _timeline(self) -> None:
        """Keep the clock over the last iteration run under the chosen schedule (simulated GPU)."""
        if self.sim is None:
            return
        last = [it.iteration for it in self.result.iterations if it.phase in ("steady", "tuned")]
        if not last:
            return
        kernels = self.sim.gpu.kernels()
        rows = kernels[kernels["iteration"] == last[-1]]
        if rows.empty:
            return
        start = rows["start_us"].to_numpy(dtype=float)
        self.result.timeline = {
            "start_s": ((start - start.min()) * 1e-6).tolist(),
            "time_s": (rows["time_us"].to_numpy(dtype=float) * 1e-6).tolist(),
            "freq_mhz": rows["freq_mhz"].to_numpy(dtype=float).tolist(),
        }

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

    def _start_trace(self) -> None:
        """Trace the sweep with torch.profiler (and NVML): a real device, or a dry run."""
        from opdvfs.runtime.profiling import traced

        sampler = None
        if self._cuda:
            from opdvfs.runtime.sampler import NvmlSampler

            sampler = NvmlSampler(interval_ms=_SAMPLE_MS)
        stack = ExitStack()
        self._trace = stack.enter_context(
            traced(
                sampler=sampler,
                cuda=self._cuda,
                freq_mhz=self.top_mhz,
                interval_ms=_SAMPLE_MS,
                until=lambda: self.sweep.done,
                lazy=True,  # imported in the planning thread, not in an optimizer hook
            )
        )
        self._trace_stack = stack
        self._stack.callback(self._close_trace_quietly)

    def _close_trace_quietly(self) -> None:
        stack, self._trace_stack = self._trace_stack, None
        if stack is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with contextlib.suppress(Exception):  # the run's own error is the one to see
                    stack.close()
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None

    # ------------------------------------------------------------------------- per iteration
    def recording(self, iteration: int) -> bool:
        """Whether the operators of ``iteration`` make the cache key (the last warm-up one)."""
        return iteration == self.warmup - 1 and self.result.cache_key is None

    def iteration_ended(self, iteration: int, n_ops: int) -> None:
        """Record the iteration that ended and move the run on (the executor's hook).

        A failure of the tuner's own never reaches the program: it is the result's error,
        and the program trains on at the top clock. Under torchrun every rank calls this at
        the same iteration end: the job's time and energy are reduced, rank 0 moves the run
        on and the others follow what it broadcasts (see the module).
        """
        try:
            self._iteration_end(iteration, n_ops)
        finally:
            self._anchor_timed()

    def _anchor_timed(self) -> None:
        """End the iteration for the time-anchored executor: it arms the next one, if applying."""
        if self.timed is None:
            return
        try:
            self.timed.mark_iteration()
        except Exception as exc:
            self.result.error = f"tuning stopped: {type(exc).__name__}: {exc}"
            self._stop_tuning()

    def _iteration_end(self, iteration: int, n_ops: int) -> None:
        job = self._join()
        measured = self._measure_iteration()
        if job is not None:
            try:
                measured = self._job_measure(job, iteration, measured)
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
        if job is None and self._waits_for_group():
            self.result.iterations.append(
                TuneIteration(iteration, self.phase, None, measured[0], measured[1])
            )
            return
        try:
            self._iteration_ended(iteration, n_ops, measured)
        except Exception as exc:
            self.result.error = f"tuning stopped: {type(exc).__name__}: {exc}"
            self._stop_tuning()
        if job is not None:
            try:
                self._lead(job, iteration)
            except Exception as exc:
                self._lost_job(exc)
        self._report()

    # ------------------------------------------------------------------------- torchrun
    def _join(self) -> StoreJob | None:
        """Join the job's ranks once the script has made its process group (torchrun)."""
        if self._job is None and not self._job_lost:
            from opdvfs.runtime.distributed import StoreJob, group_ready  # (torch: lazily)

            if not group_ready():
                return None
            self._job = StoreJob()
            self.result.world_size = self._job.world_size
            if not self._job.leader:
                self.cache = None  # rank 0 alone reads and writes it
                if self._trace_stack is not None:
                    self._drop_trace_soon()  # rank 0's sweep is the one profiled
        return self._job

    def _drop_trace_soon(self) -> None:
        """End this rank's trace, unread, at the next optimizer step's start (not from a hook)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def close(*_: object) -> None:
            stack, self._trace_stack = self._trace_stack, None
            if stack is None:
                return
            with warnings.catch_warnings(), _no_modes():
                warnings.simplefilter("ignore")
                with contextlib.suppress(Exception):
                    stack.close()

        self._pre_hook = register_optimizer_step_pre_hook(close)

    def _waits_for_group(self) -> bool:
        """Return whether this is a rank other than 0 of a torchrun job with no group (yet)."""
        return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and self.rank != 0

    def _lost_job(self, exc: BaseException) -> None:
        self.result.error = (
            f"rank {self.rank}: the ranks could not exchange an iteration's figures "
            f"({type(exc).__name__}: {exc}); this rank went on at the top clock"
        )
        self._job, self._job_lost = None, True
        self._stop_tuning()

    def _measure_iteration(self) -> tuple[float, float | None, float | None, float | None]:
        """Return this iteration's time and energy on this device (job-wide: see below)."""
        now = self._now_s()
        energy = self._energy_j()
        used_j = (
            energy - self._last_energy_j
            if energy is not None and self._last_energy_j is not None
            else None
        )
        time_s = now - self._last_end_s
        self._last_end_s, self._last_energy_j = now, energy
        return time_s, used_j, None, None

    def _job_measure(
        self,
        job: StoreJob,
        iteration: int,
        measured: tuple[float, float | None, float | None, float | None],
    ) -> tuple[float, float | None, float | None, float | None]:
        """Return the job's iteration (slowest rank's time, all ranks' energy) and this rank's.

        At the last warm-up iteration the ranks' operator sequences are compared; rank 0
        warns in one line when they differ.
        """
        time_s, energy_j = measured[0], measured[1]
        job_s, job_j, abandoned = job.iteration(time_s, energy_j, self.executor.abandoned)
        self._peer_abandoned = abandoned and not self.executor.abandoned
        if iteration == self.warmup - 1:
            same, groups = job.same_sequence(self.op_names)
            self.result.same_sequence = same
            if job.leader and not same:
                ranks = "; ".join(", ".join(map(str, g)) for g in groups.values())
                warnings.warn(
                    f"opdvfs: the ranks run {len(groups)} different operator sequences (ranks "
                    f"{ranks}): the job is planned as data-parallel on rank 0's sequence; the "
                    "ranks whose sequence differs stay at the top clock",
                    stacklevel=2,
                )
        return job_s, job_j, time_s, energy_j

    def _lead(self, job: StoreJob, iteration: int) -> None:
        """Rank 0: send what this iteration end decided (phase, clock, schedule) to the others."""
        record = self.result.iterations[-1]
        schedule = self._applied_schedule()
        payload = None
        if schedule is not job.sent:
            payload = schedule.to_json() if schedule is not None else None
            job.sent, job.sent_mhz = schedule, None  # a clock after a schedule is sent anew
        freq: float | None = None
        if schedule is None:
            freq = self.top_mhz
            if self.phase in ("warmup", "profiling") and not self.sweep.done:
                freq = float(getattr(self.sweep, "_set_mhz", self.top_mhz))
            if freq == job.sent_mhz:
                freq = None
            else:
                job.sent_mhz = freq
        job.exchange(
            {
                "iteration": iteration,
                "phase": record.phase if record.iteration == iteration else self.phase,
                "round": record.round if record.iteration == iteration else None,
                "next": self.phase,
                "freq_mhz": freq,
                "schedule": payload,
                "error": self.result.error,
                "cache_key": self.result.cache_key,
                "cache_hit": self.result.cache_hit,
            }
        )

    def _follow(
        self,
        job: StoreJob,
        iteration: int,
        n_ops: int,
        measured: tuple[float, float | None, float | None, float | None],
    ) -> None:
        """Take rank 0's decision for this iteration end, and apply it (the other ranks)."""
        self.n_launches = n_ops  # (if the ranks lose each other: the top clock by operator)
        d = job.exchange(None)
        if d["iteration"] != iteration:
            raise OpdvfsError(f"rank 0 ended iteration {d['iteration']}, this rank {iteration}")
        self.result.iterations.append(
            TuneIteration(
                iteration,
                d["phase"],
                getattr(self.actuator, "current_mhz", None),
                measured[0],
                measured[1],
                d["round"],
                measured[2],
                measured[3],
            )
        )
        if job.follows_plan:
            if d["schedule"] is not None:
                self._followed = Schedule.from_json(d["schedule"], source="rank 0")
                self._apply(self._followed)
            elif d["freq_mhz"] is not None and self._applied_schedule() is None:
                self.actuator.at(iteration + 1, 0)
                self.actuator.set_freq_mhz(float(d["freq_mhz"]))
            elif d["freq_mhz"] is not None and self.timed is not None:
                self._apply_top()  # rank 0 left its schedule for the top clock
        self.phase = d["next"]
        self.result.error = self.result.error or d["error"]
        self.result.cache_key, self.result.cache_hit = d["cache_key"], d["cache_hit"]
        if self.phase == "steady" and job.follows_plan:
            self.result.schedule = self._followed

    def _stop_tuning(self) -> None:
        self._measurement = None
        self._aborted.set()
        if self.n_launches is not None or self.timed is not None:
            self._apply_top()
        else:
            self.actuator.set_freq_mhz(self.top_mhz)
        self.phase = "top"

    def _iteration_ended(
        self,
        iteration: int,
        n_ops: int,
        measured: tuple[float, float | None, float | None, float | None],
    ) -> None:
        job = self._measurement
        record = TuneIteration(
            iteration,
            self.phase,
            getattr(self.actuator, "current_mhz", None),
            measured[0],
            measured[1],
            job.round if job is not None else None,
            measured[2],
            measured[3],
        )
        self.result.iterations.append(record)
        if self.phase == "top":
            return
        abandoned = self.executor.abandoned or self._peer_abandoned
        if abandoned and self.phase in ("switch", "reference", "tuned", "steady"):
            where = self.executor.first_divergence if self.executor.abandoned else "on another rank"
            self.result.error = (
                f"the program's operators changed ({where}): the "
                "schedule was abandoned and the run went on at the top clock"
            )
            self._stop_tuning()
            return
        if self.phase == "warmup" and iteration == self.warmup - 1:
            self.n_launches = n_ops
            if self._from_cache():
                return
        if self.phase in ("warmup", "profiling"):
            # the operators per iteration the plan maps onto: the last profiled iteration's
            # (with --warmup 1 the first iteration, which often differs, is not the one)
            self.n_launches = n_ops
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
            self._pace_planning()
        if job is not None:
            self._advance_block(job)
        elif self._pending is not None:
            self._start_measurement()
        elif self._finished.is_set() and self.phase == "planning":
            with self._lock:
                steady = self._steady
            if steady is not None:
                self._go_steady(steady)
            else:
                self._stop_tuning()

    def _planning_began(self) -> None:
        """Note when a planning phase began, on the simulated GPU's timeline and the host's."""
        if self.sim is not None:
            self._planning_since = (self._now_s(), time.perf_counter())

    def _pace_planning(self) -> None:
        """Keep a simulated GPU's iterations at the device's pace while the thread plans.

        A real GPU's host waits on its device, so planning spans ``plan seconds / iteration
        time`` iterations; a simulated GPU's host runs as fast as it dispatches (a 1 s virtual
        iteration of the tiny GPT in ~0.2 s of CPU), so as many more iterations passed at the
        top clock as the host was fast. At each planning iteration's end the training thread
        waits until the wall time since planning began catches up with the device's, or the
        plan is ready: the iterations spent planning are the device's, whatever the host.
        """
        if self._planning_since is None:
            return
        device0_s, wall0_s = self._planning_since
        ahead_s = (self._now_s() - device0_s) - (time.perf_counter() - wall0_s)
        if ahead_s > 0:
            self._plan_ready.wait(ahead_s)

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
            "freq_mhz": getattr(self.actuator, "current_mhz", None),
            "left": left,
            "round": len(self.result.rounds),
            "saving": saving,
        }

    # ------------------------------------------------------------------------- cache
    def _from_cache(self) -> bool:
        if self.n_launches is None:
            return False
        work_scale = self.sim.gpu.work_scale if self.sim is not None else None
        ranks = {"world_size": self.result.world_size} if self.result.world_size > 1 else {}
        # off the simulator the device is the actuator's kind and the GPU it measures: an
        # A100's plan is not an H200's, nor a dry run's (it sets nothing) a real run's
        where = {"gpu": self.gpu_name} if self.sim is None else {}
        key = cache_key(
            self.op_names,
            device=self.sim.gpu.name if self.sim is not None else self.kind,
            target=self.target,
            objective=self.objective,
            work_scale=work_scale,
            **where,
            **ranks,
        )
        self.result.cache_key = key
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None:
            return False
        schedule, measured = hit
        if self.timed is None and schedule.n_ops != self.n_launches:
            return False
        supported = set(self.actuator.supported_freqs_mhz())
        if self.timed is not None and any(st.freq_mhz not in supported for st in schedule.stages):
            return False
        self.result.cache_hit = True
        self.result.cached = measured
        self.result.schedule = schedule
        self._apply(schedule)
        self.phase = "steady"
        return True

    # ------------------------------------------------------------------------- planning
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

    def _size_block(self) -> None:
        """Decide the A/B block's length (once the sweep has timed the top clock)."""
        if self.block_given is not None:
            self.block, why = self.block_given, "given (--block)"
        elif self.sim is not None or self.sweep.sensor_s is None:
            self.block = DEFAULT_BLOCK
            why = (
                "the simulated GPU's energy counter is exact"
                if self.sim is not None
                else "no energy counter to size it by"
            )
        else:
            counter_s = self.sweep.sensor_s[0]
            iteration_s = self._top_iteration_s()
            self.block = ab_block(iteration_s, counter_s)
            why = (
                f"{self.block - 1} counted iterations of {iteration_s:.4g} s at the top clock "
                f"span >= {BLOCK_COUNTER_UPDATES} updates of the {counter_s * 1e3:g} ms "
                "energy counter"
                if iteration_s
                else "no iteration time to size it by"
            )
        self.result.block, self.result.block_by = self.block, why

    def _sweep_done(self) -> None:
        """End the sweep (its last clock is done): train at the top clock, plan in a thread."""
        self._size_block()
        self.actuator.set_freq_mhz(self.top_mhz)
        self.phase = "planning"
        self._planning_began()
        if self.sim is None:
            self._close_trace_soon()
        else:
            self._start_thread(None)

    def _close_trace_soon(self) -> None:
        """End the trace at the next optimizer step's start (its hooks cannot go from a hook)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def close(*_: object) -> None:
            if self._trace_stack is None:
                return
            stack, self._trace_stack = self._trace_stack, None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    stack.close()  # the profiler stopped and its trace exported; not yet read
            except Exception as exc:
                self.result.error = f"the sweep's trace could not be read: {exc}"
                return
            self._start_thread(self._trace)

        self._pre_hook = register_optimizer_step_pre_hook(close)

    def _start_thread(self, trace: Traced | None) -> None:
        self._thread = threading.Thread(
            target=self._plan_loop, args=(trace,), name="opdvfs-tune-plan", daemon=True
        )
        self._thread.start()

    def _plan_loop(self, trace: Traced | None) -> None:
        """Run the planning thread: profile, fit, then :func:`fit_budget` over measured rounds.

        A real device's sweep trace is imported here (:meth:`Traced.load`), while the program
        trains on at the top clock.
        """
        start = time.perf_counter()
        try:
            try:
                measured = trace.load() if trace is not None else None
            except Exception as exc:
                self.result.error = f"the sweep's trace could not be read: {exc}"
                return
            profile = sweep_profile(self.sweep, measured)
            self.result.profile = profile
            launches = self.n_launches if self.sim is not None else None
            fitted = fit_profile(profile, objective=self.objective, n_launches=launches)
            self._fitted = fitted
            self.result.models = fitted.models
            predicted: dict[int, Schedule] = {}

            def plan_at(budget: float) -> Schedule:
                t0 = time.perf_counter()
                schedule = plan_fitted(
                    fitted, target=budget, objective=self.objective, interval_ms=self.interval_ms
                )
                self.result.plan_seconds += time.perf_counter() - t0
                predicted[id(schedule)] = schedule
                return schedule

            self.result.plan_seconds += time.perf_counter() - start
            fit = fit_budget(plan_at, self._measure, target=self.target, rounds=self.rounds)
        except _Aborted:
            return
        except Exception as exc:  # the tuner's own failure never reaches the program
            hint = ""
            if self.result.profile is not None and self.result.profile.samples is None:
                hint = (
                    f" ({self.kind} measures no power: tune with nvml, zeusd or sim:PRESET, or "
                    "dry-run without --device where NVML finds the GPU CUDA trains on)"
                )
            what = "" if isinstance(exc, OpdvfsError | ValueError) else f"{type(exc).__name__}: "
            self.result.error = f"planning failed: {what}{exc}{hint}"
        else:
            self._finish(fit)
        finally:
            self._finished.set()
            self._plan_ready.set()

    def _finish(self, fit: BudgetFit) -> None:
        # the rounds measured here are fit_budget's, in its order; the choice is tune's own:
        # by the saving's lower bound, not its mean (choose_round)
        if len(self.result.rounds) == len(fit.rounds):
            index, met, self.result.chosen_by = choose_round(self.result.rounds, self.target)
        else:  # (not expected: every measure closes one round)
            index, met = next(i for i, r in enumerate(fit.rounds) if r is fit.best), fit.met
        schedule = fit.rounds[index].schedule
        self.result.best_round = index
        self.result.met = met
        chosen = self.result.rounds[index]
        if applies(chosen, met):
            self.result.schedule = schedule
            with self._lock:
                self._steady = schedule
        if self.cache is not None and self.result.cache_key and self._steady is not None:
            try:
                self.cache.put(
                    self.result.cache_key,
                    schedule,
                    {
                        "budget": chosen.budget,
                        "slowdown": asdict(chosen.slowdown),
                        "saving": asdict(chosen.saving) if chosen.saving else None,
                    },
                )
            except OSError as exc:
                warnings.warn(f"opdvfs: could not write the tune cache: {exc}", stacklevel=2)

    def _measure(self, schedule: Schedule) -> Measured:
        """:func:`fit_budget`'s ``measure``: wait for the training thread's A/B blocks."""
        blocks: list[_Block] = []
        for pair in range(self.pairs):  # ABBA: reference first in even pairs
            kinds: tuple[Literal["reference", "tuned"], ...] = (
                ("reference", "tuned") if pair % 2 == 0 else ("tuned", "reference")
            )
            blocks += [_Block(kind, self.block, pair) for kind in kinds]
        job = _Measurement(schedule, self._rounds_started, blocks)
        self._rounds_started += 1
        with self._lock:
            self._pending = job
            self._plan_ready.set()
        while not job.done.wait(0.05):
            if self._aborted.is_set():
                raise _Aborted
        assert job.measured is not None
        return job.measured

    def _stop_thread(self) -> None:
        self._aborted.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    # ------------------------------------------------------------------------- A/B
    def _reference_schedule(self) -> Schedule:
        if self._reference is None or self._reference.n_ops != self.n_launches:
            self._reference = Schedule.from_stage_freqs(
                [0], [self.top_mhz], n_ops=int(self.n_launches or 1), target=0.0, solver="manual"
            )
        return self._reference

    def _apply(self, schedule: Schedule) -> None:
        """Apply ``schedule`` from the next iteration: by operator, or by time off the simulator."""
        if self.timed is None:
            self.executor.use_schedule(schedule)
            return
        self.timed.use_schedule(schedule)
        self._applied = schedule

    def _apply_top(self) -> None:
        """Run the next iterations at the top clock (a reference block, or no plan)."""
        if self.timed is None:
            self._apply(self._reference_schedule())
            return
        self.timed.pause()  # nothing pending; a switch being issued has landed
        self._applied = None
        self.actuator.at(self.executor.iteration + 1, 0)
        self.actuator.set_freq_mhz(self.top_mhz)

    def _applied_schedule(self) -> Schedule | None:
        """Return the schedule being applied now (None: a clock set directly)."""
        return self.executor.schedule if self.timed is None else self._applied

    def _halt(self) -> None:
        """Stop every switch for good (the guard's ``before_restore``)."""
        self.executor.halt()
        if self.timed is not None:
            self.timed.halt()

    def _start_measurement(self) -> None:
        with self._lock:
            job, self._pending = self._pending, None
            self._plan_ready.clear()  # (set again when the thread has the next round)
        if job is None:
            return
        if self.timed is None and job.schedule.n_ops != self.n_launches:
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
            self._apply(job.schedule)
        else:
            self._apply_top()
        self.phase = "switch"

    def _advance_block(self, job: _Measurement) -> None:
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

    def _fell_back(self) -> set[int]:
        """Return the iterations the timed executor fell back to the top clock in, and the next.

        It marks the iteration it judged off the plan (its watchdog fired, or its length was
        off) and sets the top clock then, so the next one also starts at the top clock,
        unarmed; both are dropped from a tuned block. (A fallback marked after the round's
        last iteration was measured is not seen.)
        """
        if self.timed is None:
            return set()
        marked = list(self.timed.diverged_iterations)  # (appended from its worker thread)
        return {i + k for i in marked for k in (0, 1)}

    def _close_round(self, job: _Measurement) -> None:
        rows = [it for it in self.result.iterations if it.round == job.round]
        ab = ab_pairs(rows, drop=self._fell_back())
        slowdown, saving = ab.slowdown, ab.saving
        s = job.schedule
        pred_slow = (
            s.predicted_time_s / s.baseline_time_s - 1
            if s.predicted_time_s and s.baseline_time_s
            else None
        )
        pred_save = (
            1 - s.predicted_energy_j / s.baseline_energy_j
            if s.predicted_energy_j and s.baseline_energy_j
            else None
        )
        self.result.rounds.append(
            TuneRound(
                s.target or 0.0,
                len(s.stages),
                pred_slow,
                pred_save,
                slowdown,
                saving,
                ab.pairs,
                ab.dropped,
            )
        )
        job.measured = Measured(
            slowdown=slowdown.mean,
            saving=saving.mean if saving is not None else 0.0,
        )
        # until the next plan or the result: the top clock
        self.phase = "planning"
        self._planning_began()
        self._apply_top()
        job.done.set()

    def _go_steady(self, schedule: Schedule) -> None:
        self._apply(schedule)
        self.phase = "steady"
