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


#: the one instance everything reads
DEFAULTS = Defaults()
