"""Stochastic variational GP (Hensman et al. 2013): ELBO = (N/B) Σ_batch E_q(f)[log p(y|f)] - KL[q(u)||p(u)]."""
from __future__ import annotations

import torch
from torch import nn

from ..likelihoods import GaussianLikelihood, Likelihood
from ..prediction import normal_quantiles
from ..variational import Marginals, SparseVariationalGP
from ._checks import as_inputs, as_targets

__all__ = ["SVGP"]


class SVGP(nn.Module):
    """Sparse variational GP regression/likelihood model over L independent outputs.

    Args:
        kernel: flowgp kernel (batch_shape () or (num_outputs,)).
        inducing_points: initial Z, [M, D] or [L, M, D].
        likelihood: defaults to GaussianLikelihood(num_outputs=L).
        num_outputs: L.
        mean_function, q_var_init, learn_inducing, jitter: passed to SparseVariationalGP.
        quadrature_points: Gauss-Hermite points for non-closed-form expectations in training.
        predict_quadrature_points: points for predictive densities/moments (appendix A.4 uses ~100).
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
        quadrature_points: int = 20,
        predict_quadrature_points: int = 100,
    ):
        super().__init__()
        self.gp = SparseVariationalGP(
            kernel, inducing_points, num_outputs, mean_function, q_var_init, learn_inducing, jitter
        )
        self.likelihood = likelihood if likelihood is not None else GaussianLikelihood(num_outputs=num_outputs)
        self.quadrature_points = int(quadrature_points)
        self.predict_quadrature_points = int(predict_quadrature_points)

    @property
    def input_dim(self) -> int:
        return self.gp.inducing_points.shape[-1]

    @property
    def num_outputs(self) -> int:
        return self.gp.num_outputs

    def _check(self, x, y=None):
        x = as_inputs(x, self.input_dim)
        if y is None:
            return x
        return x, as_targets(y, x.shape[0], self.num_outputs)

    def expected_log_likelihood(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-point E_q(f)[log p(y_n | f_n)], shape [N, L] (closed form for a Gaussian likelihood)."""
        mean, var = self.gp.marginals(x)
        return self.likelihood.expected_log_prob(y, mean, var, self.quadrature_points)

    def elbo(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None) -> torch.Tensor:
        """Minibatch ELBO scaled to the full data set: (N/B) Σ_n ELL_n - KL (appendix eq. 14 with G = I)."""
        x, y = self._check(x, y)
        num_data = x.shape[0] if num_data is None else int(num_data)
        ell = self.expected_log_likelihood(x, y).sum()
        return ell * (num_data / x.shape[0]) - self.gp.kl_divergence()

    def predict_f(self, x: torch.Tensor, full_cov: bool = False) -> Marginals:
        """q(f₀(x*)): marginal mean and variance [N, L] (covariance [L, N, N] with full_cov)."""
        return self.gp.marginals(self._check(x), full_cov=full_cov)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of y* (noise included), each [N, L]."""
        mean, var = self.predict_f(x)
        return self.likelihood.predictive_moments(mean, var)

    def log_predictive_density(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-point log p(y* | x*), [N, L]."""
        x, y = self._check(x, y)
        mean, var = self.gp.marginals(x)
        return self.likelihood.predictive_log_density(y, mean, var, self.predict_quadrature_points)

    def predict_quantiles(self, x: torch.Tensor, probs) -> torch.Tensor:
        """Quantiles of p(y* | x*) at `probs`, [P, N, L]."""
        mean, var = self.predict(x)
        return normal_quantiles(mean, var, probs)

    def sample_f(self, x: torch.Tensor, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Posterior function samples f(x*), [S, N, L] (jointly correlated across x* when full_cov)."""
        return self.gp.sample(self._check(x), num_samples, full_cov=full_cov, generator=generator)
