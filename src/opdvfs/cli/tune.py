"""The tune command: profile, plan, apply and measure on a running training job, in one run.

``opdvfs tune --target 0.02 [--actuator nvml|zeusd|sim:PRESET|dry-run] [--clocks auto|LIST]
[--out DIR] -- python train.py ARGS`` runs the unchanged script once, in this process, under
:class:`opdvfs.tune` (built as Python builds it; :mod:`opdvfs.tuner`); the files go to
``--out`` (:func:`opdvfs.tuner.report.write_tune`), the summary to stdout, a progress display
(phase, clock, iterations left, the running saving) to stderr when it is a terminal. This
module parses the options, checks their use and prints; the loop is the library's.

Under ``torchrun ... -m opdvfs tune ... -- python train.py`` every rank runs this command and
tunes its own device, coordinated once the script makes its process group (rank 0 leads: see
:mod:`opdvfs.tuner.ranks`); ``--log`` gets ``.rankN`` before its suffix, and only rank 0
writes ``--out``, prints the summary and shows the progress display.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from opdvfs._files import check_writable_folder
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


def _progress() -> tuple[Any, Any]:
    """Return a started rich progress display on stderr and its update callback (or Nones)."""
    if not stderr.is_terminal:
        return None, None
    from rich.progress import Progress, SpinnerColumn, TextColumn

    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), console=stderr, transient=True
    )
    task = progress.add_task("tune: warm-up", total=None)
    progress.start()

    def update(status: dict[str, Any]) -> None:
        clock = status["freq_mhz"]
        left = status["left"]
        saving = status["saving"]
        progress.update(
            task,
            description=(
                f"tune: {status['phase']} | iteration {status['iteration']}"
                + (f" | {clock:g} MHz" if clock else "")
                + (f" | {left} left in phase" if left is not None else "")
                + (f" | measured saving {saving:+.2%}" if saving is not None else "")
            ),
        )

    return progress, update


@app.command(context_settings=SCRIPT_CONTEXT)
@reports_errors
def tune(
    ctx: typer.Context,
    target: Annotated[
        float | None,
        typer.Option(
            "--target",
            help="Allowed measured slowdown (0.02 = 2%; required); --mode generate: of both "
            "the time to first token and per output token unless given apart.",
        ),
    ] = None,
    actuator: Annotated[
        str,
        typer.Option(
            "--actuator",
            help="nvml (root), zeusd (no root: the Zeus daemon at ZEUSD_SOCK_PATH), "
            "sim:PRESET (a simulated GPU, e.g. sim:a100-like), or dry-run (clock calls only "
            "recorded: --device PRESET's clocks, else the NVIDIA GPU's, whose power and energy "
            "it reads through NVML, read-only).",
        ),
    ] = "nvml",
    clocks: Annotated[
        str,
        typer.Option(
            "--clocks",
            help="Clocks to profile: auto (the top, the clocks ~7.5% and ~15% below it, mid, min) "
            "or a list (MHz and/or min, mid, max).",
        ),
    ] = "auto",
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for the profile, models, schedule, report.")
    ] = Path("opdvfs-tune"),
    iterations_per_clock: Annotated[
        int | None,
        typer.Option(
            "--iterations-per-clock",
            min=1,
            help="Iterations measured at each clock (default: enough for the power sensor).",
        ),
    ] = None,
    warmup: Annotated[
        int, typer.Option("--warmup", min=1, help="Iterations at the top clock first.")
    ] = 2,
    block: Annotated[
        int | None,
        typer.Option(
            "--block",
            min=2,
            help="Iterations per A/B block (the first discarded). Default: 3 on sim:PRESET "
            "(an exact energy counter); on nvml, zeusd and dry-run enough for the counted "
            "iterations to span 10 updates of NVML's 100 ms energy counter at the top clock.",
        ),
    ] = None,
    pairs: Annotated[
        int, typer.Option("--pairs", min=1, help="A/B block pairs per measured plan.")
    ] = 3,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Most plans measured: re-plans included, and the best static clock as the "
            "last when 2 or more (see --no-static).",
        ),
    ] = 4,
    no_static: Annotated[
        bool,
        typer.Option(
            "--no-static",
            help="Do not measure the best single static clock (what nvidia-smi -lgc would "
            "lock) as a contender; by default it is the last of --rounds, applied when it wins.",
        ),
    ] = False,
    as_json: JsonOption = False,
    work_scale: WorkScaleOption = None,
    device: DryRunDeviceOption = None,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log",
            "--log-file",
            help="JSON lines of actuator calls (appended); --log-file under torchrun "
            "(its own --log-dir takes --log), one file per rank (calls.rank1.jsonl).",
        ),
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="train (iterations end at optimizer steps) or generate (a generation loop, "
            "e.g. HF generate(): steps at model forwards, prefill and decode tuned apart; "
            "sim:PRESET; docs/guide/generate.md).",
        ),
    ] = "train",
    ttft_target: Annotated[
        float | None,
        typer.Option("--ttft-target", help="--mode generate: allowed slowdown of TTFT."),
    ] = None,
    tpot_target: Annotated[
        float | None,
        typer.Option("--tpot-target", help="--mode generate: allowed slowdown of TPOT."),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Neither read nor write the cache ($OPDVFS_CACHE_DIR, else "
            "~/.cache/opdvfs/tune) of schedules per operator sequence.",
        ),
    ] = False,
    gpu: GpuOption = None,
) -> None:
    """Tune a training script's clocks in one run: profile, plan, apply, measure (A/B).

    Warm-up at the top clock; profile at a few clocks between iterations; fit and plan in a
    background thread while training goes on at the top clock; apply the schedule in blocks
    interleaved with top-clock blocks and report the measured slowdown and energy saved (95%
    t-intervals over the pairs); re-plan at another budget when the measured slowdown misses
    the target; then apply the best plan for the rest of the run. A second run of the same job
    starts from the cache and applies at once. The clock is restored however the run ends.
    On nvml, zeusd and dry-run a torch.compile'd model stays compiled (iterations end at the
    optimizer step, the plan applies by time); on sim:PRESET it runs eagerly (the simulator
    times each operator).
    """
    from opdvfs.cli._app import parse_clocks
    from opdvfs.cli.runtime import _program
    from opdvfs.runtime.launch import run_python
    from opdvfs.tuner import summary_lines, tune, write_tune
    from opdvfs.tuner.ranks import launched_as

    clock_choice: Any = (
        "auto"
        if clocks.strip().lower() == "auto"
        else lambda supported: parse_clocks(clocks, supported)
    )
    if mode == "generate":
        from opdvfs.cli.tune_generate import tune_generate

        tune_generate(
            ctx.args,
            target=target,
            ttft_target=ttft_target,
            tpot_target=tpot_target,
            actuator=actuator,
            clocks=clock_choice,
            out=out,
            warmup=warmup,
            iterations_per_clock=iterations_per_clock,
            pairs=pairs,
            rounds=rounds,
            work_scale=work_scale,
            as_json=as_json,
        )
        return
    if mode != "train":
        raise UsageError(f"--mode {mode}: expected train or generate")
    if target is None:
        raise UsageError("--target: required (the allowed slowdown, 0.02 = 2%)")
    if not 0 < target <= 1:
        raise UsageError(
            f"--target {target:g}: expected a slowdown budget as a fraction in (0, 1] (0.02 = 2%)"
        )
    if actuator in ("twin", "ascend"):
        raise UsageError(
            f"--actuator {actuator}: tune measures the device the script runs on: use nvml, "
            "zeusd, sim:PRESET or dry-run"
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    argv = list(ctx.args)
    if not argv:
        raise UsageError("give the script to tune after --: -- python train.py ARGS")
    command = _program(argv)
    if command is None:
        raise UsageError("tune runs the script in opdvfs's process: -- python SCRIPT ARGS")
    # where the files go, fixed now (a script's os.chdir does not move it) and checked
    # writable before the script trains; nothing is created until the run writes
    out_path = check_writable_folder(out)
    progress, update = _progress() if launched_as()[0] == 0 and not as_json else (None, None)
    try:
        context = tune(
            target,
            actuator=actuator,
            clocks=clock_choice,
            warmup=warmup,
            iterations_per_clock=iterations_per_clock,
            work_scale=work_scale,
            device=device,
            cache=not no_cache,
            log=log,
            gpu=gpu,
            on_iteration=update,
            block=block,
            pairs=pairs,
            rounds=rounds,
            static=not no_static,
            command=["opdvfs", *sys.argv[1:]],
        )
    except BaseException:
        if progress is not None:
            progress.stop()
        raise
    tuner = context.tuner
    announce_gpu(tuner.actuator)

    shown = warnings.showwarning

    def one_line(message: Any, *args: Any, **kwargs: Any) -> None:
        """Show opdvfs's own warnings as one line on stderr; the script's as Python does."""
        text = str(message)
        if not text.startswith("opdvfs: "):
            shown(message, *args, **kwargs)
            return
        text = text.removeprefix("opdvfs: ")
        stderr.print(f"opdvfs: warning: {text}", markup=False, highlight=False, soft_wrap=True)

    # --json: stdout holds the one JSON object; the script's own prints go to stderr
    script_out = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    try:
        with warnings.catch_warnings(), script_out:
            warnings.showwarning = one_line
            with tuner:
                run_python(command)
    finally:
        if progress is not None:
            progress.stop()
    result = tuner.result
    if tuner.rank != 0:  # rank 0 writes the job's files and summary
        if result.error is not None and result.schedule is None:
            prefix = f"rank {tuner.rank}: "
            raise CaptureError(
                result.error if result.error.startswith(prefix) else prefix + result.error
            )
        return
    # a script that took a signal and ended by itself (its handler's exit status 0) ends
    # tune with its status: a line says what tuning had not done, instead of an error
    signalled = signal.Signals(tuner.guard.signals[0]).name if tuner.guard.signals else None
    if tuner.sweep_unfinished:
        if signalled:
            note(f"the script ended after {signalled} before tuning was done; nothing was written")
            return
        # bad input (a script too short): as capture --freqs, no files
        raise CaptureError(f"{result.error} (nothing was written)")
    written = write_tune(result, out_path)
    failed = result.error is not None and result.schedule is None
    if as_json and not failed:
        doc = result.to_dict()
        doc.pop("per_iteration")  # (in tune.json)
        print(json.dumps({"out": str(out), "written": written, **doc}))
        return
    if not as_json:
        for line in summary_lines(result):
            stdout.print(line, highlight=False)
        stdout.print(f"wrote {out}: {', '.join(written)}", highlight=False)
    if failed:
        if signalled:
            note(f"{signalled} received: {result.error}")
            return
        raise CaptureError(result.error)
