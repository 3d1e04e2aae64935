"""Transformed GP (Maroñas et al. 2021): f_K = G(f₀), f₀ ~ sparse GP, q(u_K) = q(u₀) J_{u_K}.

ELBO (TGP appendix eq. 14): Σ_n E_{q(f₀,n)}[log p(y_n | G(f₀,n))] - KL[q(u₀) || p(u₀)], the expectation by
one-dimensional Gauss-Hermite quadrature; no Jacobian or inverse of G is needed.

With input-dependent flows G_{θ(x, W)} (paper §3.2-3.3, §4.4; `flowgp.flows.conditional`) the ELL also
averages S draws of W (appendix A.3): (1/S) Σ_s E_{q(f₀,n)}[log p(y_n | G_{θ(x_n, W_s)}(f₀,n))], computed as
one batched tensor [Q quadrature nodes, S, N, L], and the ELBO subtracts the network's penalty (KL[q(W)||p(W)]
for VB, λ/2·||W||² for point/MC-dropout networks). Predictions are the mixture of appendix eq. 20 over S
draws (BA-TGP, VB) or one deterministic pass (PE-TGP).
"""
from __future__ import annotations

import contextlib
import math

import torch

from ..flows import Flow, make_flow
from ..flows.conditional import input_dependent_flows, weight_sampling
from ..likelihoods import GaussianLikelihood
from ..prediction import (
    flow_log_predictive_density,
    flow_predictive_moments,
    check_probabilities,
    flow_mixture_quantiles,
    likelihood_mixture_quantiles,
    normal_quantiles,
)
from ..quadrature import gh_points
from .svgp import SVGP

__all__ = ["TGP"]

_nullcontext = contextlib.nullcontext
_MIXTURE_QUANTILE_POINTS = 20  # nodes per W draw for mixture quantiles (see TGP._mixture_quantiles)


class TGP(SVGP):
    """SVGP whose prior (and posterior) is warped element-wise by a monotone flow G.

    Args (beyond SVGP's):
        flow: a Flow or a spec string such as "sal+softplus"; its domain must be the real line.
        closed_form_affine: when G is affine and the likelihood Gaussian, use the exact Gaussian
            expectations instead of quadrature (identical up to round-off, faster).
        mc_samples_train: S, draws of W per ELBO evaluation in training for input-dependent flows (default 1).
        mc_samples_predict: S for predictions and evaluation (default 100; appendix eq. 20). Networks in
            "point" mode (PE-TGP) predict with one deterministic pass instead.
    """

    def __init__(self, kernel, inducing_points, flow: Flow | str = "identity", *args, closed_form_affine=True,
                 mc_samples_train: int = 1, mc_samples_predict: int = 100, **kw):
        for name, value in (("mc_samples_train", mc_samples_train), ("mc_samples_predict", mc_samples_predict)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
        self.mc_samples_train = int(mc_samples_train)
        self.mc_samples_predict = int(mc_samples_predict)

    # ------------------------------------------------------------------ input-dependent flows
    @property
    def input_dependent(self) -> bool:
        """Whether some stage of the flow takes its parameters from a network of x."""
        return bool(input_dependent_flows(self.flow))

    def flow_penalty(self):
        """Σ over the flow's networks of KL[q(W)||p(W)] (VB) or λ/2·||W||² (point / MC dropout); 0 without."""
        stages = input_dependent_flows(self.flow)
        if not stages:
            return self.gp.q_mu.new_zeros(())
        return sum(s.network.penalty() for s in stages)

    def _sampling(self, train: bool):
        """(S, sample): S stochastic draws of W, or (1, False) for the deterministic network (PE prediction)."""
        if train:
            return self.mc_samples_train, True
        if all(s.network.stochastic_prediction for s in input_dependent_flows(self.flow)):
            return self.mc_samples_predict, True
        return 1, False

    def _warped_nodes(self, x, mean, var, num_points: int, train: bool):
        """G_{θ(x, W_s)}(f_q) at Gauss-Hermite nodes of q(f₀): values [Q, S, N, L] and weights [Q, 1, 1, 1].

        One batched evaluation over nodes, W samples and data (no loop); S = 1 when deterministic.
        """
        f, w = gh_points(mean, var, num_points)
        num_samples, sample = self._sampling(train)
        with weight_sampling(self.flow, num_samples, sample):
            g = self.flow(f.unsqueeze(1), x, validate=False)
        return g, w.unsqueeze(1)

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
        if self.input_dependent:
            # (1/S) Σ_s Σ_q w_q log p(y_n | G_{θ(x_n, W_s)}(f_q)), appendix A.3; S draws in training.
            g, w = self._warped_nodes(x, mean, var, self.quadrature_points, train=self.training)
            return (w * self.likelihood.log_prob(y, g)).sum(0).mean(0)
        affine = self._affine_marginals(x, mean, var)
        if affine is not None:
            return self.likelihood.expected_log_prob(y, *affine)
        f, w = gh_points(mean, var, self.quadrature_points)
        return (w * self.likelihood.log_prob(y, self.flow(f, x, validate=False))).sum(0)

    def elbo(self, x, y, num_data=None):
        """(N/B) Σ_batch ELL_n - KL[q(u₀)||p(u₀)] - (KL[q(W)||p(W)] or λ/2·||W||²) (appendix A.3)."""
        value = super().elbo(x, y, num_data)
        return value - self.flow_penalty() if self.input_dependent else value

    def predict(self, x):
        """E[y*] and Var[y*] under ∫ p(y* | G(f₀)) q(f₀) df₀ by quadrature (paper §4.5)."""
        x = self._check(x)
        mean, var = self.gp.marginals(x)
        if self.input_dependent:
            # Mixture over nodes q and W draws s with weights w_q / S (appendix eq. 20).
            g, w = self._warped_nodes(x, mean, var, self.predict_quadrature_points, train=False)
            cond_mean, cond_var = self.likelihood.conditional_moments(g)
            first = (w * cond_mean).sum(0).mean(0)
            second = (w * (cond_mean.square() + cond_var)).sum(0).mean(0)
            return first, (second - first.square()).clamp_min(0)
        affine = self._affine_marginals(x, mean, var)
        if affine is not None:
            return self.likelihood.predictive_moments(*affine)
        return flow_predictive_moments(self.flow, self.likelihood, mean, var, x, self.predict_quadrature_points)

    def log_predictive_density(self, x, y):
        """log p(y* | x*) = log ∫ p(y* | G(f₀)) q(f₀) df₀ (appendix eq. 19), quadrature + log-sum-exp."""
        x, y = self._check(x, y)
        mean, var = self.gp.marginals(x)
        if self.input_dependent:
            # log (1/S) Σ_s Σ_q w_q p(y* | G_{θ(x*, W_s)}(f_q)), appendix eq. 20, with log-sum-exp.
            g, w = self._warped_nodes(x, mean, var, self.predict_quadrature_points, train=False)
            log_terms = w.log() + self.likelihood.log_prob(y, g)
            return torch.logsumexp(log_terms.flatten(0, 1), dim=0) - math.log(g.shape[1])
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
        if self.input_dependent:
            return self._mixture_quantiles(x, mean, var, probs)
        return flow_mixture_quantiles(
            self.flow, self.likelihood, mean, var, probs, x, self.predict_quadrature_points
        )

    def _mixture_quantiles(self, x, mean, var, probs, iterations: int = 80):
        """Quantiles of the eq. 20 mixture Σ_{q,s} (w_q/S) p(y* | G_s(f_q)) by bisection on its CDF.

        With S > 1 draws of W each draw gets min(Q, 20) nodes: the bisection costs S·Q per point and
        iteration, and the Monte Carlo error over W dominates the quadrature error of 20 nodes.
        """
        probs = check_probabilities(probs, mean)
        num_points = self.predict_quadrature_points
        if self._sampling(train=False)[0] > 1:
            num_points = min(num_points, _MIXTURE_QUANTILE_POINTS)
        with torch.no_grad():
            g, w = self._warped_nodes(x, mean, var, num_points, train=False)
            num_samples = g.shape[1]
            w = (w / num_samples).expand(-1, num_samples, -1, -1).flatten(0, 1)  # [Q·S, 1, 1]
            return likelihood_mixture_quantiles(self.likelihood, g.flatten(0, 1), w, probs, iterations)

    def predict_latent_quantiles(self, x, probs):
        """Quantiles of f_K(x*) = G(f₀(x*)): exact, G(quantile of f₀), since G is increasing."""
        x = self._check(x)
        mean, var = self.gp.marginals(x)
        if self.input_dependent and self._sampling(train=False)[1]:
            raise NotImplementedError(
                "latent quantiles of a Bayesian input-dependent flow are a mixture over W; use sample_f, or "
                "switch the networks to bayesian='point' for the deterministic (PE-TGP) warping")
        with weight_sampling(self.flow, 1, False) if self.input_dependent else _nullcontext():
            return self.flow(normal_quantiles(mean, var, probs), x, validate=False)

    def sample_f(self, x, num_samples: int = 1, full_cov: bool = True, generator=None):
        """Posterior samples of the transformed process f_K(x*) = G(f₀(x*)), [S, N, L]."""
        x = self._check(x)
        f0 = self.gp.sample(x, num_samples, full_cov=full_cov, generator=generator)
        if self.input_dependent:
            # One W draw per function sample (S = num_samples); with dropout networks the masks are
            # also drawn per input point, so only the GP part is jointly correlated across x*.
            _, sample = self._sampling(train=False)
            with weight_sampling(self.flow, num_samples if sample else 1, sample):
                return self.flow(f0, x, validate=False)
        return self.flow(f0, x, validate=False)
