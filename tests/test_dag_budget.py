"""The DAG planner within its time limit where HiGHS runs out of its callbacks' reach, and the
greedy pass's moves (issue 35)."""

import threading
import types

import numpy as np
import pytest

pytest.importorskip("highspy")

from opdvfs.datasets import dataset_path
from opdvfs.io import read_profile
from opdvfs.plan import _dag_lp, _dag_search, dag
from opdvfs.plan._dag_problem import _TIME_RTOL, _deadline, _Options
from opdvfs.plan.pipeline import pipeline_dag
from test_dag_planner import random_dag


def _stuck_worker(monkeypatch):
    """Make every bound worker hang in "HiGHS" (deaf to halt) until the returned event is set."""
    release = threading.Event()

    def run(self, slot, rel_gap, time_limit_s):
        release.wait(60.0)  # a root LP out of the callbacks' reach
        self._result = (None, -np.inf, False)

    monkeypatch.setattr(_dag_lp._BoundWorker, "_run", run)
    return release


def test_a_bound_worker_stuck_out_of_reach_is_not_waited_for_past_its_time(monkeypatch):
    # before: finish() joined the thread, however long HiGHS's root took (a worker told to
    # stop 0.3 s into its root stopped 18 s of CPU later)
    release = _stuck_worker(monkeypatch)
    problem = pipeline_dag(read_profile([dataset_path("perseus-gpt3-175b-a40")]), 4)
    options = _Options.build(problem)
    deadline_s, top = _deadline(problem, 0.0)
    slot = np.argmax(options.clock == top[:, None], axis=1)
    worker = _dag_lp._BoundWorker(
        problem, options, deadline_s, slot, rel_gap=1e-9, time_limit_s=60.0, stop_when=bool
    )
    try:
        found, bound_j = worker.finish(wait_s=0.01)
        # returned while the worker still ran: no event-driven wait in the test, no wall time
        assert worker._thread.is_alive()
        assert found is None and bound_j == worker.bound_j
    finally:
        release.set()
        worker._thread.join(60.0)
    assert not worker._thread.is_alive()


def test_solve_dag_returns_while_its_bound_worker_is_stuck(monkeypatch):
    release = _stuck_worker(monkeypatch)
    monkeypatch.setattr(dag, "_root_seconds", lambda columns, load: 0.0)  # the worker starts
    started = []
    original = _dag_lp._BoundWorker.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(_dag_lp._BoundWorker, "__init__", init)
    problem = pipeline_dag(read_profile([dataset_path("perseus-gpt3-175b-a40")]), 4)
    try:
        plan = dag.solve_dag(problem, 0.0, rel_gap=1e-12, time_limit_s=0.3)
        assert started, "the bound worker did not start"
        assert started[0]._thread.is_alive()  # returned before the stuck worker let go
        assert plan.status in ("optimal", "feasible")
        assert plan.makespan_s <= plan.deadline_s * (1 + 1e-6)
        assert plan.lower_bound_j <= plan.energy_j
    finally:
        release.set()
        for worker in started:
            worker._thread.join(60.0)


class _FakeClock:
    """``time.perf_counter`` for the search: moves only when a fake HiGHS solve runs."""

    def __init__(self):
        self.t = 1000.0

    def perf_counter(self):
        return self.t


class _OverrunningProgramme:
    """A programme whose every exact solve runs ``overrun_s`` past its limit; finds nothing."""

    def __init__(self, clock, overrun_s):
        self.clock, self.overrun_s, self.limits = clock, overrun_s, []

    def exact(self, slot, *, rel_gap, time_limit_s, free=None, band=None):
        self.limits.append(time_limit_s)
        self.clock.t += time_limit_s + self.overrun_s
        return None, -np.inf, False


@pytest.mark.parametrize("budget_s", [0.12, 0.5])
def test_the_last_search_keeps_the_plans_end_when_every_solve_overruns(monkeypatch, budget_s):
    # HiGHS's presolve runs out of the callbacks' reach: every solve here ends 0.05 s past its
    # limit, as an earlier search of the same plan measured. Before: each search learned the
    # overrun afresh, so the last one's first solve started with no room for it (0.1 s left:
    # 0.05 s past the plan's end)
    clock = _FakeClock()
    monkeypatch.setattr(
        _dag_search, "_time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    problem = random_dag(np.random.default_rng(0), 40, 4)
    options = _Options.build(problem)
    deadline_s, top = _deadline(problem, 0.1)
    slot = np.argmax(options.clock == top[:, None], axis=1)

    def search(until, hard_end):
        programme = _OverrunningProgramme(clock, overrun_s=0.05)
        overrun = [0.05]  # measured by the plan's earlier search
        got = _dag_search._search(
            problem,
            options,
            lambda: programme,
            slot,
            np.zeros(problem.n_nodes, dtype=bool),
            deadline_s,
            until,
            lambda _energy_j: False,
            overrun,
            hard_end=hard_end,
        )
        assert programme.limits, "no solve ran"
        assert overrun == [pytest.approx(0.05)]
        assert np.array_equal(got, slot)  # nothing found: the plan as given
        return programme.limits

    until = clock.t + budget_s
    search(until, hard_end=True)
    assert clock.t <= until + 1e-12  # no solve ended past the plan's end
    # a search whose end is a share of the budget (the next phase's start) keeps its old
    # guard: its own overruns only, so its first solve gets the whole of its 0.1 s
    clock.t = 1000.0
    assert search(clock.t + budget_s, hard_end=False)[0] == pytest.approx(0.1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("blocking_power_w", [0.0, 70.0])
def test_each_nodes_best_move_is_the_best_single_move_that_keeps_the_deadline(
    seed, blocking_power_w
):
    # the greedy pass's moves against brute force: every (node, slower option) as a plan of
    # its own, evaluated whole (makespan and energy, blocking power included)
    rng = np.random.default_rng(seed)
    problem = random_dag(rng, 30, 6, blocking_power_w=blocking_power_w)
    options = _Options.build(problem)
    deadline_s, _ = _deadline(problem, 0.15)
    limit = deadline_s * (1 + _TIME_RTOL)
    n, k = options.time_s.shape
    rows = np.arange(n)
    # a filled plan with half its nodes one option faster: float to spend here and there
    slot = _dag_search._greedy_fill(problem, options, np.zeros(n, dtype=int), deadline_s)
    slot = np.where(rng.random(n) < 0.5, np.maximum(slot - 1, 0), slot)
    _, energy, _ = problem.evaluate(options.clock[rows, slot])
    node, option = np.divmod(np.arange(n * k), k)
    ok = options.valid[node, option] & (option > slot[node])
    node, option = node[ok], option[ok]
    plans = np.repeat(slot[None], len(node), axis=0)
    plans[np.arange(len(node)), node] = option
    makespan, moved_j, _ = problem.evaluate(options.clock[rows, plans])
    longer = options.time_s[node, option] - options.time_s[node, slot[node]]
    good = (makespan <= limit) & (moved_j < energy - 1e-9)
    expected = np.full(n, -np.inf)
    np.maximum.at(expected, node[good], ((energy - moved_j) / longer)[good])

    best_k, rate = _dag_search._best_moves(problem, options, slot, limit)
    assert np.isfinite(expected).any()  # the test has moves to check
    np.testing.assert_array_equal(np.isfinite(rate), np.isfinite(expected))
    np.testing.assert_allclose(rate[np.isfinite(rate)], expected[np.isfinite(expected)], rtol=1e-6)
    head = problem.start_times(options.clock[rows, slot])
    again_k, again = _dag_search._best_moves(problem, options, slot, limit, head)
    assert np.array_equal(again_k, best_k) and np.array_equal(again, rate)


def test_a_batched_greedy_round_keeps_the_cheapest_prefix_that_holds():
    problem = pipeline_dag(read_profile([dataset_path("perseus-bloom-a40")]), 8)
    options = _Options.build(problem)
    deadline_s, _ = _deadline(problem, 0.05)
    limit = deadline_s * (1 + _TIME_RTOL)
    rows = np.arange(problem.n_nodes)
    slot = np.zeros(problem.n_nodes, dtype=int)  # all fastest: float everywhere
    _, energy, _ = problem.evaluate(options.clock[rows, slot])
    best_k, rate = _dag_search._best_moves(problem, options, slot, limit)
    got, got_j, head, batch = _dag_search._batch_round(
        problem, options, slot, float(energy), best_k, rate, 8, limit
    )
    # every prefix of the moves by rate, each evaluated alone
    order = np.argsort(-rate, kind="stable")[: int(np.isfinite(rate).sum())]
    sizes = np.unique(np.r_[1, np.clip(8 * 2.0 ** np.arange(-3, 3), 1, len(order)).astype(int)])
    best = (np.inf, None)
    for size in sizes:
        trial = slot.copy()
        trial[order[:size]] = best_k[order[:size]]
        makespan, trial_j, _ = problem.evaluate(options.clock[rows, trial])
        if (makespan <= limit and trial_j < energy) or size == 1:
            best = min(best, (float(trial_j), int(size)), key=lambda b: b[0])
    assert got_j == pytest.approx(best[0], rel=1e-12) and batch == 2 * best[1]
    makespan, energy_j, _ = problem.evaluate(options.clock[rows, got])
    assert makespan <= limit and energy_j == pytest.approx(got_j, rel=1e-12)
    np.testing.assert_allclose(head, problem.start_times(options.clock[rows, got]), rtol=1e-12)


@pytest.mark.parametrize(
    ("wall_s", "cpu_s", "starved"),
    [
        (0.048, 0.0048, 10.0),  # 8 x 32's set-up (4.8 ms of CPU) at a tenth of a core
        (0.026, 0.0026, 1.0),  # 8 x 16's: too short to tell
        (0.006, 0.0048, 1.0),  # a whole core, give or take
    ],
)
def test_a_set_up_of_a_few_ms_tells_whether_the_plan_is_starved(wall_s, cpu_s, starved):
    # the set-up no longer builds the whole programme (8 x 32: 6.2-6.6 ms -> 4.8 ms of CPU);
    # a threshold of 5 ms would have stopped telling a starved 8 x 32 plan from a fed one
    assert dag._starved(wall_s, cpu_s, 0.85) == pytest.approx(starved)
    assert dag._starved(wall_s, cpu_s, 0.0) == 1.0  # no time limit: nothing to keep back


def test_a_plan_starved_of_cpu_keeps_back_more_of_its_budget_for_its_wrap_up(monkeypatch):
    # the set-up took 0.3 s of wall time for 0.03 s of CPU (a tenth of a core): the work after
    # the relaxation (the plan when it runs out, the wrap-up) will take ten times its CPU too.
    # Before: 0.03 s kept back whatever the share of a core (limit 2 - 0.3 - 0.03 = 1.67 s)
    from opdvfs.plan._dag_lp import _OutOfTime, _Programme

    clock = types.SimpleNamespace(wall=500.0, cpu=10.0)
    monkeypatch.setattr(
        dag,
        "_time",
        types.SimpleNamespace(perf_counter=lambda: clock.wall, thread_time=lambda: clock.cpu),
    )
    prepare = dag._prepare

    def slow_prepare(problem, deadline_s=None):
        clock.wall, clock.cpu = clock.wall + 0.3, clock.cpu + 0.03
        return prepare(problem, deadline_s)

    limits = []

    def out_of_time(self, time_limit_s=None):
        limits.append(time_limit_s)
        raise _OutOfTime

    monkeypatch.setattr(dag, "_prepare", slow_prepare)
    monkeypatch.setattr(_Programme, "relax", out_of_time)
    problem = pipeline_dag(read_profile([dataset_path("perseus-gpt3-175b-a40")]), 4)
    plan = dag.solve_dag(problem, 0.02, time_limit_s=2.0)
    # 2 s - 0.3 s gone - the wrap-up 0.03 x 10 - the stretched plan's 0.01 s of CPU x 10
    assert limits == [pytest.approx(2.0 - 0.3 - 0.3 - 0.1)]
    assert plan.method == "stretched"
    assert plan.makespan_s <= plan.deadline_s * (1 + 1e-6)
    # a whole core: as before
    limits.clear()
    monkeypatch.setattr(dag, "_prepare", prepare)
    dag.solve_dag(problem, 0.02, time_limit_s=2.0)
    assert limits == [pytest.approx(2.0 - 0.03)]
