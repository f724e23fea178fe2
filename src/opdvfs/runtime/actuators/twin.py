"""An actuator that drives the simulator: the switches a real run issued, replayed on the twin.

It records every call like the dry run (same JSON lines), and :meth:`TwinActuator.measure`
then runs the workload on the simulated device with the switches of one iteration exactly where
the executor issued them (op index, clock), so the effect of the real program's dispatch --
fallbacks included -- is measured on the twin, beside the top clock.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from opdvfs.result import RunResult
from opdvfs.runtime.actuators.dry_run import DryRunActuator
from opdvfs.schedule import Schedule
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.workload import Workload

__all__ = ["TwinActuator"]


class TwinActuator(DryRunActuator):
    """Record switches like :class:`DryRunActuator`; replay them on a :class:`SimulatedDevice`."""

    def __init__(
        self,
        device: SimulatedDevice,
        *,
        log: str | os.PathLike[str] | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(device.spec.freqs_mhz, log=log, header=header)
        self.device = device

    def issued_schedule(self, n_ops: int, iteration: int | None = None) -> Schedule:
        """Return the switches issued in ``iteration`` (default: the last with any) as a plan.

        A stage starts at each switch's op index; the clock before the first switch is the one
        in effect when the iteration began (the last earlier switch, else the top clock).
        """
        sets = [c for c in self.calls if c["kind"] == "set" and c["iteration"] is not None]
        if iteration is None:
            iteration = max((c["iteration"] for c in sets), default=0)
        before = [c for c in sets if c["iteration"] < iteration]
        first = before[-1]["freq_mhz"] if before else max(self.supported_freqs_mhz())
        starts, freqs = [0], [first]
        for c in (c for c in sets if c["iteration"] == iteration):
            op = min(int(c["op_index"]), n_ops - 1)
            if op == starts[-1]:
                freqs[-1] = c["freq_mhz"]
            else:
                starts.append(op)
                freqs.append(c["freq_mhz"])
        return Schedule.from_stage_freqs(
            np.asarray(starts), np.asarray(freqs), n_ops=n_ops, target=0.0, solver="issued"
        )

    def measure(
        self, workload: Workload, *, iteration: int | None = None, iterations: int = 2
    ) -> tuple[RunResult, RunResult]:
        """Run the issued switches and the top clock on the twin: (issued, top clock)."""
        plan = self.issued_schedule(len(workload), iteration)
        issued, _ = self.device.run(workload, plan, iterations=iterations, label="issued")
        top, _ = self.device.run(workload, iterations=iterations, label="top clock")
        return issued, top
