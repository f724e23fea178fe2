"""Commands on models: fit, characterise, device, validate perf, validate power."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from opdvfs._files import check_output_file
from opdvfs.cli._app import (
    FormatOption,
    FreqOption,
    GpuOption,
    JsonOption,
    UsageError,
    app,
    load_profile,
    need_clocks,
    reports_errors,
    simulator,
    spinner,
    stderr,
    stdout,
    train_clocks,
)
from opdvfs.exceptions import ActuatorError, ValidationError
from opdvfs.models.perf import FORMS  # light: numpy only (pandas and scipy load on use)

# The models (pandas, scipy) load inside the commands that fit them, not with `opdvfs --help`.
if TYPE_CHECKING:
    from opdvfs.calibration import PowerCalibration
    from opdvfs.devices.spec import DeviceSpec, VoltageCurve
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
        help="Benchmark kernels run at 3+ clocks on the same device: the V-f curve (from power "
        "alone) and idle power are fitted on them, as by `opdvfs characterise`, and used for "
        "this profile.",
    ),
]


DeviceOption = Annotated[
    str | None,
    typer.Option(
        "--device",
        "-d",
        help="Device: a preset name, or a DEVICE.json written by `opdvfs characterise` (its "
        "V-f curve and idle power).",
    ),
]

ClocksOption = Annotated[
    str | None,
    typer.Option(
        "--clocks",
        help="The GPU's supported clocks, written to the device file: nvml (read from this "
        "machine's NVIDIA GPU, --gpu), or a list in MHz: START:STOP:STEP ranges and/or "
        "clocks, comma-separated (e.g. 210:1410:15).",
    ),
]

SwitchLatencyOption = Annotated[
    float,
    typer.Option("--switch-latency-ms", help="Clock switch latency (NVIDIA ~15, Ascend ~1)."),
]

SensorMsOption = Annotated[
    float, typer.Option("--sensor-ms", help="Power sensor averaging period (NVML: 100+).")
]


def supported_clocks(
    text: str, gpu_index: str | None = None
) -> tuple[str | None, tuple[float, ...], str]:
    """Resolve ``--clocks``: ``nvml`` (the GPU's name and clocks) or a list (no name).

    Returns the GPU's name (None for a list), its clocks (MHz, ascending) and where they come
    from, for the device file's ``source``.
    """
    from opdvfs.devices.clocks import parse_clock_grid
    from opdvfs.runtime.actuators.nvml import nvml_clocks

    if text.strip().lower() == "nvml":
        try:
            name, clocks = nvml_clocks(gpu_index)
        except ActuatorError as exc:
            raise UsageError(
                f"--clocks nvml: could not read the GPU's clocks ({exc.__cause__ or exc}); "
                "without an NVIDIA GPU, list them (e.g. --clocks 210:1410:15)"
            ) from None
        return name, clocks, f"NVML's supported clocks of {name}"
    if gpu_index is not None:
        raise UsageError("--gpu: only with --clocks nvml (a list names no GPU)")
    try:
        return None, parse_clock_grid(text), f"--clocks {text.strip()}"
    except ValidationError as exc:
        raise UsageError(f"--clocks: {exc}") from None


TrainFreqsHelp = (
    "Clocks to fit on: MHz and/or min, mid, max, or steps down from the top: top, top-1, top-2 "
    "(the profile's clocks)."
)


def device_spec(text: str | None) -> DeviceSpec | None:
    """Resolve ``--device``: a DeviceSpec JSON file (a path ending in .json) or a preset name."""
    from opdvfs.devices.spec import DeviceSpec
    from opdvfs.sim.presets import get_preset

    if text is None:
        return None
    if text.lower().endswith(".json") or Path(text).is_file():
        return DeviceSpec.read(text)
    return get_preset(text).spec


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
        str | None,
        typer.Option("--train-freqs", help=TrainFreqsHelp.replace(":", " (default: all):", 1)),
    ] = None,
    dynamic: DynamicOption = "clock",
    characterise: CharacteriseOption = None,
    device: DeviceOption = None,
    calibrate: Annotated[
        bool,
        typer.Option(
            "--calibrate",
            help="Take the paper's idle and cool-down runs on the simulated device (--device, "
            "else the profile's): the leakage slope gamma from the cool-down (the board's on a "
            "GPU), so plans are made with the die at the top clock's temperature.",
        ),
    ] = False,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit per-operator performance (and, with power data, power) models on a profile."""
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.perf import PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.sim.presets import preset_spec

    if calibrate and characterise is not None:
        raise UsageError("--calibrate and --characterise both give idle power: pass one")
    spec = device_spec(device)
    # per-op power is what the power model fits: then the sensor samples are not read
    profile = load_profile([profile_path], fmt, freq_mhz, samples=False)
    need_clocks(profile, profile_path)
    train = train_clocks(train_freqs, profile)
    perf = PerfModel(form=form).fit(profile, train)
    voltage, calibration = _characterised(characterise)
    power = None
    # --device, else the profile's device when a preset: its V-f curve (and idle power), and
    # plan MODELS then needs no --device
    spec = spec or preset_spec(profile.meta.get("device"))
    if calibrate:
        calibration = _simulated_calibration(device, spec, profile.meta.get("device"))
    has_power = {"core_power_w", "chip_power_w"} & set(profile.ops.columns)
    if has_power or profile.samples is not None:
        try:
            power = PowerModel(voltage=voltage, dynamic=_dynamic(dynamic)).fit(
                profile, train, device=spec, calibration=calibration
            )
        except ValidationError as exc:
            # samples too few, or the throughput form without an idle floor: what to add fixes
            # it, say so
            if exc.field in ("iterations", "calibration"):
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
        # where the leakage slope came from: "cooldown" (plans on the top clock's die), "fit"
        # or "none" (PowerModel.gamma_from_)
        "gamma_from": None if power is None else power.gamma_from_,
    }
    if as_json:
        print(json.dumps(payload))
        return
    power_text = "no power model" if power is None else f"power model on the {power.rail_} rail"
    if power is not None and power.gamma_from_ == "cooldown":
        power_text += " (leakage slope from the cool-down)"
    stdout.print(
        f"wrote {out}: {payload['form']} for {payload['operators']} operators on "
        f"{', '.join(f'{f:g}' for f in payload['train_freqs_mhz'])} MHz, {power_text}; "
        f"{payload['flagged_ops']} operators flagged (points break the cycle physics, or the "
        "lowest clock runs slower than the trend of the others)",
        highlight=False,
    )


@app.command()
@reports_errors
def characterise(
    profile_path: Annotated[
        Path,
        typer.Argument(
            metavar="POWER_PROFILE",
            help="Kernels (any: micro-benchmarks, or a workload swept once) with power at every "
            "supported clock.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="DEVICE.json to write.")],
    name: Annotated[
        str | None,
        typer.Option("--name", help="Device name (default: the profile's, else the file's)."),
    ] = None,
    switch_latency_ms: SwitchLatencyOption = 1.0,
    sensor_ms: SensorMsOption = 1.0,
    fmt: FormatOption = None,
    freq_mhz: FreqOption = None,
    clocks: ClocksOption = None,
    gpu_index: GpuOption = None,
    as_json: JsonOption = False,
) -> None:
    """Characterise a device once: its V-f curve from power alone, and its idle power.

    Writes a DeviceSpec JSON that --device takes wherever a preset name is accepted (fit,
    validate power, plan): the path for a GPU opdvfs has no preset for. Its clocks are
    --clocks (nvml, or a list), which must hold every profiled clock; without --clocks, the
    profiled clocks (then plan --device has no clock for the models to fill).
    """
    from opdvfs.models.characterise import characterise_spec

    check_output_file(out)
    if not (switch_latency_ms >= 0 and sensor_ms > 0):
        raise UsageError("--switch-latency-ms must be >= 0 and --sensor-ms > 0")
    if clocks is None and gpu_index is not None:
        raise UsageError("--gpu: only with --clocks nvml")
    supported = None if clocks is None else supported_clocks(clocks, gpu_index)
    profile = load_profile([profile_path], fmt, freq_mhz)
    source = (
        f"opdvfs characterise {profile_path.name}: {profile.n_ops} kernels at "
        f"{len(profile.freqs_mhz)} clocks"
    )
    with spinner() as progress:
        progress.add_task(f"characterising the device on {profile_path.name}", total=None)
        try:
            spec = characterise_spec(
                profile,
                name=name or str(profile.meta.get("device") or profile_path.stem),
                switch_latency_ms=switch_latency_ms,
                power_sample_period_ms=sensor_ms,
                source=source if supported is None else f"{source}; clocks: {supported[2]}",
                freqs_mhz=None if supported is None else supported[1],
                vendor=None if supported is None or supported[0] is None else "nvidia",
            )
        except ValidationError as exc:
            if exc.field == "clocks":
                raise UsageError(f"--clocks: {exc}") from None
            raise
    spec.write(out)
    vf = spec.voltage
    assert vf is not None  # characterise_spec sets both
    assert spec.idle is not None
    rise = vf.slope_v_per_mhz * max(spec.max_freq_mhz - vf.knee_mhz, 0.0) / vf.flat_v
    idle_top = float(spec.idle.power_w(spec.max_freq_mhz, vf))
    if as_json:
        print(
            json.dumps(
                {
                    "out": str(out),
                    "name": spec.name,
                    "clocks": len(spec.freqs_mhz),
                    "knee_mhz": vf.knee_mhz,
                    "top_rise": rise,
                    "idle_rail": spec.idle.rail,
                    "idle_top_w": idle_top,
                }
            )
        )
        return
    stdout.print(
        f"wrote {out}: {spec.name}, {len(spec.freqs_mhz)} clocks "
        f"{spec.min_freq_mhz:g}-{spec.max_freq_mhz:g} MHz; V flat to {vf.knee_mhz:.0f} MHz, "
        f"+{rise * 100:.1f}% at the top; idle {spec.idle.rail} power {idle_top:.1f} W at the top",
        highlight=False,
    )


@app.command()
@reports_errors
def device(
    out: Annotated[Path, typer.Option("--out", "-o", help="DEVICE.json to write.")],
    clocks: Annotated[
        str,
        typer.Option(
            "--clocks",
            help="The GPU's supported clocks: nvml (read from this machine's NVIDIA GPU, "
            "--gpu), or a list in MHz: START:STOP:STEP ranges and/or clocks, "
            "comma-separated (e.g. 210:1410:15).",
        ),
    ] = "nvml",
    name: Annotated[
        str | None,
        typer.Option("--name", help="Device name (default: NVML's; required with a list)."),
    ] = None,
    switch_latency_ms: SwitchLatencyOption = 1.0,
    sensor_ms: SensorMsOption = 1.0,
    gpu_index: GpuOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write a device file of the GPU's supported clocks, where no micro-benchmarks were run.

    From NVML on an NVIDIA GPU, or from a list: --device takes it (plan, fit), and plan's
    models fill the clocks a profile did not measure. It has no V-f curve or idle power
    (`opdvfs characterise --clocks` writes both, from a power profile).
    """
    from opdvfs.devices.spec import DeviceSpec

    check_output_file(out)
    if not (switch_latency_ms >= 0 and sensor_ms > 0):
        raise UsageError("--switch-latency-ms must be >= 0 and --sensor-ms > 0")
    if name is not None and not name.strip():
        raise UsageError("--name: expected a device name, got an empty one")
    gpu, freqs, source = supported_clocks(clocks, gpu_index)
    if name is None and gpu is None:
        raise UsageError("--name: a clock list names no device: pass --name NAME")
    spec = DeviceSpec(
        name=name or str(gpu),
        freqs_mhz=freqs,
        vendor="nvidia" if gpu is not None else "unknown",
        switch_latency_ms=switch_latency_ms,
        power_sample_period_ms=sensor_ms,
        source=f"opdvfs device: {source}",
    )
    spec.write(out)
    if as_json:
        print(
            json.dumps(
                {
                    "out": str(out),
                    "name": spec.name,
                    "clocks": len(spec.freqs_mhz),
                    "min_mhz": spec.min_freq_mhz,
                    "max_mhz": spec.max_freq_mhz,
                    "source": source,
                }
            )
        )
        return
    stdout.print(
        f"wrote {out}: {spec.name}, {len(spec.freqs_mhz)} clocks "
        f"{spec.min_freq_mhz:g}-{spec.max_freq_mhz:g} MHz ({source})",
        highlight=False,
    )


@validate_app.command("perf")
@reports_errors
def validate_perf_command(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    train_freqs: Annotated[str, typer.Option("--train-freqs", help=TrainFreqsHelp)],
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
        f"time); {result['flagged_ops']} ops flagged ({result['low_clock_off_trend_ops']} "
        "with the lowest clock off the trend of the others)",
        highlight=False,
    )
    if result["measured_flagged_ops"]:
        stdout.print(
            f"{result['measured_flagged_ops']} ops break the physics at some clock of the profile "
            "(slower at a higher clock: the clock not delivered, or another kernel; or cycles "
            "falling or concave): mean |error| "
            f"{result['physics_mape_pct']:.2f}% where the physics holds, "
            f"{result['measured_flagged_mape_pct']:.2f}% on them",
            highlight=False,
        )


@validate_app.command("power")
@reports_errors
def validate_power_command(
    profile_path: Annotated[Path, typer.Argument(metavar="PROFILE", help="Profile or raw file.")],
    train_freqs: Annotated[str, typer.Option("--train-freqs", help=TrainFreqsHelp)],
    no_temperature: Annotated[
        bool, typer.Option("--no-temperature", help="Drop the gamma dT V term.")
    ] = False,
    device: DeviceOption = None,
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
    from opdvfs.sim.presets import preset_spec

    if calibrate and device is None:
        raise UsageError("--calibrate needs --device (the simulated device to measure)")
    if calibrate and characterise is not None:
        raise UsageError("--calibrate and --characterise both give idle power: pass one")
    profile = load_profile([profile_path], fmt, freq_mhz)
    voltage, calibration = _characterised(characterise)
    # The V-f curve comes from --device, else from the device the profile says it ran on.
    spec = device_spec(device) or preset_spec(profile.meta.get("device"))
    if calibrate and device:
        if spec is not None and not spec.simulated:
            raise UsageError(f"--calibrate measures a simulated --device; {device} is not one")
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


def _simulated_calibration(
    device: str | None, spec: DeviceSpec | None, profile_device: object
) -> PowerCalibration:
    """``--calibrate``: the simulated device's idle and cool-down runs (``calibration_runs``).

    The device is ``--device``, else the one the profile was taken on; either must be a
    simulated preset (a real device's cool-down is not something opdvfs can take here).
    """
    name = device if device is not None else profile_device
    if spec is None or not spec.simulated or not isinstance(name, str):
        where = f"{name} is not one" if name else "pass --device PRESET"
        raise UsageError(f"--calibrate measures a simulated device; {where}")
    return simulator(spec.name, 0).calibration_runs()


def _dynamic(text: str) -> Dynamic:
    from opdvfs.models.power import DYNAMIC_FORMS

    if text not in DYNAMIC_FORMS:
        raise UsageError(f"--dynamic: expected one of {', '.join(DYNAMIC_FORMS)}, got {text!r}")
    return "throughput" if text == "throughput" else "clock"


def _characterised(path: Path | None) -> tuple[VoltageCurve | None, PowerCalibration | None]:
    """Fit the V-f curve (power alone) and idle power on a benchmark profile (--characterise).

    The same characterisation as ``opdvfs characterise``: one curve for both power forms.
    """
    from opdvfs.models.characterise import characterise_spec, idle_calibration

    if path is None:
        return None, None
    bench = load_profile([path], None, None)
    with spinner() as progress:
        progress.add_task(f"characterising the device on {path.name}", total=None)
        spec = characterise_spec(bench, name=path.stem)
    assert spec.idle is not None  # characterise_spec fits both
    return spec.voltage, idle_calibration(spec, spec.idle.rail)
