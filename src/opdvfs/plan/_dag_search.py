"""The DAG planner's search for plans: the greedy pass and the neighbourhood search.

:func:`_greedy_fill` spends a plan's slack on slower, cheaper options while the deadline holds;
:func:`_search` improves a plan by re-solving sets of nodes exactly (:func:`_neighbourhoods`;
each with :meth:`opdvfs.plan._dag_lp._Programme.exact`, the other nodes fixed); :func:`_slot_plan`
and :func:`_infeasible` make the :class:`~opdvfs.plan.dag.DagPlan` that
:mod:`opdvfs.plan.dag`'s entry points return.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable

import numpy as np

from opdvfs.plan._dag_lp import _Programme
from opdvfs.plan._dag_problem import _TIME_RTOL, DagPlan, DagProblem, _Options
from opdvfs.plan.dp import gap_pct

#: The neighbourhood search's levels: (band, window). A neighbourhood's nodes choose among the
#: options ``band`` slots either side of their current one, in time windows of ``window``
#: nodes; the search starts with small steps (fast exact solves) and widens them when a pass
#: improves nothing.
_LEVELS = ((4, 24), (8, 32), (24, 48))
#: Windows per window length (they overlap).
_STRIDE = 3
#: Sizes of the groups of neighbouring ranks re-solved together (a group of g ranks within
#: 2/g of the level's band: about the same number of choices as a pair).
_RANK_GROUPS = (2, 3)
#: A search pass that lowers the energy by less than this fraction moves to the next level.
_PASS_GAIN = 1e-4
#: A neighbourhood's exact solve stops within this fraction of its optimum (a move needs only
#: to improve; proving the last 0.01% of a sub-problem costs most of its time).
_HOOD_GAP = 1e-4
#: Seconds one neighbourhood's exact solve may take (a move found by then is kept; HiGHS's
#: heuristics find most moves early, and proving them optimal is what a hard window spends).
_HOOD_TIME_S = 0.1
#: Before the end of the plan's budget, a neighbourhood's solve starts only with this many
#: times the worst overrun seen so far left (:func:`_search`): HiGHS's presolve runs out of its
#: callbacks' reach, and on a shared machine the wall time it takes varies from one solve to
#: the next with the load (measured at 16 stages x 16-32 microbatches, load 9-11: 0.02-0.11 s
#: past a limit of 0.1 s).
_OVERRUN_ROOM = 1.5


def _greedy_fill(
    problem: DagProblem,
    options: _Options,
    slot: np.ndarray,
    deadline_s: float,
    until: float = np.inf,
    *,
    batched: bool = False,
) -> np.ndarray:
    """Move nodes to slower, cheaper options while the deadline holds; best saving rate first.

    Every move keeps the deadline, so past ``until`` (``time.perf_counter``) the plan so far
    is returned.

    A node may take ``float = deadline - (head + duration + tail)`` more time without
    lengthening any path past the deadline (its longest path through it is head + d + tail).
    Each round makes the one move with the best saving per second of float consumed, then
    recomputes the floats (two vectorised passes). ``batched`` makes each round the best
    moves of as many nodes as still keep the deadline and lower the energy together
    (:func:`_batch_round`): on 8 stages x 128 microbatches it reached the same energies as
    one move a round in a third to a quarter of the time (54-68 rounds, where one move a
    round took 260-530).
    """
    rows = np.arange(problem.n_nodes)
    limit = deadline_s * (1 + _TIME_RTOL)
    slot = slot.copy()
    if not batched:
        while True:
            best_k, rate = _best_moves(problem, options, slot, limit)
            if not np.isfinite(rate).any() or _time.perf_counter() >= until:
                return slot
            node = int(np.argmax(rate))
            slot[node] = best_k[node]
    _, start_j, _, head = problem._evaluate(options.clock[rows, slot])
    energy_j, batch = float(start_j), 1
    while True:
        best_k, rate = _best_moves(problem, options, slot, limit, head)
        if not np.isfinite(rate).any() or _time.perf_counter() >= until:
            return slot
        slot, energy_j, head, batch = _batch_round(
            problem, options, slot, energy_j, best_k, rate, batch, limit
        )


#: The batch sizes one batched greedy round tries together, as powers of two times the last
#: round's (:func:`_batch_round`).
_BATCH_LADDER = np.arange(-3, 3)


def _batch_round(
    problem: DagProblem,
    options: _Options,
    slot: np.ndarray,
    energy_j: float,
    best_k: np.ndarray,
    rate: np.ndarray,
    batch: int,
    limit_s: float,
) -> tuple[np.ndarray, float, np.ndarray, int]:
    """One round of the batched greedy pass: return the plan, its energy and heads, next batch.

    The moves are taken best rate first; prefixes of 1 and of ``batch`` x 1/8 ... 4 moves
    (:data:`_BATCH_LADDER`) are evaluated together, in one pass over the graph's levels for
    all of them, and the cheapest that keeps the deadline is kept (the one best move always
    does: it fits its float and saves energy). The next round's batch is twice the one kept.
    The old pass halved its batch one evaluation at a time until one held: on 16 stages x
    128 microbatches about two evaluations and a pass of their own for the heads a round,
    where these are one pass over 4-7 plans, the kept plan's heads reused.
    """
    rows = np.arange(problem.n_nodes)
    movable = int(np.isfinite(rate).sum())
    order = np.argsort(-rate, kind="stable")[:movable]
    sizes = np.unique(np.r_[1, np.clip(batch * 2.0**_BATCH_LADDER, 1, movable).astype(int)])
    place = np.full(problem.n_nodes, movable)
    place[order] = np.arange(movable)
    trials = np.where(place[None, :] < sizes[:, None], best_k[None, :], slot[None, :])
    makespan, trial_e, _, heads = problem._evaluate(options.clock[rows, trials])
    holds = (makespan <= limit_s) & (trial_e < energy_j)
    holds[0] = True
    pick = int(np.argmin(np.where(holds, trial_e, np.inf)))
    return trials[pick], float(trial_e[pick]), heads[pick], 2 * int(sizes[pick])


def _best_moves(
    problem: DagProblem,
    options: _Options,
    slot: np.ndarray,
    limit_s: float,
    head: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each node's best move within its float: its option, and its saving per second.

    The rate is -inf where a node has no move that fits its float and saves energy. ``head``
    is the plan's earliest starts where known already.
    """
    rows = np.arange(problem.n_nodes)
    passes = problem._passes
    per_makespan = problem.n_ranks * problem.blocking_power_w
    dur = options.time_s[rows, slot]
    head = passes.heads(dur) if head is None else head
    tail = passes.tails(dur)
    through = head + dur + tail
    makespan = float(through.max())
    slack = limit_s - through
    new_t = options.time_s  # (n, k)
    longer = new_t - dur[:, None]
    fits = options.valid & (longer <= slack[:, None]) & (longer > 0)
    # a longer critical path also charges every rank's blocking power for the extra time
    extra = np.maximum(head[:, None] + new_t + tail[:, None] - makespan, 0.0)
    with np.errstate(invalid="ignore"):  # padding: inf - inf
        saving = options.cost_j[rows, slot][:, None] - options.cost_j - per_makespan * extra
    good = fits & (saving > 1e-12)
    with np.errstate(invalid="ignore"):
        rate = np.where(good, saving / np.where(good, longer, 1.0), -np.inf)
    best_k = np.argmax(rate, axis=1)
    return best_k, rate[rows, best_k]


def _slot_plan(
    problem: DagProblem,
    options: _Options,
    slot: np.ndarray,
    deadline_s: float,
    bound_j: float,
    method: str,
    status: str,
    started: float,
) -> DagPlan:
    clock = options.clock[np.arange(problem.n_nodes), slot]
    makespan, energy, compute = (float(v) for v in problem.evaluate(clock))
    bound = min(bound_j, energy)
    return DagPlan(
        clock=clock,
        freq_mhz=problem.freqs_mhz[clock],
        start_s=problem.start_times(clock),
        makespan_s=makespan,
        energy_j=energy,
        compute_energy_j=compute,
        deadline_s=deadline_s,
        lower_bound_j=bound,
        gap_pct=gap_pct(energy, bound),
        method=method,
        status=status,
        plan_seconds=_time.perf_counter() - started,
    )


def _infeasible(problem: DagProblem, deadline_s: float, started: float) -> DagPlan:
    nan = float("nan")
    n = problem.n_nodes
    return DagPlan(
        np.full(n, -1),
        np.full(n, nan),
        np.full(n, nan),
        nan,
        nan,
        nan,
        deadline_s,
        nan,
        nan,
        "relaxation",
        "infeasible",
        _time.perf_counter() - started,
    )


def _neighbourhoods(
    problem: DagProblem, slot_start_s: np.ndarray, fractional: np.ndarray, window: int, band: int
) -> list[tuple[np.ndarray, int]]:
    """Return node sets to re-solve exactly with the rest fixed, each with its band.

    The relaxation's fractional nodes, then windows of ``window`` nodes that run at about the
    same time (across ranks), then groups of neighbouring ranks: pairs within ``band``, and
    (from _RANK_GROUPS) larger groups within a band narrowed in proportion.
    """
    n = problem.n_nodes
    size = min(n, window)
    by_time = np.argsort(slot_start_s, kind="stable")
    hoods = [(fractional, band)] if fractional.any() else []
    windows = []
    for first in range(0, max(n - size, 0) + 1, max(size // _STRIDE, 1)):
        mask = np.zeros(n, dtype=bool)
        mask[by_time[first : first + size]] = True
        windows.append((mask, band))
    groups = []
    for group in _RANK_GROUPS:
        narrowed = max(band * 2 // group, 1)
        for r in range(max(problem.n_ranks - group + 1, 0)):
            groups.append(((problem.rank >= r) & (problem.rank < r + group), narrowed))
    # windows first: on the Perseus graphs they found the first moves sooner than rank groups
    return hoods + windows + groups


def _search(
    problem: DagProblem,
    options: _Options,
    programme: Callable[[], _Programme],
    slot: np.ndarray,
    fractional: np.ndarray,
    deadline_s: float,
    until: float,
    certified: Callable[[float], bool],
    overrun_s: list[float] | None = None,
    *,
    hard_end: bool = False,
) -> np.ndarray:
    """Return the plan improved by a variable-neighbourhood search.

    Node sets are re-solved exactly (HiGHS, the others fixed, each free node within a band of
    options around its current one) while time remains and the energy is above
    ``certified`` (a test of an energy against the best bound known, which may rise while the
    search runs). A pass over every set that improves the plan by less than
    :data:`_PASS_GAIN` widens the band and the windows (:data:`_LEVELS`: the plan is then
    about a local optimum of the narrower search). Every accepted plan meets the deadline.
    ``programme`` returns the whole 0/1 programme at the deadline; it is asked for only as a
    solve starts (it may build the programme then: a search out of time builds nothing).

    No solve starts with less time left than the most a solve of this search has run past
    its limit, nor is given a limit past ``until`` less that much. ``overrun_s`` holds the
    most a solve of the plan's searches so far has (s), shared by them and updated here.
    ``hard_end``: ``until`` is the plan's own end (a time limit), not a share of the budget
    handed on to the next phase: there the reserve is :data:`_OVERRUN_ROOM` times the larger
    of the two, so that its first solve is guarded too.
    """
    rows = np.arange(problem.n_nodes)
    best = slot
    best_e = float(problem.evaluate(options.clock[rows, best])[1])
    level = 0
    # the most a neighbourhood's solve has run past its limit (HiGHS's presolve is out of the
    # callbacks' reach: ~0.1 s on 16 stages x 128 microbatches): no solve starts with less left
    learned_s = 0.0
    shared = [0.0] if overrun_s is None else overrun_s
    while level < len(_LEVELS) and not certified(best_e):
        band, window = _LEVELS[level]
        pass_start_e = best_e
        starts = problem.start_times(options.clock[rows, best])
        for hood, hood_band in _neighbourhoods(problem, starts, fractional, window, band):
            left = until - _time.perf_counter()
            reserve_s = _OVERRUN_ROOM * max(learned_s, shared[0]) if hard_end else learned_s
            if left <= reserve_s or certified(best_e):
                return best
            whole = programme()  # built at the plan's first solve: its limit starts after
            limit_s = min(until - _time.perf_counter() - reserve_s, _HOOD_TIME_S)
            solve_started = _time.perf_counter()
            got, _, _ = whole.exact(
                best,
                rel_gap=_HOOD_GAP,
                time_limit_s=limit_s,
                free=hood,
                band=hood_band,
            )
            learned_s = max(learned_s, _time.perf_counter() - solve_started - limit_s)
            shared[0] = max(shared[0], learned_s)
            if got is None:
                continue
            got = _greedy_fill(problem, options, got, deadline_s, until)
            makespan, energy, _ = problem.evaluate(options.clock[rows, got])
            if energy < best_e * (1 - 1e-12) and makespan <= deadline_s * (1 + 1e-6):
                best, best_e = got, float(energy)
                if certified(best_e):
                    return best
        fractional = np.zeros_like(fractional)
        # another pass at this level only while its passes still pay
        level += best_e > pass_start_e * (1 - _PASS_GAIN)
    return best
