"""The plan command: from a profile or MODELS file to a certified schedule.

Measurements first (DESIGN §4): a profile's measured times and energies are planned on wherever
they exist (``--values auto``), and models are fitted only when some op was not measured at
some clock the device offers. Before it plans, ``plan`` refuses (exit 2, one line; ``--force``
overrides) a switch latency below the device's own, a device other than the profile's, and
clocks outside the profiled range (the models would extrapolate); after it plans, it refuses to
write a plan predicted to be worse than the top clock on the objective, and prints that
baseline instead.

The planning is the library's (:func:`~opdvfs.plan.on_profile.plan_profile`,
:func:`~opdvfs.plan.ranks.plan_ranks`, :func:`~opdvfs.plan.pipeline.plan_pipeline`); the
command parses its options, refuses bad combinations of them, writes and prints.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
from opdvfs.schedule import Dispatch, Objective, PipelineSchedule, Schedule, Solver, Values

# The models and the planner (pandas, scipy) load inside `plan`, not with `opdvfs --help`.
if TYPE_CHECKING:
    from opdvfs.plan.active import ClockToMeasure
    from opdvfs.plan.on_profile import ProfilePlan
    from opdvfs.plan.pipeline import PipelinePlan


def _warn(message: str) -> None:
    """Print one warning line on stderr."""
    stderr.print(f"opdvfs: warning: {message}", markup=False, highlight=False)


#: The fields of ``plan --json``'s summary read off the written schedule, in order (then the
#: objective, the counts of stages, switches and clock changes, and the planning time).
SUMMARY_FIELDS = (
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
    "conservative_time_s",
    "model_share",
    "lower_bound_energy_j",
    "lower_bound_power_w",
    "gap_pct",
)


def _summary(schedule: Schedule, objective: Objective) -> dict[str, Any]:
    """Return the JSON summary of a plan: predictions on every rail, on the measurements too."""
    payload = {name: getattr(schedule, name) for name in SUMMARY_FIELDS}
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
        f"{s.values or 'model'} values in {s.plan_seconds or 0:.2f} s{_trust(s)}"
    )


def _trust(s: Schedule) -> str:
    """Return how much of the plan rests on models and the time its budget was met on."""
    if s.model_share is None:
        return ""
    sure = ""
    if s.conservative_time_s is not None:
        bound = _change(s.conservative_time_s, s.baseline_time_s)
        sure = f"; budget met on the conservative time {bound} (each cell at its upper quantile)"
    return f"\n{s.model_share:.1%} of the plan's time rests on model-filled clocks{sure}"


#: ``--pipeline`` value that plans one profile per rank (:mod:`opdvfs.plan.ranks`).
RANKS = "ranks"


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
    from opdvfs.plan.pipeline import PIPELINE_KINDS, plan_pipeline

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
    planned = plan_pipeline(
        profile,
        target,
        microbatches=microbatches,
        kind=kind,
        blocking_power_w=blocking_power_w,
        device=device,
        time_limit_s=time_limit_s,
        source=str(source),
    )
    what = f"{len(planned.schedule.stages)} pipeline stages x {2 * microbatches} instructions"
    _write_pipeline(planned, out, frontier_csv, as_json, f"{what} ({kind})")


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
    """Plan every rank of a job together from one profile per rank; write one file."""
    from opdvfs.cli.models import device_spec
    from opdvfs.plan.on_profile import check_device
    from opdvfs.plan.ranks import plan_ranks

    if objective != "energy":
        raise UsageError("--pipeline ranks plans the energy (--objective energy)")
    if len(sources) < 2:
        raise UsageError(
            f"--pipeline ranks takes one PROFILE per pipeline rank, rank 0 first; got "
            f"{len(sources)}"
        )
    spec = device_spec(device)
    profiles = []
    for path in sources:
        profiles.append(load_profile([path], None, None))
        check_device(profiles[-1].meta.get("device"), device, f"profile {path}")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        planned = plan_ranks(
            profiles,
            target,
            sources=[str(path) for path in sources],
            spec=spec,
            blocking_power_w=blocking_power_w,
            barrier=barrier,
            switch_latency_ms=switch_latency_ms,
            time_limit_s=time_limit_s,
        )
    for w in said:  # each one line (messages to ranks whose files were not given)
        typer.echo(str(w.message), err=True)
    layout = planned.layout
    _write_pipeline(
        planned,
        out,
        frontier_csv,
        as_json,
        f"{layout.n_ranks} ranks, {layout.n_nodes} nodes, "
        f"{layout.n_messages} messages ({planned.values} values)",
    )


def _write_pipeline(
    planned: PipelinePlan, out: Path, frontier_csv: Path | None, as_json: bool, what: str
) -> None:
    """Write the schedule (and the frontier CSV when asked), then say what was planned."""
    planned.schedule.write(out)
    if frontier_csv is not None:
        write_text_atomic(frontier_csv, planned.frontier().to_csv(index=False))
    _report_pipeline(planned.schedule, out, as_json, what)


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
    next_clock: Annotated[
        bool,
        typer.Option(
            "--next-clock",
            help="Also name the clock most worth profiling next for this plan (active "
            "profiling: where the models fill clocks the profile lacks), or say none is.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Plan per-stage clocks that save the most energy within a slowdown budget."""
    from opdvfs.cli.models import device_spec
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.plan.on_profile import plan_profile
    from opdvfs.profile import Profile

    # refuse a bad output before any work, so that nothing is half written
    for path in (out, frontier_csv):
        if path is not None:
            check_output_file(path)
    if next_clock and pipeline is not None:
        raise UsageError("--next-clock goes with a single PROFILE, not --pipeline")
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
    given: Profile | ModelBundle
    train = None
    from_models = source.suffix.lower() in (".json", ".npz")  # a MODELS file (JSON or columnar)
    if from_models:
        given = ModelBundle.read(source)
    else:
        # the samples are not fitted on where the rows carry power (plan_profile drops them)
        given = load_profile([source], None, None, samples=False)
        need_clocks(given, source)
        train = train_clocks(train_freqs, given)
    # handed over: plan_profile then holds the only reference and frees the profile after the
    # fit, before the planner's tables (about 470 of 1700 MB at 1M ops x 3 clocks)
    handed = [given]
    del given
    planned = plan_profile(
        handed.pop(),
        target * budget_scale,
        objective=objective,
        values=values,
        spec=spec,
        workload=workload,
        train_freqs_mhz=train,
        interval_ms=interval_ms,
        switch_latency_ms=switch_latency_ms,
        dispatch=dispatch,
        solver=solver,
        force=force,
        warn=_warn,
    )
    schedule = planned.schedule
    schedule.write(out)
    if frontier_csv is not None:
        write_text_atomic(frontier_csv, planned.frontier().to_csv(index=False))
    choice = _next_clock(planned, target * budget_scale) if next_clock and not from_models else None
    if as_json:
        summary = _summary(schedule, objective)
        if next_clock:
            summary["next_clock"] = None if choice is None else _choice_summary(choice)
        print(json.dumps(summary))
        return
    stdout.print(_summary_line(out, schedule, objective), highlight=False)
    if next_clock:
        stdout.print(_next_clock_line(choice, from_models=from_models), highlight=False)


def _next_clock(planned: ProfilePlan, target: float) -> ClockToMeasure | None:
    """Return the clock most worth profiling next for ``planned``'s plan, or None.

    :func:`~opdvfs.plan.active.next_clock_for` on the fitted profile, at the plan's target,
    objective and interval (the plan's own tables and budget).
    """
    from opdvfs.plan.active import next_clock_for

    return next_clock_for(
        planned.fitted,
        target=target,
        objective=planned.objective,
        interval_ms=planned.interval_ms,
    )


def _choice_summary(choice: ClockToMeasure) -> dict[str, Any]:
    """Return ``plan --json``'s ``next_clock``: the clock, its expected gain and cost, why."""
    return {
        "freq_mhz": choice.freq_mhz,
        "gain_pct": 100.0 * choice.gain_j / choice.plan_energy_j,
        "cost_pct": 100.0 * choice.cost_j / choice.plan_energy_j,
        "gap_mhz": list(choice.gap_mhz),
        "why": choice.why(),
    }


def _next_clock_line(choice: ClockToMeasure | None, *, from_models: bool = False) -> str:
    """Return ``plan --next-clock``'s line: the clock to profile too, or why there is none."""
    if from_models:
        return (
            "next clock: none named (a MODELS file holds no measured clocks to weigh: give "
            "the PROFILE it was fitted on)"
        )
    if choice is None:
        return (
            "next clock: none worth profiling (the models fill no clock the plan could use, "
            "or none is expected to save more than measuring it costs)"
        )
    return f"next clock: {choice.why()}; profile it too and plan again"
