"""The paper's preprocessing (§6.4, Fig. 13): operator sequence -> LFC/HFC stages -> merged stages.

1. the operator sequence with its idle gaps (gaps are low-frequency time);
2. a class per operator (:mod:`opdvfs.plan.classify`);
3. runs of one class become stages, each start a candidate switching point;
4. stages shorter than the frequency-adjustment interval (5 ms by default) are merged into a
   neighbour -- the shortest first, into its shorter neighbour, so long runs of one class
   survive whole -- and clocks change at most about once per interval.
"""

from __future__ import annotations

import heapq

import numpy as np

from opdvfs.plan.classify import HIGH, LOW

__all__ = ["segment"]


def segment(
    classes: np.ndarray, duration_us: np.ndarray, *, interval_us: float = 5000.0
) -> tuple[np.ndarray, np.ndarray]:
    """Split ops into stages of one class, merging stages shorter than ``interval_us``.

    Parameters
    ----------
    classes
        LOW/HIGH per op, in sequence order.
    duration_us
        Each op's time including the idle gap before it (at the top clock).
    interval_us
        Frequency-adjustment interval: no stage is shorter, unless there is only one.

    Returns
    -------
    starts : ndarray
        First op of each stage, ascending, starting at 0.
    stage_class : ndarray
        The class holding most of each stage's time.
    """
    cls = np.asarray(classes)
    dur = np.asarray(duration_us, dtype=float)
    first = np.flatnonzero(np.r_[True, cls[1:] != cls[:-1]])
    time = np.add.reduceat(dur, first)
    high = np.add.reduceat(np.where(cls == HIGH, dur, 0.0), first)
    first, time, high = _merge_in_rounds(first, time, high, interval_us)
    first, time, high = _merge_one_at_a_time(first, time, high, interval_us)
    return first.astype(np.int64), np.where(high * 2 >= time, HIGH, LOW)


#: A round that merges fewer than one pair per this many stages hands over to the heap.
_STALLED = 64

_Stages = tuple[np.ndarray, np.ndarray, np.ndarray]


def _merge_in_rounds(
    first: np.ndarray, time: np.ndarray, high: np.ndarray, interval_us: float
) -> _Stages:
    """Merge stages under the interval as :func:`_merge_one_at_a_time` does, many per round.

    The shortest stage under the interval merges first, into its shorter neighbour (the left
    one on a tie). Every stage whose turn cannot depend on another merge goes in one round: a
    stage whose (time, position) is below that of the two stages on either side. Nothing within
    two stages of it can merge before it (a merged stage is never shorter than its parts), so
    its neighbours are as the one-at-a-time order finds them; two such stages lie at least three
    apart, so their merges touch disjoint pairs. The shortest stage always qualifies, so every
    round merges; a chain where only one does per round (stages growing along the sequence)
    is left to the heap once rounds merge fewer than one pair per :data:`_STALLED` stages.

    Parameters
    ----------
    first, time, high
        Each stage's first op, its time (us) and the part of it in HIGH ops (us), shape (n,).

    Returns
    -------
    first, time, high
        The stages after the rounds.
    """
    while len(time) > 1:
        n = len(time)
        padded = np.r_[np.inf, np.inf, time, np.inf, np.inf]
        left1, left2 = padded[1 : n + 1], padded[:n]
        right1, right2 = padded[3 : n + 3], padded[4:]
        # ties go to the earlier stage: strictly below those before, at most those after
        turn = (time < interval_us) & (time < left1) & (time < left2)
        turn &= (time <= right1) & (time <= right2)
        stage = np.flatnonzero(turn)
        if stage.size * _STALLED < n:
            break
        # into the left neighbour unless there is none or the right one is shorter
        to_left = (stage > 0) & ((stage == n - 1) | (left1[stage] <= right1[stage]))
        keep = np.where(to_left, stage - 1, stage)  # the earlier of the pair absorbs the later
        time[keep] += time[keep + 1]
        high[keep] += high[keep + 1]
        alive = np.ones(n, dtype=bool)
        alive[keep + 1] = False
        first, time, high = first[alive], time[alive], high[alive]
    return first, time, high


def _merge_one_at_a_time(
    first: np.ndarray, time: np.ndarray, high: np.ndarray, interval_us: float
) -> _Stages:
    """Merge the shortest stage under the interval into its shorter neighbour, until none is.

    A doubly linked list of stages and a heap keyed by (time, position), stale entries skipped;
    a Python step per merge, so it finishes what :func:`_merge_in_rounds` leaves.
    """
    times, highs = time.tolist(), high.tolist()
    n = len(times)
    left = list(range(-1, n - 1))
    right = [*range(1, n), -1]
    alive = [True] * n
    heap = [(t, i) for i, t in enumerate(times) if t < interval_us]
    heapq.heapify(heap)
    while heap:
        t, i = heapq.heappop(heap)
        if not alive[i] or t != times[i]:
            continue
        lft, rgt = left[i], right[i]
        if lft < 0 and rgt < 0:
            break  # a single stage shorter than the interval: nothing to merge with
        into = lft if rgt < 0 or (lft >= 0 and times[lft] <= times[rgt]) else rgt
        keep, drop = (into, i) if into == lft else (i, into)
        times[keep] += times[drop]
        highs[keep] += highs[drop]
        alive[drop] = False
        nxt = right[drop]
        right[keep] = nxt
        if nxt >= 0:
            left[nxt] = keep
        if times[keep] < interval_us:
            heapq.heappush(heap, (times[keep], keep))
    live = np.asarray(alive, dtype=bool)
    return first[live], np.asarray(times)[live], np.asarray(highs)[live]
