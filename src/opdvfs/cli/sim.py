"""Commands on the simulated accelerator: profile, simulate, devices, workloads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from opdvfs.cli._app import (
    DeviceOption,
    JsonOption,
    SeedOption,
    UsageError,
    app,
    parse_clocks,
    reports_errors,
    simulator,
    stderr,
    stdout,
    write_profile,
)
from opdvfs.models.attribution import SENSOR_WINDOWS  # light: numpy only
from opdvfs.schedule import Schedule

# The simulator and the models load inside the commands that run them, not with `opdvfs --help`.
if TYPE_CHECKING:
    from opdvfs.sim.twin import SimulatedDevice
    from opdvfs.workloads.workload import Workload

WorkloadOption = Annotated[
    str,
    typer.Option("--workload", "-w", help="Workload name (see `opdvfs workloads`) or file."),
]


@app.command()
@reports_errors
def profile(
    device: DeviceOption,
    workload: WorkloadOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile to write (Parquet).")],
    freqs: Annotated[
        str,
        typer.Option(
            "--freqs",
            help="Clocks to profile: MHz and/or min, mid, max; auto: the top, 7.5% and 15% below "
            "it, mid and min (where a few-percent budget is decided, and the range the models "
            "need), and clocks between them until no gap is wider than 7% of the top.",
        ),
    ] = "auto",
    iterations: Annotated[
        int | None,
        typer.Option(
            "--iterations",
            "-n",
            min=1,
            help="Iterations per clock (default: enough for the device's power sensor to give "
            f"{SENSOR_WINDOWS} complete windows per clock).",
        ),
    ] = None,
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Profile a workload on a simulated device at several clocks (results are simulated)."""
    from opdvfs.workloads.library import load_workload

    sim = simulator(device, seed)
    work = load_workload(workload)
    clocks = parse_clocks(freqs, sim.spec.freqs_mhz)
    why = None
    if iterations is None:
        iterations, why = _sensor_iterations(sim, work, max(clocks))
    with Progress(console=stderr, transient=True, disable=not stderr.is_terminal) as progress:
        task = progress.add_task(f"profiling {work.name} on {device}", total=len(clocks))
        result = sim.profile(
            work, clocks, iterations=iterations, on_clock=lambda _: progress.advance(task)
        )
    write_profile(
        result,
        out,
        as_json,
        lambda s: (
            f"{s['operators']} operators x {s['clocks']} clocks x {iterations} "
            f"iteration(s) on {device} (simulated)"
        ),
    )
    if why is not None:  # after the write: a refused --out stays one error line
        stderr.print(why, highlight=False)


def _sensor_iterations(sim: SimulatedDevice, work: Workload, top_mhz: float) -> tuple[int, str]:
    """Return the iterations per clock the device's power sensor needs, and why (one line).

    One iteration at the fastest clock asked for (the shortest run) times the workload.
    """
    from opdvfs.models.attribution import sensor_iterations

    iteration_s = sim.run(work, freq_mhz=top_mhz, iterations=1)[0].iteration_time_s
    sensor = sim.sensor_ms
    n = sensor_iterations(iteration_s, **sensor)
    run_ms = n * iteration_s * 1e3
    windows = int((run_ms - sensor["window_ms"]) // sensor["period_ms"]) + 1
    took = f"{iteration_s:.3g} s" if iteration_s >= 1 else f"{iteration_s * 1e3:.3g} ms"
    return n, (
        f"opdvfs: note: profiled {n} iteration(s) per clock: one takes {took} at {top_mhz:g} MHz "
        f"and the power sensor averages {sensor['window_ms']:g} ms windows every "
        f"{sensor['period_ms']:g} ms; {n} give {windows} complete windows per clock (the "
        f"attribution needs {SENSOR_WINDOWS}; --iterations to choose)"
    )


@app.command()
@reports_errors
def simulate(
    device: DeviceOption,
    workload: WorkloadOption,
    schedule: Annotated[
        Path | None, typer.Argument(help="Schedule to apply; omit to run at --freq-mhz.")
    ] = None,
    freq_mhz: Annotated[
        str | None, typer.Option("--freq-mhz", help="Static clock without a schedule (max).")
    ] = None,
    iterations: Annotated[int, typer.Option("--iterations", "-n", min=1)] = 3,
    seed: SeedOption = 0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="RunResult JSON.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Run a workload on a simulated device under a schedule and measure it (RunResult).

    With a whole pipeline (``--workload gpt3-pp8``, see ``opdvfs workloads``) every rank runs
    one iteration under its own schedule of a pipeline SCHEDULE (or all at the top clock), and
    the ranks are composed on the job's dependency graph: the makespan and energy of the whole
    pipeline, beside the all-max run's.
    """
    from opdvfs.workloads.library import PIPELINES, load_workload

    sim = simulator(device, seed)
    if workload in PIPELINES:
        if freq_mhz is not None:
            raise UsageError("a whole pipeline runs under a pipeline SCHEDULE or at the top clock")
        _simulate_pipeline(sim, workload, schedule, out, as_json)
        return
    work = load_workload(workload)
    plan = Schedule.read(schedule) if schedule is not None else None
    if plan is not None and freq_mhz is not None:
        raise UsageError("give a SCHEDULE or --freq-mhz, not both")
    if plan is not None:
        from opdvfs.runtime.checks import check_schedule

        check_schedule(
            plan, freqs_mhz=sim.spec.freqs_mhz, device=device, n_ops=len(work), source=str(schedule)
        )
    clock = parse_clocks(freq_mhz, sim.spec.freqs_mhz)[0] if freq_mhz else None
    label = str(schedule) if schedule is not None else None
    result, _ = sim.run(work, plan, freq_mhz=clock, iterations=iterations, label=label)
    if out is not None:
        result.write(out)
    if as_json:
        print(result.model_dump_json(exclude={"timeline"}))
        return
    stdout.print(
        f"{work.name} on {device} (simulated), {iterations} iteration(s): "
        f"{result.iteration_time_s:.4f} s/iteration, chip {result.chip_power_w:.1f} W / "
        f"{result.chip_energy_j:.2f} J, core {result.core_power_w:.1f} W / "
        f"{result.core_energy_j:.2f} J, {result.switches} switches/iteration",
        highlight=False,
    )


def _simulate_pipeline(
    sim: SimulatedDevice, name: str, schedule: Path | None, out: Path | None, as_json: bool
) -> None:
    """Run a whole pipeline on the twin, all-max and under a pipeline schedule; report both."""
    from opdvfs._files import write_text_atomic
    from opdvfs.experiments.pipeline import layout_of, run_pipeline
    from opdvfs.runtime.checks import check_schedule
    from opdvfs.schedule import PipelineSchedule, read_any_schedule
    from opdvfs.workloads.library import load_pipeline

    stages = load_pipeline(name)
    plan: PipelineSchedule | None = None
    if schedule is not None:
        read = read_any_schedule(schedule)
        if not isinstance(read, PipelineSchedule):
            raise UsageError(
                f"{schedule}: a whole pipeline ({name}) runs a pipeline schedule (opdvfs plan "
                "--pipeline ranks), not a one-device schedule"
            )
        if len(read.stages) != len(stages):
            raise UsageError(
                f"{schedule}: {len(read.stages)} rank schedules, but {name} has {len(stages)} ranks"
            )
        plan = read
        for rank, (mine, work) in enumerate(zip(plan.stages, stages, strict=True)):
            check_schedule(
                mine,
                freqs_mhz=sim.spec.freqs_mhz,
                device=sim.spec.name,
                n_ops=len(work),
                source=f"{schedule} (rank {rank})",
            )
    layout = layout_of(stages)
    base = run_pipeline(sim, stages, layout=layout)
    runs = {"all_max": base.summary()}
    line = (
        f"{name} on {sim.spec.name} (simulated), one iteration of {len(stages)} ranks: all-max "
        f"{base.makespan_s:.4f} s, {base.energy_j:.1f} J (waiting at {base.wait_power_w:.1f} W)"
    )
    if plan is not None:
        got = run_pipeline(sim, stages, plan, layout=layout)
        runs["planned"] = got.summary()
        runs["planned"].update(
            target=plan.target,
            deadline_s=(1 + plan.target) * base.makespan_s,
            predicted_makespan_s=plan.predicted_makespan_s,
            predicted_energy_j=plan.predicted_energy_j,
            predicted_baseline_makespan_s=plan.baseline_makespan_s,
            predicted_baseline_energy_j=plan.baseline_energy_j,
            makespan_change=got.makespan_s / base.makespan_s - 1,
            energy_change=got.energy_j / base.energy_j - 1,
        )
        predicted = (plan.predicted_energy_j or 0.0) / (plan.baseline_energy_j or 1.0) - 1
        line += (
            f"; planned {got.makespan_s:.4f} s ({got.makespan_s / base.makespan_s - 1:+.2%}, "
            f"target {plan.target:.2%}), {got.energy_j:.1f} J "
            f"({got.energy_j / base.energy_j - 1:+.2%}; predicted {predicted:+.2%}), "
            f"{int(got.switches.sum())} clock changes"
        )
    payload = json.dumps({"pipeline": name, "device": sim.spec.name, "simulated": True, **runs})
    if out is not None:
        write_text_atomic(out, payload + "\n")
    if as_json:
        print(payload)
        return
    stdout.print(line, highlight=False)


@app.command()
def devices(as_json: JsonOption = False) -> None:
    """List the device presets."""
    from opdvfs.sim.presets import PRESETS

    if as_json:
        print(json.dumps({k: p.spec.model_dump(mode="json") for k, p in PRESETS.items()}))
        return
    table = Table(title="device presets (simulated)")
    for name in ("device", "clocks MHz", "steps", "switch ms", "sensor ms", "about"):
        table.add_column(name)
    for name, preset in PRESETS.items():
        spec = preset.spec
        table.add_row(
            name,
            f"{spec.min_freq_mhz:g}-{spec.max_freq_mhz:g}",
            str(len(spec.freqs_mhz)),
            f"{spec.switch_latency_ms:g}",
            f"{spec.power_sample_period_ms:g}",
            preset.description,
        )
    stdout.print(table)


@app.command()
def workloads(as_json: JsonOption = False) -> None:
    """List the built-in workloads."""
    from opdvfs.workloads.library import BUILDERS, PIPELINES

    rows = []
    for name, build in BUILDERS.items():
        work = build()
        rows.append(
            {
                "workload": name,
                "operators": len(work),
                "tflops": work.total_flops / 1e12,
                "description": work.meta.get("description", ""),
            }
        )
    for name, build_all in PIPELINES.items():
        stages = build_all()
        rows.append(
            {
                "workload": name,
                "operators": sum(len(w) for w in stages),
                "tflops": sum(w.total_flops for w in stages) / 1e12,
                "description": f"whole pipeline, {len(stages)} ranks ({name}@0 ... "
                f"{name}@{len(stages) - 1} one each)",
            }
        )
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="workloads (one iteration)")
    for name in ("workload", "operators", "TFLOP", "description"):
        table.add_column(name)
    for r in rows:
        table.add_row(r["workload"], str(r["operators"]), f"{r['tflops']:.3g}", r["description"])
    stdout.print(table)
