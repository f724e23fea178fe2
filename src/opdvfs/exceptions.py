"""Exceptions raised by opdvfs.

Every error derives from :class:`OpdvfsError`; leaves also derive from the builtin they specialise,
so callers may catch either (``except ValueError`` keeps working).
"""

from __future__ import annotations

__all__ = [
    "InputFormatError",
    "NotFittedError",
    "OpdvfsError",
    "ProfileFormatError",
    "ScheduleFormatError",
    "ValidationError",
]


class OpdvfsError(Exception):
    """Root of every error opdvfs raises on purpose."""


class ValidationError(OpdvfsError, ValueError):
    """A data object was constructed from values that break its invariants.

    Parameters
    ----------
    message
        What was wrong and what was expected.
    field
        The offending field or column, if known.
    row
        The 0-based row of the offending value in the table being validated, if known.
    """

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None):
        super().__init__(message)
        self.field = field
        self.row = row


class InputFormatError(OpdvfsError, ValueError):
    """A file could not be read as the format it claims (or was detected) to be.

    The message is one line that names the file, the row (1-based line number where it has one) or
    field, and what was expected; the CLI prints it as is and exits with status 2.
    """


class ProfileFormatError(InputFormatError):
    """A profile file (CSV, trace, Parquet) is malformed."""


class ScheduleFormatError(InputFormatError):
    """A schedule file does not match the schedule JSON Schema."""


class NotFittedError(OpdvfsError, AttributeError):
    """A model was used before ``fit`` was called."""
