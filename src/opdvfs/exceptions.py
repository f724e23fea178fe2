"""Exceptions raised by opdvfs.

Every error derives from :class:`OpdvfsError`; leaves also derive from the builtin they specialise,
so callers may catch either (``except ValueError`` keeps working).
"""

from __future__ import annotations

__all__ = [
    "ActuatorError",
    "CaptureError",
    "ClockNotRestoredError",
    "DeviceNotFoundError",
    "DistributedError",
    "InfeasibleError",
    "InputFormatError",
    "MissingExtraError",
    "NotFittedError",
    "NotSupportedError",
    "OpdvfsError",
    "OutputPathError",
    "PermissionDeniedError",
    "ProfileFormatError",
    "ScheduleFormatError",
    "ScheduleMismatchError",
    "UnsupportedClockError",
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
        Index label of the offending row (importers index by source line number), if known.
    detail
        The message without its location prefix, for callers that re-word the location.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        row: int | None = None,
        detail: str | None = None,
    ):
        super().__init__(message)
        self.field = field
        self.row = row
        #: The message without its "where" prefix: what was expected and what was found.
        self.detail = detail if detail is not None else message


class InputFormatError(OpdvfsError, ValueError):
    """A file could not be read as the format it claims (or was detected) to be.

    The message is one line that names the file, the row (1-based line number where it has one) or
    field, and what was expected; the CLI prints it as is and exits with status 2.
    """


class OutputPathError(OpdvfsError, OSError):
    """An output cannot be written where asked.

    A folder stands where a file is expected (or a file where a new folder is expected), or the
    destination refuses the write (permissions, a full disk). The message is one line naming the
    path and what was expected; nothing is left behind.
    """


class ProfileFormatError(InputFormatError):
    """A profile file (CSV, trace, Parquet) is malformed."""


class ScheduleFormatError(InputFormatError):
    """A schedule file does not match the schedule JSON Schema."""


class NotFittedError(OpdvfsError, AttributeError):
    """A model was used before ``fit`` was called."""


class ActuatorError(OpdvfsError, RuntimeError):
    """A clock could not be read or set on the device."""


class ClockNotRestoredError(ActuatorError):
    """A clock could not be given back to the driver: it stays locked (``opdvfs restore``)."""


class PermissionDeniedError(ActuatorError, PermissionError):
    """The process lacks the privilege to change clocks (the message says how to get it)."""


class NotSupportedError(ActuatorError, NotImplementedError):
    """The device or driver does not support the requested clock operation."""


class DeviceNotFoundError(ActuatorError, LookupError):
    """No device matches the requested index or UUID (or no driver is present)."""


class UnsupportedClockError(ValidationError):
    """A clock the device does not support was requested (every actuator raises this one)."""


class InfeasibleError(OpdvfsError, ValueError):
    """No plan fits the slowdown budget (not even every stage at the top clock)."""


class ScheduleMismatchError(OpdvfsError, ValueError):
    """A schedule does not fit the program it is applied to (operator count or sequence)."""


class CaptureError(OpdvfsError, ValueError):
    """Recording a workload from a running program failed (e.g. no complete iteration seen)."""


class DistributedError(OpdvfsError, ValueError):
    """Sharing a schedule across ranks failed (no process group, or a rank sent nothing)."""


class MissingExtraError(OpdvfsError, ImportError):
    """An optional dependency that this command needs is not installed.

    The message is one line naming the package, what needs it and the extra that installs it,
    e.g. ``matplotlib is not installed; drawing figures needs it: pip install 'opdvfs[plot]'``.

    Parameters
    ----------
    module
        The package that failed to import (``"matplotlib"``).
    extra
        The opdvfs extra that installs it (``"plot"``).
    needed_for
        What needs it, as a phrase (``"drawing figures"``).
    """

    def __init__(self, module: str, extra: str, needed_for: str):
        super().__init__(
            f"{module} is not installed; {needed_for} needs it: pip install 'opdvfs[{extra}]'",
            name=module,
        )
        self.module, self.extra = module, extra
