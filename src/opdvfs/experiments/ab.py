"""A/B measurement of a tuned schedule against the top clock, for ``opdvfs tune`` (#21).

Blocks of iterations alternate between the schedule and the top clock (ABBA); each block's first
iteration is discarded (the switch). :func:`ab_block` sizes a block for the device's energy
counter, :func:`ab_pairs` turns a round's iterations into paired t-intervals of slowdown and
saving, :func:`choose_round` picks the round to apply by the saving's lower confidence bound, and
:func:`applied_iterations` says which iterations a plan may switch in (for checking a log).
Pure functions over the records of a run; the tuner (:mod:`opdvfs.experiments.tune`) drives them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opdvfs.exceptions import ValidationError
from opdvfs.models.attribution import sensor_iterations
from opdvfs.runtime.tuning import Interval, paired_interval

__all__ = [
    "BLOCK_COUNTER_UPDATES",
    "CHOSEN_BY_LOW",
    "CHOSEN_BY_MEAN",
    "CHOSEN_BY_SLOWDOWN",
    "DEFAULT_BLOCK",
    "ABPairs",
    "TuneIteration",
    "TuneRound",
    "ab_block",
    "ab_pairs",
    "applied_iterations",
    "applies",
    "choose_round",
]

#: Iterations per A/B block (the first discarded) where the energy counter is exact (a simulated
#: GPU's moves at every kernel) or absent, and the floor of :func:`ab_block`.
DEFAULT_BLOCK = 3
#: Energy-counter updates the counted iterations of an A/B block span off the simulated GPU
#: (:func:`ab_block`).
BLOCK_COUNTER_UPDATES = 10


def ab_block(iteration_s: float | None, counter_s: float | None) -> int:
    """Return the iterations per A/B block (its first discarded) for a device's energy counter.

    A block's energy is the counter's difference across its counted iterations, so the
    counter's update period ``counter_s`` (NVML's moves every 100 ms,
    :data:`~opdvfs.runtime.sweep.NVML_COUNTER_S`) quantises it at each end: an error of up to
    one period's energy, large against a block of a few ~100 ms iterations. The counted
    iterations span :data:`BLOCK_COUNTER_UPDATES` periods (at the top clock's
    ``iteration_s``; :func:`~opdvfs.models.attribution.sensor_iterations`, as the sweep sizes
    its clocks), and never fewer than :data:`DEFAULT_BLOCK`'s. Measured on an H200 (a GPT step
    of 100 ms, dry run: a null contrast), the standard deviation of one pair's energy ratio
    over the top-clock iterations fell from 0.71% (eager) and 3.0% (compiled) with 3 counted
    iterations per block to 0.20% and 0.50% with 10. ``counter_s`` None (an exact counter, or
    none) or no iteration time: :data:`DEFAULT_BLOCK`.
    """
    if counter_s is None or iteration_s is None or not iteration_s > 0:
        return DEFAULT_BLOCK
    counted = sensor_iterations(
        iteration_s,
        period_ms=counter_s * 1e3,
        window_ms=counter_s * 1e3,
        windows=BLOCK_COUNTER_UPDATES,
    )
    return 1 + max(DEFAULT_BLOCK - 1, counted)


@dataclass
class TuneIteration:
    """One iteration of a tuning run: its phase, the clock last requested, its time and energy.

    ``time_s`` and ``energy_j`` are on the device's clock and counter (a simulated GPU's
    virtual time; a real GPU's wall time after a synchronise and its energy counter; None
    where the device has no counter). ``round`` is the A/B round it measured, if any.
    """

    iteration: int
    phase: str
    freq_mhz: float | None
    time_s: float
    energy_j: float | None
    round: int | None = None
    #: Under torchrun: this rank's own time and energy (``time_s``/``energy_j`` are the job's).
    rank_time_s: float | None = None
    rank_energy_j: float | None = None


@dataclass
class TuneRound:
    """One planned schedule and what its A/B blocks measured against the top clock.

    ``slowdown`` and ``saving`` are paired intervals over the block pairs (tuned over
    reference time minus 1; 1 minus tuned over reference energy). ``dropped``: tuned
    iterations left out because the time-triggered executor fell back to the top clock in them.
    """

    budget: float
    stages: int
    predicted_slowdown: float | None
    predicted_saving: float | None
    slowdown: Interval
    saving: Interval | None
    pairs: int
    dropped: int = 0


@dataclass(frozen=True)
class ABPairs:
    """What one round's A/B blocks measured (:func:`ab_pairs`)."""

    slowdown: Interval
    saving: Interval | None
    pairs: int
    dropped: int


def ab_pairs(rows: Sequence[TuneIteration], *, drop: Collection[int] = ()) -> ABPairs:
    """Return a round's paired intervals from its iterations, in the order they ran.

    A block starts at a ``switch`` iteration (discarded) and goes on through the ``reference``
    or ``tuned`` iterations after it; blocks pair in their order (1 with 2, 3 with 4, ...).
    Each pair gives one ratio of mean time (tuned over reference) and of mean energy, and the
    intervals are :func:`~opdvfs.runtime.tuning.paired_interval` of ``ratio - 1`` (slowdown)
    and ``1 - ratio`` (saving) over the pairs. ``drop``: iterations whose tuned rows are left
    out (those the executor fell back in); a pair with an empty side is skipped.
    """
    blocks: list[list[TuneIteration]] = []
    kind: str | None = None
    dropped = 0
    for it in rows:
        if it.phase == "switch":
            blocks.append([])
            kind = None
            continue
        if it.phase not in ("reference", "tuned"):
            continue
        if not blocks or kind not in (None, it.phase):  # (another kind with no switch row)
            blocks.append([])
        kind = it.phase
        if it.phase == "tuned" and it.iteration in drop:
            dropped += 1
            continue
        blocks[-1].append(it)
    ratios_t: list[float] = []
    ratios_e: list[float] = []
    for first, second in zip(blocks[0::2], blocks[1::2], strict=False):
        both = first + second
        ref = [it for it in both if it.phase == "reference"]
        tuned = [it for it in both if it.phase == "tuned"]
        if not ref or not tuned:
            continue
        time_ratio = np.mean([i.time_s for i in tuned]) / np.mean([i.time_s for i in ref])
        ratios_t.append(float(time_ratio))
        e_ref = [i.energy_j for i in ref if i.energy_j is not None]
        e_tun = [i.energy_j for i in tuned if i.energy_j is not None]
        if e_ref and e_tun:
            ratios_e.append(float(np.mean(e_tun) / np.mean(e_ref)))
    slowdown = paired_interval([r - 1 for r in ratios_t])
    saving = paired_interval([1 - r for r in ratios_e]) if ratios_e else None
    return ABPairs(slowdown, saving, len(ratios_t), dropped)


#: How :func:`choose_round` chose (the result's ``chosen_by``).
CHOSEN_BY_LOW = (
    "the highest lower bound of the energy saving's 95% interval among the rounds whose "
    "measured slowdown is within the target"
)
CHOSEN_BY_MEAN = (
    "the highest mean energy saving among the rounds whose measured slowdown is within the "
    "target (fewer than 2 pairs: no interval)"
)
CHOSEN_BY_SLOWDOWN = "the least measured slowdown (no round within the target)"


def applied_iterations(rows: Sequence[dict[str, Any]]) -> set[int]:
    """Return the iterations a plan may switch the clock in, from a result's ``per_iteration``.

    The tuned and steady iterations, and each ``switch`` iteration that opens a tuned block
    (the schedule is armed there); when the run ended in the steady phase, the iteration after
    its last one too (armed as the script ended). A dry-run log's sets by time should fall in
    these alone.
    """
    phases = [it["phase"] for it in rows]
    applied = {
        it["iteration"]
        for k, it in enumerate(rows)
        if it["phase"] in ("tuned", "steady")
        or (it["phase"] == "switch" and k + 1 < len(rows) and phases[k + 1] == "tuned")
    }
    if rows and phases[-1] == "steady":
        applied.add(rows[-1]["iteration"] + 1)
    return applied


def choose_round(rounds: Sequence[TuneRound], target: float) -> tuple[int, bool, str]:
    """Return the round to apply for the rest of the run, whether it met the target, and why.

    Among the rounds whose mean measured slowdown is within ``target``, the one whose saving
    has the highest lower confidence bound: over a few rounds of a few pairs the highest
    *mean* is mostly the luckiest draw (the winner's curse: on an H200 with the clocks never
    changed, a null contrast, it picked a round measuring 5.91% [-19.21%, 31.04%] over one
    measuring 0.53% [-0.86%, 1.92%]). Ties, and rounds without an interval (1 pair), go by the
    mean. No round within the target: the least measured slowdown. The rounds within the
    target are those :func:`~opdvfs.runtime.tuning.fit_budget` counts, so ``met`` is its.

    Raises
    ------
    ValidationError
        If ``rounds`` is empty.
    """
    if not rounds:
        raise ValidationError("no round was measured", field="rounds")

    def finite(value: float | None) -> float:
        return value if value is not None and math.isfinite(value) else -math.inf

    within = [i for i, r in enumerate(rounds) if r.slowdown.mean <= target]
    if not within:
        index = min(range(len(rounds)), key=lambda i: -finite(-rounds[i].slowdown.mean))
        return index, False, CHOSEN_BY_SLOWDOWN

    def key(i: int) -> tuple[float, float]:
        saving = rounds[i].saving
        if saving is None:
            return -math.inf, -math.inf
        return finite(saving.low), finite(saving.mean)

    index = max(within, key=key)  # the first of equals
    bounded = any(math.isfinite(key(i)[0]) for i in within)
    return index, True, CHOSEN_BY_LOW if bounded else CHOSEN_BY_MEAN


def applies(chosen: TuneRound, met: bool) -> bool:
    """Whether the chosen round's schedule should run for the rest of the job.

    Only a schedule that measured a saving: its mean saving above 0 (within the target, or,
    with no round within it, the least slowdown). Within the target with no energy measured,
    it applies on the models' word. A round that measured more energy than the top clock never
    applies: a user's own small MLP on sim:h100-like met the target and measured -0.06%
    [-0.09%, -0.02%], and was applied for the rest of the run.
    """
    if chosen.saving is None or chosen.saving.n == 0:
        return met
    return chosen.saving.mean > 0
