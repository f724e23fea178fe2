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
"""

from __future__ import annotations

import signal
import threading
import time as _time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from opdvfs.exceptions import ValidationError
from opdvfs.plan.dp import gap_pct

__all__ = [
    "TIME_LIMIT_S",
    "DagPlan",
    "DagProblem",
    "dag_frontier",
    "solve_dag",
    "solve_dag_milp",
    "topological_levels",
]

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
#: Share of the fractional thresholds a diving step fixes (:meth:`_Programme.dive`).
_DIVE_BATCH = 0.25
#: Share of the search's seconds the dive may take.
_DIVE_SHARE = 0.2
#: Share of the search's seconds (from the start) the search from the first start may take;
#: the rest goes to the search from the dive.
_FIRST_START_SHARE = 0.5
#: The dive is searched from only if it is within this fraction above the first start's best.
_DIVE_ROOM = 0.01
#: A search pass that lowers the energy by less than this fraction moves to the next level.
_PASS_GAIN = 1e-4
#: Share of the time budget's first second, and of the rest, the neighbourhood search may use
#: (branch and bound with HiGHS's heuristics gets the rest: the search finds plans faster, and
#: the bound worker raises the bound beside both).
_SEARCH_SHARE, _SEARCH_SHARE_LATER = 1.0, 0.1
#: Seconds kept back from branch and bound for what follows it (HiGHS stops a little late).
_WRAP_UP_S = 0.03
#: HiGHS options of the bound worker (:class:`_BoundWorker`): no primal heuristics, no restart
#: and no strong branching (pseudo-costs trusted from the first branch). From a good plan the
#: heuristics only delay the cut loop and the tree that raise the bound: on the hard Perseus
#: instances (A40 and BLOOM at d = 0-2%) HiGHS certified 0.1% from the best plan known in
#: 0.3-1.9 s this way, 0.1-12 s with its defaults. Strong branching also runs for seconds
#: without reaching the interrupt callback that stops the worker.
_BOUND_ONLY = {
    "mip_heuristic_effort": 0.0,
    "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_root_reduced_cost": False,
    "mip_allow_restart": False,
    "mip_pscost_minreliable": 0,
}


#: The default budget of one deadline (s): under a second with the wrap-up, on a loaded machine.
TIME_LIMIT_S = 0.85


def _search_seconds(time_limit_s: float) -> float:
    """Seconds of a ``time_limit_s`` budget for the neighbourhood search."""
    first = min(time_limit_s, 1.0)
    return _SEARCH_SHARE * first + _SEARCH_SHARE_LATER * (time_limit_s - first)


#: A neighbourhood's exact solve stops within this fraction of its optimum (a move needs only
#: to improve; proving the last 0.01% of a sub-problem costs most of its time).
_HOOD_GAP = 1e-4
#: Seconds one neighbourhood's exact solve may take (a move found by then is kept; HiGHS's
#: heuristics find most moves early, and proving them optimal is what a hard window spends).
_HOOD_TIME_S = 0.1
#: Relative slack on time comparisons (s): a path equal to the deadline up to rounding fits.
_TIME_RTOL = 1e-9


def topological_levels(n_nodes: int, edges: np.ndarray) -> np.ndarray:
    """Return each node's depth: the edges on the longest edge-count path reaching it.

    Kahn's algorithm one level at a time (a few numpy calls per level, never per node).

    Raises
    ------
    ValidationError
        If the graph has a cycle (some node is never reached), or an edge names no node.
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if edges.size and (edges.min() < 0 or edges.max() >= n_nodes):
        raise ValidationError(f"an edge names a node outside 0..{n_nodes - 1}", field="edges")
    src, dst = edges[:, 0], edges[:, 1]
    order = np.argsort(src, kind="stable")
    src_sorted, dst_by_src = src[order], dst[order]
    ptr = np.searchsorted(src_sorted, np.arange(n_nodes + 1))
    indeg = np.bincount(dst, minlength=n_nodes)
    level = np.full(n_nodes, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    depth = 0
    while frontier.size:
        level[frontier] = depth
        counts = ptr[frontier + 1] - ptr[frontier]
        firsts = np.repeat(ptr[frontier], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        targets = dst_by_src[firsts + within]
        np.subtract.at(indeg, targets, 1)
        touched = np.unique(targets)
        frontier = touched[indeg[touched] == 0]
        depth += 1
    if (level < 0).any():
        stuck = int(np.flatnonzero(level < 0)[0])
        raise ValidationError(f"the graph has a cycle (node {stuck} is never ready)", field="edges")
    return level


def _by_level(
    levels: range, key: np.ndarray, other: np.ndarray, level: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]:
    """Group edges by the level of their ``key`` end, sorted by it, for ``maximum.reduceat``.

    Each group is (the other ends, the key ends, segment starts, the distinct key nodes).
    """
    groups = []
    for lv in levels:
        pick = np.flatnonzero(level[key] == lv)
        if not pick.size:
            continue
        pick = pick[np.argsort(key[pick], kind="stable")]
        nodes, seg = np.unique(key[pick], return_index=True)
        groups.append((other[pick], key[pick], seg, nodes))
    return tuple(groups)


@dataclass(frozen=True)
class _Passes:
    """The graph's edges grouped by level, for vectorised longest-path passes."""

    forward: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    backward: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]

    @classmethod
    def build(cls, n_nodes: int, edges: np.ndarray) -> _Passes:
        level = topological_levels(n_nodes, edges)
        src, dst = edges[:, 0], edges[:, 1]
        top = int(level.max(initial=0))
        # a node's start is the max finish of its in-edges, all from lower levels; its tail
        # the max (duration + tail) over its out-edges, all to higher levels
        return cls(
            _by_level(range(1, top + 1), dst, src, level),
            _by_level(range(top - 1, -1, -1), src, dst, level),
        )

    def heads(self, duration: np.ndarray) -> np.ndarray:
        """Earliest start of every node, shape like ``duration`` ((n,) or (k, n) plans)."""
        start = np.zeros_like(duration)
        for src, _dst, seg, nodes in self.forward:
            start[..., nodes] = np.maximum.reduceat(start[..., src] + duration[..., src], seg, -1)
        return start

    def tails(self, duration: np.ndarray) -> np.ndarray:
        """Longest path from each node's end to the iteration's end, shape like ``duration``."""
        tail = np.zeros_like(duration)
        for dst, _src, seg, nodes in self.backward:
            tail[..., nodes] = np.maximum.reduceat(duration[..., dst] + tail[..., dst], seg, -1)
        return tail


@dataclass(frozen=True)
class DagProblem:
    """A dependency graph whose nodes each run at one of several clocks.

    Parameters
    ----------
    time_s, energy_j
        Each node's time (s) and energy (J) at each clock, shape (n_nodes, n_clocks); NaN where
        a clock is not available for a node (not measured and not modelled).
    freqs_mhz
        The clocks, ascending (MHz), shape (n_clocks,).
    edges
        Precedence ``(before, after)`` pairs of node indices, shape (n_edges, 2).
    rank
        The rank (pipeline stage) running each node, shape (n_nodes,); -1 for a zero-time
        barrier node (a collective) that no rank computes.
    names
        Each node's name (e.g. ``forward3``), shape (n_nodes,).
    blocking_power_w
        Power a rank draws while it waits (blocked on a receive or idle until the iteration
        ends), W; see the module's energy definition.
    """

    time_s: np.ndarray
    energy_j: np.ndarray
    freqs_mhz: np.ndarray
    edges: np.ndarray
    rank: np.ndarray
    names: np.ndarray
    blocking_power_w: float = 0.0
    _passes: _Passes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        time_s = np.asarray(self.time_s, dtype=float)
        energy_j = np.asarray(self.energy_j, dtype=float)
        if time_s.ndim != 2 or time_s.shape != energy_j.shape:
            raise ValidationError(
                f"time_s {time_s.shape} and energy_j {energy_j.shape} must be one "
                "(n_nodes, n_clocks) table each",
                field="time_s",
            )
        usable = np.isfinite(time_s) & np.isfinite(energy_j)
        if not usable.any(axis=1).all():
            node = int(np.flatnonzero(~usable.any(axis=1))[0])
            raise ValidationError(
                f"node {node} has no clock with a time and an energy", field="time_s"
            )
        if (time_s[usable] < 0).any() or (energy_j[usable] < 0).any():
            raise ValidationError("a node has a negative time or energy", field="time_s")
        if not (np.isfinite(self.blocking_power_w) and self.blocking_power_w >= 0):
            raise ValidationError(
                f"blocking_power_w {self.blocking_power_w} must be >= 0", field="blocking_power_w"
            )
        edges = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        object.__setattr__(self, "time_s", np.where(usable, time_s, np.nan))
        object.__setattr__(self, "energy_j", np.where(usable, energy_j, np.nan))
        object.__setattr__(self, "freqs_mhz", np.asarray(self.freqs_mhz, dtype=float))
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "rank", np.asarray(self.rank, dtype=np.int64))
        object.__setattr__(self, "names", np.asarray(self.names, dtype=object))
        object.__setattr__(self, "_passes", _Passes.build(len(time_s), edges))

    @property
    def n_nodes(self) -> int:
        """Nodes of the graph."""
        return int(self.time_s.shape[0])

    @property
    def n_ranks(self) -> int:
        """Ranks that compute (barrier nodes excluded)."""
        return int(self.rank.max(initial=-1)) + 1

    def top_clock(self) -> np.ndarray:
        """Each node's highest available clock column: the all-max plan (the baseline).

        Not its fastest: where time is flat at the top (an A40 at its power cap from ~1455 MHz)
        a lower clock can measure a little faster; the plans may use it, the baseline does not.
        """
        known = ~np.isnan(self.time_s)
        last = self.time_s.shape[1] - 1
        return last - np.argmax(known[:, ::-1], axis=1)

    def evaluate(self, clock: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return makespan (s), total energy (J) and computation energy (J) of plans.

        ``clock`` is one column per node, shape (n_nodes,) or (k, n_nodes) for k plans; the
        energy follows the module's definition (computation plus blocking power while waiting).
        """
        clock = np.asarray(clock, dtype=np.int64)
        rows = np.arange(self.n_nodes)
        duration = self.time_s[rows, clock]
        compute = self.energy_j[rows, clock].sum(axis=-1)
        makespan = (self._passes.heads(duration) + duration).max(axis=-1)
        idle = self.n_ranks * makespan - duration.sum(axis=-1)
        return makespan, compute + self.blocking_power_w * idle, compute

    def start_times(self, clock: np.ndarray) -> np.ndarray:
        """Earliest start of every node (s) under a plan, shape (n_nodes,)."""
        rows = np.arange(self.n_nodes)
        return self._passes.heads(self.time_s[rows, np.asarray(clock, dtype=np.int64)])


@dataclass(frozen=True)
class DagPlan:
    """One clock per node of a :class:`DagProblem`, with its certificate.

    Attributes
    ----------
    clock
        Column of ``freqs_mhz`` of every node, shape (n_nodes,).
    freq_mhz
        Clock of every node (MHz).
    start_s
        Earliest start of every node under the plan (s).
    makespan_s, energy_j, compute_energy_j
        The plan's makespan, total energy (module definition) and computation energy alone.
    deadline_s
        The makespan allowed.
    lower_bound_j, gap_pct
        Certified lower bound on the total energy of every plan within the deadline, and the
        plan's distance above it (% of the plan's energy).
    method
        What found the plan: ``relaxation`` (the rounded relaxation, certified alone),
        ``search`` (the neighbourhood search) or ``milp`` (HiGHS's branch and bound).
    status
        ``optimal`` (within the gap asked), ``feasible`` (time ran out first) or ``infeasible``.
    plan_seconds
        Wall time to plan (s).
    """

    clock: np.ndarray
    freq_mhz: np.ndarray
    start_s: np.ndarray
    makespan_s: float
    energy_j: float
    compute_energy_j: float
    deadline_s: float
    lower_bound_j: float
    gap_pct: float
    method: str
    status: str
    plan_seconds: float


@dataclass(frozen=True)
class _Options:
    """Each node's Pareto-optimal options, padded to (n_nodes, k); time ascending."""

    clock: np.ndarray  # column of freqs_mhz, -1 in padding
    time_s: np.ndarray  # inf in padding
    cost_j: np.ndarray  # effective energy E - P_block t; inf in padding
    valid: np.ndarray

    @classmethod
    def build(cls, problem: DagProblem) -> _Options:
        time_s = np.where(np.isnan(problem.time_s), np.inf, problem.time_s)
        cost = problem.energy_j - problem.blocking_power_w * problem.time_s
        cost = np.where(np.isnan(cost), np.inf, cost)
        order = np.lexsort((cost, time_s), axis=-1)
        t = np.take_along_axis(time_s, order, axis=1)
        c = np.take_along_axis(cost, order, axis=1)
        # an option survives if it costs less than every faster (or equally fast) one
        prev_min = np.minimum.accumulate(np.c_[np.full(len(c), np.inf), c[:, :-1]], axis=1)
        keep = np.isfinite(t) & (c < prev_min)
        k = int(keep.sum(axis=1).max())
        # pack the survivors to the left, in time order
        pos = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        valid = np.take_along_axis(keep, pos, axis=1)
        return cls(
            np.where(valid, np.take_along_axis(order, pos, axis=1), -1),
            np.where(valid, np.take_along_axis(t, pos, axis=1), np.inf),
            np.where(valid, np.take_along_axis(c, pos, axis=1), np.inf),
            valid,
        )


def _deadline(problem: DagProblem, target: float) -> tuple[float, np.ndarray]:
    """Return the deadline (1 + target) x the all-max makespan, and the all-max plan."""
    if not (np.isfinite(target) and target >= 0):
        raise ValidationError(f"target {target} must be a fraction >= 0", field="target")
    top = problem.top_clock()
    base = float(problem.evaluate(top)[0])
    return (1 + target) * base, top


#: Set by Ctrl-C while planning (:func:`_ctrl_c_stops_highs`): HiGHS holds the calling thread
#: until it returns, and Python's own KeyboardInterrupt, raised in HiGHS's callback, is lost.
_CTRL_C = threading.Event()


@contextmanager
def _ctrl_c_stops_highs() -> Iterator[None]:
    """Within: Ctrl-C stops every HiGHS solve at its next callback and raises KeyboardInterrupt.

    Only where Python's default handler is installed (the main thread of a program that has
    not set its own); elsewhere nothing changes.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _CTRL_C.clear()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: _CTRL_C.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        hit = _CTRL_C.is_set()
        _CTRL_C.clear()
    if hit:  # after the last HiGHS run, while the plan was put together: not lost either
        raise KeyboardInterrupt


def _on_mip_interrupt(programme: weakref.ref[_Programme], out: Any, into: Any) -> None:
    """HiGHS's MIP interrupt callback, handed on to its programme while that is alive."""
    alive = programme()
    if alive is not None:
        alive._on_interrupt(out, into)


class _Programme:
    """The 0/1 programme on the Pareto options, in threshold form (times in ms).

    Node ``i``'s options are sorted by time (slot 0 the fastest); ``y[i, k] = 1`` for ``k >= 1``
    means "slot ``k`` or slower", so ``y[i, 1] >= y[i, 2] >= ...`` and

        duration_i = t[i, 0] + sum_k (t[i, k] - t[i, k - 1]) y[i, k]     (same for the cost).

    This is the incremental (delta) form of a piecewise choice (Dantzig 1960; Croxton, Gendron
    and Magnanti 2003): its linear relaxation equals the one-hot one (each node's options
    relaxed to their lower convex hull), but a branch on ``y[i, k]`` splits node ``i``'s
    durations into "faster than slot k" and "slot k or slower" (a balanced dichotomy, as SOS
    branching), where a branch on a one-hot variable only forbids one option; HiGHS closes the
    gap markedly faster on it. Times are in ms: HiGHS's tolerances are absolute.
    """

    def __init__(self, problem: DagProblem, options: _Options) -> None:
        import highspy

        self.highspy = highspy
        self.problem, self.options = problem, options
        n = problem.n_nodes
        above = options.valid & (np.arange(options.valid.shape[1]) >= 1)
        node_of, slot = np.nonzero(above)
        self.node_of, self.slot = node_of, slot
        ny = len(node_of)
        self.nx, self.n = ny, n
        t_ms = options.time_s * 1e3
        self.step_ms = t_ms[node_of, slot] - t_ms[node_of, slot - 1]
        step_cost = options.cost_j[node_of, slot] - options.cost_j[node_of, slot - 1]
        self.fastest_ms = t_ms[:, 0]
        self.cols = ny + n + 1  # y thresholds, node starts, makespan
        self.makespan_col = ny + n
        ptr = np.searchsorted(node_of, np.arange(n + 1))
        # the core class: highspy.Highs's constructor prints a banner on stdout (fd 1) before
        # output_flag can be unset, which would break `--json` (one object on stdout)
        h = getattr(highspy, "_Highs", highspy.Highs)()
        h.setOptionValue("output_flag", False)
        inf = highspy.kHighsInf
        h.addVars(self.cols, np.zeros(self.cols), np.r_[np.ones(ny), np.full(n + 1, inf)])
        h.changeColsCost(
            self.cols,
            np.arange(self.cols, dtype=np.int32),
            np.r_[step_cost, np.zeros(n), problem.n_ranks * problem.blocking_power_w * 1e-3],
        )
        h.changeObjectiveOffset(float(options.cost_j[:, 0].sum()))
        # thresholds nest: y[i, k + 1] - y[i, k] <= 0
        pair = np.flatnonzero(node_of[1:] == node_of[:-1])
        m = len(pair)
        h.addRows(
            m,
            np.full(m, -inf),
            np.zeros(m),
            2 * m,
            (2 * np.arange(m)).astype(np.int32),
            np.c_[pair + 1, pair].ravel().astype(np.int32),
            np.tile([1.0, -1.0], m),
        )
        # precedence s_j - s_i - sum_k step[i, k] y[i, k] >= t[i, 0]; sinks feed the makespan
        out_deg = np.bincount(problem.edges[:, 0], minlength=n)
        sinks = np.flatnonzero(out_deg == 0)
        src = np.r_[problem.edges[:, 0], sinks]
        dst_col = np.r_[ny + problem.edges[:, 1], np.full(len(sinks), self.makespan_col)]
        counts = ptr[src + 1] - ptr[src]
        width = counts + 2
        starts = np.r_[0, np.cumsum(width)[:-1]]
        total = int(width.sum())
        index = np.empty(total, dtype=np.int32)
        value = np.empty(total)
        index[starts], value[starts] = dst_col, 1.0
        index[starts + 1], value[starts + 1] = ny + src, -1.0
        rel = np.arange(total) - np.repeat(starts, width)
        opt = rel >= 2
        row = np.repeat(np.arange(len(src)), width)
        opt_index = ptr[src[row[opt]]] + rel[opt] - 2
        index[opt], value[opt] = opt_index, -self.step_ms[opt_index]
        h.addRows(
            len(src),
            self.fastest_ms[src],
            np.full(len(src), inf),
            total,
            starts.astype(np.int32),
            index,
            value,
        )
        self.h = h
        self._is_integer: bool | None = None
        #: The best dual bound HiGHS has reported during the current (or last) branch and bound
        #: (J), and a test of (its incumbent's energy, that bound) that stops it (:meth:`watch`).
        self.live_bound_j = -np.inf
        self._stop_when: Callable[[float, float], bool] | None = None
        # HiGHS's MIP interrupt callback, at every node and between the root's cut rounds: the
        # live bound, the stop test and Ctrl-C. It holds the programme weakly: HiGHS keeps its
        # callback where Python's collector cannot see it, so a bound method would keep every
        # programme (and its HiGHS model, ~1 MB) alive for good. (Not as HiGHS's user data:
        # highspy does not keep that object alive.)
        programme = weakref.ref(self)
        h.setCallback(lambda _k, _m, out, into, _u: _on_mip_interrupt(programme, out, into), None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)

    def watch(self, stop_when: Callable[[float, float], bool] | None) -> None:
        """Stop branch and bound once ``stop_when(incumbent_j, bound_j)`` holds (None: never).

        It is asked at each of HiGHS's MIP interrupt callbacks, from the solving thread.
        """
        self._stop_when = stop_when

    def _on_interrupt(self, out: Any, into: Any) -> None:
        self.live_bound_j = max(self.live_bound_j, float(out.mip_dual_bound))
        stop_when = self._stop_when
        if _CTRL_C.is_set() or (
            stop_when is not None and stop_when(float(out.mip_primal_bound), self.live_bound_j)
        ):
            into.user_interrupt = True

    def _run(self) -> None:
        """Run HiGHS; raise KeyboardInterrupt if Ctrl-C came meanwhile."""
        self.h.run()
        if _CTRL_C.is_set():
            raise KeyboardInterrupt

    def set_deadline(self, deadline_s: float) -> None:
        self.h.changeColBounds(self.makespan_col, 0.0, deadline_s * 1e3)

    def _integrality(self, integer: bool) -> None:
        if self._is_integer is integer:
            return
        kind = (
            self.highspy.HighsVarType.kInteger if integer else self.highspy.HighsVarType.kContinuous
        )
        self.h.changeColsIntegrality(
            self.nx, np.arange(self.nx, dtype=np.int32), np.full(self.nx, kind)
        )
        self._is_integer = integer

    def thresholds(self, slot: np.ndarray) -> np.ndarray:
        """Return the ``y`` columns of a plan given as option slots."""
        return (self.slot <= slot[self.node_of]).astype(float)

    def slots(self, y: np.ndarray) -> np.ndarray:
        """Option slots of an integral ``y``."""
        return np.bincount(self.node_of, weights=y > 0.5, minlength=self.n).astype(np.int64)

    def relax(self) -> tuple[float, np.ndarray] | None:
        """Solve the relaxation: optimal cost, relaxed durations (s); None if infeasible."""
        self._integrality(False)
        self._run()
        if self.h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
            return None
        y = np.asarray(self.h.getSolution().col_value[: self.nx])
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        return float(self.h.getInfo().objective_function_value), (self.fastest_ms + step) / 1e3

    def dive(self, until: float) -> np.ndarray:
        """Round the relaxation just solved by diving; return the plan as option slots.

        Each step fixes the :data:`_DIVE_BATCH` share of fractional thresholds nearest to 0 or
        1 at their nearest value and re-solves the relaxation (warm, from its basis); a step
        whose rounding up leaves no feasible relaxation fixes the same thresholds at 0 (faster
        options: always feasible). Past ``until`` (``time.perf_counter``) or once the
        relaxation is integral, each node is rounded down to its slowest option not slower
        than its relaxed duration, as the plain rounding. Every bound is restored after.
        """
        h, nx = self.h, self.nx
        cols = np.arange(nx, dtype=np.int32)
        lower, upper = np.zeros(nx), np.ones(nx)
        y = np.asarray(h.getSolution().col_value[:nx])
        try:
            while _time.perf_counter() < until:
                frac = np.flatnonzero((y > 1e-6) & (y < 1 - 1e-6))
                if not frac.size:
                    break
                near = np.minimum(y[frac], 1 - y[frac])
                pick = frac[np.argsort(near, kind="stable")[: max(1, int(frac.size * _DIVE_BATCH))]]
                up = y[pick] >= 0.5
                lo, hi = lower.copy(), upper.copy()
                lo[pick[up]], hi[pick[~up]] = 1.0, 0.0
                h.changeColsBounds(nx, cols, lo, hi)
                self._run()
                if h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
                    lo, hi = lower.copy(), upper.copy()
                    hi[pick] = 0.0
                    h.changeColsBounds(nx, cols, lo, hi)
                    self._run()
                    if h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
                        break  # numerically lost: keep the last relaxed solution
                lower, upper = lo, hi
                y = np.asarray(h.getSolution().col_value[:nx])
        finally:
            h.changeColsBounds(nx, cols, np.zeros(nx), np.ones(nx))
        return self.round_down(y)

    def round_down(self, y: np.ndarray) -> np.ndarray:
        """Each node's slowest option not slower than its duration under thresholds ``y``."""
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        duration_ms = self.fastest_ms + step
        at_or_below = self.options.time_s * 1e3 <= duration_ms[:, None] * (1 + _TIME_RTOL) + 1e-12
        return np.maximum(at_or_below.sum(axis=1) - 1, 0)

    def exact(
        self,
        slot: np.ndarray | None,
        *,
        rel_gap: float,
        time_limit_s: float,
        free: np.ndarray | None = None,
        band: int | None = None,
    ) -> tuple[np.ndarray | None, float, bool]:
        """Solve the 0/1 programme (from ``slot``, a plan as option slots): plan, bound, optimal.

        With ``free`` (a node mask) only those nodes choose, among the options within ``band``
        slots of their current one (all if None); the others keep ``slot``'s option (a
        neighbourhood search step; the bound is then the neighbourhood's, not a certificate).
        """
        self._integrality(True)
        h = self.h
        cols = np.arange(self.nx, dtype=np.int32)
        if free is not None and slot is not None:
            current = slot[self.node_of]
            reach = band if band is not None else self.options.valid.shape[1]
            fixed = ~free[self.node_of]
            lower = (self.slot <= np.where(fixed, current, current - reach)).astype(float)
            upper = (self.slot <= np.where(fixed, current, current + reach)).astype(float)
            h.changeColsBounds(self.nx, cols, lower, upper)
        try:
            return self._branch_and_bound(slot, rel_gap=rel_gap, time_limit_s=time_limit_s)
        finally:
            if free is not None and slot is not None:
                h.changeColsBounds(self.nx, cols, np.zeros(self.nx), np.ones(self.nx))

    def _branch_and_bound(
        self, slot: np.ndarray | None, *, rel_gap: float, time_limit_s: float
    ) -> tuple[np.ndarray | None, float, bool]:
        h = self.h
        h.setOptionValue("mip_rel_gap", rel_gap)
        h.setOptionValue("time_limit", max(time_limit_s, 1e-3))
        self.live_bound_j = -np.inf
        if slot is not None:
            dur = self.options.time_s[np.arange(self.n), slot]
            starts = self.problem._passes.heads(dur)
            col = np.r_[self.thresholds(slot), starts * 1e3, (starts + dur).max() * 1e3]
            sol = self.highspy.HighsSolution()
            sol.col_value = list(col)
            sol.value_valid = True
            h.setSolution(sol)
        try:
            self._run()
        finally:  # the relaxation that follows (a frontier's next deadline) runs unlimited
            h.setOptionValue("time_limit", self.highspy.kHighsInf)
        status = h.getModelStatus()
        info = h.getInfo()
        bound = float(info.mip_dual_bound)
        if info.primal_solution_status < 2:  # no feasible point
            return None, bound, False
        y = np.asarray(h.getSolution().col_value[: self.nx])
        return self.slots(y), bound, status == self.highspy.HighsModelStatus.kOptimal


class _BoundWorker:
    """HiGHS's branch and bound raising the lower bound in a thread while the search runs.

    A second copy of the programme, from the rounded relaxation's plan, with HiGHS's primal
    heuristics and restarts off (:data:`_BOUND_ONLY`): only its cut loop and its tree, which
    are what raise the bound. HiGHS releases the GIL while it solves, so with a second core
    the bound rises while the neighbourhood search finds the plans; :attr:`bound_j` is read
    live, and the worker stops once ``stop_when(bound_j)`` holds, at its time limit, or at
    :meth:`finish`.
    """

    def __init__(
        self,
        problem: DagProblem,
        options: _Options,
        deadline_s: float,
        slot: np.ndarray,
        *,
        rel_gap: float,
        time_limit_s: float,
        stop_when: Callable[[float], bool],
    ) -> None:
        self.programme = _Programme(problem, options)
        self.programme.set_deadline(deadline_s)
        for name, value in _BOUND_ONLY.items():
            self.programme.h.setOptionValue(name, value)
        self._finished = False
        self.programme.watch(lambda _incumbent, bound: self._finished or stop_when(bound))
        self._result: tuple[np.ndarray | None, float, bool] | BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(slot, rel_gap, time_limit_s), daemon=True
        )
        self._thread.start()

    @property
    def bound_j(self) -> float:
        """The best lower bound the worker has proved so far (J)."""
        return self.programme.live_bound_j

    def _run(self, slot: np.ndarray, rel_gap: float, time_limit_s: float) -> None:
        try:
            self._result = self.programme.exact(slot, rel_gap=rel_gap, time_limit_s=time_limit_s)
        except BaseException as error:  # re-raised in the caller's thread by finish()
            self._result = error

    def finish(self, *, reraise: bool = True) -> tuple[np.ndarray | None, float]:
        """Stop the worker; return the best plan it found (None if none) and its bound (J).

        An error in the worker (Ctrl-C included) is raised here unless ``reraise`` is False
        (the caller is already unwinding from its own).
        """
        self._finished = True
        self._thread.join()
        if isinstance(self._result, BaseException):
            if reraise:
                raise self._result
            return None, self.bound_j
        if self._result is None:
            return None, self.bound_j
        found, bound, _ = self._result
        return found, max(bound, self.bound_j)


class _NoWorker:
    """No bound worker: the bound is the relaxation's and branch and bound's own."""

    bound_j = -np.inf

    def finish(self, *, reraise: bool = True) -> tuple[np.ndarray | None, float]:
        return None, -np.inf


_NO_WORKER = _NoWorker()


def _greedy_fill(
    problem: DagProblem, options: _Options, slot: np.ndarray, deadline_s: float
) -> np.ndarray:
    """Move nodes to slower, cheaper options while the deadline holds; best saving rate first.

    A node may take ``float = deadline - (head + duration + tail)`` more time without
    lengthening any path past the deadline (its longest path through it is head + d + tail).
    Each round makes the one move with the best saving per second of float consumed, then
    recomputes the floats (two vectorised passes).
    """
    rows = np.arange(problem.n_nodes)
    passes = problem._passes
    per_makespan = problem.n_ranks * problem.blocking_power_w
    slot = slot.copy()
    while True:
        dur = options.time_s[rows, slot]
        head, tail = passes.heads(dur), passes.tails(dur)
        through = head + dur + tail
        makespan = float(through.max())
        slack = deadline_s * (1 + _TIME_RTOL) - through
        new_t = options.time_s  # (n, k)
        longer = new_t - dur[:, None]
        fits = options.valid & (longer <= slack[:, None]) & (longer > 0)
        # a longer critical path also charges every rank's blocking power for the extra time
        extra = np.maximum(head[:, None] + new_t + tail[:, None] - makespan, 0.0)
        with np.errstate(invalid="ignore"):  # padding: inf - inf
            saving = options.cost_j[rows, slot][:, None] - options.cost_j - per_makespan * extra
        good = fits & (saving > 1e-12)
        if not good.any():
            return slot
        with np.errstate(invalid="ignore"):
            rate = np.where(good, saving / np.where(good, longer, 1.0), -np.inf)
        node, k = np.unravel_index(int(np.argmax(rate)), rate.shape)
        slot[node] = k


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
    programme: _Programme,
    slot: np.ndarray,
    fractional: np.ndarray,
    deadline_s: float,
    until: float,
    certified: Callable[[float], bool],
) -> np.ndarray:
    """Return the plan improved by a variable-neighbourhood search.

    Node sets are re-solved exactly (HiGHS, the others fixed, each free node within a band of
    options around its current one) while time remains and the energy is above
    ``certified`` (a test of an energy against the best bound known, which may rise while the
    search runs). A pass over every set that improves the plan by less than
    :data:`_PASS_GAIN` widens the band and the windows (:data:`_LEVELS`: the plan is then
    about a local optimum of the narrower search). Every accepted plan meets the deadline.
    """
    rows = np.arange(problem.n_nodes)
    best = slot
    best_e = float(problem.evaluate(options.clock[rows, best])[1])
    level = 0
    while level < len(_LEVELS) and not certified(best_e):
        band, window = _LEVELS[level]
        pass_start_e = best_e
        starts = problem.start_times(options.clock[rows, best])
        for hood, hood_band in _neighbourhoods(problem, starts, fractional, window, band):
            left = until - _time.perf_counter()
            if left <= 0 or certified(best_e):
                return best
            got, _, _ = programme.exact(
                best,
                rel_gap=_HOOD_GAP,
                time_limit_s=min(left, _HOOD_TIME_S),
                free=hood,
                band=hood_band,
            )
            if got is None:
                continue
            got = _greedy_fill(problem, options, got, deadline_s)
            makespan, energy, _ = problem.evaluate(options.clock[rows, got])
            if energy < best_e * (1 - 1e-12) and makespan <= deadline_s * (1 + 1e-6):
                best, best_e = got, float(energy)
                if certified(best_e):
                    return best
        fractional = np.zeros_like(fractional)
        # another pass at this level only while its passes still pay
        level += best_e > pass_start_e * (1 - _PASS_GAIN)
    return best


@_ctrl_c_stops_highs()
def solve_dag(
    problem: DagProblem,
    target: float,
    *,
    rel_gap: float = 1e-3,
    time_limit_s: float = TIME_LIMIT_S,
    deadline_s: float | None = None,
    _state: tuple[_Options, _Programme] | None = None,
    _start: np.ndarray | None = None,
    _bound_worker: bool = True,
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
        Wall-time budget: the rounded relaxation, then a neighbourhood search (up to all of
        the first second and 10% of the rest), then HiGHS's branch and bound from the best
        plan (the rest), with the bound worker beside them all the while, until the certified
        gap is within ``rel_gap``. The best plan found is returned with its certified gap;
        status ``feasible`` when that gap is above ``rel_gap``. 0 (or less than the wrap-up)
        returns the rounded relaxation.
    deadline_s
        An absolute makespan limit (s) instead of ``target``.

    Returns
    -------
    DagPlan
        ``status`` ``infeasible`` when no plan meets the deadline.
    """
    started = _time.perf_counter()
    base_deadline, _ = _deadline(problem, target)
    deadline = base_deadline if deadline_s is None else float(deadline_s)
    options, programme = _state or _prepare(problem)
    programme.set_deadline(deadline * (1 + _TIME_RTOL))
    relaxed = programme.relax()
    if relaxed is None:
        return _infeasible(problem, deadline, started)
    bound, duration = relaxed
    # the slowest option no slower than the relaxed duration: no path gets longer
    at_or_below = options.time_s <= duration[:, None] * (1 + _TIME_RTOL) + 1e-15
    slot = np.maximum(at_or_below.sum(axis=1) - 1, 0)
    fractional = ~np.isclose(options.time_s, duration[:, None], rtol=1e-7, atol=0.0).any(axis=1)
    slot = _greedy_fill(problem, options, slot, deadline)
    if _start is not None:  # a neighbouring deadline's plan (a frontier's warm start)
        start = _greedy_fill(problem, options, _start, deadline)
        rows = np.arange(problem.n_nodes)
        (mk_s, mk_r), (e_s, e_r) = problem.evaluate(options.clock[rows, np.stack([start, slot])])[
            :2
        ]
        if mk_s <= deadline * (1 + 1e-6) and (e_s < e_r or mk_r > deadline * (1 + 1e-6)):
            slot = start

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

    def left_s() -> float:
        """Seconds of the budget left for branch and bound (the wrap-up kept back)."""
        return time_limit_s - _WRAP_UP_S - (_time.perf_counter() - started)

    budget_s = left_s()
    if budget_s <= 0:
        return replace(plan, method="search")
    search_s = _search_seconds(time_limit_s)
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
            time_limit_s=budget_s,
            stop_when=lambda bound_j: best_energy[0] * (1 - rel_gap) <= bound_j,
        )
        if _bound_worker
        else _NO_WORKER
    )
    rows = np.arange(problem.n_nodes)
    found: list[np.ndarray] = []  # plans from branch and bound
    try:
        # the search from the rounded relaxation (or the warm start) ...
        split = started + _FIRST_START_SHARE * search_s
        slot = _search(problem, options, programme, slot, fractional, deadline, split, certified)
        # ... then from a second start, the relaxation rounded by diving
        energy = float(problem.evaluate(options.clock[rows, slot])[1])
        dive_until = _time.perf_counter() + _DIVE_SHARE * search_s
        if (
            not certified(energy)
            and dive_until < started + search_s
            and programme.relax() is not None
        ):
            dived = _greedy_fill(problem, options, programme.dive(dive_until), deadline)
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
                )
                makespan, dived_e, _ = problem.evaluate(options.clock[rows, dived])
                if makespan <= deadline * (1 + 1e-6) and dived_e < energy:
                    slot, energy = dived, float(dived_e)
        remaining = left_s()
        if not certified(energy) and remaining > 0:
            # the rest: HiGHS with its heuristics for plans, beside the worker for the bound
            programme.watch(lambda incumbent_j, _bound_j: certified(incumbent_j))
            try:
                best, mip_bound, _ = programme.exact(slot, rel_gap=rel_gap, time_limit_s=remaining)
            finally:
                programme.watch(None)
            bound = max(bound, mip_bound)
            if best is not None:
                found.append(best)
    except BaseException:  # stop the worker; the error in hand (Ctrl-C, say) is the one raised
        worker.finish(reraise=False)
        raise
    worker_best, worker_bound = worker.finish()
    bound = max(bound, worker_bound)
    if worker_best is not None:
        found.append(worker_best)
    plan = done(slot, "search", bound)
    for best in found:
        exact = done(_greedy_fill(problem, options, best, deadline), "milp", bound)
        if exact.energy_j < plan.energy_j and exact.makespan_s <= deadline * (1 + 1e-6):
            plan = exact
    return plan


def _prepare(problem: DagProblem) -> tuple[_Options, _Programme]:
    options = _Options.build(problem)
    return options, _Programme(problem, options)


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
    options, programme = _prepare(problem)
    programme.set_deadline(deadline * (1 + _TIME_RTOL))
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
    changes). A deadline whose rounded relaxation is certified within ``rel_gap`` costs one
    LP; only the others spend ``time_limit_s`` (per deadline; 0.25 s by default, where a
    single :func:`solve_dag` takes up to 0.85 s) on the search and branch and bound, without
    the bound worker (:class:`_BoundWorker`): in a quarter of a second its root does not finish,
    and on the 16-microbatch Perseus graphs it took the frontier from 1.9-2.1 s to 3.3-3.7 s
    with no more deadlines certified.

    Returns one row per target, in the order given: ``target``, ``deadline_s``,
    ``makespan_s``, ``energy_j``, ``lower_bound_j``, ``gap_pct``, ``method``, ``status``,
    ``plan_seconds``.
    """
    state = _prepare(problem)
    options = state[0]
    targets = np.asarray(targets, dtype=float)
    rows: list[dict[str, Any]] = [{} for _ in targets]
    previous: np.ndarray | None = None
    for at in np.argsort(targets, kind="stable"):
        plan = solve_dag(
            problem,
            float(targets[at]),
            rel_gap=rel_gap,
            time_limit_s=time_limit_s,
            _state=state,
            _start=previous,
            _bound_worker=False,
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
