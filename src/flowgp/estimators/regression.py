"""scikit-learn style estimators: thin layers over the models in `flowgp.models` and `flowgp.training.loop`.

They standardise inputs, standardise targets where the flow allows it (only rescale them where the
flow's range or domain is the positive half-line, which a shift would break), train with Adam and
undo the scaling on every output.

The flow estimators (`TGPRegressor`, `WarpedGPRegressor`) fit robustly by default (`robust=True`,
`RobustFit`): a TGP with the identity flow is the SVGP, so the best TGP is never worse than the best SVGP on
its own bound, but a TGP trained from scratch often ends in a worse optimum (the flow compresses the data
while the GP keeps a long lengthscale and a large noise; docs/results/tgp/robust-fit). The robust fit therefore
fits the SVGP first, starts the flow model exactly there (`flowgp.training.initialisation.warm_start_from_svgp`),
refines the flow with the GP held, trains everything jointly until the bound's plateau, keeps the best state
by the full-data bound, and warns (`BoundBelowSVGPWarning`) if the result still ends below the SVGP's bound.
After such a fit `fit_report_` holds the bound per point after every stage and `svgp_` the SVGP stage's model
(in the SVGP's own standardised units).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
import math
import time

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin

from ..gp.defaults import DEFAULTS
from ..build import SparseGPConfig, build
from ..flows import Flow, make_flow
from ..flows.conditional import static_flow, warping_curves
from ..data.sources import is_table
from ..training.natural_gradients import NaturalGradient
from ..training.early_stop import default_plateau
from ..training.loop import EarlyStop, train
from .base import (Estimator, InputDependentFlowOptions, as_1d_float, as_2d_float, central_probabilities,
                   positive_int)
from .features import fit_feature_names
from .chunking import PREDICT_MEMORY_BYTES, chunk_rows, inducing_row_elements, map_row_chunks
from ..training.initialisation import (init_from_data, init_identity, init_input_dependent, init_random,
                              warm_start_from_svgp)
from .sampling import predictive_draws
from .robust import BestState, BoundBelowSVGPWarning, FitRows, RobustFit, resolve_robust, warn_below_svgp

if TYPE_CHECKING:  # names of the signatures' annotations only
    import os
    from collections.abc import Iterable

    from numpy.typing import ArrayLike
    from typing_extensions import Self

    from ..gp.kernels import Kernel

__all__ = ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "RobustFit", "BoundBelowSVGPWarning",
           "summary_from_predictions"]


def summary_from_predictions(est, X, y, level=0.95) -> dict:
    """SVGPRegressor.predictive_summary's dict from any regressor with predict_interval, log_predictive_density
    and predict (three calls; what the bench scores a regressor without its own predictive_summary by)."""
    lower, upper = est.predict_interval(X, level)
    return {"log_density": est.log_predictive_density(X, y), "mean": est.predict(X), "lower": lower,
            "upper": upper}

#: weight per data point of the robust fit's anchor of the flow refinement at its start (see `_refine_flow`)
REFINE_ANCHOR = 1e-6


class SVGPRegressor(Estimator, RegressorMixin, BaseEstimator):
    """Sparse variational GP regression (Hensman et al. 2013) with a scikit-learn interface.

    Args:
        num_inducing: M, inducing inputs initialised by k-means (best of `kmeans_restarts`).
        kernel: kernel spec, e.g. "rbf", "matern32", "periodic", "rbf+linear" (`flowgp.make_kernel`), or a Kernel.
        batch_size: minibatch size (None: full batch).
        epochs: the training budget in passes over the data.
        lr: Adam's step size.
        seed: controls k-means, flow initialisation and minibatch order (fits are reproducible): an int in
            [0, 2**32 - 1], None (a fresh seed for every fit) or a NumPy Generator / RandomState (scikit-learn's
            `random_state`); the integer seed a fit used is `seed_`, and `save()` records it.
        dtype: "float64" (default) or "float32".
        device: "cpu" (default), "cuda" or a torch.device.
        noise: initial Gaussian noise variance (standardised units; appendix B.6 uses 0.05).
        lengthscale, period: initial kernel hyperparameters (standardised inputs).
        fix_noise_fraction: hold the noise fixed for this fraction of iterations (appendix B.5).
        kmeans_restarts: k-means runs from different starts for the inducing inputs; the best is kept.
        learn_inducing: train the inducing inputs Z (True) or keep them at their k-means positions.
        quadrature_points, predict_quadrature_points: Gauss-Hermite points in training / prediction (used where a
            likelihood has no closed form: the flow estimators' expectations over f₀).
        verbose: progress bar: "auto" (default: only in an interactive terminal, never inside scikit-learn's
            meta-estimators or joblib workers; `flowgp.reporting.progress.show_progress`), True or False.
        compile: False, True, a torch.compile mode name or "auto", as `flowgp.training.loop.train(compile=...)`
            documents; it pays off in long fits with small M (benchmarks/perf/step_time.py).
        threads: torch threads of `fit` and of every prediction, set for the call and restored after it: a
            positive integer, or "auto" (default): one thread when a step is too small to gain from more
            (`flowgp.training.threads.SMALL_STEP_WORK`), else the cores of this process shared with the other
            processes of the job (scikit-learn's `n_jobs`, torchrun) less the cores other processes keep busy.
        shard_reads: how the processes of a data-parallel run (torchrun, `flowgp fit --nproc`) read a table that
            `fit_stream` (or `fit` given a table) streams: "auto" (default) or True, each process reads only its
            share of the blocks (1/W of the reading per process, the same sampler law, other minibatch draws than
            one process's); False (exact mode, for debugging), every process reads the whole table and the fit
            reproduces one process to rounding. `fit_stream(shard_reads=...)` given True or False wins over it for
            that fit. Arrays in memory are always split from one process's batches. `save` records it; files
            saved before it load with "auto", the behaviour they were fitted with.
        checkpoint: a file path: training saves its state there and a later `fit` with the same path
            continues where it stopped (a finished fit is loaded back without training). Only the same fit
            resumes it (same data, parameters, class, flowgp version): a file written by another fit is a
            ValueError naming what differs. `save` does not record it (the loaded estimator has None).
        natural_gradient: "auto" (default), a step size γ in (0, 1] of natural-gradient steps on q(u)
            (`flowgp.training.natural_gradients.NaturalGradient`, Salimbeni et al. 2018, eq. 8) with Adam on the
            rest, or None: Adam on everything. "auto" takes γ = 1 in full batch (the Gaussian likelihood is
            conjugate: one step puts q(u) at its optimum for the current hyperparameters, Titsias 2009) and
            γ = 0.1 in minibatches (γ = 1 would jump to each batch's optimum); `flowgp.gp.defaults.DEFAULTS`
            holds both. Adam alone is slow to fit q(u): measured in
            benchmarks/studies/svgp_natgrad_time_to_bound.py; at M = 595 on the air-quality folds 1 500 Adam
            epochs end 0.2-0.3 nats per point below 750 epochs with γ = 1
            (docs/results/tgp/robust-fit/README.md, section 7).
        early_stop: "auto" (default), a `flowgp.training.loop.EarlyStop`, or None (train all `epochs`). "auto" is
            `flowgp.training.early_stop.default_plateau()`: the fit has stopped moving, and ends, once the best
            epoch's training loss per point (the epoch's mean negative bound per data point) improved by at most
            DEFAULTS.plateau_tol = 0.001 nats over the last DEFAULTS.plateau_window = 50 epochs (the first window
            sets the reference, so a fit runs at least 100 epochs or all of `epochs`); `epochs` is the cap. The
            robust fit of the flow estimators applies it to its SVGP stage and, unless `RobustFit.plateau` says
            otherwise, to its flow stage.

    After a fit `n_iter_` is the number of epochs trained (fewer than `epochs` when the plateau stop ended it;
    a robust fit counts both its stages) and `history_` the training loss per point after each epoch.

    See Also:
        :class:`flowgp.TGPRegressor` (a flow on the GP's output), :meth:`flowgp.estimators.Estimator.summary`.

    Examples:
        >>> import numpy as np
        >>> from flowgp import SVGPRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-3, 3, (200, 1))
        >>> y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(200)
        >>> est = SVGPRegressor(num_inducing=10, epochs=100, verbose=False).fit(X, y)
        >>> est.predict(X[:3]).shape
        (3,)
        >>> lower, upper = est.predict_interval(X[:3], level=0.95)
    """

    def __init__(self, num_inducing: int = DEFAULTS.num_inducing, kernel: str | Kernel = "rbf", batch_size: int | None = None,
                 epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr, seed: int = 0, dtype: str = "float64",
                 device: str | torch.device = "cpu", noise: float = DEFAULTS.noise, lengthscale: float = 1.0,
                 period: float = 1.0, fix_noise_fraction: float = 0.0, kmeans_restarts: int = DEFAULTS.kmeans_restarts,
                 learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points, predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
                 verbose: bool | str = "auto", checkpoint: str | os.PathLike | None = None,
                 natural_gradient: float | str | None = "auto", compile: bool | str = False,
                 early_stop: str | EarlyStop | None = "auto", threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    #: working-memory budget (bytes) of one prediction call: rows are predicted in chunks that fit in it
    #: (set it on an instance to trade speed for memory; predictions do not depend on it for these models)
    predict_memory = PREDICT_MEMORY_BYTES

    # ----- hooks the flow estimators override -------------------------------------------------------
    _MODEL = "svgp"

    def _target_positive(self) -> bool:
        """Whether targets may only be rescaled (never shifted)."""
        return False

    def _check_targets(self, y: np.ndarray) -> None:
        pass

    def _initialise_flow(self, model, y_t, generator, x_t=None) -> None:
        pass

    def config(self, **overrides) -> SparseGPConfig:
        """The `flowgp.build.SparseGPConfig` of this estimator's model (fields in `overrides` replaced)."""
        config = SparseGPConfig(
            model=self._MODEL, num_inducing=self.num_inducing, kernel=self.kernel, lengthscale=self.lengthscale,
            period=self.period, noise=self.noise, flow=getattr(self, "flow", "identity"),
            input_dependent=self._input_dependence(), learn_inducing=self.learn_inducing,
            quadrature_points=self.quadrature_points, predict_quadrature_points=self.predict_quadrature_points,
            mc_samples_train=getattr(self, "mc_samples_train", 1),
            mc_samples_predict=getattr(self, "mc_samples_predict", 100), kmeans_restarts=self.kmeans_restarts)
        return dataclasses.replace(config, **overrides)

    def _input_dependence(self):
        return None

    # ----- helpers -----------------------------------------------------------------------------------
    def scaled_targets(self, y, n=None) -> torch.Tensor:
        """y [n] checked and standardised as in training: the model's targets [n, 1] (`n`: the expected
        number of rows, e.g. X's)."""
        self.check_fitted()
        y = as_1d_float(y, (np.shape(y)[0] if np.ndim(y) else 0) if n is None else n)
        self._check_targets(y)
        return self.tensor((y - self.y_shift_) / self.y_scale_)[:, None]

    def _build(self, x, y=None, **overrides):
        return build(self.config(**overrides), x, y, dtype=self.torch_dtype(), device=self.device,
                     generator=self.generator(device="cpu"))

    def _training_data(self, X, y):
        """(X, y) checked as arrays, after the parameters (`start_fit`); X's column names kept (`features`)."""
        self.start_fit()
        fit_feature_names(self, X)
        X = as_2d_float(X)
        y = as_1d_float(y, X.shape[0])
        if X.shape[0] < 2:
            raise ValueError(f"need at least 2 training points, got n_samples = {X.shape[0]}")
        return X, y

    def _in_target_units(self, mean, var=None):
        """Model-space predictive mean [N, 1] (and variance) back in the units of y, as numpy arrays."""
        mean = self._finite(mean[:, 0].cpu().numpy() * self.y_scale_ + self.y_shift_, "mean")
        if var is None:
            return mean
        return mean, self._finite(np.sqrt(var[:, 0].cpu().numpy()) * self.y_scale_, "standard deviation")

    def _quantiles_in_target_units(self, q):
        return self._finite(q[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_, "quantiles")

    def _finite(self, values: np.ndarray, what: str) -> np.ndarray:
        """`values`, or a FloatingPointError naming the cause instead of NaN or inf predictions."""
        bad = ~np.isfinite(values)
        if bad.any():
            raise FloatingPointError(
                f"{type(self).__name__} predicted a non-finite {what} for {int(bad.sum())} of {bad.size} values: "
                f"the fitted model is numerically degenerate. With a warping this is usually a fit to targets with "
                f"few distinct values (the warped likelihood grows without bound as the warping becomes a step); "
                f"fit SVGPRegressor or TGPRegressor, or a classifier for labels")
        return values

    def prediction_row_elements(self, num_probs: int = 1, num_samples: int | None = None) -> int:
        """A generous estimate of the floats one row of a prediction holds at once: per sample (Monte Carlo
        draws of hidden layers or flow weights; `num_samples` None: the estimator's own) the projections onto
        every layer's M inducing inputs and the quadrature or mixture grid of `num_probs` quantiles."""
        if num_samples is None:
            num_samples = int(getattr(self, "mc_samples_predict", 1)) if self._input_dependence() is not None else 1
        layer_elements = inducing_row_elements(self.model_)
        # the quantile solver holds a CDF and a density tensor per probability
        grid = int(getattr(self, "predict_quadrature_points", 1) or 1) * (2 * int(num_probs) + 1)
        return int(num_samples) * (layer_elements + grid + 16)

    def predict_in_chunks(self, function, tensors, num_probs: int = 1, num_samples: int | None = None, dim: int = 0):
        """function(*chunk) over chunks of rows sized from `predict_memory`, outputs concatenated along `dim`
        (see `flowgp.estimators.chunking`)."""
        itemsize = torch.empty((), dtype=self.torch_dtype()).element_size()
        rows = chunk_rows(self.prediction_row_elements(num_probs, num_samples), itemsize, self.predict_memory)
        return map_row_chunks(function, tensors, rows, dim)

    # ----- public API --------------------------------------------------------------------------------
    #: `fit` streams tables (paths, iterators of chunks) through Estimator.fit_stream
    STREAMED_FIT = True

    def fit(self, X: ArrayLike | str | os.PathLike | Iterable, y: ArrayLike | str | int | None = None) -> Self:
        """Fit on X [n_samples, n_features] and y [n_samples]; returns self. X may instead be a table streamed in
        chunks - a path (.csv, .parquet, .npy) with y the target column, or an iterator of (X, y) chunks with y
        None - see `fit_stream`."""
        if is_table(X):
            return self.fit_stream(X, y)
        X, y = self._training_data(X, y)
        self._check_targets(y)
        xt = self.fit_input_scaling(X, y=y)
        y_std = float(y.std()) if y.std() > 0 else 1.0
        if self._target_positive():
            self.y_shift_, self.y_scale_ = 0.0, y_std
        else:
            self.y_shift_, self.y_scale_ = float(y.mean()), y_std
        yt = self.tensor((y - self.y_shift_) / self.y_scale_)[:, None]
        self.torch_dtype()  # a bad dtype fails here, before any work
        self.resolved_natural_gradient(X.shape[0])  # and a bad natural_gradient
        options = self._robust_options()
        if options is not None:
            rows = FitRows(xt, yt, xt.shape[0], float(y.mean()), (float(y.min()), float(y.max())))
            return self._robust_fit(rows, options)
        self.model_ = self._build(xt, yt)
        self._initialise_flow(self.model_, yt, self.generator(device="cpu"), x_t=xt)
        self.history_ = train(self.model_, xt, yt, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                              fix_noise_fraction=self.fix_noise_fraction, seed=self.seed_, verbose=self.verbose,
                              compile=self.compile, desc=type(self).__name__, checkpoint_path=self.checkpoint_path(),
                              natural_gradient=self._natural_gradient(xt.shape[0]), early_stop=self._early_stop())
        self.n_iter_ = len(self.history_)
        return self

    def _train_on_stream(self, xs, ys, stream, stats, callback=None) -> None:
        """The training of `fit_stream`: the model built and initialised from the sample (xs, ys), then trained
        on the whole table through `stream(shift, scale)` (a flowgp.training.batches sampler); `stats` is the scan's
        summary (flowgp.data.sources.scan); `callback(step, loss, model)` goes to the training loop."""
        self.model_ = self._build(xs, ys)
        self._initialise_flow(self.model_, ys, self.generator(device="cpu"), x_t=xs)
        self.history_ = train(self.model_, stream(self.y_shift_, self.y_scale_), epochs=self.epochs, lr=self.lr,
                              fix_noise_fraction=self.fix_noise_fraction, seed=self.seed_, verbose=self.verbose,
                              compile=self.compile, desc=type(self).__name__, checkpoint_path=self.checkpoint_path(),
                              natural_gradient=self._natural_gradient(int(stats.num_rows)),
                              early_stop=self._early_stop(), callback=callback)
        self.n_iter_ = len(self.history_)

    def _natural_gradient(self, num_rows: int):
        """The NaturalGradient on q(u) of a plain fit (`resolved_natural_gradient`), or None (the flow estimators
        have no such parameter: their robust fit sets its own)."""
        gamma, anneal = self.resolved_natural_gradient(num_rows)
        if gamma is None:
            return None
        return NaturalGradient([self.model_.gp], lr=gamma, anneal=anneal)

    def resolved_natural_gradient(self, num_rows: int) -> tuple[float | None, bool]:
        """(γ, anneal): the natural-gradient steps on q(u) of a plain fit on `num_rows` rows, from
        `natural_gradient` checked: (None, False) for Adam alone; a number: (it, False); "auto": in full batch
        (DEFAULTS.natural_gradient_full_batch, False), in minibatches (DEFAULTS.natural_gradient_minibatch, True),
        the steps annealed as `flowgp.training.natural_gradients.NaturalGradient(anneal=True)` does,
        γ_t = max(γ, 1/(t+1)). The one place this decision is made (the fit and benchmarks/perf read it here).

        Args:
            num_rows: the training rows (with `batch_size` they say whether the fit is full batch).
        """
        gamma = getattr(self, "natural_gradient", self._plain_natural_gradient())
        if gamma is None:
            return None, False
        if isinstance(gamma, str) and gamma == "auto":
            if self.batch_size is None or int(self.batch_size) >= int(num_rows):
                return DEFAULTS.natural_gradient_full_batch, False
            # minibatches start from the running average of the batches' optima: a constant γ = 0.1 leaves q(u)
            # near the prior for its first ~20 steps while Adam already moves the hyperparameters, which a short
            # fit never recovers from (60 steps of 100 of 400 rows: RMSE 0.45 against 0.05 with Adam alone or
            # γ = 1). The flow estimators' plain fit of an identity flow (`_plain_natural_gradient`) anneals too:
            # it is the SVGP and fits as SVGPRegressor does
            return DEFAULTS.natural_gradient_minibatch, True
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.integer, np.floating)) \
                or not 0 < gamma <= 1:
            raise ValueError(f"natural_gradient must be 'auto', None or a step size in (0, 1], got {gamma!r}")
        return float(gamma), False

    def _plain_natural_gradient(self):
        """`natural_gradient` of estimators without the parameter (the flow estimators' plain fits): None."""
        return None

    def _early_stop(self):
        """The EarlyStop of a plain fit (`early_stop`): "auto" is the library's plateau rule, None none."""
        rule = getattr(self, "early_stop", None)
        if isinstance(rule, str) and rule == "auto":
            return default_plateau()
        if rule is None or isinstance(rule, EarlyStop):
            return rule
        raise TypeError(f"early_stop must be 'auto', None or a flowgp.training.loop.EarlyStop, got {rule!r}")

    def _robust_options(self):
        """The RobustFit of this fit, None for a plain one (the SVGP is fitted plainly)."""
        return None

    def predict(self, X: ArrayLike, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean of y* (and its standard deviation with return_std=True)."""
        xt = self.scaled_inputs(X)
        with torch.no_grad():
            mean, var = self.predict_in_chunks(self._model_predict, [xt], num_samples=self._chunk_samples(False))
        return self._in_target_units(mean, var if return_std else None)

    def predict_quantiles(self, X: ArrayLike, probs: ArrayLike) -> np.ndarray:
        """Predictive quantiles of y*, array [len(probs), n_samples]."""
        xt = self.scaled_inputs(X)
        probs = list(np.atleast_1d(probs))
        with torch.no_grad():
            q = self.predict_in_chunks(lambda x: self._model_quantiles(x, probs), [xt], num_probs=len(probs),
                                       num_samples=self._chunk_samples(True), dim=1)
        return self._quantiles_in_target_units(q)

    # the model calls behind predict / predict_quantiles on one chunk of rows (the deep families override them)
    def _model_predict(self, x):
        return self.model_.predict(x, generator=self.generator(device=x.device))

    def _model_quantiles(self, x, probs):
        return self.model_.predict_quantiles(x, probs, generator=self.generator(device=x.device))

    def _chunk_samples(self, quantiles: bool):
        """Monte Carlo samples per row held at once in a chunk (None: deterministic predictions)."""
        return None

    def predict_interval(self, X: ArrayLike, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval (lower, upper) holding `level` of the predictive mass."""
        q = self.predict_quantiles(X, list(central_probabilities(level)))
        return q[0], q[1]

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike) -> np.ndarray:
        """Per-point log p(y* | x*) in the units of y (the target scaling's Jacobian is accounted for)."""
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        with torch.no_grad():
            lpd = self.predict_in_chunks(
                lambda x, y: self.model_.log_predictive_density(x, y, generator=self.generator(device=x.device)),
                [xt, yt])
        return lpd[:, 0].cpu().numpy() - math.log(self.y_scale_)

    def predictive_summary(self, X: ArrayLike, y: ArrayLike, level: float = 0.95) -> dict:
        """What the test scores need, in one call: a dict of arrays [n_samples] in the units of y,
        "log_density" (log p(y* | x*)), "mean" (the predictive mean), "lower" and "upper" (the central interval
        holding `level` of the predictive mass); a family may add entries.

        Here it is the three calls log_predictive_density, predict and predict_interval
        (`summary_from_predictions`); families whose predictive is a Monte Carlo mixture draw it once for all of
        them (LatentDeepGPRegressor)."""
        return summary_from_predictions(self, X, y, level)

    def elbo(self, X: ArrayLike, y: ArrayLike) -> float:
        """The ELBO on (X, y) in the units of y (a lower bound on log p(y))."""
        xt = self.scaled_inputs(X)
        yt = self.scaled_targets(y, xt.shape[0])
        with torch.no_grad():
            value = self.model_.elbo(xt, yt, generator=self.generator(device=xt.device)).item()
        return value - xt.shape[0] * math.log(self.y_scale_)

    def sample_f(self, X: ArrayLike, num_samples: int = 1, seed: int | None = None) -> np.ndarray:
        """Posterior samples of the latent function at X, in the units of y: [num_samples, n_samples]
        (`seed`: None for the fit's seed, or a seed as the `seed` parameter takes)."""
        xt = self.scaled_inputs(X)
        num_samples = positive_int(num_samples, "num_samples")
        with torch.no_grad():
            f = self.model_.sample_f(xt, num_samples, generator=self.generator(seed, xt.device))
        return f[..., 0].cpu().numpy() * self.y_scale_ + self.y_shift_

    def sample_y(self, X: ArrayLike, n_samples: int = 1,
                 random_state: int | np.random.RandomState | np.random.Generator | None = None) -> np.ndarray:
        """Draws of y from the predictive distribution at the rows of X, in the units of y: array
        [n_samples_X, n_samples], one draw per column (scikit-learn's GaussianProcessRegressor.sample_y).
        `random_state`: None (the estimator's `seed`: draws repeat), an int, or a numpy RandomState/Generator.
        See `flowgp.estimators.sampling` (the sparse GPs draw jointly over the rows)."""
        return predictive_draws(self, X, n_samples, random_state)

    def _extra_state(self) -> dict:
        return {"y_shift": self.y_shift_, "y_scale": self.y_scale_,
                "inducing_shape": list(self.model_.gp.inducing_points.shape),
                "n_iter": int(getattr(self, "n_iter_", len(getattr(self, "history_", []))))}

    def _restore(self, state):
        self.y_shift_, self.y_scale_ = float(state["y_shift"]), float(state["y_scale"])
        # files written before n_iter_ existed: the epochs of the last training run
        self.n_iter_ = int(state.get("n_iter", len(state.get("history", []))))
        z = np.zeros(state["inducing_shape"])
        self.model_ = self._build(torch.as_tensor(z), inducing_points=z)


class _StageClock:
    """Wall seconds of the robust fit's stages (`fit_report_["seconds"]`), each from the end of the one before."""

    def __init__(self):
        self.laps, self.last = {}, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self.last
        self.last = now


class _FlowRegressor(SVGPRegressor):
    """Shared constructor of the flow estimators (sklearn needs every parameter in the signature)."""

    def __init__(self, flow: str | Flow = "sal", flow_init: str = "identity", num_inducing: int = DEFAULTS.num_inducing,
                 kernel: str | Kernel = "rbf", batch_size: int | None = None, epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr,
                 seed: int = 0, dtype: str = "float64", device: str | torch.device = "cpu", noise: float = DEFAULTS.noise,
                 lengthscale: float = 1.0, period: float = 1.0, fix_noise_fraction: float = 0.0,
                 kmeans_restarts: int = DEFAULTS.kmeans_restarts, learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points,
                 predict_quadrature_points: int = DEFAULTS.predict_quadrature_points, verbose: bool | str = "auto",
                 robust: bool | RobustFit = True, checkpoint: str | os.PathLike | None = None,
                 compile: bool | str = False, early_stop: str | EarlyStop | None = "auto",
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    _FLOW_INITS = ("identity", "data", "random", "none")

    # ----- the robust fit (module doc, RobustFit) --------------------------------------------------------------
    def _robust_options(self):
        # an identity flow: the model is the SVGP itself, fitted exactly as SVGPRegressor
        return resolve_robust(self.robust, self.flow_object().is_identity)

    def _train_on_stream(self, xs, ys, stream, stats) -> None:
        options = self._robust_options()
        if options is None:
            return super()._train_on_stream(xs, ys, stream, stats)
        # the robust fit as in memory: bounds on the reservoir sample (an estimate of the table's), training
        # stages reading the whole table
        self._robust_fit(FitRows(xs, ys, int(stats.num_rows), float(stats.y_mean),
                                 (float(stats.y_min), float(stats.y_max)), stream), options)

    def _full_bound(self, model, rows: FitRows, y=None) -> float:
        """The bound on the training set in the units of y (deterministic flows: the training objective itself);
        from a sample of a streamed table, its estimate. `y`: targets other than rows.y (the SVGP stage's)."""
        y = rows.y if y is None else y
        with torch.no_grad():
            value = model.elbo(rows.x, y, num_data=rows.num_rows, generator=self.generator(device=rows.x.device))
        return value.item() - rows.num_rows * math.log(self.y_scale_)

    def _deterministic(self) -> bool:
        return self._input_dependence() is None

    def _refine_after(self, report) -> bool:
        """Whether the flow refinement runs after this warm start (`report` has both bounds per point)."""
        return True

    def _train_stage(self, model, rows: FitRows, shift, options, gamma, suffix, fix_noise_fraction, seed,
                     early_stop=None, epochs=None, lr_scale=1.0, anneal=False):
        """One stage of the robust fit: Adam (+ natural gradients on q(u)), plateau stop, best bound kept.
        `shift`: the raw targets' shift of this stage's standardisation (the scale is always y_scale_);
        `anneal`: natural-gradient steps start at 1/(t+1) (`NaturalGradient(anneal=True)`)."""
        n = rows.num_rows
        y = rows.y + (self.y_shift_ - shift) / self.y_scale_
        batch = n if self.batch_size is None else min(int(self.batch_size), n)
        keeper = None
        if options.keep_best and self._deterministic():
            def bound(m):
                with torch.no_grad():
                    return m.elbo(rows.x, y, num_data=n, generator=self.generator(device=rows.x.device)).item()
            # full batch in memory: the loss is the bound itself; otherwise the bound every keep_best_every epochs
            every = None if rows.stream is None and batch == n else -(-n // batch) * options.keep_best_every
            keeper = BestState(model, bound, every)
        natural = NaturalGradient([model.gp], lr=gamma, anneal=anneal) if gamma else None
        stream = None if rows.stream is None else (lambda: rows.stream(shift, self.y_scale_))
        history = train(model, **self._train_data(rows.x, y, stream), epochs=self.epochs if epochs is None else epochs,
                        lr=self.lr * lr_scale, fix_noise_fraction=fix_noise_fraction, seed=seed, verbose=self.verbose,
                        compile=self.compile, desc=type(self).__name__ + suffix,
                        checkpoint_path=self.checkpoint_path(suffix),
                        natural_gradient=natural, early_stop=early_stop, callback=keeper)
        if keeper is not None:
            keeper.finish(model)
        model.eval()
        return history

    def _refine_flow(self, model, x, y, max_eval: int = 200) -> None:
        """Maximise the bound over the flow and the noise, the GP held (L-BFGS, guarded, best kept). On a sample
        of a streamed table: the GP (and so the KL) held, the sample's bound has the same maximiser in
        expectation as the table's.

        The refined parameters θ are anchored at their start θ₀ by (REFINE_ANCHOR·N/2)·|θ - θ₀|², 5e-7 nats per
        point for a unit move: nothing a real improvement of the bound notices, but it makes the maximiser unique
        where the flow family has a flat direction. Example: a SAL flow driven into its exponential regime
        (sinh(u - a) ≈ -e^(a-u)/2 for large a) followed by an affine map, where a shift of `a` and of the affine's
        log-scale cancel up to e^(-2a). Without the anchor, L-BFGS walks such a valley as far as rounding takes it.
        The same fit with its sums in another order (2 processes instead of 1) ended 3.2 apart in `a`, with
        predictions 2.2e-6 apart relative (tests/cli/test_commands.py::test_fit_nproc_2_saves_the_model_of_nproc_1)."""
        held = [p for p in model.gp.parameters() if p.requires_grad]

        def lbfgs(params):
            return torch.optim.LBFGS(params, lr=1.0, max_iter=max_eval, max_eval=max_eval,
                                     line_search_fn="strong_wolfe", tolerance_grad=1e-9, tolerance_change=1e-12,
                                     history_size=20)

        for p in held:
            p.requires_grad_(False)
        free = [p for p in model.parameters() if p.requires_grad]
        start = [p.detach().clone() for p in free]
        weight = REFINE_ANCHOR * float(x.shape[0])

        def anchor():
            return 0.5 * weight * sum(((p - p0) ** 2).sum() for p, p0 in zip(free, start))

        try:
            train(model, x, y, steps=1, optimizer=lbfgs, keep_best=True, nonfinite="backoff", verbose=False,
                  seed=self.seed_, regulariser=anchor)
        finally:
            for p in held:
                p.requires_grad_(True)
        model.eval()

    def _warm_range(self, svgp, x, ys, y_range):
        """The interval (SVGP target units) on which the flow must reproduce the SVGP: TGP, where q(f) puts
        its quadrature nodes at the training inputs; v-WGP, the targets themselves (`y_range`, the raw
        targets' range, covers the rows a streamed fit's sample misses)."""
        with torch.no_grad():
            mean, var = svgp.gp.marginals(x)
        sd = var.clamp_min(0).sqrt()
        low, high = float((mean - 4 * sd).min()), float((mean + 4 * sd).max())
        return min(low, float(ys.min()), y_range[0]), max(high, float(ys.max()), y_range[1])

    def _robust_fit(self, rows: FitRows, options):
        if self.flow_init not in self._FLOW_INITS:
            raise ValueError(f"flow_init must be one of {self._FLOW_INITS}, got {self.flow_init!r}")
        n = rows.num_rows
        report = {"n": n}
        candidates = []  # (bound in y units, label, model, history)
        svgp_bound = None
        clock = _StageClock()
        if options.warm_start:
            # the SVGP in its own standardisation (shift by the targets' mean even where the flow's is 0)
            svgp_shift, svgp_scale = rows.svgp_shift, self.y_scale_
            ys = rows.y + (self.y_shift_ - svgp_shift) / svgp_scale
            svgp = self._build(rows.x, ys, model="svgp", flow="identity", input_dependent=None)
            svgp_epochs = int(round(options.svgp_epochs * self.epochs))
            # (a streamed table read whole every step is full batch too: exact gradients)
            full_batch = self.batch_size is None or int(self.batch_size) >= n
            svgp_gamma = options.svgp_natural_gradient if full_batch else options.svgp_natural_gradient_minibatch
            svgp_history = self._train_stage(svgp, rows, svgp_shift, options, svgp_gamma, ".svgp",
                                             self.fix_noise_fraction, self.seed_, self._early_stop(),
                                             epochs=svgp_epochs, anneal=not full_batch)
            # epochs the SVGP stage left unused after its plateau go to the flow model
            flow_epochs = max(1, self.epochs - len(svgp_history)) if self.epochs else 0
            svgp_bound = self._full_bound(svgp, rows, ys)
            report.update(svgp_bound=svgp_bound / n, svgp_epochs=len(svgp_history))
            self.svgp_ = svgp
            clock.lap("svgp")
            # built at the SVGP's inducing inputs, which the warm start copies anyway: no second k-means
            model = self._build(rows.x, rows.y, inducing_points=svgp.gp.inducing_points.detach().cpu().numpy())
            shift = (svgp_shift - self.y_shift_) / self.y_scale_
            y_range = tuple((v - svgp_shift) / svgp_scale for v in rows.y_range)
            low, high = self._warm_range(svgp, rows.x, ys, y_range)
            warm_start_from_svgp(model, svgp, shift, svgp_scale / self.y_scale_, low, high)
            if not self._deterministic():  # networks of input-dependent stages taught the warm-started bases
                self._initialise_networks(model, rows.x, self.generator(device="cpu"))
            report["warm_start_bound"] = self._full_bound(model, rows) / n
            clock.lap("warm_start")
            refine_evals = options.refine_evaluations(self.epochs)
            if options.refine_flow and refine_evals and self._deterministic() and self._refine_after(report):
                self._refine_flow(model, rows.x, rows.y, refine_evals)
                report["refined_bound"] = self._full_bound(model, rows) / n
                report["refine_evaluations"] = refine_evals
                clock.lap("refine")
            history = self._train_stage(model, rows, self.y_shift_, options, options.natural_gradient, "", 0.0,
                                        self.seed_, self._flow_stage_stop(options), epochs=flow_epochs,
                                        lr_scale=options.flow_lr)
            candidates.append((self._full_bound(model, rows), "warm", model, history))
            clock.lap("flow")
        inits = list(options.restarts) if options.warm_start else [self.flow_init, *options.restarts]
        for i, init in enumerate(inits):
            model = self._build(rows.x, rows.y)
            self._initialise_flow(model, rows.y, self.generator(device="cpu"), x_t=rows.x, init=init)
            history = self._train_stage(model, rows, self.y_shift_, options, options.natural_gradient,
                                        f".restart{i}", self.fix_noise_fraction, self.seed_,
                                        self._flow_stage_stop(options))
            candidates.append((self._full_bound(model, rows), init, model, history))
            clock.lap(f"restart{i}")
        report["candidates"] = {label: bound / n for bound, label, _, _ in candidates}
        report["epochs"] = {label: len(history) for _, label, _, history in candidates}
        if rows.stream is not None:
            report["bounds_from_sample_rows"] = int(rows.x.shape[0])
        bound, label, self.model_, self.history_ = max(candidates, key=lambda c: c[0])
        report.update(bound=bound / n, chosen=label, seconds=clock.laps)
        self.n_iter_ = len(self.history_) + (report.get("svgp_epochs", 0) if label == "warm" else 0)
        self.fit_report_ = report
        if svgp_bound is not None:
            warn_below_svgp(type(self).__name__, bound / n, svgp_bound / n, options.tolerance,
                            start=report.get("refined_bound", report.get("warm_start_bound")))
        return self

    def _initialise_networks(self, model, x_t, generator) -> None:
        """Input-dependent stages (TGP only): teach the networks their bases' current parameters."""

    def _plain_natural_gradient(self):
        # an identity flow is the SVGP itself, fitted exactly as SVGPRegressor's default fit; other plain (robust=False)
        # flow fits train with Adam alone, as before
        return "auto" if self.flow_object().is_identity else None

    def _flow_stage_stop(self, options):
        """The plateau rule of the robust fit's flow stages: none with early_stop=None; RobustFit.plateau="auto"
        (the default): the estimator's own `early_stop` rule; else RobustFit.plateau's. (The SVGP stage stops by
        the estimator's rule, as the SVGP's own fit does.)"""
        if getattr(self, "early_stop", "auto") is None:
            return None
        return self._early_stop() if options.plateau == "auto" else options.early_stop()

    def flow_object(self) -> Flow:
        """The flow as an object: the user's Flow itself (not copied; build trains a copy) or the flow built
        from the spec string (which validates the name early, with the list of valid names)."""
        if isinstance(self.flow, Flow):
            return self.flow
        if not isinstance(self.flow, str):
            raise TypeError(f"flow must be a spec string such as 'sal+softplus' or a Flow, got {type(self.flow).__name__}")
        return make_flow(self.flow)

    def _initialise_flow(self, model, y_t, generator, x_t=None, init=None):
        self._initialise_static_flow(model.flow, y_t, generator, init)

    def _initialise_static_flow(self, flow, y_t, generator, init=None):
        if self.flow_init not in self._FLOW_INITS:
            raise ValueError(f"flow_init must be one of {self._FLOW_INITS}, got {self.flow_init!r}")
        init = self.flow_init if init is None else init
        if not any(True for _ in flow.parameters()) or init == "none":
            return
        if init == "identity":
            init_identity(flow)
        elif init == "random":
            init_random(flow, generator=generator)
        else:
            init_from_data(flow, y_t[:, 0], direction=self._data_direction)


class TGPRegressor(InputDependentFlowOptions, _FlowRegressor):
    """Transformed GP regression (paper §3-4): a sparse GP prior warped by the marginal flow `flow`.

    The likelihood is p(y | f₀) = N(y; G(f₀), σ²) with G the flow (paper eq. 2 for "sal"); its bound and
    predictive are integrals over q(f₀) by Gauss-Hermite quadrature (appendix eq. 14 and 19).
    flow="identity" gives exactly the SVGPRegressor.

    Args:
        flow: a spec string ("sal", "sal+softplus", "tanh", "identity", ... : `flowgp.make_flow`) or a Flow
            object (a copy of it is trained; a user's own Flow subclass works as well as a built-in one).
        flow_init: "identity" (appendix B.3), "data" (B.2, eq. 30), "random" or "none"; not used with the
            robust fit's warm start (the flow then starts at the map that reproduces the SVGP).
        num_inducing, kernel, lengthscale, period, noise, kmeans_restarts, learn_inducing: the sparse GP and its
            initial hyperparameters, as in :class:`flowgp.SVGPRegressor`.
        batch_size, epochs, lr, fix_noise_fraction, seed, dtype, device, verbose, checkpoint, compile: training,
            as in :class:`flowgp.SVGPRegressor`.
        quadrature_points, predict_quadrature_points: Gauss-Hermite points over f₀ in training (appendix eq. 14)
            and in prediction (eq. 19).
        input_dependent: False (default); True (= "nonlinear"): the non-affine stages of the flow (for "sal" the
            sinh-arcsinh, as in appendix B.6) take their parameters from a network θ(x) = NN(x, W) (paper
            §3.2-3.3, §4.4); "all": every stage.
        hidden: the network's hidden layer widths (an int or a tuple).
        activation: "relu" or "tanh".
        dropout: the network's dropout rate (0 for bayesian="vb").
        bayesian: the treatment of W: "point" (PE-TGP: dropout in training, one deterministic pass in
            prediction), "mc_dropout" (BA-TGP: same training, predictions average `mc_samples_predict` dropout
            draws, appendix eq. 20) or "vb" (mean-field Gaussian q(W), reparameterised, with -KL[q(W)||p(W)] in
            the ELBO; needs dropout=0).
        mc_samples_train: draws of W in every ELBO evaluation in training.
        mc_samples_predict: draws of W averaged in prediction.
        prior_precision: λ of p_λ(W) = N(0, λ⁻¹I) (None: 1e-5, the weight decay of appendix B.6, or 1 for "vb"
            as in B.6.3).
        flow_init_epochs: epochs fitting the networks to output the initial flow's parameters (appendix B.4).
        robust: True (default): fit as `RobustFit` describes (SVGP warm start for half of `epochs`, flow
            refinement, natural gradients on q(u), plateau stop, best full-data bound kept, a
            `BoundBelowSVGPWarning` if the result still ends below the SVGP's bound); False: the plain fit from
            `flow_init`; or a `RobustFit` with other settings.
        early_stop: the plateau stop, as in :class:`flowgp.SVGPRegressor` ("auto", an EarlyStop or None).
        threads: torch threads per call ("auto" or a positive integer), as in :class:`flowgp.SVGPRegressor`.
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.

    See Also:
        :class:`flowgp.WarpedGPRegressor` (the flow on the targets instead), :func:`flowgp.make_flow`.

    Examples:
        >>> import numpy as np
        >>> from flowgp import TGPRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(0, 5, (200, 1))
        >>> y = np.exp(np.sin(X[:, 0]) + 0.2 * rng.standard_normal(200))  # positive, skewed
        >>> est = TGPRegressor(flow="sal+softplus", num_inducing=10, epochs=60, verbose=False).fit(X, y)
        >>> lower, upper = est.predict_interval(X[:5], level=0.95)  # of y: the noise is added after G
        >>> bool((lower < upper).all())
        True
    """

    _data_direction = "generative"
    _MODEL = "tgp"

    def __init__(self, flow: str | Flow = "sal", flow_init: str = "identity", num_inducing: int = DEFAULTS.num_inducing,
                 kernel: str | Kernel = "rbf", batch_size: int | None = None, epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr,
                 seed: int = 0, dtype: str = "float64", device: str | torch.device = "cpu", noise: float = DEFAULTS.noise,
                 lengthscale: float = 1.0, period: float = 1.0, fix_noise_fraction: float = 0.0,
                 kmeans_restarts: int = DEFAULTS.kmeans_restarts, learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points,
                 predict_quadrature_points: int = DEFAULTS.predict_quadrature_points, verbose: bool | str = "auto",
                 input_dependent: bool | str = False, hidden: int | tuple[int, ...] = (50,),
                 activation: str = "relu", dropout: float = 0.25, bayesian: str = "mc_dropout",
                 mc_samples_train: int = 1, mc_samples_predict: int = 100, prior_precision: float | None = None,
                 flow_init_epochs: int = 100, robust: bool | RobustFit = True,
                 checkpoint: str | os.PathLike | None = None, compile: bool | str = False,
                 early_stop: str | EarlyStop | None = "auto", threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    def _target_positive(self) -> bool:
        return self.flow_object().codomain == "positive"

    def _check_targets(self, y):
        flow = self.flow_object()
        if flow.codomain == "positive" and np.any(y <= 0):
            # G(f₀) > 0 for every f₀: non-positive targets can only be explained as noise, and the fit would
            # predict values near 0 for them without complaint
            raise ValueError(
                f"the TGP flow '{flow.spec}' only takes positive values but y has min {y.min():.4g}; shift y "
                "to be positive, or choose a flow onto the whole real line (e.g. 'sal')")

    def _input_dependence(self):
        return self.input_dependence()

    def warping_functions(self, X, f_grid=None, num_samples=100):
        """The learned warping y = G_{θ(x, W)}(f₀) at each row of X over `f_grid` (GP units; default
        linspace(-3, 3, 200)), in the units of y: dict of arrays [G, n_rows] "point", "mean", "std" plus
        "f_grid" (appendix Fig. 9). Draw them with `flowgp.reporting.plotting.plot_warping_curves`."""
        if self.which_stages() is None:
            raise ValueError("warping_functions needs input_dependent=True")
        xt = self.scaled_inputs(X)
        f = torch.linspace(-3, 3, 200) if f_grid is None else torch.as_tensor(f_grid)
        f = f.to(dtype=xt.dtype, device=xt.device)
        curves = warping_curves(self.model_.flow, xt, f, num_samples, generator=self.generator(device=xt.device))
        out = {k: v[..., 0].cpu().numpy() * self.y_scale_ for k, v in curves.items()}
        out["point"] += self.y_shift_
        out["mean"] += self.y_shift_
        out["f_grid"] = f.cpu().numpy()
        return out

    def _initialise_flow(self, model, y_t, generator, x_t=None, init=None):
        if self.which_stages() is None:
            return super()._initialise_flow(model, y_t, generator, x_t, init)
        # Appendix B.4: initialise the plain flow, then teach the networks its parameters.
        self._initialise_static_flow(static_flow(model.flow), y_t, generator, init)
        self._initialise_networks(model, x_t, generator)

    def _initialise_networks(self, model, x_t, generator) -> None:
        batch = x_t.shape[0] if self.batch_size is None else int(self.batch_size)
        init_input_dependent(model.flow, x_t, epochs=int(self.flow_init_epochs), batch_size=batch, lr=self.lr,
                             generator=generator)


class WarpedGPRegressor(_FlowRegressor):
    """Variational warped GP, v-WGP (paper §4.3): a sparse GP on T(y) with `flow` = T warping the targets.

    Targets must lie in T's domain (y > 0 for "log", "boxcox" keeps all reals).

    Args:
        flow: the warping T: a spec string ("sal", "log", "boxcox", ... : `flowgp.make_flow`) or a Flow onto
            the whole real line.
        flow_init: "identity", "data" (fits T so that T(y) is close to N(0, 1): appendix B.2 in the normalizing
            direction), "random" or "none"; not used with the robust fit's warm start.
        num_inducing, kernel, lengthscale, period, noise, kmeans_restarts, learn_inducing: the sparse GP on T(y),
            as in :class:`flowgp.SVGPRegressor`.
        batch_size, epochs, lr, fix_noise_fraction, seed, dtype, device, verbose, checkpoint, compile: training,
            as in :class:`flowgp.SVGPRegressor`.
        quadrature_points, predict_quadrature_points: Gauss-Hermite points in training and prediction.
        robust: as in :class:`flowgp.TGPRegressor` (the warm start sets T so that T(y) is the SVGP's standardised
            target).
        early_stop: the plateau stop, as in :class:`flowgp.SVGPRegressor` ("auto", an EarlyStop or None).
        threads: torch threads per call ("auto" or a positive integer), as in :class:`flowgp.SVGPRegressor`.
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.

    See Also:
        :class:`flowgp.TGPRegressor` (the flow on the GP's output), :func:`flowgp.make_flow`.

    Examples:
        >>> import numpy as np
        >>> from flowgp import WarpedGPRegressor
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(0, 5, (200, 1))
        >>> y = np.exp(np.sin(X[:, 0]) + 0.2 * rng.standard_normal(200))
        >>> est = WarpedGPRegressor(flow="log", num_inducing=10, epochs=60, verbose=False).fit(X, y)
        >>> bool((est.predict(X[:5]) > 0).all())
        True
    """

    _data_direction = "normalizing"
    _MODEL = "wgp"

    def _refine_after(self, report) -> bool:
        # For the v-WGP the refinement runs only where the warm start is inexact (positive-domain warpings such
        # as log+sal start below the SVGP's bound); a real-line warping (the default sal) starts exactly there
        # and goes straight to the joint stage. Refinement is unconstrained L-BFGS on the flow, and the v-WGP
        # bound's Jacobian term sum_i log T'(y_i) grows without bound on tied targets (a step-like T): on
        # scikit-learn's integer targets it drove T to a step in one run and the losses to inf/NaN after it.
        # (For the TGP, whose bound has no such term, refinement also lifts exact starts above the SVGP's.)
        return report["warm_start_bound"] < report["svgp_bound"] - 1e-6

    def _target_positive(self) -> bool:
        return self.flow_object().domain == "positive"

    def _check_targets(self, y):
        flow = self.flow_object()
        if flow.codomain != "real":
            raise ValueError(
                f"the v-WGP warping T = '{flow.spec}' maps onto a {flow.codomain} range, but z = T(y) is Gaussian "
                "and takes every real value (predictions would be NaN); use a warping onto the whole real line "
                "(e.g. 'sal', 'log' for positive y, 'boxcox'), or the flow in TGPRegressor")
        if flow.domain == "positive" and np.any(y <= 0):
            raise ValueError(
                f"the '{flow.spec}' warping needs positive targets but y has min {y.min():.4g}; "
                "shift y or choose a flow defined on all reals (e.g. 'sal')"
            )
