"""Profile a running program at several clocks in one run: the clock sweep (#21, needs torch).

Today a user profiles at K clocks by locking each by hand (``nvidia-smi -lgc``, root) and running
``opdvfs capture --profile`` K times. :func:`sweep_run` does it in one run of the unchanged
script, between its iterations (each ends at an optimizer step, as
:class:`~opdvfs.runtime.recorder.IterationCounter` counts them):

1. warm-up: the first ``warmup`` iterations at the top clock (the first iteration differs:
   allocations, optimizer state); the last one's length sizes the rest;
2. for each clock, highest first: set it through the actuator; an iteration counts only if it
   *started* a settle time after the request (the device's switch latency: on a simulated GPU
   exact, in its virtual time, so a 2 ms iteration under a 15 ms switch discards eight; on a
   real GPU the latency plus a margin, and at least the first iteration after a switch); where
   the device reads a temperature, its counted iterations must be thermally steady (Zeus's
   ``zeus.profile`` idea), judged by the temperature's trend over them: at most
   ``max_temp_delta_c`` per iteration, else the oldest is dropped (``unsteady``) and one more
   counted (:meth:`ClockSweep._steady_window`);
   ``iterations_per_clock`` counted iterations (sized for a power sensor: at each clock as many
   of its own iterations as span the sensor's windows, so fewer at a low clock, whose iterations
   are longer), then the next clock;
3. the clock is restored (once) as soon as the last clock is done, and the training goes on at
   the driver's clock. A :class:`~opdvfs.runtime.actuators.ClockGuard` restores it on every
   other path: an exception, SIGINT/SIGTERM, interpreter exit, a script that ends mid-sweep.

The result is one :class:`~opdvfs.profile.Profile` with every operator at every clock: per-op
times from the device's per-kernel records (a simulated GPU's :meth:`SimulatedGpu.kernels`; on a
real GPU the torch.profiler CUDA kernels, imported as ``opdvfs capture --profile`` imports them,
:func:`~opdvfs.runtime.profiling.traced`), the clock column from what was set, and the device's
power samples with each operator's start on their clock (``wall_s``), from which the power
models attribute per-op power (:func:`opdvfs.models.attribution.power_rows`).

A sweep that did not finish (the script stopped iterating first) gives no profile: the result
names the clocks done and missing and the iterations the script must run
(:attr:`SweepResult.needed_iterations`); the CLI writes nothing and exits with status 2.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from opdvfs.exceptions import CaptureError, ValidationError
from opdvfs.models.attribution import MIN_WINDOWS, sensor_iterations, sensor_span_s
from opdvfs.profile import Profile
from opdvfs.runtime.actuators import Actuator, ClockGuard
from opdvfs.runtime.actuators.base import Meter
from opdvfs.runtime.profiling import Traced
from opdvfs.runtime.recorder import IterationCounter
from opdvfs.sim.gpu import SimulatedGpu

__all__ = [
    "REAL_SETTLE_S",
    "ClockSweep",
    "SweepIteration",
    "SweepResult",
    "SweepTraces",
    "device_meter",
    "joined_traces",
    "sim_profile",
    "sweep_profile",
    "sweep_run",
    "traced_profile",
]

#: Settle time after a clock request on a real GPU (s): NVML's locked-clock change lands within
#: ~10-100 ms (a100-like preset: 15 ms); one more iteration is discarded on top of it.
REAL_SETTLE_S = 0.1
#: How often NVML's total-energy counter moves (s): every 100 ms on an H200 (measured, median
#: of 113 updates under reads every ~24 ms); the power windows are its updates.
NVML_COUNTER_S = 0.1
#: Counted iterations per clock when the device has no power sensor to size them by.
DEFAULT_PER_CLOCK = 5
#: Sensor windows per clock the default iteration count aims for: the attribution's minimum
#: (:data:`~opdvfs.models.attribution.MIN_WINDOWS`) plus two, as a window is counted only if it
#: lies wholly inside the clock's counted iterations.
SWEEP_WINDOWS = MIN_WINDOWS + 2
#: Unsteady iterations a clock waits at least before its iterations count anyway (else twice
#: its count): tied to the count alone, a clock counting one long iteration (one spans its
#: sensor's windows) gave up after two while sim:a100-like's die still warmed from idle at the
#: top clock (the tiny GPT's 1.55 s iterations: steady after four).
UNSTEADY_PATIENCE = 6

Phase = Literal["warmup", "settle", "unsteady", "counted"]


@dataclass(frozen=True)
class SweepIteration:
    """One iteration of the swept run.

    Attributes
    ----------
    iteration
        Its index (optimizer steps counted from 0).
    start_s, end_s
        When it started and ended on the device's clock (s): a simulated GPU's virtual time,
        else ``time.time()`` after the device finished its work.
    freq_mhz
        The clock set while it ran (MHz).
    phase
        ``warmup``, ``settle`` (a switch had not landed when it started), ``unsteady`` (counted,
        then dropped: the temperature's trend over the counted iterations was steeper than
        allowed) or ``counted``.
    temp_delta_c
        Its temperature change (deg C), where the device reads one.
    """

    iteration: int
    start_s: float
    end_s: float
    freq_mhz: float
    phase: Phase
    temp_delta_c: float | None = None


class ClockSweep(IterationCounter):
    """Set each clock in turn between a running program's iterations (see the module).

    Parameters
    ----------
    actuator
        Sets the clocks (entered and guarded by the caller).
    freqs_mhz
        Clocks to profile (MHz), each supported by the actuator; swept highest first.
    warmup
        Iterations at the top clock before the sweep (>= 1).
    iterations_per_clock
        Counted iterations per clock; None: at each clock as many as span ``sensor_s``'s
        (``(period_s, window_s)``) :data:`SWEEP_WINDOWS` complete windows, that clock's own
        iterations measured as they run (:attr:`per_clock`: the estimate at the top clock's
        iteration length, from the warm-up), or :data:`DEFAULT_PER_CLOCK` without a sensor.
    settle_s
        Time from a clock request until an iteration may start and count (s).
    now_s
        The device's clock (s), read at each iteration end.
    temp_c
        The die temperature now (deg C), or None: no steadiness check.
    max_temp_delta_c
        Largest temperature trend over a clock's counted iterations (deg C per iteration: the
        least-squares slope). After ``2 * iterations_per_clock`` (at least
        :data:`UNSTEADY_PATIENCE`) unsteady iterations at one clock, iterations count anyway
        (warned once), so a slowly warming device cannot stall the sweep.
    on_done
        Called once when the last clock is done (restore the clock: the guard's restore).
    more
        Called when the last clock is done, before ``on_done``: a clock to sweep too (MHz,
        supported by the actuator and not swept yet), or None: the sweep is done
        (``opdvfs tune``'s active profiling, :func:`opdvfs.tuner.policy.added_clock`).
    """

    def __init__(
        self,
        actuator: Actuator,
        freqs_mhz: Sequence[float],
        *,
        warmup: int = 2,
        iterations_per_clock: int | None = None,
        settle_s: float = REAL_SETTLE_S,
        now_s: Callable[[], float] = time.time,
        temp_c: Callable[[], float] | None = None,
        max_temp_delta_c: float = 1.0,
        sensor_s: tuple[float, float] | None = None,
        on_done: Callable[[], None] | None = None,
        more: Callable[[], float | None] | None = None,
    ) -> None:
        super().__init__(optimizer_steps=True)
        if warmup < 1:
            raise ValidationError(f"warmup {warmup}: expected at least 1", field="warmup")
        if iterations_per_clock is not None and iterations_per_clock < 1:
            raise ValidationError(
                f"iterations per clock {iterations_per_clock}: expected at least 1",
                field="iterations_per_clock",
            )
        clocks = sorted({actuator.check_freq_mhz(float(f)) for f in freqs_mhz}, reverse=True)
        if not clocks:
            raise ValidationError("no clock to profile", field="freqs_mhz")
        self.actuator = actuator
        self.freqs_mhz = tuple(clocks)
        self.top_mhz = float(max(actuator.supported_freqs_mhz()))
        self.warmup = warmup
        self.per_clock = iterations_per_clock
        self._fixed_per_clock = iterations_per_clock is not None
        self.settle_s = settle_s
        self.sensor_s = sensor_s
        self._now, self._temp = now_s, temp_c
        self.max_temp_delta_c = max_temp_delta_c
        self._on_done = on_done
        self._more = more
        self.records: list[SweepIteration] = []
        #: Length of the last warm-up iteration (s): the top clock's iteration.
        self.iteration_s: float | None = None
        self.done = False
        #: Iterations the program ran after the sweep (not recorded).
        self.iterations_after = 0
        self._clock = -1  # index into freqs_mhz; -1: warm-up
        self._set_mhz = self.top_mhz
        self._settled_at = -math.inf
        self._counted = 0
        self._counted_s = 0.0  # time of the counted iterations at the current clock
        self._unsteady = 0
        self._window: list[int] = []  # the current clock's counted records (indices)
        self._warned = False
        self._last_end = 0.0
        self._last_temp: float | None = None

    @classmethod
    def on_simulated_gpu(
        cls,
        actuator: Actuator,
        freqs_mhz: Sequence[float],
        *,
        settle_s: float | None = None,
        **options: Any,
    ) -> ClockSweep:
        """Return a sweep read off a simulated GPU's own instruments (the actuator's timeline).

        Its virtual clock, die temperature and power sensor; settling for its switch latency
        unless ``settle_s`` is given. ``options`` go to the constructor.

        Raises
        ------
        ValidationError
            If the actuator runs on wall time (no :attr:`~Actuator.timeline`): use
            :meth:`on_device`.
        """
        gpu = actuator.timeline
        if gpu is None:
            raise ValidationError(
                f"the {actuator.kind} actuator runs on wall time, not a simulated GPU's: "
                "sweep it with ClockSweep.on_device",
                field="actuator",
            )
        return cls(
            actuator,
            freqs_mhz,
            settle_s=gpu.switch_latency_s if settle_s is None else settle_s,
            now_s=gpu.now_s,
            temp_c=gpu.temperature_c,
            sensor_s=gpu.sensor_s,
            **options,
        )

    @classmethod
    def on_device(
        cls,
        actuator: Actuator,
        freqs_mhz: Sequence[float],
        *,
        now_s: Callable[[], float],
        meter: Any | None,
        interval_ms: float = 20.0,
        settle_s: float | None = None,
        **options: Any,
    ) -> ClockSweep:
        """Return a sweep of a real device (or a dry run), read off its NVML ``meter``.

        The one construction ``sweep_run`` and ``opdvfs tune`` share off the simulated GPU:
        settling :data:`REAL_SETTLE_S` unless ``settle_s`` is given; with a meter (what
        :func:`device_meter` returns) the die temperature checks each counted iteration's
        steadiness, and the iterations per clock (unless ``options`` fix them) are sized for
        :data:`SWEEP_WINDOWS` updates of NVML's energy counter, which moves every
        ``max(interval_ms / 1e3, NVML_COUNTER_S)`` s whatever the sampler's read interval
        (the power windows are the counter's updates: ``io.samples.counter_windows``).
        Without a meter: no temperature check, :data:`DEFAULT_PER_CLOCK` iterations.

        Parameters
        ----------
        now_s
            The device's clock (s), read at each iteration end (synchronise the device first).
        meter
            Has ``read_temperature_c()`` (deg C), or None.
        interval_ms
            The power sampler's read interval (ms).
        """
        counter_s = max(interval_ms / 1e3, NVML_COUNTER_S)
        return cls(
            actuator,
            freqs_mhz,
            settle_s=REAL_SETTLE_S if settle_s is None else settle_s,
            now_s=now_s,
            temp_c=meter.read_temperature_c if meter is not None else None,
            sensor_s=(counter_s, counter_s) if meter is not None else None,
            **options,
        )

    def __enter__(self) -> Any:
        """Lock the top clock for the warm-up and start counting iterations."""
        self.actuator.set_freq_mhz(self.top_mhz)
        self._last_end = self._now()
        self._last_temp = self._temp() if self._temp is not None else None
        return super().__enter__()

    @property
    def set_mhz(self) -> float:
        """The clock the sweep set last (MHz): the one it profiles now; the top once it is done."""
        return self._set_mhz

    # ------------------------------------------------------------------------- the sweep
    def _begin_clock(self, index: int, now: float) -> None:
        self._clock, self._counted, self._counted_s, self._unsteady = index, 0, 0.0, 0
        self._window = []
        freq = self.freqs_mhz[index]
        if freq != self._set_mhz:
            self.actuator.at(self.iteration + 1, 0)
            self.actuator.set_freq_mhz(freq)
            self._set_mhz = freq
            self._settled_at = now + self.settle_s
        # the same clock as the warm-up's (the top): nothing to wait for

    def _finish(self) -> None:
        self.done = True
        self._set_mhz = self.top_mhz  # restored: the driver's clock (the top, under load)
        self.actuator.at(self.iteration + 1, 0)
        if self._on_done is not None:
            self._on_done()

    def end_iteration(self, n_ops: int) -> None:
        """Record the iteration that ended; count it, and move the sweep on."""
        if self.done:  # the program goes on untouched: no device synchronisation, no record
            self.iterations_after += 1
            return
        now = self._now()
        start, self._last_end = self._last_end, now
        delta = None
        if self._temp is not None:
            temp = self._temp()
            if self._last_temp is not None:
                delta = temp - self._last_temp
            self._last_temp = temp
        phase: Phase
        if self._clock < 0:
            phase = "warmup"
            if self.iteration + 1 >= self.warmup:
                self.iteration_s = now - start
                if self.per_clock is None:
                    self.per_clock = self._default_per_clock(self.iteration_s)
                self._begin_clock(0, now)
        elif start < self._settled_at:
            phase = "settle"
        else:
            phase = "counted"
            self._counted += 1
            self._counted_s += now - start
            self._window.append(len(self.records))
        self.records.append(SweepIteration(self.iteration, start, now, self._set_mhz, phase, delta))
        if phase == "counted" and self._clock_complete() and self._steady_window():
            if self._clock + 1 < len(self.freqs_mhz) or self._one_more():
                self._begin_clock(self._clock + 1, now)
            else:
                self._finish()

    def extend(self, freq_mhz: float, *, iteration: int) -> None:
        """Sweep one more clock, the sweep being done: from the iteration after ``iteration``.

        ``opdvfs tune``'s active profiling on a real device (or a dry run): the clock worth
        adding is known only once the sweep's trace is read, while the program trains on at the
        top clock (the iterations between are not the sweep's). The sweep resumes at
        ``freq_mhz`` as :attr:`more` would have gone on (the request at the next iteration,
        its settle time, the counted iterations and their steadiness), its records continuing,
        and is done again once they are in (``on_done`` called again). ``iteration``: the
        program's iteration that just ended.

        Raises
        ------
        ValidationError
            If the sweep is still running, or ``freq_mhz`` was swept already or is not
            supported.
        """
        with self._lock:
            if not self.done:
                raise ValidationError("the sweep is still running: nothing to extend")
            freq = self.actuator.check_freq_mhz(float(freq_mhz))
            if freq in self.freqs_mhz:
                raise ValidationError(f"{freq:g} MHz was swept already", field="freq_mhz")
            self.freqs_mhz = (*self.freqs_mhz, freq)
            self.done = False
            self.iteration = iteration  # (the program's count: the sweep missed the ones since)
            now = self._now()
            self._last_end = now
            self._last_temp = self._temp() if self._temp is not None else None
            self._begin_clock(len(self.freqs_mhz) - 1, now)
            self.iteration = iteration + 1

    def _one_more(self) -> bool:
        """Append the clock ``more`` names, if any and new; return whether one was appended."""
        extra = self._more() if self._more is not None else None
        if extra is None:
            return False
        freq = self.actuator.check_freq_mhz(float(extra))
        if freq in self.freqs_mhz:
            return False
        self.freqs_mhz = (*self.freqs_mhz, freq)
        return True

    def window_trend_c(self) -> float | None:
        """Return the die's temperature trend over the clock's counted iterations (deg C each).

        The least-squares slope of its temperature at their boundaries against their count;
        None without a temperature.
        """
        deltas = [self.records[i].temp_delta_c for i in self._window]
        if not deltas or any(d is None for d in deltas):
            return None
        temps_c = np.r_[0.0, np.cumsum(np.asarray(deltas, dtype=float))]
        return float(np.polyfit(np.arange(len(temps_c)), temps_c, 1)[0])

    def _steady_window(self) -> bool:
        """Whether the clock's counted iterations were thermally steady; else slide them on.

        Steadiness is judged by the temperature's trend over the counted iterations (its
        least-squares slope per iteration, at most ``max_temp_delta_c``), not iteration by
        iteration before they count: the die's drift across them is bounded alike (by the
        limit times their number), but an iteration's change on a sensor that reads whole
        degrees (NVML) is 0, 1 or 2 deg C, where the trend over several resolves a fraction,
        and the iterations that count from the start need no waiting when the trend is flat.
        While the trend is steeper, the oldest counted iteration turns ``unsteady`` and
        counting goes on; after ``2 * per_clock`` of those (at least
        :data:`UNSTEADY_PATIENCE`) the iterations count anyway (warned once), so a slowly
        warming device cannot stall the sweep.
        """
        cap = max(2 * (self.per_clock or 1), UNSTEADY_PATIENCE)
        while True:
            trend = self.window_trend_c()
            if trend is None or abs(trend) <= self.max_temp_delta_c + 1e-9:  # (fit's rounding)
                return True
            if self._unsteady >= cap:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"opdvfs: the temperature still moved more than "
                        f"{self.max_temp_delta_c:g} deg C per iteration at "
                        f"{self.freqs_mhz[self._clock]:g} MHz; counting its iterations anyway",
                        stacklevel=3,
                    )
                return True
            oldest = self._window.pop(0)
            record = self.records[oldest]
            self.records[oldest] = replace(record, phase="unsteady")
            self._unsteady += 1
            self._counted -= 1
            self._counted_s -= record.end_s - record.start_s
            if not self._clock_complete():
                return False

    def _clock_complete(self) -> bool:
        """Whether the current clock has its counted iterations.

        Given ``iterations_per_clock`` (or without a sensor), that many. Sized for a sensor:
        once they span the sensor's :data:`SWEEP_WINDOWS` windows, which is what the power
        attribution needs, whatever their number. The count estimated from the warm-up's last
        iteration (:attr:`per_clock`) is not the test: on a real GPU that iteration often runs
        slower than the steady ones (an H200 GPT step: 10 counted iterations of 101 ms held 9
        complete 100 ms counter windows, below the attribution's
        :data:`~opdvfs.models.attribution.MIN_WINDOWS`), and a lower clock's iterations are
        longer (sim:h100-like's tiny GPT: 5.3 s at 210 MHz against 0.98 s at the top, so one
        spans the 2.1 s its 1 s windows need where the top clock's count ran three).
        """
        if self._fixed_per_clock or self.sensor_s is None:
            return self._counted >= (self.per_clock or 1)
        if self._counted < 1:
            return False
        period_s, window_s = self.sensor_s
        span_s = sensor_span_s(
            period_ms=period_s * 1e3, window_ms=window_s * 1e3, windows=SWEEP_WINDOWS
        )
        return self._counted_s >= span_s

    def _default_per_clock(self, iteration_s: float) -> int:
        if self.sensor_s is None or not iteration_s > 0:
            return DEFAULT_PER_CLOCK
        period_s, window_s = self.sensor_s
        return sensor_iterations(
            iteration_s, period_ms=period_s * 1e3, window_ms=window_s * 1e3, windows=SWEEP_WINDOWS
        )

    # ------------------------------------------------------------------------- outcome
    def clocks_done(self) -> tuple[float, ...]:
        """Return the clocks whose counted iterations are all in (MHz, in sweep order)."""
        if self.done:
            return self.freqs_mhz
        return self.freqs_mhz[: max(self._clock, 0)]

    def needed_iterations(self) -> int:
        """Return the iterations the program must run for the whole sweep (from the warm-up).

        Warm-up, then per clock its counted iterations plus those a switch discards: about
        ``ceil(settle_s / iteration_s)`` at the top clock's pace (lower clocks are slower, so
        fewer), at least one. Before the warm-up ended, the last iteration's length stands in.
        Sized for a sensor, a clock ``f`` counts the iterations that span the sensor's windows
        at its own pace, unknown before it runs: counted here at the longest its iterations can
        be, ``iteration_s * top / f`` (all compute-bound: time in inverse proportion to the
        clock), so the sum is a lower bound.
        """
        iteration_s = self.iteration_s
        if iteration_s is None and self.records:
            iteration_s = self.records[-1].end_s - self.records[-1].start_s
        per_clock = self.per_clock
        if per_clock is None:
            per_clock = self._default_per_clock(iteration_s or 0.0)
        discard = 1
        if iteration_s and iteration_s > 0:
            discard = max(1, math.ceil(self.settle_s / iteration_s))
        switches = sum(1 for f in self.freqs_mhz if f != self.top_mhz)
        counted = len(self.freqs_mhz) * per_clock
        if not self._fixed_per_clock and self.sensor_s is not None and iteration_s:
            period_s, window_s = self.sensor_s
            span_s = sensor_span_s(
                period_ms=period_s * 1e3, window_ms=window_s * 1e3, windows=SWEEP_WINDOWS
            )
            longest_s = iteration_s * self.top_mhz / np.asarray(self.freqs_mhz)
            counted = int(np.maximum(np.ceil(span_s / longest_s - 1e-9), 1).sum())
        return self.warmup + counted + switches * discard


@dataclass
class SweepResult:
    """What a sweep measured.

    Attributes
    ----------
    profile
        Every operator at every swept clock, with power samples; None if the sweep did not
        finish.
    records
        Every iteration until the sweep was done (:class:`SweepIteration`).
    freqs_mhz
        The clocks asked for, in sweep order.
    clocks_done
        Those whose iterations were all measured.
    needed_iterations
        What the program must run for the whole sweep (:meth:`ClockSweep.needed_iterations`).
    iterations_per_clock
        Counted iterations per clock: given, or sized for the sensor at the top clock's pace
        (a slower clock counts fewer of its longer iterations: :attr:`counted_per_clock`).
    warmup
        Iterations at the top clock before the sweep.
    signals
        The signals the clock guard took during the run (numbers, in order): a program that
        caught one and ended by itself (a preemption handler) ended the sweep early.
    """

    profile: Profile | None
    records: list[SweepIteration]
    freqs_mhz: tuple[float, ...]
    clocks_done: tuple[float, ...]
    needed_iterations: int
    iterations_per_clock: int
    warmup: int
    signals: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether every clock was measured."""
        return len(self.clocks_done) == len(self.freqs_mhz)

    @property
    def counted_per_clock(self) -> dict[float, int]:
        """The counted iterations at each clock (MHz -> count), in sweep order."""
        counts = dict.fromkeys(self.freqs_mhz, 0)
        for r in self.records:
            if r.phase == "counted":
                counts[r.freq_mhz] = counts.get(r.freq_mhz, 0) + 1
        return counts

    @property
    def missing_mhz(self) -> tuple[float, ...]:
        """The clocks not (wholly) measured."""
        return tuple(f for f in self.freqs_mhz if f not in self.clocks_done)

    def incomplete_message(self) -> str:
        """One line: the iterations the run had, the clocks missing, the iterations needed."""
        done = ", ".join(f"{f:g}" for f in self.clocks_done) or "none"
        missing = ", ".join(f"{f:g}" for f in self.missing_mhz)
        return (
            f"the script ended after {len(self.records)} iterations, before the clock sweep "
            f"was done (clocks done: {done}; missing: {missing} MHz): it needs at least "
            f"{self.needed_iterations} iterations ({self.warmup} warm-up, "
            f"{self.iterations_per_clock} per clock and those a switch discards); run it "
            "longer or lower --iterations-per-clock (nothing was written)"
        )


def device_meter(actuator: Actuator, *, cuda: bool, stack: ExitStack) -> Meter | None:
    """Return what reads the swept device's die temperature, or None: nothing does.

    The actuator's own NVML reader where it has one (``nvml``, ``zeusd``, a dry run measuring
    the GPU: its ``meter``); else, when the program runs on CUDA, a read-only
    :class:`~opdvfs.runtime.actuators.nvml.NvmlReader` of this process's GPU
    (:func:`~opdvfs.runtime.actuators.nvml.current_gpu`), closed with ``stack``.
    """
    meter = actuator.meter
    if meter is None and cuda:
        from opdvfs.runtime.actuators.nvml import NvmlReader

        meter = NvmlReader()
        stack.callback(meter.close)
    return meter


def _counted_clocks(records: Sequence[SweepIteration]) -> dict[int, float]:
    return {r.iteration: r.freq_mhz for r in records if r.phase == "counted"}


def _sim_profile(gpu: SimulatedGpu, sweep: ClockSweep) -> Profile:
    """Build the sweep's profile from a simulated GPU's kernel records and power samples."""
    return sim_profile(gpu, _counted_clocks(sweep.records))


def sim_profile(gpu: SimulatedGpu, counted: Mapping[int, float]) -> Profile:
    """Return a simulated GPU's profile of the iterations ``counted`` (iteration -> MHz set).

    Every kernel of those iterations, at the clock its iteration was counted at, with the
    device's power samples. (``opdvfs tune --mode generate`` profiles each phase's iterations.)

    Raises
    ------
    CaptureError
        If a counted iteration ran (in part) at another clock.
    """
    kernels = gpu.kernels()
    rows = kernels[kernels["iteration"].isin(list(counted))].copy()
    set_mhz = rows["iteration"].map(counted).to_numpy(dtype=float)
    ran_at = rows["freq_mhz"].to_numpy(dtype=float)
    if not np.array_equal(set_mhz, ran_at):  # the settle time is the device's own latency
        bad = int(rows["iteration"].to_numpy()[np.flatnonzero(set_mhz != ran_at)[0]])
        raise CaptureError(
            f"iteration {bad} was counted at {counted[bad]:g} MHz but ran at another clock"
        )
    first = rows.groupby("iteration")["start_us"].transform("min")
    ops = pd.DataFrame(
        {
            "iteration": rows["iteration"].to_numpy(),
            "op": rows["op"].to_numpy(),
            "name": rows["name"].to_numpy(),
            "type": rows["type"].to_numpy(),
            "stream": rows["stream"].to_numpy(),
            "peer": rows["peer"].to_numpy(),
            "freq_mhz": set_mhz,
            "time_us": rows["time_us"].to_numpy(),
            "start_us": (rows["start_us"] - first).to_numpy(),
            "wall_s": rows["start_us"].to_numpy() * 1e-6,  # the samples' (virtual) clock
        }
    )
    period_s, window_s = gpu.sensor_s
    meta = {
        "format": "opdvfs capture",
        "sources": ["opdvfs capture --freqs"],
        "device": gpu.name,
        "simulated": True,
        "work_scale": gpu.work_scale,
        "sensor": {"period_ms": period_s * 1e3, "window_ms": window_s * 1e3},
    }
    return Profile(ops, gpu.power_samples(), meta=meta)


class SweepTraces(Traced):
    """A sweep's traces read as one: the sweep's, then one per clock active profiling added.

    ``opdvfs tune`` on a real device reads the sweep's trace to choose a clock to add, then
    traces the sweep's iterations at it anew (:meth:`ClockSweep.extend`). :meth:`load` imports
    each (once, in the calling thread) and joins their rows and power samples, all timed on
    ``time.time()``'s clock, into one measured profile that :func:`sweep_profile` places in
    the counted iterations of both.
    """

    def __init__(self, traces: Sequence[Traced]) -> None:
        super().__init__(traces[0].sampler, traces[0].freq_mhz)
        self.parts = list(traces)

    def load(self) -> Profile | None:
        """Return the traces' rows and samples as one profile (None: one of them failed)."""
        if self.profile is None:
            parts = [t.load() for t in self.parts]
            if any(p is None for p in parts):
                return None
            self.profile = joined_traces([p for p in parts if p is not None])
        return self.profile


def joined_traces(parts: Sequence[Profile]) -> Profile:
    """Return traces of one run, in order, as one measured profile (the first one's meta).

    Each trace numbers its iterations from 0: a later one's follow the earlier ones' (the
    sweep places the rows in its own iterations by their times, :func:`traced_profile`).
    Their power samples (where every part has them) join in time order.
    """
    tables, after = [], 0
    for part in parts:
        ops = part.ops
        tables.append(ops.assign(iteration=ops["iteration"].to_numpy() + after))
        after += int(ops["iteration"].max()) + 1 if len(ops) else 0
    ops = pd.concat(tables, ignore_index=True)
    samples = [p.samples for p in parts]
    joined = None
    if all(s is not None for s in samples):
        joined = pd.concat(samples, ignore_index=True).sort_values("t_s", kind="stable")
    return Profile(ops, joined, meta=parts[0].meta)


def _traced_profile(measured: Profile, sweep: ClockSweep) -> Profile:
    """Build the sweep's profile from a trace: a row's clock is its counted iteration's."""
    counted = [r for r in sweep.records if r.phase == "counted"]
    return traced_profile(measured, counted, sweep.freqs_mhz)


def traced_profile(
    measured: Profile, counted: Sequence[SweepIteration], freqs_mhz: Sequence[float]
) -> Profile:
    """Build a swept profile from a trace of the run and its ``counted`` iterations.

    A row's clock is its counted iteration's. Rows are placed by their start (``wall_s``, the
    trace's ``time.time()`` clock) within the counted iterations' spans (``start_s``,
    ``end_s``); the sweep synchronised the device at each iteration end, so those spans hold
    exactly their iteration's kernels. Rows in no counted iteration go, and so do counted
    iterations whose operator sequence is not the most common one: the trace's clock and
    ``time.time()`` agree to within a fraction of a millisecond, so on a loaded host an
    operator at an iteration's edge can land in its neighbour (as the trace reader drops
    iterations whose sequence differs, :func:`opdvfs.io.torch_trace.read`). A pipeline stage
    that followed rank 0's sweep builds its own this way (:mod:`opdvfs.tuner.stages`).

    Raises
    ------
    CaptureError
        If the trace has no wall-clock times, or a clock of ``freqs_mhz`` keeps no iteration.
    """
    ops = measured.ops
    if "wall_s" not in ops:
        raise CaptureError("the trace has no wall-clock times (baseTimeNanoseconds)")
    counted = sorted(counted, key=lambda r: r.start_s)
    starts = np.array([r.start_s for r in counted])
    ends = np.array([r.end_s for r in counted])
    wall = ops["wall_s"].to_numpy(dtype=float)
    pos = np.searchsorted(starts, wall, side="right") - 1
    inside = (pos >= 0) & (wall <= ends[np.clip(pos, 0, None)]) if counted else pos < -1
    rows = ops[inside].copy()
    which = pos[inside]
    rows["iteration"] = np.array([r.iteration for r in counted], dtype=np.int64)[which]
    rows["freq_mhz"] = np.array([r.freq_mhz for r in counted], dtype=float)[which]
    rows["op"] = rows.groupby("iteration").cumcount()
    rows = _common_sequence(rows, freqs_mhz)
    meta = measured.meta
    meta["sources"] = ["opdvfs capture --freqs"]
    return Profile(rows, measured.samples, meta=meta)


def _common_sequence(rows: pd.DataFrame, freqs_mhz: Sequence[float]) -> pd.DataFrame:
    """Keep the iterations whose operator-name sequence is the most common one.

    Raises
    ------
    CaptureError
        If a swept clock keeps no iteration.
    """
    if rows.empty:
        return rows
    signature = rows.groupby("iteration")["name"].agg(lambda s: hash(tuple(s)))
    keep = signature.index[signature == signature.mode().iloc[0]]
    kept = rows[rows["iteration"].isin(keep)]
    lost = sorted(set(freqs_mhz) - set(kept["freq_mhz"].unique()))
    if lost:
        raise CaptureError(
            f"the trace's counted iterations at {', '.join(f'{f:g}' for f in lost)} MHz ran "
            "another operator sequence than the others"
        )
    return kept


def sweep_run(
    run: Callable[[], object],
    actuator: Actuator,
    freqs_mhz: Sequence[float],
    *,
    warmup: int = 2,
    iterations_per_clock: int | None = None,
    settle_s: float | None = None,
    max_temp_delta_c: float = 1.0,
    cuda: bool | None = None,
    interval_ms: float = 20.0,
) -> SweepResult:
    """Run ``run()`` once, profiling it at each of ``freqs_mhz`` between its iterations.

    Parameters
    ----------
    run
        Runs the program (its optimizer steps end the iterations).
    actuator
        A :class:`~opdvfs.runtime.actuators.SimGpuActuator` (the program runs on the simulated
        GPU; times and power are its own), or a real device's (NVML, zeusd: the program is
        traced with torch.profiler and NVML), or a dry run (the CPU's own op times, no power:
        for testing the sweep's logic). Entered here, and closed at the end.
    freqs_mhz
        Clocks to profile (MHz).
    warmup, iterations_per_clock, max_temp_delta_c
        As :class:`ClockSweep`.
    settle_s
        Time from a clock request until an iteration may count (s); default the simulated
        GPU's switch latency, else :data:`REAL_SETTLE_S`.
    cuda, interval_ms
        The trace's (:func:`~opdvfs.runtime.profiling.traced`), for actuators other than a
        simulated GPU.

    Returns
    -------
    SweepResult
        With a profile if every clock was measured.

    Raises
    ------
    Exception
        Whatever the program raised (the clock restored first).
    """
    guard = ClockGuard(actuator)
    sweep_kw: dict[str, Any] = {
        "warmup": warmup,
        "iterations_per_clock": iterations_per_clock,
        "max_temp_delta_c": max_temp_delta_c,
        "on_done": guard.restore,
    }
    measured: Profile | None = None
    if actuator.timeline is not None:
        sweep = ClockSweep.on_simulated_gpu(actuator, freqs_mhz, settle_s=settle_s, **sweep_kw)
        with actuator, guard, sweep:
            run()
    else:
        import torch

        from opdvfs.runtime.profiling import traced

        stack = ExitStack()  # NVML's thermometer, if opened here: closed with the run
        use_cuda = torch.cuda.is_available() if cuda is None else cuda
        sampler: Any = None
        if use_cuda:
            from opdvfs.runtime.actuators.nvml import meter_gpu
            from opdvfs.runtime.sampler import NvmlSampler

            sampler = NvmlSampler(gpu=meter_gpu(actuator.meter), interval_ms=interval_ms)

        def device_now() -> float:
            if use_cuda:  # the iteration's kernels are done: the next clock meets none of them
                torch.cuda.synchronize()
            return time.time()

        sweep = ClockSweep.on_device(
            actuator,
            freqs_mhz,
            now_s=device_now,
            meter=device_meter(actuator, cuda=use_cuda, stack=stack),
            interval_ms=interval_ms,
            settle_s=settle_s,
            **sweep_kw,
        )
        with (
            stack,
            actuator,
            guard,
            traced(
                sampler=sampler,
                cuda=use_cuda,
                freq_mhz=sweep.top_mhz,
                interval_ms=interval_ms,
                until=lambda: sweep.done,
            ) as trace,
            sweep,
        ):
            run()
        measured = trace.profile
    profile = sweep_profile(sweep, measured) if sweep.done else None
    return SweepResult(
        profile,
        list(sweep.records),
        sweep.freqs_mhz,
        sweep.clocks_done(),
        sweep.needed_iterations(),
        sweep.per_clock or sweep._default_per_clock(sweep.iteration_s or 0.0),
        sweep.warmup,
        tuple(guard.signals),
    )


def sweep_profile(sweep: ClockSweep, measured: Profile | None = None) -> Profile:
    """Return a finished sweep's profile: every operator at every swept clock (see the module).

    On a simulated GPU (the sweep's actuator) from its kernel records and power samples, which
    may be read while the program runs on (``opdvfs tune`` plans while it trains); else from
    ``measured``, the trace of the sweep's run (:func:`~opdvfs.runtime.profiling.traced`).

    Raises
    ------
    CaptureError
        If the sweep is not done, or a real device's sweep has no trace.
    """
    if not sweep.done:
        raise CaptureError("the clock sweep is not done: it has no profile yet")
    actuator = sweep.actuator
    timeline = actuator.timeline
    if timeline is not None:
        profile = _sim_profile(timeline, sweep)
    elif measured is None:
        raise CaptureError("the sweep ran on a real device and no trace was given")
    else:
        profile = _traced_profile(measured, sweep)
    return _with_sweep_meta(profile, sweep, actuator)


def _with_sweep_meta(profile: Profile, sweep: ClockSweep, actuator: Actuator) -> Profile:
    phases = pd.Series([r.phase for r in sweep.records]).value_counts()
    meta = profile.meta
    meta["sweep"] = {
        "actuator": actuator.kind,
        "freqs_mhz": list(sweep.freqs_mhz),
        "warmup": sweep.warmup,
        "iterations_per_clock": sweep.per_clock,
        "settle_s": sweep.settle_s,
        "max_temp_delta_c": sweep.max_temp_delta_c,
        "iterations": {str(k): int(v) for k, v in phases.items()},
    }
    return Profile(profile.ops, profile.samples, meta=meta)
