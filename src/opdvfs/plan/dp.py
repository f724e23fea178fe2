"""Exact per-stage clock planning: Lagrangian relaxation + Viterbi, certified by its dual bound.

The problem (DESIGN §4): choose a clock ``c_s`` for every stage ``s`` to minimise

    sum_s E[s, c_s] + e_sw * #switches   subject to   sum_s T[s, c_s] + t_sw * #switches <= B,

a multiple-choice knapsack on a chain. Relaxing the time constraint with a multiplier
``lambda >= 0`` leaves ``min sum_s (E + lambda T)[s, c_s] + (e_sw + lambda t_sw) #switches``,
which a Viterbi pass over (stage, previous clock) solves exactly in O(S C). For every ``lambda``,
``L(lambda) - lambda B`` is a lower bound on the optimum (weak duality), so bisection on
``lambda`` gives a feasible plan *and* a certificate of how far from optimal it can be. When the
certified gap exceeds the tolerance, an exact Pareto dynamic programme over (stage, clock, time)
closes it, pruned by the Lagrangian plan's energy and by the cheapest possible remainder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

__all__ = [
    "PlanResult",
    "StageTables",
    "evaluate_plans",
    "exact_frontier",
    "frontier",
    "frontier_plans",
    "solve",
    "solve_min_power",
    "stage_tables",
    "viterbi",
]

Status = Literal["optimal", "feasible", "infeasible"]


@dataclass(frozen=True)
class StageTables:
    """Time and energy of every stage at every clock.

    Attributes
    ----------
    time_s, energy_j
        Shape (n_stages, n_clocks).
    switch_time_s, switch_energy_j
        Cost of one clock change (a stall; the energy of the transition).
    lag_s
        A switch that lands this long after its stage starts (reactive dispatch): the stage's
        first ``lag_s`` run at the previous clock, so a share ``phi = min(lag_s / T_old, 1)`` of
        its work costs the old clock's time and energy. 0 for predictive dispatch.
    """

    time_s: np.ndarray
    energy_j: np.ndarray
    switch_time_s: float = 0.0
    switch_energy_j: float = 0.0
    lag_s: float = 0.0

    @property
    def shape(self) -> tuple[int, int]:
        """(n_stages, n_clocks)."""
        n_stages, n_clocks = self.time_s.shape
        return int(n_stages), int(n_clocks)

    def evaluate(self, clock: np.ndarray) -> tuple[float, float, int]:
        """Time, energy and number of switches of a plan (clock index per stage)."""
        time, energy = evaluate_plans(self, np.asarray(clock)[None, :])
        return float(time[0]), float(energy[0]), int(np.count_nonzero(np.diff(clock)))


def gap_pct(energy_j: float, lower_bound_j: float) -> float:
    """Certified optimality gap (%): how far ``energy_j`` may lie above the optimum."""
    return max(energy_j - lower_bound_j, 0.0) / energy_j * 100 if energy_j > 0 else 0.0


def stage_tables(
    op_time_us: np.ndarray,
    op_energy_j: np.ndarray,
    starts: np.ndarray,
    *,
    switch_time_s: float = 0.0,
    switch_energy_j: float = 0.0,
) -> StageTables:
    """Sum per-op tables (n_ops, n_clocks) into stages starting at ``starts`` (np.add.reduceat)."""
    idx = np.asarray(starts, dtype=int)
    return StageTables(
        time_s=np.add.reduceat(np.asarray(op_time_us, float), idx, axis=0) * 1e-6,
        energy_j=np.add.reduceat(np.asarray(op_energy_j, float), idx, axis=0),
        switch_time_s=switch_time_s,
        switch_energy_j=switch_energy_j,
    )


@dataclass(frozen=True)
class PlanResult:
    """A plan with its certificate.

    ``gap_pct = (energy_j - lower_bound_j) / energy_j * 100``: no plan within the budget uses
    less than ``lower_bound_j``, so the plan is at most ``gap_pct`` percent from optimal. A
    mean-power plan (:func:`solve_min_power`) bounds power instead: ``lower_bound_j`` is None,
    ``lower_bound_power_w`` holds the bound and ``gap_pct`` is the gap in power.
    """

    clock: np.ndarray
    time_s: float
    energy_j: float
    switches: int
    lower_bound_j: float | None
    gap_pct: float
    status: Status
    lam: float
    budget_s: float
    lower_bound_power_w: float | None = None

    @classmethod
    def infeasible(
        cls, budget_s: float, *, lower_bound_j: float | None = None, lam: float = 0.0
    ) -> PlanResult:
        """Return the result of a budget no plan fits (no clock, infinite time and energy)."""
        return cls(
            clock=np.empty(0, dtype=np.int64),
            time_s=np.inf,
            energy_j=np.inf,
            switches=0,
            lower_bound_j=lower_bound_j,
            gap_pct=np.inf,
            status="infeasible",
            lam=lam,
            budget_s=budget_s,
        )


def viterbi(tables: StageTables, lam: float | np.ndarray) -> np.ndarray:
    """Clock per stage minimising ``E + lam T`` with switch costs, exactly, for each ``lam``.

    The recursion is over (stage, clock): staying costs nothing, switching from the best clock
    of the previous stage costs ``e_sw + lam t_sw``, so each stage is O(C); a vector of
    multipliers is solved in the same pass (shape (K,) -> plans of shape (K, S)). Without
    switch costs or lag the recursion needs no loop over stages (:func:`_viterbi_free`).
    """
    lams = np.atleast_1d(np.asarray(lam, dtype=float))
    free = tables.lag_s <= 0 and not np.any(tables.switch_energy_j + lams * tables.switch_time_s)
    clock = _viterbi_free(tables, lams) if free else _viterbi_loop(tables, lams)
    return clock if np.ndim(lam) else clock[0]


#: Stages per block of :func:`_viterbi_free`: bounds its (K, block, C) temporaries.
_BLOCK_STAGES = 16384


def _viterbi_free(tables: StageTables, lams: np.ndarray) -> np.ndarray:
    """:func:`_viterbi_loop` for free switches, with the same floating-point sums and ties.

    With nothing to pay for a switch, the loop's ``best[s] = min(best[s-1], m[s-1]) + cost[s]``
    is ``m[s-1] + cost[s]`` (``m`` the running minimum), and because rounding is monotone
    ``m[s] = m[s-1] + min(cost[s])``: a running sum (``np.add.accumulate`` adds in order, as
    the loop does). The loop's backtrack keeps the next stage's clock where it ties the
    minimum and otherwise takes the first minimum, so only stages with a tied minimum need a
    step back one at a time; every other stage takes its first argmin.

    Returns
    -------
    ndarray, shape (K, S)
        Clock index per stage for each multiplier.
    """
    n_stages, n_clocks = tables.shape
    k = len(lams)
    origin = np.empty((k, n_stages), dtype=np.int64)  # the loop's argmin of best[s]
    tied: dict[int, np.ndarray] = {}  # stage -> (K, C) clocks at the minimum, where > 1 are
    carry = np.zeros(k)  # m[s-1] entering a block (0 before stage 0: cost[0] + 0 is cost[0])
    # (K, C, stages) blocks: the minima over the clocks are then C - 1 elementwise minima of
    # rows of stages, not a reduction along every stage's few clocks (the same values)
    energy_t = np.ascontiguousarray(tables.energy_j.T)
    time_t = np.ascontiguousarray(tables.time_s.T)
    for lo in range(0, n_stages, _BLOCK_STAGES):
        hi = min(lo + _BLOCK_STAGES, n_stages)
        cost = energy_t[None, :, lo:hi] + lams[:, None, None] * time_t[None, :, lo:hi]
        step = cost.min(axis=1)
        if lo == 0:
            # best[0] is cost[0] itself, not 0 + cost[0] (-0.0 + 0.0 would differ in sign)
            reach = np.add.accumulate(step, axis=1)
            best = np.empty_like(cost)
            best[:, :, :1] = cost[:, :, :1]
            np.add(reach[:, None, :-1], cost[:, :, 1:], out=best[:, :, 1:])
        else:
            reach = np.add.accumulate(np.c_[carry, step], axis=1)[:, 1:]
            best = np.concatenate([carry[:, None], reach[:, :-1]], axis=1)[:, None, :] + cost
        carry = reach[:, -1]
        at_min = best == reach[:, None, :]
        first = np.zeros((k, hi - lo), dtype=np.int64)  # the first clock at the minimum
        for c in range(n_clocks - 1, -1, -1):
            first[at_min[:, c]] = c
        origin[:, lo:hi] = first
        for j in np.flatnonzero((at_min.sum(axis=1) > 1).any(axis=0)):
            tied[lo + int(j)] = at_min[:, :, j]
    clock = origin.copy()
    rows = np.arange(k)
    # from the last stage back, a stage with a tied minimum keeps its successor's clock when
    # that clock is one of the minima (the loop prefers staying)
    for s in sorted(tied, reverse=True):
        if s + 1 < n_stages:
            after = clock[:, s + 1]
            clock[:, s] = np.where(tied[s][rows, after], after, origin[:, s])
    return clock


def _viterbi_loop(tables: StageTables, lams: np.ndarray) -> np.ndarray:
    """Run the Viterbi recursion stage by stage: switch costs and the reactive lag (K, S)."""
    n_stages, n_clocks = tables.shape
    k = len(lams)
    cost = tables.energy_j[None, :, :] + lams[:, None, None] * tables.time_s[None, :, :]
    jump = tables.switch_energy_j + lams * tables.switch_time_s
    best = cost[:, 0, :].copy()
    back = np.empty((n_stages, k, n_clocks), dtype=np.int32)
    stay = np.broadcast_to(np.arange(n_clocks, dtype=np.int32), (k, n_clocks))
    rows = np.arange(k)
    lagging = tables.lag_s > 0
    if lagging:
        phi = np.minimum(tables.lag_s / tables.time_s, 1.0)  # (S, C): share run at the old clock
        off = ~np.eye(n_clocks, dtype=bool)
    for s in range(1, n_stages):
        if lagging:
            # arriving at b from a: (1 - phi_a) cost_b + phi_a cost_a, O(C^2) per stage
            here = cost[:, s, :]
            mix = (1 - phi[s][None, :, None]) * here[:, None, :] + phi[s][None, :, None] * here[
                :, :, None
            ]
            total = best[:, :, None] + np.where(off, mix + jump[:, None, None], here[:, None, :])
            back[s] = np.argmin(total, axis=1)
            best = np.take_along_axis(total, back[s][:, None, :].astype(np.int64), 1)[:, 0, :]
            continue
        origin = np.argmin(best, axis=1)
        switch = best[rows, origin] + jump
        keep = best <= switch[:, None]
        back[s] = np.where(keep, stay, origin[:, None])
        best = np.where(keep, best, switch[:, None]) + cost[:, s, :]
    clock = np.empty((k, n_stages), dtype=np.int64)
    clock[:, -1] = np.argmin(best, axis=1)
    for s in range(n_stages - 1, 0, -1):
        clock[:, s - 1] = back[s, rows, clock[:, s]]
    return clock


def evaluate_plans(tables: StageTables, plans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Time and energy (switches and lagging switches included) of K plans (K, S), at once."""
    rows = np.arange(plans.shape[1])
    switches = np.count_nonzero(np.diff(plans, axis=1), axis=1)
    t_at, e_at = tables.time_s[rows, plans], tables.energy_j[rows, plans]
    time = t_at.sum(axis=1) + switches * tables.switch_time_s
    energy = e_at.sum(axis=1) + switches * tables.switch_energy_j
    if tables.lag_s > 0 and plans.shape[1] > 1:
        # stage s's first lag_s at the previous stage's clock
        old = plans[:, :-1]
        t_old, e_old = tables.time_s[rows[1:], old], tables.energy_j[rows[1:], old]
        phi = np.where(old != plans[:, 1:], np.minimum(tables.lag_s / t_old, 1.0), 0.0)
        time = time + (phi * (t_old - t_at[:, 1:])).sum(axis=1)
        energy = energy + (phi * (e_old - e_at[:, 1:])).sum(axis=1)
    return time, energy


def _lagrangian(
    tables: StageTables, budget: float, tol: float, rounds: int
) -> tuple[np.ndarray | None, float, float, float, float]:
    """Multi-section search on lambda: (best feasible plan, its energy, best dual bound, lambda).

    Each round solves 16 multipliers in one vectorised Viterbi pass and narrows the bracket
    between the largest infeasible and the smallest feasible one; every multiplier visited
    tightens the dual bound ``E + lambda (T - B)``. The last value is the multiplier of the
    best bound (the exact programme prices time with it).
    """
    best_plan: np.ndarray | None = None
    best_e, bound, best_lam, bound_lam = np.inf, -np.inf, 0.0, 0.0

    def visit(lams: np.ndarray) -> np.ndarray:
        nonlocal best_plan, best_e, bound, best_lam, bound_lam
        plans = viterbi(tables, lams)
        time, energy = evaluate_plans(tables, plans)
        duals = energy + lams * (time - budget)
        if duals.max() > bound:
            bound, bound_lam = float(duals.max()), float(lams[int(np.argmax(duals))])
        feasible = time <= budget * (1 + 1e-12)
        if feasible.any():
            j = int(np.flatnonzero(feasible)[np.argmin(energy[feasible])])
            if energy[j] < best_e:
                best_plan, best_e, best_lam = plans[j], float(energy[j]), float(lams[j])
        return feasible

    scale = float(np.abs(tables.energy_j).sum() / max(np.abs(tables.time_s).sum(), 1e-300))
    grid = np.r_[0.0, scale * 4.0 ** np.arange(-12, 13)]
    feasible = visit(grid)
    if feasible[0]:  # the unconstrained optimum fits: it is optimal
        return best_plan, best_e, best_e, 0.0, 0.0
    if not feasible.any():
        return None, np.inf, bound, 0.0, bound_lam
    hi = grid[int(np.flatnonzero(feasible)[0])]
    lo = grid[int(np.flatnonzero(feasible)[0]) - 1]
    for _ in range(rounds):
        if best_e - bound <= tol * abs(best_e):
            break
        lams = np.linspace(lo, hi, 18)[1:-1]
        feasible = visit(lams)
        inside = np.r_[lo, lams, hi]
        ok = np.r_[False, feasible, True]
        first = int(np.argmax(ok))
        lo, hi = inside[first - 1], inside[first]
    return best_plan, best_e, bound, best_lam, bound_lam


def _cost_to_go(tables: StageTables, lam: float) -> np.ndarray:
    """Least Lagrangian cost ``E + lam T`` of stages ``s+1 ..`` given stage ``s``'s clock.

    ``V[s, a]`` is exact (a backward Viterbi pass: switch costs and the reactive lag included),
    so for every plan within the budget that runs stage ``s`` at ``a`` after a partial plan of
    time ``t`` and energy ``e``, its energy is at least ``e + lam t + V[s, a] - lam B`` (the
    remainder takes at most ``B - t``): the pruning bound of :func:`_pareto_exact`.
    """
    n_stages, n_clocks = tables.shape
    cost = tables.energy_j + lam * tables.time_s
    jump = tables.switch_energy_j + lam * tables.switch_time_s
    value = np.zeros((n_stages, n_clocks))
    off = ~np.eye(n_clocks, dtype=bool)
    for s in range(n_stages - 2, -1, -1):
        here, ahead = cost[s + 1], value[s + 1]
        if tables.lag_s > 0:
            # from a to b: (1 - phi_a) cost_b + phi_a cost_a + jump, the stage's first lag at a
            phi = np.minimum(tables.lag_s / tables.time_s[s + 1], 1.0)[:, None]
            move = (1 - phi) * here[None, :] + phi * here[:, None] + jump + ahead[None, :]
            value[s] = np.where(off, move, (here + ahead)[None, :]).min(axis=1)
        else:
            value[s] = np.minimum(here + ahead, jump + float(np.min(here + ahead)))
    return value


def _pareto_states(
    tables: StageTables, budget: float, upper_j: float, lam: float, max_states: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Dynamic programming over (time, energy) Pareto fronts per clock, stage by stage.

    A partial plan is kept only if the fastest remainder keeps it within the budget and, priced
    at the multiplier ``lam`` (the best dual's), even the cheapest remainder keeps it at or
    below ``upper_j`` (a plan's energy; :func:`_cost_to_go`): with the dual's own ``lam``
    only plans within the certified gap of the optimum survive, so the fronts stay small.
    All states of a stage are extended to every clock at once.

    Returns
    -------
    (time, energy, plans) of the last stage's states (plans: clock per stage, one row per
    state), or None when no state survives or a front grows past ``max_states``.
    """
    n_stages, n_clocks = tables.shape
    t_rest = np.r_[np.cumsum(tables.time_s.min(axis=1)[::-1])[::-1][1:], 0.0]
    to_go = _cost_to_go(tables, lam)
    slack = 1 + 1e-12
    # an absolute slack on energy: shifted tables (the power objective) have optima near 0,
    # where a relative one keeps not even the plan that set ``upper_j``
    scale = float(np.abs(tables.energy_j).sum())
    scale = max(abs(upper_j), scale) if np.isfinite(upper_j) else scale
    upper_j = upper_j + 1e-12 * scale
    limit = upper_j + lam * budget * slack if lam else upper_j  # 0 x inf budget: no term
    switching_costs = bool(tables.switch_time_s or tables.switch_energy_j or tables.lag_s)
    clocks = np.arange(n_clocks)
    flat_t = tables.time_s[0].copy()
    flat_e = tables.energy_j[0].copy()
    flat_c = clocks.copy()
    flat_back = np.full(n_clocks, -1)
    history: list[tuple[np.ndarray, np.ndarray]] = []
    for s in range(n_stages):
        if s > 0:
            # every state (rows) extended to every clock (columns)
            prev = flat_c[:, None]
            change = prev != clocks[None, :]
            t_old, e_old = tables.time_s[s, flat_c][:, None], tables.energy_j[s, flat_c][:, None]
            t_new, e_new = tables.time_s[s][None, :], tables.energy_j[s][None, :]
            # a lagging switch runs the share phi of stage s at the previous clock
            phi = change * np.minimum(tables.lag_s / t_old, 1.0)
            t = flat_t[:, None] + t_new + change * tables.switch_time_s + phi * (t_old - t_new)
            e = flat_e[:, None] + e_new + change * tables.switch_energy_j + phi * (e_old - e_new)
            back = np.broadcast_to(np.arange(len(flat_t))[:, None], t.shape).ravel()
            label = np.broadcast_to(clocks[None, :], t.shape).ravel()
            t, e = t.ravel(), e.ravel()
        else:
            t, e, back, label = flat_t, flat_e, flat_back, flat_c
        ok = (t + t_rest[s] <= budget * slack) & (e + lam * t + to_go[s, label] <= limit)
        t, e, back, label = t[ok], e[ok], back[ok], label[ok]
        if t.size == 0:
            return None
        # Pareto front per clock: sorted by (clock, time, energy), a state survives if it is
        # cheaper than every faster one of its clock; the offset per clock makes one running
        # minimum serve every clock (a later clock's values lie below all earlier ones). When
        # switching is free, the last clock does not matter to the future: one front for all.
        group = label if switching_costs else np.zeros_like(label)
        order = np.lexsort((e, t, group))
        t, e, back, label, group = t[order], e[order], back[order], label[order], group[order]
        span = float(e.max() - e.min()) + 1.0
        shifted = (e - e.min()) - group * 2.0 * span
        best_before = np.r_[np.inf, np.minimum.accumulate(shifted)[:-1]]
        front = shifted < best_before - 1e-12 * scale
        flat_t, flat_e, flat_back, flat_c = t[front], e[front], back[front], label[front]
        if flat_t.size > max_states:
            return None
        history.append((flat_c, flat_back))
    plans = np.empty((len(flat_t), n_stages), dtype=np.int64)
    idx = np.arange(len(flat_t))
    for s in range(n_stages - 1, -1, -1):
        labels, backs = history[s]
        plans[:, s] = labels[idx]
        idx = backs[idx]
    return flat_t, flat_e, plans


def _pareto_exact(
    tables: StageTables,
    budget: float,
    upper_j: float,
    lam: float = 0.0,
    max_states: int = 200_000,
) -> np.ndarray | None:
    """Exact optimum within ``budget`` (:func:`_pareto_states`), or None past ``max_states``."""
    found = _pareto_states(tables, budget, upper_j, lam, max_states)
    if found is None:
        return None
    _, energy, plans = found
    return plans[int(np.argmin(energy))]


def exact_frontier(
    tables: StageTables, max_states: int = 200_000
) -> tuple[np.ndarray, np.ndarray] | None:
    """Return every Pareto-optimal plan (K, S) and its rows (time, energy), sorted by time.

    Unlike :func:`frontier` (the lower convex hull that a sweep of ``lambda`` reaches), this is
    the whole staircase: for every time budget, the least energy of any plan within it is the
    energy of the slowest row that fits. None when a front grows past ``max_states`` states.
    """
    found = _pareto_states(tables, np.inf, np.inf, 0.0, max_states)
    if found is None:
        return None
    time, energy, plans = found
    order = np.lexsort((energy, time))
    time, energy, plans = time[order], energy[order], plans[order]
    scale = float(np.abs(energy).max()) if energy.size else 1.0
    keep = energy < np.r_[np.inf, np.minimum.accumulate(energy)[:-1]] - 1e-12 * scale
    return plans[keep], np.column_stack([time[keep], energy[keep]])


def _greedy_fill(
    tables: StageTables, budget: float, plan: np.ndarray, max_moves: int | None = None
) -> np.ndarray:
    """Spend the time a Lagrangian plan leaves unused: the best energy-per-second moves first.

    The dual only reaches plans on the convex hull of the time-energy frontier; where a stage's
    energy is not convex in its clock, the best plan within the budget can lie between two hull
    plans. Starting from the feasible one, repeatedly move one stage to the clock that saves the
    most energy per second of budget spent (moves that save time too go first), while the whole
    plan, switch costs included, still fits; at most ``max_moves`` moves (4 per stage).
    """
    plan = plan.copy()
    rows = np.arange(tables.shape[0])
    time, energy = evaluate_plans(tables, plan[None, :])
    spent, best = float(time[0]), float(energy[0])
    limit = budget * (1 + 1e-12)
    for _ in range(max_moves if max_moves is not None else 4 * tables.shape[0]):
        d_t = tables.time_s - tables.time_s[rows, plan][:, None]
        d_e = tables.energy_j - tables.energy_j[rows, plan][:, None]
        fits = np.flatnonzero((d_e < 0) & (d_t <= limit - spent))
        if fits.size == 0:
            break
        with np.errstate(divide="ignore"):  # inf where the move saves time too
            gain = -d_e.flat[fits] / np.maximum(d_t.flat[fits], 0.0)
        for flat in fits[np.argsort(gain)[::-1][:64]]:
            trial = plan.copy()
            trial[flat // tables.shape[1]] = flat % tables.shape[1]
            t_new, e_new = evaluate_plans(tables, trial[None, :])
            if t_new[0] <= limit and e_new[0] < best:
                plan, spent, best = trial, float(t_new[0]), float(e_new[0])
                break
        else:
            break  # no candidate survives the exact check (switch costs, lag)
    return plan


#: Problems of at most this many stage-clock cells are closed with the exact Pareto programme by
#: default (:func:`solve`), and planned to their exact optimum by
#: :func:`~opdvfs.plan.planner.plan_schedule` (``tol=0``).
EXACT_CELLS = 4000


def solve(
    tables: StageTables,
    budget_s: float,
    *,
    tol: float = 1e-4,
    rounds: int = 8,
    exact: bool | None = None,
    max_states: int = 200_000,
    repair: bool = True,
) -> PlanResult:
    """Minimise energy within ``budget_s``; return the plan, its dual bound and certified gap.

    Parameters
    ----------
    tables
        Stage time/energy tables; the last clock index must be the fastest (top) clock.
    budget_s
        Time allowed, e.g. ``(1 + target) * baseline``.
    tol
        Relative gap at which the multiplier search stops.
    rounds
        Multi-section rounds of the multiplier search (16 multipliers each).
    exact
        Close a remaining gap with the exact Pareto programme (abandoned past ``max_states``
        states per stage, keeping the certified Lagrangian plan). Default: only for small
        problems (stages x clocks <= :data:`EXACT_CELLS`), where it is fast.
    repair
        Spend the budget the Lagrangian plan leaves unused with a greedy fill
        (:func:`_greedy_fill`) before the exact programme; off only to measure its effect.
    """
    plan, energy, bound, lam, bound_lam = _lagrangian(tables, budget_s, tol, rounds)
    if plan is None:
        return PlanResult.infeasible(budget_s, lower_bound_j=bound, lam=lam)
    status: Status = "optimal" if energy - bound <= tol * abs(energy) else "feasible"
    if status == "feasible" and repair:
        plan = _greedy_fill(tables, budget_s, plan)
        _, energy, _ = tables.evaluate(plan)
        if energy - bound <= tol * abs(energy):
            status = "optimal"
    if exact is None:
        exact = tables.shape[0] * tables.shape[1] <= EXACT_CELLS
    if status == "feasible" and exact:
        better = _pareto_exact(tables, budget_s, energy, bound_lam, max_states)
        if better is not None:
            plan = better
            _, energy, _ = tables.evaluate(plan)
            bound, status = energy, "optimal"
    t, e, switches = tables.evaluate(plan)
    gap = gap_pct(e, bound)
    return PlanResult(
        clock=plan,
        time_s=t,
        energy_j=e,
        switches=switches,
        lower_bound_j=float(bound),
        gap_pct=gap,
        status=status,
        lam=lam,
        budget_s=budget_s,
    )


def frontier_plans(tables: StageTables, points: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Return the frontier's plans (K, S) and rows (time, energy, lambda): :func:`frontier`."""
    scale = float(np.abs(tables.energy_j).sum() / max(np.abs(tables.time_s).sum(), 1e-300))
    lams = np.r_[0.0, scale * np.geomspace(1e-6, 1e6, points - 1)]
    plans = viterbi(tables, lams)
    time, energy = evaluate_plans(tables, plans)
    order = np.lexsort((energy, time))
    time, energy, lams, plans = time[order], energy[order], lams[order], plans[order]
    keep = energy < np.r_[np.inf, np.minimum.accumulate(energy)[:-1]] * (1 - 1e-12)
    return plans[keep], np.column_stack([time[keep], energy[keep], lams[keep]])


def frontier(tables: StageTables, points: int = 64) -> np.ndarray:
    """Return the time-energy frontier as rows (time, energy, lambda), sorted by time.

    Sweeping ``lambda`` from 0 (least energy) to large (least time) traces the lower convex
    hull of all plans' (time, energy), like Perseus' pipeline frontier; one vectorised Viterbi
    pass per 64 multipliers. Dominated and repeated points are removed; sorted by time.
    """
    return frontier_plans(tables, points)[1]


def solve_min_power(tables: StageTables, budget_s: float, *, iterations: int = 20) -> PlanResult:
    """Minimise mean power ``E / T`` within the budget (Dinkelbach's method on ``E - q T``).

    Each step solves the energy problem with ``E' = E - q T`` (``q`` the current plan's power)
    exactly as :func:`solve` does; ``q`` falls monotonically to the optimal power. The shifted
    tables keep every other field of ``tables`` (switch costs, the reactive lag).

    The certificate is on power, not energy: the last subproblem's bound ``LB`` holds
    ``E - q T >= LB`` for every plan within the budget, so ``E / T >= q + LB / T``; with
    ``T <= budget_s`` when ``LB >= 0`` and ``T >= `` the fastest plan's time when ``LB < 0``,
    that is a lower bound on the mean power of every feasible plan. The result's
    ``lower_bound_j`` is None (no energy bound follows) and ``gap_pct`` is the power gap
    ``(P - P_lb) / P * 100``, with ``lower_bound_power_w = P_lb``.
    """
    q = 0.0
    result = solve(tables, budget_s)
    if result.status == "infeasible":
        return result
    q = result.energy_j / result.time_s
    assert result.lower_bound_j is not None  # an energy solve always bounds energy
    bound_w = _power_bound(tables, budget_s, 0.0, result.lower_bound_j)
    for _ in range(iterations):
        shifted = replace(
            tables,
            energy_j=tables.energy_j - q * tables.time_s,
            switch_energy_j=tables.switch_energy_j - q * tables.switch_time_s,
        )
        sub = solve(shifted, budget_s)
        if sub.status == "infeasible":
            break
        t, e, sw = tables.evaluate(sub.clock)
        assert sub.lower_bound_j is not None
        bound_w = max(bound_w, _power_bound(tables, budget_s, q, sub.lower_bound_j))
        if e / t < result.energy_j / result.time_s:
            result = replace(
                result, clock=sub.clock, time_s=t, energy_j=e, switches=sw, lam=sub.lam
            )
        q_new = result.energy_j / result.time_s
        if abs(q_new - q) <= 1e-9 * abs(q_new):
            break
        q = q_new
    power_w = result.energy_j / result.time_s
    bound_w = min(max(bound_w, 0.0), power_w)
    gap = (power_w - bound_w) / power_w * 100 if power_w > 0 else 0.0
    return replace(
        result,
        lower_bound_j=None,
        lower_bound_power_w=bound_w,
        gap_pct=gap,
        status="optimal" if gap <= 1e-2 else "feasible",
    )


def _power_bound(tables: StageTables, budget_s: float, q: float, shifted_bound_j: float) -> float:
    """Lower bound on ``E / T`` over plans within the budget, from ``min (E - q T) >= LB``."""
    if shifted_bound_j >= 0:
        return q + shifted_bound_j / budget_s
    # no plan is faster than every stage at its fastest clock (switches and lag only add time)
    return q + shifted_bound_j / float(tables.time_s.min(axis=1).sum())
