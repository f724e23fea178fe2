"""Models fitted on profiles: performance (time vs clock); power lands here next."""

from opdvfs.models.perf import FORMS, PerfModel
from opdvfs.models.validation import validate_perf

__all__ = ["FORMS", "PerfModel", "validate_perf"]
