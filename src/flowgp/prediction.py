"""Predictive summaries of y* = G(f₀) + noise under q(f₀) = N(mean, var) (TGP appendix A.4, eqs. 19-20).

Moments use Gauss-Hermite quadrature over f₀; log densities use quadrature with log-sum-exp; quantiles
invert the quadrature mixture CDF F(t) = Σ_q w_q P(y ≤ t | G(f_q)) by vectorised bisection, which is
exact up to the quadrature error because every flow is monotone.
"""
from __future__ import annotations

import torch

from .quadrature import gh_points

__all__ = ["flow_predictive_moments", "flow_log_predictive_density", "mixture_quantiles", "normal_quantiles",
           "gaussian_mixture_quantiles", "likelihood_mixture_quantiles", "flow_mixture_quantiles",
           "check_probabilities"]


def flow_predictive_moments(flow, likelihood, mean, var, x=None, num_points: int = 100):
    """E[y*] and Var[y*] with y* | f₀ having moments likelihood.conditional_moments(G(f₀))."""
    f, w = gh_points(mean, var, num_points)
    g = flow(f, x, validate=False)
    cond_mean, cond_var = likelihood.conditional_moments(g)
    first = (w * cond_mean).sum(0)
    second = (w * (cond_mean.square() + cond_var)).sum(0)
    return first, (second - first.square()).clamp_min(0)


def flow_log_predictive_density(flow, likelihood, y, mean, var, x=None, num_points: int = 100):
    """log p(y* | x*) = log Σ_q w_q p(y* | G(f_q)) (appendix eq. 19) computed with log-sum-exp."""
    f, w = gh_points(mean, var, num_points)
    g = flow(f, x, validate=False)
    return torch.logsumexp(w.log() + likelihood.log_prob(y, g), dim=0)


def normal_quantiles(mean, var, probs):
    """Quantiles of N(mean, var) at probabilities `probs` ([P]); output [P, *mean.shape]."""
    probs = check_probabilities(probs, mean)
    z = torch.special.ndtri(probs).view((-1,) + (1,) * mean.dim())
    return mean + var.clamp_min(0).sqrt() * z


def check_probabilities(probs, like: torch.Tensor) -> torch.Tensor:
    """`probs` as a 1-D tensor of like's dtype/device; ValueError unless every value lies in (0, 1)."""
    probs = torch.as_tensor(probs, dtype=like.dtype, device=like.device).reshape(-1)
    if torch.any(~((probs > 0) & (probs < 1))):
        raise ValueError(f"quantile probabilities must lie in (0, 1), got {probs.tolist()}")
    return probs


def mixture_quantiles(component_cdf, weights, locations, spreads, probs, iterations: int = 80) -> torch.Tensor:
    """Quantiles of the mixture F(t) = Σ_k w_k F_k(t) by vectorised bisection: the one quantile solver.

    Every predictive of flowgp is such a mixture: Gauss-Hermite nodes of q(f₀) pushed through a flow (TGP,
    appendix eq. 19-20), Monte Carlo samples of the hidden layers (deep GPs) or of z (latent deep GPs).
    Each F_k is increasing, so F is, and bisection inside a bracket that holds every component's mass is
    exact to the bracket width / 2^iterations (80 steps reach float64 resolution).

    Args:
        component_cdf: t [P, 1, ...] -> F_k(t) [P, K, ...] (broadcasting over the K components on dim 1).
        weights: w_k, broadcastable to [K, ...], summing to one over K.
        locations, spreads: [K, ...] component centres and scales; the bracket is
            [min_k (loc - 10 spread), max_k (loc + 10 spread)].
        probs: P probabilities in (0, 1).
    Returns [P, ...].
    """
    probs = check_probabilities(probs, locations)
    with torch.no_grad():
        lo = (locations - 10 * spreads).amin(0) - 1e-9
        hi = (locations + 10 * spreads).amax(0) + 1e-9
        lo = lo.unsqueeze(0).expand((len(probs),) + lo.shape).clone()
        hi = hi.unsqueeze(0).expand_as(lo).clone()
        target = probs.view((-1,) + (1,) * (lo.dim() - 1))
        for _ in range(iterations):  # each step halves the bracket
            mid = 0.5 * (lo + hi)
            cdf = (weights * component_cdf(mid.unsqueeze(1))).sum(1)
            below = cdf < target
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)


def gaussian_mixture_quantiles(mean: torch.Tensor, var: torch.Tensor, probs, iterations: int = 80) -> torch.Tensor:
    """Quantiles [P, ...] of (1/S) Σ_s N(mean_s, var_s), components on dim 0 (deep-GP predictives)."""
    std = var.clamp_min(0).sqrt()
    return mixture_quantiles(lambda t: torch.special.ndtr((t - mean) / std.clamp_min(1e-300)),
                             1.0 / mean.shape[0], mean, std, probs, iterations)


def likelihood_mixture_quantiles(likelihood, nodes: torch.Tensor, weights: torch.Tensor, probs,
                                 iterations: int = 80) -> torch.Tensor:
    """Quantiles [P, ...] of Σ_q w_q p(y | g_q) for likelihood values g [Q, ...] with weights w [Q, ...]."""
    spread = likelihood.conditional_moments(nodes)[1].sqrt()
    return mixture_quantiles(lambda t: likelihood.cdf(t, nodes), weights, nodes, spread, probs, iterations)


def flow_mixture_quantiles(flow, likelihood, mean, var, probs, x=None, num_points: int = 100,
                           iterations: int = 80):
    """Quantiles of p(y*) = Σ_q w_q p(y* | G(f_q)) under q(f₀) = N(mean, var); output [P, *mean.shape]."""
    probs = check_probabilities(probs, mean)
    with torch.no_grad():
        f, w = gh_points(mean, var, num_points)
        return likelihood_mixture_quantiles(likelihood, flow(f, x, validate=False), w, probs, iterations)
