"""First-order RC thermal model, solved in closed form over piecewise-constant power."""

from __future__ import annotations

import numpy as np

__all__ = ["rc_temperature"]

# exp() of cumulative time / tau must stay finite: restart the closed form every so often.
_MAX_EXPONENT = 500.0
#: Intervals per vectorised step: bounds the temporaries (a few MB) whatever the run's length.
_CHUNK = 1 << 16


def rc_temperature(
    dt_s: np.ndarray,
    power_w: np.ndarray,
    *,
    start_c: float,
    ambient_c: float,
    k_c_per_w: float,
    tau_s: float,
) -> np.ndarray:
    """Temperature at the end of each interval of constant power.

    ``dT/dt = (ambient + k P - T) / tau``; over an interval of length ``dt`` at power ``P`` the
    exact step is ``T' = T_ss + (T - T_ss) exp(-dt / tau)`` with ``T_ss = ambient + k P``. The
    linear recurrence ``x_i = d_i x_{i-1} + (1 - d_i) u_i`` is summed with cumulative products
    (in log space), not a Python loop.

    Parameters
    ----------
    dt_s, power_w
        Interval lengths (s) and their constant power (W), shape (n,).
    start_c
        Temperature at the start of the first interval.

    Returns
    -------
    ndarray, shape (n,)
        Temperature (deg C) at the end of each interval.
    """
    dt = np.asarray(dt_s, dtype=float)
    power = np.asarray(power_w, dtype=float)
    out = np.empty_like(dt)
    x0, lo = float(start_c), 0
    cum = np.cumsum(dt) / tau_s
    while lo < len(dt):
        base = cum[lo - 1] if lo else 0.0
        hi = int(np.searchsorted(cum, base + _MAX_EXPONENT, side="right"))
        hi = max(hi, lo + 1)
        # in chunks, so the temporaries stay small; the running sum carries into each chunk's
        # first weight, which keeps the additions in the order one cumsum over [lo, hi) makes
        total = 0.0
        for a in range(lo, hi, _CHUNK):
            b = min(a + _CHUNK, hi)
            log_d = cum[a:b] - base  # -log of the cumulative decay up to each interval end
            decay = np.exp(-dt[a:b] / tau_s)
            steady = ambient_c + k_c_per_w * power[a:b]
            weight = (1.0 - decay) * steady * np.exp(log_d)
            if a > lo:
                weight[0] += total
            sums = np.cumsum(weight)
            total = sums[-1]
            out[a:b] = np.exp(-log_d) * (x0 + sums)
        x0, lo = out[hi - 1], hi
    return out
