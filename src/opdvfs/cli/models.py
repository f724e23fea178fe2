"""Commands on models: fit, validate perf, validate power."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from opdvfs.cli._app import (
    FormatOption,
    FreqOption,
    JsonOption,
    UsageError,
    app,
    load_profile,
    reports_errors,
    simulator,
    spinner,
    stderr,
    stdout,
    train_clocks,
)
from opdvfs.exceptions import ValidationError
from opdvfs.models.perf import FORMS  # light: numpy only (pandas and scipy load on use)

# The models (pandas, scipy) load inside the commands that fit them, not with `opdvfs --help`.
if TYPE_CHECKING:
    from opdvfs.calibration import PowerCalibration
    from opdvfs.devices.spec import VoltageCurve
    from opdvfs.models.power import Dynamic


DynamicOption = Annotated[
    str,
    typer.Option(
        "--dynamic",
        help="Power form: clock (the paper's alpha f V^2) or throughput (each op's energy per "
        "launch over its time at the clock).",
    ),
]


CharacteriseOption = Annotated[
    Path | None,
    typer.Option(
        "--characterise",
        metavar="PROFILE",
        help="Benchmark kernels run at 3+ clocks on the same device: the V-f curve and idle "
        "power are fitted on them (throughput form) and used for this profile.",
    ),
]


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


@app.command()
@reports_errors
def fit(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="MODELS file to write: JSON, or columnar .npz (smaller, faster at scale).",
        ),
    ],
    form: FormOption = "auto",
    train_freqs: Annotated[
        str | None, typer.Option("--train-freqs", help="Clocks to fit on (default: all).")
    ] = None,
    dynamic: DynamicOption = "clock",
    characterise: CharacteriseOption = None,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit per-operator performance (and, with power data, power) models on a profile."""
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.perf import PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.sim.presets import preset_spec

    profile = load_profile([profile_path], fmt, freq_mhz)
    train = train_clocks(train_freqs, profile)
    perf = PerfModel(form=form).fit(profile, train)
    voltage, calibration = _characterised(characterise)
    power = None
    # the profile's device, when a preset: its V-f curve, and plan MODELS needs no --device
    spec = preset_spec(profile.meta.get("device"))
    has_power = {"core_power_w", "chip_power_w"} & set(profile.ops.columns)
    if has_power or profile.samples is not None:
        try:
            power = PowerModel(voltage=voltage, dynamic=_dynamic(dynamic)).fit(
                profile, train, device=spec, calibration=calibration
            )
        except ValidationError as exc:
            if exc.field == "iterations":  # samples too few: re-profiling fixes it, say so
                raise
            stderr.print(f"opdvfs: note: no power model ({exc.detail})", highlight=False)
    ModelBundle(perf, power, device=spec).write(out)
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
@reports_errors
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
    from opdvfs.models.validation import validate_perf

    profile = load_profile([profile_path], fmt, freq_mhz)
    result = validate_perf(
        profile, train_clocks(train_freqs, profile) or [], form=form, min_us=min_us
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
@reports_errors
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
    dynamic: DynamicOption = "clock",
    measured_times: Annotated[
        bool,
        typer.Option(
            "--measured-times",
            help="Throughput form: take the ops' measured times at the held-out clocks "
            "(scores the power model alone) instead of the performance model's.",
        ),
    ] = False,
    characterise: CharacteriseOption = None,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit power models on the training clocks, predict every other clock, report the error."""
    from opdvfs.models.validation import validate_power
    from opdvfs.sim.presets import get_preset, preset_spec

    if calibrate and device is None:
        raise UsageError("--calibrate needs --device (the simulated device to measure)")
    if calibrate and characterise is not None:
        raise UsageError("--calibrate and --characterise both give idle power: pass one")
    profile = load_profile([profile_path], fmt, freq_mhz)
    voltage, calibration = _characterised(characterise)
    # The V-f curve comes from --device, else from the device the profile says it ran on.
    spec = get_preset(device).spec if device else preset_spec(profile.meta.get("device"))
    if calibrate and device:
        calibration = simulator(device, 0).calibration_runs()
    result = validate_power(
        profile,
        train_clocks(train_freqs, profile) or [],
        temperature=not no_temperature,
        device=spec,
        calibration=calibration,
        window_ms=window_ms,
        dynamic=_dynamic(dynamic),
        measured_times=measured_times,
        voltage=voltage,
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
        f"{result['dynamic']} form"
        f"{' (held-out times: ' + result['times'] + ')' if result['times'] else ''}, "
        f"{result['iterations']} fixed-point iterations",
        highlight=False,
    )


def _dynamic(text: str) -> Dynamic:
    from opdvfs.models.power import DYNAMIC_FORMS

    if text not in DYNAMIC_FORMS:
        raise UsageError(f"--dynamic: expected one of {', '.join(DYNAMIC_FORMS)}, got {text!r}")
    return "throughput" if text == "throughput" else "clock"


def _characterised(path: Path | None) -> tuple[VoltageCurve | None, PowerCalibration | None]:
    """Fit the V-f curve and idle power on a benchmark profile (``--characterise``)."""
    from opdvfs.models.characterise import characterise_device

    if path is None:
        return None, None
    bench = load_profile([path], None, None)
    with spinner() as progress:
        progress.add_task(f"characterising the device on {path.name}", total=None)
        return characterise_device(bench)
