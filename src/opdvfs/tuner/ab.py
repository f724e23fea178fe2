"""A/B measurement of a tuned schedule against the top clock, for ``opdvfs tune``.

Blocks of iterations alternate between the schedule and the top clock (ABBA); each block's first
iteration is discarded (the switch). :func:`ab_block` sizes a block for the device's energy
counter, :func:`ab_pairs` turns a round's iterations into paired t-intervals of slowdown and
saving (:func:`paired_interval`), and :func:`applied_iterations` says which iterations a plan may
switch in (for checking a log). Pure functions over the records of a run
(:mod:`opdvfs.tuner.result`); the loop (:mod:`opdvfs.tuner.loop`) drives them, and which round
applies is the policy's (:func:`opdvfs.tuner.policy.choose_round`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from opdvfs.models.attribution import sensor_iterations
from opdvfs.schedule import Schedule
from opdvfs.tuner.result import Interval, TuneIteration, TuneRound

__all__ = [
    "BLOCK_COUNTER_UPDATES",
    "DEFAULT_BLOCK",
    "ABPairs",
    "Block",
    "ab_block",
    "ab_pairs",
    "abba_blocks",
    "applied_iterations",
    "measured_round",
    "paired_interval",
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
class Block:
    """One A/B block of a round: its kind, the iterations still to run in it, its pair."""

    kind: Literal["reference", "tuned"]
    left: int  # iterations still to run in it (its first one discarded)
    pair: int


def abba_blocks(pairs: int, block: int) -> list[Block]:
    """Return a round's blocks in the order they run: reference first in even pairs (ABBA).

    A linear drift such as a warming die then cancels over two pairs.
    """
    blocks: list[Block] = []
    for pair in range(pairs):
        kinds: tuple[Literal["reference", "tuned"], ...] = (
            ("reference", "tuned") if pair % 2 == 0 else ("tuned", "reference")
        )
        blocks += [Block(kind, block, pair) for kind in kinds]
    return blocks


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
    intervals are :func:`paired_interval` of ``ratio - 1`` (slowdown)
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


def measured_round(
    schedule: Schedule, rows: Sequence[TuneIteration], *, drop: Collection[int] = ()
) -> TuneRound:
    """Return the round ``schedule``'s A/B iterations ``rows`` measured (:func:`ab_pairs`).

    Beside the measured intervals, what the plan predicted (its slowdown and saving against
    the top clock, where the planner gave both figures).
    """
    ab = ab_pairs(rows, drop=drop)
    s = schedule
    pred_slow = (
        s.predicted_time_s / s.baseline_time_s - 1
        if s.predicted_time_s and s.baseline_time_s
        else None
    )
    pred_save = (
        1 - s.predicted_energy_j / s.baseline_energy_j
        if s.predicted_energy_j and s.baseline_energy_j
        else None
    )
    return TuneRound(
        s.target or 0.0,
        len(s.stages),
        pred_slow,
        pred_save,
        ab.slowdown,
        ab.saving,
        ab.pairs,
        ab.dropped,
        freqs_mhz=tuple(sorted({st.freq_mhz for st in s.stages})),
    )


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


def paired_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Return the mean of paired differences and its t-interval (``mean +- t * s / sqrt(n)``).

    ``values``: one per A/B pair (e.g. tuned/reference ratio minus 1). The interval is the
    one-sample Student-t interval of the mean (n - 1 degrees of freedom).
    """
    from scipy import stats

    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Interval(mean, mean - half, mean + half, int(x.size), confidence)
