"""The plan command: from a profile or MODELS file to a certified schedule.

Measurements first (DESIGN §4): a profile's measured times and energies are planned on wherever
they exist (``--values auto``), and models are fitted only when some op was not measured at
some clock the device offers. Before it plans, ``plan`` refuses (exit 2, one line; ``--force``
overrides) a switch latency below the device's own, a device other than the profile's, and
clocks outside the profiled range (the models would extrapolate); after it plans, it refuses to
write a plan predicted to be worse than the top clock on the objective, and prints that
baseline instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

from opdvfs._files import check_output_file, write_text_atomic
from opdvfs.cli._app import (
    JsonOption,
    ObjectiveOption,
    UsageError,
    app,
    load_profile,
    need_clocks,
    reports_errors,
    stderr,
    stdout,
    train_clocks,
)
from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import InfeasibleError, ValidationError
from opdvfs.schedule import Dispatch, Objective, PipelineSchedule, Schedule, Solver, Values

# The models and the planner (pandas, scipy) load inside `plan`, not with `opdvfs --help`.
if TYPE_CHECKING:
    from opdvfs.plan.dag import DagProblem
    from opdvfs.plan.planner import PlanInputs

#: Operators shorter than this at the top clock are mostly timer noise (as in ``validate perf``).
NOISE_US = 20.0
#: ``--interval-ms`` when not given (ms); the planner raises it to the device's switch latency
#: where that is longer (15 ms on the GPU presets), so default flags plan what can run.
DEFAULT_INTERVAL_MS = 5.0


def _inputs_for_models_file(
    n_ops: int, spec: DeviceSpec | None, workload: str | None
) -> PlanInputs:
    """Return the planner's inputs for a MODELS file: the clocks from its device or --device."""
    from opdvfs.plan.planner import PlanInputs
    from opdvfs.workloads.library import load_workload

    if spec is None:
        raise UsageError(
            "this MODELS file records no device: pass --device (the clocks to plan over)"
        )
    if workload is not None:
        return PlanInputs.from_workload(load_workload(workload), spec.freqs_mhz, device=spec.name)
    # without a workload: every op on the compute stream, back to back
    return PlanInputs(
        np.asarray(spec.freqs_mhz), np.full(n_ops, "compute"), np.zeros(n_ops), device=spec.name
    )


def _check_device(recorded: str | None, device: str | None, what: str) -> None:
    """Refuse ``--device`` naming another device than the profile or MODELS file recorded."""
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


def _check_latency(latency_ms: float, spec: DeviceSpec | None) -> None:
    """Refuse a switch latency below the device's own (plans would expect switches too early)."""
    if spec is not None and latency_ms < spec.switch_latency_ms:
        raise UsageError(
            f"--switch-latency-ms {latency_ms:g} is below {spec.name}'s switch latency "
            f"{spec.switch_latency_ms:g} ms: the plan would expect its switches to land before "
            "they can; drop the option, or pass --force"
        )


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


def _warn(message: str) -> None:
    """Print one warning line on stderr."""
    stderr.print(f"opdvfs: warning: {message}", markup=False, highlight=False)


def _summary(schedule: Schedule, objective: Objective) -> dict[str, Any]:
    """Return the JSON summary of a plan: predictions on every rail, on the measurements too."""
    fields = (
        "solver",
        "target",
        "values",
        "baseline_time_s",
        "predicted_time_s",
        "baseline_energy_j",
        "predicted_energy_j",
        "baseline_core_energy_j",
        "predicted_core_energy_j",
        "measured_baseline_time_s",
        "measured_time_s",
        "measured_baseline_energy_j",
        "measured_energy_j",
        "measured_baseline_core_energy_j",
        "measured_core_energy_j",
        "lower_bound_energy_j",
        "lower_bound_power_w",
        "gap_pct",
    )
    payload = {name: getattr(schedule, name) for name in fields}
    payload["objective"] = objective
    payload["stages"] = len(schedule.stages)
    # the file's switches, the first of which sets the starting clock
    payload["switches"] = len(schedule.switches)
    payload["clock_changes"] = schedule.n_switches
    payload["plan_seconds"] = schedule.plan_seconds
    return payload


def _change(new: float | None, old: float | None) -> str:
    """Return ``new`` relative to ``old`` as a signed percentage, or ``?`` if unknown."""
    return f"{new / old - 1:+.2%}" if new is not None and old else "?"


def _summary_line(out: Path, schedule: Schedule, objective: Objective) -> str:
    """Return the one-line summary of a written plan, on the objective's rail."""
    s = schedule
    time = _change(s.predicted_time_s, s.baseline_time_s)
    if objective == "core-energy":
        energy = (
            f"{_change(s.predicted_core_energy_j, s.baseline_core_energy_j)} core energy "
            f"({_change(s.predicted_energy_j, s.baseline_energy_j)} chip)"
        )
    elif objective == "power":
        p_new = (s.predicted_energy_j or 0.0) / (s.predicted_time_s or 1.0)
        p_old = (s.baseline_energy_j or 0.0) / (s.baseline_time_s or 1.0)
        energy = (
            f"{_change(p_new, p_old)} mean chip power "
            f"({_change(s.predicted_energy_j, s.baseline_energy_j)} chip energy)"
        )
    else:
        energy = f"{_change(s.predicted_energy_j, s.baseline_energy_j)} chip energy"
    certificate = "(no optimality certificate)"
    if s.gap_pct is not None:
        rail = {"power": "mean power", "core-energy": "core energy"}.get(objective, "energy")
        certificate = f"(certified within {s.gap_pct:.3f}% of the optimal {rail})"
    measured = ""
    if s.measured_time_s is not None and s.measured_energy_j is not None:
        rail_new, rail_old, rail = s.measured_energy_j, s.measured_baseline_energy_j, "chip"
        if objective == "core-energy" and s.measured_core_energy_j is not None:
            rail_new, rail_old = s.measured_core_energy_j, s.measured_baseline_core_energy_j
            rail = "core"
        measured = (
            f"; on the measurements {_change(s.measured_time_s, s.measured_baseline_time_s)} "
            f"time, {_change(rail_new, rail_old)} {rail} energy"
        )
    return (
        f"wrote {out}: {len(s.stages)} stages, {len(s.switches)} switches (the first sets the "
        f"starting clock); predicted {time} time, {energy} {certificate}{measured}; planned on "
        f"{s.values or 'model'} values in {s.plan_seconds or 0:.2f} s"
    )


#: ``--pipeline`` value that plans one profile per rank (:mod:`opdvfs.plan.ranks`).
RANKS = "ranks"


#: The slowdowns ``plan --pipeline --frontier`` plans (0-30% in 1% steps).
PIPELINE_FRONTIER_TARGETS = tuple(i / 100 for i in range(31))


def _plan_pipeline(
    source: Path,
    out: Path,
    *,
    kind: str,
    target: float,
    microbatches: int,
    blocking_power_w: float,
    device: str | None,
    objective: Objective,
    time_limit_s: float | None,
    frontier_csv: Path | None,
    as_json: bool,
) -> None:
    """Plan every stage of a pipeline together on its dependency graph; write one file."""
    from opdvfs.plan.dag import TIME_LIMIT_S, solve_dag
    from opdvfs.plan.pipeline import PIPELINE_KINDS, pipeline_dag, pipeline_schedule

    if kind not in PIPELINE_KINDS:
        raise UsageError(
            f"--pipeline {kind!r}: expected one of {', '.join(PIPELINE_KINDS)} or {RANKS}"
        )
    if objective != "energy" or source.suffix.lower() in (".json", ".npz"):
        raise UsageError(
            "--pipeline plans the energy (--objective energy) of a measured stage PROFILE "
            "(ops stage<s>.forward / stage<s>.backward), not a MODELS file"
        )
    profile = load_profile([source], None, None)
    problem = pipeline_dag(profile, microbatches, kind=kind, blocking_power_w=blocking_power_w)
    plan = solve_dag(problem, target, time_limit_s=time_limit_s or TIME_LIMIT_S)
    if plan.status == "infeasible":
        raise InfeasibleError(f"no plan of {source} meets a {target:.2%} slowdown")
    recorded = profile.meta.get("device")
    schedule = pipeline_schedule(
        problem,
        plan,
        target=target,
        kind=kind,
        n_microbatches=microbatches,
        device=device or (str(recorded) if recorded else None),
        workload=source.name,
    )
    _write_pipeline(
        schedule,
        problem,
        out,
        frontier_csv,
        as_json,
        f"{len(schedule.stages)} pipeline stages x {2 * microbatches} instructions ({kind})",
    )


def _plan_ranks(
    sources: list[Path],
    out: Path,
    *,
    target: float,
    blocking_power_w: float,
    device: str | None,
    objective: Objective,
    barrier: str | None,
    switch_latency_ms: float | None,
    time_limit_s: float | None,
    frontier_csv: Path | None,
    as_json: bool,
) -> None:
    """Plan every rank of a job together from one profile per rank; write one file.

    Switches up are issued the device's switch latency ahead (:func:`rank_schedule`).
    """
    from opdvfs.cli.models import device_spec
    from opdvfs.plan.dag import TIME_LIMIT_S, solve_dag
    from opdvfs.plan.ranks import rank_layout, rank_schedule, rank_tables
    from opdvfs.sim.presets import preset_spec

    if objective != "energy":
        raise UsageError("--pipeline ranks plans the energy (--objective energy)")
    if len(sources) < 2:
        raise UsageError(
            f"--pipeline ranks takes one PROFILE per pipeline rank, rank 0 first; got "
            f"{len(sources)}"
        )
    spec = device_spec(device)
    ranks = []
    for path in sources:
        profile = load_profile([path], None, None)
        _check_device(profile.meta.get("device"), device, f"profile {path}")
        ranks.append(rank_tables(profile, spec, source=str(path)))
    freqs = ranks[0].freqs_mhz
    for path, rank in zip(sources, ranks, strict=True):
        if not np.array_equal(rank.freqs_mhz, freqs):
            raise ValidationError(
                f"{path}: planned over {rank.freqs_mhz.tolist()} MHz but {sources[0]} over "
                f"{freqs.tolist()} MHz: profile every rank on the same device",
                field="freq_mhz",
            )
    layout = rank_layout([r.ops for r in ranks], barrier=barrier)
    problem = layout.problem(
        [r.time_s for r in ranks],
        [r.energy_j for r in ranks],
        freqs,
        idle_before_s=[r.idle_before_s for r in ranks],
        blocking_power_w=blocking_power_w,
    )
    plan = solve_dag(problem, target, time_limit_s=time_limit_s or TIME_LIMIT_S)
    if plan.status == "infeasible":
        raise InfeasibleError(f"no plan of {len(sources)} ranks meets a {target:.2%} slowdown")
    if switch_latency_ms is None:
        device_spec_ = spec or preset_spec(ranks[0].device)
        switch_latency_ms = device_spec_.switch_latency_ms if device_spec_ is not None else 0.0
    values: Values = "measured" if all(r.values == "measured" for r in ranks) else "auto"
    schedule = rank_schedule(
        layout,
        problem,
        plan,
        target=target,
        values=values,
        device=ranks[0].device,
        workload=", ".join(p.name for p in sources),
        switch_latency_s=switch_latency_ms * 1e-3,
    )
    _write_pipeline(
        schedule,
        problem,
        out,
        frontier_csv,
        as_json,
        f"{layout.n_ranks} ranks, {layout.n_nodes} nodes, "
        f"{layout.n_messages} messages ({values} values)",
    )


def _write_pipeline(
    schedule: PipelineSchedule,
    problem: DagProblem,
    out: Path,
    frontier_csv: Path | None,
    as_json: bool,
    what: str,
) -> None:
    """Write the schedule (and the frontier CSV when asked), then say what was planned."""
    from opdvfs.plan.dag import dag_frontier

    schedule.write(out)
    if frontier_csv is not None:
        table = dag_frontier(problem, list(PIPELINE_FRONTIER_TARGETS))
        write_text_atomic(frontier_csv, table.to_csv(index=False))
    _report_pipeline(schedule, out, as_json, what)


def _report_pipeline(schedule: PipelineSchedule, out: Path, as_json: bool, what: str) -> None:
    """Print a written pipeline schedule's summary: one JSON object, or one line."""
    s = schedule
    if as_json:
        summary: dict[str, Any] = {
            name: getattr(s, name)
            for name in (
                "pipeline",
                "n_microbatches",
                "target",
                "solver",
                "blocking_power_w",
                "baseline_makespan_s",
                "predicted_makespan_s",
                "baseline_energy_j",
                "predicted_energy_j",
                "lower_bound_energy_j",
                "gap_pct",
                "plan_seconds",
            )
        }
        summary["stages"] = len(s.stages)
        summary["switches"] = [len(stage.switches) for stage in s.stages]
        print(json.dumps(summary))
        return
    stdout.print(
        f"wrote {out}: {what}; predicted "
        f"{_change(s.predicted_makespan_s, s.baseline_makespan_s)} makespan, "
        f"{_change(s.predicted_energy_j, s.baseline_energy_j)} energy (certified within "
        f"{s.gap_pct or 0:.3f}% of the optimum; waiting at {s.blocking_power_w:g} W); planned "
        f"in {s.plan_seconds or 0:.2f} s",
        highlight=False,
    )


@app.command()
@reports_errors
def plan(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="PROFILE|MODELS...",
            help="A profile (fitted here) or a MODELS file; with --pipeline ranks, one profile "
            "per pipeline rank, rank 0 first.",
        ),
    ],
    target: Annotated[
        float, typer.Option("--target", help="Allowed slowdown (0.02 = 2%).", min=0.0)
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Schedule to write (JSON).")],
    solver: Annotated[
        Solver, typer.Option("--solver", help="dp (exact, certified) or ga (the paper's GA).")
    ] = "dp",
    objective: ObjectiveOption = "energy",
    interval_ms: Annotated[
        float | None,
        typer.Option(
            "--interval-ms",
            min=0.0,
            help="Frequency-adjustment interval (default 5 ms); 0 plans one stage per operator. "
            "No stage is planned shorter than the switch latency (a request still pending when "
            "the next is issued is superseded).",
        ),
    ] = None,
    switch_latency_ms: Annotated[
        float | None,
        typer.Option(
            "--switch-latency-ms",
            min=0.0,
            help="Clock switch latency (default: the device's; lower needs --force).",
        ),
    ] = None,
    dispatch: Annotated[
        Dispatch,
        typer.Option("--dispatch", help="predictive (ahead of the stage) or reactive (at it)."),
    ] = "predictive",
    device: Annotated[
        str | None,
        typer.Option("--device", "-d", help="Device preset, or DEVICE.json (opdvfs characterise)."),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="Workload (op streams and idle gaps), name or file."),
    ] = None,
    train_freqs: Annotated[
        str | None,
        typer.Option(
            "--train-freqs",
            help="Clocks to fit models on, for a PROFILE: MHz, min/mid/max, top, top-N (N steps "
            "below the top); plans on the models (default: all clocks, models only where needed).",
        ),
    ] = None,
    values: Annotated[
        Values,
        typer.Option(
            "--values",
            help="Plan on a PROFILE's measurements where present, the models elsewhere (auto), "
            "on the measurements only, or on the models only.",
        ),
    ] = "auto",
    frontier_csv: Annotated[
        Path | None,
        typer.Option("--frontier", help="Also write the whole time-energy frontier (CSV)."),
    ] = None,
    budget_scale: Annotated[
        float,
        typer.Option(
            "--budget-scale",
            min=0.0,
            max=1.0,
            help="Plan for target x this (after a run measured slower than planned: "
            "predicted / measured slowdown).",
        ),
    ] = 1.0,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Plan anyway with a switch latency below the device's, a device other than "
            "the profile's, or clocks outside the profiled range.",
        ),
    ] = False,
    pipeline: Annotated[
        str | None,
        typer.Option(
            "--pipeline",
            help="Plan a whole pipeline-parallel job from a stage PROFILE (ops named "
            "stage<s>.forward / stage<s>.backward, e.g. a Perseus CSV): 1f1b or gpipe; or "
            "from one PROFILE per rank (its sends, receives and barriers give the edges): "
            "ranks. Writes one schedule per pipeline stage (opdvfs schema pipeline-schedule).",
        ),
    ] = None,
    barrier: Annotated[
        str | None,
        typer.Option(
            "--barrier",
            help="With --pipeline ranks: regular expression of the collectives that are "
            "barriers across every rank (others stay rank-local).",
        ),
    ] = None,
    microbatches: Annotated[
        int, typer.Option("--microbatches", min=1, help="With --pipeline: microbatches.")
    ] = 8,
    blocking_power_w: Annotated[
        float,
        typer.Option(
            "--blocking-power-w",
            min=0.0,
            help="With --pipeline: power (W) a rank draws while it waits, charged in the "
            "energy (Perseus's effective energy; 0: computation only).",
        ),
    ] = 0.0,
    time_limit_s: Annotated[
        float | None,
        typer.Option(
            "--time-limit-s",
            min=0.01,
            help="With --pipeline: seconds the planner may search (default 0.85); more buys a "
            "tighter certified gap (the Perseus pipelines certify within 0.1% in at most 14 s).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Plan per-stage clocks that save the most energy within a slowdown budget."""
    from opdvfs.cli.models import device_spec
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.perf import PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule, shortest_stage_ms
    from opdvfs.sim.presets import preset_spec
    from opdvfs.workloads.library import load_workload

    # refuse a bad output before any work, so that nothing is half written
    for path in (out, frontier_csv):
        if path is not None:
            check_output_file(path)
    if pipeline == RANKS:
        _plan_ranks(
            sources,
            out,
            target=target * budget_scale,
            blocking_power_w=blocking_power_w,
            device=device,
            objective=objective,
            barrier=barrier,
            switch_latency_ms=switch_latency_ms,
            time_limit_s=time_limit_s,
            frontier_csv=frontier_csv,
            as_json=as_json,
        )
        return
    if len(sources) != 1:
        raise UsageError(
            f"got {len(sources)} PROFILE|MODELS arguments: plan takes one, or one profile per "
            "rank with --pipeline ranks"
        )
    if barrier is not None:
        raise UsageError("--barrier goes with --pipeline ranks")
    source = sources[0]
    if pipeline is not None:
        _plan_pipeline(
            source,
            out,
            kind=pipeline,
            target=target * budget_scale,
            microbatches=microbatches,
            blocking_power_w=blocking_power_w,
            device=device,
            objective=objective,
            time_limit_s=time_limit_s,
            frontier_csv=frontier_csv,
            as_json=as_json,
        )
        return
    if time_limit_s is not None:
        raise UsageError("--time-limit-s goes with --pipeline (the other planners are exact)")
    spec = device_spec(device)
    device = spec.name if spec is not None else None
    models: ModelBundle | None
    launches: tuple[np.ndarray, int] | None = None  # a swept profile's kernels -> launches
    if source.suffix.lower() in (".json", ".npz"):  # a MODELS file (JSON or columnar)
        models = ModelBundle.read(source)
        recorded = models.device
        if not force:
            _check_device(recorded.name if recorded else None, device, "MODELS file")
        # the MODELS file's own device, unless --device names another (forced)
        spec = spec or recorded
        inputs = _inputs_for_models_file(len(models.perf.op_ids_), spec, workload)
        if not force:
            _check_range(models.perf.train_freqs_mhz_, inputs, "MODELS file's profile")
    else:
        profile = load_profile([source], None, None)
        need_clocks(profile, source)
        work = load_workload(workload) if workload is not None else None
        inputs = PlanInputs.from_profile(profile, spec, workload=work)
        n_launches = profile.meta.get("sweep", {}).get("launches_per_iteration")
        if n_launches:  # `capture --freqs` on a simulated GPU: its rows are the kernels
            assert inputs.measured is not None
            launches = (inputs.measured.op_ids, int(n_launches))
        if not force:
            _check_device(profile.meta.get("device"), device, "profile")
            _check_range(profile.freqs_mhz, inputs, "profile")
        # the device planned for (--device, else the profile's preset) brings the V-f curve
        spec = spec or preset_spec(inputs.device)
        models = None
        assert inputs.measured is not None
        covered = inputs.measured.covers(inputs.freqs_mhz, core=objective == "core-energy")
        # --train-freqs asks for fitted models: with --values auto it is not silently dropped
        train = train_clocks(train_freqs, profile)
        if train is not None and values == "measured":
            raise UsageError("--train-freqs fits models; --values measured plans without them")
        if values == "model" or (values == "auto" and (not covered or train is not None)):
            models = ModelBundle(
                PerfModel().fit(profile, train), PowerModel().fit(profile, train, device=spec)
            )
    latency = switch_latency_ms
    if latency is None:
        latency = spec.switch_latency_ms if spec is not None else 1.0
    elif not force:
        _check_latency(latency, spec)
    if interval_ms is None:
        interval_ms = DEFAULT_INTERVAL_MS
    elif interval_ms < latency:
        # A request still pending when the next is issued is superseded (SetFreq semantics,
        # docs/twin-calibration.md): the planner keeps stages at least one switch long
        # (plan.planner.shortest_stage_ms)
        _warn(
            f"--interval-ms {interval_ms:g} is shorter than the {latency:g} ms switch latency: "
            f"stages are planned at least {latency:g} ms long (a shorter stage's switch would be "
            "superseded before it lands)"
        )
    schedule = plan_schedule(
        models,
        inputs,
        target=target * budget_scale,
        objective=objective,
        interval_ms=interval_ms,
        switch_latency_ms=latency,
        dispatch=dispatch,
        solver=solver,
        values=values,
    )
    _refuse_worse_than_top(schedule, objective, float(np.max(inputs.freqs_mhz)))
    if launches is not None:
        from opdvfs.runtime.sweep import on_launches

        # the executor counts every operator the script launches, views included
        schedule = on_launches(schedule, *launches)
    # a MODELS file has no measured times to judge
    measured = inputs.measured
    if measured is not None and np.all(measured.time_us[:, -1] < NOISE_US):
        _warn(
            f"every operator runs under {NOISE_US:g} us at the top clock, where times are "
            "mostly timer noise: the plan's predicted savings are not trustworthy"
        )
    if schedule.measured_time_s and schedule.measured_baseline_time_s:
        slowdown = schedule.measured_time_s / schedule.measured_baseline_time_s - 1
        if slowdown > schedule.target * (1 + 1e-9) + 1e-12:
            _warn(
                f"on the profile's measurements the plan is {slowdown:.2%} slower, over its "
                f"{schedule.target:.2%} budget (planned on {values} values)"
            )
    schedule.write(out)
    if frontier_csv is not None:
        table = plan_frontier(
            models,
            inputs,
            objective=objective,
            interval_ms=shortest_stage_ms(interval_ms, latency),
            values=values,
        )
        write_text_atomic(frontier_csv, table.to_csv(index=False))
    if as_json:
        print(json.dumps(_summary(schedule, objective)))
        return
    stdout.print(_summary_line(out, schedule, objective), highlight=False)
