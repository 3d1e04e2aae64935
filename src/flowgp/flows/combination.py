"""Positive linear combinations of flows (appendix eq. 26 and its generalisation).

`Compose` (paper eq. 2) lives in `flowgp.flows.base`, next to `Flow.__rshift__`; it is re-exported here.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .base import Compose, Flow, FlowOfFlows, broadcast_param_shapes, compose
from .elementwise import Affine, Arcsinh

__all__ = ["Compose", "compose", "FlowOfFlows", "LinearCombination", "ArcsinhCombination"]


def _logsumexp(terms):
    """log Σ exp(t_i) over a list of broadcastable tensors.

    Written out because torch.logsumexp over a stacked dim is slow on CPU for these shapes; the
    shift m is detached since the expression does not depend on it.
    """
    m = terms[0].detach()
    for t in terms[1:]:
        m = torch.maximum(m, t.detach())
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    total = None
    for t in terms:
        e = torch.exp(t - m)
        total = e if total is None else total + e
    return m + torch.log(total)


class LinearCombination(FlowOfFlows):
    """G(f) = Σ_i (a_i + b_i·G_i(f)), b_i > 0 (appendix eq. 26 generalised to any increasing G_i).

    log G' = logsumexp_i(log b_i + log G_i'(f)); the inverse is numerical. With
    coefficients=False the sum is Σ_i G_i(f) (the terms carry their own scales). All terms must
    share one domain. Coefficients start at a_i = 0, b_i = 1/I (the mean of the terms).

    Args:
        flows: the terms G_i, Flow instances sharing one domain (at least one).
        coefficients: True (default): learn a_i, b_i as above; False: the plain sum Σ_i G_i(f).

    See Also:
        :class:`flowgp.flows.ArcsinhCombination` (eq. 26 itself).
    """

    def __init__(self, flows: Iterable[Flow], coefficients: bool = True):
        flows = list(flows)
        if not flows:
            raise ValueError("LinearCombination needs at least one flow")
        for flow in flows:
            if not isinstance(flow, Flow):
                raise TypeError(f"LinearCombination takes Flow instances, got {type(flow).__name__}")
        domains = {f.domain for f in flows}
        if len(domains) != 1:
            raise ValueError(f"all terms of a LinearCombination must share a domain, got {sorted(domains)}")
        param_shape = broadcast_param_shapes(flows)
        super().__init__()
        self.param_shape = param_shape
        self.flows = nn.ModuleList(flows)
        self.coefficients = (
            nn.ModuleList(Affine(param_shape=param_shape, b=1.0 / len(flows)) for _ in flows)
            if coefficients else None
        )

    def constructor_arguments(self) -> tuple[list, dict]:
        if type(self).__init__ is LinearCombination.__init__:
            return [list(self.flows)], {"coefficients": self.coefficients is not None}
        return super().constructor_arguments()

    @property
    def spec(self) -> str:
        inner = ",".join(f.spec for f in self.flows)
        return f"sum({inner})" if self.coefficients is not None else f"add({inner})"

    def constrain(self, raw: dict) -> dict:
        out = super().constrain(raw)
        if self.coefficients is not None:
            out.update({f"coef{i}": c.constrain(raw[f"coef{i}"]) for i, c in enumerate(self.coefficients)})
        return out

    def params(self, x=None, *, sampling=None) -> dict:
        out = super().params(x, sampling=sampling)
        if self.coefficients is not None:
            out.update({f"coef{i}": c.params(x) for i, c in enumerate(self.coefficients)})
        return out

    def _term(self, i, f, p):
        g = self.flows[i]._forward(f, p[str(i)])
        if self.coefficients is not None:
            g = self.coefficients[i]._forward(g, p[f"coef{i}"])
        return g

    def _term_log_det(self, i, f, p):
        ld = self.flows[i]._log_det(f, p[str(i)])
        if self.coefficients is not None:
            ld = ld + torch.log(p[f"coef{i}"]["b"])
        return ld

    def _forward(self, f, p):
        total = None
        for i in range(len(self.flows)):
            g = self._term(i, f, p)
            total = g if total is None else total + g
        return total

    def _log_det(self, f, p):
        return _logsumexp([self._term_log_det(i, f, p) for i in range(len(self.flows))])

    def _check_input(self, f, p):
        if self._needs_input_check:
            for i, flow in enumerate(self.flows):
                flow._check_input(f, p[str(i)])

    def _image(self, low, high, p):
        total_low, total_high = 0.0, 0.0
        for i, flow in enumerate(self.flows):
            lo, hi = flow._image(low, high, p[str(i)])
            if self.coefficients is not None:
                c = p[f"coef{i}"]
                lo, hi = c["a"] + c["b"] * lo, c["a"] + c["b"] * hi
            total_low, total_high = total_low + lo, total_high + hi
        return total_low, total_high

    def _bounds(self, p):
        return self._bounds_of_image(*self._image(*self.domain_interval(), p))

    def _affine(self, p):
        a_total, b_total = 0.0, 0.0
        for i, flow in enumerate(self.flows):
            coef = flow._affine(p[str(i)])
            if coef is None:
                return None
            a, b = coef
            if self.coefficients is not None:
                c = p[f"coef{i}"]
                a, b = c["a"] + c["b"] * a, c["b"] * b
            a_total, b_total = a_total + a, b_total + b
        return a_total, b_total


class ArcsinhCombination(LinearCombination):
    """Appendix eq. 26: G(f) = Σ_{i=1}^I a_i + b_i·arcsinh((f - c_i)/d_i), b_i, d_i > 0.

    Each term is an `Arcsinh` flow A·arcsinh(B(f + C)) + D with (A, B, C, D) = (b_i, 1/d_i, -c_i, a_i).
    Defaults: c_i = linspace(-2, 2, I) so that the terms differ, d_i = 2, b_i = 2/I, a_i = 0, i.e.
    close to the identity for |f| ≲ 1 with logarithmic tails.

    Args:
        num_terms: I, the number of arcsinh terms (a positive integer; the spec "lincomb5" has I = 5).
        param_shape: shape of every parameter of every term; default ().

    See Also:
        :func:`flowgp.make_flow` (spec "lincomb<I>").
    """

    def __init__(self, num_terms: int = 3, param_shape=()):
        if int(num_terms) != num_terms or num_terms < 1:
            raise ValueError(f"num_terms must be a positive integer, got {num_terms}")
        num_terms = int(num_terms)
        centres = [0.0] if num_terms == 1 else [-2.0 + 4.0 * i / (num_terms - 1) for i in range(num_terms)]
        terms = [Arcsinh(param_shape=param_shape, a=2.0 / num_terms, b=0.5, c=-c, d=0.0) for c in centres]
        super().__init__(terms, coefficients=False)
        self.num_terms = num_terms

    @property
    def spec(self) -> str:
        return f"lincomb{self.num_terms}"

    def eq26_parameters(self, x=None) -> dict:
        """{a, b, c, d} of eq. 26, each stacked over the terms along a new leading dimension."""
        p = self.params(x)
        terms = [p[str(i)] for i in range(self.num_terms)]
        return {
            "a": torch.stack([t["d"] for t in terms]),
            "b": torch.stack([t["a"] for t in terms]),
            "c": torch.stack([-t["c"] for t in terms]),
            "d": torch.stack([1.0 / t["b"] for t in terms]),
        }
