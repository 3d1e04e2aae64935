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


class _Estimator:
    """Machinery every flowgp estimator shares: dtype, input standardisation, fitted check, save/load.

    Subclasses keep their own __init__ (scikit-learn reads the parameters from its signature) and give
    `_build(input_dim, z)`, `_spec()` (constructor arguments that are objects, saved as spec strings),
    `_extra_state()` (fitted attributes beyond the input scaling) and `_restore(state)` (sets those
    attributes back and rebuilds `model_` with the saved shapes, before the weights are loaded).
    """

    _OBJECT_PARAMS = ("kernel", "flow")  # saved through `_spec()`, never as objects

    def _torch_dtype(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")
        return _DTYPES[self.dtype]

    def _check_fitted(self):
        if not hasattr(self, "model_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    def _tensor(self, a):
        return torch.as_tensor(a, dtype=self._torch_dtype(), device=self.device)

    def _fit_input_scaling(self, X: np.ndarray) -> torch.Tensor:
        """Learn the per-feature standardisation from the training inputs; returns them scaled, as a tensor."""
        self.n_features_in_ = X.shape[1]
        self.x_mean_ = X.mean(0)
        std = X.std(0)
        self.x_std_ = np.where(std > 0, std, 1.0)
        return self._tensor((X - self.x_mean_) / self.x_std_)

    def _inputs(self, X):
        self._check_fitted()
        X = _as_2d_float(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features but the estimator was fitted with {self.n_features_in_}")
        return self._tensor((X - self.x_mean_) / self.x_std_)

    def _spec(self) -> dict:
        return {"kernel": self.kernel if isinstance(self.kernel, str) else self.kernel.spec}

    def _extra_state(self) -> dict:
        return {}

    def _restore(self, state: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, path):
        """Write the fitted estimator atomically to `path` (a torch file loadable with weights_only=True)."""
        from ..checkpoint import atomic_save

        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k not in self._OBJECT_PARAMS}
        state = {
            "format": _FORMAT, "class": type(self).__name__, "params": params, "spec": self._spec(),
            "n_features_in": self.n_features_in_, "x_mean": torch.as_tensor(self.x_mean_),
            "x_std": torch.as_tensor(self.x_std_), "history": list(getattr(self, "history_", [])),
            "model": {k: v.detach().cpu() for k, v in self.model_.state_dict().items()},
            **self._extra_state(),
        }
        atomic_save(state, path)
        from pathlib import Path

        return Path(path)

    @classmethod
    def _subclass_named(cls, name):
        stack = [cls]
        while stack:
            c = stack.pop()
            if c.__name__ == name:
                return c
            stack.extend(c.__subclasses__())
        return None

    @classmethod
    def load(cls, path, device=None):
        """Load an estimator written by `save` (weights_only: no code is executed)."""
        from ..checkpoint import safe_load

        state = safe_load(path)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a flowgp estimator file")
        target = cls._subclass_named(state["class"])
        if target is None:
            raise ValueError(f"{path} holds a {state['class']}, not a {cls.__name__}")
        params = dict(state["params"])
        if device is not None:
            params["device"] = device
        est = target(**params, **state["spec"])
        est.n_features_in_ = int(state["n_features_in"])
        est.x_mean_ = state["x_mean"].numpy()
        est.x_std_ = state["x_std"].numpy()
        est.history_ = list(state["history"])
        est._restore(state)
        est.model_.load_state_dict(state["model"])
        est.model_.eval()
        return est
