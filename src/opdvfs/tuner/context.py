"""``opdvfs.tune``: the closed loop around a block of the user's code; the one way to build it.

``with opdvfs.tune(target=0.02): train()`` and ``opdvfs tune --target 0.02 -- python train.py``
build their :class:`~opdvfs.tuner.loop.Tuner` here, with the same defaults: the actuator by name
(:func:`~opdvfs.runtime.actuators.make_actuator`), the cache of measured schedules
(:class:`~opdvfs.tuner.cache.TuneCache`), one actuator log per rank under torchrun.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import opdvfs.tuner.policy as policy
from opdvfs.exceptions import ValidationError
from opdvfs.schedule import Objective
from opdvfs.tuner.cache import TuneCache
from opdvfs.tuner.loop import Tuner
from opdvfs.tuner.ranks import launched_as
from opdvfs.tuner.report import write_tune
from opdvfs.tuner.result import TuneResult

__all__ = ["ClockChoice", "tune"]

#: The clocks to profile: ``"auto"``, a list (MHz), or a function of the device's clocks that
#: returns the list (e.g. the command line's ``min,mid,max`` words resolved on the device).
ClockChoice = str | Sequence[float] | Callable[[Sequence[float]], Sequence[float]]


def rank_log(log: str | os.PathLike[str] | None) -> tuple[str | None, dict[str, Any]]:
    """Return this rank's actuator log (``calls.rank1.jsonl`` under torchrun) and its header."""
    header: dict[str, Any] = {}
    rank, world_size = launched_as()
    if log is None or world_size <= 1:
        return (None if log is None else str(log)), header
    header["rank"] = rank
    path = Path(log)
    return str(path.with_name(f"{path.stem}.rank{rank}{path.suffix}")), header


class tune:  # lower case: used as ``with opdvfs.tune(target=0.02): train()``
    """Tune the training run inside the block: ``with opdvfs.tune(target=0.02): train()``.

    The loop of :mod:`opdvfs.tuner` on the code the block runs (its optimizer steps end the
    iterations), through ``actuator`` (``"nvml"``, ``"zeusd"``, ``"sim:PRESET"``,
    ``"dry-run"`` with ``device``); the files of :func:`~opdvfs.tuner.report.write_tune` go to
    ``out`` when given; ``options`` go to :class:`~opdvfs.tuner.loop.Tuner` (``block``,
    ``pairs``, ``rounds``, ``static``, ``interval_ms``,
    ``command``). The clock is restored however the block ends.
    After the block, :attr:`result` holds what was measured.

    Parameters
    ----------
    target
        Allowed measured slowdown (0.02 = 2%).
    actuator
        The actuator's name (:func:`~opdvfs.runtime.actuators.make_actuator`).
    clocks
        The clocks to profile (:data:`ClockChoice`; ``"auto"``:
        :func:`~opdvfs.tuner.policy.profile_clocks`).
    out
        Folder for the files, written by rank 0 after the block (None: none written); made
        absolute and checked writable here, before the block trains.
    warmup, iterations_per_clock
        As :class:`~opdvfs.runtime.sweep.ClockSweep`.
    work_scale, device
        As :func:`~opdvfs.runtime.actuators.make_actuator` (a simulated GPU's work scale; a
        dry run's device preset).
    objective
        As ``opdvfs plan``.
    cache
        Read and write the cache of measured schedules (``$OPDVFS_CACHE_DIR``).
    log
        JSON lines of the actuator's calls (appended); under torchrun one file per rank
        (``calls.rank1.jsonl``).
    gpu
        For ``nvml``, ``zeusd`` and a dry run measuring a GPU: the GPU (an NVML index or UUID,
        or one per local rank, comma-separated); default this process's CUDA device
        (:func:`~opdvfs.runtime.actuators.make_actuator`).
    on_iteration
        Called after each iteration with :meth:`Tuner.status` (a progress display).
    mode
        ``"train"`` (iterations end at optimizer steps) or ``"generate"``: a generation loop
        tuned per phase, prefill and decode (:class:`~opdvfs.tuner.generate.GenerateTuner`,
        a simulated GPU; ``options`` go to it).
    ttft_target, tpot_target
        With ``mode="generate"``: the allowed slowdowns of the time to first token and per
        output token (default: ``target`` for both).
    """

    def __init__(
        self,
        target: float = 0.02,
        *,
        actuator: str = "nvml",
        clocks: ClockChoice = "auto",
        out: str | os.PathLike[str] | None = None,
        warmup: int = 2,
        iterations_per_clock: int | None = None,
        work_scale: float | None = None,
        device: str | None = None,
        objective: Objective = policy.OBJECTIVE,
        cache: bool = True,
        log: str | os.PathLike[str] | None = None,
        gpu: str | None = None,
        on_iteration: Callable[[dict[str, Any]], None] | None = None,
        mode: str = "train",
        ttft_target: float | None = None,
        tpot_target: float | None = None,
        **options: Any,
    ) -> None:
        from opdvfs._files import check_writable_folder
        from opdvfs.runtime.actuators import make_actuator

        # resolved and checked now, before the job trains: a script's os.chdir does not move
        # it, and a folder that cannot be written is an error at the start, not at the end
        self.out = None if out is None else check_writable_folder(out)
        log_path, header = rank_log(log)
        header = {"command": "tune", "actuator": actuator, "target": target, **header}
        act = make_actuator(
            actuator, device=device, log=log_path, header=header, work_scale=work_scale, gpu=gpu
        )
        try:
            chosen: Any = clocks
            if callable(clocks):
                chosen = list(clocks(act.supported_freqs_mhz()))
            elif not isinstance(clocks, str):
                chosen = [float(f) for f in clocks]
            if mode not in ("train", "generate"):
                raise ValidationError(
                    f"mode {mode!r}: expected 'train' or 'generate'", field="mode"
                )
            if mode == "generate":
                from opdvfs.tuner.generate import GenerateTuner

                self.tuner: Any = GenerateTuner(
                    act,
                    ttft_target=target if ttft_target is None else ttft_target,
                    tpot_target=target if tpot_target is None else tpot_target,
                    clocks=chosen,
                    warmup=warmup,
                    per_clock=iterations_per_clock or 2,
                    objective=objective,
                    label=actuator,
                    **options,
                )
                return
            self.tuner = Tuner(
                act,
                target=target,
                clocks=chosen,
                warmup=warmup,
                iterations_per_clock=iterations_per_clock,
                objective=objective,
                cache=TuneCache() if cache else None,
                on_iteration=on_iteration,
                label=actuator,
                **options,
            )
        except BaseException:
            act.close()
            raise

    @property
    def result(self) -> TuneResult:
        """What the run measured (complete after the block).

        With ``mode="generate"`` a :class:`~opdvfs.tuner.generate_result.GenerateResult`.
        """
        return self.tuner.result

    def __enter__(self) -> tune:
        """Start tuning (the top clock locked for the warm-up)."""
        self.tuner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the clock, then write the files (when ``out`` was given; rank 0 only).

        Nothing is written when the block ended before the clock sweep was done (the result's
        error says how many iterations it needs). An exception of the block's own always wins:
        an error of opdvfs's while it ends (a refused restore, a file it could not write) is
        then one line on stderr, never a replacement.
        """
        raised = exc[0] is not None
        try:
            self.tuner.__exit__(*exc)
            if self.out is not None and not isinstance(self.tuner, Tuner):
                from opdvfs.tuner.generate_result import write_generate

                write_generate(self.tuner.result, self.out)
            elif self.out is not None and self.tuner.rank == 0 and not self.tuner.sweep_unfinished:
                write_tune(self.tuner.result, self.out)
        except Exception as own:
            if not raised:
                raise
            print(f"opdvfs: error: {own}", file=sys.stderr, flush=True)
