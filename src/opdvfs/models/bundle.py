"""The MODELS file: a fitted performance model and, where the profile had power, a power model.

``opdvfs fit`` writes it and ``opdvfs plan`` reads it; one JSON document,
``{"format": "opdvfs.models", "version": 1, "perf": {...}, "power": {...} | null}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from opdvfs._files import JsonFile
from opdvfs.exceptions import InputFormatError
from opdvfs.models.perf import PerfModel
from opdvfs.models.power import PowerModel

__all__ = ["ModelBundle"]


@dataclass(frozen=True)
class ModelBundle(JsonFile):
    """A fitted :class:`PerfModel` and an optional fitted :class:`PowerModel`."""

    perf: PerfModel
    power: PowerModel | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return both models as one JSON-ready dict."""
        return {
            "format": "opdvfs.models",
            "version": 1,
            "perf": self.perf.to_dict(),
            "power": None if self.power is None else self.power.to_dict(),
        }

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "<dict>") -> Self:
        """Rebuild the bundle from :meth:`to_dict` output."""
        if not isinstance(doc, dict) or doc.get("format") != "opdvfs.models":
            raise InputFormatError(f'{source}: expected "format": "opdvfs.models"')
        if "perf" not in doc:
            raise InputFormatError(f"{source}: field 'perf': missing")
        power = doc.get("power")
        return cls(
            perf=PerfModel.from_dict(doc["perf"], source=f"{source} (perf)"),
            power=None
            if power is None
            else PowerModel.from_dict(power, source=f"{source} (power)"),
        )
