"""Profile a program while it runs: torch.profiler per iteration, NVML power beside it (torch).

:func:`profile_run` wraps a callable that runs the user's training loop. Each optimizer step
closes a ``ProfilerStep`` span (PyTorch's global optimizer-step hook calls ``prof.step()``), so
the trace imports as one profile iteration per training step; on a GPU the kernels are traced
and an :class:`~opdvfs.runtime.sampler.NvmlSampler` records power, temperature, SM clock and the
energy counter on the trace's clock; each sample's power becomes the counter's mean over its
interval, the window the power model's attribution uses. Nothing is set on the device.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from opdvfs.exceptions import ValidationError
from opdvfs.io import torch_trace
from opdvfs.profile import Profile

__all__ = ["Traced", "profile_run", "run_clock_mhz", "traced", "window_ms"]


class Traced:
    """What :func:`traced` measured: its ``profile`` once the block has ended.

    Attributes
    ----------
    sampler
        The NVML sampler beside the trace (a GPU), or None.
    freq_mhz
        The clock every row gets (MHz); set it before the block ends.
    profile
        The measured profile (None until the block ends without an exception).
    """

    def __init__(self, sampler: Any, freq_mhz: float | None) -> None:
        self.sampler = sampler
        self.freq_mhz = freq_mhz
        self.profile: Profile | None = None


@contextmanager
def traced(
    *,
    sampler: Any = None,
    cuda: bool = False,
    freq_mhz: float | None = None,
    interval_ms: float,
    until: Callable[[], bool] | None = None,
) -> Iterator[Traced]:
    """Trace the block with torch.profiler (one ``ProfilerStep`` per optimizer step).

    The piece :func:`profile_run` and the clock sweep (:mod:`opdvfs.runtime.sweep`) share. On a
    GPU (``cuda``) the kernels are traced and ``sampler`` (an
    :class:`~opdvfs.runtime.sampler.NvmlSampler`) records beside them; each sample's power then
    becomes the energy counter's mean over its interval (:func:`_window_power`). When the block
    ends normally, the trace is imported (:func:`opdvfs.io.torch_trace.read`, every row at the
    yielded object's ``freq_mhz``) into its ``profile``. ``until``: once it returns True at an
    optimizer step, the profiler stops recording (the program runs on untraced, its trace no
    longer growing).
    """
    out = Traced(sampler, freq_mhz)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory(prefix="opdvfs-trace-") as tmp:
        trace = Path(tmp) / "trace.json"
        with torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            # a schedule (recording) makes step() open the ProfilerStep#N spans
            schedule=lambda _: (
                torch.profiler.ProfilerAction.NONE
                if until is not None and until()
                else torch.profiler.ProfilerAction.RECORD
            ),
        ) as prof:

            def step(*_: object) -> None:
                with warnings.catch_warnings():
                    # RECORD then NONE is how a trace ends early (``until``): its results are kept
                    warnings.filterwarnings("ignore", "Incorrect schedule", UserWarning)
                    prof.step()

            hook = register_optimizer_step_post_hook(step)
            try:
                if sampler is not None:
                    with sampler:
                        yield out
                        torch.cuda.synchronize()
                else:
                    yield out
            finally:
                hook.remove()
        prof.export_chrome_trace(str(trace))
        if out.freq_mhz is None and sampler is not None:
            out.freq_mhz = run_clock_mhz(sampler.samples)
        if out.freq_mhz is None:
            raise ValidationError("the traced run's clock is unknown", field="freq_mhz")
        measured = torch_trace.read(trace, freq_mhz=out.freq_mhz)
    meta = {**measured.meta, "format": "opdvfs capture", "sources": ["opdvfs capture"]}
    samples = None
    if sampler is not None:
        samples = _window_power(sampler.samples)
        window = window_ms(samples, interval_ms)
        meta["sensor"] = {"period_ms": window, "window_ms": window}
    out.profile = Profile(measured.ops, samples, meta=meta)


def profile_run(
    run: Callable[[], None],
    *,
    freq_mhz: float | None = None,
    cuda: bool | None = None,
    interval_ms: float = 20.0,
) -> Profile:
    """Run ``run()`` under torch.profiler (and NVML on a GPU); return the profile it measured.

    Parameters
    ----------
    freq_mhz
        Core clock the program runs at; default on a GPU: the SM clock NVML read while it ran
        (:func:`run_clock_mhz`), required on the CPU.
    cuda
        Trace CUDA kernels and sample NVML; default: whether CUDA is available.
    """
    use_cuda = torch.cuda.is_available() if cuda is None else cuda
    sampler: Any = None
    if use_cuda:
        from opdvfs.runtime.sampler import NvmlSampler

        sampler = NvmlSampler(interval_ms=interval_ms)
    elif freq_mhz is None:
        raise ValidationError(
            "profiling on the CPU needs the clock: give --freq-mhz", field="freq_mhz"
        )
    with traced(sampler=sampler, cuda=use_cuda, freq_mhz=freq_mhz, interval_ms=interval_ms) as t:
        run()
    assert t.profile is not None
    return t.profile


def _window_power(samples: pd.DataFrame) -> pd.DataFrame:
    """Replace each sample's power by the energy counter's mean power since the previous one.

    NVML's power reading is a 1 s average on Ampere and newer (except GA100), too coarse to
    attribute operators with; the total-energy counter is exact, so its difference over each
    interval is that interval's energy (the window the attribution then uses). The counter need
    not change at every read: on an H200 it moved every 100 ms (median; 96-103 ms, 5th-95th
    percentile) under reads every ~24 ms, so per-read differences alternate between 0 W and
    four times the power. Such a counter's windows are its own updates: each sample is a read
    that saw a new value, timed half-way between it and the read before (the update happened
    between them), and its power is the energy since the previous update over that time. A
    counter that moved at every read keeps the reads' own times.
    """
    t = samples["t_s"].to_numpy(dtype=float)
    e = samples["energy_j"].to_numpy(dtype=float)
    if len(t) < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) < 0):
        return samples  # no usable counter: keep the readings
    moved = np.flatnonzero(np.diff(e) > 0) + 1  # the first read showing each new value
    if len(moved) == len(t) - 1:
        power = np.diff(e) / np.maximum(np.diff(t), 1e-9)
        return samples.iloc[1:].assign(power_w=power).reset_index(drop=True)
    if len(moved) < 2:
        return samples.iloc[:0]  # not one whole update interval
    at = (t[moved - 1] + t[moved]) / 2
    power = np.diff(e[moved]) / np.maximum(np.diff(at), 1e-9)
    return samples.iloc[moved[1:]].assign(t_s=at[1:], power_w=power).reset_index(drop=True)


def run_clock_mhz(samples: pd.DataFrame) -> float | None:
    """Return the SM clock a sampled run ran at (MHz): the median of the samples' clocks.

    Not the clock read before the run: an idle GPU sits at its lowest clocks until work
    arrives (an H200 read 345 MHz before a training run that then ran at 1980 MHz).
    """
    clocks = samples["freq_mhz"].to_numpy(dtype=float) if len(samples) else np.empty(0)
    clocks = clocks[np.isfinite(clocks)]
    return float(np.median(clocks)) if clocks.size else None


def window_ms(samples: pd.DataFrame, default_ms: float) -> float:
    """Return the windows' length (ms) of :func:`_window_power`'s samples: their median spacing."""
    t = samples["t_s"].to_numpy(dtype=float)
    return float(np.median(np.diff(t))) * 1e3 if len(t) >= 2 else default_ms
