"""The plan command: from a profile or MODELS file to a certified schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from opdvfs._files import write_text_atomic
from opdvfs.cli._app import (
    JsonOption,
    ObjectiveOption,
    UsageError,
    app,
    load_profile,
    reports_errors,
    stdout,
    train_clocks,
)
from opdvfs.devices.spec import DeviceSpec
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule
from opdvfs.schedule import Dispatch, Solver
from opdvfs.sim.presets import get_preset, preset_spec
from opdvfs.workloads.library import load_workload


def _inputs_for_models_file(
    n_ops: int, spec: DeviceSpec | None, workload: str | None
) -> PlanInputs:
    """Return the planner's inputs for a MODELS file: the clocks need --device."""
    if spec is None:
        raise UsageError("a MODELS file needs --device (the clocks to plan over)")
    if workload is not None:
        return PlanInputs.from_workload(load_workload(workload), spec.freqs_mhz, device=spec.name)
    # without a workload: every op on the compute stream, back to back
    return PlanInputs(
        np.asarray(spec.freqs_mhz), np.full(n_ops, "compute"), np.zeros(n_ops), device=spec.name
    )


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
        Solver, typer.Option("--solver", help="dp (exact, certified) or ga (the paper's GA).")
    ] = "dp",
    objective: ObjectiveOption = "energy",
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
        Dispatch,
        typer.Option("--dispatch", help="predictive (ahead of the stage) or reactive (at it)."),
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
    spec = get_preset(device).spec if device else None
    if source.suffix == ".json":
        models = ModelBundle.read(source)
        inputs = _inputs_for_models_file(len(models.perf.op_ids_), spec, workload)
    else:
        profile = load_profile([source], None, None)
        work = load_workload(workload) if workload is not None else None
        inputs = PlanInputs.from_profile(profile, spec, workload=work)
        # the device planned for (--device, else the profile's preset) brings the V-f curve
        spec = preset_spec(inputs.device)
        train = train_clocks(train_freqs, profile)
        models = ModelBundle(
            PerfModel().fit(profile, train), PowerModel().fit(profile, train, device=spec)
        )
    latency = switch_latency_ms
    if latency is None:
        latency = spec.switch_latency_ms if spec is not None else 1.0
    schedule = plan_schedule(
        models,
        inputs,
        target=target * budget_scale,
        objective=objective,
        interval_ms=interval_ms,
        switch_latency_ms=latency,
        dispatch=dispatch,
        solver=solver,
    )
    schedule.write(out)
    if frontier_csv is not None:
        table = plan_frontier(models, inputs, objective=objective, interval_ms=interval_ms)
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
