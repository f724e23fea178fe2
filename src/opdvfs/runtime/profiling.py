"""Profile a program while it runs: torch.profiler per iteration, NVML power beside it (torch).

:func:`profile_run` wraps a callable that runs the user's training loop. Each optimizer step
closes a ``ProfilerStep`` span (PyTorch's global optimizer-step hook calls ``prof.step()``), so
the trace imports as one profile iteration per training step; on a GPU the kernels are traced
and an :class:`~opdvfs.runtime.sampler.NvmlSampler` records power, temperature, SM clock and the
energy counter on the trace's clock; each sample's power becomes the counter's mean over its
interval, the window the power model's attribution uses. Nothing is set on the device.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from opdvfs.exceptions import ValidationError
from opdvfs.io import torch_trace
from opdvfs.io.samples import counter_windows, run_clock_mhz, window_ms
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
        The measured profile (None until the block ends without an exception; with
        ``traced(lazy=True)``, until :meth:`load`).
    """

    def __init__(self, sampler: Any, freq_mhz: float | None) -> None:
        self.sampler = sampler
        self.freq_mhz = freq_mhz
        self.profile: Profile | None = None
        self._import: Callable[[], Profile] | None = None

    def load(self) -> Profile | None:
        """Import the exported trace (once) and return the profile; None if the block failed.

        With ``traced(lazy=True)`` this is where the trace is parsed, in whichever thread calls
        it: a training loop's own thread need not stop for it.
        """
        if self.profile is None and self._import is not None:
            build, self._import = self._import, None
            self.profile = build()
        return self.profile


@contextmanager
def traced(
    *,
    sampler: Any = None,
    cuda: bool = False,
    freq_mhz: float | None = None,
    interval_ms: float,
    until: Callable[[], bool] | None = None,
    lazy: bool = False,
) -> Iterator[Traced]:
    """Trace the block with torch.profiler (one ``ProfilerStep`` per optimizer step).

    The piece :func:`profile_run` and the clock sweep (:mod:`opdvfs.runtime.sweep`) share. On a
    GPU (``cuda``) the kernels are traced and ``sampler`` (an
    :class:`~opdvfs.runtime.sampler.NvmlSampler`) records beside them; each sample's power then
    becomes the energy counter's mean over its interval
    (:func:`~opdvfs.io.samples.counter_windows`). When the block
    ends normally, the trace is imported (:func:`opdvfs.io.torch_trace.read`, every row at the
    yielded object's ``freq_mhz``) into its ``profile``. ``until``: once it returns True at an
    optimizer step, the profiler stops recording (the program runs on untraced, its trace no
    longer growing). ``lazy``: the block's end only stops the profiler and exports the trace;
    :meth:`Traced.load` imports it later (on an H200, the import of a 70-iteration GPT sweep
    stalled the training thread for 6.4 s when ``tune`` ended its trace in an optimizer hook).
    """
    out = Traced(sampler, freq_mhz)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    tmp = Path(tempfile.mkdtemp(prefix="opdvfs-trace-"))
    # the folder goes with the Traced object (or at exit), however the block ends
    weakref.finalize(out, shutil.rmtree, tmp, True)
    trace = tmp / "trace.json"
    with torch.profiler.profile(
        activities=activities,
        # no shapes: the importer reads none, and they cost ~28 KB of host memory per traced
        # op (10^5 ops per step peaked at 21.6 GB over a sweep, #33)
        record_shapes=False,
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
    freq_mhz = out.freq_mhz

    def build() -> Profile:
        try:
            measured = torch_trace.read(trace, freq_mhz=freq_mhz)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        meta = {**measured.meta, "format": "opdvfs capture", "sources": ["opdvfs capture"]}
        samples = None
        if sampler is not None:
            samples = counter_windows(sampler.samples)
            window = window_ms(samples, interval_ms)
            meta["sensor"] = {"period_ms": window, "window_ms": window}
        return Profile(measured.ops, samples, meta=meta)

    out._import = build
    if not lazy:
        out.load()


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
