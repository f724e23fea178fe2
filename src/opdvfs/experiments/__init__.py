"""End-to-end experiments on the simulated accelerator: the demo and the paper's suite."""

from opdvfs.experiments.bench import Bench, Outcome, measure, prepare
from opdvfs.experiments.suites import (
    SuiteResult,
    plan_and_measure,
    run_demo,
    run_paper_suite,
)

__all__ = [
    "Bench",
    "Outcome",
    "SuiteResult",
    "measure",
    "plan_and_measure",
    "prepare",
    "run_demo",
    "run_paper_suite",
]
