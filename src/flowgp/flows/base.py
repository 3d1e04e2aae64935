"""Base class of the marginal (element-wise) flows G of the TGP (paper §3, eq. 2; appendix B.1).

Every flow is a strictly increasing map applied element-wise. Parameters are stored unconstrained
as `raw_<name>` and mapped to their constrained values by `params(x)`; the maths lives in
`_forward(f, p)`, `_inverse(y, p)` and `_log_det(f, p)`, which only read the dict `p`. An
input-dependent flow (paper §3.2) therefore only has to override `params(x)` and return tensors
that broadcast against f (e.g. [..., N, 1] or [..., N, L]); nothing else changes.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from ..constraints import Positive

__all__ = ["Flow", "ParamSpec", "log_cosh", "log_hypot1"]

_LOG2 = math.log(2.0)


class ParamSpec(NamedTuple):
    """One scalar parameter of a flow: constrained value = constraint(raw) (identity when None)."""

    name: str
    constraint: Optional[Positive]
    default: float


def log_cosh(z: Tensor) -> Tensor:
    """log cosh z = |z| + log1p(exp(-2|z|)) - log 2, which never overflows."""
    a = z.abs()
    return a + torch.log1p(torch.exp(-2.0 * a)) - _LOG2


def log_hypot1(z: Tensor) -> Tensor:
    """0.5·log(1 + z²) through hypot, so that z² never overflows."""
    return torch.log(torch.hypot(z, z.new_ones(())))


def _fmt(t: Tensor) -> str:
    t = t.detach()
    flat = t.reshape(-1)
    if flat.numel() == 1 or bool(torch.all(flat == flat[0])):
        return f"{flat[0].item():.6g}"
    return f"[{flat.min().item():.4g} .. {flat.max().item():.4g}] (per element)"


class Flow(nn.Module):
    """Strictly increasing element-wise map G: domain -> codomain with log|G'| available.

    Subclasses declare `param_specs` (name, constraint, default) and implement `_forward`,
    `_log_det` and, when a closed form exists, `_inverse` (otherwise a guarded numerical inverse
    is used). Bounded codomains override `_bounds`.

    Args:
        param_shape: shape of every parameter, e.g. (L,) for per-output parameters that broadcast
            against inputs [..., N, L]. Default () (shared scalars).
        **initial: initial constrained values of the declared parameters (floats or tensors
            broadcastable to `param_shape`); missing ones take the documented defaults.
    """

    name: str = "flow"
    domain: str = "real"  # "real" or "positive"
    codomain: str = "real"  # "real", "positive" or "bounded" (any proper interval)
    param_specs: tuple[ParamSpec, ...] = ()

    def __init__(self, param_shape=(), **initial):
        super().__init__()
        self.param_shape = torch.Size(param_shape)
        # Gives parameter-free flows a dtype/device that follows .to(), for constants they return.
        self.register_buffer("_anchor", torch.empty(0), persistent=False)
        for spec in self.param_specs:
            value = initial.pop(spec.name, spec.default)
            value = torch.as_tensor(value, dtype=torch.get_default_dtype())
            try:
                value = torch.broadcast_to(value, self.param_shape).clone()
            except RuntimeError as err:
                raise ValueError(
                    f"{type(self).__name__}: initial {spec.name} of shape {tuple(value.shape)} does not "
                    f"broadcast to param_shape {tuple(self.param_shape)}"
                ) from err
            if spec.constraint is not None:
                if torch.any(value <= spec.constraint.lower):
                    raise ValueError(
                        f"{type(self).__name__}: {spec.name} must be > {spec.constraint.lower}, got {_fmt(value)}"
                    )
                value = spec.constraint.inverse(value)
            self.register_parameter("raw_" + spec.name, nn.Parameter(value))
        if initial:
            valid = [s.name for s in self.param_specs]
            raise TypeError(f"{type(self).__name__} got unknown parameters {sorted(initial)}; valid: {valid}")

    # ------------------------------------------------------------------ parameters
    def constrain(self, raw: dict) -> dict:
        """Map unconstrained values {name: raw} to constrained ones (for input-dependent wrappers)."""
        return {s.name: (s.constraint(raw[s.name]) if s.constraint is not None else raw[s.name])
                for s in self.param_specs}

    def params(self, x: Optional[Tensor] = None) -> dict:
        """Constrained parameters; x is ignored here and is the hook for input-dependent flows."""
        return self.constrain({s.name: getattr(self, "raw_" + s.name) for s in self.param_specs})

    @property
    def spec(self) -> str:
        """A string that `make_flow` turns back into the same architecture."""
        return self.name

    @property
    def is_identity(self) -> bool:
        return False

    @property
    def _needs_input_check(self) -> bool:
        return self.domain != "real"

    # ------------------------------------------------------------------ public API
    def forward(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True) -> Tensor:
        """G(f), broadcasting f against the parameters; validate=False skips the domain check."""
        p = self.params(x)
        if validate:
            self._check_input(f, p)
        return self._forward(f, p)

    def inverse(self, y: Tensor, x: Optional[Tensor] = None, validate: bool = True) -> Tensor:
        """G⁻¹(y); validate=True raises a ValueError when y lies outside the codomain."""
        p = self.params(x)
        if validate:
            self._check_output(y, p)
        return self._inverse(y, p)

    def log_abs_det_jacobian(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True) -> Tensor:
        """log|dG/df| element-wise (the Jacobian of a marginal flow is diagonal)."""
        p = self.params(x)
        if validate:
            self._check_input(f, p)
        return self._log_det(f, p)

    def forward_and_log_det(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True):
        """(G(f), log|dG/df|) with a single evaluation of `params(x)`."""
        p = self.params(x)
        if validate:
            self._check_input(f, p)
        return self._forward_and_log_det(f, p)

    def codomain_bounds(self, x: Optional[Tensor] = None):
        """(low, high) of the open interval G(domain), or None when it is the whole real line."""
        return self._bounds(self.params(x))

    def affine_coefficients(self, x: Optional[Tensor] = None):
        """(a, b) with G(f) = a + b·f exactly, or None when G is not affine."""
        return self._affine(self.params(x))

    def __rshift__(self, other: "Flow") -> "Flow":
        """`a >> b` applies a, then b."""
        from .combination import compose

        return compose(self, other)

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}, param_shape={tuple(self.param_shape)}"

    # ------------------------------------------------------------------ maths (override)
    def _forward(self, f: Tensor, p: dict) -> Tensor:
        raise NotImplementedError

    def _log_det(self, f: Tensor, p: dict) -> Tensor:
        raise NotImplementedError

    def _inverse(self, y: Tensor, p: dict) -> Tensor:
        from .numerical import monotone_inverse

        return monotone_inverse(
            lambda f: self._forward(f, p), lambda f: self._log_det(f, p), y, domain=self.domain, name=self.spec
        )

    def _forward_and_log_det(self, f: Tensor, p: dict):
        return self._forward(f, p), self._log_det(f, p)

    def _affine(self, p: dict):
        return None

    def _constant(self, value: float) -> Tensor:
        return self._anchor.new_full((), value)

    def _domain_interval(self):
        low = 0.0 if self.domain == "positive" else -math.inf
        return self._constant(low), self._constant(math.inf)

    def _bounds(self, p: dict):
        if self.codomain == "real":
            return None
        if self.codomain == "positive":
            return self._constant(0.0), self._constant(math.inf)
        raise NotImplementedError(f"{type(self).__name__} has a bounded codomain and must define _bounds")

    def _image(self, low: Tensor, high: Tensor, p: dict):
        """Image of the interval (low, high): monotone, so (G(low+), G(high-)).

        Evaluating G at ±inf gives the limits for every flow here; a NaN there (0·inf in a
        limit branch) falls back to the flow's own codomain bound, which is the limit.
        """
        own = self._bounds(p)
        own_low, own_high = own if own is not None else (self._constant(-math.inf), self._constant(math.inf))
        g_low, g_high = self._forward(low, p), self._forward(high, p)
        g_low = torch.where(torch.isnan(g_low), own_low, g_low)
        g_high = torch.where(torch.isnan(g_high), own_high, g_high)
        return g_low, g_high

    def _fit_codomain_to(self, low: Tensor, high: Tensor) -> None:
        """Adapt parameters so that the codomain contains [low, high], where the family allows it.

        Used by `init_from_data` before fitting bounded flows; unbounded flows need nothing.
        """

    # ------------------------------------------------------------------ validation
    def _check_input(self, f: Tensor, p: dict) -> None:
        if self.domain == "positive" and torch.any(f <= 0):
            raise ValueError(
                f"the {self.spec} flow needs positive inputs; got min {f.min().item():.4g}; "
                "use a positive-enforcing flow or shift the data"
            )

    def _check_output(self, y: Tensor, p: dict) -> None:
        bounds = self._bounds(p)
        if bounds is None:
            return
        low, high = bounds
        if not torch.any((y <= low) | (y >= high)):
            return
        low_inf = bool(torch.all(torch.isinf(low)))
        high_inf = bool(torch.all(torch.isinf(high)))
        if high_inf:
            need = f"be > {_fmt(low)}"
        elif low_inf:
            need = f"be < {_fmt(high)}"
        else:
            need = f"lie in ({_fmt(low)}, {_fmt(high)})"
        raise ValueError(
            f"y must {need} for the inverse of {self.spec}; "
            f"got values in [{y.min().item():.4g}, {y.max().item():.4g}]"
        )
