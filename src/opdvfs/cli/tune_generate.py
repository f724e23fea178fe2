"""``opdvfs tune --mode generate``: the tune command on a generation loop (prefill, decode).

``opdvfs tune --mode generate --actuator sim:PRESET [--target X | --ttft-target X
--tpot-target Y] -- python serve.py ARGS`` runs the unchanged script once, in this process,
under ``opdvfs.tune(mode="generate")`` (:mod:`opdvfs.tuner.generate`); ``--out`` gets
``generate.json`` and ``summary.txt`` (:func:`~opdvfs.tuner.generate_result.write_generate`),
stdout the headline. The options are parsed by :func:`opdvfs.cli.tune.tune`; this module
checks their use here and runs it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opdvfs.cli._app import UsageError, stdout
from opdvfs.exceptions import CaptureError

__all__ = ["tune_generate"]


def tune_generate(
    argv: Sequence[str],
    *,
    target: float | None,
    ttft_target: float | None,
    tpot_target: float | None,
    actuator: str,
    clocks: str | Callable[[Sequence[float]], Sequence[float]],
    out: Path,
    warmup: int,
    iterations_per_clock: int | None,
    pairs: int,
    rounds: int,
    work_scale: float | None,
    as_json: bool,
) -> None:
    """Run ``argv`` (``python SCRIPT ARGS``) tuned per phase; print and write what it measured."""
    from opdvfs.cli.runtime import _program
    from opdvfs.runtime.launch import run_python
    from opdvfs.tuner import tune
    from opdvfs.tuner.generate_result import headline_lines, write_generate

    ttft = ttft_target if ttft_target is not None else target
    tpot = tpot_target if tpot_target is not None else target
    if ttft is None or tpot is None:
        raise UsageError(
            "--mode generate: give --target (both phases) or --ttft-target and --tpot-target"
        )
    for flag, value in (("--ttft-target", ttft), ("--tpot-target", tpot)):
        if not value > 0:
            raise UsageError(f"{flag} {value:g}: expected a slowdown > 0 (0.05 = 5%)")
    if not actuator.startswith("sim:"):
        raise UsageError(
            f"--mode generate --actuator {actuator}: runs on a simulated GPU (sim:PRESET) "
            "for now; see docs/guide/generate.md"
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    if not argv:
        raise UsageError("give the script to tune after --: -- python serve.py ARGS")
    command = _program(list(argv))
    if command is None:
        raise UsageError("tune runs the script in opdvfs's process: -- python SCRIPT ARGS")
    context = tune(
        ttft,
        actuator=actuator,
        clocks=clocks,
        warmup=warmup,
        iterations_per_clock=iterations_per_clock,
        work_scale=work_scale,
        cache=False,
        mode="generate",
        ttft_target=ttft,
        tpot_target=tpot,
        pairs=pairs,
        rounds=rounds,
        command=["opdvfs", *sys.argv[1:]],
    )
    script_out = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    with script_out, context.tuner:
        run_python(command)
    result: Any = context.tuner.result
    if context.tuner.stage in ("warmup", "profiling"):
        raise CaptureError(f"{result.error} (nothing was written)")
    written = [str(p) for p in write_generate(result, out)]
    if as_json:
        print(json.dumps({"out": str(out), "written": written, **result.to_dict()}, default=float))
    else:
        for line in headline_lines(result):
            stdout.print(line, highlight=False, markup=False)
        stdout.print(f"wrote {out}: {', '.join(written)}", highlight=False)
    if result.error is not None and result.chosen is None:
        raise CaptureError(result.error)
