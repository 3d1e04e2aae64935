"""Elementary marginal flows of appendix B.1, Table 1, each strictly increasing.

Where Table 1 allows any real scale we constrain it positive (via `Positive`) so that every flow is
increasing, as the TGP change of variables (paper §3.4) and the models' quadrature assume.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..numerics.constraints import Positive, inv_softplus
from ..compat import packed_rows
from .base import Flow, ParamSpec, asinh, log_cosh, log_hypot1

__all__ = [
    "Identity", "Log", "Exp", "Softplus", "Sinh", "Arcsinh", "Affine", "SinhArcsinh", "SAL",
    "BoxCox", "InverseBoxCox", "TukeyGH", "Tanh",
]

_POS = Positive()


class Identity(Flow):
    """G(f) = f.

    Args:
        param_shape: shape the flow reports (it has no parameters of its own); default ().
        **initial: none: this flow has no parameters, and any name given is a TypeError.

    Examples:
        >>> import torch
        >>> from flowgp.flows import Identity
        >>> Identity()(torch.tensor([-1.0, 2.0], dtype=torch.float64))
        tensor([-1.,  2.], dtype=torch.float64)
    """

    name = "identity"

    @property
    def is_identity(self) -> bool:
        return True

    def _forward(self, f, p):
        return f

    def _inverse(self, y, p):
        return y

    def _log_det(self, f, p):
        return torch.zeros_like(f)

    def _affine(self, p):
        return self._constant(0.0), self._constant(1.0)


class Log(Flow):
    """G(f) = log f on f > 0 (Table 1 "Log"); inverse exp.

    Args:
        param_shape: shape the flow reports (it has no parameters of its own); default ().
        **initial: none: this flow has no parameters, and any name given is a TypeError.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "log"
    domain = "positive"

    def _forward(self, f, p):
        return torch.log(f)

    def _inverse(self, y, p):
        return torch.exp(y)

    def _log_det(self, f, p):
        return -torch.log(f)


class Exp(Flow):
    """G(f) = exp f onto (0, inf) (Table 1 "Exp"); inverse log.

    Args:
        param_shape: shape the flow reports (it has no parameters of its own); default ().
        **initial: none: this flow has no parameters, and any name given is a TypeError.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "exp"
    codomain = "positive"

    def _forward(self, f, p):
        return torch.exp(f)

    def _inverse(self, y, p):
        return torch.log(y)

    def _log_det(self, f, p):
        return f


class Softplus(Flow):
    """G(f) = log(1 + exp f) onto (0, inf) (Table 1 "Softplus"); inverse log(exp y - 1).

    Args:
        param_shape: shape the flow reports (it has no parameters of its own); default ().
        **initial: none: this flow has no parameters, and any name given is a TypeError.

    Examples:
        >>> import torch
        >>> from flowgp.flows import Softplus
        >>> g = Softplus()
        >>> y = g(torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64))
        >>> bool((y > 0).all()), torch.allclose(g.inverse(y), torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64))
        (True, True)
    """

    name = "softplus"
    codomain = "positive"

    def _forward(self, f, p):
        # log1p(exp f) below the threshold (exp(40) is finite in float32), f above it, where log1p(exp(-f))
        # < 5e-18 is below float64 rounding: exact to rounding, with the exact sigmoid as gradient, in one
        # pass forward and one backward (logaddexp with a zeros tensor took several)
        return F.softplus(f, beta=1.0, threshold=40.0)

    def _inverse(self, y, p):
        return inv_softplus(y)

    def _log_det(self, f, p):
        return F.logsigmoid(f)


class Sinh(Flow):
    """G(f) = sinh f (Table 1 "Sinh"); inverse arcsinh.

    Args:
        param_shape: shape the flow reports (it has no parameters of its own); default ().
        **initial: none: this flow has no parameters, and any name given is a TypeError.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "sinh"

    def _forward(self, f, p):
        return torch.sinh(f)

    def _inverse(self, y, p):
        return torch.asinh(y)

    def _log_det(self, f, p):
        return log_cosh(f)


class Arcsinh(Flow):
    """G(f) = a·arcsinh(b(f + c)) + d, a, b > 0 (Table 1 "Arcsinh"); inverse sinh((y - d)/a)/b - c.

    Defaults a = b = 1, c = d = 0: slope 1 at the origin.

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of a, b, c, d (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "arcsinh"
    param_specs = (ParamSpec("a", _POS, 1.0), ParamSpec("b", _POS, 1.0),
                   ParamSpec("c", None, 0.0), ParamSpec("d", None, 0.0))

    def _forward(self, f, p):
        return p["a"] * torch.asinh(p["b"] * (f + p["c"])) + p["d"]

    def _inverse(self, y, p):
        return torch.sinh((y - p["d"]) / p["a"]) / p["b"] - p["c"]

    def _log_det(self, f, p):
        return torch.log(p["a"]) + torch.log(p["b"]) - log_hypot1(p["b"] * (f + p["c"]))


class Affine(Flow):
    """G(f) = a + b·f, b > 0 (Table 1 "Affine (L)"); inverse (y - a)/b. Defaults a = 0, b = 1 (identity).

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of a, b (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    Examples:
        >>> import torch
        >>> from flowgp.flows import Affine
        >>> Affine(a=1.0, b=2.0)(torch.tensor([0.0, 1.0], dtype=torch.float64)).detach()
        tensor([1., 3.], dtype=torch.float64)
    """

    name = "affine"
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("b", _POS, 1.0))
    output_affine = ("a", "b")

    def _forward(self, f, p):
        return p["a"] + p["b"] * f

    def _inverse(self, y, p):
        return (y - p["a"]) / p["b"]

    def _log_det(self, f, p):
        return torch.log(p["b"]) + torch.zeros_like(f)

    def _affine(self, p):
        return p["a"], p["b"]


def _sum_to(g: Tensor, shape: torch.Size) -> Tensor:
    """g summed over the dimensions it was broadcast along from `shape` (a gradient's reduction)."""
    return g if g.shape == shape else g.sum_to_size(shape)


class _SinhArcsinhMap(torch.autograd.Function):
    """y = sinh(z), z = b·arcsinh(f) - a (Table 1 "Sinh-Arcsinh") as one node with the chain rule by hand:
        ∂y/∂f = b cosh z / sqrt(1 + f²),   ∂y/∂a = -cosh z,   ∂y/∂b = arcsinh(f) cosh z,
    summed over broadcast dimensions. One node where autograd records five (asinh, mul, sub, sinh and their
    backwards), with arcsinh from `asinh`: the TGP's quadrature evaluates this on B·Q values every step."""

    @staticmethod
    def forward(ctx, f, a, b):
        s = asinh(f)
        z = torch.addcmul(-a, b, s)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(f, s, z, a, b)
        return torch.sinh(z)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        f, s, z, a, b = ctx.saved_tensors
        gz = g * torch.cosh(z)
        need = ctx.needs_input_grad
        g_f = g_a = g_b = None
        if need[0]:  # 1/sqrt(1 + f²) → 0 as f² overflows, its limit
            g_f = _sum_to(gz * b * torch.addcmul(torch.ones_like(f), f, f).rsqrt_(), f.shape)
        if need[1]:
            g_a = _sum_to(-gz, a.shape)
        if need[2]:
            g_b = _sum_to(gz * s, b.shape)
        return g_f, g_a, g_b


class SinhArcsinh(Flow):
    """G(f) = sinh(b·arcsinh(f) - a), b > 0 (Table 1 "Sinh-Arcsinh", inner part of eq. 2).

    Inverse sinh((arcsinh(y) + a)/b). Defaults a = 0, b = 1 (identity).

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of a, b (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "sinharcsinh"
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("b", _POS, 1.0))

    def _forward(self, f, p):
        return _SinhArcsinhMap.apply(f, p["a"], p["b"])

    def _inverse(self, y, p):
        return torch.sinh((torch.asinh(y) + p["a"]) / p["b"])

    def _log_det(self, f, p):
        z = p["b"] * torch.asinh(f) - p["a"]
        return torch.log(p["b"]) + log_cosh(z) - log_hypot1(f)


class SAL(Flow):
    """G(f) = c + d·sinh(b·arcsinh(f) - a), b, d > 0: one SAL stage of TGP eq. 2 (Rios & Tobar 2019), i.e. the
    sinh-arcsinh of Table 1 followed by an affine map (appendix B.1: "SAL" = Sinh-Arcsinh + Affine (L)).

    Inverse sinh((arcsinh((y - c)/d) + a)/b); log G' = log d + log b + log cosh z - ½ log(1 + f²), z = b·arcsinh(f) - a.
    Defaults a = c = 0, b = d = 1 (the identity). The same map as `SinhArcsinh(a, b) >> Affine(c, d)`, with its four
    parameters in one tensor and one module: the TGP evaluates it at every quadrature node of every step, and
    each extra parameter tensor or module costs a compiled step gradient accumulation, optimiser and guard work
    (docs/results/perf/step-time, 2026-11-29). `output_affine` names its final affine map's shift and scale (c, d): the
    data initialisation puts a target shift and scale there, and `make_input_dependent(which="nonlinear")` leaves
    them shared while the sinh-arcsinh's (a, b) follow the inputs (appendix B.6).

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of a, b, c, d (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    Examples:
        >>> import torch
        >>> from flowgp.flows import SAL
        >>> g = SAL(b=2.0)
        >>> f = torch.tensor([0.0, 1.0], dtype=torch.float64)
        >>> g(f).detach()
        tensor([0.0000, 2.8284], dtype=torch.float64)
        >>> torch.allclose(g.inverse(g(f)), f)
        True
    """

    name = "sal"
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("b", _POS, 1.0),
                   ParamSpec("c", None, 0.0), ParamSpec("d", _POS, 1.0))
    output_affine = ("c", "d")

    legacy_stages = 2  # before this class, "sal" was SinhArcsinh >> Affine

    def merge_legacy_stages(self, source, old_prefixes, target, prefix):
        if len(old_prefixes) == 1:
            return super().merge_legacy_stages(source, old_prefixes, target, prefix)
        sinh_arcsinh, affine = old_prefixes  # (a, b) of each: this flow's (a, b) and (c, d)
        inner, outer = packed_rows(source, sinh_arcsinh, ("a", "b")), packed_rows(source, affine, ("a", "b"))
        if inner is not None and outer is not None:  # else a partial state dict: strict loading reports it
            target[prefix + "raw"] = torch.stack(inner + outer)

    def _forward(self, f, p):
        return p["c"] + p["d"] * _SinhArcsinhMap.apply(f, p["a"], p["b"])

    def _inverse(self, y, p):
        return torch.sinh((torch.asinh((y - p["c"]) / p["d"]) + p["a"]) / p["b"])

    def _log_det(self, f, p):
        z = p["b"] * torch.asinh(f) - p["a"]
        return torch.log(p["d"]) + torch.log(p["b"]) + log_cosh(z) - log_hypot1(f)


def _signed_power(u: Tensor, power: Tensor) -> Tensor:
    return torch.sign(u) * torch.abs(u).pow(power)


class BoxCox(Flow):
    """G(f) = (sgn(f)|f|^λ - 1)/λ, λ > 0 (Table 1 "Boxcox", sign-extended to all reals).

    Inverse sgn(λy + 1)|λy + 1|^{1/λ}. Default λ = 1, i.e. G(f) = f - 1. G' = |f|^{λ-1} vanishes
    or blows up at f = 0 only.

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of lam (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "boxcox"
    param_specs = (ParamSpec("lam", _POS, 1.0),)

    def _forward(self, f, p):
        lam = p["lam"]
        return (_signed_power(f, lam) - 1.0) / lam

    def _inverse(self, y, p):
        lam = p["lam"]
        return _signed_power(lam * y + 1.0, 1.0 / lam)

    def _log_det(self, f, p):
        return (p["lam"] - 1.0) * torch.log(torch.abs(f))


class InverseBoxCox(Flow):
    """G(f) = sgn(λf + 1)|λf + 1|^{1/λ}, λ > 0: Table 1's BoxCox inverse used as the forward map.

    Inverse (sgn(y)|y|^λ - 1)/λ. Default λ = 1, i.e. G(f) = f + 1.

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of lam (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "inverseboxcox"
    param_specs = (ParamSpec("lam", _POS, 1.0),)

    def _forward(self, f, p):
        lam = p["lam"]
        return _signed_power(lam * f + 1.0, 1.0 / lam)

    def _inverse(self, y, p):
        lam = p["lam"]
        return (_signed_power(y, lam) - 1.0) / lam

    def _log_det(self, f, p):
        lam = p["lam"]
        return (1.0 / lam - 1.0) * torch.log(torch.abs(lam * f + 1.0))


# Below this |g| the series of expm1(g f)/g is used: 0/0 at g = 0, and the dropped (g f)^3 term is
# far below rounding for any |f| a GP produces.
_TUKEY_SMALL_G = 1e-8


def _expm1_over(g: Tensor, f: Tensor) -> Tensor:
    """(exp(g f) - 1)/g, continuous through g = 0 where it equals f."""
    small = g.abs() < _TUKEY_SMALL_G
    g_safe = torch.where(small, torch.ones_like(g), g)
    gf = g * f
    series = f * (1.0 + gf / 2.0 + gf * gf / 6.0)
    return torch.where(small, series, torch.expm1(g_safe * f) / g_safe)


class TukeyGH(Flow):
    """G(f) = (exp(g f) - 1)/g · exp(h f²/2), g real, h ≥ 0 (Table 1 "Tukey").

    Increasing for every g because (exp(g f) - 1)/g has the sign of f; at g = 0 it is the limit
    f·exp(h f²/2). No closed-form inverse: the numerical one is used. Defaults g = 0.01, h = 0.01
    (close to the identity).

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of g, h (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    See Also:
        :func:`flowgp.make_flow` builds it from a spec string; :class:`flowgp.flows.Flow` gives the methods.
    """

    name = "tukey"
    param_specs = (ParamSpec("g", None, 0.01), ParamSpec("h", _POS, 0.01))

    def _forward(self, f, p):
        return _expm1_over(p["g"], f) * torch.exp(0.5 * p["h"] * f * f)

    def _log_det(self, f, p):
        # G' = exp(h f²/2)·(exp(g f) + h f E), E = (exp(g f) - 1)/g and h f E ≥ 0; logaddexp keeps it
        # stable, and the guard keeps log(h f E) out of the graph where h f E = 0 (e.g. f = 0).
        g, h = p["g"], p["h"]
        gf = g * f
        u = h * f * _expm1_over(g, f)
        positive = u > 0
        log_u = torch.log(torch.where(positive, u, torch.ones_like(u)))
        return 0.5 * h * f * f + torch.where(positive, torch.logaddexp(gf, log_u), gf)


class Tanh(Flow):
    """G(f) = a·tanh(b(f + c)) + d, a, b > 0 (Table 1 "TanH"), onto (d - a, d + a).

    Inverse atanh((y - d)/a)/b - c. Defaults a = b = 1, c = d = 0.

    Args:
        param_shape: shape of every parameter, e.g. (L,) for one value per output; default () (shared scalars).
        **initial: initial constrained values of a, b, c, d (floats or tensors broadcastable to `param_shape`);
            missing ones take the defaults above.

    Examples:
        >>> import torch
        >>> from flowgp.flows import Tanh
        >>> g = Tanh(a=2.0, d=1.0)  # onto (d - a, d + a) = (-1, 3)
        >>> with torch.no_grad():
        ...     [float(v) for v in g.codomain_bounds()]
        [-1.0, 3.0]
    """

    name = "tanh"
    codomain = "bounded"
    param_specs = (ParamSpec("a", _POS, 1.0), ParamSpec("b", _POS, 1.0),
                   ParamSpec("c", None, 0.0), ParamSpec("d", None, 0.0))

    def _forward(self, f, p):
        return p["a"] * torch.tanh(p["b"] * (f + p["c"])) + p["d"]

    def _inverse(self, y, p):
        return torch.atanh((y - p["d"]) / p["a"]) / p["b"] - p["c"]

    def _log_det(self, f, p):
        return torch.log(p["a"]) + torch.log(p["b"]) - 2.0 * log_cosh(p["b"] * (f + p["c"]))

    def _bounds(self, p):
        return p["d"] - p["a"], p["d"] + p["a"]

    def fit_codomain_to(self, low: Tensor, high: Tensor, margin: float = 0.25) -> None:
        """Move d and widen a so that (d - a, d + a) strictly contains [low, high]."""
        with torch.no_grad():
            p = self.params()
            inside = bool(torch.all((p["d"] - p["a"] < low) & (p["d"] + p["a"] > high)))
            if inside:
                return
            half = 0.5 * (high - low)
            a = (1.0 + margin) * half + 1e-3 * (1.0 + 0.5 * (high.abs() + low.abs()))
            d = 0.5 * (high + low)
            self.set_params(a=a, d=d)
