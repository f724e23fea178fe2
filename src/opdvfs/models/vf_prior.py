"""A generic GPU V-f curve for a device with no preset and no characterisation (issue 16).

Board power is convex in the core clock on every GPU measured in ``../shared/data/real``: the
firmware holds the core voltage flat up to a knee and raises it linearly above (paper Fig. 9 for
Ascend; the same shape on NVIDIA and AMD boards). Interpolating power linearly in ``f`` between two
training clocks (a constant voltage) over-predicts every clock in between. Without a device
curve, the power model uses this prior instead: ``V`` flat (1, relative) up to
``knee_fraction * f_top`` and linear above, reaching ``1 + top_rise`` at the top clock ``f_top``.

Its two numbers come from real boards by one documented procedure, :func:`derive_prior`: each
GPU's own curve is the ``(knee_fraction, top_rise)`` on a grid with the least RMS relative error
when each kernel's power at every measured clock is fitted as ``u_i + a_i f V(f)^2`` (two
per-kernel terms: its clock-independent power and its switching activity, paper eq. 11 with
leakage folded in ``u_i``); the prior is the median of those knees and the median of those rises
(the typical GPU: each GPU counts once, however many kernels or clocks it has, and one odd GPU --
a power-capped top, three clocks only -- moves it by at most one rank).
``benchmarks/model_generalisation.py`` re-derives it without the GPU it scores
(leave-one-GPU-out) and prints the numbers; the defaults below are :func:`derive_prior` on every
GPU there.

No single curve suits every GPU from two clocks (the best rise runs from 0 on a power-capped A40
to ~0.5 on a Titan Xp). :func:`two_clock_curve` reads the rise off the profile itself where its
kernels pin it: :func:`envelope_rise` (the kernels with no clock-independent power of their own
lie on one line in the plane of their low-clock power and their power gain, whose slope is the
curve's shape), weighed against the prior's rise by their measured errors. It is an option
(``PowerModel(two_clocks="envelope")``), not the default: the envelope's kernels are the
compute-bound ones, whose power bends more with the clock than memory-bound kernels', and it is
closer than the prior on 4 of the 13 real sets, further on 6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from opdvfs.devices.spec import VoltageCurve

__all__ = [
    "ENVELOPE_RISE_SD",
    "KNEE_FRACTIONS",
    "PRIOR_KNEE_FRACTION",
    "PRIOR_RISE_SD",
    "PRIOR_TOP_RISE",
    "TOP_RISES",
    "curve_errors",
    "derive_envelope_error",
    "derive_prior",
    "derive_rise_spread",
    "envelope_rise",
    "fit_top_rise",
    "prior_curve",
    "shape_curve",
    "shape_voltages",
    "two_clock_curve",
]

#: Candidate knees, as a fraction of the top clock (the grid :func:`derive_prior` searches).
KNEE_FRACTIONS = np.round(np.arange(0.40, 1.0001, 0.025), 4)
#: Candidate voltage rises at the top clock, relative to the flat part.
TOP_RISES = np.round(np.arange(0.0, 1.0001, 0.025), 4)

#: Most ops :func:`fit_top_rise` reads (an even stride through larger profiles).
_RISE_OPS = 20_000

#: Knee of the generic prior, fraction of the top clock: :func:`derive_prior` on every real GPU
#: of ``benchmarks/model_generalisation.py`` (V100, A100, A40, Titan V, Titan Xp, GTX Titan X,
#: Tesla K40c, GTX 980, RX 580).
PRIOR_KNEE_FRACTION = 0.75
#: Voltage rise at the top clock of the generic prior (relative), derived the same way.
PRIOR_TOP_RISE = 0.175
#: How far real GPUs' rises spread about the prior's (the standard deviation over the same GPUs
#: of each one's best rise at the prior's knee, :func:`derive_rise_spread`): the weight the
#: prior gets against a profile's own estimate (:func:`two_clock_curve`).
PRIOR_RISE_SD = 0.25
#: How far the two-clock envelope's rise has been from each real GPU's own (RMS over the same
#: GPUs, :func:`derive_envelope_error`): the envelope's error beyond its sampling noise (its
#: kernels are the compute-bound ones; memory-bound kernels' power bends less with the clock).
ENVELOPE_RISE_SD = 0.23

#: Resamples of the ops :func:`envelope_rise` draws to measure its own uncertainty.
_BOOTSTRAP = 64
#: Most ops the two-clock envelope reads (an even stride through larger profiles).
_ENVELOPE_OPS = 5_000


def shape_curve(top_mhz: float, knee_fraction: float, top_rise: float) -> VoltageCurve:
    """Return the V-f curve flat (1 V, relative) to ``knee_fraction * top_mhz``, then linear.

    ``V(top_mhz) = 1 + top_rise``; ``knee_fraction >= 1`` or ``top_rise = 0`` is flat.
    """
    knee = knee_fraction * top_mhz
    span = top_mhz - knee
    slope = top_rise / span if span > 0 else 0.0
    return VoltageCurve(knee_mhz=float(min(knee, top_mhz)), flat_v=1.0, slope_v_per_mhz=slope)


def shape_voltages(
    freqs_mhz: np.ndarray,
    top_mhz: float,
    knee_fractions: np.ndarray = KNEE_FRACTIONS,
    top_rises: np.ndarray = TOP_RISES,
) -> np.ndarray:
    """Return ``V`` at ``freqs_mhz`` of every shape :func:`shape_curve` makes from the grid.

    Shape (len(knee_fractions) * len(top_rises), len(freqs_mhz)), knee-major: row
    ``i * len(top_rises) + j`` is ``shape_curve(top_mhz, knee_fractions[i], top_rises[j])``.
    """
    f = np.asarray(freqs_mhz, dtype=float)
    kk, rr = np.meshgrid(knee_fractions, top_rises, indexing="ij")
    knee = kk.ravel()[:, None] * top_mhz
    span = np.maximum(top_mhz - knee, 1e-9)
    return 1.0 + rr.ravel()[:, None] * np.maximum(0.0, f[None, :] - knee) / span


def prior_curve(top_mhz: float) -> VoltageCurve:
    """Return the generic GPU V-f prior for a device whose top clock is ``top_mhz``."""
    return shape_curve(top_mhz, PRIOR_KNEE_FRACTION, PRIOR_TOP_RISE)


def _fit_errors(power: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Weighted relative SSE, summed over ops, of ``power ~ u_i + a_i x`` for each candidate.

    ``power`` is (n, k); ``x`` is (candidates, k): ``f V^2`` of each candidate curve at the k
    clocks. Each op's two terms are its closed-form weighted least squares (weights
    ``1 / power^2``: relative errors). Returns an array (candidates,).
    """
    ok = np.isfinite(power) & (power > 0)
    w = np.where(ok, 1.0 / np.where(ok, power, 1.0) ** 2, 0.0)
    y = np.where(ok, power, 0.0)
    sw = w.sum(1)[None, :]  # (1, n)
    swx, swxx = x @ w.T, (x * x) @ w.T  # (c, n)
    swy, swxy = (w * y).sum(1)[None, :], x @ (w * y).T
    swyy = (w * y * y).sum(1)[None, :]
    det = sw * swxx - swx**2
    good = det > 1e-12 * np.maximum(sw * swxx, 1e-300)
    a = np.where(good, (sw * swxy - swx * swy) / np.where(good, det, 1.0), 0.0)
    u = np.where(sw > 0, (swy - a * swx) / np.where(sw > 0, sw, 1.0), 0.0)
    # sum w (u + a x - y)^2 expanded, per candidate and op
    sse = swyy + u * u * sw + a * a * swxx + 2 * u * a * swx - 2 * u * swy - 2 * a * swxy
    return np.maximum(sse, 0.0).sum(1)


def curve_errors(
    freqs_mhz: np.ndarray,
    power: np.ndarray,
    top_mhz: float | None = None,
    knee_fractions: np.ndarray = KNEE_FRACTIONS,
    top_rises: np.ndarray = TOP_RISES,
) -> np.ndarray:
    """RMS relative error of the per-kernel fit ``u_i + a_i f V(f)^2`` for every candidate shape.

    Parameters
    ----------
    freqs_mhz
        The clocks, shape (k,).
    power
        Each kernel's power at each clock, shape (n, k); NaN where not measured.
    top_mhz
        The top clock the shapes are relative to (default: the highest of ``freqs_mhz``).

    Returns
    -------
    ndarray, shape (len(knee_fractions), len(top_rises))
    """
    f = np.asarray(freqs_mhz, dtype=float)
    top = float(f.max()) if top_mhz is None else float(top_mhz)
    x = f[None, :] / 1e3 * shape_voltages(f, top, knee_fractions, top_rises) ** 2
    n_points = max(int((np.isfinite(power) & (power > 0)).sum()), 1)
    return np.sqrt(_fit_errors(power, x) / n_points).reshape(len(knee_fractions), len(top_rises))


def fit_top_rise(
    freqs_mhz: np.ndarray,
    power: np.ndarray,
    top_mhz: float,
    knee_fraction: float = PRIOR_KNEE_FRACTION,
    top_rises: np.ndarray = TOP_RISES,
) -> VoltageCurve:
    """Return the prior's knee with the voltage rise fitted jointly over all ops (3 clocks).

    Three clocks identify one shape number of ``V(f)`` across many ops, not two (a knee and a
    slope fitted from three points land almost anywhere): the knee stays the prior's and the
    rise at the top clock is the one, on the ``top_rises`` grid, with the least relative squared
    error of the per-op fit ``u_i + a_i f V^2`` at the training clocks (one shared parameter).
    """
    # one shared number: 20k ops pin it as well as 100k do (its error falls as 1 / sqrt(ops)),
    # so larger profiles are read at an even stride, keeping the fit under a second at 100k
    stride = -(-len(power) // _RISE_OPS)
    errors = curve_errors(
        freqs_mhz, power[::stride], top_mhz, np.array([knee_fraction]), top_rises
    )[0]
    return shape_curve(top_mhz, knee_fraction, float(top_rises[int(np.argmin(errors))]))


def derive_prior(
    gpus: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]],
    knee_fractions: np.ndarray = KNEE_FRACTIONS,
    top_rises: np.ndarray = TOP_RISES,
) -> tuple[float, float]:
    """Derive the prior's ``(knee_fraction, top_rise)`` from the power of real GPUs.

    Parameters
    ----------
    gpus
        For each GPU, its sets as ``(freqs_mhz (k,), power (n, k))`` (kernels at every clock
        measured); each set's shapes are relative to its own top clock.

    Returns
    -------
    knee_fraction, top_rise
        The medians over GPUs of each GPU's own curve: the grid point with the least RMS
        relative error over its sets (each set weighing the same).
    """
    knees, rises = [], []
    for sets in gpus.values():
        errs = [curve_errors(f, p, None, knee_fractions, top_rises) ** 2 for f, p in sets]
        i, j = np.unravel_index(int(np.argmin(np.mean(errs, axis=0))), errs[0].shape)
        knees.append(knee_fractions[i])
        rises.append(top_rises[j])
    return float(np.median(knees)), float(np.median(rises))


def derive_rise_spread(
    gpus: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]],
    knee_fraction: float = PRIOR_KNEE_FRACTION,
    top_rises: np.ndarray = TOP_RISES,
) -> float:
    """Return how far real GPUs' voltage rises spread at the prior's knee (the prior's weight).

    Each GPU's rise is the one on ``top_rises`` with the least RMS relative error over its sets
    (as in :func:`derive_prior`, the knee held at ``knee_fraction``); the result is their
    standard deviation over GPUs (``ddof=1``): how wrong the prior's rise typically is on a GPU
    it has not seen.
    """
    rises = []
    for sets in gpus.values():
        errs = [
            curve_errors(f, p, None, np.array([knee_fraction]), top_rises)[0] ** 2 for f, p in sets
        ]
        rises.append(top_rises[int(np.argmin(np.mean(errs, axis=0)))])
    return float(np.std(rises, ddof=1)) if len(rises) > 1 else float("inf")


def envelope_rise(
    freqs_mhz: np.ndarray,
    power: np.ndarray,
    top_mhz: float,
    knee_fraction: float = PRIOR_KNEE_FRACTION,
    top_rises: np.ndarray = TOP_RISES,
) -> tuple[float | None, float]:
    """Estimate the voltage rise from many kernels at two clocks: the lower envelope.

    Each kernel's board power is ``p_i(f) = S(f) + M_i + a_i g(f)`` with ``g = f V(f)^2``: a
    floor ``S`` every kernel shares (idle power), its own clock-independent power ``M_i >= 0``
    (memory, uncore: paper §7) and its switching term (eq. 11). With ``dp_i = p_i(f2) -
    p_i(f1)`` that is ``p_i(f1) = S1' + M_i + dp_i g(f1) / (g(f2) - g(f1))``: in the plane
    ``(dp_i, p_i(f1))`` every kernel lies on or above one line, the one the kernels with no
    clock-independent power of their own sit on, whose slope ``g1 / (g2 - g1)`` is the shape of
    ``V`` between the two clocks. (A regression through all kernels is biased: busier kernels
    also move more memory, ``M_i`` grows with ``a_i``.) The line is the lower envelope at the
    kernels' mean ``dp`` (the largest ``min_i(p_i(f1) - m dp_i) + m mean(dp)``), searched over the
    slopes of the candidate rises at ``knee_fraction`` from constant ``V`` to ``V`` rising as fast
    as ``f`` between the two clocks (dynamic power no steeper than ``f^3``).

    Parameters
    ----------
    freqs_mhz
        The two training clocks, shape (2,).
    power
        Each kernel's power at them, shape (n, 2); kernels with a missing or non-positive value
        are skipped (larger profiles are read at an even stride of at most 5,000 kernels).
    top_mhz
        The top clock the knee and the rise are relative to.

    Returns
    -------
    rise, sd
        The rise (on the grid, clipped to the family's ends: constant ``V``, or the largest
        rise) and its spread over bootstrap resamples of the kernels; ``(None, 0)`` when the
        envelope lies beyond the physical range on the convex side (steeper than ``f^3``: e.g.
        the kernels' low-clock power falls as their switching power grows, which no V-f curve
        explains) or with fewer than 3 kernels.
    """
    order = np.argsort(np.asarray(freqs_mhz, dtype=float))
    f1, f2 = np.asarray(freqs_mhz, dtype=float)[order]
    p = np.asarray(power, dtype=float)[:, order]
    p = p[np.isfinite(p).all(1) & (p > 0).all(1)]
    p = p[:: -(-len(p) // _ENVELOPE_OPS)] if len(p) else p
    if len(p) < 3 or not f1 < f2:
        return None, 0.0
    v1, v2 = shape_voltages(np.array([f1, f2]), top_mhz, np.array([knee_fraction]), top_rises).T
    keep = v2 / v1 <= f2 / f1 * (1 + 1e-12)  # V no steeper than f between the clocks
    rises, v1, v2 = top_rises[keep], v1[keep], v2[keep]
    g1, g2 = f1 * v1**2, f2 * v2**2
    slope = g1 / np.maximum(g2 - g1, 1e-300)  # (c,): decreasing as the rise grows
    p1, dp = p[:, 0], p[:, 1] - p[:, 0]
    above = p1[:, None] - dp[:, None] * slope[None, :]  # (n, c)

    def best(rows: np.ndarray) -> int:
        return int(np.argmax(above[rows].min(0) + slope * dp[rows].mean()))

    # beyond the physical range: the envelope still climbs at V rising as fast as f (power
    # steeper than f^3 between the clocks), i.e. the kernels on it lie below even that line
    bound = 1.0 / ((f2 / f1) ** 3 - 1.0)
    at_bound = p1 - bound * dp
    lowest = at_bound <= at_bound.min() + 1e-9 * np.abs(at_bound).max()
    if dp[lowest].min() > dp.mean():
        return None, 0.0
    i = best(np.arange(len(p)))
    rng = np.random.default_rng(0)
    boot = [rises[best(rng.integers(0, len(p), len(p)))] for _ in range(_BOOTSTRAP)]
    return float(rises[i]), float(np.std(boot))


def two_clock_curve(
    freqs_mhz: np.ndarray,
    power: np.ndarray,
    top_mhz: float,
    knee_fraction: float = PRIOR_KNEE_FRACTION,
    prior_rise: float = PRIOR_TOP_RISE,
    prior_sd: float = PRIOR_RISE_SD,
    envelope_sd: float = ENVELOPE_RISE_SD,
) -> VoltageCurve:
    """Return the V-f curve for two training clocks and no device: the profile's own, shrunk.

    The prior's knee; the rise is :func:`envelope_rise`'s from the kernels themselves and the
    prior's, each weighted by its precision (``1 / sd^2``): the envelope's variance is its
    bootstrap spread squared plus ``envelope_sd^2`` (how far it has been from real GPUs' own
    rises, :data:`ENVELOPE_RISE_SD`), the prior's ``prior_sd^2`` (the spread of real GPUs
    about it, :data:`PRIOR_RISE_SD`). A profile whose kernels hardly differ in switching power
    (a pipeline's stages) pins nothing and keeps the prior; one whose envelope leaves the
    physical range keeps the prior outright.
    """
    rise, sd = envelope_rise(freqs_mhz, power, top_mhz, knee_fraction)
    if rise is None:
        return shape_curve(top_mhz, knee_fraction, prior_rise)
    own = sd**2 + envelope_sd**2
    weight = prior_sd**2 / (prior_sd**2 + own) if np.isfinite(prior_sd) and own > 0 else 1.0
    return shape_curve(top_mhz, knee_fraction, weight * rise + (1 - weight) * prior_rise)


def derive_envelope_error(
    gpus: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]],
    knee_fraction: float = PRIOR_KNEE_FRACTION,
    top_rises: np.ndarray = TOP_RISES,
) -> float:
    """Return the RMS, over GPUs, of the two-clock envelope's rise minus the GPU's own.

    The GPU's own rise is the one at ``knee_fraction`` that fits all its clocks best (as in
    :func:`derive_rise_spread`); the envelope's is :func:`envelope_rise` at each set's lowest and
    highest clock, averaged over the GPU's sets where it is not rejected. GPUs where it is
    rejected on every set do not count (they keep the prior); ``inf`` when none count.
    """
    misses = []
    for sets in gpus.values():
        errs = [
            curve_errors(f, p, None, np.array([knee_fraction]), top_rises)[0] ** 2 for f, p in sets
        ]
        own = top_rises[int(np.argmin(np.mean(errs, axis=0)))]
        found = [
            envelope_rise(f[[0, -1]], p[:, [0, -1]], f.max(), knee_fraction)[0] for f, p in sets
        ]
        rises = [r for r in found if r is not None]
        if rises:
            misses.append(float(np.mean(rises)) - own)
    return float(np.sqrt(np.mean(np.square(misses)))) if misses else float("inf")
