"""Commands that run a PyTorch script unchanged: capture and run."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from opdvfs.cli._app import (
    UsageError,
    app,
    reports_errors,
    stdout,
)
from opdvfs.schedule import Schedule
from opdvfs.workloads.library import load_workload

_SCRIPT = {"allow_extra_args": True, "ignore_unknown_options": True}


def _script_argv(argv: list[str]) -> list[str]:
    """``python script.py ARGS`` or ``script.py ARGS`` -> ``[script.py, ARGS...]``, checked."""
    if argv and Path(argv[0]).name.startswith("python"):
        argv = argv[1:]
    if not argv:
        raise UsageError("give the program after --, e.g. -- python train.py")
    if not Path(argv[0]).is_file():
        raise UsageError(f"{argv[0]}: no such script")
    return argv


def _run_script(argv: list[str]) -> None:
    """Run ``python script.py ARGS`` (or ``script.py ARGS``) in this process, as __main__."""
    import runpy

    argv = _script_argv(argv)
    script = Path(argv[0])
    saved = sys.argv
    sys.argv = [str(script), *argv[1:]]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved


@app.command(context_settings=_SCRIPT)
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
            "--freq-mhz", min=1.0, help="Core clock the run is at (default: NVML's SM clock)."
        ),
    ] = None,
) -> None:
    """Run a PyTorch script unchanged and record one iteration's operators as a Workload."""
    from opdvfs.runtime.dispatch import WorkloadRecorder

    _script_argv(list(ctx.args))  # a missing script is an error before anything starts

    recorder = WorkloadRecorder()

    def run() -> None:
        with recorder:
            _run_script(list(ctx.args))

    measured = None
    if profile_out is not None:
        from opdvfs.runtime.profiling import profile_run

        measured = profile_run(run, freq_mhz=freq_mhz)
    else:
        run()
    work = recorder.workload(name)  # no complete iteration: a CaptureError, reported as usual
    work.write(out)
    stdout.print(
        f"wrote {out}: {len(work)} operators per iteration "
        f"({work.meta['iterations_seen']} iterations seen)",
        highlight=False,
    )
    if measured is not None and profile_out is not None:
        measured.write(profile_out)
        summary = measured.summary()
        stdout.print(
            f"wrote {profile_out}: {summary['operators']} operators x "
            f"{summary['iterations']} iterations at {measured.freqs_mhz[0]:g} MHz, "
            f"{0 if measured.samples is None else len(measured.samples)} power samples",
            highlight=False,
        )


@app.command(context_settings=_SCRIPT)
@reports_errors
def run(
    ctx: typer.Context,
    schedule_path: Annotated[Path, typer.Argument(metavar="SCHEDULE", help="Schedule (JSON).")],
    actuator: Annotated[
        str, typer.Option("--actuator", help="nvml, ascend (log only), dry-run or twin.")
    ] = "dry-run",
    log: Annotated[
        Path | None, typer.Option("--log", "--log-file", help="JSON lines of actuator calls.")
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", "-w", help="Captured workload (op names; twin: simulated)."),
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", "-d", help="Preset (dry-run clocks; the twin).")
    ] = None,
) -> None:
    """Run a PyTorch script unchanged under a schedule (clocks restored however it ends).

    Under torchrun, rank 0 reads SCHEDULE and sends it on when the script makes its group.

    With torchrun, give --log-file: one log per rank (calls.rank1.jsonl).
    """
    from opdvfs.runtime.actuators import ClockGuard, TwinActuator, make_actuator
    from opdvfs.runtime.dispatch import ScheduleExecutor
    from opdvfs.runtime.distributed import share_schedule_on_group_init

    _script_argv(list(ctx.args))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    # ranks other than 0 take rank 0's plan (they need not have the file)
    plan = Schedule.read(schedule_path) if rank == 0 else None
    if log is not None and world > 1:
        log = log.with_name(f"{log.stem}.rank{rank}{log.suffix}")  # one log per rank
    work = load_workload(workload) if workload else None
    names = work.ops["name"].tolist() if work is not None else None
    with make_actuator(actuator, device=device, schedule=plan, log=log) as act:
        if actuator == "twin" and work is None:
            raise UsageError("--actuator twin needs --workload (the captured workload to simulate)")
        executor = ScheduleExecutor(plan, act, names=names)
        # under torchrun, ranks other than 0 receive rank 0's plan when the script makes its group
        sharing = share_schedule_on_group_init(executor, plan) if world > 1 else nullcontext()
        with sharing, ClockGuard(act), executor:
            _run_script(list(ctx.args))
    steady = executor.per_iteration()
    if steady["time_s"] is not None:
        stdout.print(
            f"iterations after the first: {steady['time_s']:.4f} s each (host clock)"
            + (
                f", {steady['energy_j']:.2f} J each (the device's energy counter)"
                if steady["energy_j"] is not None
                else ""
            ),
            highlight=False,
        )
    if executor.schedule is None:
        stdout.print(
            f"rank {rank}: the script never created a process group, so no schedule arrived "
            "from rank 0 and nothing was applied",
            highlight=False,
        )
    stdout.print(
        f"ran {executor.iteration} iterations; diverged in {len(executor.diverged_iterations)}"
        + (", schedule abandoned" if executor.abandoned else ""),
        highlight=False,
    )
    if isinstance(act, TwinActuator) and work is not None:
        issued, top = act.measure(work)
        stdout.print(
            f"on the twin ({act.device.spec.name}, simulated): the switches as issued take "
            f"{issued.iteration_time_s / top.iteration_time_s - 1:+.2%} time, "
            f"{issued.chip_energy_j / top.chip_energy_j - 1:+.2%} chip energy, "
            f"{(issued.core_energy_j or 0) / (top.core_energy_j or 1) - 1:+.2%} core energy "
            f"vs the top clock ({issued.switches} switches/iteration)",
            highlight=False,
        )
