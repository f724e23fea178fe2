"""``Schedule``: a per-stage core-clock plan for one iteration, and the switches that apply it.

A schedule divides the operators of one iteration (positions ``0 .. n_ops-1``) into contiguous
stages, each run at one clock. Every change of clock is one :class:`Switch`: issued when the
executor dispatches ``trigger_op`` and meant to land by the first operator of ``stage``. With
predictive dispatch the trigger precedes the stage (the switch latency is hidden, paper §5.3);
with reactive dispatch it is the stage's first operator.

The file is JSON with a published JSON Schema (``opdvfs schema schedule``). A pipeline-parallel
job planned as a whole gets a :class:`PipelineSchedule`: one ``Schedule`` per pipeline stage
(``opdvfs schema pipeline-schedule``).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Sequence
from typing import Literal, Self, get_args

import numpy as np
import pydantic
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from opdvfs._files import read_json
from opdvfs._model import FrozenModel
from opdvfs.exceptions import ScheduleFormatError, ValidationError

__all__ = [
    "DISPATCHES",
    "OBJECTIVES",
    "SOLVERS",
    "VALUES",
    "Dispatch",
    "Objective",
    "PipelineSchedule",
    "Schedule",
    "Solver",
    "Stage",
    "Switch",
    "Values",
    "on_launches",
    "op_signature",
    "read_any_schedule",
    "stage_of_rank",
]

#: What a plan minimises within its slowdown budget: chip energy, core (AICore) energy, mean
#: chip power, or the paper's eq. 17 score (best ``Per^2 / Power`` on the frontier).
Objective = Literal["energy", "core-energy", "power", "paper"]
#: When a switch is issued: ahead of its stage by the switch latency, or when the stage starts.
Dispatch = Literal["predictive", "reactive"]
#: The planner's search: the exact, certified programme or the paper's genetic algorithm.
Solver = Literal["dp", "ga"]
#: What the planner plans on: the profile's measurements where present and the models (corrected
#: through the measurements) elsewhere, the measurements only, or the models only (DESIGN §4).
Values = Literal["auto", "measured", "model"]

# The planner, the experiments and the CLI's choices all read these; the Literals are the one
# place the names are spelled.
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
DISPATCHES: tuple[Dispatch, ...] = get_args(Dispatch)
SOLVERS: tuple[Solver, ...] = get_args(Solver)
VALUES: tuple[Values, ...] = get_args(Values)


def op_signature(names: Iterable[str]) -> str:
    """Return a short stable hash of an operator-name sequence.

    The executor compares it (and then op by op) with the running program's sequence, and falls
    back to the maximum clock when they diverge.
    """
    # the hash of the names joined by newlines, fed a block of names at a time (a million
    # names joined and encoded whole held ~50 MB)
    hasher, names, sep = hashlib.sha256(), iter(names), ""
    while block := list(itertools.islice(names, 1 << 16)):
        hasher.update((sep + "\n".join(block)).encode())
        sep = "\n"
    return f"sha256:{hasher.hexdigest()[:16]}"


class Stage(FrozenModel):
    """Operators ``first_op .. last_op`` (inclusive) run at ``freq_mhz``.

    ``start_s``, when the planner knows it, is when the stage starts in the planned run
    (seconds from the iteration's start): the time-anchored executor (``--trigger time``)
    issues each switch at that offset minus the switch latency.
    """

    first_op: NonNegativeInt
    last_op: NonNegativeInt
    freq_mhz: PositiveFloat
    start_s: NonNegativeFloat | None = None

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.last_op < self.first_op:
            raise ValueError(f"last_op {self.last_op} is before first_op {self.first_op}")
        return self


class Switch(FrozenModel):
    """One clock change: issued at ``trigger_op``, to be in effect from stage ``stage``.

    ``delay_us`` after the trigger op starts, the request is issued (0: at once), so that a
    switch whose latency does not fall on an op boundary still lands when its stage begins.
    With ``previous_iteration`` the trigger op is one of the *previous* iteration (training
    repeats its iterations): a stage that begins less than the switch latency into the
    iteration is still served on time. In the first iteration such a switch is issued at op 0.
    """

    trigger_op: NonNegativeInt
    stage: NonNegativeInt
    freq_mhz: PositiveFloat
    delay_us: NonNegativeFloat = 0.0
    previous_iteration: bool = False


class Schedule(FrozenModel):
    """A frequency schedule for one iteration of a workload.

    Parameters
    ----------
    n_ops
        Operators per iteration the schedule was planned for.
    stages
        Contiguous stages covering ``0 .. n_ops-1`` in order.
    switches
        One per stage whose clock differs from the previous stage's, plus one for stage 0 (the
        initial clock), in stage order; ``trigger_op`` is not after the stage's first operator.
    target
        Allowed slowdown as a fraction of the baseline time (0.02 = at most 2% slower).
    baseline_time_s, predicted_time_s, baseline_energy_j, predicted_energy_j
        Per iteration, at the maximum clock and under this schedule (chip energy), on the
        values planned on (``values``).
    baseline_core_energy_j, predicted_core_energy_j
        The same on the core rail; None where neither measured nor modelled.
    values
        What the plan was computed on: ``auto`` (measured where the profile measured, the
        models corrected through the measurements elsewhere), ``measured`` or ``model``; None
        for a schedule not from the planner.
    measured_baseline_time_s, measured_time_s, measured_baseline_energy_j, measured_energy_j
        Per iteration, at the maximum clock and under this schedule, on the profile's
        measurements (raw medians over iterations, never smoothed across clocks), where the
        profile measured every op at the top clock and at its planned clock; None otherwise.
    measured_baseline_core_energy_j, measured_core_energy_j
        The same on the core rail, where the profile measured core power.
    conservative_time_s
        Per iteration, the plan's time on the conservative values it met its budget on: each
        cell's time at its upper quantile (a model-filled cell's leave-one-clock-out error times
        :data:`~opdvfs.plan.planner.TIME_QUANTILE_Z`, a measured cell's standard error times
        :data:`~opdvfs.plan.planner.MEASURED_NOISE_Z` above ``predicted``;
        :func:`~opdvfs.plan.measured.log_uncertainty`); None where no uncertainty is known.
    model_share
        Share of the plan's predicted time (0-1) on cells the models filled (clocks the profile
        did not measure for that op); None where not planned on a profile.
    lower_bound_energy_j, gap_pct
        Certified lower bound and optimality gap (exact solver) on the objective's rail; None
        for heuristics.
    lower_bound_power_w
        For the ``power`` objective, the certified lower bound on mean operator power (W) that
        ``gap_pct`` refers to; ``lower_bound_energy_j`` is then None (no energy bound follows).
    """

    format: Literal["opdvfs.schedule"] = "opdvfs.schedule"
    version: Literal[1] = 1
    n_ops: PositiveInt
    stages: tuple[Stage, ...] = Field(min_length=1)
    switches: tuple[Switch, ...] = Field(min_length=1)
    target: NonNegativeFloat
    objective: Objective = "energy"
    solver: str = Field(min_length=1)
    dispatch: Dispatch = "predictive"
    switch_latency_ms: NonNegativeFloat = 0.0
    interval_ms: NonNegativeFloat | None = None
    device: str | None = None
    workload: str | None = None
    op_signature: str | None = None
    baseline_time_s: NonNegativeFloat | None = None
    predicted_time_s: NonNegativeFloat | None = None
    baseline_energy_j: NonNegativeFloat | None = None
    predicted_energy_j: NonNegativeFloat | None = None
    baseline_core_energy_j: NonNegativeFloat | None = None
    predicted_core_energy_j: NonNegativeFloat | None = None
    values: Values | None = None
    measured_baseline_time_s: NonNegativeFloat | None = None
    measured_time_s: NonNegativeFloat | None = None
    measured_baseline_energy_j: NonNegativeFloat | None = None
    measured_energy_j: NonNegativeFloat | None = None
    measured_baseline_core_energy_j: NonNegativeFloat | None = None
    measured_core_energy_j: NonNegativeFloat | None = None
    conservative_time_s: NonNegativeFloat | None = None
    model_share: NonNegativeFloat | None = None
    lower_bound_energy_j: NonNegativeFloat | None = None
    lower_bound_power_w: NonNegativeFloat | None = None
    gap_pct: NonNegativeFloat | None = None
    plan_seconds: NonNegativeFloat | None = None

    file_error = ScheduleFormatError

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Self:
        expect = 0
        for i, stage in enumerate(self.stages):
            if stage.first_op != expect:
                raise ValueError(
                    f"stages[{i}] starts at op {stage.first_op}; expected {expect} "
                    "(stages must be contiguous from op 0)"
                )
            expect = stage.last_op + 1
        if expect != self.n_ops:
            raise ValueError(
                f"stages end at op {expect - 1}; expected n_ops - 1 = {self.n_ops - 1}"
            )
        changes = [0] + [
            i
            for i in range(1, len(self.stages))
            if self.stages[i].freq_mhz != self.stages[i - 1].freq_mhz
        ]
        got = [s.stage for s in self.switches]
        if got != changes:
            raise ValueError(
                f"switches serve stages {got}; expected one for stage 0 and for every stage whose "
                f"clock changes: {changes}"
            )
        wrapped = [sw.previous_iteration for sw in self.switches]
        n_wrapped = wrapped.index(False) if False in wrapped else len(wrapped)
        if any(wrapped[n_wrapped:]):
            raise ValueError(
                "switches issued in the previous iteration must come first (the iteration's "
                "earliest stages)"
            )
        prev_trigger = 0
        for k, sw in enumerate(self.switches):
            stage = self.stages[sw.stage]
            if sw.freq_mhz != stage.freq_mhz:
                raise ValueError(
                    f"switches[{k}] sets {sw.freq_mhz:g} MHz but stage {sw.stage} runs at "
                    f"{stage.freq_mhz:g} MHz"
                )
            if k < n_wrapped:
                continue
            if sw.trigger_op > stage.first_op or sw.trigger_op < prev_trigger:
                raise ValueError(
                    f"switches[{k}].trigger_op {sw.trigger_op} must be between the previous "
                    f"trigger ({prev_trigger}) and stage {sw.stage}'s first op ({stage.first_op})"
                )
            prev_trigger = sw.trigger_op
        for k, sw in enumerate(self.switches[:n_wrapped]):
            # issued after every switch of the previous iteration, in order, within it
            if not prev_trigger <= sw.trigger_op < self.n_ops:
                raise ValueError(
                    f"switches[{k}] (previous iteration) trigger_op {sw.trigger_op} must be "
                    f"between the last trigger of the iteration ({prev_trigger}) and n_ops - 1"
                )
            prev_trigger = sw.trigger_op
        return self

    @classmethod
    def from_stage_freqs(
        cls,
        boundaries: np.ndarray | list[int],
        freqs_mhz: np.ndarray | list[float],
        *,
        n_ops: int,
        lead_ops: np.ndarray | list[int] | None = None,
        delay_us: np.ndarray | list[float] | None = None,
        start_s: np.ndarray | list[float] | None = None,
        **fields: object,
    ) -> Schedule:
        """Build a schedule from stage start positions and per-stage clocks.

        Parameters
        ----------
        boundaries
            First op of each stage, ascending, starting at 0.
        freqs_mhz
            Clock of each stage.
        n_ops
            Operators per iteration.
        lead_ops
            For each stage, how many operators before its first op the switch is issued
            (predictive dispatch); 0 by default. A lead beyond the stage's first op reaches
            into the previous iteration (``Switch.previous_iteration``); triggers are clipped so
            that they stay ordered.
        delay_us
            For each stage, how long after its trigger op starts the switch is issued; 0 by
            default.
        start_s
            For each stage, when it starts in the planned run (s); unknown (None) by default.
        fields
            Other :class:`Schedule` fields (``target``, ``solver``, predictions ...).
        """
        starts = np.asarray(boundaries, dtype=int)
        freqs = np.asarray(freqs_mhz, dtype=float)
        ends = np.append(starts[1:] - 1, n_ops - 1)
        begins: list[float | None] = (
            [None] * len(starts) if start_s is None else [float(t) for t in start_s]
        )
        stages = tuple(
            Stage(first_op=int(a), last_op=int(b), freq_mhz=float(f), start_s=t)
            for a, b, f, t in zip(starts, ends, freqs, begins, strict=True)
        )
        change = np.flatnonzero(np.r_[True, freqs[1:] != freqs[:-1]])
        lead = np.zeros(len(starts), dtype=int) if lead_ops is None else np.asarray(lead_ops)
        raw = starts[change] - lead[change]
        wrap = np.logical_and.accumulate(raw < 0)  # only the earliest stages reach back
        triggers = np.where(wrap, raw + n_ops, np.maximum(raw, 0))
        # in time order the wrapped prefix fires after the rest (in the previous iteration's tail)
        k = int(wrap.sum())
        ordered = np.roll(np.maximum.accumulate(np.roll(triggers, -k)), k)
        delay = np.zeros(len(starts)) if delay_us is None else np.asarray(delay_us, dtype=float)
        # a trigger moved later to keep the order issues at once
        delays = np.where(ordered == triggers, delay[change], 0.0)
        switches = tuple(
            Switch(
                trigger_op=int(t),
                stage=int(s),
                freq_mhz=float(freqs[s]),
                delay_us=float(d),
                previous_iteration=bool(w),
            )
            for t, s, d, w in zip(ordered, change, delays, wrap, strict=True)
        )
        return cls.model_validate(
            {"n_ops": n_ops, "stages": stages, "switches": switches, **fields}
        )

    def freq_per_op_mhz(self) -> np.ndarray:
        """Return the planned clock of every operator, shape (n_ops,)."""
        lengths = [s.last_op - s.first_op + 1 for s in self.stages]
        return np.repeat([s.freq_mhz for s in self.stages], lengths)

    @property
    def n_switches(self) -> int:
        """Clock changes per iteration, not counting the initial setting."""
        return len(self.switches) - 1


def on_launches(
    schedule: Schedule, op_ids: Sequence[int] | np.ndarray, n_launches: int
) -> Schedule:
    """Re-index a schedule planned on a swept profile's kernels onto every operator launched.

    A simulated GPU's swept profile has a row per *kernel*; its ``op`` column is the kernel's
    position among all the operators the iteration dispatches (views and allocations, which
    start no kernel, counted), the positions the operator-counting executor counts. The
    planner numbers the profile's operators densely (``0 .. len(op_ids) - 1``); this maps that
    plan back: operator ``k`` is launch ``op_ids[k]``, each stage from its first kernel's
    launch to the launch before the next stage's, the first stage from launch 0 and the last
    to ``n_launches - 1`` (the kernel-less launches between two kernels run with the stage
    before; they take no time). A switch triggered at operator ``k`` is triggered at launch
    ``op_ids[k]`` (``op_ids[0]`` counts as launch 0), its delay unchanged.

    Parameters
    ----------
    schedule
        Planned on the profile (``schedule.n_ops == len(op_ids)``).
    op_ids
        The profile's operator positions, ascending (``Profile.time_matrix_us()[0]``).
    n_launches
        Operators dispatched per iteration (the captured workload's length).

    Raises
    ------
    ValidationError
        If the schedule's length is not ``len(op_ids)``, or the positions are not ascending
        within ``0 .. n_launches - 1``.
    """
    ids = np.asarray(op_ids, dtype=np.int64).copy()
    if len(ids) != schedule.n_ops:
        raise ValidationError(
            f"the schedule plans {schedule.n_ops} operators, the profile has {len(ids)}",
            field="n_ops",
        )
    if np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= n_launches:
        raise ValidationError(
            f"operator positions must ascend within 0..{n_launches - 1}", field="op_ids"
        )
    ids[0] = 0
    stages = schedule.stages
    nexts = [int(ids[st.first_op]) for st in stages[1:]] + [n_launches]
    doc = schedule.model_dump()
    doc["n_ops"] = n_launches
    doc["op_signature"] = None
    doc["stages"] = [
        {**st.model_dump(), "first_op": int(ids[st.first_op]), "last_op": end - 1}
        for st, end in zip(stages, nexts, strict=True)
    ]
    doc["switches"] = [
        {**sw.model_dump(), "trigger_op": int(ids[sw.trigger_op])} for sw in schedule.switches
    ]
    return Schedule.model_validate(doc)


def stage_of_rank(rank: int, world_size: int, n_stages: int, rank_map: Sequence[int] | None) -> int:
    """Return the pipeline stage that rank ``rank`` runs.

    With ``rank_map`` (the stage of every rank, in rank order) it is looked up there; without,
    ranks are split into ``n_stages`` contiguous blocks, the layout of Megatron-LM and of
    ``torch.distributed.pipelining`` with the pipeline as the outermost dimension (rank r of W
    runs stage ``r * n_stages // W``): data-parallel and tensor-parallel replicas of a stage
    share its schedule.

    Raises
    ------
    ValidationError
        If the map is too short or names a stage the schedule does not have, or the world size
        is not a multiple of the stages.
    """
    if rank_map is not None:
        if rank >= len(rank_map):
            raise ValidationError(
                f"--rank-map gives {len(rank_map)} ranks' stages, but this is rank {rank}",
                field="rank_map",
            )
        stage = int(rank_map[rank])
        if not 0 <= stage < n_stages:
            raise ValidationError(
                f"--rank-map sends rank {rank} to stage {stage}; the schedule has stages "
                f"0-{n_stages - 1}",
                field="rank_map",
            )
        return stage
    if world_size % n_stages:
        raise ValidationError(
            f"{world_size} ranks do not split into the schedule's {n_stages} pipeline stages: "
            "give --rank-map (the stage of each rank)",
            field="rank_map",
        )
    return rank * n_stages // world_size


class PipelineSchedule(FrozenModel):
    """One :class:`Schedule` per pipeline stage of a pipeline-parallel job, planned together.

    The stages' schedules come from one plan of the whole job's dependency graph
    (:mod:`opdvfs.plan.dag`): each is meant for the ranks that run its stage, and only
    together do they meet the makespan. ``opdvfs run`` gives each rank its stage's schedule
    (:meth:`for_rank`). Each stage's operators are its instructions (forward/backward per
    microbatch) in its execution order.

    Parameters
    ----------
    stages
        Schedule of each pipeline stage, stage 0 first.
    pipeline
        The pipeline schedule planned (``1f1b`` or ``gpipe``).
    n_microbatches
        Microbatches per iteration.
    target
        Allowed makespan slowdown over all-max.
    blocking_power_w
        The power a waiting rank draws, charged in the energies (Perseus's effective energy:
        each rank draws it whenever it is not computing until the iteration ends).
    baseline_makespan_s, predicted_makespan_s
        Iteration time of the whole pipeline at the top clocks and under the plan.
    baseline_energy_j, predicted_energy_j
        Energy of one iteration of the whole pipeline (one replica), computation plus waiting.
    lower_bound_energy_j, gap_pct
        Certified lower bound on ``predicted_energy_j`` of any plan within the deadline, and
        the plan's gap above it (%).
    rank_map
        Pipeline stage of each rank, when the planner was told; else contiguous blocks.
    """

    format: Literal["opdvfs.pipeline-schedule"] = "opdvfs.pipeline-schedule"
    version: Literal[1] = 1
    stages: tuple[Schedule, ...] = Field(min_length=1)
    pipeline: str = Field(min_length=1)
    n_microbatches: PositiveInt
    target: NonNegativeFloat
    solver: str = Field(min_length=1)
    device: str | None = None
    workload: str | None = None
    blocking_power_w: NonNegativeFloat = 0.0
    baseline_makespan_s: NonNegativeFloat | None = None
    predicted_makespan_s: NonNegativeFloat | None = None
    baseline_energy_j: NonNegativeFloat | None = None
    predicted_energy_j: NonNegativeFloat | None = None
    lower_bound_energy_j: NonNegativeFloat | None = None
    gap_pct: NonNegativeFloat | None = None
    plan_seconds: NonNegativeFloat | None = None
    rank_map: tuple[NonNegativeInt, ...] | None = None

    file_error = ScheduleFormatError

    def stage_of(self, rank: int, world_size: int, rank_map: Sequence[int] | None = None) -> int:
        """Return rank ``rank``'s stage (``rank_map`` first, then the file's, then blocks)."""
        chosen = rank_map if rank_map is not None else self.rank_map
        return stage_of_rank(rank, world_size, len(self.stages), chosen)

    def for_rank(
        self, rank: int, world_size: int, rank_map: Sequence[int] | None = None
    ) -> Schedule:
        """Return the schedule that rank ``rank`` of ``world_size`` applies."""
        return self.stages[self.stage_of(rank, world_size, rank_map)]


def read_any_schedule(path: str | os.PathLike[str]) -> Schedule | PipelineSchedule:
    """Read a schedule or a pipeline schedule file (by its ``format`` tag)."""
    doc = read_json(path, ScheduleFormatError)
    if isinstance(doc, dict) and doc.get("format") == "opdvfs.pipeline-schedule":
        return PipelineSchedule.read(path)
    return Schedule.read(path)
