"""The problem and plan types of the DAG planner (:mod:`opdvfs.plan.dag`), and its options.

:class:`DagProblem` is a dependency graph whose nodes each run at one of several clocks, with
its evaluator (makespan and energy of plans, vectorised over the graph's topological levels,
:class:`_Passes`); :class:`DagPlan` is one clock per node with its certificate.
:class:`_Options` keeps each node's Pareto-optimal (time, effective energy) options, which the
programme (:mod:`opdvfs.plan._dag_lp`) and the search (:mod:`opdvfs.plan._dag_search`) choose
among. The energy definition and the method are :mod:`opdvfs.plan.dag`'s; the public names are
exported there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from opdvfs.exceptions import ValidationError

#: Relative slack on time comparisons (s): a path equal to the deadline up to rounding fits.
_TIME_RTOL = 1e-9

#: A pipeline graph's passes, by index (0 forward, 1 backward). Its node ``forward{m}`` /
#: ``backward{m}`` runs that pass of microbatch ``m``: :func:`_pass_names` writes the names
#: (:func:`opdvfs.plan.pipeline.pipeline_graph`), :func:`_parse_pass_names` reads them
#: (:mod:`opdvfs.plan._dag_steady`).
_PASSES = ("forward", "backward")
_PASS_NAME = rf"^({'|'.join(_PASSES)})(\d+)$"


def _pass_names(backward: np.ndarray, microbatch: np.ndarray) -> np.ndarray:
    """Return pipeline nodes' names from their pass (1: backward) and microbatch (objects)."""
    passes = np.array(_PASSES, dtype=object)[np.asarray(backward, dtype=np.int64)]
    return passes + np.asarray(microbatch, dtype=np.int64).astype(str).astype(object)


def _parse_pass_names(names: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Return each node's pass (1: backward) and microbatch from its name (:func:`_pass_names`).

    None where a name is not a pipeline node's.
    """
    parsed = pd.Series(names, dtype=object).astype(str).str.extract(_PASS_NAME)
    if parsed[0].isna().any():
        return None
    backward = (parsed[0] == _PASSES[1]).to_numpy().astype(np.int64)
    return backward, parsed[1].astype(np.int64).to_numpy()


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
        ends), W; see :mod:`opdvfs.plan.dag`'s energy definition.
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
        energy follows :mod:`opdvfs.plan.dag`'s definition (computation plus blocking power
        while waiting).
        """
        return self._evaluate(clock)[:3]

    def _evaluate(self, clock: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`evaluate`, and every node's earliest start (s) under each plan."""
        clock = np.asarray(clock, dtype=np.int64)
        rows = np.arange(self.n_nodes)
        duration = self.time_s[rows, clock]
        compute = self.energy_j[rows, clock].sum(axis=-1)
        head = self._passes.heads(duration)
        makespan = (head + duration).max(axis=-1)
        idle = self.n_ranks * makespan - duration.sum(axis=-1)
        return makespan, compute + self.blocking_power_w * idle, compute, head

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
        The plan's makespan, total energy (:mod:`opdvfs.plan.dag`'s definition) and
        computation energy alone.
    deadline_s
        The makespan allowed.
    lower_bound_j, gap_pct
        Certified lower bound on the total energy of every plan within the deadline, and the
        plan's distance above it (% of the plan's energy).
    method
        What found the plan: ``relaxation`` (the rounded relaxation, certified alone),
        ``search`` (the neighbourhood search), ``milp`` (HiGHS's branch and bound) or
        ``stretched`` (the budget ended before the relaxation was solved: the all-max plan
        stretched to the deadline or, on graphs of 2048 nodes or more, the relaxation's last
        iterate brought within it, whichever costs less; its bound is what the relaxation's
        duals so far certify there, else weak or none).
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
    """Each node's Pareto-optimal options, padded to (n_nodes, k); time ascending.

    Their hull (:meth:`hull`) is computed once, on first use; the options :meth:`within`
    returns for a large graph come with theirs, taken from the two hulls it chose them by.
    """

    clock: np.ndarray  # column of freqs_mhz, -1 in padding
    time_s: np.ndarray  # inf in padding
    cost_j: np.ndarray  # effective energy E - P_block t; inf in padding
    valid: np.ndarray
    _hull: _Options | None = field(default=None, init=False, repr=False, compare=False)

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

    def within(
        self, problem: DagProblem, deadline_s: float, *, corners_only: bool = False
    ) -> _Options:
        """Return these options less those no plan within ``deadline_s`` can take.

        Node ``i`` can run slower than its fastest option by at most its float, the deadline
        less its longest path through it with every node at its fastest option (the critical
        path method's total float): an option slower than that misses the deadline whatever
        the others take. The dropped options are each node's slowest, so the survivors keep
        their slots (padding takes the others' place) and every plan within the deadline is
        still one of them. The programme's relaxation then takes each node's hull of the
        options it can take: tighter where a hull edge reached past the float (on GPT-3 A40
        at d = 0 the bound rose 0.147% at 8 stages x 128 microbatches and 0.080% at 8 x 16);
        at d >= 2% no option of the Perseus graphs is past its float.

        ``corners_only`` drops them only from the nodes whose hull within the float has a
        corner the whole hull lacks (for large graphs, where the relaxation's time counts).
        Only the nodes that lost an option have a hull within the float computed, and the
        options returned carry their hull, made of the rows of the two (:meth:`hull` does not
        compute it again).
        """
        fastest = self.time_s[:, 0]
        passes = problem._passes
        room = deadline_s * (1 + _TIME_RTOL) - passes.heads(fastest) - passes.tails(fastest)
        keep = self.valid & (self.time_s <= room[:, None] * (1 + _TIME_RTOL) + 1e-15)
        keep[:, 0] = self.valid[:, 0]  # the fastest stays: a deadline no plan meets is told so
        pruned = self._masked(keep)
        if not corners_only:
            return pruned
        # only where the hull within the float has a corner the whole hull has not: elsewhere
        # the two hulls differ only past the last corner within the float, where the
        # relaxation may still run a node up to its float (a looser bound, valid; on the
        # Perseus graphs at 128 microbatches, d = 0, the same bound as every node pruned to
        # 1e-9), and the programme kept whole solves faster: with every node's far options
        # gone the relaxation took 10-50% longer (fewer iterations, each dearer). A node's hull
        # is of its own options alone: only those that lost one have a hull within the float
        # apart from their whole hull
        whole_hull = self.hull()
        cut = np.flatnonzero((keep != self.valid).any(axis=1))
        within_hull = pruned._take(cut).hull()
        corner = (within_hull.clock[:, :, None] == whole_hull.clock[cut][:, None, :]).any(axis=2)
        tighter = (within_hull.valid & ~corner).any(axis=1)
        chosen = np.zeros(len(keep), dtype=bool)
        chosen[cut[tighter]] = True
        options = self._masked(np.where(chosen[:, None], keep, self.valid))
        hull = whole_hull._with_rows(cut[tighter], within_hull._take(tighter))
        object.__setattr__(options, "_hull", hull)
        return options

    def _masked(self, keep: np.ndarray) -> _Options:
        """Return these options with those outside ``keep`` made padding (slots unchanged)."""
        return _Options(
            np.where(keep, self.clock, -1),
            np.where(keep, self.time_s, np.inf),
            np.where(keep, self.cost_j, np.inf),
            keep,
        )

    def _take(self, nodes: np.ndarray) -> _Options:
        """Return the options of ``nodes`` (indices or a mask) alone, as wide as these."""
        return _Options(
            self.clock[nodes], self.time_s[nodes], self.cost_j[nodes], self.valid[nodes]
        )

    def _with_rows(self, nodes: np.ndarray, rows: _Options) -> _Options:
        """Return these options with node ``nodes[j]``'s replaced by ``rows``' row ``j``.

        Packed as :meth:`build` and :meth:`hull` pack (as wide as the most options a node
        keeps): the same arrays as every node's options packed anew.
        """
        counts = self.valid.sum(axis=1)
        counts[nodes] = rows.valid.sum(axis=1)
        width = int(counts.max(initial=0))

        def merged(mine: np.ndarray, theirs: np.ndarray, fill: float) -> np.ndarray:
            out = np.full((len(mine), width), fill, dtype=mine.dtype)
            out[:, : min(width, mine.shape[1])] = mine[:, :width]
            out[nodes] = fill
            out[nodes, : min(width, theirs.shape[1])] = theirs[:, :width]
            return out

        return _Options(
            merged(self.clock, rows.clock, -1),
            merged(self.time_s, rows.time_s, np.inf),
            merged(self.cost_j, rows.cost_j, np.inf),
            merged(self.valid, rows.valid, False),
        )

    def hull(self) -> _Options:
        """Return the options on each node's lower convex hull in (time, cost), packed.

        The programme's linear relaxation relaxes every node to this hull, so a relaxation
        stated on these options alone has the same optimum with fewer columns (on the
        Perseus tables about a third: 8 of 23 options), and needs no nesting rows (along a
        convex hull a cheaper step never waits for a dearer one). Computed on the first call
        (:meth:`_lower_hull`) and kept.
        """
        hull = self._hull
        if hull is None:
            hull = self._lower_hull()
            object.__setattr__(self, "_hull", hull)
        return hull

    def _lower_hull(self) -> _Options:
        """Compute :meth:`hull`: every node's options on its lower convex hull, packed.

        Points on a hull edge are dropped with the points above it: an option is removed
        while it lies on or above the segment joining its kept neighbours (all such at once:
        a point above the chord of two options is off the hull of any set holding them),
        until none does.
        """
        keep = self.valid.copy()
        t, c = self.time_s, self.cost_j
        n, k = t.shape
        rows = np.arange(n)[:, None]
        cols = np.arange(k)
        while True:
            before = np.maximum.accumulate(
                np.c_[np.full(n, -1), np.where(keep, cols, -1)[:, :-1]], axis=1
            )
            after = np.minimum.accumulate(
                np.c_[np.where(keep, cols, k)[:, 1:], np.full(n, k)][:, ::-1], axis=1
            )[:, ::-1]
            inner = keep & (before >= 0) & (after < k)
            b, a = np.where(inner, before, 0), np.where(inner, after, 0)
            with np.errstate(invalid="ignore"):  # padding: inf - inf, outside ``inner``
                above = (c - c[rows, b]) * (t[rows, a] - t) >= (c[rows, a] - c) * (t - t[rows, b])
            off = inner & above
            if not off.any():
                break
            keep &= ~off
        width = int(keep.sum(axis=1).max(initial=0))
        pos = np.argsort(~keep, axis=1, kind="stable")[:, :width]
        valid = np.take_along_axis(keep, pos, axis=1)

        def packed(values: np.ndarray, fill: float) -> np.ndarray:
            return np.where(valid, np.take_along_axis(values, pos, axis=1), fill)

        return _Options(
            packed(self.clock, -1).astype(self.clock.dtype),
            packed(self.time_s, np.inf),
            packed(self.cost_j, np.inf),
            valid,
        )


def _deadline(problem: DagProblem, target: float) -> tuple[float, np.ndarray]:
    """Return the deadline (1 + target) x the all-max makespan, and the all-max plan."""
    if not (np.isfinite(target) and target >= 0):
        raise ValidationError(f"target {target} must be a fraction >= 0", field="target")
    top = problem.top_clock()
    base = float(problem.evaluate(top)[0])
    return (1 + target) * base, top
