"""Power and temperature sensors: samples at the device's period, each averaging a window."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["sample_sensors"]


def sample_sensors(
    edges_s: np.ndarray,
    chip_energy_j: np.ndarray,
    core_energy_j: np.ndarray,
    temp_c: np.ndarray,
    freq_mhz: np.ndarray,
    *,
    period_s: float,
    window_s: float,
    noise_w: float,
    temp_resolution_c: float,
    rng: np.random.Generator,
    offset_s: float = 0.0,
) -> pd.DataFrame:
    """Sample a piecewise-constant power trace the way a real sensor does.

    Each sample at time ``t`` reports the mean power over ``[t - window, t]`` (NVML averages
    over 100 ms-1 s; Ascend's lpmi reads ~1 ms), plus Gaussian noise; temperature is read at
    ``t`` and quantised. The cumulative energy counter (NVML total energy) is exact.

    Parameters
    ----------
    edges_s
        Interval boundaries (s), shape (m + 1,), ascending.
    chip_energy_j, core_energy_j
        Cumulative energy at each edge (J), shape (m + 1,).
    temp_c
        Temperature at each edge, shape (m + 1,).
    freq_mhz
        Clock during each interval, shape (m,).
    """
    # In place where the numbers allow, and the table built without a copy: at a million ops
    # the samples run to millions, each of these arrays some 20 MB (the same values as
    # ``np.round(temp / r) * r``, ``np.maximum(x / span + noise, 0)``, ...).
    t_end = edges_s[-1]
    times = np.arange(edges_s[0] + window_s, t_end + 1e-12, period_s)
    if times.size == 0:
        times = np.array([t_end])
    start = times - window_s
    np.maximum(start, edges_s[0], out=start)
    span = times - start
    energy = np.interp(times, edges_s, chip_energy_j)
    chip = energy - np.interp(start, edges_s, chip_energy_j)
    core = np.interp(times, edges_s, core_energy_j)
    core -= np.interp(start, edges_s, core_energy_j)
    del start
    idx = np.searchsorted(edges_s, times, side="right")
    idx -= 1
    np.clip(idx, 0, len(freq_mhz) - 1, out=idx)
    freq = freq_mhz[idx]
    del idx
    temp = np.interp(times, edges_s, temp_c)
    temp /= temp_resolution_c
    np.round(temp, out=temp)
    temp *= temp_resolution_c
    for power in (chip, core):  # chip's noise drawn first, as always
        power /= span
        power += rng.normal(0.0, noise_w, times.size)
        np.maximum(power, 0.0, out=power)
    del span
    times += offset_s
    return pd.DataFrame(
        {
            "t_s": times,
            "power_w": chip,
            "core_power_w": core,
            "temp_c": temp,
            "freq_mhz": freq,
            "energy_j": energy,
        },
        copy=False,
    )
