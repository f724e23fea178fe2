"""Running schedules: the ``RunResult`` data object (executor and actuators land here later)."""

from opdvfs.result import RunResult, StageRecord

__all__ = ["RunResult", "StageRecord"]
