"""Transformed GP (Maroñas et al. 2021): f_K = G(f₀), f₀ ~ sparse GP, q(u_K) = q(u₀) J_{u_K}.

ELBO (TGP appendix eq. 14): Σ_n E_{q(f₀,n)}[log p(y_n | G(f₀,n))] - KL[q(u₀) || p(u₀)], the expectation by
one-dimensional Gauss-Hermite quadrature; no Jacobian or inverse of G is needed.
"""
from __future__ import annotations

import torch

from ..flows import Flow, make_flow
from ..likelihoods import GaussianLikelihood
from ..prediction import (
    flow_log_predictive_density,
    flow_predictive_moments,
    mixture_quantiles,
    normal_quantiles,
)
from ..quadrature import gh_points
from .svgp import SVGP

__all__ = ["TGP"]


class TGP(SVGP):
    """SVGP whose prior (and posterior) is warped element-wise by a monotone flow G.

    Args (beyond SVGP's):
        flow: a Flow or a spec string such as "sal+softplus"; its domain must be the real line.
        closed_form_affine: when G is affine and the likelihood Gaussian, use the exact Gaussian
            expectations instead of quadrature (identical up to round-off, faster).
    """

    def __init__(self, kernel, inducing_points, flow: Flow | str = "identity", *args, closed_form_affine=True, **kw):
        super().__init__(kernel, inducing_points, *args, **kw)
        flow = make_flow(flow) if isinstance(flow, str) else flow
        if not isinstance(flow, Flow):
            raise TypeError(f"flow must be a flowgp Flow or a spec string, got {type(flow).__name__}")
        if flow.domain != "real":
            raise ValueError(
                f"flow '{flow.spec}' needs positive inputs but the GP prior f₀ takes every real value; "
                "use it as the likelihood warping of WarpedGP, or a positive-enforcing flow such as 'softplus'"
            )
        self.flow = flow
        self.closed_form_affine = bool(closed_form_affine)

    def _affine_marginals(self, x, mean, var):
        """q(f_K) = N(a + b·mean, b²·var) when G(f) = a + b f and the likelihood is Gaussian, else None."""
        if not (self.closed_form_affine and isinstance(self.likelihood, GaussianLikelihood)):
            return None
        coefficients = self.flow.affine_coefficients(x)
        if coefficients is None:
            return None
        a, b = coefficients
        return a + b * mean, b.square() * var

    def expected_log_likelihood(self, x, y):
        """Per-point E_{q(f₀,n)}[log p(y_n | G(f₀,n))], [N, L] (appendix eq. 14)."""
        mean, var = self.gp.marginals(x)
        affine = self._affine_marginals(x, mean, var)
        if affine is not None:
            return self.likelihood.expected_log_prob(y, *affine)
        f, w = gh_points(mean, var, self.quadrature_points)
        return (w * self.likelihood.log_prob(y, self.flow(f, x, validate=False))).sum(0)

    def predict(self, x):
        """E[y*] and Var[y*] under ∫ p(y* | G(f₀)) q(f₀) df₀ by quadrature (paper §4.5)."""
        x = self._check(x)
        mean, var = self.gp.marginals(x)
        affine = self._affine_marginals(x, mean, var)
        if affine is not None:
            return self.likelihood.predictive_moments(*affine)
        return flow_predictive_moments(self.flow, self.likelihood, mean, var, x, self.predict_quadrature_points)

    def log_predictive_density(self, x, y):
        """log p(y* | x*) = log ∫ p(y* | G(f₀)) q(f₀) df₀ (appendix eq. 19), quadrature + log-sum-exp."""
        x, y = self._check(x, y)
        mean, var = self.gp.marginals(x)
        affine = self._affine_marginals(x, mean, var)
        if affine is not None:
            return self.likelihood.predictive_log_density(y, *affine)
        return flow_log_predictive_density(
            self.flow, self.likelihood, y, mean, var, x, self.predict_quadrature_points
        )

    def predict_quantiles(self, x, probs):
        """Quantiles of p(y* | x*) by inverting the quadrature mixture CDF, [P, N, L]."""
        x = self._check(x)
        mean, var = self.gp.marginals(x)
        return mixture_quantiles(
            self.flow, self.likelihood, mean, var, probs, x, self.predict_quadrature_points
        )

    def predict_latent_quantiles(self, x, probs):
        """Quantiles of f_K(x*) = G(f₀(x*)): exact, G(quantile of f₀), since G is increasing."""
        x = self._check(x)
        mean, var = self.gp.marginals(x)
        return self.flow(normal_quantiles(mean, var, probs), x, validate=False)

    def sample_f(self, x, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Posterior samples of the transformed process f_K(x*) = G(f₀(x*)), [S, N, L]."""
        x = self._check(x)
        f0 = self.gp.sample(x, num_samples, full_cov=full_cov, generator=generator)
        return self.flow(f0, x, validate=False)
