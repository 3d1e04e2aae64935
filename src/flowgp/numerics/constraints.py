"""Positive parametrisations: parameters are stored unconstrained and mapped through a named transform.

Softplus keeps gradients well scaled for values spanning several orders of magnitude (GPflow's choice);
a small lower bound keeps variances and lengthscales away from exactly zero.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["Positive", "positive", "inv_softplus"]


def inv_softplus(y: torch.Tensor) -> torch.Tensor:
    """Inverse of softplus, stable for large and tiny y: log(exp(y) - 1) = y + log(-expm1(-y))."""
    return y + torch.log(-torch.expm1(-y))


class Positive:
    """x = lower + softplus(raw); `inverse` maps a constrained value back to its raw storage."""

    name = "softplus"

    def __init__(self, lower: float = 0.0):
        if lower < 0 or not math.isfinite(lower):
            raise ValueError(f"lower must be a finite non-negative number, got {lower}")
        self.lower = float(lower)

    def __call__(self, raw: torch.Tensor) -> torch.Tensor:
        return F.softplus(raw) + self.lower

    def inverse(self, value: torch.Tensor) -> torch.Tensor:
        value = torch.as_tensor(value)
        if torch.any(value <= self.lower):
            raise ValueError(f"value must be > {self.lower} for a positive parameter, got {value}")
        return inv_softplus(value - self.lower)

    def __repr__(self) -> str:
        return f"Positive(lower={self.lower})"


#: the default constraint of positive parameters: `Positive()` (softplus with a floor)
positive = Positive()
