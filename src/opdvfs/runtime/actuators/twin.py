"""An actuator that drives the simulator: the switches a real run issued, replayed on the twin.

It records every call like the dry run (same JSON lines), and :meth:`TwinActuator.replay`
then runs the workload on the simulated device with the switches of one iteration exactly where
the executor issued them (op index, clock), so the effect of the real program's dispatch --
fallbacks included -- is measured on the twin, beside the top clock.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

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

    @property
    def kind(self) -> str:
        """``"twin"``."""
        return "twin"

    @property
    def preset(self) -> str:
        """The simulated device's preset."""
        return self.device.spec.name

    @property
    def twin(self) -> SimulatedDevice:
        """The simulated device the issued switches replay on (:attr:`device`)."""
        return self.device

    def issued_schedule(self, n_ops: int, iteration: int | None = None) -> Schedule:
        """Return the switches issued in ``iteration`` (default: the last with any) as a plan.

        Each switch is replayed where it was issued: at its op index (a switch issued by time,
        ``op_index`` None: the iteration's first op) plus its recorded ``offset_s``. The clock
        before the first switch is the one in effect when the iteration began (the last
        earlier switch, else the top clock). The stages' ``first_op`` are nominal (the op the
        switch was triggered at, kept increasing); the clocks come from the switches.
        """
        sets = [c for c in self.calls if c["kind"] == "set" and c["iteration"] is not None]
        if iteration is None:
            iteration = max((c["iteration"] for c in sets), default=0)
        before = [c for c in sets if c["iteration"] < iteration]
        first = before[-1]["freq_mhz"] if before else max(self.supported_freqs_mhz())
        starts, freqs = [0], [first]
        triggers, delays_us = [0], [0.0]
        for c in (c for c in sets if c["iteration"] == iteration):
            op = min(int(c["op_index"] or 0), n_ops - 1)
            delay_us = max(float(c.get("offset_s") or 0.0), 0.0) * 1e6
            if c["freq_mhz"] == freqs[-1]:
                continue
            if (op == triggers[-1] and delay_us == delays_us[-1]) or starts[-1] >= n_ops - 1:
                freqs[-1] = c["freq_mhz"]  # the same moment: the later request wins
                triggers[-1], delays_us[-1] = op, delay_us
                if len(freqs) > 1 and freqs[-1] == freqs[-2]:
                    for column in (starts, freqs, triggers, delays_us):
                        column.pop()
                continue
            starts.append(max(op, starts[-1] + 1))
            freqs.append(c["freq_mhz"])
            triggers.append(op)
            delays_us.append(delay_us)
        stages = [
            {"first_op": a, "last_op": b, "freq_mhz": f}
            for a, b, f in zip(
                starts, [*(s - 1 for s in starts[1:]), n_ops - 1], freqs, strict=True
            )
        ]
        switches = [
            {"trigger_op": t, "stage": k, "freq_mhz": f, "delay_us": d}
            for k, (t, f, d) in enumerate(zip(triggers, freqs, delays_us, strict=True))
        ]
        return Schedule.model_validate(
            {
                "n_ops": n_ops,
                "stages": stages,
                "switches": switches,
                "target": 0.0,
                "solver": "issued",
            }
        )

    def replay(
        self, workload: Workload, *, iteration: int | None = None, iterations: int = 2
    ) -> tuple[RunResult, RunResult]:
        """Run the issued switches and the top clock on the twin: (issued, top clock).

        As :meth:`Actuator.replay`: the switches of ``iteration`` (:meth:`issued_schedule`).
        """
        plan = self.issued_schedule(len(workload), iteration)
        issued, _ = self.device.run(workload, plan, iterations=iterations, label="issued")
        top, _ = self.device.run(workload, iterations=iterations, label="top clock")
        return issued, top
