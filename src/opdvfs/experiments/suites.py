"""The experiments: ``demo`` (one workload, the whole pipeline) and ``paper`` (Table 3, ablations).

Every figure is measured on the simulated accelerator (DESIGN §2), never taken from the plan;
the plan's prediction sits beside it. The paper's own numbers (Table 3, Fig. 18, from
``research/paper-notes.md``) are carried for comparison only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from opdvfs._model import FrozenModel
from opdvfs.experiments.bench import Bench, Outcome, measure, prepare
from opdvfs.models.validation import relative_errors_pct
from opdvfs.plan.classify import classify_by_sensitivity, sensitivity
from opdvfs.plan.planner import plan_grouped, plan_schedule
from opdvfs.schedule import DISPATCHES, Objective, Schedule
from opdvfs.sim.twin import SimRun, SimulatedDevice

__all__ = [
    "PAPER_ABLATIONS",
    "PAPER_TABLE3",
    "DemoData",
    "Goal",
    "SuiteResult",
    "drop_ratio",
    "paper_figures",
    "plan_and_measure",
    "run_demo",
    "run_paper_suite",
]

#: Paper Table 3 (Ascend 910B): (workload, target %) -> perf loss %, SoC power saving %,
#: AICore power saving %, base -> DVFS iteration time (s).
PAPER_TABLE3: dict[tuple[str, int], dict[str, float]] = {
    ("gpt3", 2): {"perf_loss": 1.59, "soc_power": 5.56, "core_power": 15.27, "base_s": 11.29},
    ("gpt3", 4): {"perf_loss": 3.28, "soc_power": 6.98, "core_power": 20.25, "base_s": 11.29},
    ("gpt3", 6): {"perf_loss": 4.96, "soc_power": 9.35, "core_power": 25.68, "base_s": 11.29},
    ("gpt3", 8): {"perf_loss": 7.17, "soc_power": 10.65, "core_power": 29.77, "base_s": 11.29},
    ("gpt3", 10): {"perf_loss": 8.59, "soc_power": 11.97, "core_power": 32.01, "base_s": 11.29},
    ("bert", 2): {"perf_loss": 1.78, "soc_power": 6.61, "core_power": 17.08, "base_s": 0.309},
    ("resnet50", 2): {"perf_loss": 1.80, "soc_power": 3.44, "core_power": 11.05, "base_s": 0.317},
    ("resnet152", 2): {"perf_loss": 1.88, "soc_power": 4.20, "core_power": 10.37, "base_s": 0.637},
}

#: Paper Fig. 18 (GPT-3, 2% target): variant -> perf loss %, SoC and AICore power saving %.
PAPER_ABLATIONS: dict[str, dict[str, float]] = {
    "reference": {"perf_loss": 1.59, "soc_power": 5.56, "core_power": 15.27},
    "late-14ms": {"perf_loss": 1.69, "soc_power": 3.41, "core_power": 7.07},
    "fai-100ms": {"perf_loss": 1.74, "soc_power": 3.60, "core_power": 9.30},
    "fai-1s": {"perf_loss": 1.97, "soc_power": 3.48, "core_power": 10.09},
}


_ABLATION_KEYS = {
    "switch lands 14 ms late": "late-14ms",
    "switch lands 14 ms late, budget re-met": "late-14ms",
    "interval 100 ms": "fai-100ms",
    "interval 1000 ms": "fai-1s",
}


def paper_figures(o: Outcome) -> dict[str, float] | None:
    """Return the paper's figures for the same row (Table 3 or Fig. 18), if it reports one."""
    if o.workload == "gpt3" and o.label.startswith("reference"):
        return PAPER_ABLATIONS["reference"]
    if o.workload == "gpt3" and o.label in _ABLATION_KEYS:
        return PAPER_ABLATIONS[_ABLATION_KEYS[o.label]]
    if o.label.endswith("%"):
        return PAPER_TABLE3.get((o.workload, round(o.target_pct)))
    return None


class Goal(FrozenModel):
    """One acceptance goal, checked on measured numbers."""

    goal: str
    met: bool
    detail: str


class SuiteResult(FrozenModel):
    """Everything a report needs in text form: sections of outcomes, the goals, the setup."""

    suite: str
    device: str
    objective: str
    simulated: bool = True
    sections: dict[str, list[Outcome]]
    goals: list[Goal]
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0


@dataclass
class DemoData:
    """Arrays behind the demo's plots (not serialised)."""

    timeline: dict[str, np.ndarray] = field(default_factory=dict)
    schedule: Schedule | None = None
    sweep: list[Outcome] = field(default_factory=list)
    static: list[Outcome] = field(default_factory=list)
    perf_errors_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    power_errors_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    #: The rail ``power_errors_pct`` scores (the power model's).
    power_rail: str = "core"


Step = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


#: The paper's frequency-adjustment interval (§6, 5 ms).
_INTERVAL_MS = 5.0


def _plan(bench: Bench, target: float, objective: Objective, **options: Any) -> Schedule:
    latency = options.pop("switch_latency_ms", bench.device.spec.switch_latency_ms)
    # (plan_schedule keeps every stage at least one switch long: plan.planner.shortest_stage_ms)
    options.setdefault("interval_ms", _INTERVAL_MS)
    return plan_schedule(
        bench.predictions,
        bench.inputs,
        target=target,
        objective=objective,
        switch_latency_ms=latency,
        **options,
    )


def plan_and_measure(
    bench: Bench,
    target: float,
    objective: Objective,
    label: str,
    *,
    device: SimulatedDevice | None = None,
    planner: Callable[[float], Schedule] | None = None,
    **options: Any,
) -> tuple[Outcome, SimRun, Schedule]:
    """Plan, execute, and while the run comes out slower than the target, re-plan (<= 3 times).

    Each correction maps the planned slowdown onto the measured one (the models' bias at the
    top clock and at the clocks chosen) and shrinks the budget by that ratio, as a user would
    after a measured iteration. The outcome records the final factor (``budget_scale``).
    ``planner`` maps a budget to a schedule (default: the per-operator planner with
    ``options``).
    """

    def plan(budget: float) -> Schedule:
        if planner is not None:
            return planner(budget)
        return _plan(bench, budget, objective, **options)

    scale = 1.0
    schedule = plan(target)
    outcome, run = measure(bench, schedule, label, target=target, device=device)
    for _ in range(3):
        predicted = outcome.predicted_perf_loss_pct or 0.0
        if outcome.perf_loss_pct <= outcome.target_pct or predicted <= 0:
            break
        scale *= predicted / outcome.perf_loss_pct
        schedule = plan(target * scale)
        outcome, run = measure(bench, schedule, label, target=target, device=device)
    return outcome.model_copy(update={"budget_scale": scale}), run, schedule


def _timeline(bench: Bench, run: SimRun) -> dict[str, np.ndarray]:
    """Last iteration's op spans, clock and class (the planner's sensitivity classes)."""
    n = run.n_ops
    exe = run.execution
    last = slice(n * (run.iterations - 1), n * run.iterations)
    t0 = exe.start_us[last][0]
    freqs = np.sort(np.asarray(bench.inputs.freqs_mhz, dtype=float))
    times = bench.models.perf.predict([freqs[0], freqs[-1]])
    sens = sensitivity(times[:, 0], times[:, 1], freqs[0], freqs[-1])
    return {
        "start_s": (exe.start_us[last] - t0) * 1e-6,
        "end_s": (exe.end_us[last] - t0) * 1e-6,
        "freq_mhz": run.freq_mhz[last],
        "high": classify_by_sensitivity(sens, bench.inputs.streams) == 1,
    }


def _model_errors(bench: Bench, held_out_mhz: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Per-op time and power errors (%) at clocks the models were not fitted on.

    Power on the rail the model was fitted on: the core where the profile measured it (Ascend's
    AICore), else the chip (a GPU's board power).
    """
    test = bench.device.profile(bench.workload, held_out_mhz)
    ops = test.ops.sort_values(["freq_mhz", "op"])
    clocks = np.sort(ops["freq_mhz"].unique())
    n = len(bench.workload)
    actual_t = ops["time_us"].to_numpy().reshape(len(clocks), n).T
    pred_t = bench.models.perf.predict(clocks)
    long_enough = actual_t >= 20.0  # the paper drops ops under 20 us
    perf = relative_errors_pct(pred_t[long_enough], actual_t[long_enough])
    power = bench.models.power
    rail = None if power is None else power.rail_
    if power is None or f"{rail}_power_w" not in ops:
        return perf, np.empty(0)
    actual_p = ops[f"{rail}_power_w"].to_numpy().reshape(len(clocks), n).T
    pred_p = power.predict(clocks, time_us=pred_t)[f"{rail}_w"]
    return perf, relative_errors_pct(pred_p[long_enough], actual_p[long_enough])


def run_demo(
    workload: str = "gpt3",
    device_name: str = "ascend-910b-like",
    *,
    target: float = 0.02,
    objective: Objective | None = None,
    sweep_targets: Sequence[float] = (0.01, 0.02, 0.04, 0.06, 0.08, 0.10),
    seed: int = 0,
    step: Step = _quiet,
) -> tuple[SuiteResult, DemoData]:
    """Profile, fit, plan ``target`` and execute it; sweep targets and static clocks; score.

    Parameters
    ----------
    workload
        Workload name (see :data:`opdvfs.workloads.BUILDERS`) or file.
    device_name
        Simulated device preset (see :data:`opdvfs.sim.presets.PRESETS`).
    target
        Allowed slowdown as a fraction of the top-clock iteration time (0.02 = 2%).
    objective
        What the plans minimise; default: the energy of the rail the device measures per op
        (``core-energy`` where the profile has core power, as Ascend's AICore; ``energy``, the
        chip, on a GPU, whose sensor reads board power only).
    sweep_targets
        Further targets (fractions) to plan and measure, for the savings figure.
    seed
        Seed of the simulator's noise.
    step
        Called with a description as each step starts (a progress bar).

    Returns
    -------
    SuiteResult
        The measured plan and the best static clock, the goals and notes.
    DemoData
        The arrays behind the demo's figures.
    """
    step(f"profiling {workload} on {device_name} at the training clocks and fitting")
    bench = prepare(workload, device_name, seed=seed)
    if objective is None:
        rail = bench.models.power.rail_ if bench.models.power is not None else "chip"
        objective = "core-energy" if rail == "core" else "energy"
    step(f"planning a {target:.0%} budget and executing it")
    main, run, schedule = plan_and_measure(bench, target, objective, "per-operator plan")
    data = DemoData(timeline=_timeline(bench, run), schedule=schedule)
    step("sweeping targets")
    for t in sweep_targets:
        data.sweep.append(plan_and_measure(bench, t, objective, f"{t:.0%}")[0])
    step("sweeping static clocks")
    for f in bench.device.spec.freqs_mhz:
        data.static.append(measure(bench, None, f"static {f:g} MHz", target=target, freq_mhz=f)[0])
    step("scoring the models on held-out clocks")
    train = set(bench.profile.freqs_mhz.tolist())
    held = [f for f in bench.device.spec.freqs_mhz if f not in train]
    data.perf_errors_pct, data.power_errors_pct = _model_errors(bench, held)
    if bench.models.power is not None:
        data.power_rail = bench.models.power.rail_
    best_static = _best_static(data.static, target, objective)
    sections = {"plan": [main], "static": [best_static] if best_static else []}
    goals = [
        _goal_budget([main]),
        _goal_prediction([main]),
    ]
    if best_static is not None:
        goals.append(_goal_beats(main, [best_static], objective))
    notes = [
        f"perf model: mean |error| {np.mean(data.perf_errors_pct):.2f}% on "
        f"{len(data.perf_errors_pct)} (op, held-out clock) points; "
        + (
            f"{data.power_rail} power model: {np.mean(data.power_errors_pct):.2f}%"
            if data.power_errors_pct.size
            else "no per-op power on this device (NVML-like sensor)"
        )
    ]
    result = SuiteResult(
        suite="demo",
        device=device_name,
        objective=objective,
        sections=sections,
        goals=goals,
        notes=notes,
    )
    return result, data


def _best_static(static: Sequence[Outcome], target: float, objective: Objective) -> Outcome | None:
    """Return the measured static clock that saves the most within the budget (an oracle)."""
    ok = [o for o in static if o.perf_loss_pct <= target * 100 + 0.05]
    return max(ok, key=lambda o: _objective_saving(o, objective)) if ok else None


def _objective_saving(o: Outcome, objective: Objective) -> float:
    return o.core_energy_saving_pct if objective == "core-energy" else o.chip_energy_saving_pct


def _goal_budget(rows: Sequence[Outcome]) -> Goal:
    worst = max(rows, key=lambda o: o.perf_loss_pct - o.target_pct)
    bad = [o for o in rows if not o.within_budget]
    return Goal(
        goal="measured performance loss <= target in every row (0.05-point noise allowance)",
        met=not bad,
        detail=f"worst: {worst.workload} {worst.label} {worst.perf_loss_pct:.2f}% at a "
        f"{worst.target_pct:g}% target"
        + (f"; over: {', '.join(f'{o.workload} {o.label}' for o in bad)}" if bad else ""),
    )


def _goal_prediction(rows: Sequence[Outcome]) -> Goal:
    gaps = [
        abs((o.predicted_chip_energy_saving_pct or 0.0) - o.chip_energy_saving_pct)
        for o in rows
        if o.predicted_chip_energy_saving_pct is not None
    ]
    worst = max(gaps) if gaps else float("nan")
    return Goal(
        goal="predicted vs measured chip-energy saving within 1 point",
        met=bool(gaps) and worst <= 1.0,
        detail=f"largest difference {worst:.2f} points over {len(gaps)} rows",
    )


def _goal_beats(main: Outcome, others: Sequence[Outcome], objective: Objective) -> Goal:
    mine = _objective_saving(main, objective)
    theirs = {o.label: _objective_saving(o, objective) for o in others}
    rail = "core" if objective == "core-energy" else "chip"
    return Goal(
        goal=f"per-operator plan beats {' and '.join(theirs)} at the same budget",
        met=all(mine > v for v in theirs.values()),
        detail=f"{rail} energy saved: per-operator {mine:.2f}%, "
        + ", ".join(f"{k} {v:.2f}%" for k, v in theirs.items()),
    )


def run_paper_suite(
    device_name: str = "ascend-910b-like",
    *,
    objective: Objective = "core-energy",
    seed: int = 0,
    step: Step = _quiet,
) -> SuiteResult:
    """Run the paper's Table 3 and Fig. 18 ablations, plus baselines and host-bound inference.

    Parameters
    ----------
    device_name
        Simulated device preset (see :data:`opdvfs.sim.presets.PRESETS`).
    objective
        What the plans minimise.
    seed
        Seed of the simulator's noise.
    step
        Called with a description as each step starts (a progress bar).
    """
    table: list[Outcome] = []
    benches: dict[str, Bench] = {}
    plans: dict[tuple[str, float], Schedule] = {}
    reference_run: SimRun | None = None
    for workload, targets in (
        ("gpt3", (0.02, 0.04, 0.06, 0.08, 0.10)),
        ("bert", (0.02,)),
        ("resnet50", (0.02,)),
        ("resnet152", (0.02,)),
    ):
        step(f"Table 3: {workload}")
        bench = benches[workload] = prepare(workload, device_name, seed=seed)
        for t in targets:
            outcome, run, plan = plan_and_measure(bench, t, objective, f"{t:.0%}")
            table.append(outcome)
            plans[(workload, t)] = plan
            if (workload, t) == ("gpt3", 0.02):
                reference_run = run
    reference_plan = plans[("gpt3", 0.02)]
    gpt3, target = benches["gpt3"], 0.02
    ref = next(o for o in table if o.workload == "gpt3" and o.target_pct == 2)
    reference = ref.model_copy(update={"label": "reference (1 ms switch, 5 ms interval)"})
    step("ablations: late switches, adjustment intervals")
    ablations = [reference]
    # the paper's experiment: the reference plan on the same chip, each SetFreq issued 14 ms
    # after its planned point ("SetFreq delayed by 14 ms", simulating a ~15 ms GPU switch);
    # every switch lands, 14 ms into the ops after the ones it was planned for
    late = gpt3.device.with_switch_delay(14.0)
    late_row, late_run = measure(
        gpt3, reference_plan, "switch lands 14 ms late", target=target, device=late
    )
    ablations.append(late_row)
    # ... and what is left of the saving once the budget is met again despite the late switches
    late_met = plan_and_measure(
        gpt3, target, objective, "switch lands 14 ms late, budget re-met", device=late
    )[0]
    ablations.append(late_met)
    for interval in (100.0, 1000.0):
        label = f"interval {interval:g} ms"
        ablations.append(plan_and_measure(gpt3, target, objective, label, interval_ms=interval)[0])
    step("where the saving comes from: op families, adjustment intervals")
    assert reference_run is not None  # gpt3 2% is a Table 3 row
    diagnostics = (
        _saving_sources(gpt3, reference_run)
        + _late_switches(gpt3, reference_plan, reference_run, late_run, target)
        + _saving_by_interval(
            gpt3, objective, {5.0: ablations[0], 100.0: ablations[-2], 1000.0: ablations[-1]}
        )
    )
    step("ablations: a 15 ms switch, predictive vs reactive")
    slow = gpt3.with_latency(15.0)
    switch15 = []
    for dispatch in DISPATCHES:
        outcome, _, _ = plan_and_measure(
            gpt3,
            target,
            objective,
            f"15 ms switch, {dispatch}",
            device=slow,
            switch_latency_ms=15.0,
            dispatch=dispatch,
        )
        switch15.append(outcome)
    ablations += switch15
    step("baselines: static clocks, per-phase plan")
    static = [
        measure(gpt3, None, f"static {f:g} MHz", target=target, freq_mhz=f)[0]
        for f in gpt3.device.spec.freqs_mhz
    ]
    best_static = _best_static(static, target, objective)
    # the per-phase baseline gets the same measured correction as the per-operator plans
    per_phase = plan_and_measure(
        gpt3,
        target,
        objective,
        "per-phase plan (forward / backward / optimizer)",
        planner=lambda budget: plan_grouped(
            gpt3.predictions,
            gpt3.inputs,
            gpt3.inputs.phases,
            target=budget,
            objective=objective,
            switch_latency_ms=gpt3.device.spec.switch_latency_ms,
        ),
    )[0]
    baselines = [reference, per_phase] + (
        [best_static.model_copy(update={"label": f"best {best_static.label}"})]
        if best_static
        else []
    )
    step("a 15 ms switch on a short iteration (bert)")
    bert = benches["bert"]
    bert_slow = bert.with_latency(15.0)
    short = [
        next(o for o in table if o.workload == "bert").model_copy(
            update={"label": "reference (1 ms switch)"}
        )
    ]
    for dispatch in DISPATCHES:
        short.append(
            plan_and_measure(
                bert,
                target,
                objective,
                f"15 ms switch, {dispatch}",
                device=bert_slow,
                switch_latency_ms=15.0,
                dispatch=dispatch,
            )[0]
        )
    step("inference: llama2-infer (host-bound)")
    llama = prepare("llama2-infer", device_name, seed=seed)
    # the paper's static 1300 MHz row (§8), at the device's nearest clock on other presets
    grid = np.asarray(llama.device.spec.freqs_mhz, dtype=float)
    uniform = float(grid[np.argmin(np.abs(grid - 1300.0))])
    inference = [
        measure(llama, None, f"uniform {uniform:g} MHz", target=target, freq_mhz=uniform)[0],
        plan_and_measure(llama, target, objective, "planned (2%)")[0],
    ]

    def kept(o: Outcome, ref: Outcome = reference) -> float:
        """Share of the reference plan's saving that ``o`` keeps."""
        return _objective_saving(o, objective) / max(_objective_saving(ref, objective), 1e-9)

    keep, keep_reactive, keep_late = kept(switch15[0]), kept(switch15[1]), kept(late_met)
    short_kept = [kept(o, short[0]) for o in short[1:]]
    # the late-switch row is the failure the predictive dispatch exists to avoid: not planned
    planned_rows = table + ablations[2:] + [per_phase] + short[1:] + inference[1:]
    goals = [
        _goal_budget(planned_rows),
        _goal_prediction([*table, per_phase]),
        _goal_beats(reference, baselines[1:], objective),
        Goal(
            goal="15 ms switch: predictive keeps >= 80% of the 1 ms saving",
            met=keep >= 0.8 and short_kept[0] >= 0.8,
            detail=f"gpt3: predictive keeps {keep:.0%}, reactive {keep_reactive:.0%}; the 1 ms "
            f"plan with switches 14 ms late keeps {keep_late:.0%} once re-planned to the budget; "
            f"bert (0.12 s iterations): predictive {short_kept[0]:.0%}, reactive "
            f"{short_kept[1]:.0%} (paper, gpt3 14 ms late: 46% of the AICore power saving)",
        ),
    ]
    goals += _paper_goals(table, ablations)
    return SuiteResult(
        suite="paper",
        device=device_name,
        objective=objective,
        sections={
            "table3": table,
            "ablations": ablations,
            "baselines": baselines,
            "short iteration": short,
            "inference": inference,
        },
        goals=goals,
        notes=[
            "Every row is measured on the simulated accelerator; the paper's figures are from a "
            "real Ascend 910B and are shown for comparison, not reproduced.",
            "The paper reports power; energy is shown beside it: on an uncore-heavy chip a slower "
            "iteration can lower chip power and still raise chip energy.",
            "A row's budget scale < 1 means its first plan measured slower than the target and "
            "was re-planned with the budget scaled by predicted / measured slowdown.",
            "The twin is calibrated on facts that involve no DVFS outcome "
            "(docs/twin-calibration.md); the Table 3 and Fig. 18 rows are predictions of it.",
            *_plan_statistics(gpt3, plans),
            *diagnostics,
        ],
    )


#: Fig. 18 variants: the share of the reference's AICore power saving each kept (paper).
_PAPER_RETENTION = {
    "switch lands 14 ms late": ("late-14ms", 7.07 / 15.27),
    "interval 100 ms": ("fai-100ms", 9.30 / 15.27),
    "interval 1000 ms": ("fai-1s", 10.09 / 15.27),
}
#: Paper §7: SetFreq calls per GPT-3 iteration at the 2% target.
_PAPER_SWITCHES = 821


def drop_ratio(o: Outcome) -> float:
    """Non-AICore power drop over AICore power drop (W/W) of a row; NaN if the core did not drop."""
    core_w = o.core_power_base_w - o.core_power_w
    chip_w = o.chip_power_base_w - o.chip_power_w
    return (chip_w - core_w) / core_w if core_w > 0 else float("nan")


def _paper_goals(table: Sequence[Outcome], ablations: Sequence[Outcome]) -> list[Goal]:
    """Issue 18's validation bands: the twin's predictions of Table 3 and Fig. 18."""
    rows = [(o, paper_figures(o)) for o in table]
    core_off = [(o, o.core_power_saving_pct - ref["core_power"]) for o, ref in rows if ref]
    soc_off = [(o, o.chip_power_saving_pct - ref["soc_power"]) for o, ref in rows if ref]
    worst_core = max(core_off, key=lambda x: abs(x[1]))
    worst_soc = max(soc_off, key=lambda x: abs(x[1]))
    ratios = [(o, drop_ratio(o)) for o in table]
    gpt3 = [o for o in table if o.workload == "gpt3"]
    ref = ablations[0]
    by_label = {o.label: o for o in ablations}
    kept = {
        label: by_label[label].core_power_saving_pct / max(ref.core_power_saving_pct, 1e-9)
        for label in _PAPER_RETENTION
        if label in by_label
    }
    keep_ok = all(abs(kept[k] - _PAPER_RETENTION[k][1]) <= 0.15 for k in kept)
    order_ok = (
        len(kept) == 3
        and 1.0
        > min(kept["interval 100 ms"], kept["interval 1000 ms"])
        > kept["switch lands 14 ms late"]
    )
    switches = ref.switches
    return [
        Goal(
            goal="Table 3: AICore power change within 3 points and SoC within 1.5 of the paper, "
            "every row",
            met=abs(worst_core[1]) <= 3.0 and abs(worst_soc[1]) <= 1.5,
            detail=f"largest AICore gap {worst_core[1]:+.2f} points ({worst_core[0].workload} "
            f"{worst_core[0].label}), largest SoC gap {worst_soc[1]:+.2f} points "
            f"({worst_soc[0].workload} {worst_soc[0].label})",
        ),
        Goal(
            goal="Table 3: non-AICore / AICore power drop in [0.6, 1.2] (paper: 0.65-1.0)",
            met=all(0.6 <= r <= 1.2 for _, r in ratios),
            detail=", ".join(f"{o.workload} {o.label} {r:.2f}" for o, r in ratios),
        ),
        Goal(
            goal="GPT-3: SoC energy falls at every target (paper: -4.1% to -4.4%, derived)",
            met=all(o.chip_energy_saving_pct > 0 for o in gpt3),
            detail=", ".join(f"{o.label} {-o.chip_energy_saving_pct:+.2f}%" for o in gpt3),
        ),
        Goal(
            goal="Fig. 18: AICore saving kept, reference > {1 s, 100 ms interval} > 14 ms late, "
            "each within 15 points of the paper's 46% / 61% / 66%",
            met=keep_ok and order_ok,
            detail=", ".join(
                f"{k}: {v:.0%} (paper {_PAPER_RETENTION[k][1]:.0%})" for k, v in kept.items()
            ),
        ),
        Goal(
            goal=f"switches per GPT-3 iteration at 2% within 25% of the paper's {_PAPER_SWITCHES}",
            met=abs(switches / _PAPER_SWITCHES - 1) <= 0.25,
            detail=f"{switches} per iteration ({switches / _PAPER_SWITCHES - 1:+.0%})",
        ),
    ]


def _plan_statistics(bench: Bench, plans: dict[tuple[str, float], Schedule]) -> list[str]:
    """Describe how the GPT-3 plans spend the iteration, per clock.

    The paper (§7): the 1600 / 1800 MHz prior is optimal at 2%; LFC runs at ~1200 MHz at 10%.
    """
    top = max(bench.device.spec.freqs_mhz)
    out = []
    for target in (0.02, 0.10):
        plan = plans.get(("gpt3", target))
        if plan is None:
            continue
        times = bench.predictions.time_us
        freqs = np.asarray(bench.predictions.freqs_mhz, dtype=float)
        stage_s, stage_f = [], []
        for st in plan.stages:
            j = int(np.argmin(np.abs(freqs - st.freq_mhz)))
            stage_s.append(float(times[st.first_op : st.last_op + 1, j].sum()) * 1e-6)
            stage_f.append(st.freq_mhz)
        secs, clocks = np.asarray(stage_s), np.asarray(stage_f)
        low = clocks < top
        share_top = secs[~low].sum() / max(secs.sum(), 1e-12)
        lfc = float(np.average(clocks[low], weights=secs[low])) if low.any() else top
        used = ", ".join(
            f"{f:g}: {secs[clocks == f].sum() / secs.sum():.0%}" for f in np.unique(clocks)
        )
        out.append(
            f"gpt3 {target:.0%} plan (predicted time per clock, MHz): {used}; "
            f"{share_top:.0%} of the time at {top:g} MHz, the rest at {lfc:.0f} MHz on average"
        )
    return out


#: Op types grouped by where an AICore saving can come from (the rest: vector and other ops).
_SOURCES = {
    "matmuls": ("MatMul", "BatchMatMul", "FlashAttention"),
    "pipeline bubble (Recv / Send)": ("Recv", "Send"),
    "TP collectives": ("AllReduce", "AllGather", "ReduceScatter"),
}
#: Paper Fig. 18 (GPT-3, 2%): AICore power saved by frequency-adjustment interval (ms).
_PAPER_BY_INTERVAL = {5.0: 15.27, 100.0: 9.30, 1000.0: 10.09}


def _saving_sources(bench: Bench, run: SimRun) -> list[str]:
    """Say which ops the reference plan's AICore energy saving comes from, and the LFC runs.

    Per op: the last iteration's core energy at the top clock minus under the plan (each op's
    own execution, a pipeline wait inside its Recv); runs: the planner's insensitive class
    (:func:`~opdvfs.plan.classify.classify_by_sensitivity`), lengths at the top clock.
    """
    n = run.n_ops
    _, top = bench.device.run(bench.workload, iterations=run.iterations)
    last = slice(n * (run.iterations - 1), n * run.iterations)
    saved_j = top.op_core_energy_j[last] - run.op_core_energy_j[last]
    types = bench.workload.ops["type"].astype(str).to_numpy()
    total = float(saved_j.sum())
    shares = {k: float(saved_j[np.isin(types, v)].sum()) / total for k, v in _SOURCES.items()}
    shares["vector and other ops"] = 1.0 - sum(shares.values())
    freqs = np.sort(np.asarray(bench.inputs.freqs_mhz, dtype=float))
    times = bench.models.perf.predict([freqs[0], freqs[-1]])
    sens = sensitivity(times[:, 0], times[:, 1], freqs[0], freqs[-1])
    low = classify_by_sensitivity(sens, bench.inputs.streams) == 0
    span_us = times[:, 1] + bench.inputs.idle_before_us
    starts = np.r_[0, np.flatnonzero(np.diff(low.astype(np.int8))) + 1]
    run_ms = np.add.reduceat(span_us, starts)[low[starts]] * 1e-3
    long = run_ms >= _INTERVAL_MS
    return [
        "gpt3 2%: AICore energy saved by op family: "
        + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()),
        f"gpt3 insensitive (LFC) runs: {run_ms.size}, median {np.median(run_ms):.2f} ms; "
        f"{run_ms[long].sum() / run_ms.sum():.0%} of LFC time in {int(long.sum())} runs of "
        f">= {_INTERVAL_MS:g} ms (paper: 821 switches imply >= 5 ms LFC runs inside the "
        "layer body)",
    ]


def _late_switches(
    bench: Bench, plan: Schedule, reference: SimRun, late: SimRun, target: float
) -> list[str]:
    """Say where the 14 ms-late row keeps or loses the reference's saving, and the other reading.

    The row issues each SetFreq 14 ms late on the 1 ms chip (the paper's experiment: every
    switch lands). A chip whose own switch takes 15 ms is the other reading of "simulates a
    15 ms switch": there a request still pending when the next is issued is superseded. Per op
    family, the share of the reference's per-op AICore energy saving each run keeps (last
    iteration, against the top clock).
    """
    slow_row, slow = measure(
        bench, plan, "15 ms switch", target=target, device=bench.with_latency(15.0)
    )
    n = reference.n_ops
    _, top = bench.device.run(bench.workload, iterations=reference.iterations)
    last = slice(n * (reference.iterations - 1), n * reference.iterations)
    types = bench.workload.ops["type"].astype(str).to_numpy()
    bubble = np.isin(types, _SOURCES["pipeline bubble (Recv / Send)"])

    def kept(run: SimRun) -> str:
        saved = top.op_core_energy_j[last] - run.op_core_energy_j[last]
        ref = top.op_core_energy_j[last] - reference.op_core_energy_j[last]
        return ", ".join(
            f"{name} {saved[m].sum() / max(ref[m].sum(), 1e-12):.0%}"
            for name, m in (("bubble", bubble), ("layer body", ~bubble))
        )

    return [
        f"gpt3 2%, switches 14 ms late: per-op AICore energy saving kept: {kept(late)}; "
        f"on a chip whose own switch takes 15 ms (newer requests supersede pending ones): "
        f"{kept(slow)}, AICore power {-slow_row.core_power_saving_pct:+.2f}%, perf loss "
        f"{slow_row.perf_loss_pct:+.2f}%, {slow_row.switches} clock changes per iteration"
    ]


def _saving_by_interval(
    bench: Bench, objective: Objective, measured: dict[float, Outcome]
) -> list[str]:
    """Return the 2% plan's AICore power saving at adjustment intervals from 2 ms to 1 s.

    Heterogeneity between stages shorter than the interval is averaged away: a saving that
    does not fall from 5 to 100 ms lives in stretches longer than 100 ms (the bubble, whole
    passes) or is uniform over the body. ``measured`` holds outcomes already measured.
    """
    got = dict(measured)
    for interval in (2.0, 10.0, 20.0, 50.0, 300.0):
        got[interval] = plan_and_measure(
            bench, 0.02, objective, f"interval {interval:g} ms", interval_ms=interval
        )[0]
    cells = ", ".join(
        f"{k:g} ms {got[k].core_power_saving_pct:.1f}%"
        + (f" (paper {_PAPER_BY_INTERVAL[k]:.1f}%)" if k in _PAPER_BY_INTERVAL else "")
        for k in sorted(got)
    )
    return [f"gpt3 2%: AICore power saved by frequency-adjustment interval: {cells}"]
