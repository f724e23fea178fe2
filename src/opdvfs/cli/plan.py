"""The plan command: from a profile or MODELS file to a certified schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import numpy as np
import typer

from opdvfs._files import write_text_atomic
from opdvfs.cli._app import (
    JsonOption,
    UsageError,
    app,
    load_profile,
    reports_errors,
    stdout,
    train_clocks,
)
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.classify import classify_by_ratios
from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule
from opdvfs.profile import Profile
from opdvfs.sim.presets import get_preset, preset_spec
from opdvfs.workloads.library import load_workload


def _plan_inputs(
    profile: Profile | None, n_ops: int, device: str | None, workload: str | None
) -> PlanInputs:
    """Device clocks, streams and idle gaps for the planner, from whatever the user gave."""
    spec = get_preset(device).spec if device else None
    if spec is None and profile is not None:
        spec = preset_spec(profile.meta.get("device"))
    name = spec.name if spec is not None else None
    if spec is not None:
        freqs = np.asarray(spec.freqs_mhz)
    elif profile is not None:
        freqs = profile.freqs_mhz
    else:
        raise UsageError("a MODELS file needs --device (the clocks to plan over)")
    if workload is not None:
        ops = load_workload(workload).ops
        streams, gaps = ops["stream"].to_numpy(), ops["gap_before_us"].to_numpy(dtype=float)
    elif profile is not None:
        rows = profile.ops
        rows = rows[
            (rows["iteration"] == rows["iteration"].min())
            & (rows["freq_mhz"] == rows["freq_mhz"].max())
        ].sort_values("op")
        streams = rows["stream"].to_numpy()
        gaps = np.zeros(len(rows))
        if "start_us" in rows and rows["start_us"].notna().all():
            end = rows["start_us"].to_numpy() + rows["time_us"].to_numpy()
            gaps[1:] = np.maximum(rows["start_us"].to_numpy()[1:] - end[:-1], 0.0)
    else:
        streams, gaps = np.full(n_ops, "compute"), np.zeros(n_ops)
    if len(streams) != n_ops:
        raise UsageError(f"the workload has {len(streams)} ops but the models {n_ops}")
    label = workload or (profile.meta.get("workload") if profile is not None else None)
    classes = None
    if profile is not None and any(c.startswith("ratio_") for c in profile.ops.columns):
        rows = profile.ops
        top = rows[rows["freq_mhz"] == rows["freq_mhz"].max()]
        first = top.sort_values(["iteration", "op"]).drop_duplicates("op")
        classes = classify_by_ratios(first.reset_index(drop=True))[0]
    return PlanInputs(freqs, streams, gaps, device=name, workload=label, classes=classes)


@app.command()
@reports_errors
def plan(
    source: Annotated[
        Path,
        typer.Argument(metavar="PROFILE|MODELS", help="A profile (fitted here) or a MODELS file."),
    ],
    target: Annotated[
        float, typer.Option("--target", help="Allowed slowdown (0.02 = 2%).", min=0.0)
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Schedule to write (JSON).")],
    solver: Annotated[
        str, typer.Option("--solver", help="dp (exact, certified) or ga (the paper's GA).")
    ] = "dp",
    objective: Annotated[
        str,
        typer.Option("--objective", help="energy (chip), core-energy, power (mean chip) or paper."),
    ] = "energy",
    interval_ms: Annotated[
        float, typer.Option("--interval-ms", min=0.0, help="Frequency-adjustment interval.")
    ] = 5.0,
    switch_latency_ms: Annotated[
        float | None,
        typer.Option(
            "--switch-latency-ms", min=0.0, help="Clock switch latency (default: the device's)."
        ),
    ] = None,
    dispatch: Annotated[
        str, typer.Option("--dispatch", help="predictive or reactive.")
    ] = "predictive",
    device: Annotated[str | None, typer.Option("--device", "-d", help="Device preset.")] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="Workload (op streams and idle gaps), name or file."),
    ] = None,
    train_freqs: Annotated[
        str | None,
        typer.Option("--train-freqs", help="Clocks to fit on, for a PROFILE (default: all)."),
    ] = None,
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
    as_json: JsonOption = False,
) -> None:
    """Plan per-stage clocks that save the most energy within a slowdown budget."""
    if solver not in ("dp", "ga"):
        raise UsageError(f"--solver {solver!r}: expected dp or ga")
    if objective not in ("energy", "core-energy", "power", "paper"):
        raise UsageError(f"--objective {objective!r}: expected energy, core-energy, power, paper")
    if dispatch not in ("predictive", "reactive"):
        raise UsageError(f"--dispatch {dispatch!r}: expected predictive or reactive")
    profile: Profile | None = None
    doc = None
    if source.suffix == ".json":
        doc = ModelBundle.read(source)
    else:
        profile = load_profile([source], None, None)
        train = train_clocks(train_freqs, profile)
        spec = get_preset(device).spec if device else preset_spec(profile.meta.get("device"))
        doc = ModelBundle(
            PerfModel().fit(profile, train), PowerModel().fit(profile, train, device=spec)
        )
    inputs = _plan_inputs(profile, len(doc.perf.op_ids_), device, workload)
    latency = switch_latency_ms
    if latency is None:
        latency = get_preset(inputs.device).spec.switch_latency_ms if inputs.device else 1.0
    try:
        schedule = plan_schedule(
            doc,
            inputs,
            target=target * budget_scale,
            objective=cast(Literal["energy", "core-energy", "power", "paper"], objective),
            interval_ms=interval_ms,
            switch_latency_ms=latency,
            dispatch=cast(Literal["predictive", "reactive"], dispatch),
            solver=cast(Literal["dp", "ga"], solver),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    schedule.write(out)
    if frontier_csv is not None:
        table = plan_frontier(doc, inputs, objective=cast(Any, objective), interval_ms=interval_ms)
        write_text_atomic(frontier_csv, table.to_csv(index=False))
    payload = {
        "solver": schedule.solver,
        "target": schedule.target,
        "baseline_time_s": schedule.baseline_time_s,
        "predicted_time_s": schedule.predicted_time_s,
        "baseline_energy_j": schedule.baseline_energy_j,
        "predicted_energy_j": schedule.predicted_energy_j,
        "lower_bound_energy_j": schedule.lower_bound_energy_j,
        "lower_bound_power_w": schedule.lower_bound_power_w,
        "gap_pct": schedule.gap_pct,
        "stages": len(schedule.stages),
        "switches": schedule.n_switches,
        "plan_seconds": schedule.plan_seconds,
    }
    if as_json:
        print(json.dumps(payload))
        return
    base_t, pred_t = schedule.baseline_time_s or 1.0, schedule.predicted_time_s or 0.0
    base_e, pred_e = schedule.baseline_energy_j or 1.0, schedule.predicted_energy_j or 0.0
    stdout.print(
        f"wrote {out}: {len(schedule.stages)} stages, {schedule.n_switches} switches; predicted "
        f"{pred_t / base_t - 1:+.2%} time, {pred_e / base_e - 1:+.2%} chip energy "
        + (
            f"(certified within {schedule.gap_pct:.3f}% of the optimal "
            f"{'mean power' if schedule.objective == 'power' else 'energy'}), "
            if schedule.gap_pct is not None
            else "(no optimality certificate), "
        )
        + f"planned in "
        f"{schedule.plan_seconds or 0:.2f} s",
        highlight=False,
    )
