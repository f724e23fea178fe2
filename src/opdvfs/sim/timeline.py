"""When each operator starts and ends, and at which clock(s) it runs, given clock switches.

A clock request is issued ``delay_us`` after its trigger operator starts (0: as it starts) and
lands ``latency_us`` later; an operator
in flight at that moment runs the rest of its work at the new clock. Between events every step is
a vectorised cumulative sum, so a run costs O(n_ops + n_switches), not a Python loop over ops.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["Execution", "SwitchEvent", "execute", "execute_loop"]


@dataclass(frozen=True)
class SwitchEvent:
    """A clock request, issued at ``issue_us`` (``trigger_op`` starts), effective at ``land_us``."""

    trigger_op: int
    clock: int
    issue_us: float
    land_us: float


@dataclass(frozen=True)
class Execution:
    """Per-op timeline, shape (n_ops,) each.

    An op starts at ``start_us`` at clock index ``clock_a``; if a switch landed while it ran, the
    share ``frac_a`` of its work ran at ``clock_a`` and the rest at ``clock_b``.
    """

    start_us: np.ndarray
    end_us: np.ndarray
    clock_a: np.ndarray
    clock_b: np.ndarray
    frac_a: np.ndarray
    switches: tuple[SwitchEvent, ...]

    @property
    def makespan_us(self) -> float:
        """End of the last operator."""
        return float(self.end_us[-1]) if len(self.end_us) else 0.0

    def time_at_a_us(self, dur_us: np.ndarray) -> np.ndarray:
        """Time each op spent at ``clock_a`` (given the duration matrix used to execute)."""
        idx = np.arange(len(self.start_us))
        return self.frac_a * dur_us[idx, self.clock_a]


def _segment(
    t: float, dur: np.ndarray, gap: np.ndarray, host: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Return starts and ends of consecutive ops at one clock, the previous one ending at ``t``.

    ``s_i = max(e_{i-1} + gap_i, host_i)``: with ``A_i`` the start if the host never made the
    device wait, the accumulated wait is the running maximum of ``host - A`` (and at least 0).
    """
    ends_no_wait = t + np.cumsum(gap + dur)
    start = ends_no_wait - dur
    if host is not None:
        start = start + np.maximum.accumulate(np.maximum(host - start, 0.0))
    return start, start + dur


def execute(
    dur_us: np.ndarray,
    *,
    initial_clock: int,
    triggers: np.ndarray,
    clocks: np.ndarray,
    latency_us: float,
    gap_us: np.ndarray | None = None,
    host_us: np.ndarray | None = None,
    start_us: float = 0.0,
    delay_us: np.ndarray | None = None,
) -> Execution:
    """Run ops with durations ``dur_us[i, clock]`` under a list of clock switches.

    Parameters
    ----------
    dur_us
        Duration of every op at every clock index, shape (n_ops, n_clocks).
    initial_clock
        Clock index in effect when the first op starts.
    triggers, clocks
        Switch ``k`` is issued when op ``triggers[k]`` starts and requests ``clocks[k]``;
        ``triggers`` non-decreasing.
    latency_us
        Time from issue to landing.
    gap_us
        Idle time before each op (device waits), shape (n_ops,).
    host_us
        Earliest time each op may start because the host dispatches it then (host-bound
        inference), shape (n_ops,), or None.
    start_us
        Time the first op may start.
    delay_us
        Time from each trigger op's start to issuing its switch, shape (n_switches,), or None.
        Landings keep their order (a request never overtakes an earlier one).
    """
    n = dur_us.shape[0]
    gap = np.zeros(n) if gap_us is None else np.asarray(gap_us, dtype=float)
    start, end = np.empty(n), np.empty(n)
    clock_a = np.empty(n, dtype=np.int64)
    clock_b = np.empty(n, dtype=np.int64)
    frac_a = np.ones(n)
    events: list[SwitchEvent] = []
    pending: deque[tuple[float, int]] = deque()
    delay = None if delay_us is None else np.asarray(delay_us, dtype=float)
    cur, i, t, k = int(initial_clock), 0, float(start_us), 0
    n_sw = len(triggers)
    while i < n:
        stop = int(triggers[k]) if k < n_sw else n
        if stop <= i:  # issue switch k as op i starts
            s_i = max(t + gap[i], host_us[i] if host_us is not None else -np.inf)
            issue = s_i + (delay[k] if delay is not None else 0.0)
            land = max(issue + latency_us, pending[-1][0] if pending else -np.inf)
            events.append(SwitchEvent(int(triggers[k]), int(clocks[k]), issue, land))
            pending.append((land, int(clocks[k])))
            k += 1
            continue
        host = None if host_us is None else host_us[i:stop]
        s, e = _segment(t, dur_us[i:stop, cur], gap[i:stop], host)
        land, new = pending[0] if pending else (np.inf, cur)
        q = int(np.searchsorted(e, land, side="right")) if land < e[-1] else stop - i
        if q < stop - i:  # the switch lands while op i+q runs (or before it starts)
            j = i + q
            start[i:j], end[i:j], clock_a[i:j], clock_b[i:j] = s[:q], e[:q], cur, cur
            pending.popleft()
            if s[q] >= land:  # lands in the gap before op j: op j runs wholly at the new clock
                cur, i, t = new, j, (e[q - 1] if q else t)
                continue
            done = (land - s[q]) / dur_us[j, cur]
            start[j], clock_a[j], frac_a[j] = s[q], cur, done
            left, at = 1.0 - done, land
            # Further switches landing before this op ends split it again; its time stays exact,
            # its energy books the later pieces at the last clock.
            while pending and pending[0][0] < at + left * dur_us[j, new]:
                nxt, clock = pending.popleft()
                left -= (nxt - at) / dur_us[j, new]
                at, new = nxt, clock
            clock_b[j] = new
            end[j] = at + left * dur_us[j, new]
            cur, i, t = new, j + 1, end[j]
            continue
        start[i:stop], end[i:stop], clock_a[i:stop], clock_b[i:stop] = s, e, cur, cur
        i, t = stop, e[-1]
    return Execution(start, end, clock_a, clock_b, frac_a, tuple(events))


def execute_loop(
    dur_us: np.ndarray,
    *,
    initial_clock: int,
    triggers: np.ndarray,
    clocks: np.ndarray,
    latency_us: float,
    gap_us: np.ndarray | None = None,
    host_us: np.ndarray | None = None,
    delay_us: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Op-by-op reference of :func:`execute`: the same semantics, a readable Python loop.

    Returns the start and end of every op. Tests check :func:`execute` against it, and the
    speed benchmark measures it as the baseline.
    """
    n = dur_us.shape[0]
    gap = np.zeros(n) if gap_us is None else gap_us
    host = np.full(n, -np.inf) if host_us is None else host_us
    t, cur, k = 0.0, initial_clock, 0
    pending: deque[tuple[float, int]] = deque()
    start, end = np.empty(n), np.empty(n)
    for i in range(n):
        s = max(t + gap[i], host[i])
        while k < len(triggers) and triggers[k] == i:
            land = s + (0.0 if delay_us is None else delay_us[k]) + latency_us
            pending.append((max(land, pending[-1][0]) if pending else land, int(clocks[k])))
            k += 1
        while pending and pending[0][0] <= s:
            cur = pending.popleft()[1]
        left, at = 1.0, s
        while pending and pending[0][0] < at + left * dur_us[i, cur]:
            land, new = pending.popleft()
            left -= (land - at) / dur_us[i, cur]
            at, cur = land, new
        start[i], end[i] = s, at + left * dur_us[i, cur]
        t = end[i]
    return start, end
