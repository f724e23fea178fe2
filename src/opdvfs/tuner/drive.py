r"""How the closed loop reaches the program and its device, chosen once per run.

Two drives, behind one small interface (:class:`Drive`), so the loop
(:class:`~opdvfs.tuner.loop.Tuner`) never asks which it has:

- :class:`SimulatedGpuDrive`: the program runs on a simulated GPU (``sim:PRESET``). The
  operator-counting executor ``opdvfs run`` uses (a dispatch mode) drives the simulator and ends
  the iterations; its plans apply by operator, onto the simulated GPU's own timeline; time and
  energy are the simulator's (an exact energy counter); the swept profile's kernels map back onto
  the operators it counts. A ``torch.compile``\\ d model runs eagerly there
  (:data:`SIM_COMPILED_HINT`).
- :class:`DeviceDrive`: a real device (``nvml``, ``zeusd``) or a dry run. No dispatch mode: the
  iterations end at the optimizer step (:func:`step_signature` identifies the job), the sweep is
  traced by torch.profiler beside NVML, and the plans apply by time (the
  :class:`~opdvfs.runtime.timed.TimedExecutor` of ``opdvfs run --trigger time``), so a compiled
  model stays compiled.

A drive calls back into the loop through three members (:class:`IterationSink`): whether an
iteration's operators are being recorded, the names recorded, and the end of an iteration.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Protocol

from opdvfs.runtime.actuators import Actuator
from opdvfs.runtime.sweep import ClockSweep, device_meter
from opdvfs.schedule import Schedule

if TYPE_CHECKING:
    from opdvfs.profile import Profile
    from opdvfs.runtime.actuators.base import Meter
    from opdvfs.runtime.profiling import Traced
    from opdvfs.sim.gpu import SimulatedGpu
    from opdvfs.tuner.result import TuneIteration

__all__ = [
    "SIM_COMPILED_HINT",
    "DeviceDrive",
    "Drive",
    "IterationSink",
    "SimulatedGpuDrive",
    "make_drive",
    "step_signature",
]

#: How often the sweep's power sampler reads NVML on a real GPU (ms).
SAMPLE_MS = 20.0

#: The compile warning on a simulated GPU (:attr:`ScheduleExecutor.compiled_hint`): there the
#: model must run eagerly, and no flag of tune's changes that.
SIM_COMPILED_HINT = (
    "the script uses torch.compile, and tune runs it eagerly on a simulated GPU (sim:PRESET): "
    "the simulator times each operator the dispatch mode sees, and Dynamo does not compile "
    "while one is active; on a real device (nvml, zeusd, dry-run measuring the GPU) tune keeps "
    "the model compiled"
)


class IterationSink(Protocol):
    """What a drive calls on the loop: the three members it needs of the tuner."""

    #: One iteration's operator names (or optimizer-step signature): the job's identity.
    op_names: list[str]

    def recording(self, iteration: int) -> bool:
        """Whether the operators of ``iteration`` make the job's identity."""
        ...

    def iteration_ended(self, iteration: int, n_ops: int) -> None:
        """Move the run on after ``iteration`` (``n_ops`` operators counted in it)."""
        ...


class Drive(ABC):
    """How the loop runs the program, times it and applies plans to it (see the module).

    Attributes
    ----------
    actuator
        The device's clock.
    top_mhz
        The device's top clock (MHz).
    executor
        What ends the program's iterations and calls the sink: it has ``iteration``,
        ``abandoned``, ``first_divergence`` and ``schedule`` (the one it applies by operator).
    device
        The device's name for the result and the report (None: not known).
    n_launches
        Operators the executor counts per iteration (set by the loop at the end of the
        warm-up and the sweep's iterations; None before).
    """

    #: Whether the device's energy counter is exact (no A/B block sizing needed).
    exact_counter: bool = False
    #: Whether plans apply by time (True) or by operator.
    by_time: bool = False

    def __init__(self, actuator: Actuator, executor: Any) -> None:
        self.actuator = actuator
        self.top_mhz = float(max(actuator.supported_freqs_mhz()))
        self.executor = executor
        self.device: str | None = None
        self.n_launches: int | None = None

    # ------------------------------------------------------------------------- lifecycle
    @abstractmethod
    def make_sweep(self, clocks: Sequence[float], **options: Any) -> ClockSweep:
        """Return the clock sweep over ``clocks`` (options as :class:`ClockSweep`)."""

    def enter(self, stack: ExitStack) -> None:
        """Enter what runs with the program (its executor), closed with ``stack``."""
        stack.enter_context(self.executor)

    @abstractmethod
    def now_s(self) -> float:
        """Return the device's time now (s): the simulated GPU's, or wall time after a sync."""

    # ------------------------------------------------------------------------- applying
    @abstractmethod
    def apply(self, schedule: Schedule) -> None:
        """Apply ``schedule`` from the next iteration."""

    @abstractmethod
    def apply_top(self) -> None:
        """Run the next iterations at the top clock (a reference block, or no plan)."""

    @abstractmethod
    def applied_schedule(self) -> Schedule | None:
        """Return the schedule being applied now (None: a clock set directly)."""

    @abstractmethod
    def can_apply(self, schedule: Schedule) -> bool:
        """Whether ``schedule`` can apply to this program as it is planned."""

    def to_top(self) -> None:
        """Leave tuning: the top clock from the next iteration on."""
        self.apply_top()

    def follow_clock(self, iteration: int, freq_mhz: float) -> None:
        """Set the clock rank 0 set (another rank of a torchrun job), from the next iteration."""
        if self.applied_schedule() is None:
            self.actuator.at(iteration + 1, 0)
            self.actuator.set_freq_mhz(freq_mhz)

    def halt(self) -> None:
        """Stop every switch for good (before the guard restores the clock)."""
        self.executor.halt()

    def iteration_done(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """End the iteration for whatever applies the plans by time (nothing by default)."""

    def fell_back(self) -> set[int]:
        """Return the iterations the executor fell back to the top clock in (none by default)."""
        return set()

    # ------------------------------------------------------------------------- the phases
    @abstractmethod
    def after_sweep(
        self, start: Callable[[Traced | None], None], fail: Callable[[str], None]
    ) -> None:
        """Call ``start`` with the sweep's trace (None: no trace) when planning may begin.

        ``fail`` gets one line if the trace cannot be had.
        """

    def trace_more(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Trace the sweep again, its trace closed: it goes on at a clock active profiling added.

        Nothing by default: a simulated GPU's records are the profile, at once.
        """

    def follower(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Drop what only the profiled rank needs: this rank follows rank 0's tuning."""

    def plan_launches(self) -> int | None:
        """Return the operators a plan maps onto (None: the profile's own operators)."""
        return None

    def stage_profile(self, counted: dict[int, float]) -> Profile:
        """Return this rank's profile of the swept iterations ``counted`` (iteration -> MHz)."""
        raise NotImplementedError(f"{type(self).__name__} does not profile pipeline stages")

    def build_stage_profile(
        self,
        counted: dict[int, float],
        spans: dict[int, tuple[float, float]],
        done: Callable[[Profile | None, str | None], None],
    ) -> None:
        """Build this rank's profile of the swept iterations ``counted`` (iteration -> MHz).

        ``spans``: each iteration's (start, end) on :meth:`now_s`'s clock. Calls ``done(profile,
        None)``, or ``done(None, error)`` with one line; here at once (:meth:`stage_profile`).
        """
        try:
            profile = self.stage_profile(counted)
        except Exception as exc:
            done(None, f"{type(exc).__name__}: {exc}")
            return
        done(profile, None)

    def work_s(self, iteration: int) -> float | None:
        """Return the device's busy time over ``iteration`` (s), where it gives one (else None).

        Ranks of one operator sequence whose work differs (data-parallel ranks of different
        batch sizes) are planned each on its own profile (:mod:`opdvfs.tuner.stages`).
        """
        return None

    def planning_began(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Note that a planning phase began (for :meth:`pace_planning`)."""

    def pace_planning(self, ready: Callable[[float], object]) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Hold the training thread while planning, as the device would (``ready(timeout_s)``)."""

    def cache_identity(self, kind: str) -> dict[str, Any]:
        """Return what, beside the operators, a cached plan is valid for (``cache_key``)."""
        return {"device": kind}

    def timeline(self, iterations: Sequence[TuneIteration]) -> dict[str, list[float]] | None:
        """Return the clock over the last iteration run under the schedule, where measured."""
        return None


class SimulatedGpuDrive(Drive):
    """A program running on a simulated GPU: operator-counting, plans applied by operator."""

    exact_counter = True

    def __init__(self, actuator: Actuator, gpu: SimulatedGpu, sink: IterationSink) -> None:
        super().__init__(actuator, _operator_executor(actuator, sink))
        #: The simulated GPU the program runs on (the actuator's timeline).
        self.gpu = gpu
        self.device = actuator.preset
        self._reference: Schedule | None = None
        #: (device s, wall s) when the current planning phase began.
        self._planning_since: tuple[float, float] | None = None

    def make_sweep(self, clocks: Sequence[float], **options: Any) -> ClockSweep:
        """Return the sweep on the simulated GPU (its kernels and sensors make the profile)."""
        return ClockSweep.on_simulated_gpu(self.actuator, clocks, **options)

    def now_s(self) -> float:
        """Return the simulated GPU's time (s)."""
        return self.gpu.now_s()

    def apply(self, schedule: Schedule) -> None:
        """Apply ``schedule`` by operator from the next iteration."""
        self.executor.use_schedule(schedule)

    def apply_top(self) -> None:
        """Apply a one-stage schedule at the top clock (the executor's operators go on)."""
        if self._reference is None or self._reference.n_ops != self.n_launches:
            self._reference = Schedule.from_stage_freqs(
                [0], [self.top_mhz], n_ops=int(self.n_launches or 1), target=0.0, solver="manual"
            )
        self.apply(self._reference)

    def applied_schedule(self) -> Schedule | None:
        """Return the schedule the executor applies by operator."""
        return self.executor.schedule

    def can_apply(self, schedule: Schedule) -> bool:
        """Return whether ``schedule`` plans the operators the executor counts."""
        return schedule.n_ops == self.n_launches

    def to_top(self) -> None:
        """Go to the top clock: by operator once the operators are counted, else directly."""
        if self.n_launches is None:
            self.actuator.set_freq_mhz(self.top_mhz)
        else:
            self.apply_top()

    def after_sweep(
        self, start: Callable[[Traced | None], None], fail: Callable[[str], None]
    ) -> None:
        """Plan at once: the simulated GPU's records are the profile (no trace)."""
        start(None)

    def plan_launches(self) -> int | None:
        """Return the operators counted: the sweep's rows are kernels, plans map back onto them."""
        return self.n_launches

    def stage_profile(self, counted: dict[int, float]) -> Profile:
        """Return the simulated GPU's kernels of the swept iterations, with its power samples."""
        from opdvfs.runtime.sweep import sim_profile

        return sim_profile(self.gpu, counted)

    def work_s(self, iteration: int) -> float | None:
        """Return the simulated GPU's kernel time over ``iteration`` (s)."""
        kernels = self.gpu.kernels()
        return float(kernels["time_us"][kernels["iteration"] == iteration].sum()) * 1e-6

    def planning_began(self) -> None:
        """Note the simulated GPU's time and the host's when planning began."""
        self._planning_since = (self.now_s(), time.perf_counter())

    def pace_planning(self, ready: Callable[[float], object]) -> None:
        """Keep the iterations at the device's pace while the thread plans.

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
        ahead_s = (self.now_s() - device0_s) - (time.perf_counter() - wall0_s)
        if ahead_s > 0:
            ready(ahead_s)

    def cache_identity(self, kind: str) -> dict[str, Any]:
        """Return the simulated GPU's preset and its work scale."""
        return {"device": self.actuator.preset, "work_scale": self.gpu.work_scale}

    def timeline(self, iterations: Sequence[TuneIteration]) -> dict[str, list[float]] | None:
        """Return the simulated GPU's kernels in the last steady (or tuned) iteration."""
        last = [it.iteration for it in iterations if it.phase in ("steady", "tuned")]
        if not last:
            return None
        kernels = self.gpu.kernels()
        rows = kernels[kernels["iteration"] == last[-1]]
        if rows.empty:
            return None
        start = rows["start_us"].to_numpy(dtype=float)
        return {
            "start_s": ((start - start.min()) * 1e-6).tolist(),
            "time_s": (rows["time_us"].to_numpy(dtype=float) * 1e-6).tolist(),
            "freq_mhz": rows["freq_mhz"].to_numpy(dtype=float).tolist(),
        }


class DeviceDrive(Drive):
    """A real device or a dry run: optimizer-step iterations, a traced sweep, plans by time.

    ``stack`` closes what opening the device's meter needed (a read-only NVML reader).
    """

    by_time = True

    def __init__(self, actuator: Actuator, sink: IterationSink, *, stack: ExitStack) -> None:
        import torch

        super().__init__(actuator, _step_counter(sink))
        self.timed = _timed_executor(actuator)
        self._cuda = torch.cuda.is_available()
        self._stack = stack
        # as sweep_run: the die temperature and the energy counter's period, via NVML
        self.meter = device_meter(actuator, cuda=self._cuda, stack=stack)
        #: The GPU's own name (NVML's, read-only), for the cache key and the result.
        self.gpu_name = _gpu_name(self.meter)
        self.device = self.gpu_name
        self._applied: Schedule | None = None  # what the time-anchored executor applies now
        self._sweep: ClockSweep | None = None
        self._trace: Any = None
        self._trace_stack: ExitStack | None = None
        self._pre_hook: Any = None
        #: What runs at the next optimizer step's start, once, in order (:meth:`_at_next_step`).
        self._before_step: list[Callable[[], None]] = []
        #: Whether this trace's end is arranged (its reader, or a follower's drop).
        self._closing = False
        #: Why a trace of an added clock could not be started (None: it was, or none was asked).
        self._unopened: str | None = None

    def make_sweep(self, clocks: Sequence[float], **options: Any) -> ClockSweep:
        """Return the sweep on the device, timed on its clock, its temperature by the meter."""
        self._sweep = ClockSweep.on_device(
            self.actuator,
            clocks,
            now_s=self.now_s,
            meter=self.meter,
            interval_ms=SAMPLE_MS,
            **options,
        )
        return self._sweep

    def enter(self, stack: ExitStack) -> None:
        """Start the trace, then the step counter and the time-anchored executor."""
        self._start_trace(stack)
        super().enter(stack)
        stack.enter_context(self.timed)  # its issuer closes before the guard restores

    def now_s(self) -> float:
        """Wall time (s) once the GPU's queued work is done."""
        if self._cuda:
            import torch

            torch.cuda.synchronize()
        return time.time()

    def apply(self, schedule: Schedule) -> None:
        """Apply ``schedule`` by time from the next iteration."""
        self.timed.use_schedule(schedule)
        self._applied = schedule

    def apply_top(self) -> None:
        """Pause the time-anchored executor and set the top clock for the next iteration."""
        self.timed.pause()  # nothing pending; a switch being issued has landed
        self._applied = None
        self.actuator.at(self.executor.iteration + 1, 0)
        self.actuator.set_freq_mhz(self.top_mhz)

    def applied_schedule(self) -> Schedule | None:
        """Return the schedule the time-anchored executor applies (None: paused)."""
        return self._applied

    def can_apply(self, schedule: Schedule) -> bool:
        """Return True: any schedule applies, its stages by their planned start times."""
        return True

    def follow_clock(self, iteration: int, freq_mhz: float) -> None:
        """Rank 0's clock: set directly, or the top clock when a schedule was applied."""
        if self.applied_schedule() is None:
            super().follow_clock(iteration, freq_mhz)
        else:
            self.apply_top()  # rank 0 left its schedule for the top clock

    def halt(self) -> None:
        """Stop the counter and the time-anchored executor's switches for good."""
        super().halt()
        self.timed.halt()

    def iteration_done(self) -> None:
        """End the iteration for the time-anchored executor: it arms the next one, if applying."""
        self.timed.mark_iteration()

    def fell_back(self) -> set[int]:
        """Return the iterations the timed executor fell back to the top clock in, and the next.

        It marks the iteration it judged off the plan (its watchdog fired, or its length was
        off) and sets the top clock then, so the next one also starts at the top clock,
        unarmed; both are dropped from a tuned block. (A fallback marked after the round's
        last iteration was measured is not seen.)
        """
        marked = list(self.timed.diverged_iterations)  # (appended from its worker thread)
        return {i + k for i in marked for k in (0, 1)}

    def after_sweep(
        self, start: Callable[[Traced | None], None], fail: Callable[[str], None]
    ) -> None:
        """End the trace at the next optimizer step's start (its hooks cannot go from a hook)."""
        self._closing = True

        def close() -> None:
            if self._trace_stack is None:
                if self._unopened is not None:  # (an added clock's trace: none to read)
                    fail(self._unopened)
                return
            stack, self._trace_stack = self._trace_stack, None
            self._closing = False
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    stack.close()  # the profiler stopped and its trace exported; not yet read
            except Exception as exc:
                fail(f"the sweep's trace could not be read: {exc}")
                return
            start(self._trace)

        self._at_next_step(close)

    def trace_more(self) -> None:
        """Trace the program again from the next optimizer step's start (not from a hook).

        The sweep goes on at a clock active profiling added once its first trace was read
        (:meth:`~opdvfs.runtime.sweep.ClockSweep.extend`): this trace records it until the
        sweep is done again, and :meth:`after_sweep` hands it over as the first one.
        """

        def open_again() -> None:
            if self._trace_stack is not None:
                return
            try:
                self._open_trace()
            except Exception as exc:  # never into the program's step: the run's error
                self._unopened = f"the added clock's trace could not be started: {exc}"

        self._at_next_step(open_again)

    def follower(self) -> None:
        """End this rank's trace, unread, at the next optimizer step's start (not from a hook).

        (Nothing, if its end is arranged already: a stage's first rank reads its trace.)
        """
        if self._trace_stack is None or self._closing:
            return
        self._closing = True

        def close() -> None:
            stack, self._trace_stack = self._trace_stack, None
            self._closing = False
            if stack is None:
                return
            with warnings.catch_warnings(), _no_modes():
                warnings.simplefilter("ignore")
                with contextlib.suppress(Exception):
                    stack.close()

        self._at_next_step(close)

    def build_stage_profile(
        self,
        counted: dict[int, float],
        spans: dict[int, tuple[float, float]],
        done: Callable[[Profile | None, str | None], None],
    ) -> None:
        """Build this stage's profile from its own trace of rank 0's sweep (a stage's first rank).

        The trace ends at the next optimizer step's start (its hooks cannot go from a hook);
        a thread imports it and places its rows in the ``counted`` iterations' ``spans``
        (:func:`~opdvfs.runtime.sweep.traced_profile`), then calls ``done``, while the program
        trains on.
        """
        if self._trace_stack is None:
            done(None, "this rank's trace of the sweep was not kept")
            return
        from opdvfs.runtime.sweep import SweepIteration, traced_profile

        records = [
            SweepIteration(i, spans[i][0], spans[i][1], float(f), "counted")
            for i, f in sorted(counted.items())
            if i in spans
        ]
        freqs = sorted({float(f) for f in counted.values()}, reverse=True)

        def load(trace: Traced) -> None:
            try:
                measured = trace.load()
                if measured is None:
                    raise ValueError("the trace holds no profile")
                profile = traced_profile(measured, records, freqs)
            except Exception as exc:
                done(None, f"the sweep's trace could not be read: {type(exc).__name__}: {exc}")
                return
            done(profile, None)

        def close() -> None:
            stack, self._trace_stack = self._trace_stack, None
            self._closing = False
            if stack is None:
                return
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    stack.close()  # the profiler stopped and its trace exported; not yet read
            except Exception as exc:
                done(None, f"the sweep's trace could not be read: {exc}")
                return
            threading.Thread(
                target=load, args=(self._trace,), name="opdvfs-stage-trace", daemon=True
            ).start()

        self._closing = True
        self._at_next_step(close)

    def cache_identity(self, kind: str) -> dict[str, Any]:
        """Return the actuator's kind and the GPU it measures: an A100's plan is not an H200's.

        Nor is a dry run's (it sets nothing) a real run's.
        """
        return {"device": kind, "work_scale": None, "gpu": self.gpu_name}

    # ------------------------------------------------------------------------- the trace
    def _start_trace(self, stack: ExitStack) -> None:
        """Trace the sweep with torch.profiler (and NVML); the trace closes with ``stack``."""
        self._open_trace()
        stack.callback(self._close_trace_quietly)

    def _at_next_step(self, action: Callable[[], None]) -> None:
        """Run ``action`` once at the next optimizer step's start: a step hook cannot add one.

        (The profiler's own step hook comes and goes with a trace: not from a step hook, as
        PyTorch runs them from a dict it iterates.)
        """
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._before_step.append(action)
        if self._pre_hook is None:

            def before_step(*_: object) -> None:
                actions, self._before_step = self._before_step, []
                for run in actions:
                    run()

            self._pre_hook = register_optimizer_step_pre_hook(before_step)

    def _open_trace(self) -> None:
        """Start a trace of the program, until the sweep is done (:func:`traced`)."""
        from opdvfs.runtime.profiling import traced

        sampler = None
        if self._cuda:
            from opdvfs.runtime.actuators.nvml import meter_gpu
            from opdvfs.runtime.sampler import NvmlSampler

            sampler = NvmlSampler(gpu=meter_gpu(self.meter), interval_ms=SAMPLE_MS)
        sweep = self._sweep
        assert sweep is not None, "make_sweep before enter"
        trace_stack = ExitStack()
        self._trace = trace_stack.enter_context(
            traced(
                sampler=sampler,
                cuda=self._cuda,
                freq_mhz=self.top_mhz,
                interval_ms=SAMPLE_MS,
                until=lambda: sweep.done,
                lazy=True,  # imported in the planning thread, not in an optimizer hook
            )
        )
        self._trace_stack = trace_stack

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
        self._before_step = []


def make_drive(actuator: Actuator, sink: IterationSink, *, stack: ExitStack) -> Drive:
    """Return the drive for ``actuator``: the one place the loop's device kind is decided."""
    gpu = actuator.timeline
    if gpu is not None:
        return SimulatedGpuDrive(actuator, gpu, sink)
    return DeviceDrive(actuator, sink, stack=stack)


# ----------------------------------------------------------------------------- the executors
@contextlib.contextmanager
def _no_modes() -> Any:
    """Run the block outside the dispatch modes: the executor must not count its operators."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _gpu_name(meter: Meter | None) -> str | None:
    """Return the name of the GPU ``meter`` reads (NVML's, e.g. "NVIDIA H200"), or None."""
    if meter is None:
        return None
    try:
        name = meter.name()
    except Exception:  # a name NVML cannot read: the key and the report go without it
        return None
    return name if isinstance(name, str) and name else None


def _operator_executor(actuator: Actuator, sink: IterationSink) -> Any:
    """Return the executor ``opdvfs run`` uses, with the sink called at each iteration end.

    The simulated GPU's: the operator-counting dispatch mode that drives the simulator, so a
    compiled model runs eagerly under it (:data:`SIM_COMPILED_HINT`). Its switches go onto the
    simulated GPU's own timeline as their trigger operator is dispatched (as every
    :class:`ScheduleExecutor`'s on a simulated GPU), never through a worker thread that waits
    out a switch's delay in host time.
    """
    from opdvfs.runtime.dispatch import ScheduleExecutor

    class TuneExecutor(ScheduleExecutor):
        """:class:`ScheduleExecutor`, recording one iteration's names; the sink runs after it."""

        compiled_hint = SIM_COMPILED_HINT

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if sink.recording(self.iteration):
                sink.op_names.append(func._schema.name)
            return super().__torch_dispatch__(func, types, args, kwargs)

        def mark_iteration(self) -> None:
            iteration, n_ops = self.iteration, self.op_index
            super().mark_iteration()
            sink.iteration_ended(iteration, n_ops)

    return TuneExecutor(None, actuator, max_diverged=2)


def step_signature(optimizer: Any) -> list[str]:
    """Return what identifies a job at an optimizer step, with no operator seen: its parameters.

    The optimizer's class, then each parameter it steps (dtype, shape, device type) in its
    groups' order, and whether ``torch.compile`` has compiled anything in this process (a
    compiled job runs other kernels at other times than its eager form). Cheap (read once a
    run) and the same whether the model is compiled or not: off the simulated GPU tune holds
    no dispatch mode, so the operators themselves are not seen (:func:`_step_counter`).
    Not in it: the batch (neither is it in the operator names a simulated GPU's key hashes).
    """
    from opdvfs.runtime.recorder import compile_in_use

    kind = type(optimizer)
    params = [
        f"{p.dtype} {tuple(p.shape)} {p.device.type}"
        for group in getattr(optimizer, "param_groups", ())
        for p in group.get("params", ())
    ]
    return [f"{kind.__module__}.{kind.__qualname__}", *params, f"compiled={compile_in_use()}"]


def _step_counter(sink: IterationSink) -> Any:
    r"""Return the iteration counter tune uses off the simulated GPU: no dispatch mode at all.

    Iterations end at the optimizer step (PyTorch's global step hook, as
    :class:`~opdvfs.runtime.applier.IterationCounter` and ``opdvfs run --trigger time``), so a
    ``torch.compile``\\ d model stays compiled: Dynamo skips every frame under a dispatch mode.
    The job's identity for the cache and the ranks' comparison is :func:`step_signature`,
    taken at the step that ends the last warm-up iteration.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from opdvfs.runtime.recorder import IterationCounter

    class _StepCounter(IterationCounter):
        """Counts optimizer steps; the sink runs at each. Applies nothing (TimedExecutor does)."""

        #: What the loop reads of the operator-counting executor: it never diverges.
        abandoned = False
        first_divergence: str | None = None
        schedule: Schedule | None = None

        def __init__(self) -> None:
            super().__init__(optimizer_steps=False)  # the hook below, which sees the optimizer

        def __enter__(self) -> Any:
            def step(optimizer: Any, *_: object) -> None:
                if sink.recording(self.iteration):
                    sink.op_names[:] = step_signature(optimizer)
                self.mark_iteration()

            self._hook = register_optimizer_step_post_hook(step)
            return super().__enter__()

        def mark_iteration(self) -> None:
            iteration = self.iteration
            super().mark_iteration()
            sink.iteration_ended(iteration, 0)

        def halt(self) -> None:
            """Nothing to stop: the time-anchored executor issues the switches."""

    return _StepCounter()


def _timed_executor(actuator: Actuator, *, tolerance: float = 0.2) -> Any:
    """Return the time-anchored executor ``opdvfs run --trigger time`` uses, driven by the loop.

    Its iterations end where the loop's do (no optimizer hook of its own);
    :meth:`~opdvfs.runtime.timed.TimedExecutor.pause` stops it applying between the A/B
    blocks. ``tolerance`` as :class:`~opdvfs.runtime.timed.TimedExecutor` (its default).
    """
    from opdvfs.runtime.timed import TimedExecutor

    return TimedExecutor(None, actuator, tolerance=tolerance, optimizer_steps=False)
