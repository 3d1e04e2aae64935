"""Training budgets for `flowgp bench`: `paper` (TGP appendix B.5-B.6) and `quick` (cheap, same protocol).

A preset fixes the optimiser budget and the initialisation; `Preset.epochs_for(n)` turns it into epochs for a
training set of n points, and `Preset.batch_for(n)` into a minibatch size.

- `paper` (appendix B.6, UCI): 15 000 epochs (each a full pass), Adam lr 0.01, k-means inducing points (best
  of 10 runs), RBF kernel hyperparameters initialised to 2.0 (we set the lengthscale; the estimators keep the
  kernel variance at 1.0), q(u) = N(0, 1e-5 I) whitened, Gaussian noise initialised to 0.05. The appendix
  does not state a minibatch size; we use 10 000 points, i.e. full batch on all seven smaller UCI sets.
  Applications (appendix B.5): RBF lengthscale 0.1, noise 1.0, Adam 0.01, 10 000 epochs (air quality) /
  20 000 epochs (rainfall), full batch, with and without the noise held fixed for 60 % of the iterations.
  Their `quick` budget: 1 000 epochs, except air-quality fits with M > 200 (the 100 % case, M = 595), which
  train for 200 epochs: one of their steps costs 0.15-0.47 s against ~0.01-0.04 s at M <= 60 (measured).
- `quick`: a fixed number of optimisation *steps* (1 500, not epochs) with minibatches of 512, so the large
  sets cost no more than the small ones; k-means with 3 restarts. Calibration, measured on this 2-core
  machine with one torch thread per process, float64, M = 100 (Nov 2026): one step of SVGP or TGP(sal) costs
  ~5 ms at batch 512 on an idle machine (boston full batch 5.1 ms, kin8nm batch 256 5.3 ms, batch 1024 9 ms);
  a whole quick fit (k-means + 1 500 steps + prediction) took 6.7 s (boston svgp), 6.9 s (boston tgp),
  6.1 s (power svgp), 9.3 s (power tgp) under light load, and 11-45 s (mean 19 s) for the 14 fits of
  split 0 while ~6 other jobs shared the 2 cores (docs/results/tgp/uci-quick-calibration). Estimate for svgp+tgp on
  the 7 sets x 10 splits (140 fits): ≈ 140 x 7.5 s ≈ 18 min with one job, ≈ 9-10 min with `--jobs 2`, on a
  quiet machine (about 2.5x longer when the cores are shared). Measured: 7 min 35 s wall with `--jobs 2` on the
  idle machine (`time flowgp bench uci --preset quick --splits 0-9 --inducing 100 --models svgp,tgp --jobs 2`).
- `reference`: the DGP-IWVI/DREG supplement's Table 1 protocol (E.2/E.3: 300 000 iterations, batch 512, Adam
  0.005, likelihood variance 0.01); `flowgp bench uci` uses the authors' seeded 90/10 splits with it.
- `tiny`: a smoke-test budget (a few steps) for CI and tests; its numbers mean nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..gp.defaults import DEFAULTS

__all__ = ["Preset", "PRESETS", "get_preset", "APPLICATION_PRESETS", "get_application_preset"]


@dataclass(frozen=True)
class Preset:
    """A training budget and the shared estimator settings of a benchmark run (`get_preset`).

    Attributes:
        name: the preset's name ("paper", "quick", "tiny", or an application's).
        epochs: a fixed number of epochs (full passes), or None to use `steps`.
        steps: a fixed number of optimiser steps (converted to epochs per data set).
        batch_size: minibatch size (None: full batch).
        lr, noise, lengthscale, kmeans_restarts: the estimators' arguments of those names.
        quadrature_points, predict_quadrature_points, fix_noise_fraction: the estimators' arguments of those names.
        large_m: with more inducing points than this, train for `large_m_epochs` epochs instead (their steps cost
            about (M/200)³ more).
        large_m_epochs: see `large_m`.
        protocol: "standard", or "reference" (the DGP-IWVI authors' splits and latent-DGP structure).
        num_importance: latent deep GPs' importance samples K (None: the model's default, 5).

    Examples:
        >>> from flowgp.bench.presets import get_preset
        >>> get_preset("quick", epochs=50).epochs
        50
    """

    name: str
    epochs: int | None = None          # fixed number of epochs (full passes), or None to use `steps`
    steps: int | None = None           # fixed number of optimiser steps (converted to epochs per dataset)
    batch_size: int | None = None      # None = full batch
    lr: float = DEFAULTS.lr
    noise: float = DEFAULTS.noise
    lengthscale: float = 2.0
    kmeans_restarts: int = DEFAULTS.kmeans_restarts
    quadrature_points: int = DEFAULTS.quadrature_points
    predict_quadrature_points: int = DEFAULTS.predict_quadrature_points
    fix_noise_fraction: float = 0.0
    large_m: int | None = None         # with more inducing points than this ...
    large_m_epochs: int | None = None  # ... train for this many epochs instead (their steps cost ~(M/200)^3 more)
    protocol: str = "standard"         # "reference": the DGP-IWVI authors' splits and latent-DGP structure
    num_importance: int | None = None  # latent deep GPs' importance samples K (None: the model's default, 5)

    def batch_for(self, n: int) -> int:
        return n if self.batch_size is None else min(int(self.batch_size), n)

    def epochs_for(self, n: int, num_inducing: int | None = None) -> int:
        if self.large_m is not None and num_inducing is not None and num_inducing > self.large_m:
            return int(self.large_m_epochs)
        if self.epochs is not None:
            return int(self.epochs)
        steps_per_epoch = math.ceil(n / self.batch_for(n))
        return max(1, round(self.steps / steps_per_epoch))

    def estimator_kwargs(self, n: int, num_inducing: int | None = None) -> dict:
        """Keyword arguments shared by every regression estimator for a training set of n points."""
        return dict(epochs=self.epochs_for(n, num_inducing), batch_size=self.batch_for(n), lr=self.lr,
                    noise=self.noise,
                    lengthscale=self.lengthscale, kmeans_restarts=self.kmeans_restarts,
                    quadrature_points=self.quadrature_points,
                    predict_quadrature_points=self.predict_quadrature_points,
                    fix_noise_fraction=self.fix_noise_fraction)


#: the budgets of `flowgp bench uci` (and the deep-GP suites) by name: paper, quick, tiny, reference, ...
PRESETS = {
    "paper": Preset("paper", epochs=15000, batch_size=10000),
    "quick": Preset("quick", steps=1500, batch_size=512, kmeans_restarts=3),
    "tiny": Preset("tiny", steps=5, batch_size=128, kmeans_restarts=1, quadrature_points=10,
                   predict_quadrature_points=20),
    # the DGP-IWVI/DREG supplement's Table 1 protocol (E.2, E.3): 300 000 iterations of minibatch 512,
    # Adam 0.005, likelihood variance 0.01, one k-means run (scipy's kmeans2 in the authors' code); latent deep
    # GPs add their E.2 structure (bench.models); `flowgp bench uci --preset reference` also switches to the
    # authors' splits (bench.uci.reference_split)
    "reference": Preset("reference", steps=300_000, batch_size=512, lr=0.005, noise=0.01, kmeans_restarts=1,
                        protocol="reference"),
    # the same with what the DREG authors' own Table 1 runs used (github.com/timrudner/snr_issues_in_deep_gps,
    # experiments/build_run_commands.py, table_1: L1_G5, K = 50, minibatch 64, 300 000 iterations); "reference"
    # keeps K = 5 and batch 512, the defaults of the DGP-IWVI run script the issue named
    "reference-k50": Preset("reference-k50", steps=300_000, batch_size=64, lr=0.005, noise=0.01,
                            kmeans_restarts=1, protocol="reference", num_importance=50),
}


def _application_presets(paper_epochs: int, **quick) -> dict:
    """Appendix B.5's budgets of one application: lengthscale 0.1, noise 1.0, full batch; `paper_epochs` epochs
    for `paper`, 1 000 for `quick` (plus the fields in `quick`), 3 for `tiny`."""
    b5 = dict(noise=1.0, lengthscale=0.1)
    return {
        "paper": Preset("paper", epochs=paper_epochs, **b5),
        "quick": Preset("quick", epochs=1000, kmeans_restarts=3, **b5, **quick),
        "tiny": replace(PRESETS["tiny"], steps=None, batch_size=None, epochs=3, **b5),
    }


#: the budgets of `flowgp bench airquality` and `flowgp bench rainfall`: {application: {preset name: Preset}}
APPLICATION_PRESETS = {
    "airquality": _application_presets(10000, large_m=200, large_m_epochs=200),
    "rainfall": _application_presets(20000),
}


def _replace(table: dict, name: str, what: str, overrides: dict, cleared_by_epochs: str) -> Preset:
    """table[name] with the non-None `overrides` replacing its fields; an explicit epoch count also clears the
    field `cleared_by_epochs` (the step budget, or the large-M epoch count) so that it applies as given."""
    if name not in table:
        raise ValueError(f"unknown preset '{name}'{what}; choose one of {sorted(table)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "epochs" in overrides:
        overrides.setdefault(cleared_by_epochs, None)
    return replace(table[name], **overrides)


def get_preset(name: str, **overrides) -> Preset:
    """The UCI preset `name` ('paper', 'quick', 'tiny'); `overrides` replace fields (e.g. epochs=50).

    Args:
        name: "paper", "quick" or "tiny".
        **overrides: fields of :class:`flowgp.bench.presets.Preset` to replace.

    See Also:
        :class:`flowgp.bench.presets.Preset` (an example).
    """
    return _replace(PRESETS, name, "", overrides, cleared_by_epochs="steps")


def get_application_preset(application: str, name: str, **overrides) -> Preset:
    """The preset `name` of an appendix B.5 application ('airquality', 'rainfall'); `overrides` as get_preset
    (an explicit epoch count applies to every M).

    Args:
        application: "airquality" or "rainfall".
        name: the preset's name within it.
        **overrides: as in :func:`flowgp.bench.presets.get_preset`.
    """
    table = APPLICATION_PRESETS.get(application)
    if table is None:
        raise ValueError(f"unknown application '{application}'; choose one of {sorted(APPLICATION_PRESETS)}")
    return _replace(table, name, f" for {application}", overrides, cleared_by_epochs="large_m")
