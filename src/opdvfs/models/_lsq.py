"""Batched weighted least squares with sign constraints, for fitting every operator at once.

All operators share the design (the training clocks) but each has its own weights (a missing
measurement has weight 0), so one ``einsum`` builds every normal-equation system and one batched
``solve`` answers them. Sign constraints are handled by enumerating active sets (few parameters),
solving each candidate for all ops, and keeping per op the feasible candidate with the least
squared error: exact for these small problems, and still a handful of vectorised calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["constrained_wls", "nonneg_wls2", "wls"]

_RIDGE = 1e-12


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
    a = np.einsum("kp,nk,kq->npq", design, w, design)
    b = np.einsum("kp,nk->np", design, w * np.nan_to_num(y))
    scale = np.trace(a, axis1=1, axis2=2)[:, None, None] / max(design.shape[1], 1)
    a = a + _RIDGE * np.maximum(scale, 1e-300) * np.eye(design.shape[1])
    enough = (w > 0).sum(axis=1) >= design.shape[1]
    coef = np.full((len(y), design.shape[1]), np.nan)
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
    for m in candidates:
        reduced = wls(design @ m, y, w)
        coef = reduced @ m.T
        feasible = np.isfinite(coef).all(axis=1)
        feasible &= (coef[:, list(nonneg)] >= -1e-12 * np.abs(coef).max(axis=1, keepdims=True)).all(
            axis=1
        )
        for g, _ in extra:
            value = coef @ g
            feasible &= value >= -1e-9 * np.abs(coef).max(axis=1) * np.abs(g).max()
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
