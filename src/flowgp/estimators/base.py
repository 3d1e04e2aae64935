"""Pieces shared by every flowgp estimator: input checks, dtype, seeding, the saved-file format.

Estimators translate their scikit-learn parameters into a `flowgp.build` config and call `build`; this module
holds what they all need around that: array checks (`as_2d_float`, `as_1d_float`), the input standardisation
(`Estimator.scaled_inputs`), generators made from `seed`, and `save`/`load` (a torch file read back with
weights_only=True: a Flow object given by the user is stored as a record - class path, constructor arguments,
state dict - never as a pickle).
"""
from __future__ import annotations

import inspect
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_array, column_or_1d

from ..build import DTYPES, InputDependence, resolve_dtype
from ..compat import FORMAT_VERSION, saved_format_version, upgrade_estimator_parameters
from ..training.checkpoint import FingerprintedPath, atomic_save, safe_load
from ..data.sources import data_digest
from .params import fitted_params, fitting, params_fingerprint, params_for_file, params_from_file
from .features import (check_feature_names, names_checked_by_table, restore_columns, saved_columns,
                       start_table_columns, table_feature_names)
from .validation import (check_device, check_parameters, check_table_target, is_bool, is_integer, resolve_seed,
                         rule_for)
from .threads import THREADED_METHODS, with_threads
from ..reporting.progress import show_progress

__all__ = ["Estimator", "InputDependentFlowOptions", "as_float_array", "as_2d_float", "as_1d_float",
           "positive_int", "central_probabilities", "FORMAT", "DTYPES"]

FORMAT = "flowgp-estimator-v1"


def as_float_array(a, name) -> np.ndarray:
    """`a` as a float64 numpy array (tensors are detached and copied to the CPU); TypeError if not numeric."""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy().astype(np.float64)
    try:
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a numeric array-like, got {type(a).__name__}") from None


def as_2d_float(X, name="X") -> np.ndarray:
    """X as a finite float64 array [n_samples, n_features]; ValueError naming the fix otherwise.

    scikit-learn's `check_array` does the conversion, so complex, sparse, object and empty inputs get the
    messages scikit-learn users know (and `check_estimator` expects); NaN/inf get ours, which names the fix.
    """
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    if getattr(X, "ndim", None) == 1 or (isinstance(X, (list, tuple)) and np.ndim(X) == 1):
        raise ValueError(f"Expected 2D array, got 1D array instead: {name} must be 2-D [n_samples, n_features]; "
                         f"Reshape your data with X.reshape(-1, 1) for a single feature")
    try:
        X = check_array(X, dtype=np.float64, ensure_all_finite=False, input_name=name)
    except TypeError as err:
        raise TypeError(f"{name} must be a numeric array-like: {err}") from None
    if not np.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return X


def as_1d_float(y, n, name="y") -> np.ndarray:
    """y as a finite float64 array [n] (a column [n, 1] is flattened with scikit-learn's DataConversionWarning);
    ValueError naming the fix otherwise."""
    if y is None:
        raise ValueError("this estimator requires y to be passed, but the target y is None")
    y = as_float_array(y, name)
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y, warn=True)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n_samples] (one target), got shape {y.shape}")
    if len(y) != n:
        raise ValueError(f"{name} has {len(y)} values but X has {n} rows")
    if not np.isfinite(y).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return y


class NotFittedYet(NotFittedError, RuntimeError):
    """Raised by an estimator used before `fit`: scikit-learn's NotFittedError (and a RuntimeError, as before)."""


def positive_int(value, name) -> int:
    """`value` as an int >= 1 (bools refused); ValueError naming the argument otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def central_probabilities(level) -> tuple:
    """The probabilities ((1 - level) / 2, (1 + level) / 2) bounding a central interval that holds `level` of the
    predictive mass; ValueError unless 0 < level < 1."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return (1 - level) / 2, (1 + level) / 2


class Estimator:
    """Machinery every flowgp estimator shares: dtype, input standardisation, fitted check, save/load.

    Subclasses keep their own __init__ (scikit-learn reads the parameters from its signature; the body is
    `self._store_arguments(locals())`) and give
    `config(...)` (the `flowgp.build` config of their model), `_extra_state()` (fitted attributes beyond the
    input scaling) and `_restore(state)` (sets those attributes back and rebuilds `model_` with the saved
    shapes, before the weights are loaded). Parameters named in `OBJECT_PARAMS` may hold objects (a Flow, a
    Kernel): they are saved as their spec string when given as one, as a record when given as a Flow object.

    Every `fit` and `fit_stream` a subclass defines runs through `flowgp.estimators.params.fitting`: the
    parameters are checked and normalised first (numpy values made plain; a value `save` could not write is a
    TypeError before any work), and their snapshot `fitted_params_` is what `save` records and what a training
    checkpoint's fingerprint (`training_fingerprint`) holds.

    Every method that computes (`flowgp.estimators.threads.THREADED_METHODS`: fit, predict, ...) runs with torch's
    thread count set from the `threads` parameter for the call and restored after it (`with_threads`).

    Every fit starts with `start_fit` (each parameter checked by `flowgp.estimators.validation`, the seed of the
    fit fixed in `seed_`) and keeps the names of its columns (`flowgp.estimators.features`: `feature_names_in_`
    from a named table in memory, checked by every method given X; a streamed table's columns), which the saved
    file records.

    See Also:
        :func:`flowgp.load`, :class:`flowgp.SVGPRegressor` (an estimator built on it).
    """

    OBJECT_PARAMS = ("kernel", "flow")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("fit", "fit_stream"):
            if name in vars(cls):
                setattr(cls, name, fitting(vars(cls)[name]))
        for name in THREADED_METHODS:  # torch's threads set per call and restored (flowgp.estimators.threads)
            if callable(vars(cls).get(name)):
                setattr(cls, name, with_threads(vars(cls)[name]))

    def _start_fit(self, fitted: dict) -> None:
        """Begin a fit with parameters `fitted` (from `fitting`): the previous fit's model and data digest are
        dropped, so a fit that raises leaves no model rather than the previous one under these parameters."""
        for name in ("model_", "_data_digest"):
            vars(self).pop(name, None)
        self.fitted_params_ = fitted

    def _record_training_data(self, digest: str) -> None:
        """Keep the digest of the rows this fit trains on (`flowgp.data.sources.DataDigest`) for
        `training_fingerprint`; every fit records it in the pass that standardises the data."""
        self._data_digest = digest

    def training_fingerprint(self) -> dict | None:
        """What a training checkpoint of this fit records and must match to be resumed (`flowgp.training.checkpoint`):
        the digest of the training rows, the estimator class, the flowgp version and the fitted parameters
        (`params.params_fingerprint`); None before the fit has recorded its data."""
        from ..compat import library_version

        digest = vars(self).get("_data_digest")
        if digest is None:
            return None
        return {"data": digest, "estimator": type(self).__name__, "flowgp version": library_version(),
                **params_fingerprint(self)}

    def _store_arguments(self, arguments: dict) -> None:
        """Keep every constructor argument as an attribute of the same name, unchanged.

        This is the scikit-learn contract: `get_params` reads the attributes back by the names in the __init__
        signature and `clone` checks that they are the very objects given (so nothing is converted or validated
        here; checks happen in `fit`). Subclasses call it first thing in __init__ with `locals()`, before any
        other local name exists: `self` and the `__class__` cell that `super()` creates are skipped.
        """
        for name, value in arguments.items():
            if name not in ("self", "__class__"):
                setattr(self, name, value)

    # ----- dtype, tensors, generators ----------------------------------------------------------------------
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype named by the `dtype` parameter ("float64" or "float32")."""
        return resolve_dtype(self.dtype)

    def tensor(self, a, dtype=None) -> torch.Tensor:
        """`a` as a tensor in the estimator's dtype (or `dtype`) on its device."""
        return torch.as_tensor(a, dtype=dtype or self.torch_dtype(), device=self.device)

    def generator(self, seed=None, device=None) -> torch.Generator:
        """A torch.Generator seeded with `seed` (default: `draw_seed()`; a seed a method was given is checked as
        the `seed` parameter is): all randomness flows from it."""
        dev = self.device if device is None else device
        return torch.Generator(device=dev).manual_seed(self.draw_seed() if seed is None else resolve_seed(seed))

    def draw_seed(self) -> int:
        """The seed of the draws the estimator makes: the `seed` parameter where it is an integer (in a fit it is
        `seed_`; on a fitted estimator `set_params(seed=...)` redraws the Monte Carlo predictions without a
        refit), else the seed the fit drew for seed=None or a NumPy generator (`seed_`)."""
        return resolve_seed(self.seed) if is_integer(self.seed) else self.seed_

    def start_fit(self) -> None:
        """What every fit does first, before any work: check every parameter (`flowgp.estimators.validation`:
        a ValueError or TypeError naming the bad one) and fix the integer seed of this fit in `seed_` (`seed`
        itself, a fresh one for seed=None, the next draw of a NumPy generator)."""
        check_parameters(self)
        self.seed_ = resolve_seed(self.seed)

    def check_fitted(self) -> None:
        """RuntimeError unless `fit` has run."""
        if not hasattr(self, "model_"):
            # the arguments fit needs with arrays: fit(X, y), or fit(X, y, output) for the multi-output estimator
            needed = [name for name, p in inspect.signature(self.fit).parameters.items()
                      if p.default is inspect.Parameter.empty or name in ("y", "output")]
            arguments = ", ".join(needed)
            raise NotFittedYet(f"this {type(self).__name__} is not fitted yet; call fit({arguments}) first")

    def summary(self, as_dict: bool = False):
        """What the fit learned, in the data's units: inducing points, epochs run, the training bound per point,
        lengthscales per input (in that input's units), kernel and noise variances (in y's units where the GP
        models y itself), the flow's parameters. Returns a `flowgp.estimators.summary.FitSummary`, shown as a
        table (`print(est.summary())`), or with `as_dict=True` its nested dict {section: {name: value}, "units":
        {section: {name: units}}}. `repr(est)` stays scikit-learn's (the parameters); this is the fitted view."""
        from .summary import summarize

        return summarize(self, as_dict)

    def checkpoint_path(self, suffix: str = "") -> FingerprintedPath | str | None:
        """The `checkpoint` parameter as a path (None: no checkpoint); `suffix` names a separate training stage.
        It carries this fit's `training_fingerprint` (`flowgp.training.checkpoint.FingerprintedPath`), so the training
        loop resumes the file only if it was written by this fit (same data, parameters, class and version)."""
        checkpoint = getattr(self, "checkpoint", None)
        if checkpoint is None:
            return None
        if not isinstance(checkpoint, (str, Path)):
            raise TypeError(f"checkpoint must be a file path (str or Path) or None, got {type(checkpoint).__name__}")
        fingerprint = self.training_fingerprint()
        path = str(checkpoint) + suffix
        # without a recorded digest the loop digests the data tensors it is given itself
        return path if fingerprint is None else FingerprintedPath(path, fingerprint)

    # ----- input scaling -----------------------------------------------------------------------------------
    def fit_input_scaling(self, X: np.ndarray, per_feature: bool = True, y=None) -> torch.Tensor:
        """Learn the standardisation of the training inputs (per feature, or with `per_feature=False` one mean
        and scale for all features, repeated per feature); returns them scaled, as a tensor. The digest of the
        training rows (X, and the targets `y` as given) is taken here too, while X is read for its moments:
        what a training checkpoint's fingerprint records (`training_fingerprint`)."""
        self.n_features_in_ = X.shape[1]
        self._record_training_data(data_digest(X, y))
        if per_feature:
            mean, std = X.mean(0), X.std(0)
        else:
            mean, std = np.full(X.shape[1], X.mean()), np.full(X.shape[1], X.std())
        self.x_mean_ = mean
        self.x_std_ = np.where(std > 0, std, 1.0)
        return self.tensor((X - self.x_mean_) / self.x_std_)

    def scaled_inputs(self, X) -> torch.Tensor:
        """X checked and standardised with the training inputs' mean and scale: what the model sees."""
        self.check_fitted()
        check_feature_names(self, X)
        X = as_2d_float(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        return self.tensor((X - self.x_mean_) / self.x_std_)

    # ----- streamed data (flowgp.data.sources) ---------------------------------------------------------------
    def supports_streaming(self) -> bool:
        """Whether `fit_stream` trains this estimator as its `fit` does: the class that defines the `fit` in use
        declares STREAMED_FIT = True (the sparse GP regressors; families with their own fit do not)."""
        for klass in type(self).__mro__:
            if "fit" in vars(klass):
                return bool(vars(klass).get("STREAMED_FIT", False))
        return False

    @with_threads
    @fitting
    def fit_stream(self, data, target=None, *, features=None, sample_size: int = 10000, callback=None,
                   shard_reads: bool | None = None):
        """Fit on a table streamed in chunks: a path (.csv, .parquet, .npy), an iterator of (X, y) chunks or a
        flowgp.data.sources source; `target` names the target column (an index for .npy, default the last).

        One streaming pass (`flowgp.estimators.table_scan.scan_table`: a bottom-k sample, block digests) gives the standardisation of X and y and a uniform
        reservoir sample of at most `sample_size` rows, from which the model is built (k-means inducing inputs,
        flow initialisation); training then reads the table block by block (`flowgp.training.batches.BlockBatches`),
        so memory follows the batch size, the number of inducing points and `sample_size`, not the number
        of rows. Inside a torch.distributed group every rank takes its part of each global batch (see
        flowgp.training.loop). The flow regressors fit robustly here too (`RobustFit`): every stage trains on the
        whole table, and the bounds that steer the fit (warm start, best state, the check against the SVGP)
        are evaluated on the sample. Estimators that declare STREAMED_FIT provide `_stream_targets` (what the
        scan tells about the targets: the regressors' standardisation here, the classifiers' classes in
        `classification.StreamedClassLabels`), `_stream_target_transform` and `_train_on_stream`.
        `callback(step, loss, model)` goes to the training loop of the estimators whose `_train_on_stream`
        takes one (those whose `fit` takes a callback); the others refuse it.

        `shard_reads` (used only inside a process group of W > 1 processes): None (default) takes the estimator's
        `shard_reads` parameter; True or False here wins over the parameter for this fit (the saved model records
        the parameter). Sharded (the parameter's default "auto", or True): each process reads only its share of
        the table's blocks, in the scan (statistics merged across processes, `flowgp.estimators.table_scan`) and
        in every epoch (`flowgp.training.batches.BlockBatches`): the I/O per process falls as 1/W and the sampler
        keeps one process's law (every row once per epoch, uniform minibatches) but not its draws. False (exact
        mode, for debugging): every process reads every block and the fit reproduces one process to rounding.
        """
        from ..training.batches import BlockBatches
        from ..data.sources import open_table
        from .table_scan import scan_table

        if not self.supports_streaming():
            raise TypeError(f"{type(self).__name__} cannot be fitted on a streamed table yet; load the data as arrays")
        check_table_target(target)
        self.start_fit()
        sample_size = positive_int(sample_size, "sample_size")
        train_options = {}
        if callback is not None:
            if "callback" not in inspect.signature(self._train_on_stream).parameters:
                raise TypeError(f"callback: {type(self).__name__}'s training takes no callback")
            train_options["callback"] = callback
        shard_reads = self.resolved_shard_reads(shard_reads)
        source = open_table(data, target, features)
        try:
            stats = scan_table(source, sample_size, self.seed_, shard_reads, max_labels=self._stream_max_labels())
            if stats.sample_y is None:
                raise ValueError("target: the table has no target column; name it with target=")
            if stats.num_rows < 2:
                raise ValueError(f"need at least 2 training points, got n_samples = {stats.num_rows}")
            ys = self._stream_targets(stats)  # sets what the targets' transform needs; the sample's targets
            self._record_training_data(stats.digest)  # taken in the scan's one pass
            self.n_features_in_ = len(source.feature_names)
            start_table_columns(self, source.feature_names, target)
            self.x_mean_ = stats.x_mean
            self.x_std_ = np.where(stats.x_std > 0, stats.x_std, 1.0)
            xs = self.tensor((stats.sample_x - self.x_mean_) / self.x_std_)

            def stream(*target_args):
                """A sampler over the whole table, targets through `_stream_target_transform(*target_args)`."""
                targets = self._stream_target_transform(*target_args)

                def transform(x, y):
                    return self.tensor((x - self.x_mean_) / self.x_std_), targets(y)
                return BlockBatches(source, self.batch_size, transform, seed=self.seed_, device=self.device,
                                    shard_reads=shard_reads)

            start = time.perf_counter()
            self._train_on_stream(xs, ys, stream, stats, **train_options)
            # the model building and training (benchmarks/perf/scaling.py), not the scan
            self.train_seconds_ = time.perf_counter() - start
        finally:
            if source is not data:
                source.close()
        return self

    def resolved_shard_reads(self, shard_reads: bool | None = None) -> bool:
        """Whether a streamed fit has each process of a data-parallel run read only its share of the table
        (`fit_stream`): the `fit_stream(shard_reads=...)` keyword where it is True or False (it wins), else the
        `shard_reads` parameter, "auto" meaning yes (with one process its share is the whole table, so "auto"
        and True shard exactly when there are several). TypeError naming the argument for any other keyword.

        Args:
            shard_reads: the `fit_stream` keyword: None (the parameter decides), True or False.
        """
        if shard_reads is not None:
            if not is_bool(shard_reads):
                raise TypeError(f"shard_reads must be True, False or None (the estimator's shard_reads parameter "
                                f"decides), got {shard_reads!r}")
            return bool(shard_reads)
        value = getattr(self, "shard_reads", "auto")
        rule_for(self, "shard_reads")(value, "shard_reads")
        return True if isinstance(value, str) else bool(value)

    def _train_data(self, xt, yt, sampler=None) -> dict:
        """The data arguments of `flowgp.training.loop.train`: (xt, yt) in minibatches of `batch_size`, or a fresh
        `sampler()` (e.g. over a streamed table), one per training stage."""
        return dict(x=xt, y=yt, batch_size=self.batch_size) if sampler is None else dict(x=sampler())

    def _stream_max_labels(self) -> int | None:
        """How many distinct target values the scan collects (classifiers: their classes); None: none."""
        return None

    def _stream_targets(self, stats) -> torch.Tensor:
        """Learn the targets' encoding from the scan's `stats` (regression: the standardisation) and return the
        sample's targets as the model sees them."""
        self._check_targets(np.array([stats.y_min, stats.y_max]))
        y_std = stats.y_std if stats.y_std > 0 else 1.0
        self.y_shift_, self.y_scale_ = (0.0, y_std) if self._target_positive() else (stats.y_mean, y_std)
        return self._stream_target_transform(self.y_shift_, self.y_scale_)(stats.sample_y)

    def _stream_target_transform(self, y_shift, y_scale):
        """Targets of a block as the model sees them: standardised by (y_shift, y_scale), [n, 1]."""
        return lambda y: self.tensor((y - y_shift) / y_scale)[:, None]

    @with_threads
    def predict_to_file(self, data, path, *, level: float = 0.95, target=None, features=None,
                        chunk_rows: int = 65536, verbose: bool | str = "auto", output=None) -> dict:
        """Predict a table chunk by chunk and append the rows (mean, std, lower, upper of the central `level`
        interval) to `path` (CSV, or Parquet for .parquet/.pq) as they are computed; memory is bounded by
        `chunk_rows`. The file is written under a temporary name and renamed into place at the end; a `path` that
        is the `data` file (or lies inside a `data` folder) is refused before any work.

        `data`: as for `fit_stream` (features: default the ones the model was fitted on, when known). With a
        `target` column the summary also scores the predictions. Returns {"rows": n} plus, with a target,
        "nll" (mean negative log predictive density), "rmse" and the interval's coverage. `output`: the
        multi-output estimator's output-index column (as in its `fit_stream`); the others take none.
        """
        from tqdm.auto import tqdm

        from ..data.paths import check_distinct
        from ..data.sources import open_table, table_writer

        self.check_fitted()
        check_distinct({"path": path}, {"data": data})  # the table read is never the file written
        central_probabilities(level)
        chunk_rows = positive_int(chunk_rows, "chunk_rows")
        if features is None and isinstance(data, (str, Path)) and not str(data).endswith(".npy"):
            features = table_feature_names(self)  # the model's own columns, by name
        if target is None and isinstance(data, (str, Path)) and str(data).endswith(".npy") and Path(data).exists():
            if np.load(data, mmap_mode="r").shape[-1] == self._table_feature_count():
                target = False
        source = open_table(data, target, features)
        columns = self._table_columns(list(source.feature_names), output)
        writer = table_writer(path, ["mean", "std", "lower", "upper"])
        totals = {"rows": 0, "lpd": 0.0, "se": 0.0, "inside": 0}
        ok = False
        bar = tqdm(total=source.num_rows, desc="predict", unit="rows", disable=not show_progress(verbose), leave=False)
        try:
            for x, y in source.chunks(chunk_rows):
                with names_checked_by_table():  # the chunk's columns were taken by name
                    mean, std, lower, upper, lpd = self._chunk_predictions(x, y, level, columns)
                writer.write(np.column_stack([mean, std, lower, upper]))
                totals["rows"] += len(x)
                if y is not None:
                    totals["lpd"] += float(np.sum(lpd))
                    totals["se"] += float(np.sum((y - mean) ** 2))
                    totals["inside"] += int(np.sum((y >= lower) & (y <= upper)))
                bar.update(len(x))
            ok = True
        finally:
            bar.close()
            writer.close(ok)
            if source is not data:
                source.close()
        n = totals["rows"]
        out = {"rows": n}
        if source.target_name is not None and n:
            out.update({"nll": -totals["lpd"] / n, "rmse": float(np.sqrt(totals["se"] / n)),
                        f"coverage{round(100 * level):d}": totals["inside"] / n})
        return out

    def _table_feature_count(self) -> int:
        """Feature columns of a table this estimator predicts (a .npy of that width has no target column)."""
        return self.n_features_in_

    def _table_columns(self, names, output):
        """What `_chunk_predictions` needs to know about a table's feature columns `names` (here: nothing)."""
        if output is not None:
            raise TypeError(f"output: {type(self).__name__} has one output; output= names the multi-output "
                            "estimator's output-index column")
        return None

    def _chunk_predictions(self, x, y, level, columns):
        """(mean, std, lower, upper, log densities or None without y) of one chunk of a table's rows."""
        mean, std = self.predict(x, return_std=True)
        lower, upper = self.predict_interval(x, level)
        return mean, std, lower, upper, None if y is None else self.log_predictive_density(x, y)

    # ----- save / load -------------------------------------------------------------------------------------
    def _extra_state(self) -> dict:
        return {}

    def _restore(self, state: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, path):
        """Write the fitted estimator atomically to `path` (a torch file loadable with weights_only=True).

        The file records the parameters the model was fitted with (`fitted_params_`; a `set_params` after the
        fit is not the fitted model), without `checkpoint`: a training checkpoint belongs to the fit that wrote
        it, so the loaded estimator has checkpoint=None and a refit of it trains afresh. Object parameters are
        saved as their spec string (a Kernel: the fitted weights come back with the model's state) or, for a
        Flow object, as a record."""
        self.check_fitted()
        sections = params_for_file(self)
        state = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "class": type(self).__name__, **sections,
            "n_features_in": self.n_features_in_, "x_mean": torch.as_tensor(np.asarray(self.x_mean_, np.float64)),
            "x_std": torch.as_tensor(np.asarray(self.x_std_, np.float64)), "history": list(getattr(self, "history_", [])),
            "model": {k: v.detach().cpu() for k, v in self.model_.state_dict().items()},
            **self._extra_state(), **saved_columns(self),
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
        """Load an estimator written by `save` (weights_only: no code is executed).

        device: where to put the model (the `device` parameter of the loaded estimator); None keeps the device it
        was saved from where this machine has it (`_device_here`: a model saved from CUDA loads on the CPU where
        there is no CUDA device, and on cuda:0 where its CUDA index does not exist, with a warning).
        """
        state = safe_load(path)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{path} is not a flowgp estimator file")
        target = cls._subclass_named(state.get("class"))
        if target is None:
            raise ValueError(f"{path} holds a {state.get('class')}, not a {cls.__name__}")
        arguments = params_from_file(state["params"], state.get("records", {}))
        params = upgrade_estimator_parameters(target.__name__, arguments, saved_format_version(state))
        if device is not None:
            check_device(device, "device")
            params["device"] = device
        else:
            params["device"] = _device_here(params.get("device") or "cpu", path)
        est = target(**params, **state["spec"])
        est.fitted_params_ = fitted_params(est)
        est.n_features_in_ = int(state["n_features_in"])
        est.x_mean_ = state["x_mean"].numpy()
        est.x_std_ = state["x_std"].numpy()
        est.history_ = list(state["history"])
        est.seed_ = int(params.get("seed") or 0)
        restore_columns(est, state)
        try:
            est._restore(state)
            est.model_.load_state_dict(state["model"])
        except RuntimeError as err:
            if "state_dict" not in str(err):
                raise
            detail = " ".join(str(err).split())[:400]
            raise ValueError(f"{path}: the saved weights do not fit a {target.__name__} built from the saved "
                             f"parameters ({detail}); the file comes from another flowgp version or was changed "
                             "after save() wrote it") from None
        est.model_.eval()
        return est


def _device_here(saved: str, path) -> str:
    """The device a model saved from `saved` loads on by default: the same one where this machine has it; a
    model saved from CUDA loads on the CPU where there is no CUDA device, and on cuda:0 where its own index is
    out of range (a model trained on a GPU must stay usable elsewhere), with a warning saying so."""
    where = torch.device(saved)
    if where.type != "cuda":
        return saved
    if not torch.cuda.is_available():
        warnings.warn(f"{path} was saved from {saved}, and this machine has no CUDA device: loading it on the CPU "
                      "(pass device= to choose)", stacklevel=3)
        return "cpu"
    if where.index is not None and where.index >= torch.cuda.device_count():
        warnings.warn(f"{path} was saved from {saved}, and this machine has {torch.cuda.device_count()} CUDA "
                      "device(s): loading it on cuda:0 (pass device= to choose)", stacklevel=3)
        return "cuda:0"
    return saved


class InputDependentFlowOptions:
    """Options of the estimators whose flow may take its parameters from a network NN(x, W) (TGP §3.2-3.3):
    input_dependent, hidden, activation, dropout, bayesian, mc_samples_train, mc_samples_predict,
    prior_precision, flow_init_epochs."""

    def which_stages(self) -> str | None:
        """None (a plain flow), "nonlinear" or "all": which stages of the flow the networks drive."""
        if self.input_dependent in (False, None):
            return None
        if self.input_dependent is True or self.input_dependent == "nonlinear":
            return "nonlinear"
        if self.input_dependent == "all":
            return "all"
        raise ValueError(f"input_dependent must be False, True (= 'nonlinear') or 'all', got {self.input_dependent!r}")

    def check_bayesian_options(self) -> None:
        from ..flows.networks import BAYESIAN_MODES

        if self.bayesian not in BAYESIAN_MODES:
            raise ValueError(f"bayesian must be one of {BAYESIAN_MODES}, got {self.bayesian!r}")
        if self.bayesian == "vb" and self.dropout:
            raise ValueError("bayesian='vb' uses no dropout (appendix B.6.3); pass dropout=0")
        for name in ("mc_samples_train", "mc_samples_predict", "flow_init_epochs"):
            value, least = getattr(self, name), 0 if name == "flow_init_epochs" else 1
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")

    def input_dependence(self) -> InputDependence | None:
        """The `flowgp.build.InputDependence` of these options (None with input_dependent=False)."""
        which = self.which_stages()
        if which is None:
            return None
        self.check_bayesian_options()
        hidden = tuple(self.hidden) if isinstance(self.hidden, (list, tuple)) else self.hidden
        return InputDependence(which=which, hidden=hidden, activation=self.activation, dropout=self.dropout,
                               bayesian=self.bayesian, prior_precision=self.prior_precision)

