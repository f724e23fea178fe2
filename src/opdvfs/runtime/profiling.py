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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from opdvfs.exceptions import ValidationError
from opdvfs.io import torch_trace
from opdvfs.profile import Profile

__all__ = ["profile_run"]


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
        Core clock the program runs at; default: the SM clock NVML reads at the start (a GPU),
        required on the CPU.
    cuda
        Trace CUDA kernels and sample NVML; default: whether CUDA is available.
    """
    use_cuda = torch.cuda.is_available() if cuda is None else cuda
    sampler: Any = None
    if use_cuda:
        from opdvfs.runtime.sampler import NvmlSampler

        sampler = NvmlSampler(interval_ms=interval_ms)
        if freq_mhz is None:
            freq_mhz = sampler.read_freq_mhz()
    if freq_mhz is None:
        raise ValidationError(
            "profiling on the CPU needs the clock: give --freq-mhz", field="freq_mhz"
        )
    activities = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory(prefix="opdvfs-trace-") as tmp:
        trace = Path(tmp) / "trace.json"
        with torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            # a schedule (always recording) makes step() open the ProfilerStep#N spans
            schedule=lambda _: torch.profiler.ProfilerAction.RECORD,
        ) as prof:
            hook = register_optimizer_step_post_hook(lambda *_: prof.step())
            try:
                if sampler is not None:
                    with sampler:
                        run()
                        torch.cuda.synchronize()
                else:
                    run()
            finally:
                hook.remove()
        prof.export_chrome_trace(str(trace))
        measured = torch_trace.read(trace, freq_mhz=freq_mhz)
    meta = {**measured.meta, "format": "opdvfs capture", "sources": ["opdvfs capture"]}
    samples = None
    if sampler is not None:
        samples = _window_power(sampler.samples)
        meta["sensor"] = {"period_ms": interval_ms, "window_ms": interval_ms}
    return Profile(measured.ops, samples, meta=meta)


def _window_power(samples: pd.DataFrame) -> pd.DataFrame:
    """Replace each sample's power by the energy counter's mean power since the previous one.

    NVML's power reading is a 1 s average on Ampere and newer (except GA100), too coarse to
    attribute operators with; the total-energy counter is exact, so its difference over each
    sampling interval is that interval's energy (the window the attribution then uses).
    """
    t = samples["t_s"].to_numpy(dtype=float)
    e = samples["energy_j"].to_numpy(dtype=float)
    if len(t) < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) < 0):
        return samples  # no usable counter: keep the readings
    power = np.diff(e) / np.maximum(np.diff(t), 1e-9)
    return samples.iloc[1:].assign(power_w=power).reset_index(drop=True)
