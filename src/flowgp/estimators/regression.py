"""scikit-learn style estimators: thin layers over the models in `flowgp.models` and `flowgp.training`.

They standardise inputs, standardise targets where the flow allows it (only rescale them where the
flow's range or domain is the positive half-line, which a shift would break), train with Adam and
undo the scaling on every output.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin

from ..checkpoint import atomic_save, safe_load
from ..flows import Flow, init_from_data, init_identity, init_random, make_flow
from ..inducing import kmeans_inducing_points
from ..kernels import make_kernel
from ..likelihoods import GaussianLikelihood
from ..models import SVGP, TGP, WarpedGP
from ..training import train
from ._base import _DTYPES, _FORMAT, _as_1d_float, _as_2d_float, _default_dtype

__all__ = ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor"]

class SVGPRegressor(RegressorMixin, BaseEstimator):
    """Sparse variational GP regression (Hensman et al. 2013) with a scikit-learn interface.

    Args:
        num_inducing: M, inducing inputs initialised by k-means (best of `kmeans_restarts`).
        kernel: kernel spec, e.g. "rbf", "matern32", "periodic", "rbf+linear" (see flowgp.kernels).
        batch_size: minibatch size (None: full batch). epochs: passes over the data. lr: Adam step.
        seed: controls k-means, flow initialisation and minibatch order (fits are reproducible).
        dtype: "float64" (default) or "float32". device: "cpu" or "cuda".
        noise: initial Gaussian noise variance (standardised units; appendix B.6 uses 0.05).
        lengthscale, period: initial kernel hyperparameters (standardised inputs).
        fix_noise_fraction: hold the noise fixed for this fraction of iterations (appendix B.5).
        quadrature_points / predict_quadrature_points: Gauss-Hermite points in training / prediction.
        verbose: show a tqdm progress bar.
    """


    def __init__(self, num_inducing=100, kernel="rbf", batch_size=None, epochs=1000, lr=0.01, seed=0,
                 dtype="float64", device="cpu", noise=0.05, lengthscale=1.0, period=1.0,
                 fix_noise_fraction=0.0, kmeans_restarts=10, learn_inducing=True, quadrature_points=20,
                 predict_quadrature_points=100, verbose=True):
        self.num_inducing = num_inducing
        self.kernel = kernel
        self.batch_size = batch_size
        self.epochs = epochs
        self.lr = lr
        self.seed = seed
        self.dtype = dtype
        self.device = device
        self.noise = noise
        self.lengthscale = lengthscale
        self.period = period
        self.fix_noise_fraction = fix_noise_fraction
        self.kmeans_restarts = kmeans_restarts
        self.learn_inducing = learn_inducing
        self.quadrature_points = quadrature_points
        self.predict_quadrature_points = predict_quadrature_points
        self.verbose = verbose

    # ----- hooks the flow estimators override -------------------------------------------------------
    def _target_positive(self) -> bool:
        """Whether targets may only be rescaled (never shifted)."""
        return False

    def _check_targets(self, y: np.ndarray) -> None:
        pass

    def _make_model(self, kernel, z):
        return SVGP(kernel, z, GaussianLikelihood(noise=self.noise), **self._model_kwargs())

    def _initialise_flow(self, model, y_t, generator) -> None:
        pass

    def _spec(self) -> dict:
        kernel = self.kernel if isinstance(self.kernel, str) else self.kernel.spec
        return {"kernel": kernel}

    # ----- helpers -----------------------------------------------------------------------------------
    def _model_kwargs(self) -> dict:
        return dict(learn_inducing=self.learn_inducing, quadrature_points=self.quadrature_points,
                    predict_quadrature_points=self.predict_quadrature_points)

    def _torch_dtype(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'float64' or 'float32', got {self.dtype!r}")
        return _DTYPES[self.dtype]

    def _check_fitted(self):
        if not hasattr(self, "model_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    def _tensor(self, a):
        return torch.as_tensor(a, dtype=self._torch_dtype(), device=self.device)

    def _inputs(self, X):
        self._check_fitted()
        X = _as_2d_float(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features but the estimator was fitted with {self.n_features_in_}")
        return self._tensor((X - self.x_mean_) / self.x_std_)

    def _targets(self, y, n):
        y = _as_1d_float(y, n)
        self._check_targets(y)
        return self._tensor((y - self.y_shift_) / self.y_scale_)[:, None]

    def _build(self, input_dim, z):
        torch_dtype = self._torch_dtype()
        if isinstance(self.kernel, str):
            kernel = make_kernel(self.kernel, input_dim, lengthscale=self.lengthscale, period=self.period)
        else:  # a user's kernel instance: train a copy, keep theirs untouched
            kernel = copy.deepcopy(self.kernel)
        with _default_dtype(torch_dtype):
            model = self._make_model(kernel, torch.as_tensor(z, dtype=torch_dtype))
        return model.to(device=self.device, dtype=torch_dtype)

    # ----- public API --------------------------------------------------------------------------------
    def fit(self, X, y):
        """Fit on X [n_samples, n_features] and y [n_samples]; returns self."""
        X = _as_2d_float(X)
        y = _as_1d_float(y, X.shape[0])
        if X.shape[0] < 2:
            raise ValueError(f"need at least 2 training points, got {X.shape[0]}")
        self._check_targets(y)
        self.n_features_in_ = X.shape[1]
        self.x_mean_ = X.mean(0)
        std = X.std(0)
        self.x_std_ = np.where(std > 0, std, 1.0)
        y_std = float(y.std()) if y.std() > 0 else 1.0
        if self._target_positive():
            self.y_shift_, self.y_scale_ = 0.0, y_std
        else:
            self.y_shift_, self.y_scale_ = float(y.mean()), y_std
        xt = self._tensor((X - self.x_mean_) / self.x_std_)
        yt = self._tensor((y - self.y_shift_) / self.y_scale_)[:, None]
        torch.manual_seed(self.seed)
        z = kmeans_inducing_points(xt, self.num_inducing, self.kmeans_restarts, self.seed)
        self.model_ = self._build(X.shape[1], z)
        generator = torch.Generator().manual_seed(self.seed)
        self._initialise_flow(self.model_, yt, generator)
        self.history_ = train(self.model_, xt, yt, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                              fix_noise_fraction=self.fix_noise_fraction, seed=self.seed, verbose=self.verbose,
                              desc=type(self).__name__)
        return self

    def predict(self, X, return_std=False):
        """Predictive mean of y* (and its standard deviation with return_std=True)."""
        xt = self._inputs(X)
        with torch.no_grad():
            mean, var = self.model_.predict(xt)
        mean = mean[:, 0].cpu().numpy() * self.y_scale_ + self.y_shift_
        if not return_std:
            return mean
        return mean, np.sqrt(var[:, 0].cpu().numpy()) * self.y_scale_

    def predict_quantiles(self, X, probs):
        """Predictive quantiles of y*, array [len(probs), n_samples]."""
        xt = self._inputs(X)
        with torch.no_grad():
            q = self.model_.predict_quantiles(xt, list(np.atleast_1d(probs)))
        return q[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_

    def predict_interval(self, X, level=0.95):
        """Central predictive interval (lower, upper) holding `level` of the predictive mass."""
        if not 0 < level < 1:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        q = self.predict_quantiles(X, [(1 - level) / 2, (1 + level) / 2])
        return q[0], q[1]

    def log_predictive_density(self, X, y):
        """Per-point log p(y* | x*) in the units of y (the target scaling's Jacobian is accounted for)."""
        xt = self._inputs(X)
        yt = self._targets(y, xt.shape[0])
        with torch.no_grad():
            lpd = self.model_.log_predictive_density(xt, yt)
        return lpd[:, 0].cpu().numpy() - math.log(self.y_scale_)

    def elbo(self, X, y):
        """The ELBO on (X, y) in the units of y (a lower bound on log p(y))."""
        xt = self._inputs(X)
        yt = self._targets(y, xt.shape[0])
        with torch.no_grad():
            value = self.model_.elbo(xt, yt).item()
        return value - xt.shape[0] * math.log(self.y_scale_)

    def sample_f(self, X, num_samples=1, seed=None):
        """Posterior samples of the latent function at X, in the units of y: [num_samples, n_samples]."""
        xt = self._inputs(X)
        generator = torch.Generator(device=xt.device).manual_seed(self.seed if seed is None else seed)
        with torch.no_grad():
            f = self.model_.sample_f(xt, num_samples, generator=generator)
        return f[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_

    def save(self, path):
        """Write the fitted estimator atomically to `path` (a torch file loadable with weights_only=True)."""
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k not in ("kernel", "flow")}
        state = {
            "format": _FORMAT, "class": type(self).__name__, "params": params, "spec": self._spec(),
            "n_features_in": self.n_features_in_, "x_mean": torch.as_tensor(self.x_mean_),
            "x_std": torch.as_tensor(self.x_std_), "y_shift": self.y_shift_, "y_scale": self.y_scale_,
            "inducing_shape": list(self.model_.gp.inducing_points.shape), "history": list(self.history_),
            "model": {k: v.detach().cpu() for k, v in self.model_.state_dict().items()},
        }
        atomic_save(state, path)
        return Path(path)

    @classmethod
    def load(cls, path, device=None):
        """Load an estimator written by `save` (weights_only: no code is executed)."""
        state = safe_load(path)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a flowgp estimator file")
        target = _ESTIMATORS.get(state["class"])
        if target is None or not issubclass(target, cls):
            raise ValueError(f"{path} holds a {state['class']}, not a {cls.__name__}")
        params = dict(state["params"])
        if device is not None:
            params["device"] = device
        est = target(**params, **state["spec"])
        est.n_features_in_ = int(state["n_features_in"])
        est.x_mean_ = state["x_mean"].numpy()
        est.x_std_ = state["x_std"].numpy()
        est.y_shift_, est.y_scale_ = float(state["y_shift"]), float(state["y_scale"])
        est.history_ = list(state["history"])
        z = np.zeros(state["inducing_shape"])
        est.model_ = est._build(est.n_features_in_, z)
        est.model_.load_state_dict(state["model"])
        est.model_.eval()
        return est


class _FlowRegressor(SVGPRegressor):
    """Shared constructor of the flow estimators (sklearn needs every parameter in the signature)."""

    def __init__(self, flow="sal", flow_init="identity", num_inducing=100, kernel="rbf", batch_size=None,
                 epochs=1000, lr=0.01, seed=0, dtype="float64", device="cpu", noise=0.05, lengthscale=1.0,
                 period=1.0, fix_noise_fraction=0.0, kmeans_restarts=10, learn_inducing=True,
                 quadrature_points=20, predict_quadrature_points=100, verbose=True):
        super().__init__(num_inducing=num_inducing, kernel=kernel, batch_size=batch_size, epochs=epochs, lr=lr,
                         seed=seed, dtype=dtype, device=device, noise=noise, lengthscale=lengthscale,
                         period=period, fix_noise_fraction=fix_noise_fraction, kmeans_restarts=kmeans_restarts,
                         learn_inducing=learn_inducing, quadrature_points=quadrature_points,
                         predict_quadrature_points=predict_quadrature_points, verbose=verbose)
        self.flow = flow
        self.flow_init = flow_init

    _FLOW_INITS = ("identity", "data", "random", "none")

    def _flow_spec(self) -> str:
        if isinstance(self.flow, Flow):
            return self.flow.spec
        if not isinstance(self.flow, str):
            raise TypeError(f"flow must be a spec string such as 'sal+softplus' or a Flow, got {type(self.flow).__name__}")
        return make_flow(self.flow).spec  # validates the name early, with the list of valid names

    def _spec(self) -> dict:
        return {**super()._spec(), "flow": self._flow_spec()}

    def _initialise_flow(self, model, y_t, generator):
        if self.flow_init not in self._FLOW_INITS:
            raise ValueError(f"flow_init must be one of {self._FLOW_INITS}, got {self.flow_init!r}")
        flow = model.flow
        if isinstance(self.flow, Flow):
            flow.load_state_dict(self.flow.state_dict())
        if not any(True for _ in flow.parameters()) or self.flow_init == "none":
            return
        if self.flow_init == "identity":
            init_identity(flow)
        elif self.flow_init == "random":
            init_random(flow, generator=generator)
        else:
            init_from_data(flow, y_t[:, 0], direction=self._data_direction)


class TGPRegressor(_FlowRegressor):
    """Transformed GP regression (paper §3-4): a sparse GP prior warped by the marginal flow `flow`.

    `flow` is a spec string ("sal", "sal+softplus", "tanh", "identity", ...) or a Flow;
    `flow_init` is "identity" (appendix B.3), "data" (B.2, eq. 30), "random" or "none".
    flow="identity" gives exactly the SVGPRegressor.
    """

    _data_direction = "generative"

    def _target_positive(self) -> bool:
        return make_flow(self._flow_spec()).codomain == "positive"

    def _make_model(self, kernel, z):
        return TGP(kernel, z, make_flow(self._flow_spec()), GaussianLikelihood(noise=self.noise),
                   **self._model_kwargs())


class WarpedGPRegressor(_FlowRegressor):
    """Variational warped GP, v-WGP (paper §4.3): a sparse GP on T(y) with `flow` = T warping the targets.

    Targets must lie in T's domain (y > 0 for "log", "boxcox" keeps all reals); `flow_init="data"` fits T
    so that T(y) is close to N(0, 1) (appendix B.2 in the normalizing direction).
    """

    _data_direction = "normalizing"

    def _target_positive(self) -> bool:
        return make_flow(self._flow_spec()).domain == "positive"

    def _check_targets(self, y):
        flow = make_flow(self._flow_spec())
        if flow.domain == "positive" and np.any(y <= 0):
            raise ValueError(
                f"the '{flow.spec}' warping needs positive targets but y has min {y.min():.4g}; "
                "shift y or choose a flow defined on all reals (e.g. 'sal')"
            )

    def _make_model(self, kernel, z):
        return WarpedGP(kernel, z, make_flow(self._flow_spec()), GaussianLikelihood(noise=self.noise),
                        **self._model_kwargs())


_ESTIMATORS = {c.__name__: c for c in (SVGPRegressor, TGPRegressor, WarpedGPRegressor)}
