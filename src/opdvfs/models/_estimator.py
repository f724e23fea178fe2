"""The one check every fitted model shares: ``fit`` has been called (sklearn's check_is_fitted)."""

from __future__ import annotations

from opdvfs.exceptions import NotFittedError

__all__ = ["check_is_fitted"]


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
