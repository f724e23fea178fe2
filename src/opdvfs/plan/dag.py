"""Clock planning on a dependency graph: every rank of a pipeline-parallel job planned together.

A pipeline-parallel iteration is a DAG (DESIGN §4 "Many ranks"): its nodes are the ranks'
computations (Perseus's *instructions*, one forward or backward of one microbatch on one stage),
each runnable at any of the device's clocks with a measured (time, energy) per clock; its edges
are the order on each rank, the sends/receives between ranks, and collectives (a zero-time
barrier node). A node starts when all its predecessors have finished; the iteration's makespan is
the longest path. :func:`solve_dag` picks one clock per node to minimise the energy subject to

    makespan <= (1 + target) x makespan at the top clock (all-max).

**Energy definition** (Perseus's *effective energy*, SOSP'24 §4.2; a documented choice): every
rank draws ``blocking_power_w`` whenever it is not computing, from the iteration's start to its
end (the makespan: the iteration ends on every rank together, at the optimizer step). So

    E = sum_i E_i(c_i) + P_block x (n_ranks x makespan - sum_i t_i(c_i))
      = sum_i [E_i(c_i) - P_block t_i(c_i)] + n_ranks x P_block x makespan,

where ``n_ranks`` counts the ranks of one pipeline (data-parallel replicas multiply every term
alike). ``blocking_power_w = 0`` charges the computations only.

**Method.** (1) Each node keeps its Pareto-optimal options in (time, effective energy).
(2) The 0/1 programme is stated in threshold form (``y[i, k] = 1``: node ``i`` runs at its
``k``-th fastest option or slower; :class:`_Programme`) with start times and a makespan
variable; its linear relaxation, solved by HiGHS, is a lower bound on every plan's energy
(each node's options relaxed to their lower convex hull, as in the discrete time-cost
trade-off literature; Phillips-Dessouky's cut method, which Perseus runs through lowtime,
works on such a continuous relaxation and rounds it without a bound). (3) Rounding each node
down to the slowest option not slower than its relaxed duration keeps every path no longer,
so the deadline still holds; a greedy pass then spends the slack that rounding freed (the
longest-path float of every node, two vectorised passes over the graph's topological
levels). (4) While that plan is further than ``rel_gap`` above the bound, a
variable-neighbourhood search re-solves sets of nodes exactly (HiGHS, the other nodes fixed,
each free node within a band of options around its current one): the relaxation's
fractional nodes, windows of nodes that run at about the same time, pairs and triples of
neighbouring ranks; a pass that improves nothing widens the band and the windows. Half its
time goes to the rounded relaxation, the rest to a second start, the relaxation rounded by
diving (fix the thresholds nearest to integral, re-solve, repeat; Berthold 2006, "Primal
heuristics for MIP"): the two lie in different basins of the search. (5) Meanwhile, in a
second thread, HiGHS's branch and bound on a copy of the whole 0/1 programme, its primal
heuristics off, raises the lower bound (HiGHS releases the GIL; on two cores the search and the
bound progress together); the search stops as soon as its plan is within ``rel_gap`` of that
bound. (6) Most of ``time_limit_s`` beyond its first second goes to HiGHS's branch and bound
with its heuristics, from the best plan (warm start), for better plans. Every result carries
its certified bound and gap. A frontier (:func:`dag_frontier`) plans its deadlines from the
tightest up, each warm-started from the one before.

The code, by concern: the problem and plan types in :mod:`opdvfs.plan._dag_problem` (exported
here), the programme on HiGHS, its bound worker and Ctrl-C in :mod:`opdvfs.plan._dag_lp`, the
greedy pass and the neighbourhood search in :mod:`opdvfs.plan._dag_search`; this module states
the budget and runs them.

**Anytime.** Every phase runs within ``time_limit_s``: the relaxation is stated on each node's
convex-hull options alone (the same optimum, a third of the columns, no nesting rows:
:meth:`~opdvfs.plan._dag_problem._Options.hull`; 0.3-1.1 s at 128 microbatches x 16 stages,
where the whole programme's took 4-10 s), and every HiGHS solve stops at its limit through
HiGHS's simplex and MIP interrupt callbacks. A relaxation that does not finish in time leaves
the all-max plan stretched to the deadline (method ``stretched``). HiGHS's branch and bound
solves its root LP out of the callbacks' reach, so the bound worker and the final branch and
bound start only where that root is expected within 30% of the seconds left
(:func:`_root_seconds`); on larger graphs the neighbourhood search takes their time.

**Large graphs** (:data:`_LARGE_NODES`, 128 microbatches x 8 stages and up): the relaxation
starts from the all-slowest basis (:meth:`~opdvfs.plan._dag_lp._Programme.start_slowest`,
20-80% less CPU); the greedy pass moves many nodes a round; the relaxation is also rounded in
time order, re-solved after each of 8 groups of nodes
(:meth:`~opdvfs.plan._dag_lp._Programme.roll`), and the cheaper plan kept: in a pipeline's
steady state every stage runs at one duration between two hull options, and only a rounding
that mixes the two in step across the stages keeps near the bound. Where time is left and
the plan is not within ``rel_gap``, the relaxation is rounded in time order again, from the
latest nodes back (:meth:`_Rounding.latest_first`), and the cheaper plan kept. A relaxation
stopped at the limit still certifies a bound, the Lagrangian of its duals so far
(:meth:`~opdvfs.plan._dag_lp._Programme.dual_bound`), and its last iterate, scaled into the
deadline, is a plan beside the stretched one (:func:`_first_plan`); on a long pipeline so is
the plan of its steady state, relaxed on the pipeline with twice as many microbatches as stages
(:mod:`opdvfs.plan._dag_steady`). Smaller graphs take the
rolling rounding too, after the plain one's greedy pass where that is not within ``rel_gap``
of the bound, and keep the cheaper (with a time limit only).
"""

from __future__ import annotations

import os
import time as _time
from dataclasses import dataclass, field, replace
from functools import cache, partial
from typing import Any

import numpy as np
import pandas as pd

from opdvfs.plan._dag_lp import (
    _NO_WORKER,
    _BoundWorker,
    _ctrl_c_stops_highs,
    _OutOfTime,
    _Programme,
)
from opdvfs.plan._dag_problem import (
    _TIME_RTOL,
    DagPlan,
    DagProblem,
    _deadline,
    _Options,
    topological_levels,
)
from opdvfs.plan._dag_search import _greedy_fill, _infeasible, _search, _slot_plan
from opdvfs.plan._dag_steady import _steady_plan

__all__ = [
    "TIME_LIMIT_S",
    "DagPlan",
    "DagProblem",
    "dag_frontier",
    "solve_dag",
    "solve_dag_milp",
    "topological_levels",
]

#: Share of the search's seconds the dive may take.
_DIVE_SHARE = 0.2
#: Share of the search's seconds (from the start) the search from the first start may take;
#: the rest goes to the search from the dive.
_FIRST_START_SHARE = 0.5
#: The dive is searched from only if it is within this fraction above the first start's best.
_DIVE_ROOM = 0.01
#: Share of the time budget's first second, and of the rest, the neighbourhood search may use
#: (branch and bound with HiGHS's heuristics gets the rest: the search finds plans faster, and
#: the bound worker raises the bound beside both).
_SEARCH_SHARE, _SEARCH_SHARE_LATER = 1.0, 0.1
#: Seconds kept back from branch and bound for what follows it (HiGHS stops a little late).
_WRAP_UP_S = 0.03
#: The bound worker, and branch and bound on the whole programme, start only if HiGHS is
#: expected to finish their root within this share of the seconds left. Its branch and bound
#: solves the root on an LP solver of its own, which neither its time limit nor the
#: interrupt callbacks reach: started on a root it could not finish, it ran 10-40 s past a
#: limit of 5 s, and a worker told to stop 0.3 s into it stopped 18 s (CPU) later.
_ROOT_ROOM = 0.3
#: Seconds from the start of branch and bound to its first interrupt past the root, on a
#: programme of _ROOT_COLUMNS threshold columns, and their growth with the columns: measured
#: (CPU, the bound worker's settings) 0.12, 0.39, 1.2 and 5.4 s on the GPT-3 A40 graphs of 8,
#: 16, 32 and 64 microbatches (2824 to 22592 columns), 0.11, 0.33 and 1.3 s on BLOOM A100.
_ROOT_S, _ROOT_COLUMNS, _ROOT_GROWTH = 0.12, 2824, 1.8
#: Share of its seconds a branch and bound (the bound worker's, the final one) is given, over
#: the load (:func:`_load`): past the root HiGHS still runs out of the callbacks' reach for a
#: while (a node's LP, a cut round): at 16 microbatches, 2 s, they ran 0.07-0.6 s past their
#: limits, and 0.23 s past 0.75 of them at load 5 on 2 cores.
_MIP_SHARE = 0.75


def _load(wall_s: float, cpu_s: float) -> float:
    """Return how many times slower than its CPU time work runs now (1 to 4).

    The larger of the relaxation's wall over CPU time (where it took long enough to tell) and
    the load average per core: on the shared 2-core machine, at load 5-6, a root of 0.4 s
    (CPU) took 2 s of wall time, past a budget of 0.85 s.
    """
    measured = wall_s / cpu_s if cpu_s > 0.01 else 1.0
    try:
        queued = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        queued = 1.0
    return min(max(measured, queued, 1.0), 4.0)


def _root_seconds(columns: int, load: float) -> float:
    """Return the expected wall seconds of branch and bound's root on ``columns`` columns.

    ``load`` is the wall time over the CPU time the relaxation just took (>= 1 where other
    work shares the cores).
    """
    return _ROOT_S * (columns / _ROOT_COLUMNS) ** _ROOT_GROWTH * load


#: Graphs of at least this many nodes (128 microbatches x 8 stages, 64 x 16) start their
#: relaxation from the all-slowest basis (:meth:`_Programme.start_slowest`), take the greedy
#: pass in batches and, after it, the relaxation rounded in time order
#: (:meth:`_Programme.roll`): on them one move a round did not finish within the default
#: budget (0.6-1.1 s at 8 stages x 128 microbatches) and the search gains little. Smaller
#: graphs plan as before (up to 32 microbatches the search and branch and bound take them
#: within 0.1-0.2% of the bound).
_LARGE_NODES = 2048
#: A large graph's relaxation is rounded in time order first where the plain rounding is
#: further than this fraction above the bound (:meth:`_Rounding.first`).
_ROLL_FIRST = 3e-3
#: ... and only with this many times the relaxation's seconds left (:meth:`_Rounding.first`):
#: its re-solves take about the relaxation's time and its greedy pass as much again. Measured
#: at 8 stages x 128 microbatches at the default budget (CPU clock, 16 cases): from 3.0 to 2.0
#: GPT-3 A40 went 0.84% -> 0.50% (d = 0) and 0.98% -> 0.62% (d = 2%), BLOOM A40 0.59% ->
#: 0.39% (d = 2%), no case worse; at 16 stages no case changed beyond run-to-run noise.
_ROLL_ROOM = 2.0
#: Groups of the rolling roundings from the latest nodes back that a large graph's plan takes
#: after the first roundings, in turn while it is not within the target gap
#: (:meth:`_Rounding.latest_first`).
_BACK_CHUNKS = (8, 32)
#: ... and only where the plan is further than this fraction above the bound: closer, the
#: neighbourhood search gained more with the same seconds (BLOOM A40 at 8 stages x 128
#: microbatches, d = 0, T = 5 s at load 5-6: 0.28% to 0.15%, where the rounding found nothing
#: cheaper and left the search 0.28%); further, it gained 0.004 points in 5 s (GPT-3 A40).
_BACK_ABOVE = 5e-3
#: Seconds of the budget a large graph's relaxation leaves for the plan made when it does not
#: finish (:func:`_first_plan`: its bound from the duals so far and its last iterate); at
#: most a tenth of the budget (a frontier's 0.25 s a deadline).
_FALLBACK_S = 0.08
#: Seconds past the budget a large pipeline's plan of its steady state may take where its
#: relaxation did not finish (:func:`_first_plan`; 0.07-0.19 s of CPU at 16 stages x 128
#: microbatches), times the CPU starvation (:func:`_starved`); it ends by (1 +
#: :data:`_STEADY_SHARE`) x the budget + :data:`_STEADY_OVER_S` (``--time-limit-s`` allows
#: 1.1 T + 0.2 s).
_STEADY_S, _STEADY_SHARE, _STEADY_OVER_S = 0.12, 0.1, 0.1
#: Seconds of CPU of the steady-state plan outside its relaxation (the short pipeline's
#: build, the rounding: 0.04-0.055 s at 16 x 128, less some slack), and the least it is
#: started with.
_STEADY_OUTSIDE_S, _STEADY_MIN_S = 0.035, 0.07


#: Wall seconds per CPU second above which a plan counts as starved of CPU (:func:`_starved`),
#: and the most it is taken to be.
_STARVED_FROM, _STARVED_MAX = 1.5, 30.0
#: Seconds of CPU a small graph's plan takes when its relaxation runs out of time (the
#: stretched plan), kept back from the relaxation on a starved process (:func:`_solve`).
_FALLBACK_SMALL_S = 0.01
#: The most of the budget kept back for the work after it on a starved process.
_STARVED_SHARE = 0.5
#: The least CPU (s) of a plan's set-up that tells whether it is starved (:func:`_starved`):
#: 8 stages x 32 microbatches and up (4.8-4.9 ms there, 2.6-2.7 ms at 8 x 16, since the
#: whole programme is built on first use; 5 ms before, with it built in the set-up).
_STARVED_SETUP_S = 0.003


def _starved(wall_s: float, cpu_s: float, time_limit_s: float) -> float:
    """Return the wall seconds per CPU second this plan has had so far; 1 where not starved.

    Measured on the plan's set-up (its options and relaxation built, before it runs): 1 below
    :data:`_STARVED_FROM` or where the set-up took under :data:`_STARVED_SETUP_S` of CPU (a
    frontier's later deadlines, small graphs), at most :data:`_STARVED_MAX`. On the shared
    2-core machine at load 12-16 (``nice -n 10``) the planning process got 0.19-0.3 s of CPU
    in 1.2-2.7 s, and the plan of a relaxation that ran out (its bound from the duals, its
    last iterate scaled) took wall time past 1.1 T + 0.2 s in 7 of 32 cases at 128
    microbatches, where the time kept back for it (0.08 s, and 0.03 s of wrap-up) assumed a
    whole core.
    """
    if time_limit_s <= 0 or cpu_s < _STARVED_SETUP_S:
        return 1.0
    ratio = wall_s / cpu_s
    return min(ratio, _STARVED_MAX) if ratio > _STARVED_FROM else 1.0


#: The default budget of one deadline (s): under a second with the wrap-up, on a loaded machine.
TIME_LIMIT_S = 0.85


def _search_seconds(time_limit_s: float) -> float:
    """Seconds of a ``time_limit_s`` budget for the neighbourhood search."""
    first = min(time_limit_s, 1.0)
    return _SEARCH_SHARE * first + _SEARCH_SHARE_LATER * (time_limit_s - first)


@_ctrl_c_stops_highs()
def solve_dag(
    problem: DagProblem,
    target: float,
    *,
    rel_gap: float = 1e-3,
    time_limit_s: float = TIME_LIMIT_S,
    deadline_s: float | None = None,
) -> DagPlan:
    """Minimise the energy within ``(1 + target) x`` the all-max makespan; certified.

    Parameters
    ----------
    problem
        The graph and its per-clock tables.
    target
        Allowed slowdown of the makespan (0.02 = 2%).
    rel_gap
        Stop once the plan is certified within this fraction of the optimum (1e-3 = 0.1%).
    time_limit_s
        Wall-time budget, every phase within it: the rounded relaxation, then a neighbourhood
        search (up to all of the first second and 10% of the rest), then HiGHS's branch and
        bound from the best plan (the rest; on graphs whose root would not fit, the search),
        with the bound worker beside them where its root fits, until the certified gap is
        within ``rel_gap``. The best plan found is returned with its certified gap; status
        ``feasible`` when that gap is above ``rel_gap``. A budget that ends before the
        relaxation is solved returns the all-max plan stretched to the deadline (method
        ``stretched``). 0 returns the rounded relaxation, solved with no limit
        (deterministic).
    deadline_s
        An absolute makespan limit (s) instead of ``target``.

    Returns
    -------
    DagPlan
        ``status`` ``infeasible`` when no plan meets the deadline.
    """
    return _solve(
        problem, target, rel_gap=rel_gap, time_limit_s=time_limit_s, deadline_s=deadline_s
    )


def _solve(
    problem: DagProblem,
    target: float,
    *,
    rel_gap: float,
    time_limit_s: float,
    deadline_s: float | None,
    prepared: _Prepared | None = None,
    warm_start: np.ndarray | None = None,
    bound_worker: bool = True,
) -> DagPlan:
    """:func:`solve_dag`, with what a frontier (:func:`dag_frontier`) sets besides.

    ``prepared`` is the options and programmes (:func:`_prepare`) to reuse, ``warm_start``
    a neighbouring deadline's plan as option slots (taken if better than the rounded
    relaxation), and ``bound_worker`` False plans without the bound worker.
    """
    started, started_cpu = _time.perf_counter(), _time.thread_time()
    base_deadline, top = _deadline(problem, target)
    deadline = base_deadline if deadline_s is None else float(deadline_s)
    prepared = prepared or _prepare(problem, deadline)
    options, relaxation = prepared.options, prepared.relaxation
    relaxation.set_deadline(deadline * (1 + _TIME_RTOL))
    # the whole programme at this deadline, built and set on first use
    programme = cache(partial(prepared.programme, deadline * (1 + _TIME_RTOL)))
    columns = _Programme.columns(options)
    # the work after the budget's phases (the wrap-up, the plan of a relaxation that ran out)
    # takes wall time in proportion to how little of a core this process gets
    starved = _starved(
        _time.perf_counter() - started, _time.thread_time() - started_cpu, time_limit_s
    )
    wrap_up_s = (
        _WRAP_UP_S
        if starved == 1.0
        else min(_WRAP_UP_S * starved, _STARVED_SHARE * time_limit_s / 2)
    )

    def left_s() -> float:
        """Seconds of the budget left for branch and bound (the wrap-up kept back)."""
        return time_limit_s - wrap_up_s - (_time.perf_counter() - started)

    large = problem.n_nodes >= _LARGE_NODES and time_limit_s > 0
    until = np.inf if time_limit_s <= 0 else started + time_limit_s - wrap_up_s
    # seconds kept back from the relaxation for the plan made if it runs out
    if starved == 1.0:
        fallback_s = min(_FALLBACK_S, 0.1 * time_limit_s) if large else 0.0
    else:
        fallback_cpu_s = _FALLBACK_S if large else _FALLBACK_SMALL_S
        fallback_s = min(fallback_cpu_s * starved, _STARVED_SHARE * time_limit_s)
    relax_started, relax_cpu = _time.perf_counter(), _time.thread_time()
    if large:
        relaxation.start_slowest()
    try:
        relaxed = relaxation.relax(None if time_limit_s <= 0 else max(left_s() - fallback_s, 0.0))
    except _OutOfTime:
        return _first_plan(
            problem,
            options,
            top,
            deadline,
            started,
            relaxation if large else None,
            until,
            warm_start,
            min(
                until + _STEADY_S * starved,
                started + (1 + _STEADY_SHARE) * time_limit_s + _STEADY_OVER_S,
            ),
            starved,
        )
    relax_s = _time.perf_counter() - relax_started
    relax_cpu = _time.thread_time() - relax_cpu
    load = _load(relax_s, relax_cpu)
    if relaxed is None:
        return _infeasible(problem, deadline, started)
    bound, duration = relaxed
    # the slowest option no slower than the relaxed duration: no path gets longer
    at_or_below = options.time_s <= duration[:, None] * (1 + _TIME_RTOL) + 1e-15
    slot = np.maximum(at_or_below.sum(axis=1) - 1, 0)
    fractional = ~np.isclose(options.time_s, duration[:, None], rtol=1e-7, atol=0.0).any(axis=1)
    if large:
        rounding = _Rounding(problem, options, relaxation, bound, deadline, rel_gap, until, relax_s)
        slot = rounding.latest_first(rounding.first(slot))
    else:
        slot = _greedy_fill(problem, options, slot, deadline, until)
        rows = np.arange(problem.n_nodes)
        energy = float(problem.evaluate(options.clock[rows, slot])[1])
        if time_limit_s > 0 and energy * (1 - rel_gap) > bound:
            # also rounded in time order, the cheaper kept: GPT-3 A40 at 8 stages x 16
            # microbatches, d = 0, 0.53% above the relaxation where the plain rounding
            # reached 0.71% (the whole planner 0.70%), for 0.05 s of CPU (at d = 2% the plain
            # one wins, 0.33% against 0.77%); the steady state wants the two hull options
            # around its relaxed durations mixed in step across the stages, which the greedy
            # pass and the search's windows do not reach from the plain rounding
            rolled = _greedy_fill(problem, options, relaxation.roll(until), deadline, until)
            slot = _cheaper(problem, options, rolled, slot, deadline)
    if warm_start is not None:  # a neighbouring deadline's plan (a frontier's warm start)
        start = _greedy_fill(problem, options, warm_start, deadline, until, batched=large)
        slot = _cheaper(problem, options, start, slot, deadline)

    def done(plan_slot: np.ndarray, method: str, lower: float) -> DagPlan:
        plan = _slot_plan(problem, options, plan_slot, deadline, lower, method, "", started)
        # HiGHS's tolerances are ~1e-7 relative: a gap below 1e-6 is closed
        status = "optimal" if plan.gap_pct <= max(rel_gap, 1e-6) * 100 else "feasible"
        return replace(plan, status=status)

    plan = done(slot, "relaxation", bound)
    if plan.makespan_s > deadline * (1 + 1e-6):
        return _infeasible(problem, deadline, started)
    if plan.status == "optimal":
        return plan
    budget_s = left_s()
    if budget_s <= 0:
        return replace(plan, method="search")
    search_s = _search_seconds(time_limit_s)
    root_s = _root_seconds(columns, load)
    # the whole programme's relaxation: about the square of the ratio of the columns (0.41 s
    # and 3.9 s, 1.3 s and 9.9 s at 128 microbatches, 8 and 16 stages)
    lp_s = relax_cpu * (columns / max(relaxation.nx, 1)) ** 2  # CPU: not the load
    best_energy = [plan.energy_j]  # the best plan's energy so far (J), read by the worker

    def certified(energy_j: float) -> bool:
        """Whether a plan of ``energy_j`` is within ``rel_gap`` of the best bound known."""
        best_energy[0] = min(best_energy[0], energy_j)  # asked only of plans found
        return energy_j * (1 - rel_gap) <= max(bound, worker.bound_j)

    worker = (
        _BoundWorker(
            problem,
            options,
            deadline * (1 + _TIME_RTOL),
            slot,
            rel_gap=rel_gap,
            time_limit_s=_MIP_SHARE * budget_s / load,
            stop_when=lambda bound_j: best_energy[0] * (1 - rel_gap) <= bound_j,
        )
        if bound_worker and root_s < _ROOT_ROOM * budget_s
        else _NO_WORKER
    )
    rows = np.arange(problem.n_nodes)
    found: list[np.ndarray] = []  # plans from branch and bound
    overrun = [0.0]  # the most a HiGHS solve of the searches has run past its limit (s)
    try:
        # the search from the rounded relaxation (or the warm start) ...
        split = started + _FIRST_START_SHARE * search_s
        slot = _search(
            problem, options, programme, slot, fractional, deadline, split, certified, overrun
        )
        # ... then from a second start, the relaxation rounded by diving
        energy = float(problem.evaluate(options.clock[rows, slot])[1])
        dive_until = _time.perf_counter() + _DIVE_SHARE * search_s
        # on the whole programme where its relaxation is expected within the search's time
        # (as measured, its dive finds better plans), else on the hull's (solved already)
        to_dive = not certified(energy) and dive_until < started + search_s
        diver = programme() if to_dive and lp_s < search_s else relaxation
        if to_dive and _relaxed_by(diver, dive_until):
            dived = _greedy_fill(
                problem, options, diver.dive(dive_until), deadline, until, batched=large
            )
            makespan, dived_e, _ = problem.evaluate(options.clock[rows, dived])
            if makespan <= deadline * (1 + 1e-6) and dived_e < energy * (1 + _DIVE_ROOM):
                dived = _search(
                    problem,
                    options,
                    programme,
                    dived,
                    np.zeros_like(fractional),
                    deadline,
                    started + search_s,
                    certified,
                    overrun,
                    hard_end=started + search_s >= until,
                )
                makespan, dived_e, _ = problem.evaluate(options.clock[rows, dived])
                if makespan <= deadline * (1 + 1e-6) and dived_e < energy:
                    slot, energy = dived, float(dived_e)
        remaining = left_s()
        if not certified(energy) and remaining > 0 and root_s < _ROOT_ROOM * remaining:
            # the rest: HiGHS with its heuristics for plans, beside the worker for the bound
            whole = programme()
            whole.watch(lambda incumbent_j, _bound_j: certified(incumbent_j))
            try:
                best, mip_bound, _ = whole.exact(
                    slot, rel_gap=rel_gap, time_limit_s=_MIP_SHARE * remaining / load
                )
            finally:
                whole.watch(None)
            bound = max(bound, mip_bound)
            if best is not None:
                found.append(best)
        elif not certified(energy) and remaining > 0:
            # too large for branch and bound in the time left: the search goes on instead
            slot = _search(
                problem,
                options,
                programme,
                slot,
                fractional,
                deadline,
                until,
                certified,
                overrun,
                hard_end=True,
            )
    except BaseException:  # stop the worker; the error in hand (Ctrl-C, say) is the one raised
        worker.finish(reraise=False)
        raise
    # a worker still in HiGHS's root (out of the callbacks' reach) is not waited for past the
    # budget: its bound so far is kept, and it stops at its next callback
    wait_s = max(until - _time.perf_counter(), 0.0) if np.isfinite(until) else None
    worker_best, worker_bound = worker.finish(wait_s=wait_s)
    bound = max(bound, worker_bound)
    if worker_best is not None:
        found.append(worker_best)
    plan = done(slot, "search", bound)
    for best in found:
        filled = _greedy_fill(problem, options, best, deadline, until, batched=large)
        exact = done(filled, "milp", bound)
        if exact.energy_j < plan.energy_j and exact.makespan_s <= deadline * (1 + 1e-6):
            plan = exact
    return plan


@dataclass(frozen=True)
class _Rounding:
    """A large graph's solved relaxation, and what a plan rounded from it is held to.

    ``bound_j`` is the relaxation's optimum, ``until`` the ``time.perf_counter`` the roundings
    stop by, ``relax_s`` the relaxation's seconds (a rounding's re-solves take about as long).
    """

    problem: DagProblem
    options: _Options
    relaxation: _Programme
    bound_j: float
    deadline_s: float
    rel_gap: float
    until: float
    relax_s: float

    def first(self, rounded: np.ndarray) -> np.ndarray:
        """Return the better of two roundings of a large graph's relaxation, each greedy-filled.

        ``rounded`` is each node rounded down alone; the other is the relaxation rounded in time
        order (:meth:`_Programme.roll`). The one more likely to win goes first, as the budget may
        end before the second: the rolling one where the plain rounding is more than
        :data:`_ROLL_FIRST` above the bound (measured at 8 stages x 128 microbatches, CPU to
        convergence: it won there in 7 of 9 cases, by up to 1.4 points, and lost by up to
        0.35; where the plain rounding was closer, the plain one won in 5 of 6, by up to 0.17).
        The second runs only while the first is not within ``rel_gap`` of the bound. The rolling
        one goes first only with at least :data:`_ROLL_ROOM` times the relaxation's
        ``relax_s`` left: its re-solves take about as long as the relaxation, and the greedy
        pass after them as long again (a frontier's 0.25 s a deadline leaves too little at 8
        stages x 128 microbatches, where the plain rounding's greedy pass gains something).
        """
        problem, options, deadline_s, until = (
            self.problem,
            self.options,
            self.deadline_s,
            self.until,
        )
        rows = np.arange(problem.n_nodes)
        plain_j = float(problem.evaluate(options.clock[rows, rounded])[1])

        def plain() -> np.ndarray:
            return _greedy_fill(problem, options, rounded, deadline_s, until, batched=True)

        def rolled() -> np.ndarray:
            return _greedy_fill(
                problem, options, self.relaxation.roll(until), deadline_s, until, batched=True
            )

        roll_first = plain_j * (1 - _ROLL_FIRST) > self.bound_j
        roll_first &= until - _time.perf_counter() >= _ROLL_ROOM * self.relax_s
        first, second = (rolled, plain) if roll_first else (plain, rolled)
        slot = first()
        if float(problem.evaluate(options.clock[rows, slot])[1]) * (1 - self.rel_gap) > (
            self.bound_j
        ):
            slot = _cheaper(problem, options, second(), slot, deadline_s)
        return slot

    def latest_first(self, slot: np.ndarray) -> np.ndarray:
        """Return ``slot`` or a cheaper plan: the relaxation rounded in time order from the latest.

        The rolling rounding again (:meth:`_Programme.roll`), its groups of :data:`_BACK_CHUNKS`
        taken from the latest nodes back, each greedy-filled; the cheapest plan is kept. From the
        latest, the earlier nodes take up each group's rounding where from the earliest the
        later ones did; which of the two lands nearer the bound depends on the graph (measured at
        8 stages x 128 microbatches, CPU to convergence, from the forward rolling rounding's
        0.62% and 0.59% above the bound: GPT-3 A40 at d = 2% 0.50% with 8 groups, BLOOM A40 at
        d = 2% 0.07% with 32; neither helped GPT-3 A40 at d = 0, 0.65%). Each runs only while the
        plan is further than ``rel_gap`` and :data:`_BACK_ABOVE` above the bound and
        :data:`_ROLL_ROOM` times the relaxation's ``relax_s`` is left before ``until`` (with its
        greedy pass a rounding takes 2-3 times the relaxation's time: one stopped at ``until``
        only takes the search's; the fewer groups first, as they take less); it re-solves the
        relaxation first (from its optimal basis, which the last rounding restored) for its
        solution.
        """
        problem, options, deadline_s, until = (
            self.problem,
            self.options,
            self.deadline_s,
            self.until,
        )
        relaxation = self.relaxation
        rows = np.arange(problem.n_nodes)
        for chunks in _BACK_CHUNKS:
            energy = float(problem.evaluate(options.clock[rows, slot])[1])
            if energy * (1 - max(self.rel_gap, _BACK_ABOVE)) <= self.bound_j:
                break
            if until - _time.perf_counter() < _ROLL_ROOM * self.relax_s or not _relaxed_by(
                relaxation, until
            ):
                break
            rolled = relaxation.roll(until, chunks, latest_first=True)
            rolled = _greedy_fill(problem, options, rolled, deadline_s, until, batched=True)
            slot = _cheaper(problem, options, rolled, slot, deadline_s)
        return slot


def _cheaper(
    problem: DagProblem,
    options: _Options,
    candidate: np.ndarray,
    slot: np.ndarray,
    deadline_s: float,
) -> np.ndarray:
    """Return the plan to keep of two given as option slots: ``candidate`` or ``slot``.

    ``candidate`` where it keeps the deadline and costs less than ``slot`` (or ``slot``
    misses the deadline); ``slot`` otherwise.
    """
    rows = np.arange(problem.n_nodes)
    (mk_c, mk_s), (e_c, e_s) = problem.evaluate(options.clock[rows, np.stack([candidate, slot])])[
        :2
    ]
    late = deadline_s * (1 + 1e-6)
    return candidate if mk_c <= late and (e_c < e_s or mk_s > late) else slot


def _relaxed_by(programme: _Programme, until: float) -> bool:
    """Solve ``programme``'s relaxation by ``until`` (``time.perf_counter``): whether it was."""
    try:
        return programme.relax(max(until - _time.perf_counter(), 0.0)) is not None
    except _OutOfTime:
        return False


def _first_plan(
    problem: DagProblem,
    options: _Options,
    top: np.ndarray,
    deadline_s: float,
    started: float,
    interrupted: _Programme | None = None,
    until: float = np.inf,
    warm_start: np.ndarray | None = None,
    steady_until: float = -np.inf,
    starved: float = 1.0,
) -> DagPlan:
    """Return the plan when the budget ends before the relaxation: all-max, stretched.

    Every node takes its cheapest option no slower than its top clock's time times the
    deadline over the all-max makespan: every path stretches by at most that factor, so the
    deadline holds. Where that misses (a deadline under the all-max makespan), every node at
    its fastest option; if that misses too, no plan meets the deadline. Its bound, without
    the relaxation, is every node at its cheapest option where a longer makespan costs
    nothing (``blocking_power_w`` 0); none otherwise.

    With ``interrupted`` (the relaxation stopped at its limit; large graphs), the bound is
    the one its duals so far certify (:meth:`_Programme.dual_bound`) where that is higher,
    and its last iterate is a second plan: each node's extra time over its fastest option
    scaled by the largest factor (of 32 steps) that keeps the deadline, rounded down. On a
    pipeline, the plan of its steady state (:func:`~opdvfs.plan._dag_steady._steady_plan`,
    by ``steady_until``, ``time.perf_counter``; its work outside HiGHS takes
    :data:`_STEADY_OUTSIDE_S` times ``starved``) is a third, and the cheapest takes the
    greedy pass in batches until then (measured at 16 stages x 128 microbatches: see
    ``benchmarks/fallback_small_pipeline.py``).

    With ``warm_start`` (a frontier's tighter deadline's plan, as option slots: it meets this
    looser deadline too), the cheapest of the plans that fit is kept and takes the greedy pass
    until ``until``: a frontier point is then never dearer than the one before it. (On a
    machine at load 10, the 0.25 s a deadline of :func:`dag_frontier` left some 16-microbatch
    relaxations unsolved, and their stretched plans cost up to 13% more than lowtime's.)
    """
    rows = np.arange(problem.n_nodes)
    top_s = problem.time_s[rows, top]
    stretch = deadline_s / float(problem.evaluate(top)[0])
    at_or_below = options.time_s <= (stretch * top_s)[:, None] * (1 + _TIME_RTOL) + 1e-15
    free_makespan = problem.n_ranks * problem.blocking_power_w == 0
    bound = float(np.nanmin(options.cost_j, axis=1).sum()) if free_makespan else -np.inf
    stretched = np.maximum(at_or_below.sum(axis=1) - 1, 0)
    slots = [stretched, np.zeros(problem.n_nodes, int)]
    if warm_start is not None:
        slots.insert(0, warm_start)
    if interrupted is not None:
        bound = max(bound, interrupted.dual_bound())
        slots.insert(0, _scaled_iterate(problem, options, interrupted.durations_now(), deadline_s))
        left_s = steady_until - _time.perf_counter() - _STEADY_OUTSIDE_S * starved
        if left_s >= _STEADY_MIN_S - _STEADY_OUTSIDE_S:
            until = max(until, steady_until)
            steady = _steady_plan(problem, options, deadline_s, left_s)
            if steady is not None:
                slots.insert(0, steady)
    plans = np.stack(slots)
    makespan, energy, _ = problem.evaluate(options.clock[rows, plans])
    fits = makespan <= deadline_s * (1 + 1e-6)
    if not fits.any():
        return _infeasible(problem, deadline_s, started)
    if interrupted is None and warm_start is None:  # the stretched plan where it fits
        slot = plans[int(np.argmax(fits))]
    else:
        slot = plans[int(np.argmin(np.where(fits, energy, np.inf)))]
        large = problem.n_nodes >= _LARGE_NODES
        slot = _greedy_fill(problem, options, slot, deadline_s, until, batched=large)
    return _slot_plan(problem, options, slot, deadline_s, bound, "stretched", "feasible", started)


def _scaled_iterate(
    problem: DagProblem, options: _Options, duration_s: np.ndarray, deadline_s: float
) -> np.ndarray:
    """Return durations past the deadline brought within it, as option slots.

    Each node's time over its fastest option is scaled by one factor, the largest of 0,
    1/32, ..., 1 whose makespan (all 33 evaluated together) keeps the deadline; each node
    then takes its slowest option not slower than that.
    """
    fastest = options.time_s[:, 0]
    over = np.maximum(duration_s - fastest, 0.0)
    factors = np.linspace(0.0, 1.0, 33)
    tried = fastest + factors[:, None] * over
    makespan = (problem._passes.heads(tried) + tried).max(axis=1)
    fit = np.flatnonzero(makespan <= deadline_s * (1 + _TIME_RTOL))
    scaled = tried[fit[-1]] if fit.size else fastest
    at_or_below = options.time_s <= scaled[:, None] * (1 + _TIME_RTOL) + 1e-15
    return np.maximum(at_or_below.sum(axis=1) - 1, 0)


@dataclass
class _Prepared:
    """A graph's options and programmes, prepared once for every deadline planned on them.

    ``relaxation`` is the relaxation on the options' hulls (every plan solves it); the whole
    0/1 programme on them (:meth:`programme`) is built on first use: only the neighbourhood
    search, the dive and branch and bound solve it, which on large graphs often do not run
    within the default budget (its build took 20-27 ms of CPU at 16 stages x 128
    microbatches).
    """

    problem: DagProblem
    options: _Options
    relaxation: _Programme
    _whole: _Programme | None = field(default=None, repr=False)

    def programme(self, deadline_s: float) -> _Programme:
        """Return the whole 0/1 programme, its makespan held to ``deadline_s``; built once."""
        if self._whole is None:
            self._whole = _Programme(self.problem, self.options)
        self._whole.set_deadline(deadline_s)
        return self._whole


def _prepare(problem: DagProblem, deadline_s: float | None = None) -> _Prepared:
    """Return the options and the relaxation on their hulls (the whole programme is lazy).

    With ``deadline_s`` (the loosest deadline they will serve), the options no plan within
    it can take are left out (:meth:`_Options.within`).
    """
    options = _Options.build(problem)
    if deadline_s is not None:
        large = problem.n_nodes >= _LARGE_NODES
        options = options.within(problem, deadline_s, corners_only=large)
    relaxation = _Programme(problem, options.hull(), nested=False, round_to=options)
    # its LP is solved as stated (measured: presolve took 0.86 s to 0.52 s at 128 x 16 off)
    relaxation.h.setOptionValue("presolve", "off")
    return _Prepared(problem, options, relaxation)


@_ctrl_c_stops_highs()
def solve_dag_milp(
    problem: DagProblem, target: float, *, rel_gap: float = 1e-9, time_limit_s: float = 600.0
) -> DagPlan:
    """Solve the 0/1 programme with HiGHS from scratch (no warm start): the reference.

    Parameters
    ----------
    problem, target
        As :func:`solve_dag`.
    rel_gap
        HiGHS's relative MIP gap (1e-9: solved to optimality).
    time_limit_s
        Wall-time limit; past it the best plan found is returned, status ``feasible``.
    """
    started = _time.perf_counter()
    deadline, _ = _deadline(problem, target)
    prepared = _prepare(problem, deadline)
    options, programme = prepared.options, prepared.programme(deadline * (1 + _TIME_RTOL))
    best, bound, optimal = programme.exact(None, rel_gap=rel_gap, time_limit_s=time_limit_s)
    if best is None:
        return _infeasible(problem, deadline, started)
    return _slot_plan(
        problem,
        options,
        best,
        deadline,
        bound,
        "milp",
        "optimal" if optimal else "feasible",
        started,
    )


@_ctrl_c_stops_highs()
def dag_frontier(
    problem: DagProblem,
    targets: np.ndarray | list[float],
    *,
    rel_gap: float = 1e-3,
    time_limit_s: float = 0.25,
) -> pd.DataFrame:
    """Plan every target on one prepared programme: the time-energy frontier.

    The deadlines are planned from the tightest up, each warm-started from the plan of the
    tighter one before it (still within the looser deadline; the greedy pass spends the extra
    time) and its relaxation re-solved from the previous basis (only the deadline's bound
    changes). A deadline whose relaxation does not finish in its time keeps the tighter
    deadline's plan where that costs less than the all-max plan stretched (:func:`_first_plan`),
    so the energy never rises as the deadline loosens. A deadline whose rounded relaxation is
    certified within ``rel_gap`` costs one LP; only the others spend ``time_limit_s`` (per
    deadline; 0.25 s by default, where a single :func:`solve_dag` takes up to 0.85 s) on the
    search and branch and bound, without the bound worker (:class:`_BoundWorker`): in a quarter
    of a second its root does not finish, and on the 16-microbatch Perseus graphs it took the
    frontier from 1.9-2.1 s to 3.3-3.7 s with no more deadlines certified.

    Returns one row per target, in the order given: ``target``, ``deadline_s``,
    ``makespan_s``, ``energy_j``, ``lower_bound_j``, ``gap_pct``, ``method``, ``status``,
    ``plan_seconds``.
    """
    targets = np.asarray(targets, dtype=float)
    prepared = _prepare(problem, _deadline(problem, float(targets.max(initial=0.0)))[0])
    options = prepared.options
    rows: list[dict[str, Any]] = [{} for _ in targets]
    previous: np.ndarray | None = None
    for at in np.argsort(targets, kind="stable"):
        plan = _solve(
            problem,
            float(targets[at]),
            rel_gap=rel_gap,
            time_limit_s=time_limit_s,
            deadline_s=None,
            prepared=prepared,
            warm_start=previous,
            bound_worker=False,
        )
        if plan.status != "infeasible":
            previous = np.argmax(options.clock == plan.clock[:, None], axis=1)
        rows[at] = {
            "target": float(targets[at]),
            "deadline_s": plan.deadline_s,
            "makespan_s": plan.makespan_s,
            "energy_j": plan.energy_j,
            "lower_bound_j": plan.lower_bound_j,
            "gap_pct": plan.gap_pct,
            "method": plan.method,
            "status": plan.status,
            "plan_seconds": plan.plan_seconds,
        }
    return pd.DataFrame(rows)
