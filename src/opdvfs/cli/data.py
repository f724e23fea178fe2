"""Commands on measurement files: import, info, formats, schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from opdvfs.cli._app import (
    FormatOption,
    FreqOption,
    JsonOption,
    UsageError,
    app,
    fail,
    load_profile,
    reports_errors,
    stdout,
    write_profile,
)
from opdvfs.io import FORMATS
from opdvfs.profile import OP_COLUMNS, SAMPLE_COLUMNS, Profile
from opdvfs.schedule import PipelineSchedule, Schedule


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.3f}x" if reference else "n/a"


@app.command("import")
@reports_errors
def import_(
    sources: Annotated[list[Path], typer.Argument(help="Measurement file(s), one per clock.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile to write (Parquet).")],
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    samples_path: Annotated[
        Path | None,
        typer.Option(
            "--samples",
            help="Power-sensor log of the same run (CSV/Parquet: t_s Unix seconds, power_w "
            "and/or energy_j, temp_c, freq_mhz; e.g. NVML reads): attached as the profile's "
            "samples, windows from the energy counter's updates; its median clock is the "
            "run's clock unless --freq-mhz gives one.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Import measurements (CSV, torch traces, Ascend, Perseus, NV-DVFS) into a profile."""
    profile = (
        _with_samples(sources, fmt, freq_mhz, samples_path)
        if samples_path is not None
        else load_profile(sources, fmt, freq_mhz)
    )
    write_profile(
        profile,
        out,
        as_json,
        lambda s: (
            f"{s['operators']} operators x {s['clocks']} clocks ({s['rows']} rows, "
            f"format {s['format']})"
        ),
    )


def _with_samples(
    sources: list[Path], fmt: str | None, freq_mhz: str | None, samples_path: Path
) -> Profile:
    """Import one run's file with its sensor log beside it (as ``capture --profile`` writes)."""
    from opdvfs.io.samples import counter_windows, read_samples, run_clock_mhz, window_ms

    if len(sources) != 1:
        raise UsageError(f"--samples belongs to one run: got {len(sources)} input files")
    raw = read_samples(samples_path)
    clock = run_clock_mhz(raw) if "freq_mhz" in raw else None
    if freq_mhz is None and clock is not None:
        freq_mhz = f"{clock:g}"
    measured = load_profile(sources, fmt, freq_mhz)
    if "wall_s" not in measured.ops or measured.ops["wall_s"].isna().all():
        raise UsageError(
            f"{sources[0]}: its operators have no wall-clock start times (wall_s) to line the "
            "samples up with; --samples goes with torch traces"
        )
    windows = counter_windows(raw) if "energy_j" in raw else raw
    period = window_ms(windows, float("nan"))
    sensor = {"period_ms": period, "window_ms": period}
    return Profile(measured.ops, windows, meta={**measured.meta, "sensor": sensor})


@app.command()
@reports_errors
def info(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Summarise a profile: operators, clocks, time per clock, rows dropped and why."""
    summary = load_profile([profile_path], fmt, freq_mhz).summary()
    if as_json:
        print(json.dumps(summary))
        return
    _print_summary(profile_path, summary)


def _print_summary(path: Path, summary: dict[str, Any]) -> None:
    stdout.print(f"[bold]{path}[/bold]  format {summary['format']}", highlight=False)
    device = summary["device"] or "not recorded"
    stdout.print(
        f"{summary['operators']} operators, {summary['iterations']} iteration(s), "
        f"{summary['clocks']} clocks, {summary['rows']} rows; device: {device}",
        highlight=False,
    )
    clocks = summary["per_clock"]
    with_energy = all(r["chip_energy_per_iteration_j"] is not None for r in clocks)
    table = Table(title="per iteration, by core clock (x: relative to the highest clock)")
    columns = ["clock MHz", "ops", "iters", "time ms", "x time"]
    if with_energy:
        columns += ["energy J", "x energy", "power W"]
    for name in columns:
        table.add_column(name, justify="right")
    top = clocks[-1]
    for row in clocks:
        cells = [
            f"{row['freq_mhz']:g}",
            str(row["ops"]),
            str(row["iterations"]),
            f"{row['time_per_iteration_ms']:.3f}",
            _ratio(row["time_per_iteration_ms"], top["time_per_iteration_ms"]),
        ]
        if with_energy:
            energy = row["chip_energy_per_iteration_j"]
            cells += [
                f"{energy:.4g}",
                _ratio(energy, top["chip_energy_per_iteration_j"]),
                f"{row['mean_chip_power_w']:.1f}",
            ]
        table.add_row(*cells)
    stdout.print(table)
    streams = ", ".join(f"{k} {v}" for k, v in summary["streams"].items())
    stdout.print(f"streams: {streams}", highlight=False)
    if summary["power_columns"]:
        stdout.print(f"power columns: {', '.join(summary['power_columns'])}", highlight=False)
    if summary["ratio_columns"]:
        stdout.print(f"ratio columns: {', '.join(summary['ratio_columns'])}", highlight=False)
    if summary["samples"]:
        stdout.print(f"sensor samples: {summary['samples']}", highlight=False)
    dropped = summary["rows_dropped"]
    if dropped:
        for reason, count in dropped.items():
            stdout.print(f"dropped {count} rows: {reason}", highlight=False)
    else:
        stdout.print("no rows dropped", highlight=False)


@app.command()
def formats() -> None:
    """List the input formats that import reads."""
    table = Table(title="input formats")
    table.add_column("format")
    table.add_column("reads")
    table.add_column("needs --freq-mhz")
    for imp in FORMATS.values():
        table.add_row(imp.name, imp.description, "yes" if imp.needs_clock else "")
    stdout.print(table)


def _workload_schema() -> dict[str, Any]:
    # opdvfs.workloads loads the workload builders (pandas): only for this schema
    from opdvfs.workloads.workload import WORKLOAD_COLUMNS

    return {"columns": WORKLOAD_COLUMNS.describe()}


def _schemas() -> dict[str, Callable[[], dict[str, Any]]]:
    from opdvfs.devices.spec import DeviceSpec
    from opdvfs.result import RunResult

    return {
        "schedule": Schedule.model_json_schema,
        "pipeline-schedule": PipelineSchedule.model_json_schema,
        "device": DeviceSpec.model_json_schema,
        "run-result": RunResult.model_json_schema,
        "profile": lambda: {"columns": OP_COLUMNS.describe(), "samples": SAMPLE_COLUMNS.describe()},
        "workload": _workload_schema,
    }


@app.command()
def schema(
    name: Annotated[
        str,
        typer.Argument(
            help="schedule, pipeline-schedule, device, run-result (JSON Schema); profile, workload."
        ),
    ],
) -> None:
    """Print the JSON Schema of a file format (e.g. opdvfs schema schedule)."""
    schemas = _schemas()
    if name not in schemas:
        raise fail(f"unknown schema {name!r}; expected one of {', '.join(schemas)}")
    print(json.dumps(schemas[name](), indent=2))
