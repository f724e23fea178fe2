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
    run_starts = np.flatnonzero(np.r_[True, cls[1:] != cls[:-1]])
    time = np.add.reduceat(dur, run_starts).tolist()
    high = np.add.reduceat(np.where(cls == HIGH, dur, 0.0), run_starts).tolist()
    first = run_starts.tolist()
    # Doubly linked list of stages; repeatedly merge the shortest stage under the interval into
    # its shorter neighbour (a heap keyed by duration, stale entries skipped).
    n = len(first)
    left = list(range(-1, n - 1))
    right = [*range(1, n), -1]
    alive = [True] * n
    heap = [(t, i) for i, t in enumerate(time) if t < interval_us]
    heapq.heapify(heap)
    while heap:
        t, i = heapq.heappop(heap)
        if not alive[i] or t != time[i] or t >= interval_us:
            continue
        lft, rgt = left[i], right[i]
        if lft < 0 and rgt < 0:
            break  # a single stage shorter than the interval: nothing to merge with
        into = lft if rgt < 0 or (lft >= 0 and time[lft] <= time[rgt]) else rgt
        keep, drop = (into, i) if into == lft else (i, into)
        # ``keep`` is the earlier of the two and absorbs ``drop``
        time[keep] += time[drop]
        high[keep] += high[drop]
        alive[drop] = False
        nxt = right[drop]
        right[keep] = nxt
        if nxt >= 0:
            left[nxt] = keep
        if time[keep] < interval_us:
            heapq.heappush(heap, (time[keep], keep))
    order = [i for i in range(n) if alive[i]]
    starts = np.asarray([first[i] for i in order], dtype=np.int64)
    stage_time = np.asarray([time[i] for i in order])
    stage_high = np.asarray([high[i] for i in order])
    return starts, np.where(stage_high * 2 >= stage_time, HIGH, LOW)
