"""Variational warped GP, v-WGP (TGP paper §4.3): a sparse GP on T(y) with the likelihood warped by T.

Bound: L̄ = L(T(Y)) + log J_Y with log J_Y = Σ_n log T'(y_n) (scaled by N/B on minibatches): the per-point
term E_q[log N(T(y_n); f_n, σ²)] + log T'(y_n) goes through the one `flowgp.gp.objective.minibatch_bound`
(SVGP.elbo) like every other bound. The warping acts on the targets, not on the latent, so it is not a
`WarpedLikelihood` (whose flow maps the GP's f₀). Predictions map
the Gaussian predictive of z* = T(y*) back through T⁻¹: quantiles and intervals exactly
(appendix A.4.1: CI(y*) = T⁻¹(CI(T(y*)))), the mean and variance by quadrature over z*.
"""
from __future__ import annotations

from ..flows import Flow, make_flow
from ..gp.likelihoods import GaussianLikelihood
from ..gp.prediction import normal_quantiles
from ..numerics.quadrature import gh_points
from .svgp import SVGP

__all__ = ["WarpedGP"]


class WarpedGP(SVGP):
    """SVGP with Gaussian likelihood on the warped targets T(y) (Snelson et al. 2003, sparsified).

    Args:
        kernel, inducing_points: as in :class:`flowgp.SVGP`.
        flow: the warping T, a Flow or spec string onto the real line; y must lie in T's domain (e.g. y > 0
            for "log").
        *args, **kw: SVGP's other arguments (likelihood, which must be a GaussianLikelihood, num_outputs, ...).

    See Also:
        :class:`flowgp.WarpedGPRegressor` (its estimator), :class:`flowgp.TGP`.
    """

    def __init__(self, kernel, inducing_points, flow: Flow | str = "identity", *args, **kw):
        super().__init__(kernel, inducing_points, *args, **kw)
        if not isinstance(self.likelihood, GaussianLikelihood):
            raise TypeError("WarpedGP needs a GaussianLikelihood on the warped targets T(y)")
        flow = make_flow(flow)  # a Flow is used as it is; a spec string is built; anything else: TypeError
        if flow.codomain != "real":
            # z = T(y) is modelled by a Gaussian, which puts mass on every real value: T⁻¹ of a predictive
            # draw outside T's range does not exist (it would come back as NaN means and quantiles)
            raise ValueError(
                f"the v-WGP warping T = '{flow.spec}' maps onto a {flow.codomain} range, but z = T(y) is Gaussian "
                "and takes every real value; use a warping onto the whole real line (e.g. 'sal', 'log' for "
                "positive y, 'boxcox', 'sinharcsinh'), or put the positive flow in a TGP (TGPRegressor)")
        self.flow = flow

    def warp(self, y, x=None):
        """z = T(y) and log T'(y), element-wise; raises a ValueError when y is outside T's domain."""
        return self.flow.forward_and_log_det(y, x)

    def expected_log_likelihood(self, x, y, generator=None, batch_rows=None):
        """Per-point E_q(f)[log N(T(y_n); f_n, σ²)] + log T'(y_n), [N, L]. `batch_rows` (SVGP's signature) is
        unused: the Gaussian likelihood of the warped targets draws nothing."""
        z, log_det = self.warp(y, x)
        mean, var = self.gp.marginals(x)
        return self.likelihood.expected_log_prob(z, mean, var) + log_det

    def _warped_predictive(self, x):
        mean, var = self.gp.marginals(x)
        return self.likelihood.predictive_moments(mean, var)  # of z* = T(y*)

    def predict(self, x, generator=None):
        """E[y*] and Var[y*] with y* = T⁻¹(z*), z* ~ N(μ, v + σ²), by Gauss-Hermite quadrature (draws nothing:
        `generator` is accepted for the signature SVGP's predictions share)."""
        x = self.validate(x)
        mean, var = self._warped_predictive(x)
        z, w = gh_points(mean, var, self.predict_quadrature_points)
        y = self.flow.inverse(z, x, validate=False)
        first = (w * y).sum(0)
        return first, ((w * y.square()).sum(0) - first.square()).clamp_min(0)

    def sample_y(self, x, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Draws of y* = T⁻¹(z*), z* = f + ε with f ~ q(f(x*)) (jointly over x* when full_cov) and ε ~ N(0, σ²),
        [S, N, L]: the predictive whose moments `predict` gives."""
        x = self.validate(x)
        z = self.likelihood.sample(self.gp.sample(x, num_samples, full_cov=full_cov, generator=generator),
                                   generator=generator)
        return self.flow.inverse(z, x, validate=False)

    def predict_median(self, x):
        """Median of y*: T⁻¹(μ)."""
        x = self.validate(x)
        mean, _ = self._warped_predictive(x)
        return self.flow.inverse(mean, x, validate=False)

    def predict_quantiles(self, x, probs, generator=None):
        """Exact quantiles T⁻¹(μ + sqrt(v + σ²) Φ⁻¹(p)), [P, N, L] (appendix A.4.1)."""
        x = self.validate(x)
        mean, var = self._warped_predictive(x)
        return self.flow.inverse(normal_quantiles(mean, var, probs), x, validate=False)

    def log_predictive_density(self, x, y, generator=None):
        """log p(y*) = log N(T(y*); μ, v + σ²) + log T'(y*), [N, L]."""
        x, y = self.validate(x, y)
        z, log_det = self.warp(y, x)
        mean, var = self.gp.marginals(x)
        return self.likelihood.predictive_log_density(z, mean, var) + log_det
