"""The simulated accelerator: a workload at fixed clocks (``profile``) or on a schedule (``run``).

It combines the pure pieces of :mod:`opdvfs.sim`: per-op physics at every clock
(:func:`~opdvfs.sim.physics.op_timing`), the switch-aware timeline
(:func:`~opdvfs.sim.timeline.execute`), the RC thermal model with temperature-dependent leakage
solved by fixed-point passes, and sensors sampled at the device's real granularity. Given a seed,
every result is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import ValidationError
from opdvfs.profile import Profile
from opdvfs.result import RunResult, StageRecord
from opdvfs.schedule import Schedule
from opdvfs.sim.params import TwinParams
from opdvfs.sim.physics import (
    CUBE,
    VECTOR,
    activity,
    core_power_w,
    coupled_power_w,
    leakage_scale,
    op_arrays,
    op_timing,
    uncore_power_w,
)
from opdvfs.sim.presets import get_preset
from opdvfs.sim.sensors import sample_sensors
from opdvfs.sim.thermal import rc_temperature
from opdvfs.sim.timeline import Execution, execute
from opdvfs.workloads.workload import Workload

__all__ = ["SensorMs", "SimRun", "SimulatedDevice"]

#: Thermal fixed-point passes (power -> temperature -> leakage -> power); the paper's own
#: iteration converges in <= 4, and leakage is a small share of power.
_THERMAL_PASSES = 3
#: Relative noise of a fine-grained (Ascend lpmi-like) per-op power reading.
_POWER_READ_NOISE = 0.005


@dataclass(frozen=True)
class SimRun:
    """Everything one simulated run produced, per op instance (shape (iterations * n_ops,)).

    ``chip_energy_j`` and ``core_energy_j`` are totals over the run, idle gaps included;
    ``op_*_energy_j`` cover each op's own execution only.
    """

    #: The timeline: per-op arrays index the clocks the run used; ``switches[k].clock`` indexes
    #: the device's clock list.
    execution: Execution
    dur_us: np.ndarray
    op_chip_energy_j: np.ndarray
    op_core_energy_j: np.ndarray
    chip_energy_j: float
    core_energy_j: float
    temp_start_c: np.ndarray
    samples: pd.DataFrame
    iterations: int
    n_ops: int
    core_busy: np.ndarray
    ld_busy: np.ndarray
    st_busy: np.ndarray
    unit: np.ndarray
    #: Clock each op instance started at (MHz).
    freq_mhz: np.ndarray

    @property
    def iteration_time_s(self) -> float:
        """Mean wall time per iteration: the run starts at 0 (idle gaps included)."""
        return float(self.execution.end_us[-1]) * 1e-6 / self.iterations


class SensorMs(TypedDict):
    """A power sensor's sampling period and averaging window, in ms (a profile's ``sensor``)."""

    period_ms: float
    window_ms: float


class SimulatedDevice:
    """A simulated accelerator with the paper's physics (DESIGN §2).

    Parameters
    ----------
    spec
        What the device exposes: clocks, V-f curve, switch latency, sensor period.
    params
        Hidden physics constants.
    seed
        Seed of every random draw (noise, jitter, sensor noise).
    switch_delay_ms
        Extra time before each of a schedule's SetFreq requests is issued (ms, default 0):
        the paper's Fig. 18 ablation, "SetFreq delayed by 14 ms" on a chip whose own switch
        takes 1 ms. Every request still lands (in order, one latency after it is issued), so
        each switch takes effect that much later than planned.
    """

    def __init__(
        self,
        spec: DeviceSpec,
        params: TwinParams,
        *,
        seed: int = 0,
        switch_delay_ms: float = 0.0,
    ) -> None:
        if spec.voltage is None:
            raise ValidationError(f"device {spec.name!r}: the simulator needs a V-f curve")
        if not switch_delay_ms >= 0:
            raise ValidationError("switch_delay_ms must be >= 0", field="switch_delay_ms")
        self.spec = spec
        self.params = params
        self.seed = seed
        self.switch_delay_ms = float(switch_delay_ms)
        self._clocks = np.asarray(spec.freqs_mhz, dtype=float)
        self._volts = spec.voltage.voltage_v(self._clocks)

    @classmethod
    def from_preset(cls, name: str, *, seed: int = 0) -> SimulatedDevice:
        """Build the simulated device of preset ``name`` (:data:`opdvfs.sim.presets.PRESETS`).

        Raises
        ------
        ValidationError
            If there is no such preset (the message names those that exist).
        """
        preset = get_preset(name)
        return cls(preset.spec, preset.twin, seed=seed)

    def with_switch_delay(self, delay_ms: float) -> SimulatedDevice:
        """Return the same device (same seed), each SetFreq issued ``delay_ms`` late.

        Paper Fig. 18: the reference plan "with SetFreq delayed by 14 ms" (simulating a GPU's
        ~15 ms switch on a chip whose own takes 1 ms): the plan's 1 ms latency hiding still
        applies, so every switch takes effect ``delay_ms`` after the op it was planned for
        starts, and the ops between run at the previous stage's clock.
        """
        return SimulatedDevice(self.spec, self.params, seed=self.seed, switch_delay_ms=delay_ms)

    @property
    def sensor_ms(self) -> SensorMs:
        """The power sensor: ``period_ms`` between samples and the ``window_ms`` each averages.

        What a profile records in ``meta["sensor"]`` and what
        :func:`opdvfs.models.attribution.sensor_iterations` takes.
        """
        return SensorMs(
            period_ms=self.spec.power_sample_period_ms, window_ms=self.params.power_window_ms
        )

    # ----------------------------------------------------------------------------- physics
    def clock_index(self, freqs_mhz: Sequence[float] | np.ndarray) -> np.ndarray:
        """Index of each clock in the device's list; a clock it does not support is an error."""
        f = np.asarray(freqs_mhz, dtype=float)
        idx = np.searchsorted(self._clocks, f)
        ok = (idx < len(self._clocks)) & np.isclose(
            self._clocks[np.minimum(idx, len(self._clocks) - 1)], f
        )
        if not ok.all():
            bad = f[~ok][0]
            raise ValidationError(
                f"device {self.spec.name!r}: {bad:g} MHz is not a supported clock "
                f"({self._clocks[0]:g}-{self._clocks[-1]:g} MHz, {len(self._clocks)} steps)",
                field="freq_mhz",
            )
        return idx

    # ----------------------------------------------------------------------------- core run
    def _simulate_static(
        self,
        workload: Workload,
        clock: int,
        *,
        iterations: int,
        rng: np.random.Generator,
        start_temp_c: float | None = None,
    ) -> SimRun:
        """:meth:`_simulate` at one clock (index) throughout: no switch is ever issued."""
        none = np.empty(0, dtype=int)
        return self._simulate(
            workload,
            iterations=iterations,
            initial_clock=clock,
            triggers=none,
            clocks=none,
            latency_us=0.0,
            rng=rng,
            start_temp_c=start_temp_c,
        )

    def _simulate(
        self,
        workload: Workload,
        *,
        iterations: int,
        initial_clock: int,
        triggers: np.ndarray,
        clocks: np.ndarray,
        latency_us: float,
        rng: np.random.Generator,
        start_temp_c: float | None = None,
        delay_us: np.ndarray | None = None,
    ) -> SimRun:
        p = self.params
        # Only the clocks this run can use: a static run costs one column, not the whole list.
        used = np.unique(np.r_[initial_clock, clocks]).astype(int)
        initial_clock = int(np.searchsorted(used, initial_clock))
        clocks = np.searchsorted(used, clocks)
        f_used, v_used = self._clocks[used], self._volts[used]
        arrays = op_arrays(workload.ops)
        timing = op_timing(arrays, f_used, p)
        n = len(arrays)
        total = n * iterations
        op = np.tile(np.arange(n), iterations)
        mult = np.exp(rng.normal(0.0, p.noise_rel, total))
        jitter = np.abs(rng.normal(0.0, p.jitter_us, total))
        # the peer wait is the other ranks' time, not this op's: no measurement noise on it
        wait = arrays.wait_us[op][:, None]
        # (time - wait) * mult + wait + jitter, in place: one (total, clocks) array, not four
        dur = timing.time_us[op]
        dur -= wait
        dur *= mult[:, None]
        dur += wait
        dur += jitter[:, None]
        del mult, jitter, wait
        gap = np.tile(workload.ops["gap_before_us"].to_numpy(dtype=float), iterations)
        host = None
        dispatch_us = workload.ops["host_us"].to_numpy(dtype=float)
        if dispatch_us.any():
            # The host dispatches op i when it has dispatched all before it (it never syncs), so
            # a host slower than the device makes the device wait (host-bound inference).
            per_op = np.tile(dispatch_us, iterations)
            host = np.cumsum(per_op) - per_op
        exe = execute(
            dur,
            initial_clock=initial_clock,
            triggers=triggers,
            clocks=clocks,
            latency_us=latency_us,
            gap_us=gap,
            host_us=host,
            delay_us=delay_us,
        )
        # the requests' clocks as indices of the device's clock list (the arrays keep `used`)
        exe = replace(
            exe, switches=tuple(replace(e, clock=int(used[e.clock])) for e in exe.switches)
        )
        act = activity(arrays, timing, p)
        uncore = uncore_power_w(arrays, timing.time_us, p)
        clk, gclk, eclk = exe.clock, exe.gap_clock, exe.end_clock
        # A request landing inside an op changes the chip's clock there. An op whose time is
        # the same at its start clock and at every clock landed inside it (a collective, a
        # pipeline wait: the AI cores idle) runs on unchanged and draws power at each clock from
        # its landing to the next (or the op's end); any other op keeps the clock it started
        # at to its end (SetFreq semantics).
        row, seg_clock = exe.inner_op, exe.inner_clock
        same = timing.time_us[op[row], seg_clock] == timing.time_us[op[row], clk[row]]
        inside = ~np.isnan(exe.op_land_us)
        inside &= np.bincount(row[~same], minlength=total) == 0
        op_split = np.where(inside, exe.op_land_us, exe.end_us)
        late = np.flatnonzero(inside)  # the ops with a fourth interval
        # the fourth interval's pieces, one per landing: its clock and its share of the interval
        keep = inside[row]
        row, seg_clock, seg_land = row[keep], seg_clock[keep], exe.inner_land_us[keep]
        then = np.r_[row[1:] == row[:-1], False]  # another landing follows in the same op
        seg_end = np.where(then, np.r_[seg_land[1:], 0.0], exe.end_us[row])
        seg_share = (seg_end - seg_land) / (exe.end_us[row] - exe.op_land_us[row])
        pieces_late = (np.searchsorted(late, row), seg_clock, seg_share)
        # what the result keeps of the (ops, clocks) timing tables, gathered now so that the
        # tables (hundreds of MB at a million ops) are freed before the thermal passes
        busy = (timing.core_busy[op, clk], timing.ld_busy[op, clk], timing.st_busy[op, clk])
        del timing, dur
        # Four intervals per op instance: the idle gap before it (the run starts at 0, so the
        # first op's gap counts too) at the clock in effect when the gap began, the rest of the
        # gap after a request landed in it, the op at the clock it started at, and the rest of
        # a clock-independent op after a request landed inside it (empty for every other op):
        # every piece is booked at its own clock.
        prev_end = np.r_[0.0, exe.end_us[:-1]]
        split = np.where(np.isnan(exe.gap_land_us), exe.start_us, exe.gap_land_us)
        pieces = [split - prev_end, exe.start_us - split, op_split - exe.start_us]
        if late.size:  # (a run without one, e.g. at a static clock, keeps three columns)
            pieces.append(exe.end_us - op_split)
        dt_us = np.stack(pieces, axis=1)
        del pieces, split
        cols = dt_us.shape[1]
        temp0 = p.ambient_c + 30.0 if start_temp_c is None else start_temp_c
        temp_ops = np.full(total, temp0)
        # one pair of (total, cols) buffers for every pass: a million ops, 24-32 MB each
        chip, core = np.zeros((total, cols)), np.zeros((total, cols))
        temp_cols = np.full((total, cols), temp0)
        power_args = (act, uncore, op, clk, gclk, late, pieces_late, temp_cols, f_used, v_used)
        for step in range(_THERMAL_PASSES):
            self._interval_power(*power_args, chip, core)
            if step == 0 and start_temp_c is None:
                # A warm device: start at the steady state of the run's own mean power.
                temp0 = p.ambient_c + p.k_c_per_w * float((chip * dt_us).sum() / dt_us.sum())
            ends = rc_temperature(
                dt_us.ravel() * 1e-6,
                chip.ravel(),
                start_c=temp0,
                ambient_c=p.ambient_c,
                k_c_per_w=p.k_c_per_w,
                tau_s=p.tau_s,
            ).reshape(total, cols)
            # each interval's power is taken at its starting temperature
            temp_cols[:, 0] = np.r_[temp0, ends[:-1, -1]]
            temp_cols[:, 1:] = ends[:, :-1]
            temp_ops = ends[:, 1]  # temperature when each op starts (after its gap)
        self._interval_power(*power_args, chip, core)
        del power_args, temp_cols, act, uncore
        # energies in the power buffers themselves, (power * dt) * 1e-6 as before
        for power in (chip, core):
            power *= dt_us
            power *= 1e-6
        chip_j, core_j = chip, core
        # The sensors' inputs, each (total * cols + 1,) built in its own buffer: the same
        # numbers as np.r_[0, ...] of each and the edges' `* 1e-6`, with one temporary fewer
        # apiece (~150 MB at a million ops, the peak of a profile's last clock)
        temp_ops = temp_ops.copy()
        temp_edges = np.r_[temp0, ends.ravel()]
        del ends
        ends_us = np.cumsum(dt_us, axis=1)
        ends_us += prev_end[:, None]
        del dt_us, prev_end
        edges_s = np.empty(ends_us.size + 1)
        edges_s[0] = 0.0
        np.multiply(ends_us.ravel(), 1e-6, out=edges_s[1:])
        del ends_us
        chip_cum, core_cum = np.empty(edges_s.size), np.empty(edges_s.size)
        for cum, energy in ((chip_cum, chip_j), (core_cum, core_j)):
            cum[0] = 0.0
            np.cumsum(energy.ravel(), out=cum[1:])
        # what the result keeps of the energies, before they are freed for the sensors' pass
        op_chip_j, op_core_j = chip_j[:, 2:].sum(axis=1), core_j[:, 2:].sum(axis=1)
        chip_total_j, core_total_j = float(chip_j.sum()), float(core_j.sum())
        del chip, core, chip_j, core_j, power, energy
        clock_mhz = np.empty((total, cols))
        for col, c in enumerate((gclk, clk, clk, eclk)[:cols]):
            clock_mhz[:, col] = f_used[c]
        samples = sample_sensors(
            edges_s,
            chip_cum,
            core_cum,
            temp_edges,
            clock_mhz.ravel(),
            period_s=self.spec.power_sample_period_ms * 1e-3,
            window_s=p.power_window_ms * 1e-3,
            noise_w=p.power_noise_w,
            temp_resolution_c=p.temp_resolution_c,
            rng=rng,
        )
        return SimRun(
            execution=exe,
            dur_us=exe.end_us - exe.start_us,
            op_chip_energy_j=op_chip_j,
            op_core_energy_j=op_core_j,
            chip_energy_j=chip_total_j,
            core_energy_j=core_total_j,
            temp_start_c=temp_ops,
            samples=samples,
            iterations=iterations,
            n_ops=n,
            core_busy=busy[0],
            ld_busy=busy[1],
            st_busy=busy[2],
            unit=arrays.unit[op],
            freq_mhz=f_used[clk],
        )

    def _interval_power(
        self,
        act: np.ndarray,
        uncore: np.ndarray,
        op: np.ndarray,
        clk: np.ndarray,
        gclk: np.ndarray,
        late: np.ndarray,
        pieces_late: tuple[np.ndarray, np.ndarray, np.ndarray],
        temp_c: np.ndarray,
        f: np.ndarray,
        v: np.ndarray,
        chip: np.ndarray,
        core: np.ndarray,
    ) -> None:
        """Fill ``chip`` and ``core`` power of each op's intervals, (n, 3) or (n, 4).

        Columns: the gap at its first clock, the rest of the gap, the op at its start clock,
        and (if the buffers have a fourth column) the rest of the op after the first landing
        inside it, filled only in the rows ``late`` (the other rows' fourth interval is empty
        and stays 0): ``pieces_late`` is, per landing inside those ops, its row's position in
        ``late``, the clock it set and its share of the interval, and the interval's power is
        the pieces' powers weighted by their shares (its energy, each piece at its own clock).
        ``clk``, ``gclk`` and the pieces' clocks index the clocks ``f`` (MHz) with voltages
        ``v`` used by this run; ``temp_c`` is each interval's starting temperature. The columns
        are computed one at a time into the caller's buffers, so a pass holds one column's
        temporaries rather than stacked copies.
        """
        p = self.params
        for col, c, a in ((0, gclk, 0.0), (1, clk, 0.0), (2, clk, None)):
            t = temp_c[:, col]
            fc, vc = f[c], v[c]
            scale = leakage_scale(t, p)  # once for both rails
            activity = act[op, c] if a is None else a
            core[:, col] = core_power_w(activity, fc, vc, t, p, leak_scale=scale)
            # the rest of the chip: its idle (or the op's traffic), plus the part on the AI
            # cores' clock and the temperature-dependent leakage, plus misc
            rest = p.uncore_idle_w if a is not None else uncore[op, c]
            np.add(core[:, col], rest, out=chip[:, col])
            chip[:, col] += coupled_power_w(fc, vc, t, p, leak_scale=scale)
            chip[:, col] += p.misc_w
        if chip.shape[1] == 4 and late.size:  # the rest of an op after a landing inside it
            pos, c, share = pieces_late
            t, o = temp_c[late[pos], 3], op[late[pos]]
            scale = leakage_scale(t, p)
            core_w = core_power_w(act[o, c], f[c], v[c], t, p, leak_scale=scale)
            chip_w = (
                core_w
                + uncore[o, c]
                + coupled_power_w(f[c], v[c], t, p, leak_scale=scale)
                + p.misc_w
            )
            core[late, 3] = np.bincount(pos, weights=share * core_w, minlength=late.size)
            chip[late, 3] = np.bincount(pos, weights=share * chip_w, minlength=late.size)

    # ----------------------------------------------------------------------------- profiling
    def profile(
        self,
        workload: Workload,
        freqs_mhz: Sequence[float],
        *,
        iterations: int = 1,
        on_clock: Callable[[float], None] | None = None,
    ) -> Profile:
        """Measure ``iterations`` iterations at each clock, as a profiler run per clock would.

        Rows carry the measured time; with a fine-grained power sensor (period <= 1 ms, Ascend
        lpmi-like) also per-op core and chip power and, on Ascend-like devices, the pipeline
        ratios a CANN profiler reports. Coarse sensors (NVML) give only the sample table, as on
        real GPUs. Each clock's noise comes from its own seeded stream, so the rows of one clock
        do not depend on which other clocks are profiled.
        """
        if iterations < 1:
            raise ValidationError("iterations must be >= 1", field="iterations")
        clocks = self.clock_index(freqs_mhz)
        fine = self.spec.power_sample_period_ms <= 1.0
        ascend = self.spec.vendor == "ascend"
        # Each clock's rows are copied into columns for every clock as they come, and its
        # samples kept as columns: concatenating the tables at the end held them twice (~330 MB
        # more at a million ops x 3 clocks). The same table as pd.concat of them.
        stacked: dict[str, np.ndarray] = {}
        categories: dict[str, pd.CategoricalDtype] = {}
        samples: list[dict[str, np.ndarray]] = []
        offset_s = 0.0
        for k, clock in enumerate(clocks):
            f = float(self._clocks[clock])
            rng = np.random.default_rng([self.seed, round(f * 1000)])
            run = self._simulate_static(workload, int(clock), iterations=iterations, rng=rng)
            rows = self._rows(workload, run, f, rng, fine=fine, ratios=ascend)
            rows["wall_s"] = run.execution.start_us * 1e-6 + offset_s
            _stack_into(stacked, categories, rows, len(run.dur_us), k, len(clocks))
            del rows
            smp = run.samples.assign(t_s=run.samples["t_s"] + offset_s)
            samples.append({name: smp[name].to_numpy() for name in smp.columns})
            offset_s = float(smp["t_s"].iloc[-1]) + 1.0
            del run, smp  # ~100 MB per million ops, which the next clock's run would meet
            if on_clock is not None:
                on_clock(f)
        meta = {
            "format": "simulated",
            "device": self.spec.name,
            "workload": workload.name,
            "simulated": True,
            "seed": self.seed,
            "sources": [f"simulated:{self.spec.name}:{workload.name}"],
            "sensor": self.sensor_ms,
        }
        table = pd.DataFrame(
            {
                name: pd.Categorical.from_codes(values, dtype=categories[name])
                if name in categories
                else values
                for name, values in stacked.items()
            },
            copy=False,
        )
        del stacked
        # a column at a time, each clock's part dropped once copied
        names = list(samples[0])
        sensor = pd.DataFrame(
            {name: np.concatenate([part.pop(name) for part in samples]) for name in names},
            copy=False,
        )
        del samples
        return Profile(table, sensor, meta=meta)

    def _rows(
        self,
        workload: Workload,
        run: SimRun,
        freq_mhz: float,
        rng: np.random.Generator,
        *,
        fine: bool,
        ratios: bool,
    ) -> dict[str, Any]:
        """Return the profile rows of ``run`` as columns (arrays, categoricals, a scalar clock).

        Columns, not a table: a table copied them into one block, and the caller copies each
        into the rows of every clock (and drops it) as it comes.
        """
        n, total = run.n_ops, run.n_ops * run.iterations
        ops = workload.ops
        op = np.tile(np.arange(n), run.iterations)
        iteration = np.repeat(np.arange(run.iterations), n)
        first = run.execution.start_us[::n]
        columns: dict[str, Any] = {
            "iteration": iteration,
            "op": op,
            # categoricals (the profile keeps them so): no per-row string objects
            **{key: _repeat_text(ops[key], op) for key in ("name", "type", "stream")},
            "freq_mhz": freq_mhz,
            "time_us": run.dur_us,
            "start_us": run.execution.start_us - first[iteration],
            "temp_c": np.round(run.temp_start_c / self.params.temp_resolution_c)
            * self.params.temp_resolution_c,
        }
        if fine:
            read = 1.0 + rng.normal(0.0, _POWER_READ_NOISE, (2, total))
            seconds = run.dur_us * 1e-6
            columns["core_power_w"] = run.op_core_energy_j / seconds * read[0]
            columns["chip_power_w"] = run.op_chip_energy_j / seconds * read[1]
        if ratios:
            on_core = run.unit < 2
            nan = np.full(total, np.nan)
            columns["ratio_mac"] = np.where(
                run.unit == CUBE, run.core_busy, np.where(on_core, 0.0, nan)
            )
            columns["ratio_vec"] = np.where(
                run.unit == VECTOR, run.core_busy, np.where(on_core, 0.0, nan)
            )
            columns["ratio_mte2"] = np.where(on_core, run.ld_busy, nan)
            columns["ratio_mte3"] = np.where(on_core, run.st_busy, nan)
        return columns

    # ----------------------------------------------------------------------------- running
    def run(
        self,
        workload: Workload,
        schedule: Schedule | None = None,
        *,
        freq_mhz: float | None = None,
        iterations: int = 1,
        label: str | None = None,
    ) -> tuple[RunResult, SimRun]:
        """Run ``iterations`` iterations under ``schedule`` (or at one clock, default max).

        The device starts at its maximum clock; the schedule's first switch (at op 0) sets the
        first stage's clock; every switch is issued ``switch_delay_ms`` after its planned
        point and lands ``switch_latency_ms`` after it is issued (SetFreq semantics,
        :mod:`opdvfs.sim.timeline`). Returns the per-iteration :class:`RunResult` and the raw
        :class:`SimRun`.
        """
        if iterations < 1:
            raise ValidationError("iterations must be >= 1", field="iterations")
        n = len(workload)
        top = len(self._clocks) - 1
        latency_us = self.spec.switch_latency_ms * 1e3
        if schedule is not None:
            if schedule.n_ops != n:
                raise ValidationError(
                    f"schedule plans {schedule.n_ops} ops but workload {workload.name!r} has {n}",
                    field="n_ops",
                )
            triggers, clocks, delays = self._switch_times(schedule, n, iterations)
            delays = delays + self.switch_delay_ms * 1e3
            initial = top
            stages = [(s.first_op, s.last_op, s.freq_mhz) for s in schedule.stages]
        else:
            f = self._clocks[top] if freq_mhz is None else freq_mhz
            initial = int(self.clock_index([f])[0])
            triggers = clocks = np.empty(0, dtype=int)
            delays = np.empty(0)
            stages = [(0, n - 1, float(self._clocks[initial]))]
        rng = np.random.default_rng([self.seed, 7])
        sim = self._simulate(
            workload,
            iterations=iterations,
            initial_clock=initial,
            triggers=triggers,
            clocks=clocks,
            latency_us=latency_us,
            delay_us=delays,
            rng=rng,
        )
        seq = np.r_[initial, [e.clock for e in sim.execution.landed]]
        changes = int(np.count_nonzero(seq[1:] != seq[:-1]))
        iter_s = sim.iteration_time_s
        chip_j = sim.chip_energy_j / iterations
        core_j = sim.core_energy_j / iterations
        last = n * (iterations - 1)
        exe = sim.execution
        timeline = tuple(
            StageRecord(
                stage=k,
                first_op=a,
                last_op=b,
                freq_mhz=f,
                start_s=(exe.start_us[last + a] - exe.start_us[last]) * 1e-6,
                end_s=(exe.end_us[last + b] - exe.start_us[last]) * 1e-6,
                chip_energy_j=float(sim.op_chip_energy_j[last + a : last + b + 1].sum()),
                core_energy_j=float(sim.op_core_energy_j[last + a : last + b + 1].sum()),
            )
            for k, (a, b, f) in enumerate(stages)
        )
        result = RunResult(
            device=self.spec.name,
            workload=workload.name,
            simulated=True,
            iterations=iterations,
            iteration_time_s=iter_s,
            chip_power_w=chip_j / iter_s,
            chip_energy_j=chip_j,
            core_power_w=core_j / iter_s,
            core_energy_j=core_j,
            switches=round(changes / iterations),
            schedule=label,
            timeline=timeline,
        )
        return result, sim

    def _switch_times(
        self, schedule: Schedule, n: int, iterations: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global trigger op, clock index and delay of every switch over the run, in order.

        A ``previous_iteration`` switch of iteration ``k`` fires in iteration ``k - 1`` (in the
        first iteration, at op 0 with no delay).
        """
        sw = schedule.switches
        clock = self.clock_index([s.freq_mhz for s in sw])
        op = np.array([s.trigger_op for s in sw])
        delay = np.array([s.delay_us for s in sw])
        back = np.array([s.previous_iteration for s in sw])
        k = np.arange(iterations)[:, None]
        trig = op[None, :] + n * (k - back[None, :])
        first = (k == 0) & back[None, :]
        trig = np.where(first, 0, trig)
        wait = np.where(first, 0.0, delay[None, :])
        # in time order: by trigger op, then by the stage they serve (iteration-major)
        order = np.lexsort((np.arange(trig.size), trig.ravel()))
        trig, clock, wait = (
            trig.ravel()[order],
            np.tile(clock, iterations)[order],
            wait.ravel()[order],
        )
        # a request for the clock last requested is never sent (an actuator sets a clock only
        # when it changes): re-sent, it would supersede its own pending twin, and a one-stage
        # plan on an iteration shorter than the switch (resnet50 on h100-like: 10 ms against
        # 15 ms) would never get its clock
        keep = np.r_[True, clock[1:] != clock[:-1]]
        return trig[keep], clock[keep], wait[keep]

    # ----------------------------------------------------------------------------- calibration
    def calibration_runs(
        self, freqs_mhz: Sequence[float] | None = None, *, idle_s: float = 60.0
    ) -> PowerCalibration:
        """Take the paper's offline power measurements (Fig. 11) on the simulator.

        Idle power (core and chip) at two clocks after ``idle_s`` of nothing running, and a
        cool-down: ``idle_s`` of heavy matrix work at the top clock, then ``idle_s`` idle while
        the device's own power sensor records core power, chip power and temperature falling
        together (``core_power_w``, ``chip_power_w``, ``temp_c``: either rail's leakage slope,
        :func:`~opdvfs.models.thermal.leakage_slope`; a GPU's board sensor gives the chip's).
        The cool-down keeps only the samples whose averaging window starts after the load ended:
        a window still covering it reads load power at an idle temperature (on h100-like's 1 s
        window they made the core slope 2.88 W/C/V instead of 1.10).
        """
        clocks = list(freqs_mhz or (self.spec.min_freq_mhz, self.spec.max_freq_mhz))
        # Idle time as many 10 ms gaps: power is evaluated per interval at its start temperature,
        # so a long idle stretch must be cut up for the leakage to follow the cooling chip.
        ticks = int(idle_s / 0.01)
        nothing = pd.DataFrame(
            {
                "name": [f"idle{i}" for i in range(ticks)],
                "type": "Host",
                "stream": "host",
                "gap_before_us": 1e4,
            }
        )
        rows = []
        for f in clocks:
            clock = int(self.clock_index([f])[0])
            rng = np.random.default_rng([self.seed, 99, clock])
            run = self._simulate_static(
                Workload(nothing, name="idle"),
                clock,
                iterations=1,
                rng=rng,
                start_temp_c=self.params.ambient_c,
            )
            tail = run.samples[run.samples["t_s"] > 0.8 * idle_s]
            rows.append(
                {
                    "freq_mhz": f,
                    "core_power_w": tail["core_power_w"].mean(),
                    "chip_power_w": tail["power_w"].mean(),
                    "temp_c": tail["temp_c"].mean(),
                }
            )
        # cool-down: a long heavy load at the top clock, then nothing
        load_ops = int(idle_s * 1e6 / 2000)
        load = pd.DataFrame(
            {
                "name": [f"load{i}" for i in range(load_ops)],
                "type": "MatMul",
                "stream": "compute",
                "flops": 3.5e11,
                "bytes_loaded": 2e7,
                "bytes_stored": 2e7,
                "gap_before_us": 0.0,
            }
        )
        cool = nothing.assign(
            name=[f"cool{i}" for i in range(ticks)], flops=0.0, bytes_loaded=0.0, bytes_stored=0.0
        )
        top = len(self._clocks) - 1
        run = self._simulate_static(
            Workload(pd.concat([load, cool], ignore_index=True), name="cool"),
            top,
            iterations=1,
            rng=np.random.default_rng([self.seed, 98]),
        )
        load_end = float(run.execution.end_us[load_ops - 1]) * 1e-6
        # a sample averages [t - window, t]: only windows that start after the load ended
        after = run.samples[run.samples["t_s"] > load_end + self.params.power_window_ms * 1e-3]
        cooldown = pd.DataFrame(
            {
                "freq_mhz": float(self._clocks[top]),
                "core_power_w": after["core_power_w"].to_numpy(dtype=float),
                "chip_power_w": after["power_w"].to_numpy(dtype=float),
                "temp_c": after["temp_c"].to_numpy(dtype=float),
            }
        )
        return PowerCalibration(idle=pd.DataFrame(rows), cooldown=cooldown)


def _stack_into(
    stacked: dict[str, np.ndarray],
    categories: dict[str, pd.CategoricalDtype],
    columns: dict[str, Any],
    n: int,
    part: int,
    parts: int,
) -> None:
    """Move ``columns`` (``n`` rows) into rows ``part`` of ``parts`` equal parts of ``stacked``.

    Each column is dropped from ``columns`` once copied. The first part allocates the stacked
    columns; a categorical is stacked as its codes, its dtype (the same in every part: one
    workload's text) kept in ``categories``; a scalar fills its rows.
    """
    for name in list(columns):
        column = columns.pop(name)
        if isinstance(column, pd.Categorical):
            if categories.setdefault(name, column.dtype) != column.dtype:
                raise AssertionError(f"column {name!r}: other categories in part {part}")
            column = column.codes
        values = np.asarray(column)
        if name not in stacked:
            stacked[name] = np.empty(n * parts, dtype=values.dtype)
        stacked[name][part * n : (part + 1) * n] = values
        del column, values


def _repeat_text(column: pd.Series, op: np.ndarray) -> pd.Categorical[Any]:
    """Return the text ``column[op]`` as a categorical (codes taken, no string per row)."""
    text = pd.Categorical(column)
    return pd.Categorical.from_codes(text.codes[op], dtype=text.dtype)
