"""Accuracy of fitted models on held-out clocks, reported the way the paper does (§4, Fig. 15).

Fit on the training clocks, predict every other clock of the profile, and report the mean and
median absolute percentage error, the share of predictions within 5% and 10%, and the operators
excluded for being shorter than ``min_us`` at the highest training clock (the paper drops
operators under 20 us: 58.3% of them, 0.9% of the time) with their share of the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opdvfs.calibration import PowerCalibration
from opdvfs.devices.spec import DeviceSpec, VoltageCurve
from opdvfs.exceptions import ValidationError
from opdvfs.models.attribution import power_rows
from opdvfs.models.perf import VIOLATION_LOW_CLOCK_OFF_TREND, PerfModel, check_physics
from opdvfs.models.power import Dynamic, PowerModel
from opdvfs.profile import Profile

__all__ = [
    "error_summary",
    "relative_errors_pct",
    "training_plan",
    "validate_perf",
    "validate_power",
]


def relative_errors_pct(pred: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """``|pred / actual - 1| * 100`` over the finite pairs with a positive actual value."""
    pred, actual = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(actual) & (actual > 0)
    return np.abs(pred[ok] / actual[ok] - 1.0) * 100.0


def error_summary(pred: np.ndarray, actual: np.ndarray) -> dict[str, float | int]:
    """Mean / median |error| % and shares within 5% and 10%, over finite pairs."""
    err = relative_errors_pct(pred, actual)
    if err.size == 0:
        return {
            "n_points": 0,
            "mape_pct": float("nan"),
            "median_pct": float("nan"),
            "within5_pct": float("nan"),
            "within10_pct": float("nan"),
        }
    return {
        "n_points": int(err.size),
        "mape_pct": float(err.mean()),
        "median_pct": float(np.median(err)),
        "within5_pct": float((err <= 5.0).mean() * 100.0),
        "within10_pct": float((err <= 10.0).mean() * 100.0),
    }


def _held_out_clocks(freqs_mhz: np.ndarray, train_mhz: np.ndarray, clocks: str) -> np.ndarray:
    """Return the clocks of ``freqs_mhz`` not trained on; none is an error (nothing to score).

    ``clocks`` names what ``freqs_mhz`` holds, for the message.
    """
    test = np.array([f for f in freqs_mhz if not np.isclose(train_mhz, f).any()])
    if test.size == 0:
        raise ValidationError(
            f"every {clocks} is a training clock; leave at least one out to validate",
            field="train_freqs_mhz",
        )
    return test


def validate_perf(
    profile: Profile,
    train_freqs_mhz: Sequence[float],
    *,
    form: str = "auto",
    min_us: float = 20.0,
) -> dict[str, Any]:
    """Fit a :class:`PerfModel` on ``train_freqs_mhz`` and score it on the other clocks.

    Returns
    -------
    dict
        ``form, n_points, mape_pct, median_pct, within5_pct, within10_pct, excluded_ops,
        excluded_time_pct`` plus ``flagged_ops`` (included ops whose training points violate the
        physics), ``low_clock_off_trend_ops`` (those of them whose lowest clock is off the trend
        of the others, 4+ clocks), ``measured_flagged_ops`` (included ops whose measured times
        at *every* clock of the profile, held-out ones too, break the physics:
        :func:`~opdvfs.models.perf.check_physics`; e.g. slower at a higher clock), the mean
        |error| over the other included ops, ``physics_mape_pct`` (where the physics holds: no
        smooth per-op form follows a point that breaks it), and over them,
        ``measured_flagged_mape_pct`` (NaN where none), ``train_freqs_mhz`` and
        ``test_freqs_mhz``.
    """
    model = PerfModel(form=form).fit(profile, train_freqs_mhz)
    _, freqs, times = profile.time_matrix_us()
    train = model.train_freqs_mhz_
    test = _held_out_clocks(freqs, train, "clock of the profile")
    test_cols = [int(np.flatnonzero(np.isclose(freqs, f))[0]) for f in test]
    top = int(np.flatnonzero(np.isclose(freqs, train.max()))[0])
    short = ~(times[:, top] >= min_us)
    total = np.nansum(times)
    pred, actual = model.predict(test), times[:, test_cols]
    summary = error_summary(pred[~short], actual[~short])
    broken = (check_physics(freqs, times) != 0) & ~short
    holds = ~short & ~broken
    return {
        "form": model.form_,
        **summary,
        "excluded_ops": int(short.sum()),
        "excluded_time_pct": float(np.nansum(times[short]) / total * 100.0) if total else 0.0,
        "flagged_ops": int(((model.violation_ != 0) & ~short).sum()),
        "low_clock_off_trend_ops": int(
            (((model.violation_ & VIOLATION_LOW_CLOCK_OFF_TREND) != 0) & ~short).sum()
        ),
        "measured_flagged_ops": int(broken.sum()),
        "physics_mape_pct": error_summary(pred[holds], actual[holds])["mape_pct"],
        "measured_flagged_mape_pct": error_summary(pred[broken], actual[broken])["mape_pct"],
        "train_freqs_mhz": train.tolist(),
        "test_freqs_mhz": test.tolist(),
    }


def validate_power(
    profile: Profile,
    train_freqs_mhz: Sequence[float],
    *,
    temperature: bool = True,
    device: DeviceSpec | None = None,
    calibration: PowerCalibration | None = None,
    window_ms: float | None = None,
    dynamic: Dynamic = "clock",
    measured_times: bool = False,
    voltage: VoltageCurve | None = None,
) -> dict[str, Any]:
    """Fit a :class:`PowerModel` on ``train_freqs_mhz``; score per-op power on the other clocks.

    The rail scored is the core rail where the profile measures it (the paper's AICore), else
    the chip. With only sensor samples, both the training and the held-out per-op power come
    from window attribution (:mod:`opdvfs.models.attribution`).

    The throughput form (``dynamic="throughput"``) needs each op's time at the held-out clocks:
    by default a :class:`PerfModel` fitted on the same training clocks predicts them (what a
    plan sees); ``measured_times=True`` takes the profile's, to score the power model alone.

    Returns
    -------
    dict
        ``n_points, mape_pct, within1_pct, within5_pct, within10_pct,
        mape_no_temperature_pct`` plus ``rail``, ``temperature_share_pct`` (mean share of the
        ``gamma dT V`` term in the predicted power), ``iterations`` (most fixed-point steps),
        ``train_freqs_mhz`` and ``test_freqs_mhz``.
    """

    def fit(with_t: bool) -> PowerModel:
        return PowerModel(temperature=with_t, dynamic=dynamic, voltage=voltage).fit(
            profile,
            train_freqs_mhz,
            device=device,
            calibration=calibration,
            window_ms=window_ms,
        )

    model = fit(temperature)
    rows = power_rows(profile, window_ms)  # the rows it was fitted on
    table = rows.pivot_table(
        index="op", columns="freq_mhz", values=f"{model.rail_}_power_w", aggfunc="median"
    ).reindex(model.op_ids_)
    freqs = table.columns.to_numpy(dtype=float)
    train = model.train_freqs_mhz_
    test = _held_out_clocks(freqs, train, "clock with power data")
    actual = table[test].to_numpy(dtype=float)
    time_us = None  # the clock form does not use the ops' times
    if dynamic == "throughput" and measured_times:
        _, clocks, measured = profile.time_matrix_us()
        time_us = measured[:, [int(np.flatnonzero(np.isclose(clocks, f))[0]) for f in test]]
    elif dynamic == "throughput":
        time_us = PerfModel().fit(profile, train.tolist()).predict(test, model.op_ids_)
    pred = model.predict(test, time_us=time_us)
    rail = "core_w" if model.rail_ == "core" else "chip_w"
    plain = fit(False).predict(test, time_us=time_us)[rail] if temperature else pred[rail]
    summary = error_summary(pred[rail], actual)
    ok = np.isfinite(actual)
    within1 = np.abs(pred[rail][ok] / actual[ok] - 1.0) * 100 <= 1.0
    share = (
        model.gamma_
        * (pred["temp_c"] - model.ambient_c_)
        * model.voltage_.voltage_v(test)[None, :]
        / pred[rail]
    )
    return {
        "n_points": summary["n_points"],
        "mape_pct": summary["mape_pct"],
        "within1_pct": float(within1.mean() * 100) if within1.size else float("nan"),
        "within5_pct": summary["within5_pct"],
        "within10_pct": summary["within10_pct"],
        "mape_no_temperature_pct": error_summary(plain, actual)["mape_pct"],
        "rail": model.rail_,
        "dynamic": model.dynamic,
        "times": None if dynamic == "clock" else "measured" if measured_times else "perf model",
        "temperature_share_pct": float(np.nanmean(share) * 100) if model.use_temperature_ else 0.0,
        "iterations": int(pred["iterations"].max()),
        "train_freqs_mhz": train.tolist(),
        "test_freqs_mhz": test.tolist(),
    }


def training_plan(freqs_mhz: Sequence[float] | np.ndarray, n_clocks: int) -> np.ndarray:
    """Return the ``n_clocks`` clocks to profile, from the supported ``freqs_mhz``.

    2: the lowest and highest; 3: and the clock nearest the middle of the range; 4: and the
    clock nearest the middle of the upper half (the better plan: a kernel's memory-bound knee
    and the voltage's rise both sit in the upper part of the range, between a middle and a top
    clock). More: evenly spread over the range. Returns the distinct clocks, ascending.
    """
    f = np.unique(np.asarray(freqs_mhz, dtype=float))
    lo, hi = f[0], f[-1]
    if n_clocks >= len(f):
        return f
    mid, upper = (lo + hi) / 2, lo + 0.75 * (hi - lo)
    targets = {2: [lo, hi], 3: [lo, mid, hi], 4: [lo, mid, upper, hi]}
    want = targets.get(n_clocks, list(np.linspace(lo, hi, n_clocks)))
    picked = np.unique(f[np.abs(f[:, None] - np.asarray(want)[None, :]).argmin(axis=0)])
    return picked
