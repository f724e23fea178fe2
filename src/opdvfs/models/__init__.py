"""Models fitted on profiles: performance (time vs clock) and power (core, chip, thermal)."""

from opdvfs.models.perf import FORMS, PerfModel
from opdvfs.models.power import PowerCalibration, PowerModel
from opdvfs.models.validation import validate_perf, validate_power

__all__ = [
    "FORMS",
    "PerfModel",
    "PowerCalibration",
    "PowerModel",
    "validate_perf",
    "validate_power",
]
