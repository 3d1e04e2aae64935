"""Flows written the way a user writes them in their own module (the documented `Flow` contract only)."""
import torch

from flowgp.numerics.constraints import Positive
from flowgp.flows import Flow, ParamSpec


class Cubic(Flow):
    """G(f) = a + f + c·f³, c > 0: G' = 1 + 3c·f² > 0. No closed-form inverse (the numerical one is used).

    `name` borrows a built-in's on purpose: it must never turn into the built-in SAL flow.
    """

    name = "sal"
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("c", Positive(), 0.1))

    def _forward(self, f, p):
        return p["a"] + f + p["c"] * f ** 3

    def _log_det(self, f, p):
        return torch.log1p(3.0 * p["c"] * f * f)


class Scale(Flow):
    """G(f) = s·f + shift with s > 0, a constructor argument of its own and a closed-form inverse."""

    name = "scale"
    param_specs = (ParamSpec("s", Positive(), 1.0),)

    def __init__(self, shift: float = 0.0, param_shape=(), **initial):
        super().__init__(param_shape, **initial)
        self.shift = float(shift)

    def _forward(self, f, p):
        return p["s"] * f + self.shift

    def _inverse(self, y, p):
        return (y - self.shift) / p["s"]

    def _log_det(self, f, p):
        return torch.log(p["s"]) + torch.zeros_like(f)
