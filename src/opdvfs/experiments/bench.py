"""One workload on one simulated device, end to end: profile, fit, plan, execute, measure.

A :class:`Bench` holds what every trial on the pair shares (the profile at the training clocks,
the fitted models, the measured top-clock baseline); :func:`measure` runs a schedule on the
simulator and returns an :class:`Outcome`: what was measured beside what the plan predicted.
Savings are against the top clock, measured in the same run length and with the same noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opdvfs._model import FrozenModel
from opdvfs.calibration import PowerCalibration
from opdvfs.models.attribution import sensor_iterations
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.planner import PlanInputs, Predictions, predict
from opdvfs.profile import Profile
from opdvfs.result import RunResult
from opdvfs.schedule import Schedule
from opdvfs.sim.twin import SimRun, SimulatedDevice
from opdvfs.tuner.policy import Measured
from opdvfs.workloads.library import load_workload
from opdvfs.workloads.workload import Workload

__all__ = ["Bench", "Outcome", "calibrate", "measure", "prepare", "saving_pct", "twin_measure"]


@dataclass(frozen=True)
class Bench:
    """A workload profiled and fitted on a simulated device, with its measured baseline."""

    device_name: str
    device: SimulatedDevice
    workload: Workload
    profile: Profile
    models: ModelBundle
    inputs: PlanInputs
    baseline: RunResult
    iterations: int
    #: The models' predictions for ``inputs``, made once for every plan of the bench.
    predictions: Predictions

    def with_latency(self, switch_latency_ms: float) -> SimulatedDevice:
        """Return the same device (same seed), its switches landing ``switch_latency_ms`` late."""
        spec = self.device.spec.model_copy(update={"switch_latency_ms": switch_latency_ms})
        return SimulatedDevice(spec, self.device.params, seed=self.device.seed)


#: A measured run spans at least this many switch latencies (the first switch lands one in).
STEADY = 20


def prepare(
    workload: str | Workload,
    device_name: str,
    *,
    train_freqs_mhz: Sequence[float] = (1000.0, 1400.0, 1800.0),
    iterations: int = 2,
    seed: int = 0,
) -> Bench:
    """Profile ``workload`` at the training clocks, fit both models, measure the top clock.

    The power model is fitted with the paper's offline calibration (:func:`calibrate`: idle
    runs and a cool-down, whose leakage slope the static profiles cannot give), so the plans
    are made on the top clock's die (:func:`~opdvfs.plan.planner.predict`).

    Parameters
    ----------
    workload
        A workload, or its name (see :data:`opdvfs.workloads.BUILDERS`) or file.
    device_name
        Simulated device preset (see :data:`opdvfs.sim.presets.PRESETS`).
    train_freqs_mhz
        Clocks to profile and fit at (MHz); each snaps to the device's nearest clock.
    iterations
        Iterations of every measured run (the baseline and each trial), at least
        :data:`STEADY` switch latencies' worth; the profile takes as
        many as the device's power sensor needs
        (:func:`~opdvfs.models.attribution.sensor_iterations` of the baseline's iteration).
    seed
        Seed of the simulator's noise.
    """
    sim = SimulatedDevice.from_preset(device_name, seed=seed)
    spec = sim.spec
    work = load_workload(workload) if isinstance(workload, str) else workload
    grid = np.asarray(spec.freqs_mhz)
    # the training clocks the device has (nearest supported ones for other presets)
    train = sorted({float(grid[np.argmin(np.abs(grid - f))]) for f in train_freqs_mhz})
    first, _ = sim.run(work, iterations=1, label="top clock")
    # A plan's first switch lands a switch latency into the run: measure enough iterations that
    # it is a small part of it, as a user measures a running job's steady state (h100-like:
    # 15 ms against a 10 ms resnet50 iteration; 2 iterations measured -7% of a -26% plan)
    iterations = max(
        iterations, math.ceil(STEADY * spec.switch_latency_ms * 1e-3 / first.iteration_time_s)
    )
    baseline, _ = sim.run(work, iterations=iterations, label="top clock")
    # enough iterations per clock for a coarse (NVML-like) sensor's windows, as `opdvfs profile`
    repeats = sensor_iterations(baseline.iteration_time_s, **sim.sensor_ms)
    profile = sim.profile(work, train, iterations=repeats)
    # the paper's offline calibration (Fig. 11): idle power and a cool-down give the leakage's
    # temperature slope, which static profiles cannot (their temperature follows the clock)
    calibration = calibrate(sim)
    models = ModelBundle(
        PerfModel().fit(profile),
        PowerModel().fit(profile, device=spec, calibration=calibration),
        device=spec,
    )
    inputs = PlanInputs.from_workload(work, spec.freqs_mhz, device=spec.name)
    predictions = predict(models, inputs)
    return Bench(device_name, sim, work, profile, models, inputs, baseline, iterations, predictions)


def calibrate(sim: SimulatedDevice, *, seconds: float = 60.0) -> PowerCalibration:
    """Take the paper's offline power measurements (Fig. 11) on ``sim``, the chip rail's too.

    :meth:`SimulatedDevice.calibration_runs` (what ``opdvfs fit --calibrate`` and ``opdvfs
    validate power --calibrate`` take): idle power at two clocks after ``seconds`` idle, and a
    cool-down read on the device's own power sensor, ``seconds`` of matrix work at the top
    clock then ``seconds`` idle, with ``chip_power_w`` beside ``core_power_w`` (a GPU reads
    board power only, so its leakage slope comes from the chip column,
    :func:`~opdvfs.models.thermal.leakage_slope`) and no sample whose averaging window still
    covers the load.
    """
    return sim.calibration_runs(idle_s=seconds)


def saving_pct(base: float | None, value: float | None) -> float:
    """Percent saved going from ``base`` to ``value`` (negative: it rose)."""
    if base is None or value is None or base == 0:
        return float("nan")
    return (1.0 - value / base) * 100.0


class Outcome(FrozenModel):
    """A schedule measured on the simulator beside its prediction, per iteration.

    Savings and losses are percentages against the top clock (positive: saved / slower).
    """

    label: str
    workload: str
    device: str
    target_pct: float
    iteration_time_base_s: float
    iteration_time_s: float
    perf_loss_pct: float
    predicted_perf_loss_pct: float | None
    chip_power_base_w: float
    chip_power_w: float
    chip_power_saving_pct: float
    core_power_base_w: float
    core_power_w: float
    core_power_saving_pct: float
    chip_energy_saving_pct: float
    core_energy_saving_pct: float
    predicted_chip_energy_saving_pct: float | None
    predicted_core_energy_saving_pct: float | None
    switches: int
    stages: int
    switch_latency_ms: float
    gap_pct: float | None = None
    plan_seconds: float | None = None
    #: The budget the final plan was made for, as a share of the target (1: as asked; < 1:
    #: re-planned once after the first plan measured slower than the target).
    budget_scale: float = 1.0

    @property
    def within_budget(self) -> bool:
        """Measured slowdown at most the target (0.05-point allowance for the twin's noise)."""
        return self.perf_loss_pct <= self.target_pct + 0.05


def measure(
    bench: Bench,
    schedule: Schedule | None,
    label: str,
    *,
    target: float,
    freq_mhz: float | None = None,
    device: SimulatedDevice | None = None,
) -> tuple[Outcome, SimRun]:
    """Run ``schedule`` (or a static ``freq_mhz``) on the twin and compare with the baseline.

    ``device`` replaces the bench's device, e.g. one whose switches land later
    (:meth:`Bench.with_latency`); the baseline is the bench's.
    """
    dev = device or bench.device
    result, run = dev.run(
        bench.workload, schedule, freq_mhz=freq_mhz, iterations=bench.iterations, label=label
    )
    base = bench.baseline
    pred_loss: float | None
    pred_chip: float | None
    pred_core: float | None
    if schedule is not None and schedule.baseline_time_s:
        pred_loss = ((schedule.predicted_time_s or 0.0) / schedule.baseline_time_s - 1) * 100
        pred_chip = saving_pct(schedule.baseline_energy_j, schedule.predicted_energy_j)
        core = (schedule.baseline_core_energy_j, schedule.predicted_core_energy_j)
        # no core prediction from a model fitted on board power (a GPU's sensor)
        pred_core = saving_pct(*core) if None not in core else None
    else:
        pred_loss = pred_chip = pred_core = None
    outcome = Outcome(
        label=label,
        workload=bench.workload.name,
        device=bench.device_name,
        target_pct=target * 100,
        iteration_time_base_s=base.iteration_time_s,
        iteration_time_s=result.iteration_time_s,
        perf_loss_pct=(result.iteration_time_s / base.iteration_time_s - 1) * 100,
        predicted_perf_loss_pct=pred_loss,
        chip_power_base_w=base.chip_power_w,
        chip_power_w=result.chip_power_w,
        chip_power_saving_pct=saving_pct(base.chip_power_w, result.chip_power_w),
        core_power_base_w=base.core_power_w or 0.0,
        core_power_w=result.core_power_w or 0.0,
        core_power_saving_pct=saving_pct(base.core_power_w, result.core_power_w),
        chip_energy_saving_pct=saving_pct(base.chip_energy_j, result.chip_energy_j),
        core_energy_saving_pct=saving_pct(base.core_energy_j, result.core_energy_j),
        predicted_chip_energy_saving_pct=pred_chip,
        predicted_core_energy_saving_pct=pred_core,
        switches=result.switches,
        stages=len(schedule.stages) if schedule is not None else 1,
        switch_latency_ms=dev.spec.switch_latency_ms,
        gap_pct=schedule.gap_pct if schedule is not None else None,
        plan_seconds=schedule.plan_seconds if schedule is not None else None,
    )
    return outcome, run


def twin_measure(
    device: SimulatedDevice,
    workload: Workload,
    *,
    trigger: Literal["op", "time"],
    offsets: Literal["measured", "planned"] = "measured",
    iterations: int = 2,
) -> Callable[[Schedule], Measured]:
    """Return a ``measure`` of a plan on the twin as ``trigger`` applies it (for ``fit_budget``).

    The budget loop is :func:`~opdvfs.tuner.policy.fit_budget`.

    ``op``: each switch at its trigger op and delay (the operator-counting executor). ``time``:
    each switch at its due time from the iteration's start
    (:func:`~opdvfs.runtime.timed.issued_by_time`, the default guard included), the due times
    learned from a measured run of the plan (``offsets="measured"``: the plan run on the twin
    by its trigger ops, then once as time mode issues it,
    :func:`~opdvfs.runtime.timed.plan_timing`) or taken from the
    planner's predicted stage starts (``"planned"``). Both against the top clock over the same
    ``iterations``; each iteration draws its own noise, so a time-triggered switch meets an
    executed run that differs from the one its due time was learned on. The executor's own
    lateness (its worker thread, the host) is not in it: its real runs are what show that.
    """
    from opdvfs.runtime.timed import issued_by_time, plan_timing

    top, _ = device.run(workload, iterations=iterations, label="top clock")

    def measure(schedule: Schedule) -> Measured:
        applied = schedule
        if trigger == "time":
            timing = (
                plan_timing(schedule, device=device, workload=workload)
                if offsets == "measured"
                else plan_timing(schedule)
            )
            applied = issued_by_time(schedule, timing)
        run, _ = device.run(workload, applied, iterations=iterations, label=trigger)
        return Measured(
            slowdown=run.iteration_time_s / top.iteration_time_s - 1,
            saving=1 - run.chip_energy_j / top.chip_energy_j,
        )

    return measure
