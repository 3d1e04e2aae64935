"""Pieces shared by every flowgp estimator: input checks, dtype handling, the saved-file format."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import atomic_save, safe_load

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
    scaled_inputs = _inputs  # public name of the redesign (D1 lands it in estimators/base.py); temporary alias

    def _spec(self) -> dict:
        return {"kernel": self.kernel if isinstance(self.kernel, str) else self.kernel.spec}

    def _extra_state(self) -> dict:
        return {}

    def _restore(self, state: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, path):
        """Write the fitted estimator atomically to `path` (a torch file loadable with weights_only=True)."""
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k not in self._OBJECT_PARAMS}
        state = {
            "format": _FORMAT, "class": type(self).__name__, "params": params, "spec": self._spec(),
            "n_features_in": self.n_features_in_, "x_mean": torch.as_tensor(np.asarray(self.x_mean_, np.float64)),
            "x_std": torch.as_tensor(np.asarray(self.x_std_, np.float64)), "history": list(getattr(self, "history_", [])),
            "model": {k: v.detach().cpu() for k, v in self.model_.state_dict().items()},
            **self._extra_state(),
        }
        atomic_save(state, path)
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
        state = safe_load(path)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a flowgp estimator file")
        target = cls._subclass_named(state.get("class"))
        if target is None:
            raise ValueError(f"{path} holds a {state.get('class')}, not a {cls.__name__}")
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


@contextlib.contextmanager
def _seeded(seed, device):
    """Fixed global RNG inside the block (dropout masks / q(W) draws), restored afterwards: repeatable predictions."""
    dev = torch.device(device)
    devices = [] if dev.type != "cuda" else [torch.cuda.current_device() if dev.index is None else dev.index]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


class _InputDependentFlowOptions:
    """Options of the estimators whose flow may take its parameters from a network NN(x, W) (TGP §3.2-3.3):
    input_dependent, hidden, activation, dropout, bayesian, mc_samples_train, mc_samples_predict,
    prior_precision, flow_init_epochs."""

    def _store_input_dependent_options(self, input_dependent, hidden, activation, dropout, bayesian,
                                       mc_samples_train, mc_samples_predict, prior_precision, flow_init_epochs):
        """Keep the constructor arguments as attributes of the same names (the scikit-learn contract)."""
        self.input_dependent = input_dependent
        self.hidden = hidden
        self.activation = activation
        self.dropout = dropout
        self.bayesian = bayesian
        self.mc_samples_train = mc_samples_train
        self.mc_samples_predict = mc_samples_predict
        self.prior_precision = prior_precision
        self.flow_init_epochs = flow_init_epochs

    def _which_stages(self):
        if self.input_dependent in (False, None):
            return None
        if self.input_dependent is True or self.input_dependent == "nonlinear":
            return "nonlinear"
        if self.input_dependent == "all":
            return "all"
        raise ValueError(f"input_dependent must be False, True (= 'nonlinear') or 'all', got {self.input_dependent!r}")

    def _check_bayesian_options(self) -> None:
        from ..bayesian import BAYESIAN_MODES
        from ..flows import Flow

        if self.bayesian not in BAYESIAN_MODES:
            raise ValueError(f"bayesian must be one of {BAYESIAN_MODES}, got {self.bayesian!r}")
        if self.bayesian == "vb" and self.dropout:
            raise ValueError("bayesian='vb' uses no dropout (appendix B.6.3); pass dropout=0")
        if isinstance(self.flow, Flow):
            raise ValueError("input_dependent=True needs flow as a spec string (the networks are built here)")
        for name in ("mc_samples_train", "mc_samples_predict", "flow_init_epochs"):
            value, least = getattr(self, name), 0 if name == "flow_init_epochs" else 1
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")

    def _maybe_input_dependent(self, flow, input_dim: int):
        """`flow` itself, or its non-affine stages (all stages with input_dependent="all") driven by NN(x, W)."""
        from ..bayesian import default_prior_precision
        from ..flows.conditional import make_input_dependent

        which = self._which_stages()
        if which is None:
            return flow
        self._check_bayesian_options()
        precision = default_prior_precision(self.bayesian) if self.prior_precision is None else self.prior_precision
        return make_input_dependent(flow, input_dim, which, hidden=tuple(self.hidden), activation=self.activation,
                                    dropout=self.dropout, bayesian=self.bayesian, prior_precision=precision)
