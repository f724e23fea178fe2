"""Models fitted on profiles: performance (time vs clock) and power (core, chip, thermal).

* :class:`PerfModel` (:mod:`~opdvfs.models.perf`): each operator's time at any clock;
* :class:`PowerModel` (:mod:`~opdvfs.models.power`): each operator's core and chip power at any
  clock, with the thermal fixed point of :mod:`~opdvfs.models.thermal`;
* :func:`characterise_device`, :func:`characterise_spec` and :func:`fit_voltage_curve`
  (:mod:`~opdvfs.models.characterise`): a device's V-f curve and idle power, fitted when the
  device does not give them; :func:`prior_curve` and :func:`derive_prior`
  (:mod:`~opdvfs.models.vf_prior`): the generic GPU V-f curve used when nothing gives one;
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
    "characterise_spec": "opdvfs.models.characterise",
    "derive_prior": "opdvfs.models.vf_prior",
    "prior_curve": "opdvfs.models.vf_prior",
    "training_plan": "opdvfs.models.validation",
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
    "characterise_spec",
    "derive_prior",
    "fit_voltage_curve",
    "prior_curve",
    "training_plan",
    "validate_perf",
    "validate_power",
]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from opdvfs.models.bundle import ModelBundle
    from opdvfs.models.characterise import (
        characterise_device,
        characterise_spec,
        fit_voltage_curve,
    )
    from opdvfs.models.perf import FORMS, PerfModel
    from opdvfs.models.power import PowerModel
    from opdvfs.models.validation import training_plan, validate_perf, validate_power
    from opdvfs.models.vf_prior import derive_prior, prior_curve

__getattr__, __dir__ = attach(__name__, _EXPORTS)
