"""Running schedules: the ``RunResult`` data object (executor and actuators land here later)."""

from opdvfs.runtime.result import RunResult, StageRecord

__all__ = ["RunResult", "StageRecord"]
