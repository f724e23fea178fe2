"""Models fitted on profiles: performance (time vs clock) and power (core, chip, thermal).

* :class:`PerfModel` (:mod:`~opdvfs.models.perf`): each operator's time at any clock;
* :class:`PowerModel` (:mod:`~opdvfs.models.power`): each operator's core and chip power at any
  clock, with the thermal fixed point of :mod:`~opdvfs.models.thermal`;
* :func:`characterise_device` and :func:`fit_voltage_curve` (:mod:`~opdvfs.models.characterise`):
  a device's V-f curve and idle power, fitted when the device does not give them;
* :func:`validate_perf` and :func:`validate_power` (:mod:`~opdvfs.models.validation`): a model's
  error on the clocks it was not fitted on;
* :class:`ModelBundle` (:mod:`~opdvfs.models.bundle`): the MODELS file, both fitted models.

Per-op power attributed from sensor windows is in :mod:`~opdvfs.models.attribution`; the batched
least-squares kernels under the fits in :mod:`~opdvfs.models._lsq`.

Names load on first use (PEP 562), so importing the package costs nothing until one is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opdvfs._lazy import attach

#: Exported name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "ModelBundle": "opdvfs.models.bundle",
    "characterise_device": "opdvfs.models.characterise",
    "fit_voltage_curve": "opdvfs.models.characterise",
    "FORMS": "opdvfs.models.perf",
    "PerfModel": "opdvfs.models.perf",
    "PowerModel": "opdvfs.models.power",
    "validate_perf": "opdvfs.models.validation",
    "validate_power": "opdvfs.models.validation",
}

__all__ = [
    "FORMS",
    "ModelBundle",
    "PerfModel",
    "PowerModel",
    "characterise_device",
    "fit_voltage_curve",
    "validate_perf",
    "validate_power",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.characterise import characterise_device, fit_voltage_curve
    from opdvfs.models.perf import FORMS, PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.models.validation import validate_perf, validate_power

__getattr__, __dir__ = attach(__name__, _EXPORTS)
