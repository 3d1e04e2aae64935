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
