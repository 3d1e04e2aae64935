"""Likelihoods p(y | f) with their expectations under Gaussian marginals q(f) = N(mean, var).

Shapes: y, f, mean and var broadcast element-wise; outputs are log-densities per element (sum over
data and outputs is the caller's job). `f` may carry extra leading dimensions (quadrature nodes,
Monte Carlo samples).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .constraints import Positive
from .quadrature import expectation, log_expectation_exp

__all__ = ["Likelihood", "GaussianLikelihood"]

_LOG_2PI = math.log(2.0 * math.pi)


class Likelihood(nn.Module):
    """Base class: subclasses give `log_prob(y, f)`; expectations default to Gauss-Hermite quadrature."""

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def expected_log_prob(self, y, mean, var, num_points: int = 20) -> torch.Tensor:
        """E_{q(f)}[log p(y | f)] (the ELL integrand of TGP appendix eq. 14 with G = I)."""
        return expectation(lambda f: self.log_prob(y, f), mean, var, num_points)

    def conditional_moments(self, f):
        """E[y | f] and Var[y | f] (used for predictive moments through a flow)."""
        raise NotImplementedError

    def predictive_log_density(self, y, mean, var, num_points: int = 100) -> torch.Tensor:
        """log ∫ p(y | f) N(f; mean, var) df (appendix eq. 19) by quadrature with log-sum-exp."""
        return log_expectation_exp(lambda f: self.log_prob(y, f), mean, var, num_points)


class GaussianLikelihood(Likelihood):
    """p(y | f) = N(y; f, σ²), σ² stored through a softplus with a floor (one noise per output)."""

    def __init__(self, noise: float = 0.05, num_outputs: int = 1, noise_floor: float = 1e-6):
        super().__init__()
        if not noise > noise_floor:
            raise ValueError(f"noise must be > noise_floor={noise_floor}, got {noise}")
        self._positive = Positive(lower=noise_floor)
        raw = self._positive.inverse(torch.full((num_outputs,), float(noise), dtype=torch.float64))
        self.raw_noise = nn.Parameter(raw.to(torch.get_default_dtype()))

    @property
    def noise(self) -> torch.Tensor:
        """σ², shape [L] (broadcasts against [..., N, L])."""
        return self._positive(self.raw_noise)

    @noise.setter
    def noise(self, value) -> None:
        value = torch.as_tensor(value, dtype=self.raw_noise.dtype, device=self.raw_noise.device)
        with torch.no_grad():
            self.raw_noise.copy_(self._positive.inverse(value).expand_as(self.raw_noise))

    def log_prob(self, y, f):
        noise = self.noise
        return -0.5 * (_LOG_2PI + noise.log() + (y - f).square() / noise)

    def expected_log_prob(self, y, mean, var, num_points: int = 20):
        """Closed form: -½ log 2πσ² - ((y - μ)² + v) / 2σ²."""
        noise = self.noise
        return -0.5 * (_LOG_2PI + noise.log() + ((y - mean).square() + var) / noise)

    def conditional_moments(self, f):
        """E[y | f] and Var[y | f]."""
        return f, self.noise.expand_as(f)

    def predictive_moments(self, mean, var):
        """Mean and variance of y* = f + ε under f ~ N(mean, var)."""
        return mean, var + self.noise

    def predictive_log_density(self, y, mean, var, num_points: int = 100):
        """Closed form log N(y; μ, v + σ²)."""
        total = var + self.noise
        return -0.5 * (_LOG_2PI + total.log() + (y - mean).square() / total)

    def cdf(self, y, f):
        """P(Y <= y | f), used to invert mixture CDFs for predictive quantiles."""
        return torch.special.ndtr((y - f) / self.noise.sqrt())

    def sample(self, f, generator: torch.Generator | None = None):
        eps = torch.randn(f.shape, dtype=f.dtype, device=f.device, generator=generator)
        return f + self.noise.sqrt() * eps


# ----------------------------------------------------------------------------------------------------
# Classification likelihoods (TGP paper §5.2, appendix B.6: probit for binary, softmax for multiclass;
# robust max of Hernández-Lobato et al. 2011 for deep GP classification).
# ----------------------------------------------------------------------------------------------------
__all__ += ["BernoulliLikelihood", "SoftmaxLikelihood", "RobustMaxLikelihood"]


def _labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Integer class indices in [0, C) as int64 (accepts float tensors holding whole numbers)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor of class indices, got {type(y).__name__}")
    if y.is_floating_point():
        if not torch.all(y == y.round()):
            raise ValueError("y must hold integer class indices 0..C-1, got non-integer values")
        y = y.long()
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"y must hold class indices in [0, {num_classes}), got range [{int(y.min())}, {int(y.max())}]")
    return y


class BernoulliLikelihood(Likelihood):
    """p(y | f) = Φ((2y - 1) f) for y ∈ {0, 1} (probit link, TGP appendix B.6).

    `f` and `y` broadcast element-wise (e.g. f [Q, N, 1], y [N, 1]). The ELL has no closed form and uses
    Gauss-Hermite quadrature (base class); the predictive p(y=1) = Φ(μ / sqrt(1 + σ²)) is exact.
    """

    def log_prob(self, y, f):
        return torch.special.log_ndtr((2.0 * y - 1.0) * f)

    def predictive_prob(self, mean, var):
        """p(y* = 1) = ∫ Φ(f) N(f; μ, σ²) df = Φ(μ / sqrt(1 + σ²))."""
        return torch.special.ndtr(mean / torch.sqrt(1.0 + var))

    def predictive_log_density(self, y, mean, var, num_points: int = 100):
        """Closed form log Φ((2y - 1) μ / sqrt(1 + σ²))."""
        return torch.special.log_ndtr((2.0 * y - 1.0) * mean / torch.sqrt(1.0 + var))

    def conditional_moments(self, f):
        p = torch.special.ndtr(f)
        return p, p * (1.0 - p)


class SoftmaxLikelihood(Likelihood):
    """Categorical p(y = c | f) = softmax(f)_c over C independent latents (TGP appendix B.6).

    `f` has shape [..., C] (classes last) and y [...] holds class indices; log_prob returns [...].
    Expectations under q(f) = Π_c N(μ_c, σ²_c) use reparameterised Monte Carlo (S samples, batched).
    """

    def __init__(self, num_classes: int):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        self.num_classes = num_classes

    def log_prob(self, y, f):
        y = _labels(y, self.num_classes)
        logp = torch.log_softmax(f, dim=-1)
        index = y.expand(logp.shape[:-1]).unsqueeze(-1)
        return torch.gather(logp, -1, index).squeeze(-1)

    def _samples(self, mean, var, num_samples, generator):
        eps = torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        return mean + var.clamp_min(0).sqrt() * eps

    def expected_log_prob(self, y, mean, var, num_samples: int = 20, generator=None):
        """(1/S) Σ_s log softmax(μ + σ ε_s)_y, ε_s ~ N(0, I): unbiased and reparameterised. Returns [...]."""
        return self.log_prob(y, self._samples(mean, var, num_samples, generator)).mean(0)

    def predictive_probs(self, mean, var, num_samples: int = 100, generator=None):
        """p(y* = c) ≈ (1/S) Σ_s softmax(f_s)_c; sums to one over the last dimension."""
        return torch.softmax(self._samples(mean, var, num_samples, generator), dim=-1).mean(0)

    def predictive_log_density(self, y, mean, var, num_samples: int = 100, generator=None):
        probs = self.predictive_probs(mean, var, num_samples, generator)
        y = _labels(y, self.num_classes)
        return torch.gather(probs, -1, y.unsqueeze(-1)).squeeze(-1).log()


class RobustMaxLikelihood(Likelihood):
    """Robust max (Hernández-Lobato et al. 2011): p(y = c | f) = 1 - ε if c = argmax f, else ε / (C - 1).

    With independent q(f_c) = N(μ_c, σ²_c), P(argmax f = y) = ∫ N(t; μ_y, σ²_y) Π_{c≠y} Φ((t - μ_c)/σ_c) dt,
    a one-dimensional integral done by Gauss-Hermite quadrature; then
    E[log p(y | f)] = P·log(1 - ε) + (1 - P)·log(ε / (C - 1)). `f` has shape [..., C], y [...].
    """

    def __init__(self, num_classes: int, epsilon: float = 1e-3):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        if not 0.0 < epsilon < 1.0 - 1.0 / num_classes:
            raise ValueError(f"epsilon must lie in (0, 1 - 1/C) = (0, {1 - 1 / num_classes:.4g}), got {epsilon}")
        self.num_classes = num_classes
        self.epsilon = float(epsilon)

    def _log_levels(self):
        return math.log1p(-self.epsilon), math.log(self.epsilon / (self.num_classes - 1))

    def log_prob(self, y, f):
        y = _labels(y, self.num_classes)
        top = f.argmax(-1)
        hit, miss = self._log_levels()
        return torch.where(top == y, f.new_tensor(hit), f.new_tensor(miss))

    def prob_argmax(self, y, mean, var, num_points: int = 20):
        """P(argmax_c f_c = y) under independent Gaussians, [...] (quadrature over f_y)."""
        y = _labels(y, self.num_classes)
        std = var.clamp_min(1e-12).sqrt()
        idx = y.expand(mean.shape[:-1]).unsqueeze(-1)
        mu_y = torch.gather(mean, -1, idx)  # [..., 1]
        sd_y = torch.gather(std, -1, idx)
        nodes, weights = gauss_hermite_nodes(num_points, mean)
        weights = weights.squeeze(-1)  # [Q, 1, ...] against the class-free result [...]
        t = mu_y.unsqueeze(0) + sd_y.unsqueeze(0) * nodes  # [Q, ..., 1]
        log_cdf = torch.special.log_ndtr((t - mean.unsqueeze(0)) / std.unsqueeze(0))  # [Q, ..., C]
        # the class y itself must not enter the product
        own = torch.zeros_like(mean, dtype=torch.bool).scatter(-1, idx, True)
        log_cdf = log_cdf.masked_fill(own.unsqueeze(0), 0.0)
        return (weights * log_cdf.sum(-1).exp()).sum(0)

    def expected_log_prob(self, y, mean, var, num_points: int = 20):
        """E_q[log p(y | f)] = P·log(1 - ε) + (1 - P)·log(ε/(C-1)), P = P(argmax = y) by 1-D quadrature."""
        p = self.prob_argmax(y, mean, var, num_points)
        hit, miss = self._log_levels()
        return p * hit + (1.0 - p) * miss

    def predictive_probs(self, mean, var, num_points: int = 20):
        """p(y* = c) = ε/(C-1) + (1 - ε - ε/(C-1))·P(argmax = c), [..., C]; sums to one."""
        c = self.num_classes
        labels = torch.arange(c, device=mean.device).view((c,) + (1,) * (mean.dim() - 1))
        p = self.prob_argmax(labels, mean.unsqueeze(0).expand((c,) + mean.shape),
                             var.unsqueeze(0).expand((c,) + var.shape), num_points)  # [C, ...]
        p = p.movedim(0, -1)
        low = self.epsilon / (c - 1)
        return low + (1.0 - self.epsilon - low) * p

    def predictive_log_density(self, y, mean, var, num_points: int = 20):
        p = self.prob_argmax(y, mean, var, num_points)
        low = self.epsilon / (self.num_classes - 1)
        return (low + (1.0 - self.epsilon - low) * p).log()


def gauss_hermite_nodes(num_points: int, like: torch.Tensor):
    """Standard-normal nodes z_q and weights w_q shaped [Q, 1, ..., 1] to broadcast against `like` + [1]."""
    from .quadrature import gauss_hermite

    nodes, weights = gauss_hermite(num_points, like.dtype, like.device)
    shape = (num_points,) + (1,) * like.dim()
    return nodes.view(shape), weights.view(shape)
