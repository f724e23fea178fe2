"""One pipeline stage's instruction chain (1F1B) from a per-instruction stage profile.

Pipeline-parallel profiles such as Perseus's (:mod:`opdvfs.io.perseus`) measure each stage's
forward and backward computation of one microbatch at every clock, as operators named
``stage{s}.forward`` and ``stage{s}.backward``. A stage runs them once per microbatch, in the
1F1B order (Narayanan et al., PipeDream-Flush, SC'21): ``n_stages - s - 1`` warm-up forwards,
then alternating one forward and one backward, then the remaining backwards. On one stage the
chain's time and energy are sums, so the order does not change the optimum; it fixes which
instruction a clock switch follows.

:func:`plan_pipeline` is the use case ``opdvfs plan --pipeline 1f1b|gpipe``: every stage of the
pipeline planned together on its dependency graph (:func:`pipeline_dag`,
:func:`~opdvfs.plan.dag.solve_dag`), into one :class:`~opdvfs.schedule.PipelineSchedule`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from opdvfs.exceptions import InfeasibleError, ValidationError
from opdvfs.plan._dag_problem import _pass_names
from opdvfs.plan.dag import TIME_LIMIT_S, DagPlan, DagProblem, dag_frontier, solve_dag
from opdvfs.plan.dp import gap_pct
from opdvfs.profile import Profile
from opdvfs.schedule import PipelineSchedule, Schedule

__all__ = [
    "FRONTIER_TARGETS",
    "PIPELINE_KINDS",
    "PipelinePlan",
    "gpipe",
    "one_f_one_b",
    "pipeline_dag",
    "pipeline_graph",
    "pipeline_schedule",
    "plan_pipeline",
    "stage_chain",
]

#: The synchronous pipeline schedules :func:`pipeline_graph` builds.
PIPELINE_KINDS = ("1f1b", "gpipe")
#: The slowdowns a whole job's frontier is planned at (0-30% in 1% steps; ``plan --frontier``).
FRONTIER_TARGETS = tuple(i / 100 for i in range(31))

_STAGE_OP = re.compile(r"^stage(\d+)\.(forward|backward)$")


def one_f_one_b(stage: int, n_stages: int, n_microbatches: int) -> list[str]:
    """Return stage ``stage``'s instructions (``forward``/``backward``) in 1F1B order.

    Parameters
    ----------
    stage
        Pipeline stage, 0-based.
    n_stages
        Pipeline stages.
    n_microbatches
        Microbatches per iteration.
    """
    warmup = min(n_stages - stage - 1, n_microbatches)
    steady = n_microbatches - warmup
    return (
        ["forward"] * warmup
        + ["forward", "backward"] * steady
        + ["backward"] * (n_microbatches - steady)
    )


def gpipe(stage: int, n_stages: int, n_microbatches: int) -> list[str]:
    """Return a stage's instructions in GPipe order (Huang et al., NeurIPS'19).

    Every forward, then every backward (microbatch order both times; every stage alike).
    """
    del stage, n_stages
    return ["forward"] * n_microbatches + ["backward"] * n_microbatches


def _order(kind: str) -> Callable[[int, int, int], list[str]]:
    if kind not in PIPELINE_KINDS:
        raise ValidationError(
            f"pipeline schedule {kind!r}: expected one of {', '.join(PIPELINE_KINDS)}",
            field="pipeline",
        )
    return one_f_one_b if kind == "1f1b" else gpipe


def pipeline_graph(
    forward_time_s: np.ndarray,
    forward_energy_j: np.ndarray,
    backward_time_s: np.ndarray,
    backward_energy_j: np.ndarray,
    freqs_mhz: np.ndarray,
    n_microbatches: int,
    *,
    kind: str = "1f1b",
    blocking_power_w: float = 0.0,
) -> DagProblem:
    """Return the dependency graph of one synchronous pipeline iteration.

    Node ``forward{m}`` / ``backward{m}`` of stage ``s`` (rank ``s``) runs stage ``s``'s
    forward or backward of microbatch ``m``. Edges: each stage's own order (1F1B or GPipe);
    the activation send ``forward m`` of stage s -> of stage s+1; the gradient send
    ``backward m`` of stage s+1 -> of stage s; and on the last stage its forward of m before
    its backward of m. Sends take no time (Perseus's emulator: compute-bound stages).

    Parameters
    ----------
    forward_time_s, forward_energy_j, backward_time_s, backward_energy_j
        Per stage and clock (n_stages, n_clocks); NaN where a clock is unavailable.
    freqs_mhz
        The clocks, ascending (MHz).
    n_microbatches
        Microbatches per iteration.
    kind
        ``1f1b`` or ``gpipe``.
    blocking_power_w
        Power of a waiting rank (W); see :mod:`opdvfs.plan.dag`.
    """
    order = _order(kind)
    n_stages = int(np.shape(forward_time_s)[0])
    if n_microbatches < 1 or n_stages < 1:
        raise ValidationError(
            "a pipeline needs >= 1 stage and >= 1 microbatch", field="n_microbatches"
        )
    per_stage = 2 * n_microbatches
    kinds = np.array([order(s, n_stages, n_microbatches) for s in range(n_stages)])
    is_fwd = kinds == "forward"
    micro = np.where(is_fwd, np.cumsum(is_fwd, axis=1) - 1, np.cumsum(~is_fwd, axis=1) - 1)
    node = np.arange(n_stages * per_stage).reshape(n_stages, per_stage)
    # node id of (stage, forward?, microbatch)
    where = np.empty((n_stages, 2, n_microbatches), dtype=np.int64)
    stage_ix = np.repeat(np.arange(n_stages), per_stage)
    where[stage_ix, (~is_fwd).ravel().astype(int), micro.ravel()] = node.ravel()
    own = np.c_[node[:, :-1].ravel(), node[:, 1:].ravel()]
    sends = np.c_[where[:-1, 0].ravel(), where[1:, 0].ravel()]
    grads = np.c_[where[1:, 1].ravel(), where[:-1, 1].ravel()]
    turn = np.c_[where[-1, 0], where[-1, 1]]
    edges = np.unique(np.r_[own, sends, grads, turn], axis=0)
    rows = np.where(is_fwd.ravel()[:, None], 0, 1)
    table_t = np.stack([np.asarray(forward_time_s), np.asarray(backward_time_s)])
    table_e = np.stack([np.asarray(forward_energy_j), np.asarray(backward_energy_j)])
    return DagProblem(
        time_s=table_t[rows[:, 0], stage_ix],
        energy_j=table_e[rows[:, 0], stage_ix],
        freqs_mhz=np.asarray(freqs_mhz, dtype=float),
        edges=edges,
        rank=stage_ix,
        names=_pass_names(~is_fwd.ravel(), micro.ravel()),
        blocking_power_w=blocking_power_w,
    )


def pipeline_dag(
    profile: Profile,
    n_microbatches: int = 8,
    *,
    kind: str = "1f1b",
    blocking_power_w: float = 0.0,
) -> DagProblem:
    """Return a whole pipeline's graph from a stage profile (e.g. a Perseus CSV), measured.

    The per-clock time and energy of each stage's forward and backward are the profile's
    medians over iterations (:class:`~opdvfs.plan.measured.MeasuredTables`), not smoothed
    across clocks: the deadline is a makespan on the measured times; a clock a stage was not
    measured at is unavailable to it.

    Raises
    ------
    ValidationError
        If the profile is not a stage profile, or a stage lacks its forward or backward.
    """
    from opdvfs.plan.measured import MeasuredTables

    table = MeasuredTables.from_profile(profile, shrink=False)
    parsed = pd.Series(table.names).str.extract(_STAGE_OP)
    if parsed[0].isna().any():
        bad = table.names[int(np.flatnonzero(parsed[0].isna())[0])]
        raise ValidationError(
            f"op {bad!r} is not named stage<s>.forward / stage<s>.backward: not a stage profile",
            field="name",
        )
    stages = parsed[0].astype(int).to_numpy()
    backward = (parsed[1] == "backward").to_numpy()
    n_stages = int(stages.max()) + 1
    shape = (n_stages, len(table.freqs_mhz))
    time_s = np.full((2, *shape), np.nan)
    energy = np.full((2, *shape), np.nan)
    time_s[backward.astype(int), stages] = table.time_us * 1e-6
    energy[backward.astype(int), stages] = table.chip_energy_j
    missing = np.isnan(time_s).all(axis=2)
    if missing.any():
        which, stage = np.argwhere(missing)[0]
        raise ValidationError(
            f"stage {stage} has no {('forward', 'backward')[which]} in the profile", field="name"
        )
    return pipeline_graph(
        time_s[0],
        energy[0],
        time_s[1],
        energy[1],
        table.freqs_mhz,
        n_microbatches,
        kind=kind,
        blocking_power_w=blocking_power_w,
    )


def stage_chain(profile: Profile, stage: int, n_microbatches: int = 8) -> Profile:
    """Return the profile of stage ``stage``'s 1F1B chain: one op per instruction and microbatch.

    Every op of the chain carries the measured rows (every clock and iteration) of its
    instruction; ops are named ``forward{m}`` / ``backward{m}`` for microbatch ``m``.

    Parameters
    ----------
    profile
        A stage profile whose ops are named ``stage{s}.forward`` / ``stage{s}.backward``.
    stage
        The pipeline stage, 0-based.
    n_microbatches
        Microbatches per iteration (the chain has twice as many instructions).

    Raises
    ------
    ValidationError
        If the profile holds no op of that stage.
    """
    rows = profile.ops
    parsed = rows["name"].str.extract(_STAGE_OP)
    if parsed[0].isna().all():
        raise ValidationError(
            "no op named stage<s>.forward / stage<s>.backward: not a stage profile", field="name"
        )
    n_stages = int(parsed[0].dropna().astype(int).max()) + 1
    mine = rows[parsed[0].astype(float).to_numpy() == stage]
    if mine.empty:
        raise ValidationError(
            f"stage {stage} is not in the profile (stages 0-{n_stages - 1})", field="stage"
        )
    order = one_f_one_b(stage, n_stages, n_microbatches)
    kinds = np.asarray(order)
    # microbatch index of each instruction: its rank among the instructions of its kind
    micro = np.zeros(len(kinds), dtype=int)
    for kind in ("forward", "backward"):
        micro[kinds == kind] = np.arange(int((kinds == kind).sum()))
    chain = pd.DataFrame(
        {
            "op": np.arange(len(kinds)),
            "name": _pass_names(kinds == "backward", micro),
            "instruction": kinds,
        }
    )
    measured = mine.drop(columns=["op", "name"]).assign(
        instruction=mine["name"].str.rsplit(".", n=1).str[-1].to_numpy()
    )
    table = chain.merge(measured, on="instruction").drop(columns="instruction")
    meta = {**profile.meta, "workload": f"stage {stage} of {n_stages}, 1F1B x{n_microbatches}"}
    return Profile(table, meta=meta)


def rank_energy_j(
    problem: DagProblem, clock: np.ndarray, makespan_s: float, mine: np.ndarray
) -> float:
    """Return one rank's effective energy (J) in an iteration of ``makespan_s`` seconds.

    Its nodes (``mine``, a mask over the graph's nodes) at their ``clock`` indices, plus the
    blocking power for every second of the makespan the rank is not computing (Perseus's
    effective energy, the DAG planner's objective per rank).
    """
    rows = np.flatnonzero(mine)
    busy_s = problem.time_s[rows, clock[rows]].sum()
    energy_j = problem.energy_j[rows, clock[rows]].sum()
    return float(energy_j + problem.blocking_power_w * (makespan_s - busy_s))


def pipeline_file(
    problem: DagProblem,
    plan: DagPlan,
    schedules: Sequence[Schedule],
    *,
    pipeline: str,
    n_microbatches: int,
    target: float,
    device: str | None,
    workload: str | None,
    clock: np.ndarray | None = None,
    rank_map: tuple[int, ...] | None = None,
) -> PipelineSchedule:
    """Return the file of per-rank ``schedules``, with the whole pipeline's totals.

    ``clock`` is the plan as it will run (default ``plan.clock``; the ranks builder adjusts
    it): the predicted makespan, energy and gap are its own, the baseline is all-max.
    """
    base_makespan, base_energy, _ = problem.evaluate(problem.top_clock())
    makespan_s, energy_j, _ = problem.evaluate(plan.clock if clock is None else clock)
    return PipelineSchedule(
        stages=tuple(schedules),
        pipeline=pipeline,
        n_microbatches=n_microbatches,
        target=target,
        solver=f"dag ({plan.method})",
        device=device,
        workload=workload,
        blocking_power_w=problem.blocking_power_w,
        baseline_makespan_s=float(base_makespan),
        predicted_makespan_s=float(makespan_s),
        baseline_energy_j=float(base_energy),
        predicted_energy_j=float(energy_j),
        lower_bound_energy_j=max(plan.lower_bound_j, 0.0),
        gap_pct=gap_pct(float(energy_j), plan.lower_bound_j),
        plan_seconds=plan.plan_seconds,
        rank_map=rank_map,
    )


def pipeline_schedule(
    problem: DagProblem,
    plan: DagPlan,
    *,
    target: float,
    kind: str,
    n_microbatches: int,
    device: str | None = None,
    workload: str | None = None,
    rank_map: tuple[int, ...] | None = None,
) -> PipelineSchedule:
    """Return the per-stage schedules of a plan of a pipeline graph (:func:`pipeline_graph`).

    Stage ``s``'s schedule runs its instructions in execution order (the graph's node order on
    rank ``s``), one schedule stage per run of equal clocks, each with its planned start. Its
    time and energy fields are the stage's share of one iteration: the whole pipeline's
    makespan, and the stage's computation plus its waiting at the blocking power.
    """
    top = problem.top_clock()
    base_makespan = problem.evaluate(top)[0]

    schedules = []
    for stage in range(problem.n_ranks):
        mine = problem.rank == stage
        freqs = plan.freq_mhz[mine]
        first = np.flatnonzero(np.r_[True, freqs[1:] != freqs[:-1]])
        schedules.append(
            Schedule.from_stage_freqs(
                first,
                freqs[first],
                n_ops=int(mine.sum()),
                start_s=plan.start_s[mine][first],
                target=target,
                solver="dag",
                device=device,
                workload=f"{workload or 'pipeline'}: stage {stage} of {problem.n_ranks}, "
                f"{kind} x{n_microbatches}",
                values="measured",
                baseline_time_s=float(base_makespan),
                predicted_time_s=plan.makespan_s,
                baseline_energy_j=rank_energy_j(problem, top, float(base_makespan), mine),
                predicted_energy_j=rank_energy_j(problem, plan.clock, plan.makespan_s, mine),
                plan_seconds=plan.plan_seconds,
            )
        )
    return pipeline_file(
        problem,
        plan,
        schedules,
        pipeline=kind,
        n_microbatches=n_microbatches,
        target=target,
        device=device,
        workload=workload,
        rank_map=rank_map,
    )


@dataclass(frozen=True)
class PipelinePlan:
    """A whole job planned on its dependency graph (:func:`plan_pipeline`, ``plan_ranks``).

    Attributes
    ----------
    schedule
        One schedule per pipeline stage (or rank).
    problem
        The graph planned (per-clock tables, edges, deadline's baseline).
    plan
        The solver's plan of it (clocks, start times, bound and gap).
    """

    schedule: PipelineSchedule
    problem: DagProblem
    plan: DagPlan

    def frontier(self, targets: Sequence[float] = FRONTIER_TARGETS) -> pd.DataFrame:
        """Return the time-energy frontier of the same graph at ``targets`` (``--frontier``)."""
        return dag_frontier(self.problem, list(targets))


def plan_pipeline(
    profile: Profile,
    target: float,
    *,
    microbatches: int = 8,
    kind: str = "1f1b",
    blocking_power_w: float = 0.0,
    device: str | None = None,
    time_limit_s: float | None = None,
    source: str | None = None,
) -> PipelinePlan:
    """Plan every stage of a pipeline together on its dependency graph: ``plan --pipeline``.

    Parameters
    ----------
    profile
        A measured stage profile (ops ``stage<s>.forward`` / ``stage<s>.backward``, e.g. a
        Perseus CSV).
    target
        The allowed slowdown of the makespan (0.02 = 2%).
    microbatches, kind, blocking_power_w
        :func:`pipeline_dag`'s: microbatches per iteration, the schedule (``1f1b``, ``gpipe``),
        and the power (W) a stage draws while it waits.
    device
        The device named in the schedule (default: the profile's).
    time_limit_s
        Seconds the planner may search (default :data:`~opdvfs.plan.dag.TIME_LIMIT_S`).
    source
        The profile's file, named in errors and (its name) in the schedule's workload.

    Raises
    ------
    InfeasibleError
        When no plan meets the slowdown.
    """
    problem = pipeline_dag(profile, microbatches, kind=kind, blocking_power_w=blocking_power_w)
    plan = solve_dag(problem, target, time_limit_s=time_limit_s or TIME_LIMIT_S)
    if plan.status == "infeasible":
        what = source or "the pipeline"
        raise InfeasibleError(f"no plan of {what} meets a {target:.2%} slowdown")
    recorded = profile.meta.get("device")
    schedule = pipeline_schedule(
        problem,
        plan,
        target=target,
        kind=kind,
        n_microbatches=microbatches,
        device=device or (str(recorded) if recorded else None),
        workload=Path(source).name if source is not None else None,
    )
    return PipelinePlan(schedule, problem, plan)
