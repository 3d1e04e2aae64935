"""Pieces shared by every flowgp estimator: input checks, dtype handling, the saved-file format."""
from __future__ import annotations

import numpy as np
import torch

_DTYPES = {"float64": torch.float64, "float32": torch.float32, torch.float64: torch.float64,
           torch.float32: torch.float32}
_FORMAT = "flowgp-estimator-v1"


def _as_float_array(a, name) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy().astype(np.float64)
    try:
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a numeric array-like, got {type(a).__name__}") from None


def _as_2d_float(X, name="X") -> np.ndarray:
    X = _as_float_array(X, name)
    if X.ndim == 1:
        raise ValueError(f"{name} must be 2-D [n_samples, n_features]; reshape a single feature with X.reshape(-1, 1)")
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_samples, n_features], got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return X


def _as_1d_float(y, n, name="y") -> np.ndarray:
    y = _as_float_array(y, name)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n_samples] (one target), got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"{name} has {len(y)} values but X has {n} rows")
    if not np.isfinite(y).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return y


class _default_dtype:
    """Context manager building parameters in the estimator's dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.previous)
