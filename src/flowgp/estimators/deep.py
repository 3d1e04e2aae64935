"""scikit-learn style deep-GP estimators: thin layers over `flowgp.models.deep_gp` and `flowgp.training.loop`.

`posterior="gaussian"` is the doubly-stochastic DGP of Salimbeni & Deisenroth (2017); "cnf" the convolutional
flow steps of Yu et al. (2021, §III) over DSVI's full-covariance Gaussian base (identity at initialisation, so
it starts as DSVI's posterior; one draw of U per data point; `dsvi_warmup` trains the DSVI model first);
"cnf-paper" the paper's exact design (diagonal base from φ(Z), one draw of U shared by the batch);
"flow-layerwise" the naive layer-wise flow (their Fig. 1). Inputs (and regression targets) are standardised as in the other estimators. Prediction uses
`num_samples_predict` samples drawn from a generator seeded with `seed`, so predictions are reproducible.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin

from ..gp.defaults import DEFAULTS
from ..build import DeepGPConfig, build
from ..data.sources import is_table
from ..gp.likelihoods import BernoulliLikelihood
from ..models.cnf_posterior import ELEMENTWISE_SHAPES, FLOW_BASES
from ..models.deep_gp import BASE_GRADIENTS, DRAWS, FLOW_ROWS, POSTERIORS, SKIPS, select_flow_strength, warm_start_from_gaussian
from ..models.image_skip import check_image_shape
from ..training.loop import default_optimizer, train
from ..build import resolve_dtype
from .base import Estimator, as_2d_float, positive_int
from .features import fit_feature_names
from .validation import check_parameters
from .chunking import chunk_rows, inducing_row_elements, map_row_chunks
from .classification import StreamedClassLabels, check_labels, training_classes
from .regression import SVGPRegressor

if TYPE_CHECKING:  # names of the signatures' annotations only
    import os
    from collections.abc import Callable, Iterable

    from numpy.typing import ArrayLike
    from typing_extensions import Self

__all__ = ["DeepGPRegressor", "DeepGPClassifier"]

_CLASS_LIKELIHOODS = ("robustmax", "softmax")
#: a deep GP's training state is saved at least every this many steps (besides every 100 epochs): on a large
#: set (Fashion-MNIST: 235 steps per epoch of 256 images) an interrupted fit then loses at most this much work
CHECKPOINT_STEPS = 1000


def checkpoint_epochs(num_rows: int, batch_size: int | None) -> int:
    """Epochs between checkpoints: 100, or fewer where 100 epochs are more than CHECKPOINT_STEPS steps."""
    per_epoch = math.ceil(num_rows / batch_size) if batch_size else 1
    return max(1, min(100, math.ceil(CHECKPOINT_STEPS / per_epoch)))


class _DeepMixin:
    """Model construction, seeded prediction samples and save/load shared by the two deep-GP estimators."""

    def _check_deep_params(self):
        check_parameters(self)  # every parameter's own rule first
        if not isinstance(self.kernel, str):
            raise TypeError("kernel must be a kernel name such as 'rbf' for deep GPs, "
                            f"got {type(self.kernel).__name__}")
        if self.posterior not in POSTERIORS:
            raise ValueError(f"posterior must be one of {POSTERIORS}, got {self.posterior!r}")
        if self.flow_base not in FLOW_BASES:
            raise ValueError(f"flow_base must be 'network' (CNF-DGP eq. 9) or 'free', got {self.flow_base!r}")
        if self.flow_elementwise not in ELEMENTWISE_SHAPES:
            raise ValueError(f"flow_elementwise must be one of {ELEMENTWISE_SHAPES}, got {self.flow_elementwise!r}")
        warm = self.dsvi_warmup
        if isinstance(warm, bool) or not isinstance(warm, (int, float, np.integer, np.floating)) or not 0 <= warm < 1:
            raise ValueError(f"dsvi_warmup must be a fraction in [0, 1) of the epochs trained as DSVI first, got {warm!r}")
        if self.draws is not None and self.draws not in DRAWS:
            raise ValueError(f"draws must be one of {DRAWS} or None (the posterior's default), got {self.draws!r}")
        if self.base_gradient is not None and self.base_gradient not in BASE_GRADIENTS:
            raise ValueError(f"base_gradient must be one of {BASE_GRADIENTS} or None (the default for the draws), "
                             f"got {self.base_gradient!r}")
        if self.base_gradient == "dsvi" and (self.posterior != "cnf" or self.draws not in (None, "coupled")):
            raise ValueError("base_gradient='dsvi' needs posterior='cnf' with draws='coupled' (its default), got "
                             f"posterior={self.posterior!r}, draws={self.draws!r}")
        scale = self.flow_lr_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) or \
                not 0 < scale <= 1e3 or not math.isfinite(scale):
            raise ValueError(f"flow_lr_scale must be a positive number (a fraction of lr), got {scale!r}")
        rows = self.flow_rows
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1):
            raise ValueError(f"flow_rows must be a positive integer (rows of each batch on which the flow's change "
                             f"of the bound is estimated) or None (every row), got {rows!r}")
        if not isinstance(self.flow_selection, (bool, np.bool_)):
            raise TypeError(f"flow_selection must be True or False, got {self.flow_selection!r}")
        if warm > 0 and self.posterior != "cnf":
            raise ValueError(f"dsvi_warmup > 0 needs posterior='cnf' (the flow over DSVI's Gaussian base), "
                             f"got posterior={self.posterior!r}")
        for name in ("layers", "num_samples_train", "num_samples_predict", "flow_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.skip not in SKIPS:
            raise ValueError(f"skip must be one of {SKIPS} (DSVI's linear projection, or the convolutional "
                             f"skip-layer connection for images), got {self.skip!r}")
        if self.skip == "conv" and self.image_shape is None:
            raise ValueError("skip='conv' needs image_shape=(channels, height, width) of the images in X "
                             "(each row a flattened image), e.g. image_shape=(1, 28, 28)")
        if self.image_shape is not None:
            check_image_shape(self.image_shape)
        resolve_dtype(self.dtype)

    def fit_input_scaling(self, X, y=None):
        """Standardised inputs; images (`image_shape` given) are scaled by one mean and scale over all pixels
        instead of per pixel, so that the skip and the kernel see the image as it is (pixels on the border,
        constant over the data, keep their value rather than being set to 0 each). `y`: as in
        Estimator.fit_input_scaling (digested with X)."""
        if self.image_shape is not None:
            check_image_shape(self.image_shape, X.shape[1])
        return super().fit_input_scaling(X, per_feature=self.image_shape is None, y=y)

    def _generator(self, device, seed=None):
        return self.generator(seed, device)

    def config(self, **overrides) -> DeepGPConfig:
        """The `flowgp.build.DeepGPConfig` of this estimator's model (fields in `overrides` replaced)."""
        config = DeepGPConfig(
            layers=int(self.layers), posterior=self.posterior, num_inducing=int(self.num_inducing),
            kernel=self.kernel, hidden_width=self.hidden_width, likelihood=self._likelihood_name(),
            noise=getattr(self, "noise", DEFAULTS.noise),
            num_classes=len(self.classes_) if hasattr(self, "classes_") else None,
            lengthscale=self.lengthscale, period=self.period, num_samples=int(self.num_samples_train),
            flow_steps=int(self.flow_steps), flow_base=self.flow_base, learn_inducing=self.learn_inducing,
            flow_elementwise=self.flow_elementwise, skip=self.skip, draws=self.draws,
            base_gradient=self.base_gradient, flow_rows=self.flow_rows,
            image_shape=None if self.image_shape is None else tuple(int(v) for v in self.image_shape),
            quadrature_points=self.quadrature_points, predict_quadrature_points=self.predict_quadrature_points,
            kmeans_restarts=self.kmeans_restarts)
        return dataclasses.replace(config, **overrides)

    def _build(self, x, y=None, **overrides):
        return build(self.config(**overrides), x, y, dtype=self.torch_dtype(), device=self.device,
                     generator=self.generator(device="cpu"))

    def _optimizer(self):
        """None (the training loop's Adam), or for posterior="cnf" with flow_lr_scale != 1 a factory of the same
        Adam with the flow steps' parameters in a group of their own at flow_lr_scale x lr."""
        scale = float(self.flow_lr_scale)
        if self.posterior != "cnf" or scale == 1.0:
            return None
        flow = {id(p) for p in self.model_.posterior.parameters()}
        lr = float(self.lr)

        def factory(params):
            params = list(params)
            groups = [{"params": [p for p in params if id(p) not in flow]},
                      {"params": [p for p in params if id(p) in flow], "lr": lr * scale}]
            return default_optimizer([g for g in groups if g["params"]], lr)

        return factory

    def _fit_model(self, xt, yt, sampler=None, callback=None):
        """Build the model from (xt, yt) and train it on them, or on `sampler()` (a fresh flowgp.training.batches sampler
        per training stage, e.g. over a streamed table; the model is then built from a sample of it). `callback`:
        the caller's `train` callback, called after every step of the main stage (not of a DSVI warm start)."""
        # every draw (flow-posterior networks, Monte Carlo samples) comes from generators made from `seed`
        self.model_ = self._build(xt, yt)
        warm_epochs = int(round(float(self.dsvi_warmup) * self.epochs))
        every = 100 if sampler is not None else checkpoint_epochs(xt.shape[0], self.batch_size)
        history = []
        fix_noise = getattr(self, "fix_noise_fraction", 0.0)
        if warm_epochs > 0:
            # DSVI first (the same model with a Gaussian q(U)), then the flow starts from its fitted state: with
            # identity steps that *is* the DSVI posterior, so the flow stage only adds what the flow gains
            dsvi = self._build(xt, yt, posterior="gaussian", draws=None)
            history += list(train(dsvi, **self._train_data(xt, yt, sampler), epochs=warm_epochs, lr=self.lr,
                                  fix_noise_fraction=min(1.0, fix_noise * self.epochs / warm_epochs), seed=self.seed_,
                                  verbose=self.verbose, compile=self.compile,
                                  desc=type(self).__name__ + " (DSVI warm start)",
                                  checkpoint_path=self.checkpoint_path(".dsvi"),
                                  checkpoint_every=every))
            warm_start_from_gaussian(self.model_, dsvi)
            fix_noise = 0.0 if fix_noise * self.epochs <= warm_epochs else \
                (fix_noise * self.epochs - warm_epochs) / (self.epochs - warm_epochs)
        select = self.posterior == "cnf" and self.flow_selection
        average = _FlowAverage(self.model_.posterior.parameters()) if select else None
        history += list(train(self.model_, **self._train_data(xt, yt, sampler), epochs=self.epochs - warm_epochs,
                              lr=self.lr, optimizer=self._optimizer(), callback=_combined(average, callback),
                              fix_noise_fraction=fix_noise, seed=self.seed_, verbose=self.verbose,
                              compile=self.compile, desc=type(self).__name__, checkpoint_path=self.checkpoint_path(),
                              checkpoint_every=every))
        self.history_ = history
        if select:
            # the richer family must not end below its own Gaussian base: the flow is kept at the strength
            # (0 = the DSVI posterior) whose training bound is highest
            self.flow_strength_ = select_flow_strength(self.model_, xt, yt, seed=self.seed_,
                                                       alternatives={"averaged": average.average})
        self.model_.eval()

    def _fit_table(self, X, y, callback=None):
        """`fit` on a streamed table (Estimator.fit_stream); images are refused (their scaling is global)."""
        if self.image_shape is not None:
            raise ValueError("image_shape: images are scaled by one mean and scale over all pixels, which a "
                             "streamed fit does not compute; pass the images as arrays")
        return self.fit_stream(X, y, callback=callback)

    def _deep_state(self) -> dict:
        return {"num_inducing_fitted": self.model_.layers[0].num_inducing, "y_dim": self.model_.num_outputs}

    def _restore_model(self, state):
        # the structure only needs shapes: placeholder inputs and Z, then the saved weights replace everything
        m, d = int(state["num_inducing_fitted"]), self.n_features_in_
        placeholder = torch.zeros(max(m, d), d, dtype=torch.float64)
        self.model_ = self._build(placeholder, None, inducing_points=torch.zeros(m, d, dtype=torch.float64),
                                  num_outputs=int(state["y_dim"]))
        self.model_.load_state_dict(state["model"])
        self.model_.eval()


class _FlowAverage:
    """Training-loop callback: an exponential moving average of the flow steps' parameters (Polyak averaging).

    The flow's gradient is mostly Monte Carlo noise, so its iterates scatter around the path the signal takes;
    their average (decay 0.998 per step: about the last 500 steps) is a candidate of the flow selection next to
    the final values (energy, 2 layers, quick budget, splits 0 / 1: gain over the DSVI base +0.0009 / +0.0050 per
    point with it, +0.0007 / 0 from the final values alone; docs/results/cnf-dgp/flow-vs-dsvi-uci). Its state is saved in
    training checkpoints, so a resumed fit averages the same iterates.
    """

    def __init__(self, params, decay: float = 0.998):
        self.params = list(params)
        self.decay = float(decay)
        self.average = [p.detach().clone() for p in self.params]

    def __call__(self, step, loss, model):
        with torch.no_grad():
            for a, p in zip(self.average, self.params):
                a.mul_(self.decay).add_(p.detach(), alpha=1.0 - self.decay)

    def state_dict(self) -> dict:
        return {"average": [a.clone() for a in self.average]}

    def load_state_dict(self, state) -> None:
        state = state.get("flow_average", state)  # (saved next to a caller's callback: `_Callbacks`)
        for a, saved in zip(self.average, state["average"]):
            a.copy_(saved)


def _combined(average, callback):
    """The `train` callback of a fit: the flow average, the caller's callback, both (`_Callbacks`) or None."""
    if callback is None or average is None:
        return average if callback is None else callback
    return _Callbacks(average, callback)


class _Callbacks:
    """The flow average and a caller's callback in one `train` callback: both called after every step (the run
    stops when the caller's returns a true value), both states kept in the checkpoints. A state saved by the
    flow average alone (a fit begun without the caller's callback) resumes the average, and the caller's
    callback starts without one."""

    def __init__(self, average, callback):
        self.average, self.callback = average, callback

    def __call__(self, step, loss, model):
        self.average(step, loss, model)
        return self.callback(step, loss, model)

    def state_dict(self) -> dict:
        own = self.callback.state_dict() if hasattr(self.callback, "state_dict") else None
        return {"flow_average": self.average.state_dict(), "callback": own}

    def load_state_dict(self, state) -> None:
        self.average.load_state_dict(state)
        if state.get("callback") is not None and hasattr(self.callback, "load_state_dict"):
            self.callback.load_state_dict(state["callback"])


class DeepGPRegressor(_DeepMixin, SVGPRegressor):
    """Deep GP regression (DSVI, Salimbeni & Deisenroth 2017; CNF-DGP, Yu et al. 2021) with a scikit-learn interface.

    Args:
        layers: number of GP layers L (hidden layers get `hidden_width` GPs, default max(min(D, 16), 1)).
        posterior: "gaussian" (DSVI), "cnf" (convolutional flow over DSVI's Gaussian base, coupled draws of U,
            trained as DSVI plus a learned correction and kept at the strength that maximises the training
            bound), "cnf-paper" (the CNF paper's design, shared draws) or
            "flow-layerwise" (ablation).
        num_samples_train: S samples per ELBO evaluation (flow posteriors: S draws of U per data point).
        num_samples_predict: S for prediction (paper: 100).
        hidden_width: GPs per hidden layer (None: max(min(D, 16), 1)).
        flow_steps: 1×1-convolution (or dense) steps of the flow posteriors, each with a sinh-arcsinh step.
        flow_base: the "cnf-paper" base π(V): "network" (φ_ℓ(Z_ℓ), CNF-DGP eq. 9) or "free" (ablation).
        flow_elementwise: "entry" or "channel": parameter sharing of the "cnf" posterior's sinh-arcsinh steps.
        draws: how a flow posterior's bound draws U (`flowgp.models.deep_gp.DeepGP`): "per-point", "coupled"
            ("cnf" only: DSVI's chain with locally reparameterised draws, DSVI's own estimator while the flow
            is the identity) or "shared"; None takes the posterior's default ("coupled" for "cnf", "shared"
            for "cnf-paper", "per-point" for "flow-layerwise").
        base_gradient: with coupled draws, "dsvi" (None's choice: everything DSVI also has follows DSVI's bound,
            bit for bit a DSVI fit with the same seed, and the flow steps the flow's change of it: DSVI plus a
            learned correction) or "joint" (every parameter follows the flow posterior's bound); see
            `flowgp.models.deep_gp.DeepGP`.
        flow_selection: ("cnf" only) after training, scale the flow toward the identity where that raises the
            training bound (`flowgp.models.deep_gp.select_flow_strength`, λ in {0, 1/8, 1/4, 1/2, 1} with common
            random numbers, for the final flow and for an exponential moving average of its iterates; the winner
            is kept only if it beats λ = 0 again on fresh draws); λ = 0 is the Gaussian base, so the fitted bound
            never ends below it. The scores are kept in `flow_strength_`.
        flow_lr_scale: ("cnf" only) the flow steps' Adam step size as a fraction of `lr` (the base and the
            hyperparameters keep `lr`). The flow's gradient is mostly Monte Carlo noise where the posterior is
            nearly Gaussian, and Adam moves every parameter by about its step size whatever its signal-to-noise
            ratio: at the full `lr` the flow drifts away from where the bound is highest (energy, 2 layers,
            quick budget: gain per point of the selected flow over its base 0 at x1, +0.0007 at x0.1).
        flow_rows: ("cnf" with base_gradient "dsvi") rows of each batch on which the flow's change of the bound is
            estimated (a random subset; None: every row); see `flowgp.models.deep_gp.DeepGP`.
        dsvi_warmup: fraction of `epochs` trained as DSVI first ("cnf" only); the flow then starts from the
            fitted DSVI posterior (`flowgp.models.deep_gp.warm_start_from_gaussian`) for the remaining epochs.
        skip: the hidden layers' skip-layer connection: "linear" (DSVI's fixed projection), "conv", the
            convolutional skip-layer connection of CNF-DGP §IV-B for images: X holds each image flattened in
            (C, H, W) order, `image_shape` = (C, H, W); hidden layers keep the image layout (C·H·W GPs sharing
            one kernel) and carry their input forward through a trainable 3×3 convolution
            (`flowgp.models.image_skip.ConvSkip`); or "dense", the same with a trainable fully connected skip
            (the design the convolution replaces). With `image_shape` inputs are scaled by one mean and scale
            over all pixels.
        image_shape: (C, H, W) of the images in X's rows, for skip="conv" / "dense" (None: X is not images).
        num_inducing: M inducing points per layer, shared by all layers.
        kernel, lengthscale, period, noise, kmeans_restarts, learn_inducing: as in :class:`flowgp.SVGPRegressor`.
        quadrature_points, predict_quadrature_points: as in :class:`flowgp.SVGPRegressor`.
        batch_size, epochs, lr, seed, dtype, device, fix_noise_fraction, verbose, checkpoint, compile: training,
            as in :class:`flowgp.SVGPRegressor`.
        threads: torch threads per call ("auto" or a positive integer), as in :class:`flowgp.SVGPRegressor`;
            "auto" sizes a step as layers x (batch x M² + M³).
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.

    See Also:
        :class:`flowgp.models.DeepGP` (the model), :class:`flowgp.DeepGPClassifier`.

    Examples:
        >>> import numpy as np
        >>> from flowgp import DeepGPRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-2, 2, (100, 2))
        >>> y = np.tanh(3 * X[:, 0]) + 0.05 * rng.standard_normal(100)
        >>> est = DeepGPRegressor(layers=2, num_inducing=10, epochs=5, verbose=False).fit(X, y)
        >>> est.predict(X[:3]).shape
        (3,)
    """

    def __init__(self, layers: int = 3, posterior: str = "gaussian", num_samples_train: int = 1,
                 num_samples_predict: int = 100, hidden_width: int | None = None, flow_steps: int = 2,
                 flow_base: str = "network", num_inducing: int = DEFAULTS.num_inducing, kernel: str = "rbf",
                 batch_size: int | None = None, epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr, seed: int = 0,
                 dtype: str = "float64", device: str | torch.device = "cpu", noise: float = DEFAULTS.noise,
                 lengthscale: float = 1.0, period: float = 1.0, fix_noise_fraction: float = 0.0,
                 kmeans_restarts: int = DEFAULTS.kmeans_restarts, learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points,
                 predict_quadrature_points: int = DEFAULTS.predict_quadrature_points, verbose: bool | str = "auto",
                 checkpoint: str | os.PathLike | None = None, flow_elementwise: str = "entry",
                 dsvi_warmup: float = 0.0, skip: str = "linear", image_shape: tuple[int, int, int] | None = None,
                 draws: str | None = None, compile: bool | str = False, base_gradient: str | None = None,
                 flow_selection: bool = True, flow_lr_scale: float = 0.1,
                 flow_rows: int | None = FLOW_ROWS,
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    def _likelihood_name(self):
        return "gaussian"

    #: `fit` streams tables (paths, iterators of chunks) through Estimator.fit_stream
    STREAMED_FIT = True

    def fit(self, X: ArrayLike | str | os.PathLike | Iterable, y: ArrayLike | str | int | None = None,
            callback: Callable | None = None) -> Self:
        """Fit on X [n_samples, n_features] and y [n_samples]; returns self. X may instead be a table streamed in
        chunks - a path (.csv, .parquet, .npy) with y the target column, or an iterator of (X, y) chunks with y
        None - see `fit_stream`: the model (k-means inducing inputs, the hidden layers' linear projections) is
        built from a reservoir sample and trained on the whole table, block by block. `callback(step, loss,
        model)` is passed to `flowgp.training.loop.train` (called after every step; a true value stops the fit;
        one with state_dict()/load_state_dict() has its state kept in the fit's checkpoints)."""
        self._check_deep_params()
        if is_table(X):
            return self._fit_table(X, y, callback)
        X, y = self._training_data(X, y)
        xt = self.fit_input_scaling(X, y=y)
        self.y_shift_, self.y_scale_ = float(y.mean()), (float(y.std()) if y.std() > 0 else 1.0)
        yt = self.tensor((y - self.y_shift_) / self.y_scale_)[:, None]
        self._fit_model(xt, yt, callback=callback)
        return self

    def _train_on_stream(self, xs, ys, stream, stats, callback=None) -> None:
        """The training of `fit_stream`: built from the sample (xs, ys), every stage trained on the whole table."""
        self._fit_model(xs, ys, sampler=lambda: stream(self.y_shift_, self.y_scale_), callback=callback)

    # predict / predict_quantiles come from SVGPRegressor; every chunk replays the seed and every row shares
    # the draws (common_noise), so a row's prediction does not depend on which rows are predicted with it
    def _model_predict(self, x):
        return self.model_.predict(x, self.num_samples_predict, self._generator(x.device), common_noise=True)

    def _model_quantiles(self, x, probs):
        return self.model_.predict_quantiles(x, probs, self.num_samples_predict, self._generator(x.device),
                                             common_noise=True)

    def _chunk_samples(self, quantiles: bool):
        return self.num_samples_predict

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike) -> np.ndarray:
        """Per-point log p(y* | x*) ≈ log-mean-exp over the samples, in the units of y."""
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        with torch.no_grad():
            lpd = self.predict_in_chunks(
                lambda x, y: self.model_.log_predictive_density(x, y, self.num_samples_predict,
                                                                self._generator(x.device), common_noise=True),
                [xt, yt], num_samples=self.num_samples_predict)
        return lpd[:, 0].cpu().numpy() - math.log(self.y_scale_)

    def elbo(self, X: ArrayLike, y: ArrayLike) -> float:
        """A Monte Carlo estimate (num_samples_predict samples) of the ELBO on (X, y) in the units of y."""
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        with torch.no_grad():
            value = self.model_.elbo(xt, yt, num_samples=self.num_samples_predict,
                                     generator=self._generator(xt.device)).item()
        return value - xt.shape[0] * math.log(self.y_scale_)

    def sample_f(self, X: ArrayLike, num_samples: int = 1, seed: int | None = None) -> np.ndarray:
        """Samples of the last layer's f at X (independent across points), [num_samples, n_samples]
        (`seed`: None for the fit's seed, or a seed as the `seed` parameter takes)."""
        xt = self.scaled_inputs(X)
        num_samples = positive_int(num_samples, "num_samples")
        with torch.no_grad():
            gen = self._generator(xt.device, seed)  # one stream across chunks: rows stay independent
            f = self.predict_in_chunks(lambda x: self.model_.sample_f(x, num_samples, generator=gen), [xt],
                                       num_samples=num_samples, dim=1)
        return f[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_

    def _extra_state(self) -> dict:
        return {"y_shift": self.y_shift_, "y_scale": self.y_scale_, **self._deep_state()}

    def _restore(self, state):
        self.y_shift_, self.y_scale_ = float(state["y_shift"]), float(state["y_scale"])
        self._restore_model(state)


class DeepGPClassifier(_DeepMixin, StreamedClassLabels, Estimator, ClassifierMixin, BaseEstimator):
    """Deep GP classification: probit (Bernoulli) for two classes, robust max (CNF-DGP §IV-B) or softmax otherwise.

    Labels may be any sortable values, mapped to 0..C-1 through `classes_`.

    Args:
        layers, posterior, num_samples_train, num_samples_predict, hidden_width: as in `DeepGPRegressor`.
        flow_steps, flow_base, flow_elementwise, dsvi_warmup, draws, base_gradient: as in `DeepGPRegressor`.
        flow_selection, flow_lr_scale, flow_rows, skip, image_shape: as in :class:`flowgp.DeepGPRegressor`.
        likelihood: "robustmax" (default) or "softmax" for more than two classes (two classes: the probit).
        num_inducing, kernel, lengthscale, period, kmeans_restarts, learn_inducing: as in `DeepGPRegressor`.
        quadrature_points, predict_quadrature_points: as in :class:`flowgp.DeepGPRegressor`.
        batch_size, epochs, lr, seed, dtype, device, verbose, checkpoint, compile: training, as in
            :class:`flowgp.SVGPRegressor`.
        threads: torch threads per call ("auto" or a positive integer), as in :class:`flowgp.SVGPRegressor`;
            "auto" sizes a step as layers x (batch x M² + M³).
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.

    See Also:
        :class:`flowgp.DeepGPRegressor`, :class:`flowgp.SVGPClassifier`.
    """

    def __init__(self, layers: int = 3, posterior: str = "gaussian", num_samples_train: int = 1,
                 num_samples_predict: int = 100, hidden_width: int | None = None, flow_steps: int = 2,
                 flow_base: str = "network", likelihood: str = "robustmax", num_inducing: int = DEFAULTS.num_inducing,
                 kernel: str = "rbf", batch_size: int | None = None, epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr,
                 seed: int = 0, dtype: str = "float64", device: str | torch.device = "cpu",
                 lengthscale: float = 1.0, period: float = 1.0, kmeans_restarts: int = DEFAULTS.kmeans_restarts,
                 learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points, predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
                 verbose: bool | str = "auto", checkpoint: str | os.PathLike | None = None,
                 flow_elementwise: str = "entry", dsvi_warmup: float = 0.0, skip: str = "linear",
                 image_shape: tuple[int, int, int] | None = None, draws: str | None = None,
                 compile: bool | str = False, base_gradient: str | None = None, flow_selection: bool = True,
                 flow_lr_scale: float = 0.1, flow_rows: int | None = FLOW_ROWS,
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    def _likelihood_name(self):
        if hasattr(self, "classes_") and len(self.classes_) == 2:
            return "bernoulli"
        return self.likelihood

    def _encode(self, y, n) -> torch.Tensor:
        """Class indices as a tensor: float [n, 1] in {0, 1} for two classes, int64 [n] otherwise."""
        y = check_labels(y, n)  # NaN/None labels say so, rather than "labels not seen in fit"
        idx = np.clip(np.searchsorted(self.classes_, y), 0, len(self.classes_) - 1)
        unknown = self.classes_[idx] != y
        if np.any(unknown):
            raise ValueError(f"y holds labels not seen in fit: {sorted(set(y[unknown].tolist()))[:5]}; "
                             f"known classes: {self.classes_.tolist()}")
        if len(self.classes_) == 2:
            return self.tensor(idx)[:, None]
        return torch.as_tensor(idx, dtype=torch.long, device=self.device)

    #: `fit` streams tables (paths, iterators of chunks) through Estimator.fit_stream (numeric labels)
    STREAMED_FIT = True

    def fit(self, X: ArrayLike | str | os.PathLike | Iterable, y: ArrayLike | str | int | None = None,
            callback: Callable | None = None) -> Self:
        """Fit on X [n_samples, n_features] and labels y [n_samples]; returns self. X may instead be a table
        streamed in chunks (see `fit_stream`; numeric labels, the classes from a full pass over the table).
        `callback(step, loss, model)` is passed to `flowgp.training.loop.train` (called after every step, e.g.
        to score the model on held-out data as it trains: `flowgp.bench.learning_curve.CurveRecorder`; a true
        value stops the fit; one with state_dict()/load_state_dict() has its state kept in the checkpoints)."""
        self._check_deep_params()
        if self.likelihood not in _CLASS_LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {_CLASS_LIKELIHOODS}, got {self.likelihood!r}")
        if is_table(X):
            return self._fit_table(X, y, callback)
        self.start_fit()
        fit_feature_names(self, X)
        X = as_2d_float(X)
        y = check_labels(y, X.shape[0])
        self.classes_ = training_classes(y)
        xt = self.fit_input_scaling(X, y=y)
        self._fit_model(xt, self._encode(y, X.shape[0]), callback=callback)
        return self

    def _train_on_stream(self, xs, ys, stream, stats, callback=None) -> None:
        """The training of `fit_stream`: built from the sample (xs, ys), every stage trained on the table."""
        self._fit_model(xs, ys, sampler=stream, callback=callback)

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities [n_samples, n_classes] averaged over `num_samples_predict` samples (in row chunks
        of bounded memory; every row shares the draws, so its probabilities do not depend on the other rows)."""
        xt = self.scaled_inputs(X)
        with torch.no_grad():
            probs = self._map_chunks(self._chunk_proba, [xt])
        return probs.cpu().numpy().astype(np.float64)

    def _map_chunks(self, function, tensors):
        # rows per chunk from the [S, rows, layer width + M] temporaries of propagating S samples (as regressors)
        layer_elements = inducing_row_elements(self.model_)
        itemsize = torch.empty((), dtype=self.torch_dtype()).element_size()
        rows = chunk_rows(int(self.num_samples_predict) * (layer_elements + 16), itemsize,
                          getattr(self, "predict_memory", None))
        return map_row_chunks(function, tensors, rows)

    def _chunk_proba(self, x):
        mean, var = self.model_.predict_f_samples(x, self.num_samples_predict, self._generator(x.device),
                                                  common_noise=True)
        lik = self.model_.likelihood
        if isinstance(lik, BernoulliLikelihood):
            p1 = lik.predictive_prob(mean, var).mean(0)[:, 0]
            return torch.stack([1 - p1, p1], -1)
        probs = lik.predictive_probs(mean, var).mean(0)
        # the robust max's class probabilities sum to one only up to its quadrature error (~1e-6)
        return probs / probs.sum(-1, keepdim=True)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most probable class label per row."""
        probs = self.predict_proba(X)  # first: an unfitted estimator says so (NotFittedError), not AttributeError
        return self.classes_[probs.argmax(1)]

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike) -> np.ndarray:
        """Per-point log p(y* | x*) (log-mean-exp over the samples)."""
        xt = self.scaled_inputs(X)
        yt = self._encode(y, xt.shape[0])
        with torch.no_grad():
            lpd = self._map_chunks(
                lambda x, y: self.model_.log_predictive_density(x, y, self.num_samples_predict,
                                                                self._generator(x.device), common_noise=True),
                [xt, yt])
        return lpd.reshape(xt.shape[0]).cpu().numpy()

    def elbo(self, X: ArrayLike, y: ArrayLike) -> float:
        """A Monte Carlo estimate of the ELBO on (X, y)."""
        xt = self.scaled_inputs(X)
        yt = self._encode(y, xt.shape[0])
        with torch.no_grad():
            return self.model_.elbo(xt, yt, num_samples=self.num_samples_predict,
                                    generator=self._generator(xt.device)).item()

    def _extra_state(self) -> dict:
        return {"classes": self.classes_.tolist(), **self._deep_state()}

    def _restore(self, state):
        self.classes_ = np.asarray(state["classes"])
        self._restore_model(state)
