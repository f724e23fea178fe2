"""Workloads: the ``Workload`` data object (builders and capture land here later)."""

from opdvfs.workloads.workload import PHASES, WORKLOAD_COLUMNS, Workload

__all__ = ["PHASES", "WORKLOAD_COLUMNS", "Workload"]
