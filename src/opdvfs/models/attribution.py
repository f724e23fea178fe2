"""Attribute coarse power samples (NVML-style windows) to the operators that ran in them.

A GPU power sample averages over 100 ms-1 s, thousands of operators. Each window's energy is
``E_j = P_idle D_j,idle + sum_c P_c D_jc``, with ``D_jc`` the time operators of class ``c`` ran
inside window ``j``: a non-negative least-squares fit of one power per class (and per clock)
from many windows. Windows overlap freely (a 1 s average read every 100 ms).

A training iteration repeats the same mix of operators, so most windows hold nearly the same
mix and the plain fit is ill-conditioned (class powers trade off against each other). The fit is
therefore ridge-regularised towards the mean power, with the strength chosen by cross-validation
over contiguous blocks of windows.

:func:`power_rows` gives the power models their per-op rows: the profile's measured power
columns, or the class powers attributed from its sensor windows. A run too short for its sensor
(fewer than :data:`MIN_WINDOWS` complete windows at a clock) is refused with the number of
iterations :func:`sensor_iterations` asks for; ``opdvfs profile`` profiles that many by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from opdvfs.exceptions import ValidationError
from opdvfs.models._lsq import nnls
from opdvfs.profile import Profile

if TYPE_CHECKING:  # pandas loads with the first profile, not with `opdvfs --help`
    import pandas as pd

__all__ = [
    "MIN_WINDOWS",
    "SENSOR_WINDOWS",
    "attribute_class_power",
    "class_time_in_windows",
    "power_rows",
    "ridge_nnls",
    "sensor_iterations",
    "sensor_span_s",
]

#: Complete sensor windows per clock a profile aims for (``opdvfs profile``'s default iterations):
#: the attribution's accuracy levels off around here on the simulated GPUs (``benchmarks/
#: power_models.py``: bert on the a100-like, 39 windows 6.9% per-op error, 117 windows 7.2%).
SENSOR_WINDOWS = 40
#: Folds of the blocked cross-validation that picks the ridge strength.
CV_FOLDS = 5
#: Fewest complete windows per clock the attribution accepts: two per cross-validation fold.
#: Below it the ridge strength cannot be chosen and, with no window at all, a class's power is
#: NaN (the crash of issue #14).
MIN_WINDOWS = 2 * CV_FOLDS


def sensor_iterations(
    iteration_s: float,
    *,
    period_ms: float,
    window_ms: float,
    windows: int = SENSOR_WINDOWS,
) -> int:
    """Return the iterations per clock for a profiled run to span ``windows`` sensor windows.

    A sensor read every ``period_ms`` that averages the last ``window_ms`` gives its first
    complete window ``window_ms`` into the run and one more every period, so ``windows`` of them
    take ``window_ms + (windows - 1) period_ms``. ``opdvfs profile`` and
    :func:`opdvfs.experiments.bench.prepare` profile this many iterations; :func:`power_rows`
    names it when a profile is too short.

    Parameters
    ----------
    iteration_s
        Wall time of one iteration (s) at the fastest clock profiled (the shortest run).
    period_ms, window_ms
        The sensor's sampling period and averaging window (ms): NVML-like 100 ms / 100 ms-1 s,
        Ascend-like 1 ms / 1 ms.
    windows
        Complete windows wanted per clock.

    Returns
    -------
    int
        At least 1.
    """
    if not (iteration_s > 0 and math.isfinite(iteration_s)):
        raise ValidationError(
            f"iteration time: expected a positive number of seconds, got {float(iteration_s)}",
            field="iteration_s",
        )
    span_s = sensor_span_s(period_ms=period_ms, window_ms=window_ms, windows=windows)
    return max(1, math.ceil(span_s / iteration_s))


def sensor_span_s(*, period_ms: float, window_ms: float, windows: int = SENSOR_WINDOWS) -> float:
    """Return the seconds a run takes to span ``windows`` complete sensor windows.

    The first complete window ends ``window_ms`` into the run and one more every ``period_ms``:
    ``window_ms + (windows - 1) period_ms`` (:func:`sensor_iterations` divides it by an
    iteration's length; the clock sweep counts iterations until they cover it).
    """
    span_ms = window_ms + (windows - 1) * period_ms  # in ms, so 100 + 39 x 100 is exactly 4000
    return span_ms * 1e-3


def _complete(run: pd.DataFrame, samples: pd.DataFrame, column: str, window_s: float) -> np.ndarray:
    """Mask of the samples with a reading whose window ``[t - window_s, t]`` lies inside ``run``.

    ``run``: one clock's rows (``wall_s`` start, ``time_us``); a window reaching past the run
    would mix in another clock's power or the idle time between runs.
    """
    start = run["wall_s"].to_numpy(dtype=float)
    end = start + run["time_us"].to_numpy(dtype=float) * 1e-6
    t_s = samples["t_s"].to_numpy(dtype=float)
    finite = np.isfinite(samples[column].to_numpy(dtype=float))
    return finite & (t_s - window_s >= start.min()) & (t_s <= end.max())


def class_time_in_windows(
    start_s: np.ndarray,
    dur_s: np.ndarray,
    cls: np.ndarray,
    n_classes: int,
    window_end_s: np.ndarray,
    window_s: float,
) -> np.ndarray:
    """Time each class ran inside each window ``[end - window_s, end]``, shape (n_win, n_classes).

    Ops of one stream do not overlap, so a class's cumulative busy time is a piecewise-linear,
    non-decreasing function of time; the time inside a window is its difference at the ends.
    """
    order = np.argsort(start_s, kind="stable")
    s, d, c = start_s[order], dur_s[order], cls[order]
    out = np.zeros((len(window_end_s), n_classes))
    lo = window_end_s - window_s
    for k in range(n_classes):
        mine = c == k
        if not mine.any():
            continue
        ks, kd = s[mine], d[mine]
        # cumulative busy time at each op's start and end (knots of a piecewise-linear curve)
        before = np.r_[0.0, np.cumsum(kd)[:-1]]
        knots_t = np.ravel(np.column_stack([ks, ks + kd]))
        knots_b = np.ravel(np.column_stack([before, before + kd]))
        out[:, k] = np.interp(window_end_s, knots_t, knots_b) - np.interp(lo, knots_t, knots_b)
    return out


#: Ridge strengths tried by cross-validation (relative to the design's column scale). The strong
#: end matters on real GPUs: on the H200 fixture every 100 ms window holds one whole training step,
#: the class powers are not identifiable, and the weak end alone gave classes 0-3058 W on a 700 W
#: board (tests/test_real_gpu_trace.py); cross-validation then picks the mean power. The simulated
#: sensors' choices (benchmarks/power_models.py) are unchanged.
RIDGE_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


def _ridge_solve(design: np.ndarray, energy: np.ndarray, lam: float) -> np.ndarray:
    scale = np.sqrt((design**2).sum(axis=0).mean())
    prior = energy.sum() / max(design.sum(), 1e-300)  # the mean power of all windows
    eye = lam * scale * np.eye(design.shape[1])
    return nnls(np.r_[design, eye], np.r_[energy, eye @ np.full(design.shape[1], prior)])


def ridge_nnls(design: np.ndarray, energy: np.ndarray, folds: int = CV_FOLDS) -> np.ndarray:
    """Non-negative ridge fit of per-class power, strength chosen by blocked cross-validation."""
    if len(energy) < 2 * folds:
        return _ridge_solve(design, energy, RIDGE_GRID[len(RIDGE_GRID) // 2])
    block = np.arange(len(energy)) * folds // len(energy)
    errors = []
    for lam in RIDGE_GRID:
        err = 0.0
        for k in range(folds):
            train, test = block != k, block == k
            fit = _ridge_solve(design[train], energy[train], lam)
            err += float(((design[test] @ fit - energy[test]) ** 2).sum())
        errors.append(err)
    return _ridge_solve(design, energy, RIDGE_GRID[int(np.argmin(errors))])


def attribute_class_power(
    rows: pd.DataFrame, samples: pd.DataFrame, *, window_s: float, column: str = "power_w"
) -> pd.DataFrame:
    """Mean power of each op class at each clock, from windowed samples.

    Parameters
    ----------
    rows
        Profile rows with ``wall_s``, ``time_us``, ``type`` and ``freq_mhz``.
    samples
        Sensor samples with ``t_s`` and ``column``.
    window_s
        Averaging window of one sample.

    Returns
    -------
    DataFrame
        Columns ``freq_mhz, type, power_w`` (and the idle power as type ``"(idle)"``), plus
        ``windows`` (samples used) and ``residual_pct`` (RMS error of the window energies). A
        class no complete window saw gets the windows' mean power; with no window at all at a
        clock, every class is NaN there.
    """
    import pandas as pd

    out = []
    classes, cls = _class_codes(rows["type"])
    # only the columns read below: splitting every column by clock copied the whole table
    used = rows[["freq_mhz", "wall_s", "time_us"]].assign(_cls=cls)
    for freq, part in used.groupby("freq_mhz"):
        start = part["wall_s"].to_numpy(dtype=float)
        dur = part["time_us"].to_numpy(dtype=float) * 1e-6
        smp = samples[_complete(part, samples, column, window_s)]
        busy = class_time_in_windows(
            start, dur, part["_cls"].to_numpy(), len(classes), smp["t_s"].to_numpy(), window_s
        )
        design = np.c_[busy, np.maximum(window_s - busy.sum(axis=1), 0.0)]
        energy = smp[column].to_numpy() * window_s
        seen = design.sum(axis=0) > 0
        power = np.full(design.shape[1], np.nan)
        if len(energy):
            power[seen] = ridge_nnls(design[:, seen], energy)
            # a class that ran in no complete window (an iteration's tail, say) gets the mean
            # power of the windows: the only thing the sensor says about it
            power[~seen] = energy.sum() / (len(energy) * window_s)
        fitted = design[:, seen] @ power[seen] if len(energy) else np.empty(0)
        # relative to each window's energy: a window that read 0 J (a sensor that reads nothing
        # on an idle rank) has no relative error and is left out
        read = energy > 0
        resid = (
            float(np.sqrt(np.mean((fitted[read] / energy[read] - 1.0) ** 2)) * 100)
            if read.any()
            else np.nan
        )
        names = [*classes.tolist(), "(idle)"]
        out.append(
            pd.DataFrame(
                {
                    "freq_mhz": freq,
                    "type": names,
                    "power_w": power,
                    "windows": len(energy),
                    "residual_pct": resid,
                }
            )
        )
    return pd.concat(out, ignore_index=True)


def _class_codes(types: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(types.to_numpy(dtype=str), return_inverse=True)``, without sorting every row.

    The distinct values are found by hashing (a categorical's codes) and only they are converted
    to text and sorted: the row-wide string sort took ~3 s at 3.4M rows.
    """
    import pandas as pd

    codes, uniques = pd.factorize(types, use_na_sentinel=False)
    text = pd.Series(uniques, dtype=types.dtype).to_numpy(dtype=str)
    classes, inverse = np.unique(text, return_inverse=True)
    return classes, inverse[codes]


def power_rows(
    profile: Profile, window_ms: float | None = None, *, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Profile rows with per-op power: measured, or attributed from the sensor windows.

    Parameters
    ----------
    profile
        With ``core_power_w`` and/or ``chip_power_w`` per op, or sensor samples and the ops'
        wall-clock start times (``wall_s``).
    window_ms
        The samples' averaging window (ms, > 0); default from the profile's metadata
        (``meta["sensor"]["window_ms"]``).
    columns
        Keep only these of the rows' columns (those the rows have), e.g. what a fit reads: the
        other columns are not copied. Default: every column.

    Returns
    -------
    DataFrame
        The rows with measured power (rows missing it dropped), or every row with
        ``chip_power_w`` set to its class's attributed power at its clock
        (:func:`attribute_class_power`).

    Raises
    ------
    ValidationError
        If ``window_ms`` is not a positive number, the profile has neither power columns nor
        samples to attribute, or a clock's run spans fewer than :data:`MIN_WINDOWS` complete
        windows (``field="iterations"``; the message names the iterations to profile).
    """
    import pandas as pd

    if window_ms is not None and not (math.isfinite(window_ms) and window_ms > 0):
        raise ValidationError(
            f"window_ms: expected a positive number of milliseconds, got {float(window_ms):g}",
            field="window_ms",
        )
    ops = profile.ops
    if "core_power_w" in ops or "chip_power_w" in ops:
        cols = [c for c in ("core_power_w", "chip_power_w") if c in ops]
        if columns is not None:
            ops = ops[[c for c in ops.columns if c in columns]]
        return ops.dropna(subset=cols)
    samples = profile.samples
    if samples is None or "wall_s" not in ops or ops["wall_s"].isna().any():
        raise ValidationError(
            "profile has no per-op power columns and no sensor samples with op wall times "
            "(wall_s) to attribute them from",
            field="chip_power_w",
        )
    sensor = profile.meta.get("sensor", {})
    window = window_ms or sensor.get("window_ms")
    if not window:
        raise ValidationError(
            "the sensor's averaging window is unknown: pass window_ms", field="window_ms"
        )
    _check_long_enough(ops, samples, float(window), sensor.get("period_ms"))
    cls = attribute_class_power(ops, samples, window_s=float(window) / 1e3)
    table = cls.set_index(["freq_mhz", "type"])["power_w"]
    # look up each distinct (clock, type) pair once, then gather per row: converting every
    # row's type to text took ~0.4 s at 3.4M rows
    type_code, types = pd.factorize(ops["type"], use_na_sentinel=False)
    freq_code, freqs = pd.factorize(ops["freq_mhz"], use_na_sentinel=False)
    type_text = pd.Series(types, dtype=ops["type"].dtype).astype(str)
    pairs = pd.MultiIndex.from_arrays(
        [np.repeat(np.asarray(freqs), len(types)), np.tile(type_text.to_numpy(), len(freqs))]
    )
    power = table.reindex(pairs).to_numpy()[freq_code * len(types) + type_code]
    if columns is not None:
        ops = ops[[c for c in ops.columns if c in columns]]
    return ops.assign(chip_power_w=power)


def _check_long_enough(
    ops: pd.DataFrame, samples: pd.DataFrame, window_ms: float, period_ms: float | None
) -> None:
    """Refuse a profile whose run at some clock spans fewer than :data:`MIN_WINDOWS` windows.

    The message names the iterations :func:`sensor_iterations` asks for at the fastest clock
    (its iterations are the shortest), so one re-profile fixes every clock.
    """
    t_s = np.sort(samples["t_s"].to_numpy(dtype=float))
    if period_ms is None:  # imported samples: the sensor's period is their spacing
        gaps = np.diff(t_s)
        period_ms = float(np.median(gaps)) * 1e3 if gaps.size else window_ms
    short, needed = [], 1
    for _, part in ops[["freq_mhz", "iteration", "wall_s", "time_us"]].groupby("freq_mhz"):
        found = int(_complete(part, samples, "power_w", window_ms / 1e3).sum())
        end_s = part["wall_s"] + part["time_us"] * 1e-6
        iterations = part["iteration"].nunique()
        iteration_s = float(end_s.max() - part["wall_s"].min()) / iterations
        needed = max(
            needed, sensor_iterations(iteration_s, period_ms=period_ms, window_ms=window_ms)
        )
        if found < MIN_WINDOWS:
            short.append((float(part["freq_mhz"].iloc[0]), found, iterations, iteration_s))
    if short:
        freq, found, iterations, iteration_s = short[0]
        raise ValidationError(
            f"profile too short for its power sensor: at {freq:g} MHz its {iterations} "
            f"iteration(s) of {iteration_s * 1e3:.3g} ms span {found} complete {window_ms:g} ms "
            f"window(s), fewer than the {MIN_WINDOWS} that attributing power to operators "
            f"needs; profile at least {needed} iterations per clock ({SENSOR_WINDOWS} windows; "
            "`opdvfs profile` picks this many when --iterations is not given)",
            field="iterations",
        )
