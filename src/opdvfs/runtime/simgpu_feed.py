"""Launch every aten operator a program dispatches on a :class:`SimulatedGpu` (needs torch).

:class:`SimGpuFeed` is the workload recorder (:class:`~opdvfs.runtime.recorder.WorkloadRecorder`)
with its rows sent to the simulated GPU as launches instead of kept: the same FLOPs, bytes and
counting as ``opdvfs capture``, so the executor's operator indices and the device's agree. The
aten name runs as the simulator's operator of that kind
(:data:`opdvfs.sim.physics.ATEN_TYPES`: a matmul on the matrix units, a layer norm as a
reduction ...); views and allocations start no kernel.

Enter it *before* an executor (lower on the dispatch-mode stack): the executor then sees each
operator first and issues its switch, and the device places the operator after, at the clock
that switch leaves in effect.
"""

from __future__ import annotations

import threading
from typing import Any

from opdvfs.runtime.recorder import WorkloadRecorder
from opdvfs.sim.gpu import SimulatedGpu

__all__ = ["SimGpuFeed"]

#: aten operators that start no kernel on a GPU besides views (allocations, metadata).
_NO_KERNEL = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::lift_fresh",
        "aten::resize_",
        "aten::set_",
        "aten::_local_scalar_dense",
    }
)


class _Launcher(list[dict[str, Any]]):
    """Where the recorder appends each operator's row: a launch on the device, nothing kept."""

    def __init__(self, feed: SimGpuFeed) -> None:
        super().__init__()
        self._feed = feed

    def append(self, row: dict[str, Any]) -> None:
        """Launch ``row`` on the device."""
        self._feed.launch(row)


class SimGpuFeed(WorkloadRecorder):
    """A dispatch mode that launches every aten operator on ``gpu``; iterations end there too.

    Parameters
    ----------
    gpu
        The simulated GPU the program runs on.
    optimizer_steps
        As :class:`~opdvfs.runtime.recorder.IterationCounter`: iterations end at optimizer steps
        (or only at :meth:`mark_iteration`, for ``--iteration-at``).
    """

    def __init__(self, gpu: SimulatedGpu, *, optimizer_steps: bool = True) -> None:
        super().__init__(optimizer_steps=optimizer_steps)
        self.gpu = gpu
        self._current = _Launcher(self)
        self._views: set[str] = set()
        self._local = threading.local()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        self._local.kernel = not (func.is_view or name in _NO_KERNEL)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def launch(self, row: dict[str, Any]) -> None:
        """Launch the recorder's ``row`` for the operator being dispatched."""
        self.gpu.launch(row, kernel=getattr(self._local, "kernel", True))

    def end_iteration(self, n_ops: int) -> None:
        """End the device's iteration (its time and energy counter are recorded)."""
        self.gpu.mark_iteration()
