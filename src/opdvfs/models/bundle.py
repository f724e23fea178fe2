"""The MODELS file: the fitted performance and power models and the device they were fitted for.

``opdvfs fit`` writes it and ``opdvfs plan`` reads it; one JSON document,
``{"format": "opdvfs.models", "version": 1, "perf": {...}, "power": {...} | null,
"device": {...} | null}``. ``device`` (a :class:`~opdvfs.devices.spec.DeviceSpec`: the clocks to
plan over, the switch latency) was added later in version 1: files without it still read, with
no device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import pydantic

from opdvfs._files import JsonFile, check_format
from opdvfs._model import describe_validation_error
from opdvfs.devices.spec import DeviceSpec
from opdvfs.exceptions import InputFormatError
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel

__all__ = ["ModelBundle"]


@dataclass(frozen=True)
class ModelBundle(JsonFile):
    """A fitted :class:`PerfModel`, an optional fitted :class:`PowerModel` and their device.

    Parameters
    ----------
    perf
        Time vs clock of every operator.
    power
        Power vs clock of every operator, if the profile had power data.
    device
        The device the profile was taken on, when known (a preset's spec): ``plan MODELS``
        then needs no ``--device``.
    """

    perf: PerfModel
    power: PowerModel | None = None
    device: DeviceSpec | None = None

    def to_dict(self, *, arrays: bool = False) -> dict[str, Any]:
        """Return both models and the device as one JSON-ready dict.

        ``arrays``: the per-operator values stay numpy arrays, for a columnar file.
        """
        return {
            "format": "opdvfs.models",
            "version": 1,
            "perf": self.perf.to_dict(arrays=arrays),
            "power": None if self.power is None else self.power.to_dict(arrays=arrays),
            "device": None if self.device is None else self.device.model_dump(mode="json"),
        }

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "<dict>") -> Self:
        """Rebuild the bundle from :meth:`to_dict` output (files without ``device`` too)."""
        check_format(doc, "opdvfs.models", source, what="a MODELS file")
        if "perf" not in doc:
            raise InputFormatError(f"{source}: field 'perf': missing")
        power, device = doc.get("power"), doc.get("device")
        try:
            spec = None if device is None else DeviceSpec.model_validate(device)
        except pydantic.ValidationError as exc:
            raise InputFormatError(f"{source} (device): {describe_validation_error(exc)}") from None
        return cls(
            perf=PerfModel.from_dict(doc["perf"], source=f"{source} (perf)"),
            power=None
            if power is None
            else PowerModel.from_dict(power, source=f"{source} (power)"),
            device=spec,
        )
