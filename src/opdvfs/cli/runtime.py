"""Commands that run a PyTorch script unchanged: capture and run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from opdvfs.cli._app import (
    UsageError,
    _reports_errors,
    app,
    stdout,
)
from opdvfs.devices.presets import PRESETS, get_preset
from opdvfs.plan.schedule import Schedule
from opdvfs.runtime.actuators.base import Actuator
from opdvfs.workloads.library import load_workload

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
