"""Compositions (paper eq. 2: G = G_{K-1} ∘ ... ∘ G_0) and positive linear combinations (appendix eq. 26)."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from .base import Flow
from .elementwise import Affine, Arcsinh

__all__ = ["Compose", "compose", "LinearCombination", "ArcsinhCombination"]


def _broadcast_param_shapes(flows: Sequence[Flow]) -> torch.Size:
    try:
        return torch.broadcast_shapes(*(f.param_shape for f in flows))
    except RuntimeError as err:
        shapes = [tuple(f.param_shape) for f in flows]
        raise ValueError(f"the flows' param_shapes {shapes} do not broadcast") from err


def _category(flow: Flow) -> str:
    with torch.no_grad():
        bounds = flow.codomain_bounds()
    if bounds is None:
        return "real"
    low, high = bounds
    if bool(torch.all(low == 0)) and bool(torch.all(torch.isinf(high))):
        return "positive"
    return "bounded"


def _full_line(low, high) -> bool:
    return bool(torch.all(torch.isinf(low) & (low < 0))) and bool(torch.all(torch.isinf(high) & (high > 0)))


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


class _FlowOfFlows(Flow):
    """Shared parts of flows built from child flows `self.flows`: domain, codomain and the nested
    parameter dicts keyed by the child's index."""

    @property
    def domain(self) -> str:
        return self.flows[0].domain

    @property
    def codomain(self) -> str:
        return _category(self)

    @property
    def _needs_input_check(self) -> bool:
        return any(f._needs_input_check for f in self.flows)

    def constrain(self, raw: dict) -> dict:
        return {str(i): f.constrain(raw[str(i)]) for i, f in enumerate(self.flows)}

    def params(self, x=None) -> dict:
        return {str(i): f.params(x) for i, f in enumerate(self.flows)}


class Compose(_FlowOfFlows):
    """f_K = G_{K-1}(...G_0(f_0)) (paper eq. 2), applied in list order: "sal+softplus" = softplus(sal(f)).

    log|G'| is the sum of the stages' log-derivatives at their own inputs; the inverse applies the
    stages' inverses in reverse order. Nested compositions are flattened.
    """

    def __init__(self, flows: Iterable[Flow]):
        flat = []
        for flow in flows:
            if not isinstance(flow, Flow):
                raise TypeError(f"Compose takes Flow instances, got {type(flow).__name__}")
            flat.extend(flow.flows if isinstance(flow, Compose) else [flow])
        if not flat:
            raise ValueError("Compose needs at least one flow")
        super().__init__()
        self.flows = nn.ModuleList(flat)
        self.param_shape = _broadcast_param_shapes(flat)

    @property
    def spec(self) -> str:
        return "+".join(f.spec for f in self.flows)

    @property
    def is_identity(self) -> bool:
        return all(f.is_identity for f in self.flows)

    def _forward(self, f, p):
        for i, flow in enumerate(self.flows):
            f = flow._forward(f, p[str(i)])
        return f

    def _inverse(self, y, p):
        for i in reversed(range(len(self.flows))):
            y = self.flows[i]._inverse(y, p[str(i)])
        return y

    def _forward_and_log_det(self, f, p):
        total = None
        for i, flow in enumerate(self.flows):
            f, ld = flow._forward_and_log_det(f, p[str(i)])
            total = ld if total is None else total + ld
        return f, total

    def _log_det(self, f, p):
        return self._forward_and_log_det(f, p)[1]

    def _check_input(self, f, p):
        # Only stages that restrict their input need their (intermediate) input computed.
        last = max((i for i, fl in enumerate(self.flows) if fl._needs_input_check), default=-1)
        for i in range(last + 1):
            flow = self.flows[i]
            flow._check_input(f, p[str(i)])
            if i < last:
                f = flow._forward(f, p[str(i)])

    def _image(self, low, high, p):
        for i, flow in enumerate(self.flows):
            low, high = flow._image(low, high, p[str(i)])
        return low, high

    def _bounds(self, p):
        low, high = self._image(*self.flows[0]._domain_interval(), p)
        return None if _full_line(low, high) else (low, high)

    def _affine(self, p):
        a, b = None, None
        for i, flow in enumerate(self.flows):
            coef = flow._affine(p[str(i)])
            if coef is None:
                return None
            ai, bi = coef
            a, b = (ai, bi) if a is None else (ai + bi * a, bi * b)
        return a, b

    def _fit_codomain_to(self, low, high) -> None:
        """Adapt bounded stages, last to first, so that the composition can reach [low, high]."""
        for i in reversed(range(len(self.flows))):
            flow = self.flows[i]
            flow._fit_codomain_to(low, high)
            if i == 0:
                break
            with torch.no_grad():
                p = flow.params()
                bounds = flow._bounds(p)
                if bounds is not None and not bool(torch.all((bounds[0] < low) & (bounds[1] > high))):
                    return  # the data cannot be reached; the caller's codomain check reports it
                try:
                    low, high = flow._inverse(low, p), flow._inverse(high, p)
                except RuntimeError:
                    return
                if not bool(torch.all(torch.isfinite(low) & torch.isfinite(high))):
                    return


def compose(*flows: Flow) -> Compose:
    """Composition applying the flows in the given order (same as `flows[0] >> flows[1] >> ...`)."""
    return Compose(flows)


class LinearCombination(_FlowOfFlows):
    """G(f) = Σ_i (a_i + b_i·G_i(f)), b_i > 0 (appendix eq. 26 generalised to any increasing G_i).

    log G' = logsumexp_i(log b_i + log G_i'(f)); the inverse is numerical. With
    coefficients=False the sum is Σ_i G_i(f) (the terms carry their own scales). All terms must
    share one domain. Coefficients start at a_i = 0, b_i = 1/I (the mean of the terms).
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
        param_shape = _broadcast_param_shapes(flows)
        super().__init__()
        self.param_shape = param_shape
        self.flows = nn.ModuleList(flows)
        self.coefficients = (
            nn.ModuleList(Affine(param_shape=param_shape, b=1.0 / len(flows)) for _ in flows)
            if coefficients else None
        )

    @property
    def spec(self) -> str:
        inner = ",".join(f.spec for f in self.flows)
        return f"sum({inner})" if self.coefficients is not None else f"add({inner})"

    def constrain(self, raw: dict) -> dict:
        out = super().constrain(raw)
        if self.coefficients is not None:
            out.update({f"coef{i}": c.constrain(raw[f"coef{i}"]) for i, c in enumerate(self.coefficients)})
        return out

    def params(self, x=None) -> dict:
        out = super().params(x)
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
        low, high = self._image(*self._domain_interval(), p)
        return None if _full_line(low, high) else (low, high)

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
