"""A frozen pydantic base with a lossless, atomic JSON file round-trip.

The small data objects (``DeviceSpec``, ``Schedule``, ``RunResult``) derive from it, so they are
typed, checked once on construction, immutable, and read back from JSON with one clear error line.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Self

import pydantic

from opdvfs._files import check_format, read_json, write_text_atomic
from opdvfs.exceptions import InputFormatError

__all__ = ["FrozenModel", "describe_validation_error"]


def describe_validation_error(exc: pydantic.ValidationError) -> str:
    """Return the first error of a pydantic ValidationError as one line.

    The line reads ``field 'stages.0.freq_mhz': Input should be greater than 0, got -1``: the
    field's path, pydantic's reason, and the value found when it is a short scalar. Never
    pydantic's own multi-line text (which also names its documentation URL).
    """
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    given = err.get("input")
    got = ""
    if isinstance(given, bool | int | float | str) and len(repr(given)) <= 40:
        got = f", got {json.dumps(given)}"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {where!r}: {err['msg']}{got}{more}"


class FrozenModel(pydantic.BaseModel):
    """Immutable, extra-field-forbidding base model with ``read``/``write`` helpers."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    #: The error raised when a file does not hold a valid object of this class.
    file_error: ClassVar[type[InputFormatError]] = InputFormatError

    def to_json(self) -> str:
        """Return the object as indented JSON text."""
        return self.model_dump_json(indent=2) + "\n"

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the object as JSON, atomically (temp file, then rename)."""
        write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "<string>") -> Self:
        """Parse and validate JSON text; errors name ``source`` and the offending field."""
        try:
            data: Any = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise cls.file_error(f"{source}: not valid JSON ({exc})") from None
        return cls._validate(data, source)

    @classmethod
    def _validate(cls, data: Any, source: str) -> Self:
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as exc:
            raise cls.file_error(f"{source}: {describe_validation_error(exc)}") from None

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Self:
        """Read and validate a JSON file written by :meth:`write`.

        A class with a ``format`` tag (``Schedule``) names another opdvfs file given in its
        place (a MODELS file, a workload) and the command that takes it.
        """
        doc = read_json(path, cls.file_error)
        tag = cls.model_fields["format"].default if "format" in cls.model_fields else None
        if isinstance(tag, str):
            what = f"a {cls.__name__.lower()}"
            check_format(doc, tag, str(path), what=what, error=cls.file_error)
        return cls._validate(doc, str(path))
