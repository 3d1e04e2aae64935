"""Predictive summaries of y* = G(f₀) + noise under q(f₀) = N(mean, var) (TGP appendix A.4, eqs. 19-20).

Moments use Gauss-Hermite quadrature over f₀; log densities use quadrature with log-sum-exp; quantiles
invert the quadrature mixture CDF F(t) = Σ_q w_q P(y ≤ t | G(f_q)) by vectorised bisection, which is
exact up to the quadrature error because every flow is monotone.
"""
from __future__ import annotations

import torch

from .quadrature import gh_points

__all__ = ["flow_predictive_moments", "flow_log_predictive_density", "mixture_quantiles", "normal_quantiles"]


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
    probs = torch.as_tensor(probs, dtype=mean.dtype, device=mean.device)
    z = torch.special.ndtri(probs).view((-1,) + (1,) * mean.dim())
    return mean + var.clamp_min(0).sqrt() * z


def mixture_quantiles(flow, likelihood, mean, var, probs, x=None, num_points: int = 100, iterations: int = 80):
    """Quantiles of p(y*) = Σ_q w_q p(y* | G(f_q)); needs likelihood.cdf. Output [P, *mean.shape]."""
    probs = torch.as_tensor(probs, dtype=mean.dtype, device=mean.device)
    if torch.any((probs <= 0) | (probs >= 1)):
        raise ValueError(f"quantile probabilities must lie in (0, 1), got {probs.tolist()}")
    with torch.no_grad():
        f, w = gh_points(mean, var, num_points)
        g = flow(f, x, validate=False)  # [Q, ...]
        spread = likelihood.conditional_moments(g)[1].sqrt().amax(0)
        lo = g.amin(0) - 10 * spread - 1e-9
        hi = g.amax(0) + 10 * spread + 1e-9
        shape = (-1,) + (1,) * mean.dim()
        target = probs.view(shape)
        lo = lo.unsqueeze(0).expand((len(probs),) + lo.shape).clone()
        hi = hi.unsqueeze(0).expand_as(lo).clone()
        for _ in range(iterations):  # bisection halves the bracket: 80 steps reach float64 resolution
            mid = 0.5 * (lo + hi)
            cdf = (w.unsqueeze(0) * likelihood.cdf(mid.unsqueeze(1), g.unsqueeze(0))).sum(1)
            below = cdf < target
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)
