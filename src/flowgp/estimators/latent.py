"""scikit-learn style latent-variable deep GP: a thin layer over `flowgp.models.latent.model`.

Inputs and targets are standardised as in the other estimators. Training maximises the importance-weighted
bound L_K (DGP-IWVI/DREG supplement eq. A.9) with the REG (C.17) or DREG (D.23) gradient for q(z), Adam with
the E.2 schedule; predictions draw z from the prior p(z) (supplement E.3) from a generator seeded with `seed`.
`objective="per-slot"` trains the DREG authors' published objective instead, which is not a bound
(`flowgp.models.latent.model`); its value is then reported as an objective, never as a bound.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math

import numpy as np
import torch

from ..gp.defaults import DEFAULTS
from ..training.batches import ArrayBatches
from ..build import LatentDeepGPConfig, build, resolve_dtype
from ..data.sources import is_table
from ..models.latent.encoders import ENCODER_SKIPS
from ..models.latent.diagnostics import gradient_snr
from ..models.latent.model import HIDDEN_LAYERS, check_gradient, check_num_importance, check_objective
from ..training.natural_gradients import NaturalGradient
from ..training.loop import step_lr, train
from .base import central_probabilities, positive_int
from .regression import SVGPRegressor
from .validation import check_parameters

if TYPE_CHECKING:  # names of the signatures' annotations only
    import os
    from collections.abc import Callable

    from numpy.typing import ArrayLike
    from typing_extensions import Self

__all__ = ["LatentDeepGPRegressor"]


class LatentDeepGPRegressor(SVGPRegressor):
    """Deep GP with a latent input z ~ N(0, I), trained by importance-weighted VI (multimodal predictives).

    Args:
        layers: number of GP layers (hidden layers have `hidden_width` GPs with a fixed PCA linear mean).
        latent_dim: dimension of z.
        num_importance: K importance samples per point.
        gradient: q(z)'s gradient estimator: "dreg" (doubly reparameterised, eq. D.23 through each slot's
            conditional given the other importance samples' hidden values; unbiased), "reg" (eq. C.17), or the
            ablations "dreg-eps" and "dreg-d23"; `flowgp.models.latent.model.GRADIENT_ESTIMATORS`.
        amortized: q(z_n) from the E.2 encoder network of (x_n, y_n) (True) or free per-point parameters.
        natgrad: natural-gradient steps on the last layer's q(u) (step `natgrad_lr`), Adam for the rest.
        natgrad_lr: the natural-gradient step size γ.
        hidden_width: GPs per hidden layer.
        num_inducing: M inducing points per layer (E.2: 128).
        kernel: kernel name of every layer (a string such as "rbf").
        batch_size: minibatch size (None: full batch).
        epochs: passes over the data (iterations = epochs × ceil(N / batch_size)).
        lr: Adam's step size (E.2: 0.005), decayed by `lr_decay` every 1000 iterations.
        lr_decay: the factor of that decay.
        seed, dtype, device, kmeans_restarts, learn_inducing, verbose: as in :class:`flowgp.SVGPRegressor`.
        num_samples_predict: samples of z ~ p(z) for predictions and test log-likelihoods (E.3: 10000, the
            default), drawn in chunks of bounded memory.
        noise: initial likelihood variance (E.2: 0.01).
        compile: False, True, a torch.compile mode name or "auto", as `flowgp.training.loop.train(compile=...)`
            documents; it pays off in long fits with small M (benchmarks/perf/step_time.py).
        threads: torch threads of `fit` and of every prediction, set for the call and restored after it: a
            positive integer, or "auto" (default): one thread when a step is too small to gain from more
            (`flowgp.training.threads.SMALL_STEP_WORK`), else the cores of this process shared with the other
            processes of the job (scikit-learn's `n_jobs`, torchrun) less the cores other processes keep busy.
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.
        checkpoint: a file path: training saves its state there and a later `fit` with the same path
            continues where it stopped (only the same fit: see SVGPRegressor).
        extend_checkpoint: with `checkpoint`, a file written with fewer `epochs` (finished or not) is carried on
            to `epochs` on the same trajectory, optimiser states included (`flowgp.training.loop.train(extend_budget=
            True)`): train longer without starting again. Otherwise such a file is refused.
        hidden_layer: "pca" (hidden_width GPs with a fixed PCA mean) or "concat" (supplement E.2: a fixed
            projection of hidden_width GPs added to the observed inputs, `ConcatProjectionLayer`).
        q_var_init, hidden_q_var_init: initial whitened S = value·I of the last / hidden layers (hidden None:
            q_var_init; the reference run script: 1 and 1e-10).
        learn_hidden_variance: train the hidden kernels' variances.
        encoder_skips: the q(z) network's skips, "dense" or "residual" (the DREG authors' code;
            `flowgp.models.latent.encoders.AmortizedLatentEncoder`).
        objective: what training maximises. "bound" (the default): L_K with the hidden layers drawn jointly over
            the K importance samples, a lower bound on log p(y). "per-slot": the DREG authors' published training
            objective (their Table 1), each slot's hidden values drawn from their own marginal; NOT a lower bound
            on log p(y): measured 0.9-1.5 nats above the valid bound on a 3-point problem and 0.43-0.60 nats per
            training point above it on power fits trained on it (docs/results/ldgp/table1-uci). `elbo` is
            always the bound; `training_objective` gives the value of the objective trained.

    See Also:
        :class:`flowgp.models.latent.LatentDeepGP` (the model), :class:`flowgp.DeepGPRegressor` (without z).

    Examples:
        >>> from flowgp import LatentDeepGPRegressor
        >>> from flowgp.data.synthetic import make_multimodal_demo
        >>> X, y, mode = make_multimodal_demo(num_points=200, seed=0)
        >>> est = LatentDeepGPRegressor(num_inducing=10, epochs=5, num_samples_predict=50, verbose=False)
        >>> est.fit(X, y).sample_y(X[:4], n_samples=3).shape
        (4, 3)
    """

    def __init__(self, layers: int = 2, latent_dim: int = 1, num_importance: int = 5, gradient: str = "dreg",
                 amortized: bool = True, natgrad: bool = False, hidden_width: int | None = 5,
                 num_inducing: int = 128, kernel: str = "rbf", batch_size: int | None = None,
                 epochs: int = DEFAULTS.epochs, lr: float = 0.005, lr_decay: float = 0.98, natgrad_lr: float = 0.01,
                 seed: int = 0, dtype: str = "float64", device: str | torch.device = "cpu", noise: float = 0.01,
                 kmeans_restarts: int = DEFAULTS.kmeans_restarts, learn_inducing: bool = True, num_samples_predict: int = 10000,
                 verbose: bool | str = "auto", checkpoint: str | os.PathLike | None = None,
                 hidden_layer: str = "pca", q_var_init: float = 1e-5, hidden_q_var_init: float | None = None,
                 learn_hidden_variance: bool = True, compile: bool | str = False, extend_checkpoint: bool = False,
                 encoder_skips: str = "dense", objective: str = "bound",
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    # ----- checks and construction ---------------------------------------------------------------------
    def _check_params(self):
        check_parameters(self)  # every parameter's own rule first
        positive_int(self.layers, "layers")
        if isinstance(self.latent_dim, bool) or not isinstance(self.latent_dim, (int, np.integer)):
            raise TypeError(f"latent_dim must be an int, got {type(self.latent_dim).__name__}")
        if self.latent_dim < 1:
            raise ValueError(f"latent_dim must be >= 1 (the latent input's dimension), got {self.latent_dim}")
        check_num_importance(int(self.num_importance) if isinstance(self.num_importance, np.integer)
                             else self.num_importance)
        check_gradient(self.gradient)
        check_objective(self.objective)
        for name in ("hidden_width", "num_inducing", "num_samples_predict"):
            positive_int(getattr(self, name), name)
        if self.hidden_layer not in HIDDEN_LAYERS:
            raise ValueError(f"hidden_layer must be one of {HIDDEN_LAYERS}, got {self.hidden_layer!r}")
        if self.encoder_skips not in ENCODER_SKIPS:
            raise ValueError(f"encoder_skips must be one of {ENCODER_SKIPS}, got {self.encoder_skips!r}")
        if not isinstance(self.kernel, str):
            raise TypeError(f"kernel must be a kernel name such as 'rbf', got {type(self.kernel).__name__}")
        resolve_dtype(self.dtype)
        if not isinstance(self.epochs, (int, np.integer)) or self.epochs < 0:
            raise ValueError(f"epochs must be a non-negative integer, got {self.epochs!r}")

    def config(self, **overrides) -> LatentDeepGPConfig:
        """The `flowgp.build.LatentDeepGPConfig` of this estimator's model (fields in `overrides` replaced)."""
        config = LatentDeepGPConfig(
            layers=int(self.layers), latent_dim=int(self.latent_dim), num_inducing=int(self.num_inducing),
            amortized=bool(self.amortized), hidden_width=int(self.hidden_width), kernel=self.kernel,
            noise=self.noise, num_importance=int(self.num_importance), gradient=self.gradient,
            learn_inducing=self.learn_inducing, kmeans_restarts=self.kmeans_restarts,
            hidden_layer=self.hidden_layer, q_var_init=float(self.q_var_init),
            hidden_q_var_init=None if self.hidden_q_var_init is None else float(self.hidden_q_var_init),
            learn_hidden_variance=bool(self.learn_hidden_variance), encoder_skips=self.encoder_skips,
            objective=self.objective)
        return dataclasses.replace(config, **overrides)

    def _build(self, x, y=None, **overrides):
        return build(self.config(**overrides), x, y, dtype=self.torch_dtype(), device=self.device,
                     generator=self.generator(device="cpu"))

    def _generator(self, device, seed=None):
        return self.generator(seed, device)

    def _train(self, xt, yt, callback=None, stream=None, num_rows=None):
        """The importance-weighted fit of supplement E.2: Adam (and natural-gradient steps on the last layer's
        q(u) with natgrad=True), every step size decayed by lr_decay every 1000 iterations, each iteration a
        fresh random subset of the rows (from a streamed table: `stream`, a sampler of `num_rows` rows read
        block by block, for the same number of iterations)."""
        n = xt.shape[0] if stream is None else int(num_rows)
        batch = n if self.batch_size is None else min(positive_int(self.batch_size, "batch_size"), n)
        iterations = int(self.epochs) * math.ceil(n / batch)
        natgrad = NaturalGradient([self.model_.layers[-1].gp], lr=self.natgrad_lr) if self.natgrad else None
        sampler = ArrayBatches(xt, yt, batch, per_step=batch < n, seed=self.seed_) if stream is None else stream
        return train(self.model_, sampler, steps=iterations, lr=self.lr, schedule=step_lr(1000, self.lr_decay),
                     natural_gradient=natgrad, seed=self.seed_, verbose=self.verbose, compile=self.compile,
                     desc=type(self).__name__ + ("" if self.objective == "bound" else f" ({self.objective} objective)"),
                     checkpoint_path=self.checkpoint_path(), extend_budget=self.extend_checkpoint,
                     callback=callback)

    # ----- public API --------------------------------------------------------------------------------
    #: `fit` streams tables (paths, iterators of chunks) through Estimator.fit_stream (amortised q(z) only)
    STREAMED_FIT = True

    def fit(self, X: ArrayLike, y: ArrayLike | None = None, callback: Callable | None = None) -> Self:
        """Fit on X [n_samples, n_features] and y [n_samples]; returns self.

        `callback(step, loss, model)` is passed to `flowgp.training.loop.train` (called after every iteration, a
        truthy return stops training), e.g. to record a learning curve (benchmarks/studies/ldgp_learning_curve.py).
        X may instead be a table streamed in chunks (see `fit_stream`; the amortised q(z) only: free per-row
        q(z_n) parameters grow with the rows): built from a reservoir sample, trained block by block.
        """
        self._check_params()
        if is_table(X):
            if not self.amortized:
                raise ValueError("amortized: a streamed fit needs the amortised q(z) (the encoder of (x, y)); with "
                                 "amortized=False every row keeps its own q(z_n) in memory - pass arrays")
            return self.fit_stream(X, y, callback=callback)
        X, y = self._training_data(X, y)
        xt = self.fit_input_scaling(X, y=y)
        self.y_shift_, self.y_scale_ = float(y.mean()), (float(y.std()) if y.std() > 0 else 1.0)
        yt = self.tensor((y - self.y_shift_) / self.y_scale_)[:, None]
        self.model_ = self._build(xt, yt)
        self.history_ = self._train(xt, yt, callback)
        return self

    def _train_on_stream(self, xs, ys, stream, stats, callback=None) -> None:
        """The training of `fit_stream`: built from the sample (xs, ys), trained on the whole table."""
        self.model_ = self._build(xs, ys)
        self.history_ = self._train(xs, ys, callback, stream=stream(self.y_shift_, self.y_scale_),
                                    num_rows=stats.num_rows)

    # predict (the mean of the multimodal predictive over `num_samples_predict` z ~ p(z), and its std) and
    # predict_quantiles (of the predictive Gaussian mixture) come from SVGPRegressor
    def _model_predict(self, x):
        return self.model_.predict(x, int(self.num_samples_predict), self._generator(x.device), common_noise=True)

    def _model_quantiles(self, x, probs):
        return self.model_.predict_quantiles(x, probs, int(self.num_samples_predict), self._generator(x.device),
                                             common_noise=True)

    def _chunk_samples(self, quantiles: bool):
        # the model's predict sums over bounded chunks of samples itself; its quantiles hold all samples
        return int(self.num_samples_predict) if quantiles else 1

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike, num_samples: int | None = None) -> np.ndarray:
        """Per-point log p(y* | x*) (supplement E.3: z ~ p(z), log of the mean likelihood by log-sum-exp),
        in the units of y; `num_samples` defaults to `num_samples_predict`."""
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        s = int(self.num_samples_predict) if num_samples is None else positive_int(num_samples, "num_samples")
        with torch.no_grad():
            lpd = self.predict_in_chunks(
                lambda x, y: self.model_.log_predictive_density(x, y, s, self._generator(x.device),
                                                                common_noise=True), [xt, yt],
                num_samples=s)
        return lpd.cpu().numpy() - math.log(self.y_scale_)

    def predictive_summary(self, X: ArrayLike, y: ArrayLike, level: float = 0.95) -> dict:
        """SVGPRegressor.predictive_summary from one set of `num_samples_predict` draws of z per point
        (`LatentDeepGP.predictive_summary`; the three separate calls draw them three times: power's 957 test
        points with 10 000 draws take about 100 s each on one core), plus "log_density_kde": the IWVI authors'
        public script's KDE estimate of log p(y* | x*) from one draw of y per z (units of y)."""
        probs = list(central_probabilities(level))
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        s = int(self.num_samples_predict)

        def one_chunk(x, y):
            out = self.model_.predictive_summary(x, y, probs, s, self._generator(x.device), common_noise=True)
            return out["log_density"], out["log_density_kde"], out["mean"], out["quantiles"][0], out["quantiles"][1]

        lpd, kde, mean, lower, upper = self.predict_in_chunks(one_chunk, [xt, yt], num_probs=2, num_samples=s)
        q = self._quantiles_in_target_units(torch.stack([lower, upper]))
        log_scale = math.log(self.y_scale_)
        return {"log_density": lpd.cpu().numpy() - log_scale, "mean": self._in_target_units(mean),
                "lower": q[0], "upper": q[1], "log_density_kde": kde.cpu().numpy() - log_scale}

    def elbo(self, X: ArrayLike, y: ArrayLike, num_importance: int | None = None) -> float:
        """An estimate of the importance-weighted bound L_K on (X, y) in the units of y (K defaults to the
        estimator's num_importance; X must be the training inputs when q(z) is free per point). The bound (joint
        draws) whatever `objective` the model was trained on."""
        return self._objective_value(X, y, num_importance, "elbo")

    def training_objective(self, X, y, num_importance=None):
        """An estimate of the objective this estimator trains (`objective`) on (X, y), in the units of y: `elbo`
        for "bound", the DREG authors' per-slot objective (not a bound) for "per-slot"."""
        return self._objective_value(X, y, num_importance, "training_objective")

    def _objective_value(self, X, y, num_importance, method: str) -> float:
        xt = self.scaled_inputs(X)  # checks that the estimator is fitted
        objective = getattr(self.model_, method)
        yt = self.scaled_targets(y, xt.shape[0])
        k = int(self.num_importance) if num_importance is None else num_importance
        with torch.no_grad():
            value = objective(xt, yt, num_importance=k, generator=self._generator(xt.device)).item()
        return value - xt.shape[0] * math.log(self.y_scale_)

    def gradient_snr(self, X, y, num_importance: int, gradient: str, **options):
        """SNR of the q(z) gradient estimator on data in its own units (supplement E.3, Figs. 1 and 3): the
        fitted model's `flowgp.models.latent.diagnostics.gradient_snr` on X, y scaled as in training; `options`
        are that function's (`repeats`, `points`, `seed`, `return_details`)."""
        return gradient_snr(self.model_, self.scaled_inputs(X), self.scaled_targets(y, len(X)), num_importance,
                            gradient, **options)

    def sample_f(self, X: ArrayLike, num_samples: int = 1, seed: int | None = None) -> np.ndarray:
        """Samples of the last layer's latent function at X with z ~ p(z), [num_samples, n_samples]."""
        xt = self.scaled_inputs(X)
        with torch.no_grad():
            s = positive_int(num_samples, "num_samples")
            gen = self._generator(xt.device, seed)  # one stream across chunks: rows stay independent

            def draw(x):
                return torch.cat([m + v.sqrt() * torch.randn(m.shape, dtype=m.dtype, device=m.device, generator=gen)
                                  for m, v in self.model_.prior_marginals(x, s, gen)], 0)

            f = self.predict_in_chunks(draw, [xt], num_samples=s, dim=1)
        return f[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_

    def _extra_state(self) -> dict:
        return {"y_shift": self.y_shift_, "y_scale": self.y_scale_,
                "num_inducing_fitted": self.model_.layers[0].num_inducing,
                "num_data": 0 if self.model_.amortized else self.model_.qz.num_data}

    def _restore(self, state):
        self.y_shift_, self.y_scale_ = float(state["y_shift"]), float(state["y_scale"])
        # rebuild the structure from placeholder data (k-means of distinct random rows gives exactly M
        # centres; free q(z) needs the training-set size), then load the saved weights over it
        m = int(state["num_inducing_fitted"])
        n = int(state["num_data"]) if state["num_data"] else max(m, 2)
        gen = torch.Generator().manual_seed(0)
        xt = torch.randn((n, self.n_features_in_), generator=gen, dtype=torch.float64)
        yt = torch.randn((n, 1), generator=gen, dtype=torch.float64)
        self.model_ = self._build(xt, yt, num_inducing=m, kmeans_restarts=1)
