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

from opdvfs.exceptions import ValidationError
from opdvfs.models.perf import PerfModel
from opdvfs.profile import Profile

__all__ = ["error_summary", "validate_perf"]


def error_summary(pred: np.ndarray, actual: np.ndarray) -> dict[str, float | int]:
    """Mean / median |error| % and shares within 5% and 10%, over finite pairs."""
    ok = np.isfinite(pred) & np.isfinite(actual) & (actual > 0)
    err = np.abs(pred[ok] / actual[ok] - 1.0) * 100.0
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
        physics),
        ``train_freqs_mhz`` and ``test_freqs_mhz``.
    """
    model = PerfModel(form=form).fit(profile, train_freqs_mhz)
    _, freqs, times = profile.time_matrix_us()
    train = model.train_freqs_mhz_
    test = np.array([f for f in freqs if not np.isclose(train, f).any()])
    if test.size == 0:
        raise ValidationError(
            "every clock of the profile is a training clock; leave at least one out to validate",
            field="train_freqs_mhz",
        )
    test_cols = [int(np.flatnonzero(np.isclose(freqs, f))[0]) for f in test]
    top = int(np.flatnonzero(np.isclose(freqs, train.max()))[0])
    short = ~(times[:, top] >= min_us)
    total = np.nansum(times)
    summary = error_summary(model.predict(test)[~short], times[~short][:, test_cols])
    return {
        "form": model.form_,
        **summary,
        "excluded_ops": int(short.sum()),
        "excluded_time_pct": float(np.nansum(times[short]) / total * 100.0) if total else 0.0,
        "flagged_ops": int(((model.violation_ != 0) & ~short).sum()),
        "train_freqs_mhz": train.tolist(),
        "test_freqs_mhz": test.tolist(),
    }
