"""Checks of a schedule against where it is about to run, made before anything runs."""

from __future__ import annotations

from collections.abc import Sequence

from opdvfs.exceptions import ScheduleMismatchError, UnsupportedClockError, ValidationError
from opdvfs.schedule import Schedule

__all__ = ["MAX_COUNTS", "check_counts", "check_schedule"]


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
    _check_timing(schedule, source)
    if n_ops is not None and n_ops != schedule.n_ops:
        raise ScheduleMismatchError(
            f"{source} plans {schedule.n_ops} operators per iteration, the workload has {n_ops}"
        )


#: The longest switch delay accepted when the schedule does not say how long an iteration is (s).
MAX_DELAY_S = 60.0


def _check_timing(schedule: Schedule, source: str) -> None:
    """Refuse switch delays past the iteration, and clocks held shorter than a switch takes."""
    iteration_s = schedule.predicted_time_s or schedule.baseline_time_s
    limit_s = iteration_s if iteration_s else MAX_DELAY_S
    for k, sw in enumerate(schedule.switches):
        if sw.delay_us * 1e-6 > limit_s:
            within = f"the iteration ({limit_s:g} s)" if iteration_s else f"{limit_s:g} s"
            raise ValidationError(
                f"{source}: switches[{k}].delay_us {sw.delay_us:g}: longer than {within}; "
                "expected a delay within the iteration",
                field="delay_us",
            )
    latency_s = schedule.switch_latency_ms * 1e-3
    starts = [schedule.stages[sw.stage].start_s for sw in schedule.switches]
    if latency_s <= 0 or len(starts) < 2 or iteration_s is None or None in starts:
        return
    held_s = [b - a for a, b in zip(starts, [*starts[1:], iteration_s], strict=True)]  # type: ignore[operator]
    for k, held in enumerate(held_s[:-1]):  # the last clock also holds into the next iteration
        if held < latency_s:
            raise ValidationError(
                f"{source}: switches[{k}] holds {schedule.switches[k].freq_mhz:g} MHz for "
                f"{held * 1e3:.3g} ms, shorter than the {latency_s * 1e3:g} ms switch latency: the "
                "next switch is asked for before this one lands; re-plan with --interval-ms at "
                "least the latency",
                field="stages",
            )


#: The most of each count a run may ask for: far above any useful value, far below one that
#: allocates for minutes (10^7 A/B pairs: 3.2 GB) or never ends.
MAX_COUNTS: dict[str, int] = {
    "pairs": 1_000,
    "rounds": 100,
    "block": 10_000,
    "warmup": 10_000,
    "iterations_per_clock": 10_000,
}


def check_counts(**counts: int | None) -> None:
    """Refuse a count (``pairs=3``, ...) below 1 or above its :data:`MAX_COUNTS` (None: unset).

    Raises
    ------
    ValidationError
        One line naming the option (``--pairs``) and its accepted range.
    """
    for name, value in counts.items():
        if value is None:
            continue
        most = MAX_COUNTS[name]
        if not 1 <= value <= most:
            option = "--" + name.replace("_", "-")
            raise ValidationError(
                f"{option} {value}: expected 1 to {most:,}".replace(",", " "), field=name
            )
