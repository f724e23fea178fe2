"""The DAG planner's 0/1 programme on HiGHS, its bound worker, and Ctrl-C while HiGHS runs.

:class:`_Programme` states :mod:`opdvfs.plan.dag`'s problem in threshold form for HiGHS: its
linear relaxation (the lower bound), diving, and exact solves of the whole programme or of a
neighbourhood of it (the search's moves, :mod:`opdvfs.plan._dag_search`). :class:`_BoundWorker`
runs branch and bound on a copy in a second thread to raise the bound while the search runs.
HiGHS holds the calling thread while it solves, so Ctrl-C reaches it through its MIP interrupt
callback: :func:`_ctrl_c_stops_highs` turns SIGINT into a flag that every solve checks.
"""

from __future__ import annotations

import signal
import threading
import time as _time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from opdvfs.exceptions import MissingExtraError
from opdvfs.plan._dag_problem import _TIME_RTOL, DagProblem, _Options

#: Share of the fractional thresholds a diving step fixes (:meth:`_Programme.dive`).
_DIVE_BATCH = 0.25
#: Groups of nodes the rolling rounding fixes in turn (:meth:`_Programme.roll`): measured on
#: 8 stages x 128 microbatches (A40, d = 0-2%), 8 groups with the greedy pass after them
#: reached 0.27-0.65% above the bound where 16 reached 0.33-1.46% and the plain rounding 0.47-2.0%.
_ROLL_CHUNKS = 8
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


#: Seconds :meth:`_BoundWorker.finish` waits for a halted worker past the time it was given.
_FINISH_GRACE_S = 0.02


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


class _OutOfTime(Exception):
    """A relaxation stopped at its time limit before it was solved."""


def _on_interrupt(programme: weakref.ref[_Programme], kind: Any, out: Any, into: Any) -> None:
    """HiGHS's interrupt callbacks, handed on to their programme while that is alive."""
    alive = programme()
    if alive is not None:
        alive._on_interrupt(kind, out, into)


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

    ``nested`` False leaves the nesting rows out: for a relaxation on convex-hull options
    (:meth:`_Options.hull`), where no optimum breaks them; ``round_to`` is then the options
    its durations round to (the full ones). Every solve stops at its time limit
    through HiGHS's simplex and MIP interrupt callbacks (:meth:`_on_interrupt`), and at once
    when :meth:`halt` is called from another thread.
    """

    def __init__(
        self,
        problem: DagProblem,
        options: _Options,
        *,
        nested: bool = True,
        round_to: _Options | None = None,
    ) -> None:
        try:
            import highspy
        except ImportError as e:
            raise MissingExtraError("highspy", "pipeline", "the pipeline planner") from e

        self.highspy = highspy
        self.problem, self.options = problem, options
        #: The options :meth:`round_down` (and so :meth:`dive`) returns slots of.
        self.round_to = options if round_to is None else round_to
        n = problem.n_nodes
        node_of, slot = np.nonzero(self._above_fastest(options))
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
        if not nested:
            pair = pair[:0]
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
        #: ``time.perf_counter`` past which the current solve stops; set by :meth:`halt`.
        self._until = np.inf
        self._halted = False
        # HiGHS's MIP interrupt callback, at every node and between the root's cut rounds: the
        # live bound, the stop test, the time limit and Ctrl-C; its simplex interrupt callback,
        # every few simplex iterations (the relaxation, and the LPs within branch and bound):
        # the time limit and Ctrl-C. HiGHS's own time_limit is set as well on branch and bound
        # (not on an LP: there it counts from the model's first run), but it is not asked
        # within a long LP. The callback holds the programme weakly: HiGHS keeps it
        # where Python's collector cannot see it, so a bound method would keep every
        # programme (and its HiGHS model, ~1 MB) alive for good. (Not as HiGHS's user data:
        # highspy does not keep that object alive.)
        programme = weakref.ref(self)
        kinds = highspy.cb.HighsCallbackType
        self._mip_kind = kinds.kCallbackMipInterrupt
        h.setCallback(lambda k, _m, out, into, _u: _on_interrupt(programme, k, out, into), None)
        for kind in (kinds.kCallbackMipInterrupt, kinds.kCallbackSimplexInterrupt):
            h.startCallback(kind)

    @staticmethod
    def _above_fastest(options: _Options) -> np.ndarray:
        """Return which options have a threshold column ``y[i, k]``: every one but the fastest."""
        return options.valid & (np.arange(options.valid.shape[1]) >= 1)

    @classmethod
    def columns(cls, options: _Options) -> int:
        """Return the threshold columns (:attr:`nx`) of the programme on ``options``, unbuilt."""
        return int(np.count_nonzero(cls._above_fastest(options)))

    def watch(self, stop_when: Callable[[float, float], bool] | None) -> None:
        """Stop branch and bound once ``stop_when(incumbent_j, bound_j)`` holds (None: never).

        It is asked at each of HiGHS's MIP interrupt callbacks, from the solving thread.
        """
        self._stop_when = stop_when

    def halt(self) -> None:
        """Stop the solve under way (from another thread) and every later one."""
        self._halted = True

    def _on_interrupt(self, kind: Any, out: Any, into: Any) -> None:
        stop = _CTRL_C.is_set() or self._halted or _time.perf_counter() >= self._until
        if kind == self._mip_kind:
            self.live_bound_j = max(self.live_bound_j, float(out.mip_dual_bound))
            stop_when = self._stop_when
            stop = stop or (
                stop_when is not None and stop_when(float(out.mip_primal_bound), self.live_bound_j)
            )
        # HiGHS keeps the flag between callbacks and runs: a run stopped for its time would
        # stop every later one at its first callback
        into.user_interrupt = bool(stop)

    def _run(self, time_limit_s: float | None = None) -> None:
        """Run HiGHS within ``time_limit_s`` (None: none); raise KeyboardInterrupt on Ctrl-C."""
        limit = self.highspy.kHighsInf if time_limit_s is None else max(time_limit_s, 1e-3)
        self._until = _time.perf_counter() + (np.inf if time_limit_s is None else time_limit_s)
        if self._is_integer:  # on an LP HiGHS counts its limit from the model's first run
            self.h.setOptionValue("time_limit", limit)
        try:
            self.h.run()
        finally:
            self._until = np.inf
            self.h.setOptionValue("time_limit", self.highspy.kHighsInf)
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

    def relax(self, time_limit_s: float | None = None) -> tuple[float, np.ndarray] | None:
        """Solve the relaxation: optimal cost, relaxed durations (s); None if infeasible.

        Raises
        ------
        _OutOfTime
            If ``time_limit_s`` (None: no limit) passed before it was solved.
        """
        self._integrality(False)
        self._run(time_limit_s)
        status = self.h.getModelStatus()
        if status in (
            self.highspy.HighsModelStatus.kTimeLimit,
            self.highspy.HighsModelStatus.kInterrupt,
        ):
            raise _OutOfTime
        if status != self.highspy.HighsModelStatus.kOptimal:
            return None
        y = np.asarray(self.h.getSolution().col_value[: self.nx])
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        return float(self.h.getInfo().objective_function_value), (self.fastest_ms + step) / 1e3

    def start_slowest(self) -> None:
        """Give HiGHS a first basis: every node at its slowest option, starts on a tree.

        Only for a programme without nesting rows (the relaxation on hull options), and only
        where HiGHS holds no basis yet (a frontier's next deadline starts from the last). The
        thresholds sit at their upper bounds (the slowest options: with no blocking power
        every reduced cost then has the sign its bound needs, so the dual simplex starts in
        phase 2); each start is basic and each node's latest-finishing predecessor's row,
        and the latest sink's, is tight (a spanning tree of the all-slowest schedule, so the
        basis is triangular). HiGHS's own start, every row basic, spends about one pivot per
        node bringing the starts in: measured at 16 stages x 128 microbatches (A100), 3400-6400
        simplex iterations in 0.38-0.83 s from this basis where its own took 8700-11200 in
        0.75-1.09 s, to the same optimum.
        """
        self.start_from(None)

    def start_from(self, slot: np.ndarray | None) -> None:
        """Give HiGHS :meth:`start_slowest`'s first basis built on another plan's schedule.

        ``slot`` is each node's option on this programme's options (None: its slowest): the
        thresholds sit at that option's bounds (1 up to its slot, 0 beyond), each start is
        basic and each node's latest-finishing predecessor's row, and the latest sink's, is
        tight (the tree of that plan's schedule). Measured (``benchmarks/relaxation_basis.py``):
        from the all-max plan stretched to the deadline, HiGHS's dual simplex takes as many
        iterations as from the slowest options (every row's dual is 0 in such a basis, so it
        moves each threshold to its slowest bound first).
        """
        problem, status = self.problem, self.highspy.HighsBasisStatus
        src, dst = problem.edges[:, 0], problem.edges[:, 1]
        sinks = np.flatnonzero(np.bincount(src, minlength=self.n) == 0)
        if self.h.getBasis().valid or self.h.getNumRow() != len(src) + len(sinks):
            return  # a basis to start from already, or nesting rows
        if slot is None:
            slot = np.where(self.options.valid, np.arange(self.options.valid.shape[1]), -1).max(
                axis=1
            )
        duration = self.options.time_s[np.arange(self.n), slot]
        finish = problem._passes.heads(duration) + duration
        by_node = np.lexsort((-finish[src], dst))
        tight = by_node[np.r_[True, dst[by_node][1:] != dst[by_node][:-1]]]
        has_in = np.bincount(dst, minlength=self.n) > 0
        # 0 at the lower bound, 1 basic, 2 at the upper bound
        row = np.ones(len(src) + len(sinks), dtype=np.int64)
        row[tight] = 0
        row[len(src) + int(np.argmax(finish[sinks]))] = 0
        col = np.r_[np.where(self.slot <= slot[self.node_of], 2, 0), has_in.astype(np.int64), 1]
        named = np.array([status.kLower, status.kBasic, status.kUpper], dtype=object)
        basis = self.highspy.HighsBasis()
        basis.col_status, basis.row_status = list(named[col]), list(named[row])
        basis.valid = True
        self.h.setBasis(basis)

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
                self._run(until - _time.perf_counter())
                if h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
                    lo, hi = lower.copy(), upper.copy()
                    hi[pick] = 0.0
                    h.changeColsBounds(nx, cols, lo, hi)
                    self._run(until - _time.perf_counter())
                    if h.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
                        break  # numerically lost: keep the last relaxed solution
                lower, upper = lo, hi
                y = np.asarray(h.getSolution().col_value[:nx])
        finally:
            h.changeColsBounds(nx, cols, np.zeros(nx), np.ones(nx))
        return self.round_down(y)

    def roll(
        self, until: float, chunks: int = _ROLL_CHUNKS, *, latest_first: bool = False
    ) -> np.ndarray:
        """Round the relaxation just solved in time order; return the plan as option slots.

        A rolling horizon: the nodes are cut into ``chunks`` groups by their start under the
        relaxed durations; group by group, from the earliest, every threshold of the group
        is fixed at its nearest value (at 0 where that leaves no feasible relaxation: faster
        options always fit) and the relaxation is re-solved (warm, from its basis), so the
        later nodes take up what the rounding of the earlier ones gained or lost. The
        rounding of each node alone (:meth:`round_down`) loses where a pipeline's steady
        state runs every stage at one fractional duration between two hull options: the
        plans that match the relaxation mix the two options in step across the stages,
        which no node rounded alone finds. Past ``until`` (``time.perf_counter``) the
        relaxation so far is rounded down. Every bound is restored after, and the
        relaxation's optimal basis. ``latest_first`` takes the groups from the latest, so
        the earlier nodes take up the rounding of the later ones
        (:meth:`opdvfs.plan.dag._Rounding.latest_first`).
        """
        h, nx = self.h, self.nx
        cols = np.arange(nx, dtype=np.int32)
        y = np.asarray(h.getSolution().col_value[:nx])
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        starts = self.problem._passes.heads((self.fastest_ms + step) / 1e3)
        place = np.empty(self.n, dtype=np.int64)
        place[np.argsort(-starts if latest_first else starts, kind="stable")] = np.arange(self.n)
        group = place[self.node_of] * chunks // max(self.n, 1)
        lower, upper = np.zeros(nx), np.ones(nx)
        optimal = self.highspy.HighsModelStatus.kOptimal
        solved = h.getBasis()  # the relaxation's own: a frontier's next deadline starts there
        try:
            for at in range(chunks):
                pick = group == at
                for fixed in (
                    np.where(y[pick] >= 0.5, 1.0, 0.0),
                    np.where(y[pick] >= 1 - 1e-6, 1.0, 0.0),
                ):
                    if _time.perf_counter() >= until:
                        return self.round_down(y)
                    lo, hi = lower.copy(), upper.copy()
                    lo[pick], hi[pick] = fixed, fixed
                    h.changeColsBounds(nx, cols, lo, hi)
                    self._run(until - _time.perf_counter())
                    if h.getModelStatus() == optimal:
                        break
                else:
                    break  # out of time or numerically lost: keep the last relaxed solution
                lower, upper = lo, hi
                y = np.asarray(h.getSolution().col_value[:nx])
        finally:
            h.changeColsBounds(nx, cols, np.zeros(nx), np.ones(nx))
            h.setBasis(solved)
        return self.round_down(y)

    def dual_bound(self) -> float:
        """Return a certified lower bound (J) from the row duals HiGHS holds now (-inf: none).

        For any row duals (clipped to the signs the row bounds allow) the Lagrangian
        ``min over the box of c x - y (A x - b)`` is a lower bound on the programme; the box
        is each column's bounds with every start between its earliest (all-fastest heads)
        and its latest (the deadline less its all-fastest duration and tail): every plan
        within the deadline lies in it. Used when a relaxation stops at its time limit:
        HiGHS's dual simplex iterates are near dual feasible, and their bound rises toward
        the optimum (measured at 16 stages x 128 microbatches: 2.0-2.9% below it at 30% of
        the solve's time, 0.3-0.7% at 50%, 0.01-0.43% at 70%).
        """
        lp = self.h.getLp()
        solution = self.h.getSolution()
        row_lo, row_hi = np.asarray(lp.row_lower_), np.asarray(lp.row_upper_)
        dual = np.asarray(solution.row_dual, dtype=float)
        # any duals give a valid bound: HiGHS's flag that they are its solve's is not needed
        if dual.shape != row_lo.shape or not np.isfinite(dual).all():
            return -np.inf
        dual = np.where(
            dual > 0,
            np.where(np.isfinite(row_lo), dual, 0.0),
            np.where(np.isfinite(row_hi), dual, 0.0),
        )
        a = lp.a_matrix_
        start = np.asarray(a.start_)
        col = np.repeat(np.arange(lp.num_col_), np.diff(start))
        used = np.bincount(
            col, weights=np.asarray(a.value_) * dual[np.asarray(a.index_)], minlength=lp.num_col_
        )
        reduced = np.asarray(lp.col_cost_) - used
        lower, upper = np.asarray(lp.col_lower_).copy(), np.asarray(lp.col_upper_).copy()
        fastest_s = self.fastest_ms / 1e3
        passes = self.problem._passes
        deadline_ms = upper[self.makespan_col]
        lower[self.nx : self.nx + self.n] = passes.heads(fastest_s) * 1e3
        upper[self.nx : self.nx + self.n] = (
            deadline_ms - self.fastest_ms - passes.tails(fastest_s) * 1e3
        )
        with np.errstate(invalid="ignore"):  # 0 x inf where a reduced cost is 0
            columns = np.where(
                reduced > 0, reduced * lower, np.where(reduced < 0, reduced * upper, 0.0)
            )
            rows = np.where(dual > 0, dual * row_lo, np.where(dual < 0, dual * row_hi, 0.0))
        bound = float(lp.offset_ + rows.sum() + columns.sum())
        return bound if np.isfinite(bound) else -np.inf

    def durations_now(self) -> np.ndarray:
        """Return each node's duration (s) under the thresholds HiGHS holds now (maybe late)."""
        y = np.clip(np.asarray(self.h.getSolution().col_value[: self.nx]), 0.0, 1.0)
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        return (self.fastest_ms + step) / 1e3

    def round_down(self, y: np.ndarray) -> np.ndarray:
        """Each node's slowest option not slower than its duration under thresholds ``y``."""
        step = np.bincount(self.node_of, weights=y * self.step_ms, minlength=self.n)
        duration_ms = self.fastest_ms + step
        at_or_below = self.round_to.time_s * 1e3 <= duration_ms[:, None] * (1 + _TIME_RTOL) + 1e-12
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
        self.live_bound_j = -np.inf
        if slot is not None:
            dur = self.options.time_s[np.arange(self.n), slot]
            starts = self.problem._passes.heads(dur)
            col = np.r_[self.thresholds(slot), starts * 1e3, (starts + dur).max() * 1e3]
            sol = self.highspy.HighsSolution()
            sol.col_value = list(col)
            sol.value_valid = True
            h.setSolution(sol)
        self._run(time_limit_s)
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
        self.programme.watch(lambda _incumbent, bound: stop_when(bound))
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

    def finish(
        self, *, reraise: bool = True, wait_s: float | None = None
    ) -> tuple[np.ndarray | None, float]:
        """Stop the worker; return the best plan it found (None if none) and its bound (J).

        An error in the worker (Ctrl-C included) is raised here unless ``reraise`` is False
        (the caller is already unwinding from its own). With ``wait_s``, a worker that has
        not stopped within that many seconds plus :data:`_FINISH_GRACE_S` is left to stop at
        its next callback (it is halted; HiGHS's root LP and presolve run out of the
        callbacks' reach, for seconds on a large root), and its live bound is returned alone.
        """
        self.programme.halt()
        self._thread.join(None if wait_s is None else wait_s + _FINISH_GRACE_S)
        if self._thread.is_alive():
            return None, self.bound_j
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

    def finish(
        self, *, reraise: bool = True, wait_s: float | None = None
    ) -> tuple[np.ndarray | None, float]:
        return None, -np.inf


_NO_WORKER = _NoWorker()
