"""Models fitted on profiles: performance (time vs clock) and power (core, chip, thermal)."""

from opdvfs.calibration import PowerCalibration
from opdvfs.models.perf import FORMS, PerfModel
from opdvfs.models.power import PowerModel
from opdvfs.models.validation import validate_perf, validate_power

__all__ = [
    "FORMS",
    "PerfModel",
    "PowerCalibration",
    "PowerModel",
    "validate_perf",
    "validate_power",
]
