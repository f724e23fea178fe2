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
    freqs: Annotated[
        str, typer.Option("--freqs", help="Clocks to profile: MHz and/or min, mid, max.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile to write (Parquet).")],
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
    return n, (
        f"opdvfs: note: profiled {n} iteration(s) per clock: one takes {iteration_s * 1e3:.4g} ms "
        f"at {top_mhz:g} MHz and the power sensor averages {sensor['window_ms']:g} ms windows "
        f"every {sensor['period_ms']:g} ms; {n} give {SENSOR_WINDOWS} complete windows per "
        "clock (--iterations to choose)"
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
    """Run a workload on a simulated device under a schedule and measure it (RunResult)."""
    from opdvfs.workloads.library import load_workload

    sim = simulator(device, seed)
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
    from opdvfs.workloads.library import BUILDERS

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
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="workloads (one iteration)")
    for name in ("workload", "operators", "TFLOP", "description"):
        table.add_column(name)
    for r in rows:
        table.add_row(r["workload"], str(r["operators"]), f"{r['tflops']:.3g}", r["description"])
    stdout.print(table)
