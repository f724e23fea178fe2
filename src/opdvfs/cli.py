"""The ``opdvfs`` command line: a thin typer layer over the library (DESIGN §6).

Every command reports bad input as one line on stderr and exit status 2, never a traceback, and
never leaves a half-written output file (outputs are written to a temp file, then renamed).
``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar, cast

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from opdvfs import __version__
from opdvfs._files import write_text_atomic
from opdvfs.devices.presets import PRESETS, get_preset
from opdvfs.exceptions import OpdvfsError, ValidationError
from opdvfs.io import FORMATS, read_profile
from opdvfs.models.bundle import ModelBundle
from opdvfs.models.perf import FORMS, PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.models.validation import validate_perf, validate_power
from opdvfs.plan.classify import classify_by_ratios
from opdvfs.plan.planner import PlanInputs, plan_frontier, plan_schedule
from opdvfs.plan.schedule import Schedule
from opdvfs.profile import OP_COLUMNS, SAMPLE_COLUMNS, Profile
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.library import BUILDERS, load_workload

__all__ = ["app", "main", "parse_clocks"]

app = typer.Typer(
    name="opdvfs",
    help="Per-operator DVFS: profile, model, plan and apply core-clock schedules.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
# Tables get 120 columns when the output is not a terminal (pipes, CI logs), not rich's 80.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)
stderr = Console(stderr=True, soft_wrap=True)

P = ParamSpec("P")
R = TypeVar("R")


class UsageError(OpdvfsError, ValueError):
    """A command-line value is malformed (exit status 2)."""


def _fail(message: str) -> typer.Exit:
    stderr.print(f"opdvfs: error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn opdvfs errors into one stderr line and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except OpdvfsError as exc:
            raise _fail(str(exc)) from None

    return wrapper


def parse_clocks(
    text: str, available_mhz: Sequence[float] | np.ndarray | None = None
) -> list[float]:
    """Parse a clock list such as ``1000,1400,1800`` or ``min,mid,max`` (MHz).

    The words ``min``, ``mid`` and ``max`` need ``available_mhz`` (the device's or profile's
    clocks); ``mid`` is the available clock nearest the middle of the range.
    """
    clocks: list[float] = []
    grid = np.asarray(sorted(available_mhz)) if available_mhz is not None else None
    for item in (t.strip() for t in text.split(",")):
        if item.lower() in ("min", "mid", "max"):
            if grid is None or grid.size == 0:
                raise UsageError(f"clock {item!r}: words need a device or profile clock list")
            middle = grid[np.argmin(np.abs(grid - (grid[0] + grid[-1]) / 2))]
            clocks.append(float({"min": grid[0], "mid": middle, "max": grid[-1]}[item.lower()]))
            continue
        try:
            value = float(item)
        except ValueError:
            raise UsageError(
                f"clock {item!r}: expected a number of MHz or min, mid, max (e.g. 1000,1800)"
            ) from None
        if not np.isfinite(value) or value <= 0:
            raise UsageError(f"clock {item!r}: expected a positive number of MHz")
        clocks.append(value)
    return clocks


def _load(sources: Sequence[Path], fmt: str | None, freq_mhz: str | None) -> Profile:
    clocks = parse_clocks(freq_mhz) if freq_mhz else None
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    ) as progress:
        progress.add_task(f"reading {len(sources)} file(s)", total=None)
        return read_profile(list(sources), format=fmt, freqs_mhz=clocks)


FormatOption = Annotated[
    str | None,
    typer.Option(
        "--format", "-f", help=f"Input format: {', '.join(FORMATS)} (detected if omitted)."
    ),
]
FreqOption = Annotated[
    str | None,
    typer.Option(
        "--freq-mhz",
        help="Core clock of each input (MHz), for formats that do not record it; one value or "
        "one per file.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _version(value: bool) -> None:
    if value:
        stdout.print(f"opdvfs {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Per-operator DVFS: profile, model, plan and apply core-clock schedules."""


@app.command("import")
@_reports_errors
def import_(
    sources: Annotated[list[Path], typer.Argument(help="Measurement file(s), one per clock.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile to write (Parquet).")],
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import measurements (CSV, torch traces, Ascend, Perseus, NV-DVFS) into a profile."""
    _write_profile(
        _load(sources, fmt, freq_mhz),
        out,
        as_json,
        lambda s: (
            f"{s['operators']} operators x {s['clocks']} clocks ({s['rows']} rows, "
            f"format {s['format']})"
        ),
    )


def _write_profile(
    profile: Profile, out: Path, as_json: bool, describe: Callable[[dict[str, Any]], str]
) -> None:
    """Write a profile atomically, then print its summary as JSON or one line (+ drops)."""
    profile.write(out)
    summary = profile.summary()
    if as_json:
        print(json.dumps({"out": str(out), **summary}))
        return
    stdout.print(f"wrote {out}: {describe(summary)}", highlight=False)
    for reason, count in summary["rows_dropped"].items():
        stdout.print(f"  dropped {count} rows: {reason}", highlight=False)


@app.command()
@_reports_errors
def info(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Summarise a profile: operators, clocks, time per clock, rows dropped and why."""
    summary = _load([profile_path], fmt, freq_mhz).summary()
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


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.3f}x" if reference else "n/a"


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


def _schemas() -> dict[str, Callable[[], dict[str, Any]]]:
    from opdvfs.devices.spec import DeviceSpec
    from opdvfs.plan.schedule import Schedule
    from opdvfs.runtime.result import RunResult
    from opdvfs.workloads.workload import WORKLOAD_COLUMNS

    return {
        "schedule": Schedule.model_json_schema,
        "device": DeviceSpec.model_json_schema,
        "run-result": RunResult.model_json_schema,
        "profile": lambda: {"columns": OP_COLUMNS.describe(), "samples": SAMPLE_COLUMNS.describe()},
        "workload": lambda: {"columns": WORKLOAD_COLUMNS.describe()},
    }


@app.command()
def schema(
    name: Annotated[
        str, typer.Argument(help="schedule, device, run-result (JSON Schema); profile, workload.")
    ],
) -> None:
    """Print the JSON Schema of a file format (e.g. opdvfs schema schedule)."""
    schemas = _schemas()
    if name not in schemas:
        raise _fail(f"unknown schema {name!r}; expected one of {', '.join(schemas)}")
    print(json.dumps(schemas[name](), indent=2))


DeviceOption = Annotated[
    str, typer.Option("--device", "-d", help="Device preset (see `opdvfs devices`).")
]
WorkloadOption = Annotated[
    str,
    typer.Option("--workload", "-w", help="Workload name (see `opdvfs workloads`) or file."),
]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the simulator's noise.")]


def _simulator(device: str, seed: int) -> SimulatedDevice:
    preset = get_preset(device)
    return SimulatedDevice(preset.spec, preset.twin, seed=seed)


@app.command()
@_reports_errors
def profile(
    device: DeviceOption,
    workload: WorkloadOption,
    freqs: Annotated[
        str, typer.Option("--freqs", help="Clocks to profile: MHz and/or min, mid, max.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile to write (Parquet).")],
    iterations: Annotated[int, typer.Option("--iterations", "-n", min=1)] = 1,
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Profile a workload on a simulated device at several clocks (results are simulated)."""
    sim = _simulator(device, seed)
    work = load_workload(workload)
    clocks = parse_clocks(freqs, sim.spec.freqs_mhz)
    with Progress(console=stderr, transient=True, disable=not stderr.is_terminal) as progress:
        task = progress.add_task(f"profiling {work.name} on {device}", total=len(clocks))
        result = sim.profile(
            work, clocks, iterations=iterations, on_clock=lambda _: progress.advance(task)
        )
    _write_profile(
        result,
        out,
        as_json,
        lambda s: (
            f"{s['operators']} operators x {s['clocks']} clocks x {iterations} "
            f"iteration(s) on {device} (simulated)"
        ),
    )


@app.command()
@_reports_errors
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
    sim = _simulator(device, seed)
    work = load_workload(workload)
    plan = Schedule.read(schedule) if schedule is not None else None
    if plan is not None and freq_mhz is not None:
        raise UsageError("give a SCHEDULE or --freq-mhz, not both")
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


validate_app = typer.Typer(
    help="Score models on clocks they were not fitted on.", no_args_is_help=True
)
app.add_typer(validate_app, name="validate")

FormOption = Annotated[
    str,
    typer.Option(
        "--form",
        help=f"Model form: auto, {', '.join(FORMS)} (auto: best for the "
        "number of training clocks).",
    ),
]


def _train_clocks(text: str | None, profile: Profile) -> list[float] | None:
    return None if text is None else parse_clocks(text, profile.freqs_mhz)


@app.command()
@_reports_errors
def fit(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Models file to write (JSON).")],
    form: FormOption = "auto",
    train_freqs: Annotated[
        str | None, typer.Option("--train-freqs", help="Clocks to fit on (default: all).")
    ] = None,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit per-operator performance (and, with power data, power) models on a profile."""
    profile = _load([profile_path], fmt, freq_mhz)
    train = _train_clocks(train_freqs, profile)
    perf = PerfModel(form=form).fit(profile, train)
    power = None
    has_power = {"core_power_w", "chip_power_w"} & set(profile.ops.columns)
    if has_power or profile.samples is not None:
        device = profile.meta.get("device")
        spec = get_preset(device).spec if device in PRESETS else None
        try:
            power = PowerModel().fit(profile, train, device=spec)
        except ValidationError as exc:
            stderr.print(f"opdvfs: note: no power model ({exc.detail})", highlight=False)
    ModelBundle(perf, power).write(out)
    payload = {
        "out": str(out),
        "form": perf.form_,
        "operators": len(perf.op_ids_),
        "train_freqs_mhz": perf.train_freqs_mhz_.tolist(),
        "flagged_ops": int((perf.violation_ != 0).sum()),
        "median_train_residual_pct": float(np.nanmedian(perf.residual_) * 100),
        "power_model": None if power is None else power.rail_,
    }
    if as_json:
        print(json.dumps(payload))
        return
    power_text = "no power model" if power is None else f"power model on the {power.rail_} rail"
    stdout.print(
        f"wrote {out}: {payload['form']} for {payload['operators']} operators on "
        f"{', '.join(f'{f:g}' for f in payload['train_freqs_mhz'])} MHz, {power_text}; "
        f"{payload['flagged_ops']} operators flagged (points break the cycle physics)",
        highlight=False,
    )


@validate_app.command("perf")
@_reports_errors
def validate_perf_command(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    train_freqs: Annotated[
        str, typer.Option("--train-freqs", help="Clocks to fit on: MHz and/or min, mid, max.")
    ],
    form: FormOption = "auto",
    min_us: Annotated[
        float, typer.Option("--min-us", help="Exclude ops shorter than this (paper: 20 us).")
    ] = 20.0,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit on the training clocks, predict every other clock, report the error."""
    profile = _load([profile_path], fmt, freq_mhz)
    result = validate_perf(
        profile, _train_clocks(train_freqs, profile) or [], form=form, min_us=min_us
    )
    if as_json:
        print(json.dumps(result))
        return
    stdout.print(
        f"{result['form']} fitted on {', '.join(f'{f:g}' for f in result['train_freqs_mhz'])} "
        f"MHz, scored on {len(result['test_freqs_mhz'])} other clocks: mean |error| "
        f"{result['mape_pct']:.2f}% (paper, Func2 on Ascend: 1.96%), median "
        f"{result['median_pct']:.2f}%, within 5%: {result['within5_pct']:.1f}%, within 10%: "
        f"{result['within10_pct']:.1f}% over {result['n_points']} points; excluded "
        f"{result['excluded_ops']} ops < {min_us:g} us ({result['excluded_time_pct']:.1f}% of "
        f"time); {result['flagged_ops']} ops flagged",
        highlight=False,
    )


@validate_app.command("power")
@_reports_errors
def validate_power_command(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    train_freqs: Annotated[
        str, typer.Option("--train-freqs", help="Clocks to fit on: MHz and/or min, mid, max.")
    ],
    no_temperature: Annotated[
        bool, typer.Option("--no-temperature", help="Drop the gamma dT V term.")
    ] = False,
    device: Annotated[
        str | None,
        typer.Option("--device", "-d", help="Device preset whose V-f curve to use."),
    ] = None,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Take the paper's idle and cool-down runs on the "
            "simulated --device (gamma, beta, theta from them).",
        ),
    ] = False,
    window_ms: Annotated[
        float | None,
        typer.Option("--window-ms", help="Sensor averaging window, for sample-only profiles."),
    ] = None,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit power models on the training clocks, predict every other clock, report the error."""
    if calibrate and device is None:
        raise UsageError("--calibrate needs --device (the simulated device to measure)")
    profile = _load([profile_path], fmt, freq_mhz)
    # The V-f curve comes from --device, else from the device the profile says it ran on.
    device = device or (
        profile.meta.get("device") if profile.meta.get("device") in PRESETS else None
    )
    spec = get_preset(device).spec if device else None
    calibration = _simulator(device, 0).calibration_runs() if calibrate and device else None
    result = validate_power(
        profile,
        _train_clocks(train_freqs, profile) or [],
        temperature=not no_temperature,
        device=spec,
        calibration=calibration,
        window_ms=window_ms,
    )
    if as_json:
        print(json.dumps(result))
        return
    stdout.print(
        f"{result['rail']} power fitted on "
        f"{', '.join(f'{f:g}' for f in result['train_freqs_mhz'])} MHz, scored on "
        f"{len(result['test_freqs_mhz'])} other clocks: mean |error| {result['mape_pct']:.2f}% "
        f"(paper: 4.62%), without the temperature term {result['mape_no_temperature_pct']:.2f}% "
        f"(paper: 4.97%); within 1/5/10%: {result['within1_pct']:.1f}/"
        f"{result['within5_pct']:.1f}/{result['within10_pct']:.1f}% of {result['n_points']} "
        f"points; temperature term {result['temperature_share_pct']:.1f}% of power, "
        f"{result['iterations']} fixed-point iterations",
        highlight=False,
    )


def _plan_inputs(
    profile: Profile | None, n_ops: int, device: str | None, workload: str | None
) -> PlanInputs:
    """Device clocks, streams and idle gaps for the planner, from whatever the user gave."""
    meta_device = profile.meta.get("device") if profile is not None else None
    name = device or (meta_device if meta_device in PRESETS else None)
    if name is not None:
        freqs = np.asarray(get_preset(name).spec.freqs_mhz)
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
@_reports_errors
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
        profile = _load([source], None, None)
        train = _train_clocks(train_freqs, profile)
        meta_device = device or profile.meta.get("device")
        spec = get_preset(meta_device).spec if meta_device in PRESETS else None
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
            target=target,
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
            f"(certified within {schedule.gap_pct:.3f}% of optimal), "
            if schedule.gap_pct is not None
            else "(no optimality certificate), "
        )
        + f"planned in "
        f"{schedule.plan_seconds or 0:.2f} s",
        highlight=False,
    )


_SCRIPT = {"allow_extra_args": True, "ignore_unknown_options": True}


def _run_script(argv: list[str]) -> None:
    """Run ``python script.py ARGS`` (or ``script.py ARGS``) in this process, as __main__."""
    import runpy

    if argv and Path(argv[0]).name.startswith("python"):
        argv = argv[1:]
    if not argv:
        raise UsageError("give the program after --, e.g. -- python train.py")
    script = Path(argv[0])
    if not script.is_file():
        raise UsageError(f"{script}: no such script")
    saved = sys.argv
    sys.argv = [str(script), *argv[1:]]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved


@app.command(context_settings=_SCRIPT)
@_reports_errors
def capture(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Workload to write (JSON/Parquet).")],
    name: Annotated[str, typer.Option("--name", help="Workload name.")] = "captured",
) -> None:
    """Run a PyTorch script unchanged and record one iteration's operators as a Workload."""
    from opdvfs.runtime.dispatch import WorkloadRecorder

    recorder = WorkloadRecorder()
    with recorder:
        _run_script(list(ctx.args))
    try:
        work = recorder.workload(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    work.write(out)
    stdout.print(
        f"wrote {out}: {len(work)} operators per iteration "
        f"({work.meta['iterations_seen']} iterations seen)",
        highlight=False,
    )


@app.command(context_settings=_SCRIPT)
@_reports_errors
def run(
    ctx: typer.Context,
    schedule_path: Annotated[Path, typer.Argument(metavar="SCHEDULE", help="Schedule (JSON).")],
    actuator: Annotated[str, typer.Option("--actuator", help="nvml or dry-run.")] = "dry-run",
    log: Annotated[Path | None, typer.Option("--log", help="JSON lines of actuator calls.")] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="Captured workload: checks op names.")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", "-d", help="Preset whose clocks a dry run uses.")
    ] = None,
) -> None:
    """Run a PyTorch script unchanged under a schedule (clocks restored however it ends)."""
    from opdvfs.runtime.actuators import ClockGuard, DryRunActuator, NvmlActuator
    from opdvfs.runtime.dispatch import ScheduleExecutor

    plan = Schedule.read(schedule_path)
    names = load_workload(workload).ops["name"].tolist() if workload else None
    act: Actuator
    if actuator == "nvml":
        act = NvmlActuator()
    elif actuator == "dry-run":
        name = device or plan.device
        freqs = (
            get_preset(name).spec.freqs_mhz
            if name in PRESETS
            else sorted({s.freq_mhz for s in plan.stages})
        )
        act = DryRunActuator(freqs, log=log)
    else:
        raise UsageError(f"--actuator {actuator!r}: expected nvml or dry-run")
    executor = ScheduleExecutor(plan, act, names=names)
    try:
        with ClockGuard(act), executor:
            _run_script(list(ctx.args))
    finally:
        close = getattr(act, "close", None)
        if close is not None:
            close()
    stdout.print(
        f"ran {executor.iteration} iterations; diverged in {len(executor.diverged_iterations)}"
        + (", schedule abandoned" if executor.abandoned else ""),
        highlight=False,
    )


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        stderr.print("opdvfs: interrupted")
        sys.exit(130)
