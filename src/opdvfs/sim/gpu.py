"""A simulated GPU: the twin applied online to the operators a real script dispatches.

:class:`SimulatedGpu` is a device whose clock can be set and whose time and power come from the
simulator (:class:`~opdvfs.sim.twin.SimulatedDevice`) applied, as they are launched, to the
operators the program dispatches (:mod:`opdvfs.runtime.simgpu_feed` turns each aten operator into
a launch). It keeps a *virtual* device timeline: kernels run back to back, each wholly at the clock
in effect when it starts (as if the host always kept ahead of the device: the CPU's own speed
does not show, so a script run on a CPU times like the same script on that GPU), and a clock
request lands the preset's switch latency after it is issued (SetFreq semantics, as
:mod:`opdvfs.sim.timeline`: a newer request replaces the clock of one still pending, which
then never lands, and the change lands when the pending one was due).

It exposes only what a real GPU's instruments give -- the supported clocks, set/reset clock, a
total-energy counter (J, as NVML's ``nvmlDeviceGetTotalEnergyConsumption``), power samples at
the sensor's period each averaging its window (NVML: 100 ms on A100-class, 1 s on Hopper), the
current power, and per-kernel start/duration/clock records (a profiler trace) -- never the twin's
parameters or per-operator model.

How a kernel's time and power are found: each distinct launch (name, type, stream, FLOPs,
bytes) is a *kind*; the first time a kind runs at a clock, all kinds missing at that clock are
run once on a noise-free copy of the twin (one :meth:`SimulatedDevice.run` for the batch), and
each launch then takes its kind's time at its clock with the twin's own measurement noise
(multiplicative ``noise_rel`` plus absolute jitter, drawn per launch) and its kind's chip power.
Launches are buffered and placed on the timeline in vectorised batches (at a clock request, a
reading, an iteration end, or every :data:`_BATCH` launches); between clock events a batch is one
cumulative sum.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from opdvfs._means import iteration_means
from opdvfs.exceptions import ValidationError
from opdvfs.sim.sensors import sample_sensors
from opdvfs.sim.thermal import rc_temperature
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.workload import Workload

__all__ = ["NO_KERNEL", "SimulatedGpu"]

#: Kind of a launch that starts no kernel (a view, an allocation): no time, no energy.
NO_KERNEL = -1
#: Launches buffered before they are placed on the timeline in one vectorised step.
_BATCH = 4096
#: The launch fields that make a kind: what the twin's physics reads, and the name.
_KIND_FIELDS = ("name", "type", "stream", "flops", "bytes_loaded", "bytes_stored", "peer")
#: A kind field a launch may leave out, and the value it then takes.
_KIND_DEFAULTS = {"peer": -1}
#: The largest ``work_scale`` (an H100's day of work per CPU operator is ~1e9; beyond 1e12 the
#: simulated times of a large model lose their precision and then overflow).
MAX_WORK_SCALE = 1e12

#: The fields ``work_scale`` multiplies.
_SCALED_FIELDS = ("flops", "bytes_loaded", "bytes_stored")
#: The idle stretch the twin runs to find the device's idle power (s).
_IDLE_S = 0.1


class SimulatedGpu:
    """A GPU simulated from preset ``preset``, driven by the operators launched on it.

    Times on its timeline are virtual (µs from the first launch, reported in s); energy in J;
    power in W; clocks in MHz. Thread-safe: launches come from the program's threads, clock
    requests from the executor's worker thread.

    Parameters
    ----------
    preset
        A simulated device preset (:data:`opdvfs.sim.presets.PRESETS`).
    freq_mhz
        The clock it starts at (MHz), as one locked before the program started; default the
        top clock (the driver's own choice under load).
    work_scale
        Each launch does this many times its operator's FLOPs and bytes, so that a model small
        enough for a CPU stands for a larger one (a bigger batch or width) on the GPU.
    seed
        Seed of the measurement noise (kernel times, power samples).

    Raises
    ------
    ValidationError
        For an unknown preset (the message names the presets).
    """

    def __init__(
        self,
        preset: str,
        *,
        freq_mhz: float | None = None,
        work_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not 0 < work_scale <= MAX_WORK_SCALE:
            raise ValidationError(
                f"work_scale {work_scale:g}: expected > 0 and at most {MAX_WORK_SCALE:g} (a "
                "larger one overflows the simulated times)",
                field="work_scale",
            )
        self.work_scale = float(work_scale)
        twin = SimulatedDevice.from_preset(preset, seed=seed)
        params = twin.params
        # the kind tables come from a noise-free twin; the noise is drawn per launch instead
        quiet = params.model_copy(update={"noise_rel": 0.0, "jitter_us": 0.0})
        self._twin = SimulatedDevice(twin.spec, quiet, seed=seed)
        self._noise_rel, self._jitter_us = params.noise_rel, params.jitter_us
        self._sensor_noise_w = params.power_noise_w
        self.name = twin.spec.name
        self._clocks_mhz = np.asarray(twin.spec.freqs_mhz, dtype=float)
        self._top = len(self._clocks_mhz) - 1
        self._latency_us = twin.spec.switch_latency_ms * 1e3
        sensor = twin.sensor_ms
        self._period_s, self._window_s = sensor["period_ms"] * 1e-3, sensor["window_ms"] * 1e-3
        self._seed = seed
        self._rng = np.random.default_rng([seed, 11])
        self._lock = threading.RLock()
        # kinds: their fields, and (kinds, clocks) tables of time (us) and chip power (W)
        self._kinds: dict[tuple[Any, ...], int] = {}
        self._kind_rows: list[dict[str, Any]] = []
        self._time_us = np.full((0, len(self._clocks_mhz)), np.nan)
        self._power_w = np.full((0, len(self._clocks_mhz)), np.nan)
        # launches not yet placed: kind, iteration, op index
        self._buffer: list[tuple[int, int, int]] = []
        # placed kernels, in chunks: start, duration (us), clock index, kind, energy, where
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self._placed: tuple[np.ndarray, ...] | None = None
        self._n_placed = 0
        self._end_us = 0.0
        self._energy_j = 0.0
        # clock state: in effect, pending (clock, land_us), requests not yet issued
        self._clock = self._top if freq_mhz is None else int(twin.clock_index([freq_mhz])[0])
        # before the program: the device idled at its clock long enough to settle
        idle = pd.DataFrame({"name": ["idle"], "type": "Host", "stream": "host"})
        _, run = self._twin.run(
            Workload(idle.assign(gap_before_us=_IDLE_S * 1e6), name="idle"),
            freq_mhz=float(self._clocks_mhz[self._clock]),
        )
        self._idle_w = (run.chip_energy_j - float(run.op_chip_energy_j.sum())) / _IDLE_S
        self._start_c = params.ambient_c + params.k_c_per_w * self._idle_w
        self._pending: tuple[int, float] | None = None
        self._future: list[tuple[float, int, int]] = []  # (issue_us, order, clock)
        self._requests = 0
        self._reset_wanted = False
        # iterations: the global index of each one's first launch; ends (us) and energy (J)
        self._iteration, self._op_index = 0, 0
        self._iteration_first = [0]
        self.iteration_ends_s: list[float] = []
        self.iteration_energy_j: list[float] = []

    # ---------------------------------------------------------------------------- instruments
    def supported_freqs_mhz(self) -> tuple[float, ...]:
        """Return the clocks the device accepts (MHz), ascending."""
        return tuple(float(f) for f in self._clocks_mhz)

    @property
    def switch_latency_s(self) -> float:
        """Seconds from a clock request to the clock taking effect."""
        return self._latency_us * 1e-6

    @property
    def sensor_s(self) -> tuple[float, float]:
        """The power sensor's ``(period_s, window_s)``: time between samples, time each averages."""
        return self._period_s, self._window_s

    def request_freq_mhz(self, freq_mhz: float, *, at_s: float | None = None) -> None:
        """Request the core clock ``freq_mhz`` (MHz); it lands the switch latency later.

        Parameters
        ----------
        freq_mhz
            One of :meth:`supported_freqs_mhz`.
        at_s
            Virtual time the request is issued (s); None or a time already past: now (the end
            of the last launched kernel). A request due later waits on the timeline.

        Raises
        ------
        ValidationError
            If the clock is not supported.
        """
        clock = int(self._twin.clock_index([freq_mhz])[0])
        with self._lock:
            self._flush()
            issue_us = self._end_us if at_s is None else max(at_s * 1e6, self._end_us)
            self._requests += 1
            bisect.insort(self._future, (issue_us, self._requests, clock))
            self._advance(self._end_us)

    def cancel_requests(self) -> float:
        """Drop the requests issued for a later time that the timeline has not reached yet.

        As a switch worker's cancel on a real GPU (nothing queued is issued after it): a
        request already issued stays pending and lands. Returns the clock the device settles
        at (MHz): the pending request's, else the one in effect.
        """
        with self._lock:
            self._flush()
            self._future.clear()
            clock = self._pending[0] if self._pending is not None else self._clock
            return float(self._clocks_mhz[clock])

    def reset(self) -> None:
        """Give the clock back to the driver: a request for the top clock.

        Requests issued for a later time are dropped first (:meth:`cancel_requests`): nothing
        scheduled before the reset lands after it. Safe from a signal handler: if the
        interrupted thread holds the device, the request is issued as soon as it lets go.
        """
        if not self._lock.acquire(blocking=False):
            self._reset_wanted = True
            return
        try:
            self._reset_wanted = False
            self._flush()  # the launches before the reset see the requests due in them
            self._future.clear()
            self.request_freq_mhz(float(self._clocks_mhz[self._top]))
        finally:
            self._lock.release()

    def clock_mhz(self) -> float:
        """Return the clock in effect now (MHz; a pending request has not landed)."""
        with self._lock:
            self._flush()
            return float(self._clocks_mhz[self._clock])

    def now_s(self) -> float:
        """Return the virtual time now (s): the end of the last kernel launched."""
        with self._lock:
            self._flush()
            return self._end_us * 1e-6

    def idle_until(self, t_s: float) -> None:
        """Let the device idle until virtual time ``t_s`` (a receive waiting for its sender).

        The next launch starts no earlier than ``t_s``; the idle span runs no kernel (no
        energy), and the clock events due in it happen. Earlier times change nothing.
        """
        with self._lock:
            self._flush()
            if t_s * 1e6 > self._end_us:
                self._end_us = t_s * 1e6
                self._advance(self._end_us)

    def energy_j(self) -> float:
        """Return the total-energy counter (J since the device was created)."""
        with self._lock:
            self._flush()
            return self._energy_j

    def power_w(self) -> float:
        """Return the power the sensor reads now: the mean over the last window (W).

        Before the first launch: the device's idle power.
        """
        with self._lock:
            self._flush()
            if self._n_placed == 0:
                return self._idle_w
            edges_s, cum_j = self._edges()
            t = edges_s[-1]
            t0 = max(t - self._window_s, 0.0)
            span = t - t0
            if span <= 0:
                return 0.0
            return float((cum_j[-1] - np.interp(t0, edges_s, cum_j)) / span)

    def power_samples(self) -> pd.DataFrame:
        """Return the power sensor's samples so far, as NVML's would be read.

        Columns ``t_s`` (virtual), ``power_w`` (mean over the window ending then, with the
        sensor's noise), ``temp_c`` (the die then, quantised as the sensor reads it),
        ``freq_mhz`` (the clock then) and ``energy_j`` (the counter then), one row every sensor
        period from one window after the first launch.
        """
        with self._lock:
            self._flush()
            _, _, clock, _, _, _, _ = self._records()
            if len(clock) == 0:
                return pd.DataFrame(columns=["t_s", "power_w", "temp_c", "freq_mhz", "energy_j"])
            edges_s, cum_j = self._edges()
            temp_c = self._temperatures_c(edges_s, cum_j)
            freq = self._clocks_mhz[clock]
        samples = sample_sensors(
            edges_s,
            cum_j,
            cum_j,
            temp_c,
            freq,
            period_s=self._period_s,
            window_s=self._window_s,
            noise_w=self._sensor_noise_w,
            temp_resolution_c=self._twin.params.temp_resolution_c,
            rng=np.random.default_rng([self._seed, 12, len(edges_s)]),
        )
        if samples["t_s"].iloc[0] < self._window_s - 1e-12:  # shorter than one window: none
            samples = samples.iloc[:0]
        columns = ["t_s", "power_w", "temp_c", "freq_mhz", "energy_j"]
        return samples[columns].reset_index(drop=True)

    def temperature_c(self) -> float:
        """Return the die temperature now (deg C, unquantised)."""
        with self._lock:
            self._flush()
            edges_s, cum_j = self._edges()
            return float(self._temperatures_c(edges_s, cum_j)[-1])

    def kernels(self) -> pd.DataFrame:
        """Return the kernels run so far, as a profiler trace gives them.

        Columns ``iteration``, ``op`` (the launch's position in its iteration, views and
        allocations counted), ``name``, ``type`` and ``stream`` (the launch's, as a trace's
        operator carries them), ``peer`` (a send's or receive's other rank, else -1),
        ``start_us`` (virtual), ``time_us``, ``freq_mhz``. Launches
        that start no kernel are left out.
        """
        with self._lock:
            self._flush()
            start, dur, clock, kind, _, iteration, op = self._records()
            rows = list(self._kind_rows)
        keep = kind != NO_KERNEL
        which = kind[keep]
        return pd.DataFrame(
            {
                "iteration": iteration[keep],
                "op": op[keep],
                "name": np.asarray([r["name"] for r in rows], dtype=object)[which],
                "type": np.asarray([r["type"] for r in rows], dtype=object)[which],
                "stream": np.asarray([r["stream"] for r in rows], dtype=object)[which],
                "peer": np.asarray([r["peer"] for r in rows], dtype=np.int64)[which],
                "start_us": start[keep],
                "time_us": dur[keep],
                "freq_mhz": self._clocks_mhz[clock[keep]],
            }
        )

    def op_start_s(self, iteration: int, op_index: int) -> float | None:
        """Return when launch ``op_index`` of ``iteration`` started (virtual s).

        The next launch (not yet dispatched) starts now; None for a launch further ahead or
        an iteration that never began.
        """
        with self._lock:
            self._flush()
            if iteration >= len(self._iteration_first):
                return None
            index = self._iteration_first[iteration] + op_index
            if index < self._n_placed:
                return float(self._records()[0][index]) * 1e-6
            return self._end_us * 1e-6 if index == self._n_placed else None

    # ---------------------------------------------------------------------------- the program
    def launch(self, op: Mapping[str, Any], *, kernel: bool = True) -> None:
        """Launch one operator (it runs once the launches before it have).

        ``op`` has a workload row's fields (``name``, ``type``, ``stream``, ``flops``,
        ``bytes_loaded``, ``bytes_stored``, and optionally ``peer``); ``kernel=False``: it
        starts no kernel (a view, an allocation) but keeps its place in the iteration's count.
        """
        kind = self._kind(op) if kernel else NO_KERNEL
        with self._lock:
            self._buffer.append((kind, self._iteration, self._op_index))
            self._op_index += 1
            if len(self._buffer) >= _BATCH:
                self._flush()

    def mark_iteration(self) -> None:
        """End the current iteration: its end time and the energy counter are recorded."""
        with self._lock:
            self._flush()
            self.iteration_ends_s.append(self._end_us * 1e-6)
            self.iteration_energy_j.append(self._energy_j)
            self._iteration += 1
            self._op_index = 0
            self._iteration_first.append(self._n_placed)

    def per_iteration(self, skip: int = 1) -> dict[str, float | None]:
        """Mean virtual time (s) and energy (J) per iteration after the first ``skip``.

        As :meth:`~opdvfs.runtime.applier.ScheduleApplier.per_iteration`, on the device's
        timeline and counter.
        """
        with self._lock:
            ends, energy = self.iteration_ends_s[skip:], self.iteration_energy_j[skip:]
        return iteration_means(ends, energy)

    # ---------------------------------------------------------------------------- internals
    def _kind(self, op: Mapping[str, Any]) -> int:
        key = tuple(op[f] if f in op else _KIND_DEFAULTS[f] for f in _KIND_FIELDS)
        kind = self._kinds.get(key)
        if kind is None:
            with self._lock:
                kind = self._kinds.setdefault(key, len(self._kind_rows))
                if kind == len(self._kind_rows):
                    row = dict(zip(_KIND_FIELDS, key, strict=True))
                    for work in _SCALED_FIELDS:
                        row[work] = float(row[work]) * self.work_scale
                    self._kind_rows.append(row)
        return kind

    def _fill(self, kinds: np.ndarray, clock: int) -> None:
        """Make sure the tables hold ``kinds`` at ``clock``: one twin run for those missing."""
        n = len(self._kind_rows)
        if len(self._time_us) < n:
            grow = np.full((max(n, 2 * len(self._time_us)) - len(self._time_us), 1), np.nan)
            wide = np.repeat(grow, len(self._clocks_mhz), axis=1)
            self._time_us = np.vstack([self._time_us, wide])
            self._power_w = np.vstack([self._power_w, wide])
        kinds = np.unique(kinds[kinds != NO_KERNEL])
        missing = kinds[np.isnan(self._time_us[kinds, clock])]
        if missing.size == 0:
            return
        ops = pd.DataFrame([self._kind_rows[k] for k in missing])
        work = Workload(ops, name="launched")
        _, run = self._twin.run(work, freq_mhz=float(self._clocks_mhz[clock]))
        self._time_us[missing, clock] = run.dur_us
        self._power_w[missing, clock] = run.op_chip_energy_j / (run.dur_us * 1e-6)

    def _next_event_us(self) -> float:
        land = self._pending[1] if self._pending is not None else np.inf
        issue = self._future[0][0] if self._future else np.inf
        return float(min(land, issue))

    def _advance(self, t_us: float) -> None:
        """Apply the clock events up to ``t_us``: requests issued, pending ones landing."""
        while True:
            land = self._pending[1] if self._pending is not None else np.inf
            issue = self._future[0][0] if self._future else np.inf
            if min(land, issue) > t_us:
                return
            if land <= issue:  # a request landing as another is issued lands first
                assert self._pending is not None
                self._clock, self._pending = self._pending[0], None
            else:
                issue_us, _, clock = self._future.pop(0)
                # a newer request replaces the pending clock but not its landing time (as
                # sim/timeline: requests closer than the latency must not starve the change)
                due_us = self._pending[1] if self._pending is not None else None
                self._pending = (clock, issue_us + self._latency_us if due_us is None else due_us)

    def _flush(self) -> None:
        """Place the buffered launches on the timeline (vectorised between clock events)."""
        if self._buffer:
            launched = np.asarray(self._buffer, dtype=np.int64)
            self._buffer.clear()
            kinds, where = launched[:, 0], launched[:, 1:]
            n = len(kinds)
            scale = np.exp(self._rng.normal(0.0, self._noise_rel, n))
            jitter = np.abs(self._rng.normal(0.0, self._jitter_us, n))
            real = kinds != NO_KERNEL
            i = 0
            while i < n:
                clock = self._clock
                part = kinds[i:]
                self._fill(part, clock)
                base = np.where(real[i:], self._time_us[np.maximum(part, 0), clock], 0.0)
                dur = np.where(real[i:], base * scale[i:] + jitter[i:], 0.0)
                ends = self._end_us + np.cumsum(dur)
                starts = ends - dur
                # kernels starting before the next clock event run at this clock
                j = int(np.searchsorted(starts, self._next_event_us(), side="left"))
                if j:
                    watts = self._power_w[np.maximum(part[:j], 0), clock]
                    power = np.where(real[i : i + j], watts, 0.0)
                    energy = power * dur[:j] * 1e-6
                    self._chunks.append(
                        (
                            starts[:j],
                            dur[:j],
                            np.full(j, clock),
                            part[:j],
                            energy,
                            where[i : i + j, 0],
                            where[i : i + j, 1],
                        )
                    )
                    self._placed = None
                    self._n_placed += j
                    self._end_us = float(ends[j - 1])
                    self._energy_j += float(energy.sum())
                    i += j
                self._advance(self._end_us)
        if self._reset_wanted:  # a signal handler asked while this thread held the device
            self._reset_wanted = False
            self._future.clear()
            self._requests += 1
            bisect.insort(self._future, (self._end_us, self._requests, self._top))
            self._advance(self._end_us)

    def _records(self) -> tuple[np.ndarray, ...]:
        """Return the placed kernels: start, duration, clock, kind, energy, iteration, op."""
        if self._placed is None:
            if self._chunks:
                self._chunks = [tuple(np.concatenate(c) for c in zip(*self._chunks, strict=True))]
                self._placed = self._chunks[0]
            else:
                empty_f, empty_i = np.empty(0), np.empty(0, dtype=np.int64)
                self._placed = (empty_f, empty_f, empty_i, empty_i, empty_f, empty_i, empty_i)
        return self._placed

    def _temperatures_c(self, edges_s: np.ndarray, cum_j: np.ndarray) -> np.ndarray:
        """Die temperature at each kernel boundary: the twin's RC model driven by the power."""
        p, start_c = self._twin.params, self._start_c
        dt_s = np.diff(edges_s)
        if dt_s.size == 0:
            return np.full(len(edges_s), start_c)
        power_w = np.divide(np.diff(cum_j), dt_s, out=np.zeros_like(dt_s), where=dt_s > 0)
        ends_c = rc_temperature(
            dt_s,
            power_w,
            start_c=start_c,
            ambient_c=p.ambient_c,
            k_c_per_w=p.k_c_per_w,
            tau_s=p.tau_s,
        )
        return np.r_[start_c, ends_c]

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Kernel boundaries (s) and the energy counter at each, shape (n + 1,)."""
        start, dur, _, _, energy, _, _ = self._records()
        edges_s = np.r_[start[:1], start + dur] * 1e-6 if len(start) else np.zeros(1)
        return edges_s, np.r_[0.0, np.cumsum(energy)]

    def __repr__(self) -> str:
        """Say which preset it simulates."""
        return f"SimulatedGpu({self.name!r})"
