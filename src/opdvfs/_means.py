"""Per-iteration means from iteration end times and an energy counter read at each end.

Shared by the runtime's executors (:meth:`~opdvfs.runtime.applier.ScheduleApplier.per_iteration`)
and the simulated GPU (:meth:`~opdvfs.sim.gpu.SimulatedGpu.per_iteration`), so it sits below both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def iteration_means(ends_s: Sequence[float], energy_j: Sequence[float]) -> dict[str, float | None]:
    """Return ``iterations``, mean ``time_s`` and mean ``energy_j`` between the recorded ends.

    ``energy_j`` is the counter read at each end (``None`` as the mean when it was not read at
    every end).
    """
    ends = np.asarray(ends_s, dtype=float)
    energy = np.asarray(energy_j, dtype=float)
    n = len(ends) - 1
    if n < 1:
        return {"iterations": 0, "time_s": None, "energy_j": None}
    return {
        "iterations": n,
        "time_s": float((ends[-1] - ends[0]) / n),
        "energy_j": float((energy[-1] - energy[0]) / n) if len(energy) == n + 1 else None,
    }
