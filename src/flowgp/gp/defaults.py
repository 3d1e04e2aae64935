"""The library's default values, written once: the estimators' `__init__` defaults, the build configs
(`flowgp.build`), `flowgp fit` and the bench presets read them from `DEFAULTS`.

The values follow the TGP paper's appendix B.6 (k-means inducing inputs, best of 10 runs; Gaussian noise
initialised to 0.05; Adam with learning rate 0.01) and appendix A.4 (about 100 Gauss-Hermite points for
predictive densities, 20 in the training bound).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Defaults", "DEFAULTS"]


@dataclass(frozen=True)
class Defaults:
    """Default values shared by the estimators, the build configs, the CLI and the bench presets."""

    #: inducing inputs M of a sparse GP (per layer of a deep GP)
    num_inducing: int = 100
    #: Gauss-Hermite points of the expected log-likelihood in the training bound
    quadrature_points: int = 20
    #: Gauss-Hermite points of predictive densities and moments
    predict_quadrature_points: int = 100
    #: k-means runs for the initial inducing inputs (the best inertia is kept)
    kmeans_restarts: int = 10
    #: initial Gaussian likelihood variance
    noise: float = 0.05
    #: training epochs (full passes over the data)
    epochs: int = 1000
    #: Adam learning rate
    lr: float = 0.01
    #: initial kernel lengthscale and period
    lengthscale: float = 1.0
    period: float = 1.0
    #: kernel spec
    kernel: str = "rbf"
    #: torch threads of a fit or prediction: "auto" (`flowgp.training.threads.choose_threads`: one thread for
    #: small steps, else the cores of this process divided by the processes sharing them) or a positive integer
    threads: int | str = "auto"
    #: natural-gradient step γ on q(u) of an SVGP fit in full batch ("auto" picks it): the Gaussian likelihood
    #: is conjugate, so γ = 1 is the exact update of q(u) for the current hyperparameters
    natural_gradient_full_batch: float = 1.0
    #: γ in minibatches: γ = 1 jumps to each batch's optimum, γ = 0.1 reaches every bound level 2-3x sooner in
    #: wall seconds than Adam alone (benchmarks/studies/svgp_natgrad_time_to_bound.py,
    #: benchmarks/studies/svgp_minibatch_budget.py)
    natural_gradient_minibatch: float = 0.1
    #: the estimators' plateau stop (`early_stop="auto"`): a fit stops once its best training loss per point
    #: (the epoch's mean negative bound per data point) improved by at most `plateau_tol` nats over the last
    #: `plateau_window` epochs; `epochs` stays the cap. A window of 20 ended the default SVGP on kin8nm (M = 100,
    #: batch 512) after 320 epochs at a bound of -0.5057 per point, 0.012 below GPyTorch's best after 1 000
    #: epochs (-0.4936): the best of 20 noisy minibatch epochs hides a slow rise. 50 ends it after 450 epochs at
    #: -0.5006, within 0.01 (docs/results/perf/time-to-model)
    plateau_window: int = 50
    plateau_tol: float = 1e-3
    #: the robust flow fit's L-BFGS refinement evaluates the full-data bound at most this share of `epochs`
    #: times (one evaluation costs about one epoch), so it never costs more than a fraction of the fit it refines
    refine_budget: float = 0.2


#: the one instance everything reads
DEFAULTS = Defaults()
