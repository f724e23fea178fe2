"""Planning: from fitted models to a per-stage clock ``Schedule`` within a slowdown budget.

:class:`PlanInputs` holds what the planner needs besides the models (the device's clocks, the op
streams and idle time, optional classes), from a workload or a profile. :func:`plan_schedule`
plans the clocks (the exact, certified solver of :mod:`opdvfs.plan.dp`, or the paper's GA);
:func:`stage_problem` is its preprocessing step alone (classify, segment, stage tables, paper
§6.3), :func:`plan_frontier` the whole time-energy frontier, and :func:`plan_grouped` the coarse
baselines (one static clock, one clock per training phase). Inputs from a profile carry its
measurements, which every planner uses first (:mod:`opdvfs.plan.measured`); :mod:`opdvfs.plan.milp`
states the same problem for HiGHS (the reference the tests check against) and
:mod:`opdvfs.plan.pipeline` builds a pipeline stage's 1F1B chain from a stage profile.

The ranks of a pipeline-parallel job are planned together, on their dependency graph:
:mod:`opdvfs.plan.dag` states it (:class:`DagProblem`) and plans one clock per node, certified
(:func:`solve_dag`, and :func:`dag_frontier` for the frontier; a :class:`DagPlan`);
:mod:`opdvfs.plan.pipeline` builds the graph of a whole pipeline from a stage profile
(:func:`pipeline_dag`), and :mod:`opdvfs.plan.ranks` from each rank's own operator sequence
(:func:`rank_layout` of :class:`RankOps`).

The use cases, which the CLI and ``tune`` call: :func:`plan_profile` plans a measured profile
(:mod:`opdvfs.plan.on_profile`: the clocks a profile should measure, :func:`auto_clocks`; models
fitted only where it did not measure), :func:`plan_ranks` a job from one profile per rank, and
:func:`plan_pipeline` a 1F1B or GPipe pipeline from a stage profile.
"""

from opdvfs.plan.dag import DagPlan, DagProblem, dag_frontier, solve_dag
from opdvfs.plan.on_profile import auto_clocks, plan_profile
from opdvfs.plan.pipeline import pipeline_dag, plan_pipeline
from opdvfs.plan.planner import (
    PlanInputs,
    Predictions,
    StageProblem,
    plan_frontier,
    plan_grouped,
    plan_schedule,
    predict,
    stage_problem,
)
from opdvfs.plan.ranks import RankOps, plan_ranks, rank_layout
from opdvfs.schedule import Schedule

__all__ = [
    "DagPlan",
    "DagProblem",
    "PlanInputs",
    "Predictions",
    "RankOps",
    "Schedule",
    "StageProblem",
    "auto_clocks",
    "dag_frontier",
    "pipeline_dag",
    "plan_frontier",
    "plan_grouped",
    "plan_pipeline",
    "plan_profile",
    "plan_ranks",
    "plan_schedule",
    "predict",
    "rank_layout",
    "solve_dag",
    "stage_problem",
]
