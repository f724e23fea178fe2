"""A whole pipeline-parallel job on the twin: every rank under its own schedule, together.

The twin (:class:`~opdvfs.sim.twin.SimulatedDevice`) runs one device's op sequence; a pipeline's
ranks depend on each other only through their messages. :func:`run_pipeline` runs each rank on
its own simulated device under its own schedule, then composes the ranks on the job's
dependency graph (:func:`opdvfs.plan.ranks.rank_layout`: a receive starts once its send is
posted, barriers join every rank): each node of the graph lasts what the rank's run measured
it lasting, and starts when its predecessors have finished. Where a rank waits (blocked on a
receive, or done before the iteration ends) the wait goes back into that rank's run as idle
time before the op that waited (the end-of-iteration wait before op 0: the previous
iteration's tail), so the twin charges it at its idle power, at the clock in effect and
temperature of that moment; the rank is re-run and the graph re-composed until the waits stop
moving (a switch that lands inside a new wait changes the next op's time a little). The
iteration's makespan is the composed one; the energy is every rank's chip energy over it,
computing and waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opdvfs.exceptions import ValidationError
from opdvfs.plan.ranks import RankLayout, RankOps, rank_layout
from opdvfs.schedule import PipelineSchedule
from opdvfs.sim.twin import SimulatedDevice
from opdvfs.workloads.workload import Workload

__all__ = ["PipelineRun", "layout_of", "run_pipeline"]

#: Waits (s) that move less than this between two passes have converged.
_WAIT_TOL_S = 1e-6
#: Passes before giving up on convergence (the result says how far it was).
_MAX_PASSES = 6


@dataclass(frozen=True)
class PipelineRun:
    """One iteration of a whole pipeline on the twin.

    Attributes
    ----------
    makespan_s
        The iteration's time: the last node's end on the composed graph (s).
    energy_j
        Chip energy of every rank over the iteration, waiting included (J).
    compute_energy_j
        The part spent running ops (J).
    rank_energy_j, rank_busy_s, rank_wait_s
        Per rank: chip energy (J), time running ops and gaps of its own (s), time waiting for
        other ranks (s); busy + wait = makespan.
    switches
        Clock changes per rank.
    passes
        Run-and-compose passes made.
    residual_s
        Largest change of a wait in the last pass (s): 0 when converged exactly.
    """

    makespan_s: float
    energy_j: float
    compute_energy_j: float
    rank_energy_j: np.ndarray
    rank_busy_s: np.ndarray
    rank_wait_s: np.ndarray
    switches: np.ndarray
    passes: int
    residual_s: float

    @property
    def wait_power_w(self) -> float:
        """Mean chip power of a waiting rank (W): energy outside ops over time outside ops.

        What :mod:`opdvfs.plan.dag` calls the blocking power (``--blocking-power-w``).
        """
        outside_s = float(self.rank_wait_s.sum())
        if outside_s <= 0:
            return 0.0
        return (self.energy_j - self.compute_energy_j) / outside_s

    def summary(self) -> dict[str, Any]:
        """Return the JSON-ready figures."""
        return {
            "makespan_s": self.makespan_s,
            "energy_j": self.energy_j,
            "compute_energy_j": self.compute_energy_j,
            "rank_energy_j": self.rank_energy_j.tolist(),
            "rank_wait_s": self.rank_wait_s.tolist(),
            "wait_power_w": self.wait_power_w,
            "switches": int(self.switches.sum()),
            "passes": self.passes,
            "residual_s": self.residual_s,
        }


def layout_of(stages: Sequence[Workload], *, barrier: str | None = None) -> RankLayout:
    """Return the dependency graph of a whole pipeline's workloads (stage 0 first)."""
    return rank_layout([RankOps.from_frame(w.ops, w.name) for w in stages], barrier=barrier)


def run_pipeline(
    device: SimulatedDevice,
    stages: Sequence[Workload],
    schedule: PipelineSchedule | None = None,
    *,
    barrier: str | None = None,
    layout: RankLayout | None = None,
) -> PipelineRun:
    """Run one iteration of every rank under its own schedule and compose them (module doc).

    Parameters
    ----------
    device
        The simulated device every rank runs on; rank ``r`` draws its noise from seed
        ``device.seed + r``.
    stages
        Each rank's workload, rank 0 first, in pipeline order.
    schedule
        One schedule per rank (``schedule.stages[r]`` for rank ``r``); None: all at the top
        clock.
    barrier
        As :func:`opdvfs.plan.ranks.rank_layout`.
    layout
        The graph, when already built (:func:`layout_of`).
    """
    n_ranks = len(stages)
    if schedule is not None and len(schedule.stages) != n_ranks:
        raise ValidationError(
            f"the pipeline schedule has {len(schedule.stages)} rank schedules but the pipeline "
            f"{n_ranks} ranks",
            field="stages",
        )
    graph = layout if layout is not None else layout_of(stages, barrier=barrier)
    devices = [
        SimulatedDevice(device.spec, device.params, seed=device.seed + r) for r in range(n_ranks)
    ]
    base_gap_us = [w.ops["gap_before_us"].to_numpy(dtype=float) for w in stages]
    extra_us = [np.zeros(len(w)) for w in stages]
    firsts = [graph.node_first_op[graph.node_rank == r] for r in range(n_ranks)]
    lasts = [graph.node_last_op[graph.node_rank == r] for r in range(n_ranks)]
    residual = np.inf
    passes = 0
    while True:
        passes += 1
        node_s = np.zeros(graph.n_nodes)
        results = []
        for r, work in enumerate(stages):
            ops = work.ops
            ops["gap_before_us"] = base_gap_us[r] + extra_us[r]
            run = Workload(ops, name=work.name, meta=work.meta)
            mine = schedule.stages[r] if schedule is not None else None
            result, sim = devices[r].run(run, mine)
            exe = sim.execution
            # a node lasts from its first op's own gap to its last op's end
            node_s[graph.node_rank == r] = (
                base_gap_us[r][firsts[r]] + exe.end_us[lasts[r]] - exe.start_us[firsts[r]]
            ) * 1e-6
            results.append((result, sim))
        start = graph.start_times(node_s)
        end = start + node_s
        makespan = float(end.max())
        new_extra = []
        for r in range(n_ranks):
            mine = graph.node_rank == r
            prev_end = np.r_[0.0, end[mine][:-1]]
            wait = np.maximum(start[mine] - prev_end, 0.0)
            extra = np.zeros(len(stages[r]))
            extra[firsts[r]] = wait * 1e6
            extra[0] += (makespan - end[mine][-1]) * 1e6
            new_extra.append(extra)
        residual = max(float(np.abs(a - b).max()) for a, b in zip(new_extra, extra_us, strict=True))
        residual *= 1e-6
        if residual <= _WAIT_TOL_S or passes >= _MAX_PASSES:
            break
        extra_us = new_extra
    energy = np.array([res.chip_energy_j for res, _ in results])
    compute = float(sum(float(sim.op_chip_energy_j.sum()) for _, sim in results))
    wait_s = np.array([float(e.sum()) * 1e-6 for e in extra_us])
    return PipelineRun(
        makespan_s=makespan,
        energy_j=float(energy.sum()),
        compute_energy_j=compute,
        rank_energy_j=energy,
        rank_busy_s=makespan - wait_s,
        rank_wait_s=wait_s,
        switches=np.array([res.switches for res, _ in results]),
        passes=passes,
        residual_s=residual,
    )
