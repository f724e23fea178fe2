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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from opdvfs.devices.spec import VoltageCurve

__all__ = [
    "KNEE_FRACTIONS",
    "PRIOR_KNEE_FRACTION",
    "PRIOR_TOP_RISE",
    "TOP_RISES",
    "curve_errors",
    "derive_prior",
    "fit_top_rise",
    "prior_curve",
    "shape_curve",
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


def shape_curve(top_mhz: float, knee_fraction: float, top_rise: float) -> VoltageCurve:
    """Return the V-f curve flat (1 V, relative) to ``knee_fraction * top_mhz``, then linear.

    ``V(top_mhz) = 1 + top_rise``; ``knee_fraction >= 1`` or ``top_rise = 0`` is flat.
    """
    knee = knee_fraction * top_mhz
    span = top_mhz - knee
    slope = top_rise / span if span > 0 else 0.0
    return VoltageCurve(knee_mhz=float(min(knee, top_mhz)), flat_v=1.0, slope_v_per_mhz=slope)


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
    kk, rr = np.meshgrid(knee_fractions, top_rises, indexing="ij")
    knee = kk.ravel()[:, None] * top
    span = np.maximum(top - knee, 1e-9)
    volt = 1.0 + rr.ravel()[:, None] * np.maximum(0.0, f[None, :] - knee) / span
    x = f[None, :] / 1e3 * volt**2
    n_points = max(int((np.isfinite(power) & (power > 0)).sum()), 1)
    return np.sqrt(_fit_errors(power, x) / n_points).reshape(kk.shape)


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
