"""Checks of a schedule against where it is about to run, made before anything runs."""

from __future__ import annotations

from collections.abc import Sequence

from opdvfs.exceptions import ScheduleMismatchError, UnsupportedClockError
from opdvfs.schedule import Schedule

__all__ = ["check_schedule"]


def check_schedule(
    schedule: Schedule,
    *,
    freqs_mhz: Sequence[float],
    device: str | None = None,
    n_ops: int | None = None,
    source: str = "schedule",
) -> None:
    """Refuse a schedule that cannot run as planned: device, clocks and length, in that order.

    Parameters
    ----------
    schedule
        The schedule to apply.
    freqs_mhz
        The clocks the target accepts (MHz): the actuator's or the simulated device's.
    device
        The target's preset name (``--device``, or the twin's), compared with the schedule's
        ``device`` when both are known.
    n_ops
        Operators per iteration of the workload it runs on, when known.
    source
        How the schedule is named in messages (its file).

    Raises
    ------
    ScheduleMismatchError
        If the schedule was planned for another device, or for another number of operators.
    UnsupportedClockError
        If a stage's clock is not one the target accepts.
    """
    if device is not None and schedule.device is not None and schedule.device != device:
        raise ScheduleMismatchError(
            f"{source} was planned for {schedule.device}, not {device} (plan it for {device}, "
            f"or run it on {schedule.device})"
        )
    accepted = set(float(f) for f in freqs_mhz)
    for k, stage in enumerate(schedule.stages):
        if float(stage.freq_mhz) not in accepted:
            span = f"{min(accepted):g}-{max(accepted):g} MHz" if accepted else "none"
            raise UnsupportedClockError(
                f"{source}: stage {k} runs at {stage.freq_mhz:g} MHz, not a clock of "
                f"{device or 'this device'} ({span}, {len(accepted)} steps)",
                field="freq_mhz",
            )
    if n_ops is not None and n_ops != schedule.n_ops:
        raise ScheduleMismatchError(
            f"{source} plans {schedule.n_ops} operators per iteration, the workload has {n_ops}"
        )
