"""Checks every fitted model shares: fitted (sklearn's check_is_fitted), clocks, finite results.

``fit`` has been called before use, the training clocks are distinct and in the profile, and
what ``fit`` produced is finite.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from opdvfs.exceptions import NotFittedError, ValidationError

__all__ = ["check_finite", "check_is_fitted", "training_clocks"]


def check_is_fitted(model: object, attribute: str) -> None:
    """Raise :class:`NotFittedError` unless ``model`` has the fitted ``attribute`` (``coef_``).

    Parameters
    ----------
    model
        The estimator.
    attribute
        A fitted attribute (trailing ``_``) that ``fit`` always sets.
    """
    if not hasattr(model, attribute):
        raise NotFittedError(
            f"this {type(model).__name__} is not fitted yet; call fit(profile) first"
        )


def training_clocks(
    train_freqs_mhz: Sequence[float] | np.ndarray | None, available_mhz: np.ndarray, missing: str
) -> np.ndarray:
    """Return the training clocks, ascending: ``available_mhz`` when None, else those given.

    Parameters
    ----------
    train_freqs_mhz
        Clocks asked for (MHz), or None for every available one.
    available_mhz
        Clocks the profile has data at (MHz), ascending.
    missing
        What the message says of a clock without data (``"is not in the profile"``).

    Raises
    ------
    ValidationError
        If a clock repeats (two columns of one clock make a 3-clock form fit 2 clocks) or the
        profile has no data at it.
    """
    if train_freqs_mhz is None:
        return np.asarray(available_mhz, dtype=float)
    train = np.sort(np.asarray(train_freqs_mhz, dtype=float))
    repeated = train[1:][np.isclose(train[1:], train[:-1])]
    if repeated.size:
        raise ValidationError(
            f"training clock {repeated[0]:g} MHz is given twice; expected distinct clocks",
            field="train_freqs_mhz",
        )
    for f in train:
        if not np.isclose(available_mhz, f).any():
            raise ValidationError(
                f"training clock {f:g} MHz {missing} (clocks: "
                f"{', '.join(f'{c:g}' for c in available_mhz)})",
                field="train_freqs_mhz",
            )
    return train


def check_finite(model: object, op_ids: np.ndarray, **fitted: np.ndarray | float) -> None:
    """Refuse a fit that produced a NaN or infinity: a model that predicts NaN must not be used.

    Parameters
    ----------
    model
        The estimator (named in the message).
    op_ids
        Operator positions, one per row of the per-op arrays.
    **fitted
        Its fitted arrays (first axis: operators) and scalars, by attribute name.
    """
    for name, value in fitted.items():
        bad = ~np.isfinite(np.asarray(value, dtype=float))
        if bad.any():
            where = f" (operator {int(op_ids[np.argwhere(bad)[0][0]])})" if bad.ndim else ""
            raise ValidationError(
                f"{type(model).__name__}.fit produced a non-finite {name}{where}; the profile's "
                "values at the training clocks cannot be fitted",
                field=name,
            )
