"""Stochastic variational GP (Hensman et al. 2013): ELBO = (N/B) Σ_batch E_q(f)[log p(y|f)] - KL[q(u)||p(u)].

The likelihood is any `flowgp.gp.likelihoods.Likelihood`; with a `WarpedLikelihood(flow, base)` this is the
transformed GP of Maroñas et al. (2021) (`TGP` only builds that likelihood). Likelihoods that depend on the
inputs (`accepts_inputs`) receive x (and the generator) in every expectation, and their `kl_terms()` (e.g.
an input-dependent flow's network penalty, TGP appendix A.3) join KL[q(u)||p(u)] in the bound.
"""
from __future__ import annotations

import torch
from torch import nn

from ..gp.defaults import DEFAULTS
from ..gp.likelihoods import GaussianLikelihood, Likelihood
from ..gp.objective import minibatch_bound
from ..gp.variational import Marginals, SparseVariationalGP
from ._checks import as_inputs, as_targets
from .protocol import TrainsItsBound

__all__ = ["SVGP"]


class SVGP(TrainsItsBound, nn.Module):
    """Sparse variational GP regression/likelihood model over L independent outputs.

    Args:
        kernel: flowgp kernel (batch_shape () or (num_outputs,)).
        inducing_points: initial Z, [M, D] or [L, M, D].
        likelihood: any flowgp Likelihood; defaults to GaussianLikelihood(num_outputs=L) in Z's dtype.
        num_outputs: L.
        mean_function, q_var_init, learn_inducing, jitter: passed to SparseVariationalGP.
        quadrature_points: Gauss-Hermite points for non-closed-form expectations in training.
        predict_quadrature_points: points for predictive densities/moments (appendix A.4 uses ~100).

    See Also:
        :class:`flowgp.TGP` (the flow-warped model), :class:`flowgp.SVGPRegressor` (its estimator),
        :func:`flowgp.training.train` (fitting it).

    Examples:
        >>> import torch
        >>> from flowgp import SVGP, make_kernel
        >>> x = torch.linspace(-3, 3, 50, dtype=torch.float64)[:, None]
        >>> model = SVGP(make_kernel("rbf", input_dim=1), inducing_points=x[::5].clone())
        >>> float(model.elbo(x, torch.sin(x)).detach()) < 0
        True
        >>> from flowgp.training import train
        >>> history = train(model, x, torch.sin(x), epochs=50, verbose=False)
        >>> len(history), history[-1] < history[0]
        (50, True)
    """

    def __init__(
        self,
        kernel: nn.Module,
        inducing_points: torch.Tensor,
        likelihood: Likelihood | None = None,
        num_outputs: int = 1,
        mean_function: nn.Module | None = None,
        q_var_init: float = 1e-5,
        learn_inducing: bool = True,
        jitter: float | None = None,
        quadrature_points: int = DEFAULTS.quadrature_points,
        predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
    ):
        super().__init__()
        self.gp = SparseVariationalGP(
            kernel, inducing_points, num_outputs, mean_function, q_var_init, learn_inducing, jitter
        )
        if likelihood is None:
            z = self.gp.inducing_points
            likelihood = GaussianLikelihood(num_outputs=num_outputs, dtype=z.dtype, device=z.device)
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a flowgp Likelihood, got {type(likelihood).__name__}")
        self.likelihood = likelihood
        self.quadrature_points = int(quadrature_points)
        self.predict_quadrature_points = int(predict_quadrature_points)

    @property
    def input_dim(self) -> int:
        return self.gp.inducing_points.shape[-1]

    @property
    def num_outputs(self) -> int:
        return self.gp.num_outputs

    def validate(self, x, y=None):
        """x checked as [N, D] (and y as [N] or [N, L]); returns x, or (x, y) with y as [N, L]."""
        x = as_inputs(x, self.input_dim)
        if y is None:
            return x
        return x, as_targets(y, x.shape[0], self.num_outputs)

    def likelihood_inputs(self, x, generator=None, batch_rows: tuple[int, int] | None = None) -> dict:
        """Keyword arguments for the likelihood's expectations: x (and generator) when it depends on x, and
        `batch_rows` (the rows' place in a global batch split over processes) when it draws per row."""
        if not self.likelihood.accepts_inputs:
            return {}
        inputs = {"x": x, "generator": generator}
        if batch_rows is not None and getattr(self.likelihood, "input_dependent", False):
            inputs["batch_rows"] = batch_rows
        return inputs

    def expected_log_likelihood(self, x: torch.Tensor, y: torch.Tensor, generator=None,
                                batch_rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Per-point E_q(f)[log p(y_n | f_n)], shape [N, L] (closed form for a Gaussian likelihood).
        batch_rows: (offset, B) of these rows in a global batch split over processes, for a likelihood that
        draws per row (an input-dependent flow's dropout masks: drawn for all B rows and sliced)."""
        mean, var = self.gp.marginals(x)
        return self.likelihood.expected_log_prob(y, mean, var, self.quadrature_points,
                                                 **self.likelihood_inputs(x, generator, batch_rows))

    def kl_terms(self) -> list:
        """The global terms of the bound: KL[q(u)||p(u)] (appendix eq. 9) and the likelihood's own."""
        return [self.gp.kl_divergence(), *self.likelihood.kl_terms()]

    def elbo(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None, generator=None,
             batch_rows: tuple[int, int] | None = None, indices=None) -> torch.Tensor:
        """Minibatch ELBO scaled to the full data set: (N/B) Σ_n ELL_n - KL (appendix eq. 14; A.3 with W).
        batch_rows: (offset, B) when x is part of a global batch split over processes (flowgp.training.distributed);
        indices: the rows' positions (flowgp.models.protocol.TrainableModel), unused."""
        x, y = self.validate(x, y)
        return minibatch_bound(self.expected_log_likelihood(x, y, generator, batch_rows), self.kl_terms(),
                               num_data, x.shape[0])

    def predict_f(self, x: torch.Tensor, full_cov: bool = False) -> Marginals:
        """q(f₀(x*)): marginal mean and variance [N, L] (covariance [L, N, N] with full_cov)."""
        return self.gp.marginals(self.validate(x), full_cov=full_cov)

    def predict(self, x: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of y* (noise included), each [N, L] (appendix eq. 19 moments).

        generator: torch.Generator for the W draws of a Bayesian input-dependent flow (eq. 20); a likelihood
        that draws nothing ignores it."""
        x = self.validate(x)
        mean, var = self.gp.marginals(x)
        inputs = self.likelihood_inputs(x, generator)
        if inputs:
            return self.likelihood.predictive_moments(mean, var, self.predict_quadrature_points, **inputs)
        return self.likelihood.predictive_moments(mean, var)

    def log_predictive_density(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> torch.Tensor:
        """Per-point log p(y* | x*), [N, L] (appendix eq. 19; eq. 20 over W draws taken from `generator`)."""
        x, y = self.validate(x, y)
        mean, var = self.gp.marginals(x)
        return self.likelihood.predictive_log_density(y, mean, var, self.predict_quadrature_points,
                                                      **self.likelihood_inputs(x, generator))

    def predict_quantiles(self, x: torch.Tensor, probs, generator=None) -> torch.Tensor:
        """Quantiles of p(y* | x*) at `probs`, [P, N, L] (W draws of an input-dependent flow from `generator`)."""
        x = self.validate(x)
        mean, var = self.gp.marginals(x)
        return self.likelihood.predictive_quantiles(mean, var, probs, self.predict_quadrature_points,
                                                    **self.likelihood_inputs(x, generator))

    def predict_latent_quantiles(self, x: torch.Tensor, probs) -> torch.Tensor:
        """Quantiles of the latent function the likelihood reads, f_K(x*) = G(f₀(x*)) (f₀ itself for a plain
        likelihood), [P, N, L]: exact, since every flow is increasing."""
        x = self.validate(x)
        mean, var = self.gp.marginals(x)
        return self.likelihood.latent_quantiles(mean, var, probs, x=x)

    def sample_f(self, x: torch.Tensor, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Posterior function samples f_K(x*) = G(f₀(x*)), [S, N, L] (f₀ jointly correlated across x* when
        full_cov; with a Bayesian input-dependent flow one W draw per sample)."""
        x = self.validate(x)
        f0 = self.gp.sample(x, num_samples, full_cov=full_cov, generator=generator)
        return self.likelihood.transform(f0, x=x, generator=generator)

    def sample_y(self, x: torch.Tensor, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Draws of y* from the predictive p(y* | x*), [S, N, L]: y = f_K + ε with f_K = G(f₀) from `sample_f`
        (jointly over x* when full_cov) and ε from the likelihood's noise (a warped likelihood's base), so their
        marginal moments are `predict`'s."""
        noise = getattr(self.likelihood, "base", self.likelihood)
        if not hasattr(noise, "sample"):
            raise TypeError(f"{type(noise).__name__} cannot draw y; sample_y needs a likelihood with sample()")
        return noise.sample(self.sample_f(x, num_samples, full_cov, generator), generator=generator)
