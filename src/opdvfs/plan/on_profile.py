"""Plan a measured profile: the clocks to measure, the models to fit, the schedule (DESIGN §4).

The use case ``opdvfs plan PROFILE`` and ``opdvfs tune`` share, in one place:

1. **Which clocks a profile should measure**: :func:`auto_clocks` (``profile --freqs auto``,
   ``capture --freqs auto``, the clocks ``tune`` sweeps).
2. **Fit only what was not measured**: :func:`fit_profile` takes the planner's inputs from the
   profile (:meth:`~opdvfs.plan.planner.PlanInputs.from_profile`) and fits a
   :class:`~opdvfs.models.bundle.ModelBundle` only where some operator was not measured at
   some clock the device offers (with ``values="auto"``), into a :class:`PlanOnProfile`.
3. **Plan, and map to launches**: :func:`plan_fitted` plans on it
   (:func:`~opdvfs.plan.planner.plan_schedule`) and maps a simulated GPU's swept profile back
   onto every operator launched (:func:`~opdvfs.schedule.on_launches`).

:func:`plan_profile` is the three with what ``opdvfs plan`` adds around them: the refusals
(a device other than the profile's, clocks outside the profiled range, a switch latency below
the device's, a plan worse than the top clock; ``force`` lifts the first three), a MODELS file
in place of the profile, and the warnings the command prints (:class:`ProfilePlan`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import InfeasibleError, ValidationError
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule, shortest_stage_ms
from opdvfs.profile import Profile
from opdvfs.schedule import Dispatch, Objective, Schedule, Solver, Values, on_launches
from opdvfs.sim.presets import preset_spec
from opdvfs.workloads.library import load_workload
from opdvfs.workloads.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "DEFAULT_MAX_GAP",
    "NOISE_US",
    "PlanOnProfile",
    "ProfilePlan",
    "auto_clocks",
    "check_device",
    "fit_profile",
    "plan_fitted",
    "plan_profile",
    "within_profiled",
]

#: Operators shorter than this at the top clock are mostly timer noise (as in ``validate perf``).
NOISE_US = 20.0
#: :func:`auto_clocks`' widest gap, a fraction of the top clock: what the time models bridge
#: within 0.8% (90th percentile) on real kernels, 8.5% of the top on Perseus's A100 stages and
#: 6.9% on its A40's (issue 31 item 2). On the a100-like preset's 81 clocks: 19 clocks of 81,
#: where the five leave gaps of 390 and 600 MHz.
DEFAULT_MAX_GAP = 0.07
#: The interval :func:`plan_profile` plans at when none is given (ms); the planner raises it to
#: the device's switch latency where that is longer (15 ms on the GPU presets), so the default
#: plans what can run.
DEFAULT_INTERVAL_MS = 5.0


def auto_clocks(
    freqs_mhz: Sequence[float],
    *,
    below: Sequence[float] = (0.925, 0.85),
    max_gap: float | None = DEFAULT_MAX_GAP,
) -> tuple[float, ...]:
    """Return the clocks ``--clocks auto`` profiles: the top, two clocks below it, mid and min.

    ``below``: the clocks nearest these fractions of the top (7.5% and 15% below it). Why
    these. A slowdown budget of a few percent is spent where operators lose little time per
    clock step: compute-bound ones (time ~ 1/f) can give up no more than the budget in clock,
    memory- and latency-bound ones far more, and a plan mixes them, so its clocks lie mostly
    5-15% below the top. Measured there, the planner plans on measurements where the budget
    decides, instead of on the fitted time model, which over-predicts the slowdown where time
    is nearly flat in the clock. The steps just below the top tell it almost nothing (one
    15 MHz step is 1% of the clock, within the model's error): on ``sim:a100-like`` with the
    tiny GPT at 2%, profiling top, 1395, 1380, mid and min kept a plan that saved 13.7%
    measured against 17.9% from top, 1305, 1200, mid and min (the offline pipeline, every clock
    profiled: 18.1%; ``benchmarks/tune_vs_offline.py``). The models (time ``a + b/f`` per
    operator, power ``p0 + a f^3``) need a spread to separate their terms, and ``opdvfs plan``
    refuses clocks outside the measured range (the models would extrapolate), so the device's
    lowest clock and the one nearest the middle of its range close it: memory-bound
    operators can go there at no cost. Five clocks; fewer when the device has fewer.

    ``max_gap``: then add the grid clock nearest each gap's middle until no gap is wider than
    this fraction of the top clock (issue 31 item 2; default :data:`DEFAULT_MAX_GAP`; None:
    the five clocks alone, as ``opdvfs tune`` sweeps them,
    :func:`~opdvfs.tuner.policy.profile_clocks`). How
    wide a gap the models bridge, measured on real kernels with every clock known (the fitted
    time, corrected through the profiled clocks, against the measured one at every clock
    between them): on Perseus A100 stages the 90th percentile error stays at or under 0.8% up
    to gaps of 8.5% of the top clock (1.1-1.3% at 12.8%), on the A40's GPT-3 stages 0.8% at
    6.9% (1.1% at 10.3%); the V100 kernels are not bridged at gaps of 20% (p90 13-16%, its
    lowest clock off the physics). The five clocks leave 19% (A100) and 25% (A40) between
    ``min`` and ``mid``. In ``benchmarks/few_clock_plans.py`` (27 real sets, 2/5/10%)
    ``max_gap=0.08`` cuts the plans more than 0.5% above the every-clock optimum from 18 to 9
    (worst 9.3% -> 3.7%; no plan late, against one by 0.011 points) at 8-9 clocks on Perseus,
    0.05 to 7 (1.5%, 13-17 clocks) and 0.03 to none (0.375%, 22-27 clocks). With active
    profiling on top (:mod:`opdvfs.plan.active`, ``few_clock_plans.py --active``) 0.07 leaves
    4 (worst 3.7%, none late, 9 clocks added over the 81 plans; the five clocks and active
    profiling: 7, worst 7.6%, none late): the plans still more than 0.5% off are on Perseus's
    stages, whose measured times step where no smooth model goes (the A40's backward stage
    runs 4% faster at 960 MHz than at 1005), and the optimum on the profiled clocks is as far
    off as the plan.
    """
    grid = np.unique(np.asarray(freqs_mhz, dtype=float))
    if grid.size == 0:
        raise ValidationError("the device lists no clock", field="freqs_mhz")
    top = grid[-1]
    targets = [top, *(top * f for f in below), (grid[0] + grid[-1]) / 2, grid[0]]
    picks = {int(np.argmin(np.abs(grid - t))) for t in targets}
    if max_gap is not None:
        picks = _bridge(grid, picks, max_gap * float(top))
    return tuple(float(grid[i]) for i in sorted(picks, reverse=True))


def _bridge(grid: np.ndarray, picks: set[int], widest_mhz: float) -> set[int]:
    """Add the grid clock nearest each gap's middle until no gap is wider than ``widest_mhz``.

    A gap with no grid clock inside is left as it is.
    """
    picks = set(picks)
    while True:
        chosen = np.array(sorted(picks))
        gaps = np.diff(grid[chosen])
        added = False
        for k in np.flatnonzero(gaps > widest_mhz * (1 + 1e-9)):
            lo, hi = int(chosen[k]), int(chosen[k + 1])
            if hi - lo < 2:
                continue
            inner = np.arange(lo + 1, hi)
            middle = (grid[lo] + grid[hi]) / 2
            picks.add(int(inner[np.argmin(np.abs(grid[inner] - middle))]))
            added = True
        if not added:
            return picks


def within_profiled(profile: Profile, spec: DeviceSpec | None = None) -> DeviceSpec | None:
    """Return ``spec`` (default: the profile's preset) without clocks outside the profiled range.

    What ``tune`` plans over: the models fill the clocks between two measured ones (their
    error there is estimated, :func:`~opdvfs.plan.measured.log_uncertainty`) but would
    extrapolate below the lowest or above the highest, which ``opdvfs plan`` refuses without
    ``--force``. A sweep over ``--clocks 1410,1110,810`` on ``sim:a100-like`` planned some
    operators at 210 MHz before. None when the device has no preset and ``spec`` is None (the
    planner then takes the profile's own clocks).
    """
    spec = spec or preset_spec(profile.meta.get("device"))
    if spec is None:
        return None
    measured = profile.freqs_mhz
    low, high = float(measured[0]) * (1 - 1e-9), float(measured[-1]) * (1 + 1e-9)
    kept = tuple(f for f in spec.freqs_mhz if low <= f <= high)
    if not kept or len(kept) == len(spec.freqs_mhz):
        return spec
    return spec.with_changes(freqs_mhz=kept)


# ----------------------------------------------------------------------------- refusals
def check_device(recorded: str | None, device: str | None, what: str) -> None:
    """Refuse a ``device`` other than the one the profile or MODELS file (``what``) recorded."""
    if device is not None and recorded is not None and recorded != device:
        raise ValidationError(
            f"the {what} was measured on {recorded!r}, not on --device {device!r}: plan it "
            "for its own device (drop --device), or pass --force",
            field="device",
        )


def _check_range(measured_mhz: np.ndarray, inputs: PlanInputs, what: str) -> None:
    """Refuse device clocks outside the measured range (the models would extrapolate)."""
    low, high = float(np.min(measured_mhz)), float(np.max(measured_mhz))
    freqs = np.asarray(inputs.freqs_mhz, dtype=float)
    outside = freqs[(freqs < low * (1 - 1e-9)) | (freqs > high * (1 + 1e-9))]
    if outside.size:
        raise ValidationError(
            f"{inputs.device or 'the device'} offers {freqs.min():g}-{freqs.max():g} MHz but the "
            f"{what} measured {low:g}-{high:g} MHz: {outside.size} clock(s) outside it "
            f"(e.g. {outside[0]:g} MHz) would be extrapolated by the models; profile the "
            "device's lowest and highest clocks, or pass --force",
            field="freq_mhz",
        )


def _latency(latency_ms: float | None, spec: DeviceSpec | None, check: bool) -> float:
    """Return the switch latency to plan with: the device's (1 ms unknown), or the one given.

    ``check``: refuse one below the device's own (plans would expect switches too early).
    """
    if latency_ms is None:
        return spec.switch_latency_ms if spec is not None else 1.0
    if check and spec is not None and latency_ms < spec.switch_latency_ms:
        raise ValidationError(
            f"--switch-latency-ms {latency_ms:g} is below {spec.name}'s switch latency "
            f"{spec.switch_latency_ms:g} ms: the plan would expect its switches to land before "
            "they can; drop the option, or pass --force",
            field="switch_latency_ms",
        )
    return latency_ms


def _rail(schedule: Schedule, objective: Objective, prefix: str) -> tuple[float, float] | None:
    """Return (baseline, plan) on the objective's rail from the ``{prefix}*`` fields, if known.

    The rail: core energy for ``core-energy``, mean chip power for ``power``, chip energy
    otherwise; ``prefix`` is ``""`` (the values planned on) or ``"measured_"``.
    """
    core = "core_" if objective == "core-energy" else ""
    planned = prefix or "predicted_"  # the plan's own fields: predicted_* or measured_*
    base = getattr(schedule, f"{prefix}baseline_{core}energy_j")
    plan = getattr(schedule, f"{planned}{core}energy_j")
    if base is None or plan is None:
        return None
    if objective == "power":
        base_t = getattr(schedule, f"{prefix}baseline_time_s")
        plan_t = getattr(schedule, f"{planned}time_s")
        if not base_t or not plan_t:
            return None
        return base / base_t, plan / plan_t
    return base, plan


def _refuse_worse_than_top(schedule: Schedule, objective: Objective, top_mhz: float) -> None:
    """Refuse a plan worse than the top clock on the objective, predicted or measured.

    Predicted: on the values planned on; measured: on the profile's measurements, where it
    measured the planned clocks (a model-planned schedule can lose there what it gains on the
    models). :class:`InfeasibleError`: no plan within the budget is known to beat the top clock.
    """
    what = {"core-energy": "core energy", "power": "mean chip power"}.get(objective, "chip energy")
    unit = "W" if objective == "power" else "J"
    for prefix, where in (("", "predicted"), ("measured_", "measured")):
        pair = _rail(schedule, objective, prefix)
        if pair is None or pair[1] <= pair[0] * (1 + 1e-9):
            continue
        base, plan = pair
        base_t = getattr(schedule, f"{prefix}baseline_time_s") or 0.0
        raise InfeasibleError(
            f"the plan's {where} {what} {plan:.6g} {unit} exceeds the top clock's {base:.6g} "
            f"{unit} ({where} baseline: {base_t:.6g} s per iteration at {top_mhz:g} MHz); "
            "not written: run at the top clock"
        )


# ----------------------------------------------------------------------------- fit and plan
@dataclass(frozen=True)
class PlanOnProfile:
    """The models fitted on a profile and the planner's inputs, as ``opdvfs plan`` has them.

    Attributes
    ----------
    models
        The fitted time and power models (None when the profile measured every clock).
    inputs
        The planner's inputs (the device's clocks, streams, measurements).
    switch_latency_ms
        The switch latency to plan with (ms): the device's unless another was asked for.
    n_launches
        Operators the executor counts per iteration (a simulated GPU's sweep: its rows are the
        kernels, mapped back with :func:`~opdvfs.schedule.on_launches`); None: the
        profile's operators are those the executor counts.
    """

    models: ModelBundle | None
    inputs: PlanInputs
    switch_latency_ms: float
    n_launches: int | None = None


def _load(workload: Workload | str | None) -> Workload | None:
    return load_workload(workload) if isinstance(workload, str) else workload


def fit_profile(
    profile: Profile,
    *,
    objective: Objective = "energy",
    n_launches: int | None = None,
    spec: DeviceSpec | None = None,
    workload: Workload | str | None = None,
    train_freqs_mhz: Sequence[float] | None = None,
    values: Values = "auto",
    switch_latency_ms: float | None = None,
    check: bool = False,
) -> PlanOnProfile:
    """Fit the models a profile's plan needs, as ``opdvfs plan PROFILE`` does.

    The planner's inputs from the profile over the device's clocks
    (:meth:`PlanInputs.from_profile`), and models fitted only where they are planned on: with
    ``values="auto"`` when some operator was not measured at some clock the device offers (or
    ``train_freqs_mhz`` asks for models), always with ``values="model"``, never with
    ``values="measured"``.

    Parameters
    ----------
    profile
        The measured profile (two clocks or more).
    objective
        What the plan minimises (``core-energy`` needs the core rail measured or modelled).
    n_launches
        Operators the executor counts per iteration, when the profile's rows are a simulated
        GPU's kernels (:attr:`PlanOnProfile.n_launches`).
    spec
        The device to plan for; by default the preset the profile names (its clocks and V-f
        curve).
    workload
        The op streams and idle gaps (a :class:`Workload`, or its name or file); by default
        the profile's.
    train_freqs_mhz
        Clocks to fit the models on (default: every profiled clock).
    values
        What the plan is planned on (:data:`~opdvfs.schedule.Values`).
    switch_latency_ms
        The switch latency to plan with (default: the device's, else 1 ms).
    check
        Refuse (:class:`ValidationError`) a ``spec`` other than the profile's device, device
        clocks outside the profiled range (the models would extrapolate), and a switch latency
        below the device's, as ``opdvfs plan`` does without ``--force``.
    """
    inputs = PlanInputs.from_profile(profile, spec, workload=_load(workload))
    if check:
        check_device(profile.meta.get("device"), spec.name if spec else None, "profile")
        _check_range(profile.freqs_mhz, inputs, "profile")
    # the device planned for (spec, else the profile's preset) brings the V-f curve
    spec = spec or preset_spec(inputs.device)
    assert inputs.measured is not None
    covered = inputs.measured.covers(inputs.freqs_mhz, core=objective == "core-energy")
    # models asked for with values="auto" are fitted, not silently dropped
    if train_freqs_mhz is not None and values == "measured":
        raise ValidationError(
            "--train-freqs fits models; --values measured plans without them", field="values"
        )
    models = None
    if values == "model" or (values == "auto" and (not covered or train_freqs_mhz is not None)):
        models = ModelBundle(
            PerfModel().fit(profile, train_freqs_mhz),
            PowerModel().fit(profile, train_freqs_mhz, device=spec),
        )
    return PlanOnProfile(models, inputs, _latency(switch_latency_ms, spec, check), n_launches)


def _on_models(
    models: ModelBundle,
    *,
    spec: DeviceSpec | None,
    workload: Workload | str | None,
    switch_latency_ms: float | None,
    check: bool,
) -> PlanOnProfile:
    """Return a MODELS file's :class:`PlanOnProfile`: its device's clocks, or ``spec``'s."""
    recorded = models.device
    if check:
        name = recorded.name if recorded else None
        check_device(name, spec.name if spec else None, "MODELS file")
    # the MODELS file's own device, unless spec names another (with check off)
    spec = spec or recorded
    if spec is None:
        raise ValidationError(
            "this MODELS file records no device: pass --device (the clocks to plan over)",
            field="device",
        )
    work = _load(workload)
    n_ops = len(models.perf.op_ids_)
    if work is not None:
        inputs = PlanInputs.from_workload(work, spec.freqs_mhz, device=spec.name)
    else:  # without a workload: every op on the compute stream, back to back
        inputs = PlanInputs(
            np.asarray(spec.freqs_mhz), np.full(n_ops, "compute"), np.zeros(n_ops), device=spec.name
        )
    if check:
        _check_range(models.perf.train_freqs_mhz_, inputs, "MODELS file's profile")
    return PlanOnProfile(models, inputs, _latency(switch_latency_ms, spec, check))


def plan_fitted(
    fitted: PlanOnProfile,
    *,
    target: float,
    objective: Objective = "energy",
    interval_ms: float = 20.0,
    dispatch: Dispatch = "predictive",
    solver: Solver = "dp",
    values: Values = "auto",
    refuse_worse: bool = False,
    conservative: bool = True,
) -> Schedule:
    """Plan at ``target`` on :func:`fit_profile`'s models, as ``opdvfs plan`` does; map to launches.

    ``interval_ms`` below the device's switch latency is raised to it by
    :func:`~opdvfs.plan.planner.plan_schedule` (shorter stages' switches would be superseded).
    ``refuse_worse``: raise :class:`InfeasibleError` when the plan is predicted, or measured on
    the profile, to be worse than the top clock on the objective (``opdvfs plan`` writes no
    such plan). ``conservative``: meet the budget on the cells' conservative times (``opdvfs
    plan``), or plan on their point values (False: ``opdvfs tune``, whose A/B rounds measure
    each plan and re-plan; :func:`~opdvfs.plan.planner.plan_schedule`).
    """
    schedule = plan_schedule(
        fitted.models,
        fitted.inputs,
        target=target,
        objective=objective,
        interval_ms=interval_ms,
        switch_latency_ms=fitted.switch_latency_ms,
        dispatch=dispatch,
        solver=solver,
        values=values,
        conservative=conservative,
    )
    if refuse_worse:
        _refuse_worse_than_top(schedule, objective, float(np.max(fitted.inputs.freqs_mhz)))
    if fitted.n_launches is not None:
        assert fitted.inputs.measured is not None
        # the executor counts every operator the script launches, views included
        schedule = on_launches(schedule, fitted.inputs.measured.op_ids, fitted.n_launches)
    return schedule


@dataclass(frozen=True)
class ProfilePlan:
    """A plan of a profile (:func:`plan_profile`) and what was said about it.

    Attributes
    ----------
    schedule
        The planned schedule, on the operators the executor counts.
    fitted
        The models fitted (None where every clock was measured) and the planner's inputs.
    objective, values
        What was minimised, and planned on.
    interval_ms
        The frequency-adjustment interval asked for (the plan's stages are at least the switch
        latency long, :func:`~opdvfs.plan.planner.shortest_stage_ms`).
    warnings
        Each warning :func:`plan_profile` gave, in order: an interval shorter than the switch
        latency, operators all under :data:`NOISE_US`, a plan over its budget on the profile's
        measurements.
    """

    schedule: Schedule
    fitted: PlanOnProfile
    objective: Objective
    values: Values
    interval_ms: float
    warnings: tuple[str, ...] = ()

    def frontier(self) -> pd.DataFrame:
        """Return the whole time-energy frontier of the same problem (``plan --frontier``)."""
        return plan_frontier(
            self.fitted.models,
            self.fitted.inputs,
            objective=self.objective,
            interval_ms=shortest_stage_ms(self.interval_ms, self.fitted.switch_latency_ms),
            values=self.values,
        )


def plan_profile(
    source: Profile | ModelBundle,
    target: float,
    *,
    objective: Objective = "energy",
    values: Values = "auto",
    spec: DeviceSpec | None = None,
    workload: Workload | str | None = None,
    train_freqs_mhz: Sequence[float] | None = None,
    interval_ms: float | None = None,
    switch_latency_ms: float | None = None,
    dispatch: Dispatch = "predictive",
    solver: Solver = "dp",
    force: bool = False,
    warn: Callable[[str], None] | None = None,
) -> ProfilePlan:
    """Plan per-stage clocks for a measured profile within a slowdown ``target``: ``opdvfs plan``.

    Measurements first: :func:`fit_profile` fits models only where the profile did not measure
    (``values``); :func:`plan_fitted` plans and maps a simulated GPU's swept kernels back onto
    every launch (the profile's ``sweep.launches_per_iteration``). The parameters not listed
    below are :func:`fit_profile`'s and :func:`~opdvfs.plan.planner.plan_schedule`'s
    (``train_freqs_mhz``: a profile only).

    Parameters
    ----------
    source
        A measured profile, or models already fitted (a MODELS file), planned over their
        recorded device's clocks (or ``spec``'s) and ``workload``'s streams (default: every
        operator on the compute stream, back to back). Not referenced past the fit: a caller
        that hands over its only reference frees the profile before planning.
    target
        The allowed slowdown (0.02 = 2%).
    interval_ms
        The frequency-adjustment interval (default :data:`DEFAULT_INTERVAL_MS`); 0 plans one
        stage per operator. A stage is never planned shorter than the switch latency.
    force
        Plan anyway with a ``spec`` other than the recorded device, device clocks outside the
        profiled range, or a switch latency below the device's (else :class:`ValidationError`).
    warn
        Called with each warning as it arises (so one given before planning is not lost if
        planning then fails); they are also in :attr:`ProfilePlan.warnings`.

    Raises
    ------
    InfeasibleError
        When no plan is known to beat the top clock on the objective, predicted or measured.
    """
    notes: list[str] = []

    def note(message: str) -> None:
        notes.append(message)
        if warn is not None:
            warn(message)

    if isinstance(source, ModelBundle):
        if train_freqs_mhz is not None:
            raise ValidationError("models already fitted take no training clocks", field="train")
        fitted = _on_models(
            source,
            spec=spec,
            workload=workload,
            switch_latency_ms=switch_latency_ms,
            check=not force,
        )
    else:
        if {"chip_power_w", "core_power_w"} & set(source.ops.columns):
            # power per op: the sensor samples are not fitted on (a handed-over profile frees
            # them here, ~140 MB at 1M ops x 3 clocks)
            source = source.without_samples()
        n_launches = source.meta.get("sweep", {}).get("launches_per_iteration")
        fitted = fit_profile(
            source,
            objective=objective,
            # `capture --freqs` on a simulated GPU: its rows are the kernels
            n_launches=int(n_launches) if n_launches else None,
            spec=spec,
            workload=workload,
            train_freqs_mhz=train_freqs_mhz,
            values=values,
            switch_latency_ms=switch_latency_ms,
            check=not force,
        )
    # the profile is not needed past the fit: a caller that handed over its only reference
    # (as ``opdvfs plan`` does) frees it here, before the planner's tables (at 1M ops x 3
    # clocks the profile holds ~470 MB, the tables reach ~900 MB)
    del source
    latency = fitted.switch_latency_ms
    if interval_ms is None:
        interval_ms = DEFAULT_INTERVAL_MS
    elif interval_ms < latency:
        # A request still pending when the next is issued is superseded (SetFreq semantics,
        # docs/twin-calibration.md): the planner keeps stages at least one switch long
        # (plan.planner.shortest_stage_ms)
        note(
            f"--interval-ms {interval_ms:g} is shorter than the {latency:g} ms switch latency: "
            f"stages are planned at least {latency:g} ms long (a shorter stage's switch would be "
            "superseded before it lands)"
        )
    schedule = plan_fitted(
        fitted,
        target=target,
        objective=objective,
        interval_ms=interval_ms,
        dispatch=dispatch,
        solver=solver,
        values=values,
        refuse_worse=True,
    )
    # models alone have no measured times to judge
    measured = fitted.inputs.measured
    if measured is not None and np.all(measured.raw().time_us[:, -1] < NOISE_US):
        note(
            f"every operator runs under {NOISE_US:g} us at the top clock, where times are "
            "mostly timer noise: the plan's predicted savings are not trustworthy"
        )
    # on the raw medians (the schedule's measured_* fields), not on the smoothed cells
    if schedule.measured_time_s and schedule.measured_baseline_time_s:
        slowdown = schedule.measured_time_s / schedule.measured_baseline_time_s - 1
        if slowdown > schedule.target * (1 + 1e-9) + 1e-12:
            note(
                f"on the profile's measurements the plan is {slowdown:.2%} slower, over its "
                f"{schedule.target:.2%} budget (planned on {values} values)"
            )
    return ProfilePlan(schedule, fitted, objective, values, interval_ms, tuple(notes))
