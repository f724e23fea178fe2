"""The clock-planning problem as a 0/1 linear programme, solved by HiGHS: the reference optimum.

:func:`milp_solve` states the problem of :mod:`opdvfs.plan.dp` independently (one-hot clock
per stage ``x[s, c]``, a switch indicator ``y[s] >= |x[s, c] - x[s-1, c]|`` for every clock,
``sum T x + t_sw sum y <= B``, minimise ``sum E x + e_sw sum y``) and hands it to a MILP
solver, so the tests and ``benchmarks/real_planning.py`` can check the exact programme against
it. Planning a single chain does not need it at run time; ``highspy`` (the ``pipeline``
extra, which the pipeline planner, :mod:`opdvfs.plan.dag`, solves with) is imported on first use.
"""

from __future__ import annotations

import numpy as np

from opdvfs.exceptions import MissingExtraError, ValidationError
from opdvfs.plan.dp import PlanResult, StageTables, gap_pct

__all__ = ["milp_solve"]


def _check(tables: StageTables, budget_s: float) -> None:
    """Reject what the 0/1 programme does not state: the reactive lag, a NaN budget or cell."""
    if tables.lag_s > 0:
        raise ValidationError(
            "the MILP states predictive dispatch only (lag_s must be 0)", field="lag_s"
        )
    if not np.isfinite(budget_s):
        raise ValidationError(f"budget_s {budget_s} is not finite", field="budget_s")
    if not (np.isfinite(tables.time_s).all() and np.isfinite(tables.energy_j).all()):
        raise ValidationError("the stage tables hold a NaN or infinite cell", field="tables")


def milp_solve(tables: StageTables, budget_s: float, *, rel_gap: float = 1e-9) -> PlanResult:
    """Minimise energy within ``budget_s`` with HiGHS; return the plan, its bound and gap.

    Times enter in milliseconds: HiGHS's feasibility tolerance is absolute (1e-7), and in
    seconds it lets the budget row slip by ~1e-5 of itself, enough to "beat" the optimum.

    Parameters
    ----------
    tables
        Stage time and energy tables with switch costs (``lag_s`` must be 0).
    budget_s
        Time allowed (s).
    rel_gap
        Relative MIP gap at which HiGHS stops (its default, 1e-4, is too loose for a
        reference).

    Returns
    -------
    PlanResult
        ``status`` ``optimal`` (within ``rel_gap``) or ``infeasible``; ``lower_bound_j`` is
        HiGHS's dual bound and ``gap_pct`` its gap, as in :func:`opdvfs.plan.dp.solve`.

    Raises
    ------
    ValidationError
        If the tables carry a reactive lag or a non-finite value.
    """
    _check(tables, budget_s)
    try:
        import highspy  # imported on first use: only checks need this programme
    except ImportError as e:
        raise MissingExtraError("highspy", "pipeline", "the exact 0/1 programme") from e

    n_stages, n_clocks = tables.shape
    nx, ny = n_stages * n_clocks, n_stages - 1
    n = nx + ny
    time_ms = np.r_[tables.time_s.ravel(), np.full(ny, tables.switch_time_s)] * 1e3
    cost = np.r_[tables.energy_j.ravel(), np.full(ny, tables.switch_energy_j)]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", rel_gap)
    inf = highspy.kHighsInf
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsCost(n, np.arange(n), cost)
    h.changeColsIntegrality(n, np.arange(n), np.full(n, highspy.HighsVarType.kInteger))
    # one clock per stage: sum_c x[s, c] = 1
    one_hot = np.arange(nx, dtype=np.int32)
    h.addRows(
        n_stages,
        np.ones(n_stages),
        np.ones(n_stages),
        nx,
        np.arange(0, nx, n_clocks, dtype=np.int32),
        one_hot,
        np.ones(nx),
    )
    if ny:
        # y[s-1] >= x[s, c] - x[s-1, c] for every clock: y - x[s, c] + x[s-1, c] >= 0
        grid = np.meshgrid(np.arange(1, n_stages), np.arange(n_clocks), indexing="ij")
        s, c = grid[0].ravel(), grid[1].ravel()
        index = np.column_stack([nx + s - 1, s * n_clocks + c, (s - 1) * n_clocks + c])
        h.addRows(
            len(s),
            np.zeros(len(s)),
            np.full(len(s), inf),
            index.size,
            np.arange(0, index.size, 3, dtype=np.int32),
            index.ravel().astype(np.int32),
            np.tile([1.0, -1.0, 1.0], len(s)),
        )
    h.addRow(-inf, budget_s * 1e3, n, np.arange(n, dtype=np.int32), time_ms)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return PlanResult.infeasible(budget_s)
    x = np.asarray(h.getSolution().col_value[:nx]).reshape(n_stages, n_clocks)
    clock = np.argmax(x, axis=1).astype(np.int64)
    time_s, energy_j, switches = tables.evaluate(clock)
    info = h.getInfo()
    bound = float(info.mip_dual_bound)
    return PlanResult(
        clock=clock,
        time_s=time_s,
        energy_j=energy_j,
        switches=switches,
        lower_bound_j=bound,
        gap_pct=gap_pct(energy_j, bound),
        status="optimal",
        lam=0.0,
        budget_s=budget_s,
    )
