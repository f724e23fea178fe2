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

The use cases, which the CLI and ``tune`` call: :func:`plan_profile` plans a measured profile
(:mod:`opdvfs.plan.on_profile`: the clocks a profile should measure, :func:`auto_clocks`; models
fitted only where it did not measure), :func:`plan_ranks` a job from one profile per rank, and
:func:`plan_pipeline` a 1F1B or GPipe pipeline from a stage profile.
"""

from opdvfs.plan.on_profile import auto_clocks, plan_profile
from opdvfs.plan.pipeline import plan_pipeline
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
from opdvfs.plan.ranks import plan_ranks
from opdvfs.schedule import Schedule

__all__ = [
    "PlanInputs",
    "Predictions",
    "Schedule",
    "StageProblem",
    "auto_clocks",
    "plan_frontier",
    "plan_grouped",
    "plan_pipeline",
    "plan_profile",
    "plan_ranks",
    "plan_schedule",
    "predict",
    "stage_problem",
]
