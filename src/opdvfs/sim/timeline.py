"""When each operator starts and ends, and at which clock it runs, given clock switches.

SetFreq semantics (paper §7.1: SetFreq is an operator on its own stream): a request is issued
``delay_us`` after its trigger operator starts (0: as it starts), requests are issued in order
(one stream), and a request lands ``latency_us`` after it is issued. A request issued while an
earlier one is still pending supersedes it: the earlier one never lands, and the clock change
under way lands when it was due, at the newest target (the clock controller's target register
holds one value, the newest write; a newer write replaces the target, it does not restart the
change). So a stage shorter than the latency loses its clock altogether, as on hardware, while
a stream of requests closer together than the latency still moves the clock once per latency,
to the newest target (a controller whose change restarted at every write would never land one
under such a stream). An operator runs wholly at the clock in effect when it starts: a request
landing while it runs takes effect from the next operator (or part-way through the idle gap
before it); the landings inside an op are kept (:attr:`Execution.inner_land_us`), since an op
whose time does not depend on the clock draws power at each of them from its landing on.
Between events every step is a vectorised cumulative sum, so a run costs O(n_ops +
n_switches), not a Python loop over ops.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Execution", "SwitchEvent", "execute", "execute_loop"]


@dataclass(frozen=True)
class SwitchEvent:
    """A clock request, issued at ``issue_us`` (``trigger_op`` starts), effective at ``land_us``.

    ``landed`` is False for a request superseded by a later one before ``land_us``: it never
    took effect. ``land_us`` is ``issue_us`` plus the latency, or earlier for a request that
    superseded a pending one: it lands when the superseded change was due.
    """

    trigger_op: int
    clock: int
    issue_us: float
    land_us: float
    landed: bool = True


@dataclass(frozen=True)
class Execution:
    """Per-op timeline, shape (n_ops,) each.

    Op ``i`` runs from ``start_us`` to ``end_us`` at clock index ``clock``. The idle gap before
    it (from the previous op's end, or the run's start) runs at ``gap_clock`` until
    ``gap_land_us`` (NaN: the whole gap) and at ``clock`` after it. If several requests land in
    one gap, the time after the first landing is at ``clock``. A request landing while op ``i``
    runs does not change its duration (the op keeps the clock it started at), but the chip's
    clock changes then: ``op_land_us`` is the first landing inside the op (NaN: none) and
    ``end_clock`` the clock in effect when it ends, which an op whose time does not depend on
    the clock (a collective, a pipeline wait) draws power at from the landing on.
    """

    start_us: np.ndarray
    end_us: np.ndarray
    clock: np.ndarray
    gap_clock: np.ndarray
    gap_land_us: np.ndarray
    op_land_us: np.ndarray
    end_clock: np.ndarray
    switches: tuple[SwitchEvent, ...]
    inner_op: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    inner_land_us: np.ndarray = field(default_factory=lambda: np.empty(0))
    inner_clock: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def makespan_us(self) -> float:
        """End of the last operator."""
        return float(self.end_us[-1]) if len(self.end_us) else 0.0

    @property
    def landed(self) -> tuple[SwitchEvent, ...]:
        """The requests that took effect (not superseded), in time order."""
        return tuple(e for e in self.switches if e.landed)


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
    """Run ops with durations ``dur_us[i, clock]`` under a list of clock requests.

    Parameters
    ----------
    dur_us
        Duration of every op at every clock index, shape (n_ops, n_clocks).
    initial_clock
        Clock index in effect when the first op starts.
    triggers, clocks
        Request ``k`` is issued when op ``triggers[k]`` starts and asks for ``clocks[k]``;
        ``triggers`` non-decreasing.
    latency_us
        Time from issue to landing (a request that supersedes a pending one lands when that
        one was due).
    gap_us
        Idle time before each op (device waits), shape (n_ops,).
    host_us
        Earliest time each op may start because the host dispatches it then (host-bound
        inference), shape (n_ops,), or None.
    start_us
        Time the first op may start.
    delay_us
        Time from each trigger op's start to issuing its request, shape (n_switches,), or None.
        Requests are issued in order (one SetFreq stream): never before the previous one.
    """
    n = dur_us.shape[0]
    gap = np.zeros(n) if gap_us is None else np.asarray(gap_us, dtype=float)
    start, end = np.empty(n), np.empty(n)
    clock = np.empty(n, dtype=np.int64)
    gap_clock = np.empty(n, dtype=np.int64)
    gap_land = np.full(n, np.nan)
    op_land = np.full(n, np.nan)
    issued: list[list[float]] = []  # per request: trigger, clock, issue, land, landed
    pending: deque[int] = deque()  # requests not landed yet, oldest first (lands increase)
    inner: list[tuple[int, float, int]] = []  # landings inside an op: op, time, clock
    delay = None if delay_us is None else np.asarray(delay_us, dtype=float)
    cur, i, t, k = int(initial_clock), 0, float(start_us), 0
    last_issue = -np.inf
    # the gap before the next op to place: clock at its start, first landing in it
    g_clock, g_land = cur, np.nan
    n_sw = len(triggers)
    while i < n:
        stop = int(triggers[k]) if k < n_sw else n
        if stop <= i:  # issue request k as op i starts (plus its delay)
            s_i = max(t + gap[i], host_us[i] if host_us is not None else -np.inf)
            issue = max(s_i + (delay[k] if delay is not None else 0.0), last_issue)
            last_issue = issue
            land = issue + latency_us
            if pending and issued[pending[-1]][3] > issue:
                # the last request has not landed: this one replaces its target, and the change
                # still lands when it was due (a newer request never postpones it)
                prev = pending.pop()
                issued[prev][4] = 0.0
                land = issued[prev][3]
            pending.append(len(issued))
            issued.append([float(triggers[k]), float(clocks[k]), issue, land, 1.0])
            k += 1
            continue
        host = None if host_us is None else host_us[i:stop]
        s, e = _segment(t, dur_us[i:stop, cur], gap[i:stop], host)
        land = issued[pending[0]][3] if pending else np.inf
        # the first op that starts at or after the landing runs at the new clock
        q = int(np.searchsorted(s, land, side="left")) if land <= s[-1] else stop - i
        j = i + q
        start[i:j], end[i:j], clock[i:j] = s[:q], e[:q], cur
        gap_clock[i:j], gap_land[i:j] = cur, np.nan
        if q:
            gap_clock[i], gap_land[i] = g_clock, g_land
            g_clock, g_land = cur, np.nan
        if q == stop - i:
            i, t = stop, e[-1]
            continue
        new = int(issued[pending.popleft()][1])
        t = e[q - 1] if q else t
        if land > t and np.isnan(g_land):  # lands in the idle gap before op j
            g_land = land
        elif land <= t:  # landed while op j - 1 ran: it kept its clock, op j's gap has the new
            g_clock = new
            if land < t and j > 0:
                inner.append((j - 1, land, new))
                if np.isnan(op_land[j - 1]):
                    op_land[j - 1] = land
        cur, i = new, j
    # the clock each op ends at: the one the gap after it starts at; for the last op, any
    # request still pending that lands before it ends
    end_clock = np.r_[gap_clock[1:], cur] if n else np.empty(0, dtype=np.int64)
    for r in pending if n else ():
        if issued[r][3] < end[-1]:
            if np.isnan(op_land[-1]):
                op_land[-1] = issued[r][3]
            end_clock[-1] = int(issued[r][1])
            inner.append((n - 1, issued[r][3], int(issued[r][1])))
    events = tuple(
        SwitchEvent(int(a), int(c), issue, land, bool(ok)) for a, c, issue, land, ok in issued
    )
    return Execution(
        start,
        end,
        clock,
        gap_clock,
        gap_land,
        op_land,
        end_clock,
        events,
        inner_op=np.array([r[0] for r in inner], dtype=np.int64),
        inner_land_us=np.array([r[1] for r in inner], dtype=float),
        inner_clock=np.array([r[2] for r in inner], dtype=np.int64),
    )


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Op-by-op reference of :func:`execute`: the same semantics, a readable Python loop.

    Returns the start, end and clock index of every op. Tests check :func:`execute` against
    it, and the speed benchmark measures it as the baseline.
    """
    n = dur_us.shape[0]
    gap = np.zeros(n) if gap_us is None else gap_us
    host = np.full(n, -np.inf) if host_us is None else host_us
    t, cur, k, last_issue = 0.0, initial_clock, 0, -np.inf
    pending: list[tuple[float, int]] = []  # (land, clock), oldest first
    start, end = np.empty(n), np.empty(n)
    clock = np.empty(n, dtype=np.int64)
    for i in range(n):
        s = max(t + gap[i], host[i])
        while k < len(triggers) and triggers[k] == i:
            issue = max(s + (0.0 if delay_us is None else delay_us[k]), last_issue)
            last_issue = issue
            land = issue + latency_us
            if pending and pending[-1][0] > issue:
                # a newer request replaces the pending one's target; the change lands when due
                land = pending.pop()[0]
            pending.append((land, int(clocks[k])))
            k += 1
        while pending and pending[0][0] <= s:  # requests landed by the time op i starts
            cur = pending.pop(0)[1]
        start[i], end[i], clock[i] = s, s + dur_us[i, cur], cur
        t = end[i]
    return start, end, clock
