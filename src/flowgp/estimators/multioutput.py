"""scikit-learn style multi-output estimator: a thin layer over `flowgp.models.amogp.model.AMOGP` and `flowgp.training.loop`.

Rows are (x, y, output): each row's `output` (0..D-1) names its series, so the series may be observed at
different inputs and in different numbers. Inputs are standardised with one shared shift/scale (the series
share one time axis); each series' targets with their own.
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
from ..training.batches import ArrayBatches
from ..build import AMOGPConfig, build
from ..models.amogp.model import layer_curves
from ..training.natural_gradients import NaturalGradient
from ..training.loop import EarlyStop, train
from ..data.sources import data_digest, is_table
from .base import Estimator, as_1d_float, as_2d_float, central_probabilities, positive_int
from .features import check_feature_names, fit_feature_names, start_table_columns
from .validation import check_parameters, check_table_target, resolve_seed
from .chunking import PREDICT_MEMORY_BYTES, chunk_rows, map_row_chunks

if TYPE_CHECKING:  # names of the signatures' annotations only
    import os
    from numpy.typing import ArrayLike
    from typing_extensions import Self

__all__ = ["AlignedMultiOutputGPRegressor"]


class AlignedMultiOutputGPRegressor(Estimator, RegressorMixin, BaseEstimator):
    """Aligned warped multi-output GP regression (AMO-GP, Kaiser et al. 2018) for 1-D inputs.

    Args:
        num_inducing: inducing points of the shared CP layer per inducing set (per latent process with
            cp_inducing="latent", per output with "output"); None (default): 20 per output's worth, i.e.
            20·D/R per latent (20 per output).
        num_inducing_alignment, num_inducing_warping: inducing points per alignment / warping GP.
        latent_processes: R white-noise latents shared by the outputs.
        alignment, warping: "gp" or "identity"; both "identity" is the MO-GP (CP kernel alone), warping
            "identity" alone the aligned-only ablation.
        num_outputs: D (None: max(output) + 1); every output must have training rows.
        batch_size: rows per step; "auto" (default) trains on the full batch when there are at most
            `full_batch_max` rows (the step then follows the exact bound, which the minibatch noise otherwise
            keeps the extra layers from reaching), else in minibatches of 256; None: always the full batch.
        full_batch_max: the most rows trained on as one full batch with batch_size="auto".
        epochs, lr, seed, dtype, device, verbose: training (Adam on the bound; a progress bar with verbose="auto"
            only in an interactive terminal, never inside scikit-learn's meta-estimators).
        natural_gradient: γ (default 0.5) or None (Adam on everything): natural-gradient steps of size γ
            (`flowgp.training.natural_gradients.NaturalGradient`, Salimbeni et al. 2018) on the Gaussian q(u) of the layers named in
            `natural_gradient_layers` ("latent", the default: the CP layer; "all": alignment and warping q(u)
            too), Adam on the rest, both through `flowgp.training.loop.train`. Natural-gradient steps suit a bound
            that is nearly conjugate in q(u), as the CP layer's is given its inputs; the alignments' q(u) reach
            the bound only through the CP layer's Ψ-statistics, and steps on them made the London fits erratic
            (docs/results/amogp/README.md, "Natural gradients on the CP layer only").
        natural_gradient_layers: "latent" (default) or "all", as above.
        tol, patience: plateau stop: training ends when the best per-point -ELBO improved by less than
            tol·|best| over the last `patience` epochs (default 1e-4 over 50; tol=None: run all epochs).
        noise: initial σ²_y (standardised units).
        lengthscale: initial CP auto-covariance lengthscale (standardised inputs).
        alignment_variance, alignment_lengthscale, warping_variance, warping_lengthscale: initial variance and
            lengthscale of the SE kernels of the alignment and warping GPs.
        alignment_noise, latent_noise: initial σ²_a, σ²_f (standardised units). σ²_a starts at 1e-5, an
            almost deterministic alignment: it is input noise to the CP layer, and 1e-3 (the default before) is
            0.6 of a 7-hour lengthscale over a 3-week window, which blurred the CP layer before the alignments
            were learned (London gap blocks: block RMSE 1.878 vs 2.256 on average, one fit stuck at 2.4;
            artificial gap: 0.083 vs 0.078, within the seeds' spread; docs/results/amogp/README.md).
        num_samples: Monte Carlo samples through the hierarchy for log_predictive_density and intervals.
        start_from_mogp: with an alignment or warping GP, first fit the MO-GP (identity layers, the same CP
            sets and training settings, `epochs` at most) and start AMO-GP's CP layer, offsets and noise from
            it (`AMOGP.start_from`); the MO-GP's history is `mogp_history_`. Off by default: it lifts fits
            stuck in poor optima where the outputs are nearly aligned (London gap blocks), but where they are
            not, the MO-GP has already fitted the misaligned shape and the alignments stay near the identity
            (artificial gap experiment: gap RMSE 1.07 against 0.08; docs/results/amogp/README.md).
        cp_inducing: "latent" (default: inducing variables on a smoothed copy of each latent process,
            Álvarez et al. 2010) or "output" (one set per output, the supplement's §3.1). The prior is the
            same. With one latent the per-output sets are nearly linearly dependent (cond(K_uu) 1e17-1e19
            on the London data), which makes the fit sensitive to rounding; the latent sets are not, their
            inducing inputs spread over distinct places, and on the London PM2.5 table and gap blocks the
            latent form fits better and faster (docs/results/amogp/README.md, "Inducing variables on the
            latent"; `flowgp.models.amogp.model.AMOGP`).
        cp_grid: with cp_inducing="latent", keep the CP layer's inducing inputs on their initial evenly spaced
            grid over the input range (not trained); the bound's Ψ₂ contraction then runs over the grid's 2M - 1
            midpoints (`flowgp.models.amogp.psi_grid`), and a full-batch step costs about 0.7 of one with trained inducing
            inputs. The bound is slightly looser (about 0.01 nats per point on the London data); held-out blocks
            fit better on average over four London windows (block RMSE 1.91 against 2.12) and on the artificial
            gap data (docs/results/amogp/README.md, "Inducing inputs on a grid"). None (default): on with latent
            sets and an alignment GP (where the Ψ₂ node runs), off otherwise (the MO-GP, alignment="identity",
            has no Ψ₂ node to speed up and fits its blocks slightly better with trained inducing inputs). Files
            saved before this option load with False.
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

    See Also:
        :class:`flowgp.models.amogp.AMOGP` (the model and its bound).

    Examples:
        >>> import numpy as np
        >>> from flowgp import AlignedMultiOutputGPRegressor
        >>> t = np.linspace(0, 1, 60)
        >>> X = np.concatenate([t, t])[:, None]
        >>> output = np.repeat([0, 1], 60)  # which output each row belongs to
        >>> y = np.sin(6 * (X[:, 0] - 0.1 * output))  # the second output shifted
        >>> est = AlignedMultiOutputGPRegressor(epochs=5, verbose=False).fit(X, y, output)
        >>> est.predict(t[:3, None], np.zeros(3, dtype=int)).shape
        (3,)
    """

    def __init__(self, num_inducing: int | None = None, num_inducing_alignment: int = 10,
                 num_inducing_warping: int = 10, latent_processes: int = 1, alignment: str = "gp",
                 warping: str = "gp", num_outputs: int | None = None, batch_size: int | str | None = "auto",
                 epochs: int = 500, lr: float = DEFAULTS.lr, seed: int = 0, dtype: str = "float64",
                 device: str | torch.device = "cpu", noise: float = DEFAULTS.noise, lengthscale: float = 0.3,
                 alignment_variance: float = 0.01, alignment_lengthscale: float = 1.0,
                 warping_variance: float = 0.05, warping_lengthscale: float = 1.0, alignment_noise: float = 1e-5,
                 latent_noise: float = 1e-3, num_samples: int = 200, verbose: bool | str = "auto",
                 checkpoint: str | os.PathLike | None = None, natural_gradient: float | None = 0.5,
                 natural_gradient_layers: str = "latent", tol: float | None = 1e-4, patience: int = 50,
                 full_batch_max: int = 2048, cp_inducing: str = "latent", start_from_mogp: bool = False,
                 compile: bool | str = False, cp_grid: bool | None = None,
                 threads: int | str = DEFAULTS.threads,
                 shard_reads: bool | str = "auto") -> None:
        self._store_arguments(locals())

    # ----- helpers -------------------------------------------------------------------------------------
    def _check_options(self):
        check_parameters(self)  # every parameter's own rule first
        for name in ("alignment", "warping"):
            if getattr(self, name) not in ("gp", "identity"):
                raise ValueError(f"{name} must be 'gp' or 'identity', got {getattr(self, name)!r}")
        for name in ("num_inducing", "num_inducing_alignment", "num_inducing_warping", "latent_processes"):
            v = getattr(self, name)
            if name == "num_inducing" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.natural_gradient is not None and not (isinstance(self.natural_gradient, (int, float, np.floating))
                                                      and not isinstance(self.natural_gradient, bool)
                                                      and 0 < self.natural_gradient <= 1):
            raise ValueError(f"natural_gradient must be None or a step size in (0, 1], got {self.natural_gradient!r}")
        if self.cp_inducing not in ("output", "latent"):
            raise ValueError(f"cp_inducing must be 'output' or 'latent', got {self.cp_inducing!r}")
        if self.cp_grid is not None and not isinstance(self.cp_grid, (bool, np.bool_)):
            raise TypeError(f"cp_grid must be None, True or False, got {self.cp_grid!r}")
        if self.cp_grid and self.cp_inducing != "latent":
            raise ValueError("cp_grid=True needs cp_inducing='latent' (the grid is one set per latent process)")
        if self.natural_gradient_layers not in ("latent", "all"):
            raise ValueError(f"natural_gradient_layers must be 'latent' or 'all', got {self.natural_gradient_layers!r}")
        if self.tol is not None and not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"tol must be None or a non-negative number, got {self.tol!r}")
        for name in ("patience", "full_batch_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (self.batch_size is None or self.batch_size == "auto" or (
                isinstance(self.batch_size, (int, np.integer)) and not isinstance(self.batch_size, bool)
                and self.batch_size >= 1)):
            raise ValueError(f"batch_size must be 'auto', None or a positive integer, got {self.batch_size!r}")

    def resolved_batch_size(self, n: int):
        """The rows per step for n training rows (None: the full batch); see `batch_size`."""
        if self.batch_size == "auto":
            return None if n <= int(self.full_batch_max) else 256
        return self.batch_size

    def _natural_gradient(self, model):
        """The flowgp.training.natural_gradients.NaturalGradient of `natural_gradient` over the chosen layers' q(u), or None."""
        if self.natural_gradient is None:
            return None
        sets = [model.latent]
        if self.natural_gradient_layers == "all":
            sets += [s for s, on in ((getattr(model, "align", None), model.alignment),
                                     (getattr(model, "warp", None), model.warping)) if on]
        return NaturalGradient(sets, lr=float(self.natural_gradient))

    def _output_index(self, output, n, num_outputs=None):
        if output is None:
            raise ValueError("output is required: one series index (0..D-1) per row of X")
        o = np.asarray(output.detach().cpu() if isinstance(output, torch.Tensor) else output)
        if o.ndim != 1:
            raise ValueError(f"output must be 1-D [n_samples], got shape {o.shape}")
        if len(o) != n:
            raise ValueError(f"output has {len(o)} entries but X has {n} rows")
        if o.size and (not np.issubdtype(o.dtype, np.number) or np.any(o != np.round(o))):
            raise ValueError("output must hold integer series indices 0..D-1")
        o = o.astype(np.int64)
        if num_outputs is not None and o.size and (o.min() < 0 or o.max() >= num_outputs):
            raise ValueError(f"output indices must lie in 0..{num_outputs - 1}, got values in {o.min()}..{o.max()}")
        if o.size and o.min() < 0:
            raise ValueError(f"output indices must be non-negative, got {o.min()}")
        return o

    def scaled_inputs(self, X, output=None):
        """(x [n, 1] standardised, output index tensor [n], output index array [n]) as the model sees them."""
        self.check_fitted()
        check_feature_names(self, X)
        X = as_2d_float(X)
        if X.shape[1] != 1:
            raise ValueError(f"X must have exactly one feature (AMO-GP takes 1-D inputs), got {X.shape[1]}")
        o = self._output_index(output, X.shape[0], self.n_outputs_)
        xt = self.tensor((X - self.x_mean_) / self.x_std_)
        return xt, self.tensor(o, torch.long), o

    def resolved_num_inducing(self, num_outputs: int) -> int:
        """CP inducing points per inducing set for `num_outputs` outputs (see `num_inducing`)."""
        if self.num_inducing is not None:
            return int(self.num_inducing)
        if self.cp_inducing == "output":
            return 20
        return max(1, math.ceil(20 * num_outputs / int(self.latent_processes)))

    def resolved_cp_grid(self) -> bool:
        """Whether the CP inducing inputs stay on their grid (`cp_grid`; None: with latent sets and an alignment
        GP)."""
        if self.cp_grid is None:
            return self.cp_inducing == "latent" and self.alignment == "gp"
        return bool(self.cp_grid)

    def config(self, **overrides) -> AMOGPConfig:
        """The `flowgp.build.AMOGPConfig` of this estimator's model (fields in `overrides` replaced)."""
        d = getattr(self, "n_outputs_", self.num_outputs)
        if d is None and self.num_inducing is None:
            raise ValueError("num_outputs: the default num_inducing depends on the number of outputs; fit first "
                             "or pass num_outputs / num_inducing")
        config = AMOGPConfig(
            num_outputs=d, num_inducing=self.resolved_num_inducing(d if d is not None else 1),
            num_inducing_alignment=int(self.num_inducing_alignment),
            num_inducing_warping=int(self.num_inducing_warping), latent_processes=int(self.latent_processes),
            alignment=self.alignment == "gp", warping=self.warping == "gp", lengthscale=self.lengthscale,
            variance=1.0, alignment_variance=self.alignment_variance,
            alignment_lengthscale=self.alignment_lengthscale, warping_variance=self.warping_variance,
            warping_lengthscale=self.warping_lengthscale, noise=self.noise, alignment_noise=self.alignment_noise,
            latent_noise=self.latent_noise, cp_inducing=self.cp_inducing, cp_grid=self.resolved_cp_grid())
        return dataclasses.replace(config, **overrides)

    # ----- public API ----------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike | None = None, output: ArrayLike | None = None) -> Self:
        """Fit on X [n, 1], y [n] and output [n] (series index per row); returns self. X may instead be a table
        streamed in chunks, with y the target column and output the output column (see `fit_stream`)."""
        if is_table(X):
            return self.fit_stream(X, y, output=output)
        self.start_fit()
        self._check_options()
        fit_feature_names(self, X)
        X = as_2d_float(X)
        if X.shape[1] != 1:
            raise ValueError(f"X must have exactly one feature (AMO-GP takes 1-D inputs), got {X.shape[1]}")
        y = as_1d_float(y, X.shape[0])
        o = self._output_index(output, X.shape[0], self.num_outputs)
        d = int(self.num_outputs) if self.num_outputs is not None else int(o.max()) + 1
        self._check_counts(np.bincount(o, minlength=d))
        self.n_outputs_ = d
        self.n_features_in_ = 1
        self._record_training_data(data_digest(np.column_stack([X[:, 0], o]), y))  # inputs, output index, targets
        self.x_mean_, self.x_std_ = float(X.mean()), float(X.std()) or 1.0
        self.y_mean_ = np.array([y[o == i].mean() for i in range(d)])
        self.y_std_ = np.array([y[o == i].std() or 1.0 for i in range(d)])
        xt = (X[:, 0] - self.x_mean_) / self.x_std_
        yt = (y - self.y_mean_[o]) / self.y_std_[o]

        def make(**overrides):
            return build(self.config(**overrides), torch.as_tensor(xt[:, None]), torch.as_tensor(yt),
                         dtype=self.torch_dtype(), device=self.device, generator=self.generator(device="cpu"),
                         output=torch.as_tensor(o))

        # the output index is a batch tensor of its own, passed to AMOGP.elbo as output=
        sampler = ArrayBatches(self.tensor(xt[:, None]), self.tensor(yt), self.resolved_batch_size(len(yt)),
                               extra={"output": self.tensor(o, torch.long)}, seed=self.seed_)
        self._train_model(make, sampler, len(yt))
        return self

    def fit_stream(self, data, target=None, *, output=None, features=None, sample_size: int = 10000, callback=None,
                   shard_reads: bool | None = None):
        """Fit on a table streamed in chunks: a path (.csv, .parquet, .npy) or an iterator of (X, y) chunks, with
        `target` the target column and two feature columns, the input and `output` (the series index 0..D-1:
        its name, or its index among the feature columns for .npy tables and chunk iterators); `features`
        picks the two from a wider table.

        One streaming pass (`flowgp.estimators.table_scan.scan_table` with the output as group column; split over
        the processes of a data-parallel run unless reads are not sharded: the `shard_reads` keyword, None taking
        the `shard_reads` parameter, as in `Estimator.fit_stream`) gives the input's
        standardisation, each series' target mean and std and input range, and a uniform sample of at most
        `sample_size` rows; the model is built from those (CP inducing inputs over the input's range, each
        alignment GP's over its series' range) and trained on the whole table block by block
        (`flowgp.training.batches.BlockBatches`), the output index travelling as a batch tensor. The batch is as in
        `fit` (`batch_size="auto"`: the full table up to `full_batch_max` rows). The result is the fit of the
        same rows as arrays, up to the order in which minibatches visit them.
        """
        from ..training.batches import BlockBatches
        from ..data.sources import open_table
        from .table_scan import scan_table

        if callback is not None:
            raise TypeError(f"callback: {type(self).__name__}'s training takes no callback")
        check_table_target(target)
        self.start_fit()
        self._check_options()
        shard_reads = self.resolved_shard_reads(shard_reads)
        sample_size = positive_int(sample_size, "sample_size")
        source = open_table(data, target, features)
        try:
            names = list(source.feature_names)
            xcol, col = self._table_columns(names, output)
            stats = scan_table(source, sample_size, self.seed_, shard_reads, group_feature=col)
            if stats.sample_y is None:
                raise ValueError("target: the table has no target column; name it with target=")
            groups = stats.groups
            seen = len(groups["count"])
            d = int(self.num_outputs) if self.num_outputs is not None else seen
            if seen > d:
                raise ValueError(f"output indices must lie in 0..{d - 1}, got values up to {seen - 1}")
            self._check_counts(np.pad(groups["count"], (0, d - seen)))
            self.n_outputs_ = d
            self.n_features_in_ = 1
            self._record_training_data(stats.digest)  # taken in the scan's one pass
            start_table_columns(self, names, target)  # the input and output columns, for predict_to_file
            self.output_name_ = names[col]
            self.x_mean_, self.x_std_ = float(stats.x_mean[xcol]), float(stats.x_std[xcol]) or 1.0
            self.y_mean_ = groups["y_mean"].astype(np.float64)
            self.y_std_ = np.where(groups["y_std"] > 0, groups["y_std"], 1.0)
            ranges = (np.stack([groups["x_min"][:, xcol], groups["x_max"][:, xcol]], -1) - self.x_mean_) / self.x_std_
            o_sample = stats.sample_x[:, col].astype(np.int64)
            xs = (stats.sample_x[:, xcol] - self.x_mean_) / self.x_std_
            ys = (stats.sample_y - self.y_mean_[o_sample]) / self.y_std_[o_sample]

            def make(**overrides):
                return build(self.config(**overrides), torch.as_tensor(xs[:, None]), torch.as_tensor(ys),
                             dtype=self.torch_dtype(), device=self.device, generator=self.generator(device="cpu"),
                             output=torch.as_tensor(o_sample), input_ranges=ranges)

            def transform(x, y):
                o = x[:, col].astype(np.int64)
                return (self.tensor(((x[:, xcol] - self.x_mean_) / self.x_std_)[:, None]),
                        self.tensor((y - self.y_mean_[o]) / self.y_std_[o]), {"output": self.tensor(o, torch.long)})

            sampler = BlockBatches(source, self.resolved_batch_size(stats.num_rows), transform, seed=self.seed_,
                                   device=self.device, shard_reads=shard_reads)
            start = time.perf_counter()
            self._train_model(make, sampler, stats.num_rows)
            self.train_seconds_ = time.perf_counter() - start
        finally:
            if source is not data:
                source.close()
        return self

    def _table_feature_count(self) -> int:
        return 2  # the input and the output index

    def _table_columns(self, names, output):
        """(input column, output column) positions among a table's two feature columns (`predict_to_file`;
        `output` None: the output column of the table the model was fitted on, `output_name_`)."""
        if output is None:
            output = getattr(self, "output_name_", None)
        if len(names) != 2:
            raise ValueError(f"features: an AMO-GP table has two feature columns, the input and the output "
                             f"index, got {names}; name them with features=[input, output]")
        col = self._output_column(output, names)
        return 1 - col, col

    def _chunk_predictions(self, x, y, level, columns):
        xcol, col = columns
        inputs, output = x[:, [xcol]], x[:, col]
        mean, std = self.predict(inputs, output, return_std=True)
        lower, upper = self.predict_interval(inputs, output, level)
        return mean, std, lower, upper, None if y is None else self.log_predictive_density(inputs, y, output)

    @staticmethod
    def _output_column(output, names) -> int:
        """The position among the table's two feature columns of the output index column `output`."""
        if output is None:
            raise ValueError("output: name the table's output-index column (output='site', or its index among "
                             "the feature columns)")
        if isinstance(output, (int, np.integer)) and not isinstance(output, bool):
            if output not in (0, 1):
                raise ValueError(f"output must be 0 or 1 (a position among the feature columns {names}), got {output}")
            return int(output)
        if output not in names:
            raise ValueError(f"output {output!r} is not one of the table's feature columns {names}")
        return names.index(output)

    @staticmethod
    def _check_counts(counts) -> None:
        if np.any(counts < 2):
            empty = [i for i in range(len(counts)) if counts[i] < 2]
            raise ValueError(f"every output needs at least 2 training rows; output(s) {empty} have "
                             f"{[int(counts[i]) for i in empty]} (drop them or renumber the outputs)")

    def _train_model(self, make, sampler, n: int) -> None:
        """Build the model with `make(**config overrides)` and train it on `sampler` (n rows): the MO-GP start
        when asked, then AMO-GP, both through flowgp.training.loop.train."""
        self.model_ = make()
        early = None if self.tol is None else EarlyStop(window=int(self.patience), rel_tol=float(self.tol))
        batch = self.resolved_batch_size(n)
        # full batch: every step's loss is the exact bound, so the fit ends at the best point it evaluated
        # (natural-gradient steps on this non-conjugate bound occasionally overshoot, see docs/results/amogp)
        kwargs = dict(epochs=int(self.epochs), lr=self.lr, seed=self.seed_, verbose=self.verbose,
                      compile=self.compile, early_stop=early, keep_best=batch is None or batch >= n)
        self.mogp_history_ = []
        if self.start_from_mogp and (self.model_.alignment or self.model_.warping):
            mogp = make(alignment=False, warping=False)
            self.mogp_history_ = train(mogp, sampler, natural_gradient=self._natural_gradient(mogp),
                                       desc=f"{type(self).__name__} (MO-GP start)",
                                       checkpoint_path=self.checkpoint_path(".mogp"), **kwargs)
            self.model_.start_from(mogp)
        self.history_ = train(self.model_, sampler, natural_gradient=self._natural_gradient(self.model_),
                              desc=type(self).__name__, checkpoint_path=self.checkpoint_path(), **kwargs)

    def predict(self, X: ArrayLike, output: ArrayLike,
                return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Moment-matched predictive mean of y* (and its standard deviation with return_std=True)."""
        xt, ot, o = self.scaled_inputs(X, output)
        with torch.no_grad():
            mean, var = self.model_.predict_y(xt, ot)
        mean = mean.cpu().numpy() * self.y_std_[o] + self.y_mean_[o]
        if not return_std:
            return mean
        return mean, np.sqrt(var.cpu().numpy()) * self.y_std_[o]

    #: working-memory budget (bytes) of one Monte Carlo prediction call (see flowgp.estimators.chunking)
    predict_memory = PREDICT_MEMORY_BYTES

    def _in_sample_chunks(self, function, tensors, seed):
        """function(generator, *chunk) over row chunks sized for `num_samples` draws of every layer's inducing
        projections; the generator is replayed per chunk and draws are common to the rows (`common_noise`), so
        each row's result is the same whatever rows are predicted with it or however they are chunked."""
        itemsize = torch.empty((), dtype=self.torch_dtype()).element_size()
        # per sample and row: [M] projections onto each layer's inducing inputs and their temporaries
        layers = self.model_.latent.z.shape[:2].numel() + int(self.num_inducing_alignment) + int(
            self.num_inducing_warping)  # the CP layer projects onto all its inducing sets
        rows = chunk_rows(int(self.num_samples) * (4 * layers + 16), itemsize, self.predict_memory)

        def run(*chunk):
            generator = torch.Generator(device=chunk[0].device).manual_seed(self.draw_seed() if seed is None else seed)
            return function(generator, *chunk)

        seed = None if seed is None else resolve_seed(seed)
        with torch.no_grad():
            return map_row_chunks(run, tensors, rows, dim=-1)

    def predict_interval(self, X: ArrayLike, output: ArrayLike, level: float = 0.95, method: str = "gaussian",
                         seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval (lower, upper): "gaussian" from the propagated Gaussian, "samples" from
        quantiles of y drawn through the hierarchy."""
        central_probabilities(level)
        xt, ot, o = self.scaled_inputs(X, output)
        if method == "gaussian":
            mean, std = self.predict(X, output, return_std=True)
            from scipy.stats import norm

            h = norm.ppf(0.5 + level / 2)
            return mean - h * std, mean + h * std
        if method != "samples":
            raise ValueError(f"method must be 'gaussian' or 'samples', got {method!r}")
        probs = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=xt.dtype, device=xt.device)

        def chunk_quantiles(generator, x, out):
            smp = self.model_.sample(x, out, int(self.num_samples), generator, common_noise=True)
            eps = torch.randn(smp["y_mean"].shape[:-1] + (1,), generator=generator, dtype=x.dtype, device=x.device)
            return torch.quantile(smp["y_mean"] + smp["y_var"].sqrt() * eps, probs, dim=0)

        q = self._in_sample_chunks(chunk_quantiles, [xt, ot], seed)
        q = q.cpu().numpy() * self.y_std_[o] + self.y_mean_[o]
        return q[0], q[1]

    def log_predictive_density(self, X: ArrayLike, y: ArrayLike, output: ArrayLike, method: str = "mc",
                               seed: int | None = None) -> np.ndarray:
        """Per-point log p(y* | x*) in the units of y: "mc" through the hierarchy (num_samples), "gaussian"
        from the propagated Gaussian."""
        xt, ot, o = self.scaled_inputs(X, output)
        y = as_1d_float(y, xt.shape[0])
        yt = self.tensor((y - self.y_mean_[o]) / self.y_std_[o])
        lpd = self._in_sample_chunks(
            lambda generator, x, y, out: self.model_.log_predictive_density(x, y, out, int(self.num_samples), generator,
                                                                            method=method, common_noise=True),
            [xt, yt, ot], seed)
        return lpd.cpu().numpy() - np.log(self.y_std_[o])

    def score(self, X: ArrayLike, y: ArrayLike, output: ArrayLike, sample_weight: ArrayLike | None = None) -> float:
        """R² of the predictive mean over all rows."""
        from sklearn.metrics import r2_score

        return r2_score(y, self.predict(X, output), sample_weight=sample_weight)

    def elbo(self, X: ArrayLike, y: ArrayLike, output: ArrayLike) -> float:
        """The bound (eq. 22) on (X, y, output) in the units of y."""
        xt, ot, o = self.scaled_inputs(X, output)
        y = as_1d_float(y, xt.shape[0])
        yt = self.tensor((y - self.y_mean_[o]) / self.y_std_[o])
        with torch.no_grad():
            value = self.model_.elbo(xt, yt, ot).item()
        return value - float(np.log(self.y_std_[o]).sum())

    def layers(self, x_grid, d, f_grid=None):
        """Learned layers of output d with uncertainty: "alignment" â_d on x_grid as (mean, std) in the units of
        X; with f_grid (CP-layer values, model units), "warping" ĝ_d(f) + b_d as (mean, std) in the units of y."""
        self.check_fitted()
        if not 0 <= int(d) < self.n_outputs_:
            raise ValueError(f"d must lie in 0..{self.n_outputs_ - 1}, got {d}")
        xt = self.tensor((np.asarray(x_grid, dtype=float).reshape(-1, 1) - self.x_mean_) / self.x_std_)
        with torch.no_grad():
            m, v = self.model_.alignment_function(xt, int(d))
            res = {"alignment": (m.cpu().numpy() * self.x_std_ + self.x_mean_, v.sqrt().cpu().numpy() * self.x_std_)}
            if f_grid is not None:
                ft = self.tensor(np.asarray(f_grid, dtype=float).reshape(-1, 1))
                gm, gv = self.model_.warping_function(ft, int(d))
                gm = (gm + self.model_.offset[int(d)]).cpu().numpy()
                res["warping"] = (gm * self.y_std_[d] + self.y_mean_[d], gv.sqrt().cpu().numpy() * self.y_std_[d])
        return res

    def plot_layers(self, x_grid, path=None, X=None, y=None, output=None, true_functions=None, output_names=None):
        """Draw the three layers and the prediction per output (standardised units; see
        flowgp.reporting.plotting.amogp_layers_figure); returns the matplotlib Figure (saved to `path` if given)."""
        self.check_fitted()
        xg = (np.asarray(x_grid, dtype=float).ravel() - self.x_mean_) / self.x_std_
        data = None
        if X is not None:
            o = self._output_index(output, len(X), self.n_outputs_)
            data = ((np.asarray(X, float)[:, 0] - self.x_mean_) / self.x_std_,
                    (np.asarray(y, float) - self.y_mean_[o]) / self.y_std_[o], o)
        from ..reporting.plotting import amogp_layers_figure

        return amogp_layers_figure(layer_curves(self.model_, xg), path=path, data=data,
                                   true_functions=true_functions, output_names=output_names)

    OBJECT_PARAMS = ()

    def _extra_state(self) -> dict:
        return {"n_outputs": self.n_outputs_, "y_mean": torch.as_tensor(self.y_mean_),
                "y_std": torch.as_tensor(self.y_std_),
                "shapes": {"a": list(self.model_.align.z.shape[:2]) if self.model_.alignment else [self.n_outputs_, 1],
                           "f": list(self.model_.cp_inducing_shape),
                           "g": list(self.model_.warp.z.shape[:2]) if self.model_.warping else [self.n_outputs_, 1]}}

    def _restore(self, state):
        self.n_outputs_ = int(state["n_outputs"])
        self.x_mean_, self.x_std_ = float(self.x_mean_), float(self.x_std_)
        self.y_mean_, self.y_std_ = state["y_mean"].numpy(), state["y_std"].numpy()
        self.model_ = build(self.config(inducing_shapes=state["shapes"]), None, None, dtype=self.torch_dtype(),
                            device=self.device)
