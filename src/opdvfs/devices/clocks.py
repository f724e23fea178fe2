"""A device's supported clocks: read from NVML on an NVIDIA GPU, or parsed from a list (issue 31).

A device file (:class:`~opdvfs.devices.spec.DeviceSpec`) that lists only the profiled clocks
leaves the planner nothing for its models to fill: ``opdvfs characterise --clocks`` and
``opdvfs device`` write the clocks the GPU offers instead. On an NVIDIA GPU they are one NVML
call away (:func:`~opdvfs.runtime.actuators.nvml.nvml_clocks`, through the read-only
:class:`~opdvfs.runtime.actuators.nvml.NvmlReader`: the SM clocks supported at the highest
memory clock, the ones the NVML actuator locks); elsewhere the user lists them
(:func:`parse_clock_grid`: ``210:1410:15``, ``1000,1400,1800``, or both).
"""

from __future__ import annotations

import numpy as np

from opdvfs.exceptions import ValidationError

__all__ = ["MAX_CLOCKS", "parse_clock_grid"]

#: Most clocks a list may give (a 1 MHz step over 0-10 GHz): a typo's range stays bounded.
MAX_CLOCKS = 10_000


def _number(text: str, item: str) -> float:
    """Return ``text`` as a positive, finite number of MHz, or raise naming the item."""
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(
            f"clock {item!r}: expected MHz (e.g. 1410), a range START:STOP:STEP (e.g. "
            "210:1410:15) or a comma list of them",
            field="clocks",
        ) from None
    if not np.isfinite(value) or value <= 0:
        raise ValidationError(f"clock {item!r}: expected a positive number of MHz", field="clocks")
    return value


def parse_clock_grid(text: str) -> tuple[float, ...]:
    """Return the clocks of a list such as ``210:1410:15`` or ``1005,1395,1410`` (MHz), ascending.

    Items are separated by commas; each is a clock or a range ``START:STOP:STEP``, which holds
    ``START, START + STEP, ...`` up to ``STOP`` (included when on the step, to 1e-6 MHz).
    Repeats are dropped.

    Raises
    ------
    ValidationError
        (field ``clocks``) On an empty list, an item that is not a positive number or a range
        with ``START <= STOP`` and ``STEP > 0``, or more than :data:`MAX_CLOCKS` clocks.
    """
    clocks: list[float] = []
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise ValidationError(
            "no clock given: expected e.g. 210:1410:15 or 1000,1800", field="clocks"
        )
    for item in items:
        parts = item.split(":")
        if len(parts) == 1:
            clocks.append(_number(item, item))
            continue
        if len(parts) != 3:
            raise ValidationError(
                f"clock range {item!r}: expected START:STOP:STEP (MHz, e.g. 210:1410:15)",
                field="clocks",
            )
        start, stop, step = (_number(p, item) for p in parts)
        if stop < start:
            raise ValidationError(
                f"clock range {item!r}: STOP is below START (expected START:STOP:STEP)",
                field="clocks",
            )
        count = int(np.floor((stop - start) / step + 1e-9)) + 1
        if count + len(clocks) > MAX_CLOCKS:
            raise ValidationError(
                f"clock range {item!r}: more than {MAX_CLOCKS} clocks (is STEP in MHz?)",
                field="clocks",
            )
        clocks.extend(np.round(start + step * np.arange(count), 6).tolist())
    grid = np.unique(np.asarray(clocks, dtype=float))
    if len(grid) > MAX_CLOCKS:
        raise ValidationError(f"more than {MAX_CLOCKS} clocks given", field="clocks")
    return tuple(float(f) for f in grid)
