"""Commands that run a PyTorch script unchanged: capture and run.

``-- python [FLAGS] train.py ARGS`` (or ``-m MODULE``, ``-c CODE``) runs in this process as
Python would run it; any other program (``accelerate launch``, ``deepspeed``, a shell script) is
started as a launcher whose Python processes activate opdvfs through ``PYTHONPATH``
(:mod:`opdvfs.runtime.launch`). ``--print-env`` prints those variables for any launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from opdvfs.cli._app import (
    SCRIPT_CONTEXT,
    DryRunDeviceOption,
    GpuOption,
    JsonOption,
    UsageError,
    WorkScaleOption,
    announce_gpu,
    app,
    note,
    reports_errors,
    stderr,
    stdout,
)
from opdvfs.exceptions import CaptureError

if TYPE_CHECKING:  # (the actuators load when a command needs them)
    from opdvfs.runtime.actuators import Actuator

IterationAtOption = Annotated[
    str | None,
    typer.Option(
        "--iteration-at",
        metavar="MODULE:FUNCTION",
        help="End an iteration at each return of this function or method (e.g. "
        "mymodel:MLP.forward), instead of at optimizer steps: inference, custom loops.",
    ),
]

PrintEnvOption = Annotated[
    bool,
    typer.Option(
        "--print-env",
        help="Print the environment variables that activate this command in the Python "
        "processes any launcher starts (export lines), and exit.",
    ),
]


def _print(lines: Any) -> None:
    for line in lines:
        stdout.print(line, highlight=False)


def _report(command: str, lines: Any, data: dict[str, Any], as_json: bool) -> None:
    """Print the lines, or (``--json``) one JSON object: the fields and the lines."""
    if as_json:
        print(json.dumps({"command": command, **data, "lines": list(lines)}))
    else:
        _print(lines)


def _script_output(as_json: bool) -> Any:
    """With ``--json`` stdout holds only the JSON object: the script's prints go to stderr."""
    return contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()


def _program(argv: list[str]) -> Any:
    """Return the parsed Python command, or None for a launcher (checked before it starts)."""
    from opdvfs.runtime.launch import parse_python_command

    command = parse_python_command(argv)
    if command is None and shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise UsageError(f"{argv[0]}: no such program")
    return command


def _absolute(settings: dict[str, Any]) -> dict[str, Any]:
    """Return the settings with absolute paths: launched processes may start elsewhere."""
    out = dict(settings)
    for key in ("out", "schedule", "log"):
        if out.get(key):
            out[key] = str(Path(out[key]).resolve())
    if out.get("workload") and Path(out["workload"]).is_file():
        out["workload"] = str(Path(out["workload"]).resolve())
    return out


def _launch(argv: list[str], settings: dict[str, Any], as_json: bool = False) -> None:
    """Run a launcher with opdvfs activated in its Python processes; report as in-process.

    SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 and SIGQUIT are passed on to the launcher (whose
    processes restore their clocks), the launcher's failure status is this command's, and rank
    0's outcome is printed.
    """
    from opdvfs.runtime.launch import activation_env, read_reports, report_dir
    from opdvfs.runtime.session import Outcome

    folder = report_dir()
    try:
        env = activation_env({**_absolute(settings), "report_dir": folder}, dict(os.environ))
        # (--json: the launched program's stdout goes to stderr, stdout holds the JSON)
        proc = subprocess.Popen(argv, env=env, stdout=sys.stderr if as_json else None)

        def forward(signum: int, frame: FrameType | None) -> None:
            proc.send_signal(signum)

        from opdvfs.runtime.actuators.base import GUARDED_SIGNALS

        # every signal that ends a job goes on to the launcher (whose processes restore); one
        # this process ignores (nohup's SIGHUP) stays ignored
        previous = {
            s: signal.signal(s, forward)
            for s in GUARDED_SIGNALS
            if signal.getsignal(s) not in (signal.SIG_IGN, None)
        }
        try:
            status = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if status != 0:
            stderr.print(
                f"opdvfs: {shlex.join(argv)} exited with status {status}",
                markup=False,
                highlight=False,
            )
            raise typer.Exit(status if status > 0 else 128 - status)
        reports = read_reports(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    first = reports[0]
    _report(settings["mode"], first["lines"], first.get("data") or {}, as_json)
    for report in reports:  # any rank that failed fails the run
        if report["error"]:
            Outcome((), report["error"], report["mode"]).raise_error()


def _export_lines(settings: dict[str, Any]) -> None:
    from opdvfs.runtime.launch import activation_env

    for key, value in activation_env(_absolute(settings)).items():
        print(f"export {key}={shlex.quote(value)}")


def _in_process(
    command: Any, settings: dict[str, Any], profile: Any = None, as_json: bool = False
) -> Any:
    """Run a Python command in this process under a session; return (outcome, measured)."""
    from opdvfs.runtime.launch import run_python
    from opdvfs.runtime.session import Session

    session = Session(**settings)
    if session.executor is not None:  # a run: say which GPU it drives
        announce_gpu(session.actuator)

    def run() -> None:
        with session, _script_output(as_json):
            run_python(command)

    measured = None
    if profile is not None:
        measured = profile(run)
    else:
        run()
    return session.outcome(), measured


@app.command(context_settings=SCRIPT_CONTEXT)
@reports_errors
def capture(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Workload to write (JSON/Parquet).")],
    name: Annotated[str, typer.Option("--name", help="Workload name.")] = "captured",
    profile_out: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Also measure a Profile (torch.profiler; on a GPU kernels + NVML power).",
        ),
    ] = None,
    freq_mhz: Annotated[
        float | None,
        typer.Option(
            "--freq-mhz",
            min=1.0,
            help="Core clock the run is at (default: NVML's SM clock during the run).",
        ),
    ] = None,
    iteration_at: IterationAtOption = None,
    print_env: PrintEnvOption = False,
    freqs: Annotated[
        str | None,
        typer.Option(
            "--freqs",
            help="With --profile: profile at each of these clocks in this one run (MHz and/or "
            "min, mid, max of the actuator's clocks), set between iterations through "
            "--actuator; the clock is restored however the run ends.",
        ),
    ] = None,
    actuator: Annotated[
        str,
        typer.Option(
            "--actuator",
            help="With --freqs: nvml (root), zeusd (no root: the Zeus daemon at "
            "ZEUSD_SOCK_PATH), sim:PRESET (a simulated GPU, e.g. sim:a100-like), or dry-run "
            "(clocks only recorded: the clocks of --device, or on an NVIDIA machine without it "
            "the GPU's, measured read-only through NVML).",
        ),
    ] = "nvml",
    iterations_per_clock: Annotated[
        int | None,
        typer.Option(
            "--iterations-per-clock",
            min=1,
            help="With --freqs: iterations measured at each clock (default: enough for the "
            "power sensor to give 12 windows per clock; 5 without one).",
        ),
    ] = None,
    warmup: Annotated[
        int,
        typer.Option(
            "--warmup", min=1, help="With --freqs: iterations at the top clock before the sweep."
        ),
    ] = 2,
    work_scale: WorkScaleOption = None,
    device: DryRunDeviceOption = None,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log", "--log-file", help="With --freqs: JSON lines of actuator calls (appended)."
        ),
    ] = None,
    as_json: JsonOption = False,
    gpu: GpuOption = None,
) -> None:
    """Run a PyTorch script unchanged and record one iteration's operators as a Workload.

    The program after -- is `python [FLAGS] SCRIPT|-m MODULE ARGS`, or a launcher
    (`accelerate launch train.py`) whose Python processes record; rank 0 writes the workload.
    With --profile and --freqs, one run profiles every clock: warm-up iterations at the top
    clock, then each clock in turn (the iterations a switch disturbs discarded), then the
    clock is restored and the script goes on; a script that ends before the sweep is done
    exits with status 2, naming the iterations it needs, and writes nothing.
    """
    settings: dict[str, Any] = {
        "mode": "capture",
        "out": str(out),
        "name": name,
        "iteration_at": iteration_at,
    }
    if print_env:
        _export_lines(settings)
        return
    argv = list(ctx.args)
    command = _program(argv)  # a missing script is an error before anything starts
    if freqs is not None:
        _capture_sweep(
            command,
            settings,
            profile_out=profile_out,
            freqs=freqs,
            actuator=actuator,
            iterations_per_clock=iterations_per_clock,
            warmup=warmup,
            work_scale=work_scale,
            device=device,
            log=log,
            freq_mhz=freq_mhz,
            as_json=as_json,
            gpu=gpu,
        )
        return
    if gpu is not None:
        raise UsageError("--gpu goes with --freqs (the GPU a clock sweep sets and measures)")
    if work_scale is not None or iterations_per_clock is not None or log is not None:
        raise UsageError(
            "--iterations-per-clock, --work-scale and --log go with --freqs (a clock sweep)"
        )
    if command is None:
        if profile_out is not None:
            raise UsageError("--profile runs the script in opdvfs's process: -- python SCRIPT")
        _launch(argv, settings, as_json)
        return
    profile = None
    if profile_out is not None:
        from opdvfs.runtime.profiling import profile_run

        def profile(run: Any) -> Any:
            return profile_run(run, freq_mhz=freq_mhz)

    outcome, measured = _in_process(command, settings, profile, as_json)
    outcome.raise_error()  # no complete iteration: a CaptureError, reported as usual
    lines, data = list(outcome.lines), dict(outcome.data)
    if measured is not None and profile_out is not None:
        measured.write(profile_out)
        summary = measured.summary()
        samples = 0 if measured.samples is None else len(measured.samples)
        lines.append(
            f"wrote {profile_out}: {summary['operators']} operators x "
            f"{summary['iterations']} iterations at {measured.freqs_mhz[0]:g} MHz, "
            f"{samples} power samples"
        )
        data["profile"] = {
            "out": str(profile_out),
            "operators": summary["operators"],
            "iterations": summary["iterations"],
            "freqs_mhz": [float(f) for f in measured.freqs_mhz],
            "power_samples": samples,
        }
    _report("capture", lines, data, as_json)


def _sweep_actuator(
    kind: str,
    device: str | None,
    work_scale: float | None,
    log: Path | None,
    gpu: str | None = None,
) -> Actuator:
    """Return the actuator a sweep sets clocks through (a simulated GPU at ``work_scale``)."""
    from opdvfs.runtime.actuators import make_actuator

    if kind == "twin" or kind == "ascend":
        raise UsageError(
            f"--actuator {kind}: a clock sweep measures the device the script runs on: use "
            "nvml, zeusd, sim:PRESET or dry-run"
        )
    header = {"command": "capture --freqs", "actuator": kind}
    log_path = None if log is None else str(log)
    return make_actuator(
        kind, device=device, log=log_path, header=header, work_scale=work_scale, gpu=gpu
    )


def _capture_sweep(
    command: Any,
    settings: dict[str, Any],
    *,
    profile_out: Path | None,
    freqs: str,
    actuator: str,
    iterations_per_clock: int | None,
    warmup: int,
    work_scale: float | None,
    device: str | None,
    log: Path | None,
    freq_mhz: float | None,
    as_json: bool = False,
    gpu: str | None = None,
) -> None:
    """``capture --profile P --freqs LIST``: profile every clock in one run (#21)."""
    from opdvfs.cli._app import parse_clocks
    from opdvfs.profile import Profile
    from opdvfs.runtime.launch import run_python
    from opdvfs.runtime.session import Session
    from opdvfs.runtime.sweep import sweep_run

    if profile_out is None:
        raise UsageError("--freqs profiles the run at several clocks: give --profile PROFILE")
    if command is None:
        raise UsageError("--freqs runs the script in opdvfs's process: -- python SCRIPT")
    if settings.get("iteration_at"):
        raise UsageError(
            "--freqs counts iterations at optimizer steps; --iteration-at is not supported "
            "with it yet"
        )
    if freq_mhz is not None:
        raise UsageError("--freq-mhz names the one clock of a run; --freqs sets each clock")
    from opdvfs.runtime.checks import check_counts

    check_counts(warmup=warmup, iterations_per_clock=iterations_per_clock)
    act = _sweep_actuator(actuator, device, work_scale, log, gpu)
    announce_gpu(act)
    try:
        clocks = parse_clocks(freqs, act.supported_freqs_mhz())
        for clock in clocks:
            act.check_freq_mhz(clock)
        session = Session(**settings)
    except BaseException:
        act.close()
        raise

    def run() -> None:
        with session, _script_output(as_json):
            run_python(command)

    result = sweep_run(run, act, clocks, warmup=warmup, iterations_per_clock=iterations_per_clock)
    if result.profile is None and result.signals:
        # the script caught a signal and ended by itself (its own status stands): a note
        name = signal.Signals(result.signals[0]).name
        note(f"{name} received: {result.incomplete_message()}; nothing was written")
        return
    if result.profile is None:
        hint = ""
        if actuator.startswith("sim:") and work_scale is None:
            hint = (
                "; on a simulated GPU, --work-scale (e.g. 1e4) makes each iteration longer, "
                "so fewer span the power sensor's windows"
            )
        raise CaptureError(result.incomplete_message() + hint)
    outcome = session.outcome()
    outcome.raise_error()  # no complete iteration: a CaptureError, reported as usual
    measured = result.profile
    if act.timeline is not None and session.recorder and session.recorder.iterations:
        # its ops are launch positions: a plan on it maps back with schedule.on_launches
        meta = measured.meta
        meta["sweep"]["launches_per_iteration"] = len(session.recorder.iterations[-1])
        measured = Profile(measured.ops, measured.samples, meta=meta)
    measured.write(profile_out)
    phases = measured.meta["sweep"]["iterations"]
    samples = measured.samples
    # a slower clock counts fewer of its longer iterations (as many as span the sensor's windows)
    counted = ", ".join(f"{n} at {f:g}" for f, n in result.counted_per_clock.items())
    data = {
        **outcome.data,
        "profile": {
            "out": str(profile_out),
            "operators": measured.n_ops,
            "freqs_mhz": [float(f) for f in measured.freqs_mhz],
            "counted_per_clock": {f"{f:g}": n for f, n in result.counted_per_clock.items()},
            "warmup": result.warmup,
            "power_samples": 0 if samples is None else len(samples),
        },
    }
    _report(
        "capture",
        [
            *outcome.lines,
            f"swept {len(result.freqs_mhz)} clocks on {actuator} in one run: "
            f"{result.warmup} warm-up iterations at {max(result.freqs_mhz):g} MHz, then "
            f"{counted} MHz counted ({phases.get('settle', 0)} discarded after switches, "
            f"{phases.get('unsteady', 0)} while the temperature moved); clock restored",
            f"wrote {profile_out}: {measured.n_ops} operators at "
            f"{', '.join(f'{f:g}' for f in measured.freqs_mhz)} MHz, "
            f"{0 if samples is None else len(samples)} power samples",
        ],
        data,
        as_json,
    )


@app.command(context_settings=SCRIPT_CONTEXT)
@reports_errors
def run(
    ctx: typer.Context,
    schedule_path: Annotated[Path, typer.Argument(metavar="SCHEDULE", help="Schedule (JSON).")],
    actuator: Annotated[
        str,
        typer.Option(
            "--actuator",
            help="nvml (root), zeusd (no root: the Zeus daemon at ZEUSD_SOCK_PATH), ascend "
            "(log only), dry-run, twin, or sim:PRESET (a simulated GPU, e.g. sim:a100-like: the "
            "script's operators run on it; time and energy are its own).",
        ),
    ] = "dry-run",
    log: Annotated[
        Path | None,
        typer.Option(
            "--log", "--log-file", help="JSON lines of actuator calls (appended; a header per run)."
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="Captured workload (op names; twin: simulated)."),
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", "-d", help="Preset (dry-run clocks; the twin).")
    ] = None,
    iteration_at: IterationAtOption = None,
    trigger: Annotated[
        str,
        typer.Option(
            "--trigger",
            help="time: issue each switch at its planned offset from each iteration's anchor "
            "(no per-operator hook; torch.compile and CUDA graphs stay as they are); op: count "
            "operators under a dispatch mode; auto: time where the switch latency is >= 1 ms "
            "and stages >= 5x it, else op (printed).",
        ),
    ] = "auto",
    rank_map: Annotated[
        str | None,
        typer.Option(
            "--rank-map",
            help="With a pipeline schedule (opdvfs plan --pipeline): the pipeline stage of each "
            "rank, comma-separated (0,0,1,1); default: rank r of W runs stage r*stages//W.",
        ),
    ] = None,
    work_scale: WorkScaleOption = None,
    print_env: PrintEnvOption = False,
    as_json: JsonOption = False,
    gpu: GpuOption = None,
) -> None:
    """Run a PyTorch script unchanged under a schedule (clocks restored however it ends).

    The schedule is checked against the actuator's clocks, --device and --workload before the
    script starts. Under torchrun, rank 0 reads SCHEDULE and sends it on when the script makes
    its group; give --log-file: one log per rank (calls.rank1.jsonl). A pipeline schedule gives
    each rank its own pipeline stage's schedule (--rank-map). After -- comes `python
    [FLAGS] SCRIPT|-m MODULE ARGS` or a launcher (`accelerate launch train.py`). A schedule that
    no iteration ran under ends with exit status 2.
    """
    from opdvfs.runtime.session import Session

    settings: dict[str, Any] = {
        "mode": "run",
        "schedule": str(schedule_path),
        "actuator": actuator,
        "log": None if log is None else str(log),
        "workload": workload,
        "device": device,
        "iteration_at": iteration_at,
        "trigger": trigger,
        "rank_map": rank_map,
        "work_scale": work_scale,
        "gpu": gpu,
    }
    argv = list(ctx.args)
    command = None if print_env else _program(argv)
    if print_env or command is None:
        # check here, before the launcher starts (each launched process checks its own again)
        checked = Session(**{**settings, "log": None})
        checked.actuator.close()
        if print_env:
            _export_lines(settings)
        else:
            _launch(argv, settings, as_json)
        return
    settings["share"] = True  # under torchrun, rank 0's schedule reaches the other ranks
    outcome, _ = _in_process(command, settings, as_json=as_json)
    if not (as_json and outcome.error):  # (--json and an error: the one line on stderr)
        _report("run", outcome.lines, outcome.data, as_json)
    outcome.raise_error()


def _open_gpu(kind: str, gpu: str) -> Actuator:
    """Return the ``nvml`` or ``zeusd`` actuator of ``gpu`` (``"gpu0"``; a record's names)."""
    from opdvfs.runtime.actuators import NvmlActuator, ZeusdActuator

    if kind not in ("nvml", "zeusd") or not gpu.startswith("gpu") or not gpu[3:].isdigit():
        raise UsageError(f"a record names {kind!r} on {gpu!r}: expected nvml or zeusd on gpuN")
    index = int(gpu[3:])
    return ZeusdActuator(index=index) if kind == "zeusd" else NvmlActuator(index=index)


@app.command()
@reports_errors
def restore(
    gpu: Annotated[
        int | None,
        typer.Option(
            "--gpu",
            min=0,
            help="Reset this GPU (NVML index) even without a record of a clock left set.",
        ),
    ] = None,
    actuator: Annotated[
        str,
        typer.Option("--actuator", help="With --gpu: nvml (root) or zeusd (the Zeus daemon)."),
    ] = "nvml",
) -> None:
    """Give back to the driver a GPU clock that an earlier run left locked.

    A run killed with SIGKILL, or whose reset the driver refused, leaves a record next to the
    tuning cache ($OPDVFS_CACHE_DIR/clocks); every guarded start on that GPU repairs it by
    itself, and this command does it by hand: each record of this host whose process has
    ended is reset through the actuator that set it, and removed. Records of running
    processes are left to them.
    """
    from opdvfs.runtime.actuators import left_set

    if gpu is not None:
        if actuator not in left_set.REAL_KINDS:
            raise UsageError(f"--actuator {actuator}: expected nvml or zeusd")
        name = f"gpu{gpu}"
        with _open_gpu(actuator, name) as act:
            act.give_back()
        left_set.record_path(name).unlink(missing_ok=True)
        stdout.print(f"{name}: clock given back to the driver", highlight=False)
        return
    found = left_set.records()
    if not found:
        stdout.print(
            f"no clock left set on this host (records in {left_set.state_dir()})",
            highlight=False,
        )
        return
    for path, doc in found:
        what = f"{doc['gpu']}: {left_set.describe(doc)}"
        if left_set.process_alive(int(doc["pid"])):
            stdout.print(f"{what}, still running: left to it", highlight=False)
            continue
        with _open_gpu(str(doc["kind"]), str(doc["gpu"])) as act:
            act.give_back()
        path.unlink(missing_ok=True)
        stdout.print(f"{what}: restored", highlight=False)
