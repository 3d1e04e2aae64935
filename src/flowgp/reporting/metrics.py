"""Test metrics used throughout the TGP paper's experiments (§5, appendix B.6)."""
from __future__ import annotations

import numpy as np

__all__ = ["rmse", "mean_nll", "coverage", "r2", "expected_calibration_error"]


def _arrays(*arrays):
    out = [np.asarray(a, dtype=np.float64).reshape(len(a), -1) for a in arrays]
    n = out[0].shape[0]
    if any(a.shape[0] != n for a in out):
        raise ValueError(f"all arrays must have the same number of rows, got {[a.shape[0] for a in out]}")
    return out


def rmse(y_true, y_pred) -> float:
    """Root mean squared error.

    Args:
        y_true: targets, [N] or [N, L].
        y_pred: predictions of the same shape.

    Examples:
        >>> from flowgp.reporting.metrics import rmse
        >>> rmse([0.0, 0.0], [3.0, 4.0])
        3.5355339059327378
    """
    y_true, y_pred = _arrays(y_true, y_pred)
    return float(np.sqrt(np.mean((y_true - y_pred) ** 2)))


def mean_nll(log_density) -> float:
    """Negative mean test log predictive density, -1/N Σ log p(y*_n | x*_n).

    Args:
        log_density: log p(y*_n | x*_n) per test point (e.g. a regressor's ``log_predictive_density``).

    Examples:
        >>> from flowgp.reporting.metrics import mean_nll
        >>> mean_nll([-1.0, -2.0])
        1.5
    """
    return float(-np.mean(np.asarray(log_density, dtype=np.float64)))


def coverage(y_true, lower, upper) -> float:
    """Fraction of targets inside their predictive interval [lower, upper] (0.95 is ideal for 95 % intervals).

    Args:
        y_true: targets, [N] or [N, L].
        lower, upper: the interval's bounds, of the same shape (e.g. from ``predict_interval``).

    Examples:
        >>> from flowgp.reporting.metrics import coverage
        >>> coverage([0.0, 1.0, 5.0], [-1.0, -1.0, -1.0], [2.0, 2.0, 2.0])
        0.6666666666666666
    """
    y_true, lower, upper = _arrays(y_true, lower, upper)
    return float(np.mean((y_true >= lower) & (y_true <= upper)))


def r2(y_true, y_pred) -> float:
    """Coefficient of determination (scikit-learn's R², uniform over outputs).

    Args:
        y_true: targets, [N] or [N, L].
        y_pred: predictions of the same shape.

    See Also:
        ``sklearn.metrics.r2_score`` (the same value); :func:`flowgp.reporting.metrics.rmse`.
    """
    y_true, y_pred = _arrays(y_true, y_pred)
    ss_res = ((y_true - y_pred) ** 2).sum(0)
    ss_tot = ((y_true - y_true.mean(0)) ** 2).sum(0)
    return float(np.mean(1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0)))


def expected_calibration_error(labels, probs, bins: int = 15) -> float:
    """ECE of a classifier (Guo et al. 2017): the rows binned by confidence max_c p(c | x) into `bins` equal
    intervals of [0, 1], Σ_b (n_b / N)·|accuracy_b - mean confidence_b|.

    Args:
        labels: true class indices, [N].
        probs: predicted class probabilities, [N, C] (e.g. a classifier's ``predict_proba``).
        bins: the number of confidence bins; default 15.

    Examples:
        >>> from flowgp.reporting.metrics import expected_calibration_error
        >>> round(expected_calibration_error([0, 1], [[0.9, 0.1], [0.2, 0.8]], bins=10), 6)
        0.15
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0]:
        raise ValueError(f"probs must be [N, classes] with one row per label, got {probs.shape} for {labels.shape[0]} labels")
    if int(bins) < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    confidence = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    total = 0.0
    for b in range(int(bins)):
        rows = which == b
        if rows.any():
            total += rows.mean() * abs(correct[rows].mean() - confidence[rows].mean())
    return float(total)
