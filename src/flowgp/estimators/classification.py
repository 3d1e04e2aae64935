"""scikit-learn style classifiers: thin layers over `flowgp.models.TGPClassification` and `flowgp.training.loop`.

Inputs are standardised; labels may be any sortable values (strings included) and are mapped to indices
0..C-1 through `classes_`. Binary problems use one latent GP with the probit link, multiclass problems C
latents with the softmax (or robust max). `fix_variance_epochs` holds the variational covariance fixed for
the first epochs, as the TGP appendix B.6 does following Hensman et al. (2015).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import column_or_1d
from sklearn.utils.multiclass import type_of_target

from ..gp.defaults import DEFAULTS
from ..build import ClassificationConfig, build
from ..data.sources import is_table
from ..flows import Flow, make_flow
from ..flows.conditional import static_flow
from ..models.classification import CLASSIFICATION_LIKELIHOODS
from ..training.loop import train
from .base import Estimator, InputDependentFlowOptions, as_2d_float
from .features import fit_feature_names
from .validation import check_parameters
from .chunking import PREDICT_MEMORY_BYTES, chunk_rows, inducing_row_elements, map_row_chunks
from ..training.initialisation import init_identity, init_input_dependent, init_random
from .robust import BestState, resolve_robust, warn_below_svgp

if TYPE_CHECKING:  # names of the signatures' annotations only
    import os
    from collections.abc import Iterable

    from numpy.typing import ArrayLike
    from typing_extensions import Self

    from ..gp.kernels import Kernel
    from .robust import RobustFit

__all__ = ["SVGPClassifier", "TGPClassifier"]


def _label_kind(value) -> str:
    """'text' for strings, 'number' for numbers and booleans, else the type's name (labels must share a kind)."""
    if isinstance(value, (str, bytes, np.str_, np.bytes_)):
        return "text"
    if isinstance(value, (bool, int, float, np.bool_, np.number)) and not isinstance(value, np.timedelta64):
        return "number"
    return type(value).__name__


#: the kinds of labels a classifier takes: its classes are saved with the model (`classes_`), as plain values
LABEL_KINDS = ("text", "number")


def check_label_dtype(y: np.ndarray) -> None:
    """TypeError naming y and the fix for labels that are neither numbers, booleans nor strings (dates and
    durations, complex numbers): classes are saved with the model and must come back from the file as they were."""
    if y.dtype.kind in "mMcV":
        raise TypeError(f"y holds labels of dtype {y.dtype}; class labels must be integers, booleans or strings "
                        "(they are saved with the model): convert them first, e.g. y.astype(str) for dates, or "
                        "np.unique(y, return_inverse=True)[1] for integer codes")


def check_labels(y, n: int) -> np.ndarray:
    """Class labels as a 1-D numpy array of length n, refused with a clear error when they cannot be classes.

    ValueError for a wrong shape or length and for missing labels (NaN, inf or None); TypeError for labels that
    mix kinds (strings with numbers), which cannot be sorted into `classes_` - numpy's own message would be
    "'<' not supported", and a plain list such as ['a', 1] would otherwise silently turn 1 into the string '1'.
    """
    if y is None:
        raise ValueError("this classifier requires y to be passed, but the target y is None")
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    elif not isinstance(y, np.ndarray):
        items = np.asarray(y, dtype=object)  # the user's own values, before numpy coerces them to one type
        if items.ndim == 2 and items.shape[1] == 1:
            items = items[:, 0]
        if items.ndim == 1:
            check_label_kinds(items)
    y = np.asarray(y)
    check_label_dtype(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y, warn=True)  # scikit-learn's DataConversionWarning: a column was passed for a 1-D y
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D [n_samples] (one label per row), got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"y has {len(y)} labels but X has {n} rows")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise ValueError("y contains NaN or inf; drop the unlabelled rows first")
    if y.dtype.kind == "O":
        if any(v is None or (isinstance(v, (float, np.floating)) and not np.isfinite(v)) for v in y):
            raise ValueError("y contains None or NaN; drop the unlabelled rows first")
        check_label_kinds(y)
    return y


def check_label_kinds(y) -> None:
    """TypeError naming y and the fix when labels mix kinds (e.g. strings and numbers) or are of a kind that cannot
    be a class (e.g. dates)."""
    kinds = {}
    for v in y:
        kinds.setdefault(_label_kind(v), v)
    other = [(k, v) for k, v in kinds.items() if k not in LABEL_KINDS and v is not None]  # None: unlabelled
    if other:
        check_label_dtype(np.asarray([other[0][1]]))  # a date or duration: the message of its dtype
        raise TypeError(f"y holds labels of type {other[0][0]} (e.g. {other[0][1]!r}); class labels must be integers, "
                        "booleans or strings (they are saved with the model): convert them first, e.g. "
                        "np.asarray(y).astype(str)")
    if len(kinds) > 1:
        examples = " and ".join(f"{v!r} ({k})" for k, v in kinds.items())
        raise TypeError(f"y mixes labels of different kinds, e.g. {examples}, which cannot be sorted into classes; "
                        "give every label the same type, e.g. np.asarray(y).astype(str) or map them to integers")


def training_classes(y: np.ndarray) -> np.ndarray:
    """The classes a classifier is fitted to, from `check_labels` output: ValueError for a continuous target
    (scikit-learn's "Unknown label type" wording) and for fewer than two classes."""
    if y.dtype.kind == "f" and type_of_target(y) == "continuous":
        raise ValueError("Unknown label type: continuous. y holds real values, not class labels; use a regressor "
                         "(e.g. SVGPRegressor) or turn y into classes first (e.g. np.digitize)")
    classes = label_classes(y)
    if len(classes) < 2:
        raise ValueError(f"y must hold at least two classes to train a classifier, got only one class: "
                         f"{classes.tolist()}")
    return classes


def label_classes(y: np.ndarray) -> np.ndarray:
    """The sorted distinct labels of a `check_labels` array, with a clear error when they cannot be sorted."""
    try:
        return np.unique(y)
    except TypeError as err:
        raise TypeError(f"y holds labels that cannot be sorted into classes ({err}); give every label the same "
                        "type, e.g. np.asarray(y).astype(str) or map them to integers") from None


class StreamedClassLabels:
    """The classifiers' side of `Estimator.fit_stream`: the classes are every distinct label of the table (the
    scan collects them, so a class the reservoir sample misses is kept), and a block's labels are encoded by the
    estimator's own `_encode`. Numeric labels only (a table's columns are numbers)."""

    #: a streamed fit's scan collects at most this many distinct labels (more: not a classification target)
    MAX_STREAM_CLASSES = 1000

    def _stream_max_labels(self) -> int:
        return self.MAX_STREAM_CLASSES

    def _stream_targets(self, stats) -> torch.Tensor:
        """`classes_` from every distinct label of the table (the scan's), the sample's labels encoded."""
        if stats.y_values is None:
            raise ValueError(f"y: the target column holds more than {self.MAX_STREAM_CLASSES} distinct values; a "
                             "classifier needs class labels (use a regressor for a continuous target)")
        self.classes_ = training_classes(stats.y_values)
        return self._stream_target_transform()(stats.sample_y)

    def _stream_target_transform(self):
        """Labels of a block as the model's targets."""
        return lambda y: self._encode(y, len(y))


class SVGPClassifier(StreamedClassLabels, Estimator, ClassifierMixin, BaseEstimator):
    """Sparse variational GP classifier (Hensman et al. 2015) with a scikit-learn interface.

    Args:
        num_inducing: M, inducing inputs initialised by k-means (best of `kmeans_restarts`).
        kernel: kernel spec, e.g. "rbf", "matern32" (one kernel per latent GP for multiclass problems).
        batch_size: minibatch size (None: full batch).
        epochs: the training budget in passes over the data.
        lr: Adam's step size.
        seed: controls k-means, flow initialisation, Monte Carlo draws and minibatch order; as for
            SVGPRegressor (an int, None or a NumPy Generator; the seed a fit used is `seed_`).
        dtype: "float64" (default) or "float32".
        device: "cpu" (default), "cuda" or a torch.device.
        lengthscale, period: initial kernel hyperparameters (standardised inputs).
        likelihood: "softmax" (default) or "robustmax" for more than two classes; binary uses the probit.
        kmeans_restarts: k-means runs from different starts for the inducing inputs; the best is kept.
        learn_inducing: train the inducing inputs Z (True) or keep them at their k-means positions.
        fix_variance_epochs: hold the variational covariance fixed for this many epochs first (appendix B.6).
        quadrature_points: Gauss-Hermite points of the binary ELL.
        mc_samples: Monte Carlo samples of the multiclass ELL.
        predict_samples: MC samples of the multiclass predictive probabilities.
        verbose: progress bar: "auto" (default: only in an interactive terminal, never inside scikit-learn's
            meta-estimators or joblib workers; `flowgp.reporting.progress.show_progress`), True or False.
        compile: False, True, a torch.compile mode name or "auto", as `flowgp.training.loop.train(compile=...)`
            documents; it pays off in long fits with small M (benchmarks/perf/step_time.py).
        threads: torch threads of `fit` and of every prediction, set for the call and restored after it: a
            positive integer, or "auto" (default): one thread when a step is too small to gain from more
            (`flowgp.training.threads.SMALL_STEP_WORK`), else the cores of this process shared with the other
            processes of the job (scikit-learn's `n_jobs`, torchrun) less the cores other processes keep busy.
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.
        checkpoint: a file path: training saves its state there (the variance-fixed stage next to it, with
            the suffix ".stage1") and a later `fit` with the same path continues where it stopped (only the
            same fit: see SVGPRegressor).

    See Also:
        :class:`flowgp.TGPClassifier` (warped latents), :class:`flowgp.DeepGPClassifier`.

    Examples:
        >>> import numpy as np
        >>> from flowgp import SVGPClassifier
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 2))
        >>> y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
        >>> est = SVGPClassifier(num_inducing=10, epochs=50, verbose=False).fit(X, y)
        >>> est.classes_.tolist(), est.predict_proba(X[:2]).shape
        (['no', 'yes'], (2, 2))
    """

    def __init__(self, num_inducing: int = DEFAULTS.num_inducing, kernel: str | Kernel = "rbf", batch_size: int | None = None,
                 epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr, seed: int = 0, dtype: str = "float64",
                 device: str | torch.device = "cpu", lengthscale: float = 1.0, period: float = 1.0,
                 likelihood: str = "softmax", fix_variance_epochs: int = 0, kmeans_restarts: int = DEFAULTS.kmeans_restarts,
                 learn_inducing: bool = True, quadrature_points: int = DEFAULTS.quadrature_points, mc_samples: int = 20,
                 predict_samples: int = 256, verbose: bool | str = "auto",
                 checkpoint: str | os.PathLike | None = None, compile: bool | str = False,
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    # ----- hooks the flow estimator overrides --------------------------------------------------------
    def _initialise_flow(self, model, generator, x_t) -> None:
        pass

    def _input_dependence(self):
        return None

    def config(self, **overrides) -> ClassificationConfig:
        """The `flowgp.build.ClassificationConfig` of this estimator's model (fields in `overrides` replaced)."""
        config = ClassificationConfig(
            num_classes=len(self.classes_) if hasattr(self, "classes_") else None,
            num_inducing=self.num_inducing, kernel=self.kernel, lengthscale=self.lengthscale, period=self.period,
            likelihood=self.likelihood, flow=getattr(self, "flow", "identity"),
            input_dependent=self._input_dependence(), learn_inducing=self.learn_inducing,
            quadrature_points=self.quadrature_points, mc_samples=self.mc_samples,
            predict_samples=self.predict_samples, mc_samples_train=getattr(self, "mc_samples_train", 1),
            mc_samples_predict=getattr(self, "mc_samples_predict", 100), kmeans_restarts=self.kmeans_restarts)
        return dataclasses.replace(config, **overrides)

    # ----- helpers -----------------------------------------------------------------------------------
    def _check_params(self):
        check_parameters(self)  # every parameter's own rule first
        if self.likelihood not in CLASSIFICATION_LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {CLASSIFICATION_LIKELIHOODS}, got {self.likelihood!r}")
        if isinstance(self.fix_variance_epochs, bool) or not isinstance(self.fix_variance_epochs, int) \
                or self.fix_variance_epochs < 0:
            raise ValueError(f"fix_variance_epochs must be a non-negative integer, got {self.fix_variance_epochs!r}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"epochs must be a non-negative integer, got {self.epochs!r}")

    def _encode(self, y, n) -> torch.Tensor:
        y = check_labels(y, n)
        idx = np.searchsorted(self.classes_, y)
        idx = np.clip(idx, 0, len(self.classes_) - 1)
        unknown = self.classes_[idx] != y
        if np.any(unknown):
            raise ValueError(f"y holds labels not seen in fit: {sorted(set(y[unknown].tolist()))[:5]}; "
                             f"known classes: {self.classes_.tolist()}")
        return torch.as_tensor(idx, dtype=torch.long, device=self.device)

    def encoded_labels(self, y, n=None) -> torch.Tensor:
        """Labels as the model's class indices 0..C-1 (ValueError on labels not seen in fit)."""
        self.check_fitted()
        return self._encode(y, (np.shape(y)[0] if np.ndim(y) else 0) if n is None else n)

    def _build(self, x, y=None, **overrides):
        return build(self.config(**overrides), x, y, dtype=self.torch_dtype(), device=self.device,
                     generator=self.generator(device="cpu"))

    # ----- public API --------------------------------------------------------------------------------
    #: `fit` streams tables (paths, iterators of chunks) through Estimator.fit_stream
    STREAMED_FIT = True

    def fit(self, X: ArrayLike | str | os.PathLike | Iterable, y: ArrayLike | str | int | None = None) -> Self:
        """Fit on X [n_samples, n_features] and labels y [n_samples] (any sortable labels); returns self. X may
        instead be a table streamed in chunks - a path (.csv, .parquet, .npy) with y the label column, or an
        iterator of (X, y) chunks with y None - see `fit_stream` (numeric labels; the classes come from a full
        pass over the table, the model is built from a reservoir sample and trained block by block)."""
        if is_table(X):
            self._check_params()
            self.torch_dtype()  # a bad dtype fails here, before the pass over the table
            return self.fit_stream(X, y)
        xt, yt = self._training_data(X, y)
        # every draw of the fit comes from generators made from `seed`
        self.model_ = self._build(xt, yt)
        self._initialise_flow(self.model_, self.generator(device="cpu"), xt)
        self.history_ = self._train_model(self.model_, xt, yt, self.epochs)
        return self

    def _train_on_stream(self, xs, ys, stream, stats) -> None:
        """The training of `fit_stream`: built from the sample (xs, ys), trained on the whole table."""
        self.model_ = self._build(xs, ys)
        self._initialise_flow(self.model_, self.generator(device="cpu"), xs)
        self.history_ = self._train_model(self.model_, None, None, self.epochs, sampler=stream)

    def _training_data(self, X, y):
        """Checks, `classes_`, and the scaled inputs and encoded labels the model sees."""
        self.start_fit()
        self._check_params()
        self.torch_dtype()  # a bad dtype fails here, before any work
        fit_feature_names(self, X)
        X = as_2d_float(X)
        y = check_labels(y, X.shape[0])
        self.classes_ = training_classes(y)
        xt = self.fit_input_scaling(X, y=y)
        return xt, self._encode(y, X.shape[0])

    def _train_model(self, model, xt, yt, epochs, suffix="", callback=None, sampler=None):
        """The appendix B.6 schedule: S held for the first `fix_variance_epochs` epochs, then everything. Trained
        on (xt, yt), or on `sampler()` (a fresh flowgp.training.batches sampler per stage, e.g. over a streamed table)."""
        frozen = min(self.fix_variance_epochs, epochs)
        kwargs = dict(lr=self.lr, seed=self.seed_, verbose=self.verbose,
                      compile=self.compile, desc=type(self).__name__ + suffix, callback=callback)
        history = []
        if frozen:
            # Stage 1 (appendix B.6): S held fixed; train() only optimises parameters that require grad.
            model.set_variance_trainable(False)
            try:
                history += train(model, **self._train_data(xt, yt, sampler), epochs=frozen,
                                 checkpoint_path=self.checkpoint_path(suffix + ".stage1"), **kwargs)
            finally:
                model.set_variance_trainable(True)
        if epochs > frozen:
            history += train(model, **self._train_data(xt, yt, sampler), epochs=epochs - frozen,
                             checkpoint_path=self.checkpoint_path(suffix), **{**kwargs, "seed": self.seed_ + 1})
        model.eval()
        return history

    #: working-memory budget (bytes) of one prediction call: rows are predicted in chunks that fit in it (as the
    #: regressors; predictions do not depend on it: every row shares the draws)
    predict_memory = PREDICT_MEMORY_BYTES

    def _predict_rows(self) -> int:
        """Rows per chunk: per row the projections onto the inducing inputs and the larger of the multiclass
        [samples, classes] draws and the binary flow's [quadrature nodes, W draws] grid."""
        model = self.model_
        grid = max(int(model.predict_samples) * int(model.num_classes),
                   int(model.predict_quadrature_points) * int(model.mc_samples_predict))
        itemsize = torch.empty((), dtype=self.torch_dtype()).element_size()
        return chunk_rows(inducing_row_elements(model) + grid + 16, itemsize, self.predict_memory)

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities [n_samples, n_classes], columns ordered as `classes_`; rows sum to one."""
        xt = self.scaled_inputs(X)
        with torch.no_grad():
            probs = map_row_chunks(lambda x: self.model_.predict_proba(x, generator=self.generator(device=x.device)),
                                   [xt], self._predict_rows())
        return probs.cpu().numpy().astype(np.float64)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most probable class label per row."""
        probs = self.predict_proba(X)
        return self.classes_[probs.argmax(1)]

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike) -> np.ndarray:
        """Per-point log p(y* | x*) (the negative of the per-point NLL)."""
        xt = self.scaled_inputs(X)
        yt = self._encode(y, xt.shape[0])
        with torch.no_grad():
            out = map_row_chunks(
                lambda x, t: self.model_.log_predictive_density(x, t, generator=self.generator(device=x.device)),
                [xt, yt], self._predict_rows())
        return out.cpu().numpy()

    def elbo(self, X: ArrayLike, y: ArrayLike) -> float:
        """The ELBO on (X, y) (a lower bound on log p(y | X); Monte Carlo for the softmax)."""
        xt = self.scaled_inputs(X)
        yt = self._encode(y, xt.shape[0])
        with torch.no_grad():
            return self.model_.elbo(xt, yt, generator=self.generator(device=xt.device)).item()

    def _extra_state(self) -> dict:
        return {"classes": self.classes_.tolist(), "inducing_shape": list(self.model_.gp.inducing_points.shape)}

    def _restore(self, state):
        self.classes_ = np.asarray(state["classes"])
        z = np.zeros(state["inducing_shape"])
        self.model_ = self._build(torch.as_tensor(z), inducing_points=z)


class TGPClassifier(InputDependentFlowOptions, SVGPClassifier):
    """Transformed GP classifier (paper §5.2): every latent GP warped by its own marginal flow.

    `flow` is a spec string ("sal", "sinharcsinh", "lincomb3", "tanh", ...) or a Flow with per-latent
    parameters; `flow_init` is "identity" (appendix B.3), "random" or "none" (there are no targets to
    initialise a flow from data in classification). flow="identity" gives exactly the SVGPClassifier.

    Input-dependent flows (paper §3.2-3.3, §4.4) as in TGPRegressor: `input_dependent=True` makes the
    non-affine stages take their parameters from a network NN(x, W) (`hidden`, `activation`, `dropout`);
    `bayesian` = "point" (PE-TGP), "mc_dropout" (BA-TGP: predictions average `mc_samples_predict` W draws,
    appendix eq. 20) or "vb" (mean-field q(W), needs dropout=0). `mc_samples_train` W draws per ELBO
    evaluation (binary; the softmax pairs one W draw with each latent draw). The networks are fitted to the
    initial flow parameters for `flow_init_epochs` epochs (appendix B.4). `prior_precision` is λ of p_λ(W).

    Args:
        flow: a spec string or a Flow, as above (one flow per latent GP).
        flow_init: "identity" (default), "random" or "none".
        num_inducing, kernel, lengthscale, period, kmeans_restarts, learn_inducing: as in `SVGPClassifier`.
        likelihood, fix_variance_epochs: as in :class:`flowgp.SVGPClassifier`.
        batch_size, epochs, lr, seed, dtype, device, verbose, checkpoint, compile: training, as in
            :class:`flowgp.SVGPClassifier`.
        quadrature_points, mc_samples, predict_samples: the expectations' nodes and samples, as in
            :class:`flowgp.SVGPClassifier`.
        input_dependent, hidden, activation, dropout, bayesian: the input-dependent flow, as above.
        mc_samples_train, mc_samples_predict, prior_precision, flow_init_epochs: as above and in `TGPRegressor`.
        robust: True (default): the SVGP classifier first, then the flow from its state, the best full-data
            bound kept (`fit`); False: the plain fit from `flow_init`; or a `RobustFit`.
        threads: torch threads per call ("auto" or a positive integer), as in :class:`flowgp.SVGPRegressor`.
        shard_reads: how the processes of a data-parallel run read a streamed table ("auto", True or False), as
            in :class:`flowgp.SVGPRegressor`.

    See Also:
        :class:`flowgp.SVGPClassifier`, :class:`flowgp.TGPRegressor` (the same flows in regression).
    """

    _FLOW_INITS = ("identity", "random", "none")

    def __init__(self, flow: str | Flow = "sal", flow_init: str = "identity", num_inducing: int = DEFAULTS.num_inducing,
                 kernel: str | Kernel = "rbf", batch_size: int | None = None, epochs: int = DEFAULTS.epochs, lr: float = DEFAULTS.lr,
                 seed: int = 0, dtype: str = "float64", device: str | torch.device = "cpu",
                 lengthscale: float = 1.0, period: float = 1.0, likelihood: str = "softmax",
                 fix_variance_epochs: int = 0, kmeans_restarts: int = DEFAULTS.kmeans_restarts, learn_inducing: bool = True,
                 quadrature_points: int = DEFAULTS.quadrature_points, mc_samples: int = 20, predict_samples: int = 256,
                 verbose: bool | str = "auto", input_dependent: bool | str = False,
                 hidden: int | tuple[int, ...] = (50,), activation: str = "relu", dropout: float = 0.25,
                 bayesian: str = "mc_dropout", mc_samples_train: int = 1, mc_samples_predict: int = 100,
                 prior_precision: float | None = None, flow_init_epochs: int = 100, robust: bool | RobustFit = True,
                 checkpoint: str | os.PathLike | None = None, compile: bool | str = False,
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    def _input_dependence(self):
        return self.input_dependence()

    # ----- the robust fit (flowgp.estimators.robust) ---------------------------------------------
    def fit(self, X: ArrayLike | str | os.PathLike | Iterable, y: ArrayLike | str | int | None = None) -> Self:
        """Fit on X [n_samples, n_features] and labels y [n_samples] (any sortable labels); returns self.

        With `robust` (default) the SVGP classifier (the flow at the identity) is fitted first - the same fit as
        `SVGPClassifier` with these settings: all `epochs`, its optimiser and seeds, the best full-data bound
        kept - and the TGP classifier starts exactly there (its q(u), kernel and inducing inputs, the flow at
        the identity: the same bound) and trains for `RobustFit.classifier_flow_epochs(epochs)` more (`epochs`
        at the default: a robust fit takes twice the steps of a plain one). The state with the best full-data
        bound is kept, so the result is never below that SVGPClassifier's bound for a flow that holds the
        identity (e.g. 'sal'), and `BoundBelowSVGPWarning` says when it still ends below. Both stages use Adam
        (the likelihoods are not conjugate); a half-length SVGP stage left the GP under-trained at small
        budgets (`RobustFit.svgp_epochs`). `fit_report_` gives the bound per point after each stage.
        """
        options = self._robust_options()
        if options is None or is_table(X):
            return super().fit(X, y)  # a table: fit_stream, which comes back to _train_on_stream
        xt, yt = self._training_data(X, y)
        return self._robust_fit(xt, yt, xt.shape[0], options)

    #: `fit` streams tables (paths, iterators of chunks), the robust fit included (numeric labels)
    STREAMED_FIT = True

    def _train_on_stream(self, xs, ys, stream, stats) -> None:
        options = self._robust_options()
        if options is None:
            return super()._train_on_stream(xs, ys, stream, stats)
        # the robust fit as in memory: the bounds that steer it on the reservoir sample (an estimate of the
        # table's, scaled to its rows), every training stage on the whole table
        self._robust_fit(xs, ys, int(stats.num_rows), options, sampler=stream)

    def _robust_fit(self, xt, yt, n: int, options, sampler=None):
        """The robust fit (see `fit`) on (xt, yt) of n rows, or trained on `sampler()` (a streamed table of n
        rows, xt and yt its sample: the bounds are then estimates from the sample)."""
        def bound(model):
            with torch.no_grad():
                return model.elbo(xt, yt, num_data=n, generator=self.generator(device=xt.device)).item()

        # a step's loss is the full-data bound only for one full batch with the binary quadrature; otherwise
        # the bound (Monte Carlo with the same draws every time for softmax / robust max) is taken every epoch
        if sampler is not None:
            every = int(sampler().steps_per_epoch)
        else:
            every = None if self.batch_size is None and len(self.classes_) == 2 else \
                -(-n // (n if self.batch_size is None else int(self.batch_size)))
        # the SVGP stage is the SVGPClassifier's own fit (same build, epochs, schedule and seeds): its likelihoods
        # are not conjugate, and a shorter stage ends below that fit and leaves the flow model's GP behind
        svgp = self._build(xt, yt, flow="identity", input_dependent=None)
        svgp_epochs, flow_epochs = self.epochs, options.classifier_flow_epochs(self.epochs)
        keeper = BestState(svgp, bound, every) if options.keep_best else None
        self._train_model(svgp, xt, yt, svgp_epochs, ".svgp", keeper, sampler=sampler)
        if keeper is not None:
            keeper.finish(svgp)
        svgp_bound = bound(svgp)
        model = self._build(xt, yt)
        self._initialise_flow(model, self.generator(device="cpu"), xt, init="identity")
        model.gp.load_state_dict(svgp.gp.state_dict())
        report = {"n": n, "svgp_epochs": svgp_epochs, "flow_epochs": flow_epochs, "svgp_bound": svgp_bound / n,
                  "warm_start_bound": bound(model) / n}
        keeper = BestState(model, bound, every) if options.keep_best and self.which_stages() is None else None
        self.history_ = self._train_model(model, xt, yt, flow_epochs, "", keeper, sampler=sampler)
        if keeper is not None:
            keeper.finish(model)
        self.model_ = model
        report["bound"] = bound(model) / n
        self.fit_report_ = report
        self.svgp_ = svgp
        # start: a flow that only approximates the identity (e.g. 'tanh') is told apart from an optimiser's failure
        warn_below_svgp(type(self).__name__, report["bound"], report["svgp_bound"], options.tolerance,
                        start=report["warm_start_bound"])
        return self

    def _robust_options(self):
        # an identity flow: the model is the SVGP classifier itself
        return resolve_robust(self.robust, self.flow_object().is_identity)

    def flow_object(self) -> Flow:
        """The flow as an object: the user's Flow itself (build trains a copy) or the one named by the spec."""
        if isinstance(self.flow, Flow):
            flow = self.flow
        elif isinstance(self.flow, str):
            flow = make_flow(self.flow)  # validates the name early, with the list of valid names
        else:
            raise TypeError(f"flow must be a spec string such as 'sal' or a Flow, got {type(self.flow).__name__}")
        if flow.domain != "real":
            raise ValueError(f"flow '{flow.spec}' needs positive inputs but the latent GPs take every real value; "
                             "choose a flow defined on all reals such as 'sal'")
        return flow

    def _check_params(self):
        super()._check_params()
        if self.flow_init not in self._FLOW_INITS:
            raise ValueError(f"flow_init must be one of {self._FLOW_INITS}, got {self.flow_init!r}")
        self.flow_object()
        if self.which_stages() is not None:
            self.check_bayesian_options()

    def _initialise_flow(self, model, generator, x_t, init=None):
        input_dependent = self.which_stages() is not None
        flow = static_flow(model.flow) if input_dependent else model.flow
        init = self.flow_init if init is None else init
        if any(True for _ in flow.parameters()) and init != "none":
            if init == "identity":
                init_identity(flow)
            else:
                init_random(flow, generator=generator)
        if input_dependent:
            # appendix B.4: teach the networks the initial (non-input-dependent) parameters
            init_input_dependent(model.flow, x_t, epochs=int(self.flow_init_epochs), generator=generator)


