"""Measurements first: the planner's per-op tables from what the profile measured (DESIGN §4).

At a 2-10% budget the decisions live in the top few clock steps, where a 1% model bias flips
them (issue 15: on a real A100 the fitted models said 1380 MHz costs 1.5% time and saves 3.2%
energy; measured, it costs 0.23% and adds 0.16%). So wherever the profile measured an operator
at a clock, the planner takes that measurement (the median over iterations), and the models
fill only the clocks that were not measured. Where they fill, the fitted curve is corrected to
pass through the measured points: the log-ratio ``ln(measured / predicted)`` of each op is
interpolated linearly in the clock between its measured clocks and held at the nearest one
beyond them (so a plan never trades a measured fact for a model value).

:data:`~opdvfs.schedule.Values` selects the source: ``auto`` (measured where present, the
corrected models elsewhere), ``measured`` (every op at every planned clock must be measured:
a gap is an error naming the op and the clock) or ``model`` (the models alone, as before).

A static-clock profile measures each clock with the die at that clock's own steady temperature;
a plan runs its slowed ops on a die near the top clock's, where they leak more. Before they
correct the models, :func:`at_die` moves the measured energies to the plan's die temperature by
the power model's own temperature term (``gamma dT V``, paper eqs. 10-11): left at their cooler
die they would pull the corrected tables back to the profile's bias.

A profile of many clocks measures each cell once or a few times, with the timer's and the power
sensor's noise (about 0.6% per op on the simulated GPUs). A planner choosing among them picks the
cells where the noise happened to be low (the winner's curse): GPT-3 on a100-like profiled at all
81 clocks and planned at 2% ran 2.24% slower (2.08% smoothed, when a cell measured once was
smoothed too). :func:`shrink_across_clocks` pulls each
op's medians towards a penalised smoothing spline across its clocks (log value against log
clock), whose smoothness generalised cross-validation chooses per op from the op's own scatter
(the posterior mean under a smooth prior whose noise-to-signal ratio the data estimate: empirical
Bayes, not a tuned constant), and keeps every residual pattern that more ops share at the same
clocks than noise would explain (a throttled clock, a voltage step, one op's repeated copies):
that is measured behaviour. Three clocks or fewer are not smoothed at all.

Measured means measured (issue 31): the smoothing never moves a cell's median by more than that
cell's own noise, the standard error of its median estimated from its iterations
(:func:`median_noise`); a cell measured once has no noise estimate and is left alone. Unbounded,
the smoothing moved real kernels' medians by up to 13.7% (the legacy V100 set at its ``auto``
clocks, one sample per cell). The tables keep the raw medians too (:meth:`MeasuredTables.raw`):
every figure called "measured" (a schedule's ``measured_*`` fields, the over-budget warning) is
computed on them, not on the smoothed cells the planner chooses among.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from opdvfs.exceptions import ValidationError
from opdvfs.models.perf import check_times
from opdvfs.models.power import PowerModel
from opdvfs.profile import CellBlocks, Profile, block_medians, cell_medians

__all__ = [
    "POOL_MIN_CLOCKS",
    "MeasuredTables",
    "at_die",
    "correct_to_measurements",
    "gap_reach",
    "log_uncertainty",
    "median_noise",
    "missing_measurement",
    "pooled_noise",
    "shrink_across_clocks",
]

#: Relative tolerance when matching a planned clock to a profiled one.
_CLOCK_RTOL = 1e-9

#: Smoothing parameters GCV chooses among, per op: relative to the penalty's median eigenvalue,
#: from interpolation (1e-8) to the straight line in (ln f, ln value) (1e8), a quarter decade apart.
_LAMBDAS = np.logspace(-8.0, 8.0, 65)

#: Rounds of smoothing and finding the shared patterns (backfitting): the first smooth has
#: spread a shared step to the step's neighbouring clocks, the second smooths without it.
_BACKFIT = 2

#: Ops smoothed at a time: bounds the (ops x lambdas) GCV table of a million-op profile.
_ROW_BLOCK = 32768

#: Fewest measured clocks of an op whose residuals from its smooth curve count as noise
#: (:func:`pooled_noise`). A curve across an op's clocks takes two to three degrees of freedom
#: (a power law and its bend), so at four or five clocks what is left is as much the curve's
#: misfit as noise; and a plan on so few, far-apart clocks picks little of their noise (the
#: winner's curse needs close clocks whose order noise can change). On the 27 real sets of
#: ``benchmarks/few_clock_plans.py`` (4-5 ``auto`` clocks) a noise estimate from the curves'
#: residuals (0.01-0.2%) made the plans' slack cost up to 0.044% of energy on 8 plans, none of
#: which was late without it.
POOL_MIN_CLOCKS = 6

#: Standard error of a normal sample's median over that of its mean, sqrt(pi / 2) (large n).
_MEDIAN_EFFICIENCY = float(np.sqrt(np.pi / 2.0))


@dataclass(frozen=True)
class MeasuredTables:
    """Median time and energy of every op at every profiled clock; NaN where not measured.

    Attributes
    ----------
    op_ids
        Operator positions, ascending, shape (n_ops,).
    names
        Operator names, shape (n_ops,).
    freqs_mhz
        The profile's clocks, ascending (MHz), shape (n_clocks,).
    time_us
        Median time over iterations (us), shape (n_ops, n_clocks).
    chip_energy_j, core_energy_j
        Median over iterations of each row's ``time x power`` (J), shape (n_ops, n_clocks); NaN
        where the row has no power of that rail (e.g. a NaN in the source's energy column).
    temp_c
        Median die temperature the cell was measured at (C), shape (n_ops, n_clocks); NaN
        where the profile has none. A static-clock profile measures each clock at that
        clock's own steady temperature (:func:`at_die`).
    time_noise_us
        The standard error of each cell's median time (us, :func:`median_noise`), shape
        (n_ops, n_clocks); 0 where the cell was measured once (no estimate), None where every
        cell was. The planner's conservative time adds it (:func:`log_uncertainty`).
    chip_noise_j
        The same for the chip energy (J).
    pooled_time_noise
        Where every cell was measured once (no cell has its own noise estimate): the noise of
        one measurement of a time, a relative standard deviation pooled over the whole profile
        (:func:`pooled_noise`); None otherwise. The planner leaves the plan that much slack
        (:data:`~opdvfs.plan.planner.MEASURED_SUM_Z`), on the time only.
    unsmoothed
        The raw medians, where ``time_us`` and the energies are smoothed across clocks
        (:meth:`from_profile` with ``shrink``); None where they are the raw medians. Read them
        through :meth:`raw`.
    """

    op_ids: np.ndarray
    names: np.ndarray
    freqs_mhz: np.ndarray
    time_us: np.ndarray
    chip_energy_j: np.ndarray
    core_energy_j: np.ndarray
    temp_c: np.ndarray | None = None
    unsmoothed: MeasuredTables | None = None
    time_noise_us: np.ndarray | None = None
    chip_noise_j: np.ndarray | None = None
    pooled_time_noise: float | None = None

    @classmethod
    def from_profile(cls, profile: Profile, *, shrink: bool = True) -> MeasuredTables:
        """Return the profile's medians over iterations, one (op, clock) cell each.

        With ``shrink`` (the default) each op's time and energies are then smoothed across its
        clocks (:func:`shrink_across_clocks`), so that a planner choosing among the cells does
        not pick their noise, each cell by at most its median's noise (:func:`median_noise`;
        a cell measured once is left alone); the raw medians stay in :meth:`raw`.
        ``shrink=False`` keeps the raw medians only.
        """
        rows = profile.ops
        op_ids, freqs, cell = profile.cells()
        shape = (len(op_ids), len(freqs))
        n_cells = shape[0] * shape[1]
        counts = np.bincount(cell, minlength=n_cells)
        names = _op_names(rows["name"], cell // shape[1], shape[0])
        columns: dict[str, np.ndarray | None] = {
            "time_us": rows["time_us"].to_numpy(dtype=float),
            "chip_j": _energy(rows, "chip_power_w"),
            "core_j": _energy(rows, "core_power_w"),
            "temp_c": rows["temp_c"].to_numpy(dtype=float) if "temp_c" in rows else None,
        }
        del rows
        if counts.max(initial=0) < 2:  # every cell measured once: none may move, no own noise
            once = {
                c: np.full(n_cells, np.nan) if v is None else cell_medians(v, cell, counts)
                for c, v in columns.items()
            }
            time_us = once["time_us"].reshape(shape)
            check_times(op_ids, names, freqs, np.where(np.isnan(time_us), np.inf, time_us))
            raw = cls(
                op_ids,
                names,
                freqs,
                time_us,
                once["chip_j"].reshape(shape),
                once["core_j"].reshape(shape),
                once["temp_c"].reshape(shape),
            )
            with threadpool_limits(limits=1, user_api="blas"):
                return replace(raw, pooled_time_noise=pooled_noise(freqs, time_us))
        blocks = CellBlocks.of(cell, counts)
        del cell
        medians, noise = {}, {}
        for c, values in columns.items():
            if values is None:  # no such column: no value, no noise
                medians[c], noise[c] = np.full(shape, np.nan), np.zeros(shape)
                continue
            median, spread, n = _cell_stats(values, blocks, n_cells)
            medians[c] = median.reshape(shape)
            # the noise of each cell: the standard error of its median, from its own iterations
            noise[c] = median_noise(spread.reshape(shape), n.reshape(shape))
        del blocks, columns
        time_us = medians["time_us"]
        # a measured time of 0 has no slowdown to trade (cells not measured are gaps, not errors)
        check_times(op_ids, names, freqs, np.where(np.isnan(time_us), np.inf, time_us))
        raw = cls(
            op_ids, names, freqs, time_us, medians["chip_j"], medians["core_j"], medians["temp_c"]
        )
        raw = replace(raw, time_noise_us=noise["time_us"], chip_noise_j=noise["chip_j"])
        if not shrink or len(freqs) < 4:  # three clocks or fewer: nothing to smooth
            return raw
        # one BLAS thread: waking a pool for (ops x clocks) products costs more on a busy
        # machine than it saves (GPT-3 at 119 clocks: 0.4 s on one, 1.3 s on two)
        with threadpool_limits(limits=1, user_api="blas"):
            time_s, chip_s, core_s = (
                shrink_across_clocks(freqs, t, noise=noise[c])
                for t, c in (
                    (time_us, "time_us"),
                    (raw.chip_energy_j, "chip_j"),
                    (raw.core_energy_j, "core_j"),
                )
            )
        return cls(
            op_ids,
            names,
            freqs,
            time_s,
            chip_s,
            core_s,
            raw.temp_c,
            unsmoothed=raw,
            time_noise_us=raw.time_noise_us,
            chip_noise_j=raw.chip_noise_j,
        )

    def raw(self) -> MeasuredTables:
        """Return the tables of the raw medians (these tables, where nothing was smoothed).

        Every figure reported as measured is computed on them.
        """
        return self if self.unsmoothed is None else self.unsmoothed

    def columns(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Column of each clock of ``freqs_mhz`` in these tables, -1 where it was not profiled."""
        freqs = np.asarray(freqs_mhz, dtype=float)
        pos = np.clip(np.searchsorted(self.freqs_mhz, freqs), 0, len(self.freqs_mhz) - 1)
        near = np.isclose(self.freqs_mhz[pos], freqs, rtol=_CLOCK_RTOL, atol=0.0)
        return np.where(near, pos, -1)

    def covers(self, freqs_mhz: np.ndarray, *, core: bool = False) -> bool:
        """Return whether every op's time and chip energy (and core, if asked) were measured.

        At every clock of ``freqs_mhz``: then the planner needs no model.
        """
        cols = self.columns(np.asarray(freqs_mhz, dtype=float))
        if len(self.op_ids) and (cols < 0).any():
            return False
        tables = (self.time_us, self.chip_energy_j, self.core_energy_j)
        # column by column: no (ops x clocks) copy
        return all(
            bool(np.isfinite(t[:, c]).all())
            for t in tables[: 3 if core else 2]
            for c in set(cols.tolist())
        )

    def at(self, freqs_mhz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Time (us), chip and core energy (J) at ``freqs_mhz``; NaN where not measured."""
        return self.time_at(freqs_mhz), self.chip_at(freqs_mhz), self.core_at(freqs_mhz)

    def time_at(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Return the times (us) of :meth:`at` alone."""
        return self._pick(self.time_us, freqs_mhz)

    def chip_at(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Return the chip energies (J) of :meth:`at` alone."""
        return self._pick(self.chip_energy_j, freqs_mhz)

    def core_at(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Return the core energies (J) of :meth:`at` alone."""
        return self._pick(self.core_energy_j, freqs_mhz)

    def _pick(self, table: np.ndarray, freqs_mhz: np.ndarray) -> np.ndarray:
        cols = self.columns(freqs_mhz)
        if (cols >= 0).all():
            return table[:, cols]
        # the profiled columns and one of NaN, gathered row by row (a column at a time wrote
        # the (ops x clocks) result with a stride: 2.5x slower)
        ext = np.empty((len(table), table.shape[1] + 1))
        ext[:, :-1] = table
        ext[:, -1] = np.nan
        return np.take(ext, np.where(cols >= 0, cols, table.shape[1]), axis=1)

    def noise_at(self, freqs_mhz: np.ndarray, *, rail: str = "time") -> np.ndarray:
        """Return each cell's median's standard error at ``freqs_mhz`` (0: unknown).

        ``rail``: ``time`` (us) or ``chip`` (J).
        """
        table = self.time_noise_us if rail == "time" else self.chip_noise_j
        cols = self.columns(np.asarray(freqs_mhz, dtype=float))
        if table is None:
            return np.zeros((len(self.op_ids), len(cols)))
        return np.where(cols[None, :] >= 0, table[:, np.maximum(cols, 0)], 0.0)

    def time_noise_at(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Return each cell's median time's standard error (us) at ``freqs_mhz`` (0: unknown)."""
        return self.noise_at(freqs_mhz, rail="time")

    def temp_at(self, freqs_mhz: np.ndarray) -> np.ndarray:
        """Die temperature (C) of each cell at ``freqs_mhz``; NaN where not measured or none."""
        cols = self.columns(np.asarray(freqs_mhz, dtype=float))
        if self.temp_c is None:
            return np.full((len(self.op_ids), len(cols)), np.nan)
        return np.where(cols[None, :] >= 0, self.temp_c[:, np.maximum(cols, 0)], np.nan)


def pooled_noise(freqs_mhz: np.ndarray, table: np.ndarray) -> float:
    """Return one measurement's noise, a relative standard deviation pooled over a profile.

    For a profile that measured each cell once, where no cell has its own noise estimate: the
    residuals of the log values from each op's smooth curve across its clocks
    (:func:`shrink_across_clocks`, unbounded: every pattern more ops share stays in the
    curve), pooled over the cells of every op measured at :data:`POOL_MIN_CLOCKS` clocks or
    more and taken robustly, ``1.4826 MAD`` (a few cells off the curve for a reason, a
    throttled clock, do not inflate it). Slightly low: the curve follows each cell a little.
    0 where no op has that many clocks or no residual is finite. On ``sim:a100-like``'s tiny
    GPT at its 81 clocks 0.56% (the simulator's per-op noise is about 0.6%); on Perseus's
    stage chains (38 and 60 clocks) under 3e-6: their tables are smooth.

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    table
        Measured values (> 0), NaN where not measured, shape (n_ops, n_clocks).
    """
    values = np.asarray(table, dtype=float)
    rows = np.isfinite(values).sum(axis=1) >= POOL_MIN_CLOCKS
    if not rows.any():
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        resid = np.log(values[rows] / shrink_across_clocks(freqs_mhz, values[rows]))
    resid = resid[np.isfinite(resid)]
    if resid.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(resid - np.median(resid))))


def median_noise(spread: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Return the standard error of each cell's median: ``sqrt(pi / 2) s / sqrt(n)``.

    ``s`` is the standard deviation of the cell's ``n`` iterations (``ddof=1``); the factor is
    the median's asymptotic efficiency against the mean for normal noise (for ``n = 2`` the
    median is the mean, and the bound is loose by that factor: generous, never zero). 0 where
    ``n < 2`` or ``s`` is unknown: a cell measured once carries no estimate of its noise, so
    the smoothing leaves it alone (:func:`shrink_across_clocks`).
    """
    s, n = np.asarray(spread, dtype=float), np.asarray(count, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        se = _MEDIAN_EFFICIENCY * s / np.sqrt(n)
    return np.where((n >= 2) & np.isfinite(se), se, 0.0)


def _op_names(name: pd.Series, op_index: np.ndarray, n_ops: int) -> np.ndarray:
    """Return each op's name from its rows' (``op_index``: each row's op, 0 to ``n_ops - 1``).

    Every row of an op names the same operator (a :class:`Profile` checks), so any row's will
    do: scattered by code where the names are categorical (a validated profile's are), not
    one Python string per row.
    """
    if not isinstance(name.dtype, pd.CategoricalDtype):
        out = np.empty(n_ops, dtype=object)
        out[op_index] = name.to_numpy()
        return out
    codes = np.empty(n_ops, dtype=np.int64)
    codes[op_index] = name.cat.codes.to_numpy()
    return np.asarray(name.cat.categories, dtype=object)[codes]


def _cell_stats(
    values: np.ndarray, blocks: CellBlocks, n_cells: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each cell's median, standard deviation (``ddof=1``) and count, NaN skipped.

    pandas' grouped ``median``, ``std`` and ``count``, bit for bit, from the blocks of cells
    measured equally often (:class:`~opdvfs.profile.CellBlocks`): the standard deviation by
    Welford's update in row order, a column of the block at a time, as pandas computes it. NaN
    where a cell has no value (median) or fewer than two (standard deviation).
    """
    median = np.full(n_cells, np.nan)
    spread = np.full(n_cells, np.nan)
    count = np.zeros(n_cells)
    for cells, block in blocks.blocks(values):
        known = ~np.isnan(block)
        n, mean, m2 = (np.zeros(len(cells)) for _ in range(3))
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, value in enumerate(block):
                if known[k].all():  # the same update without the masks
                    n += 1
                    old = mean
                    mean = old + (value - old) / n
                    m2 += (value - mean) * (value - old)
                    continue
                n += known[k]
                old = mean
                mean = np.where(known[k], old + (value - old) / n, old)
                m2 = np.where(known[k], m2 + (value - mean) * (value - old), m2)
            spread[cells] = np.where(n > 1, np.sqrt(m2 / (n - 1)), np.nan)
        count[cells] = n
        median[cells] = block_medians(block)
    return median, spread, count


def _energy(rows: pd.DataFrame, power_column: str) -> np.ndarray | None:
    """Return each row's energy (J) from its time and a power column; None without the column.

    NaN where a row has no power.
    """
    if power_column not in rows:
        return None
    energy = rows["time_us"].to_numpy(dtype=float) * rows[power_column].to_numpy(dtype=float)
    energy *= 1e-6
    return energy


def _curvature_penalty(x: np.ndarray) -> np.ndarray:
    """``D^T D`` for the second divided differences of a curve sampled at ascending ``x``.

    Row ``k`` of ``D`` is the second divided difference at ``x[k+1]``, scaled by the square root
    of the half-span it stands for, so that ``|D y|^2`` approximates ``integral y''(x)^2 dx`` on an
    uneven grid (the cubic smoothing spline's penalty). Its null space is the straight lines.
    """
    h = np.diff(x)
    a, b = h[:-1], h[1:]
    rows = np.arange(len(x) - 2)
    d = np.zeros((len(x) - 2, len(x)))
    weight = np.sqrt((a + b) / 2.0)
    d[rows, rows] = 2.0 / (a * (a + b)) * weight
    d[rows, rows + 1] = -2.0 / (a * b) * weight
    d[rows, rows + 2] = 2.0 / (b * (a + b)) * weight
    return d.T @ d


def shrink_across_clocks(
    freqs_mhz: np.ndarray, table: np.ndarray, *, noise: np.ndarray | None = None
) -> np.ndarray:
    """Return each op's row of positive measurements shrunk towards its curve across the clocks.

    Per op, the Whittaker smoother ``z = argmin |y - z|^2 + lambda |D z|^2`` of
    ``y = ln(value)`` against ``x = ln(f)`` (:func:`_curvature_penalty`; a power law
    ``value = a f^b`` is not penalised), with ``lambda`` chosen per op by generalised
    cross-validation, ``GCV = n RSS / (n - tr S)^2`` (Craven and Wahba 1979): the smoothing
    spline is the posterior mean under an integrated random-walk prior, and GCV estimates its
    noise-to-signal ratio from the op's own scatter about its curve, so a cell is pulled towards
    its neighbours by as much as the data say it is noisy. Residual patterns that many ops share
    (:func:`_shared`) are added back: they are the clocks' behaviour, not noise. One
    eigendecomposition of the penalty (``S = U diag(1 / (1 + lambda s)) U^T``) serves every op
    and every ``lambda``: vectorised over ops (the GCV table in blocks of :data:`_ROW_BLOCK`)
    and clocks.

    Rows with a missing or non-positive cell are returned unchanged, as is the whole table when
    it has fewer than four clocks (with three, GCV is the same for every ``lambda``: nothing
    tells noise from curvature).

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    table
        Values (time or energy, > 0), NaN where not measured, shape (n_ops, n_clocks).
    noise
        Each cell's noise (the standard error of its median, :func:`median_noise`; 0 where
        unknown), same shape: no cell moves by more (measured means measured). None: unbounded.

    Returns
    -------
    ndarray, shape (n_ops, n_clocks)
    """
    values = np.asarray(table, dtype=float)
    n = values.shape[1]
    if n < 4:
        return values
    s, u = np.linalg.eigh(_curvature_penalty(np.log(np.asarray(freqs_mhz, dtype=float))))
    s = np.clip(s, 0.0, None)
    lambdas = _LAMBDAS / np.median(s[s > s.max() * 1e-12])
    keep = 1.0 / (1.0 + lambdas[:, None] * s[None, :])  # (n_lambdas, n): S's eigenvalues
    residual_dof = (1.0 - keep).sum(axis=1)  # n - tr S, without cancelling against n
    out = values.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = np.flatnonzero(np.all(np.isfinite(np.log(values)), axis=1))
    if len(rows) == 0:
        return out
    logs = np.log(values[rows]) @ u  # (ops, n): each row in the penalty's eigenbasis
    shared = np.zeros_like(logs)
    for _ in range(_BACKFIT):
        # smooth what the shared patterns leave, then find them in what the smooth leaves
        coef = logs - shared
        best = np.empty(len(rows), dtype=int)
        for start in range(0, len(rows), _ROW_BLOCK):
            block = slice(start, start + _ROW_BLOCK)
            rss = (coef[block] ** 2) @ ((1.0 - keep) ** 2).T  # (ops, n_lambdas)
            best[block] = np.argmin(rss / residual_dof**2, axis=1)  # GCV, n a common factor
        smooth = coef * keep[best]
        # each op's noise sigma^2: its residual sum of squares over the factor of its
        # expectation, tr (I - S)^2
        drop = 1.0 - keep[best]
        with np.errstate(divide="ignore", invalid="ignore"):
            sigma2 = ((drop * coef) ** 2).sum(axis=1) / (drop**2).sum(axis=1)
        usable = sigma2 > 0
        resid = logs - smooth
        patterns = _shared(resid[usable] / np.sqrt(sigma2[usable])[:, None], drop[usable] ** 2)
        shared = resid @ patterns
    out[rows] = np.exp((smooth + shared) @ u.T)
    if noise is not None:
        bound = np.nan_to_num(np.asarray(noise, dtype=float), nan=0.0)
        out = np.clip(out, values - bound, values + bound)
    return out


def _shared(white: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Return the projection (n, n), in the eigenbasis, onto what many ops share of the residuals.

    ``white`` holds each op's residuals in the penalty's eigenbasis over its noise sigma,
    ``expected`` each op's noise variance factor there, ``(1 - keep)^2``; noise alone gives
    ``E[white^T white] = diag(expected.sum(0))``. Directions of the Gram matrix so whitened whose
    eigenvalue exceeds noise's largest, ``(1 + sqrt(m / n_ops))^2`` (Marchenko-Pastur), are
    patterns many ops show at the same clocks (a clock the board throttles, a voltage step,
    one op's repeated copies). An op's score on one is signal (variance ``eigval - 1`` across
    ops) plus unit noise, so its posterior mean keeps ``1 - 1 / eigval`` of it (empirical
    Bayes). ``resid @ P`` is the kept part of the residuals.
    """
    n = white.shape[1]
    noise = expected.sum(axis=0)
    free = noise > noise.max() * 1e-9  # the null space (lines) has no residual
    projection = np.zeros((n, n))
    if not free.any() or len(white) == 0:
        return projection
    root = np.sqrt(noise[free])
    gram = white[:, free].T @ white[:, free] / np.outer(root, root)
    eigval, eigvec = np.linalg.eigh(gram)
    above = eigval > (1.0 + np.sqrt(free.sum() / len(white))) ** 2
    kept, weight = eigvec[:, above], 1.0 - 1.0 / eigval[above]
    # whiten (1 / root), project on the kept directions, shrink, colour back (root)
    projection[np.ix_(free, free)] = (kept * weight / root[:, None]) @ (kept.T * root[None, :])
    return projection


def missing_measurement(
    measured: MeasuredTables, table: np.ndarray, freqs_mhz: np.ndarray, what: str
) -> ValidationError | None:
    """Return the error for the first unmeasured (op, clock) cell of ``table``, or None.

    ``table`` is one rail at ``freqs_mhz`` (from :meth:`MeasuredTables.at`); the message names
    the operator (position and name), the clock and the quantity.
    """
    gaps = ~np.isfinite(table)
    if not gaps.any():
        return None
    row, col = np.unravel_index(int(np.argmax(gaps)), gaps.shape)
    more = int(gaps.sum()) - 1
    return ValidationError(
        f"op {int(measured.op_ids[row])} ({measured.names[row]}) has no measured {what} at "
        f"{float(freqs_mhz[col]):g} MHz"
        + (f" (and {more} more op-clock cells)" if more else "")
        + ": profile it, or plan with --values auto (and --train-freqs without that clock) "
        "so that the models fill it",
        field=what,
    )


def correct_to_measurements(
    freqs_mhz: np.ndarray,
    predicted: np.ndarray,
    measured: np.ndarray,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Measured values where present; elsewhere the prediction, corrected through them.

    Per op, the log-ratio ``r = ln(measured / predicted)`` at its measured clocks is
    interpolated linearly in the clock between them and held constant beyond them; an
    unmeasured cell becomes ``predicted * exp(r)``. An op with no usable measurement keeps the
    prediction (a measured cell whose log-ratio is not finite is kept as measured but anchors
    nothing). Vectorised over ops and clocks: the rows that share their measured clocks
    (:func:`_groups`) are corrected together, on the unmeasured columns alone.

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    predicted
        The models' values, shape (n_ops, n_clocks).
    measured
        The measurements, NaN where not measured, same shape.
    out
        Where to write the result (``predicted`` itself corrects it in place); a new array
        by default.

    Returns
    -------
    ndarray, shape (n_ops, n_clocks)
    """
    f = np.asarray(freqs_mhz, dtype=float)
    out = np.empty(np.shape(predicted)) if out is None else out
    # rows are independent: in blocks, the temporaries are a block's, not the table's
    for start in range(0, len(out), _ROW_BLOCK):
        # each group reads its own rows of `predicted` before it writes them (`out` may be it)
        for group, ratio in _groups(predicted, measured, start):
            cells = _cells(group.rows, group.targets)
            filled = predicted[cells] * np.exp(_correction(f, group, ratio))
            if group.known is not None:  # measured, though anchoring nothing: as measured
                filled = np.where(group.known, measured[cells], filled)
            if group.targets is not _EVERY:  # the measured cells
                out[group.rows] = measured[group.rows]
            out[cells] = filled
    return out


@dataclass(frozen=True)
class _Group:
    """Rows that :func:`correct_to_measurements` and :func:`log_uncertainty` fill alike.

    A row's corrected values and uncertainties depend on its own cells and on which of its
    clocks anchor the interpolation (its pattern) alone: rows that share the pattern share
    its neighbours, spans and shares, computed once and broadcast over the rows.

    Attributes
    ----------
    rows
        The rows: a block's slice, or positions, ascending.
    anchors
        The clocks whose log-ratio ``ln(measured / predicted)`` is finite: shape (1, n_clocks)
        where every row has that pattern, (n_rows, n_clocks) where each row has its own.
    columns
        The columns of the group's tables of log-ratios and noise: the shared pattern's
        anchors, or :data:`_EVERY` column (each row its own pattern).
    targets
        The columns to fill: those not in the shared pattern, or :data:`_EVERY` column (each
        row its own pattern).
    known
        Whether each target cell was measured (its log-ratio not finite: kept as measured,
        anchoring nothing), shape (n_rows, len(targets)); None where none was.
    """

    rows: slice | np.ndarray
    anchors: np.ndarray
    columns: np.ndarray | slice
    targets: np.ndarray | slice
    known: np.ndarray | None


#: Every column of a table (a view, not a copy), for the rows that each have their own pattern.
_EVERY = slice(None)


#: Fewest rows sharing one pattern that :func:`_groups` fills as a group of their own; the rows
#: of rarer patterns are filled together, each by its own pattern. So a block is at most
#: ``_ROW_BLOCK / _GROUP_ROWS + 1`` groups, however many patterns its rows have.
_GROUP_ROWS = 1024


def _groups(
    predicted: np.ndarray, measured: np.ndarray, start: int
) -> list[tuple[_Group, np.ndarray]]:
    """Return the groups of the block of rows from ``start``, each with its log-ratios.

    The log-ratios ``ln(measured / predicted)`` of the group's rows at its columns, 0 where
    not an anchor, shape (n_rows, len(columns)). Every profile swept over one clock list
    measures each op at the same clocks: then the block is one group, its log-ratios taken on
    those columns alone (a third of a device's clocks at 1M ops x 9, 3 profiled). Otherwise
    each pattern that :data:`_GROUP_ROWS` rows or more share is a group (most rows, where a
    few ops missed a clock), and the rows of the rarer ones one more.
    """
    rows = slice(start, start + _ROW_BLOCK)
    m, p = measured[rows], predicted[rows]
    known = np.isfinite(m)
    if (known == known[:1]).all():
        cols = np.flatnonzero(known[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.log(m[:, cols] / p[:, cols])
        if np.isfinite(ratio).all():
            return [(_Group(rows, known[:1], cols, np.flatnonzero(~known[0]), None), ratio)]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log(m / p)
    anchors = known & np.isfinite(ratio)
    r = np.where(anchors, ratio, 0.0)
    pattern_of, counts = _patterns(anchors)
    groups = []
    for g in np.flatnonzero(counts >= _GROUP_ROWS):
        at = np.flatnonzero(pattern_of == g)
        pattern = anchors[at[0]][None, :]
        cols, targets = np.flatnonzero(pattern[0]), np.flatnonzero(~pattern[0])
        known_t = known[np.ix_(at, targets)]
        group = _Group(start + at, pattern, cols, targets, known_t if known_t.any() else None)
        groups.append((group, r[np.ix_(at, cols)]))
    rest = np.flatnonzero(counts[pattern_of] < _GROUP_ROWS)
    if len(rest) == len(m):  # no pattern common enough: the block's rows as they are
        return [(_Group(rows, anchors, _EVERY, _EVERY, known), r)]
    if len(rest):
        group = _Group(start + rest, anchors[rest], _EVERY, _EVERY, known[rest])
        groups.append((group, r[rest]))
    return groups


def _patterns(flags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each row's pattern of ``flags`` (bool) as a number, and each number's count of rows.

    Each row packed to bits: up to 16 clocks, the bits are the number (counted in one pass);
    more, the distinct rows numbered by :func:`numpy.unique` (a 64-bit key up to 64 clocks).
    """
    packed = np.packbits(flags, axis=1)
    width = 2 if packed.shape[1] <= 2 else -(-packed.shape[1] // 8) * 8
    padded = np.zeros((len(packed), width), dtype=np.uint8)
    padded[:, : packed.shape[1]] = packed
    if width == 2:
        bits = padded.view(np.uint16)[:, 0]
        return bits, np.bincount(bits, minlength=1 << 16)
    keys = padded.view(np.uint64)[:, 0] if width == 8 else padded.view(np.dtype((np.void, width)))
    _, number, counts = np.unique(keys.ravel(), return_inverse=True, return_counts=True)
    return number.ravel(), counts


def _cells(rows: slice | np.ndarray, cols: np.ndarray | slice) -> tuple[slice | np.ndarray, ...]:
    """Index of the cells of ``rows`` at ``cols`` (each a slice or positions)."""
    if isinstance(rows, np.ndarray) and isinstance(cols, np.ndarray):
        return np.ix_(rows, cols)
    return rows, cols


def _take(table: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Each row's values of ``table`` at ``cols``, shape (1, k) (every row's) or (n_rows, k)."""
    return table[:, cols[0]] if len(cols) == 1 else np.take_along_axis(table, cols, axis=1)


def _at(group: _Group, cols: np.ndarray) -> np.ndarray:
    """Positions of the columns ``cols`` (the group's columns) in its tables."""
    n_clocks = group.anchors.shape[1]
    if isinstance(group.columns, slice) or len(group.columns) == n_clocks:
        return cols
    at = np.zeros(n_clocks, dtype=int)
    at[group.columns] = np.arange(len(group.columns))
    return at[cols]


def _correction(f: np.ndarray, group: _Group, ratio: np.ndarray) -> np.ndarray:
    """Return the log-correction of each of ``group``'s target cells, shape (n_rows, n_targets).

    The anchors' log-ratios (``ratio``, :func:`_groups`) interpolated linearly in the clock
    between the nearest anchors on each side, held beyond them; 0 in a row without one.
    """
    n_clocks = len(f)
    if not isinstance(group.columns, slice) and len(group.columns) < n_clocks:
        # every column, 0 where not an anchor
        wide = np.zeros((len(ratio), n_clocks))
        wide[:, group.columns] = ratio
        ratio = wide
    left, right = _usable_neighbours(group.anchors)
    left, right = left[:, group.targets], right[:, group.targets]
    has_left, has_right = left >= 0, right < n_clocks
    left_c, right_c = np.clip(left, 0, n_clocks - 1), np.clip(right, 0, n_clocks - 1)
    f_left, f_right = f[left_c], f[right_c]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(f_right > f_left, (f[group.targets] - f_left) / (f_right - f_left), 0.0)
    share = np.where(has_left & has_right, share, np.where(has_left, 0.0, 1.0))
    line = (1.0 - share) * _take(ratio, left_c) + share * _take(ratio, right_c)
    return np.where(has_left | has_right, line, 0.0)


def at_die(
    power: PowerModel,
    freqs_mhz: np.ndarray,
    time_us: np.ndarray,
    energy_j: np.ndarray,
    temp_c: np.ndarray,
    die_temp_c: np.ndarray,
    *,
    rail: str,
) -> np.ndarray:
    """Return measured energies moved from the die they were measured at to ``die_temp_c``.

    ``energy + gamma (T_die - T_cell) V(f) time`` (:meth:`PowerModel.temperature_shift_w`,
    paper eqs. 10-11 and 16, the ``rail``'s ``gamma``), cell by cell; unchanged where the cell
    has no temperature or the model no temperature term. Vectorised over ops and clocks.

    Parameters
    ----------
    power
        The fitted power model whose temperature term moves the cells.
    freqs_mhz
        Clocks of the columns (MHz), shape (n_clocks,).
    time_us, energy_j, temp_c
        The measured time (us), energy (J, either rail) and die temperature (C) of every
        cell, NaN where not measured, shape (n_ops, n_clocks).
    die_temp_c
        The die temperature to move them to (C), broadcastable to (n_ops, n_clocks).
    rail
        ``chip`` or ``core``: the rail ``energy_j`` is on.

    Returns
    -------
    ndarray, shape (n_ops, n_clocks)
    """
    shift_w = power.temperature_shift_w(freqs_mhz, temp_c, die_temp_c)[f"{rail}_w"]
    return energy_j + shift_w * np.nan_to_num(time_us, nan=0.0) * 1e-6


def _usable_neighbours(usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest usable column at or left of each cell (-1: none), and at or right (n: none)."""
    n_clocks = usable.shape[1]
    cols = np.arange(n_clocks)
    left = np.maximum.accumulate(np.where(usable, cols, -1), axis=1)
    right = np.minimum.accumulate(np.where(usable, cols, n_clocks)[:, ::-1], axis=1)[:, ::-1]
    return left, right


def _interior_curvature(
    f: np.ndarray, group: _Group, ratio: np.ndarray, rel_noise: np.ndarray | None
) -> np.ndarray:
    """Each of ``group``'s ops' leave-one-clock-out curvature of ``ratio`` (per MHz^2); NaN if none.

    At every measured clock with a measured clock on both sides, the error of predicting its
    log-ratio from its two neighbours by the straight line (what :func:`correct_to_measurements`
    does where a clock was not measured) is ``e = r'' s / 2`` for a log-ratio of curvature
    ``r''``, with ``s = (f - f_L) (f_R - f)``. Per op, ``|r''| = 2 sum |e| / sum s`` over those
    clocks: each clock weighted by its span, so the noise of closely spaced clocks (whose
    span is small) is not blown up into a steep bend. The three cells' own noise
    (``rel_noise``, log units; None: unknown, 0) explains part of ``e``: only what exceeds two
    of its standard deviations counts. ``ratio`` and ``rel_noise``: the group's rows at its
    columns (:func:`_groups`).
    """
    n_clocks = len(f)
    anchors = group.anchors
    left, right = _usable_neighbours(anchors)
    # strictly left / right of each column
    left_s = np.concatenate([np.full((len(anchors), 1), -1), left[:, :-1]], axis=1)
    right_s = np.concatenate([right[:, 1:], np.full((len(anchors), 1), n_clocks)], axis=1)
    inner = anchors & (left_s >= 0) & (right_s < n_clocks)
    lc, rc = np.clip(left_s, 0, n_clocks - 1), np.clip(right_s, 0, n_clocks - 1)
    f_l, f_r = f[lc], f[rc]
    # the clocks whose error counts: the shared pattern's interior ones, or every column
    mid = np.flatnonzero(inner[0]) if len(anchors) == 1 else _EVERY
    # (a cell measured at 0 has an infinite relative noise: it anchors nothing)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        share = (f[None, :] - f_l) / (f_r - f_l)
        span = (f[None, :] - f_l) * (f_r - f[None, :])
        # each clock's and its neighbours' positions in the tables
        s, jl, jr = share[:, mid], _at(group, lc[:, mid]), _at(group, rc[:, mid])
        j = _at(group, mid) if isinstance(mid, np.ndarray) else mid
        line = (1 - s) * _take(ratio, jl) + s * _take(ratio, jr)
        excess = np.abs(ratio[:, j] - line)
        if rel_noise is not None:  # None: no noise known (0), nothing to take off
            n2 = rel_noise[:, j] ** 2, _take(rel_noise, jl) ** 2, _take(rel_noise, jr) ** 2
            noise_sd = np.sqrt(n2[0] + (1 - s) ** 2 * n2[1] + s**2 * n2[2])
            excess -= 2.0 * noise_sd
        kept = np.where(inner[:, mid], np.maximum(excess, 0.0), 0.0)
        if isinstance(mid, np.ndarray):  # summed over every column, 0 at the others, in order
            full = np.zeros((len(ratio), n_clocks))
            full[:, mid] = kept
            kept = full
        curv = 2.0 * kept.sum(axis=1) / np.where(inner, span, 0.0).sum(axis=1)
    return np.where(inner.any(axis=1), curv, np.nan)


def log_uncertainty(
    freqs_mhz: np.ndarray,
    predicted: np.ndarray,
    measured: np.ndarray,
    noise: np.ndarray | None = None,
) -> np.ndarray:
    """Return each cell's uncertainty as a standard deviation of its log (relative).

    For a time or an energy table: the estimate the data support for the tables
    :func:`correct_to_measurements` builds:

    - a **measured** cell: its own noise, the standard error of its median (``noise``, from
      its iterations; 0 for a cell measured once, or without ``noise``) over the median;
    - a **model-filled** cell between measured clocks ``f_L < f < f_R``: the fitted curve,
      corrected through the measurements, is off there by the curvature its log-ratio
      ``ln(measured / predicted)`` has that the straight-line correction misses,
      ``|r''| (f - f_L) (f_R - f) / 2``: zero at a measured clock, largest mid-gap, growing
      with the gap's width squared. ``|r''|`` is estimated leave-one-clock-out from the op's
      own measured clocks (each interior clock predicted from its two neighbours,
      :func:`_interior_curvature`; weighted by span), and never below the median over the ops that
      have an estimate (one op's two or three clocks may miss a bend its neighbours show; ops
      with fewer than three measured clocks take that median). Beyond the measured range
      (``--force``), the nearest measured clock at distance ``d`` and its gap ``h`` give
      ``|r''| d (d + h) / 2``.

    0 where nothing supports an estimate (no op measured at three clocks). Vectorised over ops
    and clocks.

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    predicted
        The models' values (time or energy, > 0), shape (n_ops, n_clocks).
    measured
        The measured medians, NaN where not measured, same shape.
    noise
        The standard error of each measured median (same unit), same shape; None: unknown (0).

    Returns
    -------
    ndarray, shape (n_ops, n_clocks)
    """
    f = np.asarray(freqs_mhz, dtype=float)
    shape = np.shape(measured)
    # rows are independent but for the pooled curvature: two passes over row blocks, so the
    # temporaries are a block's, not the table's. The first writes each measured cell's noise
    # and each op's curvature, the second each filled cell's sigma.
    out = np.empty(shape)
    curv = np.empty(shape[0])
    groups: list[_Group] = []
    for start in range(0, shape[0], _ROW_BLOCK):
        for group, ratio in _groups(predicted, measured, start):
            # the measured cells' noise: at the anchors, or at every cell where some target
            # was measured too (the second pass fills the others)
            every = group.known is not None
            cells = _cells(group.rows, _EVERY if every else group.columns)
            own = None
            if noise is None:
                out[cells] = 0.0
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    rel = np.nan_to_num(np.asarray(noise[cells], dtype=float) / measured[cells])
                out[cells] = rel
                own = rel[:, group.columns] if every else rel
            curv[group.rows] = _interior_curvature(f, group, ratio, own)
            groups.append(group)
    has = np.isfinite(curv)
    pooled = float(np.median(curv[has])) if has.any() else 0.0
    curv = np.maximum(np.where(has, curv, pooled), pooled)
    for group in groups:  # the filled cells
        cells = _cells(group.rows, group.targets)
        sigma = 0.5 * curv[group.rows, None] * gap_reach(f, group.anchors)[:, group.targets]
        out[cells] = sigma if group.known is None else np.where(group.known, out[cells], sigma)
    return out


def gap_reach(freqs_mhz: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Return each cell's reach from the measured clocks (MHz^2): its error's scale if filled.

    Between measured clocks ``f_L < f < f_R``: ``(f - f_L) (f_R - f)``; beyond the measured
    range, the nearest measured clock at distance ``d`` and its gap ``h``: ``d (d + h)``; 0 at
    a measured clock (and where a row measured nothing). A model-filled cell's
    :func:`log_uncertainty` is its op's curvature times half of it, so measuring one more
    clock scales the uncertainty of the cells around it by the ratio of their reaches after
    and before (:mod:`opdvfs.plan.active`). Vectorised over rows and clocks.

    Parameters
    ----------
    freqs_mhz
        Clocks of the columns, ascending (MHz), shape (n_clocks,).
    measured
        Whether each cell was measured, shape (n_rows, n_clocks) (one row: shared by every op).
    """
    f = np.asarray(freqs_mhz, dtype=float)
    n_clocks = len(f)
    left, right = _usable_neighbours(np.asarray(measured, dtype=bool))
    lc, rc = np.clip(left, 0, n_clocks - 1), np.clip(right, 0, n_clocks - 1)
    has_l, has_r = left >= 0, right < n_clocks
    # the gap beyond the last (first) measured clock: to its own neighbour inside the range
    span_l = np.where(has_l & ~has_r, f[lc] - f[np.clip(lc - 1, 0, None)], 0.0)
    span_r = np.where(has_r & ~has_l, f[np.clip(rc + 1, None, n_clocks - 1)] - f[rc], 0.0)
    d_l, d_r = f[None, :] - f[lc], f[rc] - f[None, :]
    return np.where(
        has_l & has_r,
        d_l * d_r,
        np.where(has_l, d_l * (d_l + span_l), np.where(has_r, d_r * (d_r + span_r), 0.0)),
    )
