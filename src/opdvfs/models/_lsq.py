"""Batched least squares for fitting every operator at once.

Per-clock forms (:mod:`opdvfs.models.perf`): all operators share the design (the training clocks)
but each has its own weights (a missing measurement has weight 0), so one ``einsum`` builds every
normal-equation system and one batched ``solve`` answers them. Sign constraints are handled by
enumerating active sets (few parameters), solving each candidate for all ops, and keeping per op
the feasible candidate with the least squared error: exact for these small problems, and still a
handful of vectorised calls.

Fixed effects (:mod:`opdvfs.models.power`, :mod:`opdvfs.models.characterise`): rows from every
operator and clock, each operator with its own coefficients and all sharing a few. The per-op
coefficients are eliminated with ``bincount``-built normal equations, one batch for all ops.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

__all__ = [
    "constrained_wls",
    "fit_fixed_effects",
    "mean_by",
    "nnls",
    "nonneg_wls2",
    "per_op_static",
    "stack_columns",
    "wls",
]

_RIDGE = 1e-12
# rows (operators) per block of the per-row solves: bounds their temporaries at any size
_CHUNK_ROWS = 1 << 17


def wls(design: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Solve ``min sum_k w_ik (X_k . b_i - y_ik)^2`` for every row ``i``.

    Parameters
    ----------
    design
        Shared design matrix, shape (k, p).
    y, w
        Targets and weights, shape (n, k).

    Returns
    -------
    ndarray, shape (n, p)
        Coefficients; NaN for rows with fewer weighted points than parameters.
    """
    return _wls(design, w * np.nan_to_num(y), w, (w > 0).sum(axis=1))


def _wls(design: np.ndarray, wy: np.ndarray, w: np.ndarray, points: np.ndarray) -> np.ndarray:
    """:func:`wls` from ``w * nan_to_num(y)`` and each row's count of weighted points.

    What every candidate of :func:`constrained_wls` shares, computed once for all of them.
    """
    a = np.einsum("kp,nk,kq->npq", design, w, design)
    b = np.einsum("kp,nk->np", design, wy)
    scale = np.trace(a, axis1=1, axis2=2)[:, None, None] / max(design.shape[1], 1)
    a = a + _RIDGE * np.maximum(scale, 1e-300) * np.eye(design.shape[1])
    enough = points >= design.shape[1]
    if len(wy) and enough.all():  # every row solved: no copy of the systems picked out
        return np.linalg.solve(a, b[..., None])[..., 0]
    coef = np.full((len(wy), design.shape[1]), np.nan)
    if enough.any():
        coef[enough] = np.linalg.solve(a[enough], b[enough][..., None])[..., 0]
    return coef


def constrained_wls(
    design: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    nonneg: Sequence[int],
    extra: Sequence[tuple[np.ndarray, str]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares with ``coef[j] >= 0`` for ``j in nonneg``, for every row.

    Candidates are every subset of ``nonneg`` pinned at zero (the rest free). ``extra`` adds
    linear inequality constraints ``g . coef >= 0`` (``(g, name)``), checked for feasibility
    and, as an extra candidate each, enforced as an equality by eliminating one parameter.

    Returns
    -------
    coef : ndarray, shape (n, p)
    sse : ndarray, shape (n,)
        Weighted squared error of the chosen candidate (inf where nothing was feasible).
    """
    n, p = len(y), design.shape[1]
    if n > _CHUNK_ROWS:  # rows are independent: in blocks, the temporaries stay small
        parts = [
            constrained_wls(
                design, y[i : i + _CHUNK_ROWS], w[i : i + _CHUNK_ROWS], nonneg=nonneg, extra=extra
            )
            for i in range(0, n, _CHUNK_ROWS)
        ]
        return np.concatenate([c for c, _ in parts]), np.concatenate([e for _, e in parts])
    best = np.full((n, p), np.nan)
    best_sse = np.full(n, np.inf)
    candidates: list[np.ndarray] = []  # each: (p, q) map from reduced to full coefficients
    for mask in range(1 << len(nonneg)):
        pinned = {nonneg[j] for j in range(len(nonneg)) if mask >> j & 1}
        free = [j for j in range(p) if j not in pinned]
        if not free:
            continue
        candidates.append(np.eye(p)[:, free])
    for g, _ in extra:
        # g . coef = 0: express the last parameter with a nonzero g through the others
        j = int(np.flatnonzero(g)[-1])
        others = [i for i in range(p) if i != j]
        m = np.zeros((p, p - 1))
        for col, i in enumerate(others):
            m[i, col] = 1.0
            m[j, col] = -g[i] / g[j]
        candidates.append(m)
    wy, points = w * np.nan_to_num(y), (w > 0).sum(axis=1)
    for m in candidates:
        reduced = _wls(design @ m, wy, w, points)
        coef = reduced @ m.T
        feasible = np.isfinite(coef).all(axis=1)
        # each row's largest |coefficient|, column by column (a reduction along rows of 2-3
        # values costs a call per row); the same values, NaN where the row has one
        largest = functools.reduce(np.maximum, np.abs(coef).T)
        floor = -1e-12 * largest
        for j in nonneg:
            feasible &= coef[:, j] >= floor
        for g, _ in extra:
            value = coef @ g
            feasible &= value >= -1e-9 * largest * np.abs(g).max()
        resid = np.nan_to_num(coef @ design.T - y)
        sse = np.where(feasible, (w * resid**2).sum(axis=1), np.inf)
        better = sse < best_sse
        best[better], best_sse[better] = coef[better], sse[better]
    return best, best_sse


def nonneg_wls2(
    x1: np.ndarray, x2: np.ndarray, y: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form ``min sum w (c1 x1 + c2 x2 - y)^2`` with ``c1, c2 >= 0``, every row at once.

    A two-parameter convex quadratic has its constrained optimum either inside (the free
    solution, when both are >= 0) or on an axis, so three closed forms cover every case; this
    is the fast path of the two-parameter forms (func2, func3 per b, roofline per p).

    Parameters
    ----------
    x1, x2
        Basis values at the k training points, shape (k,).
    y, w
        Targets and weights, shape (n, k); weight 0 marks a missing point.

    Returns
    -------
    coef : ndarray, shape (n, 2)
    sse : ndarray, shape (n,)
    """
    y = np.where(w > 0, y, 0.0)
    s11, s12, s22 = w @ (x1 * x1), w @ (x1 * x2), w @ (x2 * x2)
    b1, b2, syy = (w * y) @ x1, (w * y) @ x2, (w * y * y).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = s11 * s22 - s12 * s12
        free1, free2 = (s22 * b1 - s12 * b2) / det, (s11 * b2 - s12 * b1) / det
        only1, only2 = np.maximum(b1 / s11, 0.0), np.maximum(b2 / s22, 0.0)

    def sse(c1: np.ndarray, c2: np.ndarray) -> np.ndarray:
        return syy - 2 * (c1 * b1 + c2 * b2) + c1 * c1 * s11 + 2 * c1 * c2 * s12 + c2 * c2 * s22

    zero = np.zeros_like(b1)
    sse1, sse2 = sse(only1, zero), sse(zero, only2)
    use1 = sse1 <= sse2
    c1, c2 = np.where(use1, only1, 0.0), np.where(use1, 0.0, only2)
    err = np.where(use1, sse1, sse2)
    free = (free1 >= 0) & (free2 >= 0) & np.isfinite(free1) & np.isfinite(free2)
    c1, c2 = np.where(free, free1, c1), np.where(free, free2, c2)
    err = np.where(free, sse(free1, free2), err)
    enough = (w > 0).sum(axis=1) >= 2
    coef = np.where(enough[:, None], np.stack([c1, c2], axis=1), np.nan)
    return coef, np.where(enough, np.maximum(err, 0.0), np.inf)


# --------------------------------------------------------------------------------- fixed effects
def fit_fixed_effects(
    per_op: np.ndarray,
    shared: np.ndarray,
    target: np.ndarray,
    op: np.ndarray,
    n_ops: int,
    *,
    weight: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Least squares ``target = per_op . c_op + shared . s`` with ``s >= 0``, all ops at once.

    The per-op coefficients are eliminated exactly (each op's rows are projected off the span
    of its own columns: batched ``k x k`` normal equations built with ``bincount``), the shared
    ones solved by NNLS on what is left, then the per-op ones recovered. A shared column that
    the per-op columns already span (e.g. two clocks per op and two per-op columns) is not
    identified by the data: it is left out (coefficient 0) instead of fitting noise.

    Parameters
    ----------
    per_op
        Columns with a coefficient per operator, shape (rows, k).
    shared
        Columns with one coefficient for every operator, shape (rows, s); s may be 0.
    target
        Measured values, shape (rows,).
    op
        Operator index of each row, in ``[0, n_ops)``.
    weight
        Row weights (e.g. ``1 / target**2`` for relative errors); default 1.

    Returns
    -------
    per_op_coef : ndarray, shape (n_ops, k)
        Min-norm where an op's rows do not pin all k (fewer distinct points than columns).
    shared_coef : ndarray, shape (s,)
    """
    # Unweighted, the columns are used as given (x * 1 is x: the same numbers without a copy of
    # each); at 3M rows every full-length temporary is 24 MB a column, so none is kept longer
    # than it is needed and the per-row products run in blocks of rows.
    root = np.sqrt(weight) if weight is not None else None
    b = per_op if root is None else per_op * root[:, None]
    k = b.shape[1]
    gram = np.empty((n_ops, k, k))
    for i in range(k):
        for j in range(i, k):
            gram[:, i, j] = gram[:, j, i] = np.bincount(op, b[:, i] * b[:, j], minlength=n_ops)
    # relative cutoff: the columns' scales differ by orders of magnitude (W vs W us)
    scale = np.sqrt(np.einsum("nii->ni", gram)) + 1e-300
    inv = _pinv(gram / scale[:, :, None] / scale[:, None, :], rcond=1e-10)
    inv = inv / scale[:, :, None] / scale[:, None, :]

    def per_op_fit(col: np.ndarray) -> np.ndarray:
        rhs = np.stack([np.bincount(op, b[:, i] * col, minlength=n_ops) for i in range(k)], 1)
        return np.einsum("nij,nj->ni", inv, rhs)

    def within(col: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``col`` less each row's op fit of it, into ``out`` (rows are independent)."""
        fit = per_op_fit(col)
        for start in range(0, len(col), _CHUNK_ROWS):
            rows = slice(start, start + _CHUNK_ROWS)
            np.subtract(col[rows], np.einsum("rk,rk->r", b[rows], fit[op[rows]]), out=out[rows])
        return out

    y = target if root is None else target * root
    cols = shared if root is None else shared * root[:, None]
    del root
    if not cols.shape[1]:
        return per_op_fit(y), np.zeros(0)
    design = np.empty(cols.shape)
    for c in range(cols.shape[1]):
        within(cols[:, c], design[:, c])
    norm = np.linalg.norm(cols, axis=0)
    design[:, np.linalg.norm(design, axis=0) <= 1e-9 * np.maximum(norm, 1e-300)] = 0.0
    shared_coef = nnls(design, within(y, np.empty(len(y))))
    del design
    return per_op_fit(y - cols @ shared_coef), shared_coef


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ``scipy.optimize.nnls(a, b)[0]``: ``argmin |a x - b|`` with ``x >= 0``.

    scipy.optimize is imported here, where nnls runs, not with every command (~0.3-0.5 s).
    """
    import scipy.optimize

    return np.asarray(scipy.optimize.nnls(a, b)[0])


def _pinv(a: np.ndarray, *, rcond: float) -> np.ndarray:
    """``np.linalg.pinv(a, rcond=rcond)`` of a stack of matrices, the same numbers, faster at 1x1.

    A 1x1 matrix's SVD is ``|a|`` with signs for ``u`` and ``v`` (LAPACK's ``dbdsdc``), so its
    pseudo-inverse is ``1 / a`` (0 for 0); the batched SVD took ~0.7 s at a million ops. Values
    outside [1e-100, 1e100] (where LAPACK would rescale first) or not finite take ``pinv``.
    """
    if a.shape[1:] != (1, 1):
        return np.linalg.pinv(a, rcond=rcond)
    value = a[:, 0, 0]
    magnitude = np.abs(value)
    plain = (magnitude > 1e-100) & (magnitude < 1e100)
    out = np.zeros_like(a)
    out[plain, 0, 0] = 1.0 / value[plain]
    rest = ~plain & (value != 0)  # zero: pinv gives 0, as out holds
    if rest.any():
        out[rest] = np.linalg.pinv(a[rest], rcond=rcond)
    return out


def per_op_static(
    x: np.ndarray, volt: np.ndarray, power: np.ndarray, op: np.ndarray, n_ops: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-op least squares ``P = u + theta V + alpha x``: (alpha, theta) per op, all at once.

    The 3x3 normal equations of every op are built with ``bincount`` and solved as one batch;
    an op whose points do not pin three parameters keeps theta = 0 and the two-parameter line.
    """
    basis = (np.ones_like(x), volt, x)  # the columns as they are, not stacked into a copy
    gram = np.zeros((n_ops, 3, 3))
    rhs = np.zeros((n_ops, 3))
    for a in range(3):
        rhs[:, a] = np.bincount(op, basis[a] * power, minlength=n_ops)
        for b in range(3):
            gram[:, a, b] = np.bincount(op, basis[a] * basis[b], minlength=n_ops)
    ok = np.linalg.cond(gram) < 1e12
    coef = np.zeros((n_ops, 3))
    coef[ok] = np.linalg.solve(gram[ok], rhs[ok][..., None])[..., 0]
    # the two-parameter line (u + alpha x) where three are not identified
    two = gram[:, [0, 2]][:, :, [0, 2]]
    fallback = np.linalg.solve(two[~ok] + 1e-300 * np.eye(2), rhs[~ok][:, [0, 2], None])[..., 0]
    coef[~ok, 2] = fallback[:, 1]
    return coef[:, 2], coef[:, 1]


def stack_columns(cols: list[np.ndarray], rows: int) -> np.ndarray:
    """Stack columns into a (rows, len(cols)) design; (rows, 0) when there are none."""
    return np.stack(cols, axis=1) if cols else np.zeros((rows, 0))


def mean_by(op: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Mean of ``values`` per operator index ``op`` in ``[0, n)``; 0 for an op with no row."""
    count = np.bincount(op, minlength=n)
    return np.bincount(op, values, minlength=n) / np.maximum(count, 1)
