"""Positive parametrisations: parameters are stored unconstrained and mapped through a named transform.

Softplus keeps gradients well scaled for values spanning several orders of magnitude (GPflow's choice);
a small lower bound keeps variances and lengthscales away from exactly zero.

The one convention: x = softplus(raw) + lower (optionally max(·, floor)), computed by `softplus_positive`
(also as the object `Positive`), stored as raw = `inv_softplus`(x - lower). Kernels, likelihoods, flows, the
flow-parameter networks, the latent encoders and the CNF posterior all use it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["Positive", "positive", "softplus_positive", "inv_softplus"]


def softplus_positive(raw: torch.Tensor, lower=0.0, floor: float | None = None) -> torch.Tensor:
    """x = softplus(raw) + lower, then max(x, floor) where `floor` is given.

    `lower` is a number or a tensor of bounds broadcasting against raw. No Python branch depends on a tensor's
    value, so a compiled step traces it once.

    Args:
        raw: the unconstrained tensor.
        lower: the lower bound (a number or a tensor broadcasting against raw).
        floor: a minimum applied after the softplus (None: none).

    See Also:
        :class:`flowgp.numerics.constraints.Positive`.
    """
    value = F.softplus(raw) + lower
    return value if floor is None else value.clamp_min(floor)


def inv_softplus(y):
    """Inverse of softplus, stable for large and tiny y: log(exp(y) - 1) = y + log(-expm1(-y)).

    A Python number gives a Python float (computed in double precision), a tensor a tensor of its dtype.

    Args:
        y: positive values: a Python number or a tensor.

    Examples:
        >>> import math
        >>> from flowgp.numerics.constraints import inv_softplus
        >>> round(math.log1p(math.exp(inv_softplus(2.0))), 12)
        2.0
    """
    if isinstance(y, (int, float)):
        return y + math.log(-math.expm1(-y))
    return y + torch.log(-torch.expm1(-y))


class Positive:
    """x = lower + softplus(raw) (`softplus_positive`); `inverse` maps a constrained value back to its raw storage.

    Args:
        lower: the lower bound of the constrained value; default 0.

    Examples:
        >>> import torch
        >>> from flowgp.numerics.constraints import Positive
        >>> c = Positive(lower=1e-6)
        >>> x = torch.tensor([0.5, 2.0], dtype=torch.float64)
        >>> torch.allclose(c(c.inverse(x)), x)
        True
    """

    name = "softplus"

    def __init__(self, lower: float = 0.0):
        if lower < 0 or not math.isfinite(lower):
            raise ValueError(f"lower must be a finite non-negative number, got {lower}")
        self.lower = float(lower)

    def __call__(self, raw: torch.Tensor) -> torch.Tensor:
        return softplus_positive(raw, self.lower)

    def inverse(self, value: torch.Tensor) -> torch.Tensor:
        value = torch.as_tensor(value)
        if torch.any(value <= self.lower):
            raise ValueError(f"value must be > {self.lower} for a positive parameter, got {value}")
        return inv_softplus(value - self.lower)

    def __repr__(self) -> str:
        return f"Positive(lower={self.lower})"


#: the default constraint of positive parameters: `Positive()` (softplus with a floor)
positive = Positive()
