"""Base class of the marginal (element-wise) flows G of the TGP (paper §3, eq. 2; appendix B.1).

Every flow is a strictly increasing map applied element-wise. Writing a new flow (in flowgp or in your own
module) takes a subclass with:

* `param_specs`: a tuple of `ParamSpec(name, constraint, default)`; the parameters are stored unconstrained in
  one tensor `raw` of shape [len(param_specs), *param_shape] (row i for `param_specs[i]`; `raw_parameter(name)`
  is a view of one row, `set_params(**values)` writes constrained values) and mapped to their constrained
  values by `params(x)`. One tensor, not one per parameter: each parameter tensor costs a training step its
  own gradient accumulation, optimiser work and compiled-graph input (docs/results/perf/step-time, 2026-11-29);
* `_forward(f, p)` and `_log_det(f, p)` (log|G'(f)|), which only read the dict `p` of constrained values;
* optionally `_inverse(y, p)` (a guarded numerical inverse is used otherwise), `_bounds(p)` for a bounded
  codomain (set `codomain = "bounded"`), `_affine(p)` -> (a, b) when G(f) = a + b·f exactly, and
  `output_affine = (shift, scale)`, the names of two parameters with G(f) = shift + scale·H(f) where H does not
  depend on them (e.g. `SAL`): a data initialisation can then set the flow's final shift and scale, and an
  input-dependent version of it (which="nonlinear") keeps them shared.

Such a class works wherever a built-in one does: `make_flow(instance)`, compositions (`a >> b`, `Compose`,
`LinearCombination`), input-dependent wrapping, and `flowgp.flows.serialization` (the constructor arguments
are recorded automatically, so the class needs nothing else). An input-dependent flow (paper §3.2) only
overrides `params(x)` and returns tensors that broadcast against f (e.g. [..., N, 1] or [..., N, L]).

For example, in your own module:

    import torch
    from flowgp.numerics.constraints import Positive
    from flowgp.flows import Flow, ParamSpec

    class Cubic(Flow):  # G(f) = a + f + c·f³ with c > 0, so G'(f) = 1 + 3c·f² > 0
        name = "cubic"
        param_specs = (ParamSpec("a", None, 0.0), ParamSpec("c", Positive(), 0.1))

        def _forward(self, f, p):
            return p["a"] + f + p["c"] * f ** 3

        def _log_det(self, f, p):
            return torch.log1p(3.0 * p["c"] * f * f)

    flow = Cubic() >> make_flow("softplus")     # no _inverse: a guarded numerical inverse is used

The composition `Compose` (eq. 2) lives here too, so that `a >> b` needs no import of another module.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Iterable, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import packed_rows, saved_before_packing, warn_upgrade
from ..numerics.constraints import Positive, softplus_positive
from .numerical import monotone_inverse

if TYPE_CHECKING:  # only for annotations: the sampling mode is read by input-dependent flows
    from .sampling import WeightSampling

__all__ = ["Flow", "ParamSpec", "FlowOfFlows", "Compose", "compose", "broadcast_param_shapes", "log_cosh",
           "log_hypot1", "asinh", "legacy_rows", "PARAMETER_DTYPE"]

_LOG2 = math.log(2.0)

#: Parameters are built in float64, whatever torch's default dtype: `flow.to(torch.float32)` afterwards
#: only rounds, and float64 models stay exact.
PARAMETER_DTYPE = torch.float64


class ParamSpec(NamedTuple):
    """One scalar parameter of a flow: constrained value = constraint(raw) (identity when None).

    Args:
        name: the parameter's name (a keyword of the flow's constructor and a key of `Flow.params`).
        constraint: a :class:`flowgp.numerics.constraints.Positive` (value = softplus of the raw value, above its
            lower bound) or None (unconstrained: value = raw).
        default: the constrained value a new flow starts from.

    Examples:
        >>> from flowgp.flows import SAL
        >>> [(s.name, s.default) for s in SAL.param_specs]
        [('a', 0.0), ('b', 1.0), ('c', 0.0), ('d', 1.0)]
    """

    name: str
    constraint: Optional[Positive]
    default: float


def log_cosh(z: Tensor) -> Tensor:
    """log cosh z = |z| + log1p(exp(-2|z|)) - log 2, which never overflows."""
    a = z.abs()
    return a + torch.log1p(torch.exp(-2.0 * a)) - _LOG2


def asinh(x: Tensor) -> Tensor:
    """arcsinh x = sgn(x)·log1p(|x| + x²/(1 + sqrt(1 + x²))), relative error within a few ulp, from vectorised
    element-wise passes: on CPU `torch.asinh` runs element by element (about 4x the time of these passes on
    10⁴ floats), and the TGP evaluates it on every quadrature node of every point of every step.

    x²/(1 + sqrt(1 + x²)) is formed as |x| / (u + sqrt(u² + 1)) with u = 1/|x|, so that no square overflows
    (x = 0 gives 0/inf = 0, |x| = inf gives inf); above half the dtype's largest value, where |x| + x²/(...) ≈ 2|x|
    would overflow, log1p(|x|/2) + log 4 is used. Other devices use `torch.asinh` (fast there).

    Args:
        x: a tensor of any shape and floating dtype.

    See Also:
        :class:`flowgp.flows.SinhArcsinh`, :class:`flowgp.flows.SAL` (its users).
    """
    if x.device.type != "cpu":
        return torch.asinh(x)
    a = x.abs()
    u = a.reciprocal()
    q = a / torch.addcmul(torch.ones_like(u), u, u).sqrt_().add_(u)
    big = a > 0.5 * torch.finfo(x.dtype).max
    s = torch.log1p(torch.where(big, 0.5 * a, q.add_(a)))
    return s.add_(big, alpha=2.0 * _LOG2).copysign_(x)


def log_hypot1(z: Tensor) -> Tensor:
    """0.5·log(1 + z²) through hypot, so that z² never overflows."""
    return torch.log(torch.hypot(z, z.new_ones(())))


def _fmt(t: Tensor) -> str:
    t = t.detach()
    flat = t.reshape(-1)
    if flat.numel() == 1 or bool(torch.all(flat == flat[0])):
        return f"{flat[0].item():.6g}"
    return f"[{flat.min().item():.4g} .. {flat.max().item():.4g}] (per element)"


def _materialise(value):
    # A one-shot iterator (e.g. a generator of flows) would be consumed by __init__; keep it as a list.
    return list(value) if isinstance(value, Iterator) else value


def _recordable(value):
    # A torch.Generator only draws initial values (a rebuilt flow loads its state dict instead): not kept.
    return None if isinstance(value, torch.Generator) else value


def _recording_arguments(init):
    """Wrap a Flow class's `__init__` so that the outermost call records its arguments on the instance.

    The record (`Flow.constructor_arguments`) lets `flowgp.flows.serialization` rebuild any flow - also a
    user's class - from its class path, these arguments and its state dict, without pickling the object.
    Inner calls (`super().__init__(...)` of parent classes) pass through unrecorded.
    """

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if self.__dict__.get("_flowgp_constructing", False):
            return init(self, *args, **kwargs)
        args = tuple(_materialise(a) for a in args)
        kwargs = {k: _materialise(v) for k, v in kwargs.items()}
        # object.__setattr__: nn.Module's own __setattr__ needs Module.__init__ to have run.
        object.__setattr__(self, "_flowgp_constructing", True)
        try:
            init(self, *args, **kwargs)
        finally:
            object.__setattr__(self, "_flowgp_constructing", False)
        object.__setattr__(self, "_flowgp_arguments", (tuple(_recordable(a) for a in args),
                                                       {k: _recordable(v) for k, v in kwargs.items()}))

    __init__.flowgp_records_arguments = True
    return __init__


def broadcast_param_shapes(flows: Sequence["Flow"]) -> torch.Size:
    """The common param_shape of several flows (ValueError naming them when they do not broadcast)."""
    try:
        return torch.broadcast_shapes(*(f.param_shape for f in flows))
    except RuntimeError as err:
        shapes = [tuple(f.param_shape) for f in flows]
        raise ValueError(f"the flows' param_shapes {shapes} do not broadcast") from err


def _upgrade_saved_entries(module, state_dict, prefix, *args) -> None:
    """Load pre-hook of every Flow (runs before its children's): `Flow.upgrade_state_dict`."""
    module.upgrade_state_dict(state_dict, prefix)


#: the rows of one saved flow's parameters (`flowgp.compat.packed_rows`: the upgrades of saved files live there)
legacy_rows = packed_rows


class Flow(nn.Module):
    """Strictly increasing element-wise map G: domain -> codomain with log|G'| available.

    Subclasses declare `param_specs` (name, constraint, default) and implement `_forward`,
    `_log_det` and, when a closed form exists, `_inverse` (otherwise a guarded numerical inverse
    is used). Bounded codomains override `_bounds` (module docstring: the whole contract).

    Args:
        param_shape: shape of every parameter, e.g. (L,) for per-output parameters that broadcast
            against inputs [..., N, L]. Default () (shared scalars).
        **initial: initial constrained values of the declared parameters (floats or tensors
            broadcastable to `param_shape`); missing ones take the documented defaults.

    Parameters are built in float64 (`PARAMETER_DTYPE`); use `.to(dtype)` for another precision.
    Every public method takes `sampling=None`, a `WeightSampling` that input-dependent stages read
    (how many network weight draws, stochastic or not, from which generator); plain flows ignore it.

    See Also:
        :func:`flowgp.make_flow` (flows by name), :class:`flowgp.flows.Compose` (stacking flows),
        :func:`flowgp.flows.monotone_inverse` (the numerical inverse).
    """

    name: str = "flow"
    domain: str = "real"  # "real" or "positive"
    codomain: str = "real"  # "real", "positive" or "bounded" (any proper interval)
    param_specs: tuple[ParamSpec, ...] = ()
    #: (shift, scale): names of parameters with G(f) = shift + scale·H(f), H free of them; None if there are none
    output_affine: Optional[tuple[str, str]] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "flowgp_records_arguments", False):
            cls.__init__ = _recording_arguments(init)

    @_recording_arguments
    def __init__(self, param_shape=(), **initial):
        super().__init__()
        self.param_shape = torch.Size(param_shape)
        # Gives parameter-free flows a dtype/device that follows .to(), for constants they return.
        self.register_buffer("_anchor", torch.empty(0, dtype=PARAMETER_DTYPE), persistent=False)
        rows = []
        for spec in self.param_specs:
            value = initial.pop(spec.name, spec.default)
            value = torch.as_tensor(value, dtype=PARAMETER_DTYPE)
            try:
                value = torch.broadcast_to(value, self.param_shape).clone()
            except RuntimeError as err:
                raise ValueError(
                    f"{type(self).__name__}: initial {spec.name} of shape {tuple(value.shape)} does not "
                    f"broadcast to param_shape {tuple(self.param_shape)}"
                ) from err
            rows.append(self._unconstrained(spec, value))
        if initial:
            valid = [s.name for s in self.param_specs]
            raise TypeError(f"{type(self).__name__} got unknown parameters {sorted(initial)}; valid: {valid}")
        if rows:
            self.raw = nn.Parameter(torch.stack(rows))
        self._set_constraint_rows()
        self.register_load_state_dict_pre_hook(_upgrade_saved_entries)

    # ------------------------------------------------------------------ description
    def constructor_arguments(self) -> tuple[list, dict]:
        """(args, kwargs) of the call that built this flow, recorded automatically for serialization.

        Override only when the recorded call no longer describes the object (its state dict aside).
        """
        recorded = self.__dict__.get("_flowgp_arguments")
        if recorded is None:
            raise RuntimeError(f"{type(self).__name__} was not built through its __init__, so its constructor "
                               "arguments are unknown; override constructor_arguments()")
        args, kwargs = recorded
        return list(args), dict(kwargs)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the parameters (of the constants of a parameter-free flow); follows `.to()`."""
        for p in self.parameters():
            return p.dtype
        return self._anchor.dtype

    @property
    def device(self) -> torch.device:
        """The device of the parameters (of the constants of a parameter-free flow); follows `.to()`."""
        for p in self.parameters():
            return p.device
        return self._anchor.device

    @property
    def spec(self) -> str:
        """A string that `make_flow` turns back into the same architecture (for registered flows)."""
        return self.name

    @property
    def is_identity(self) -> bool:
        return False

    @property
    def _needs_input_check(self) -> bool:
        return self.domain != "real"

    # ------------------------------------------------------------------ parameters
    def constrain(self, raw: dict) -> dict:
        """Map unconstrained values {name: raw} to constrained ones (for input-dependent wrappers)."""
        return {s.name: (s.constraint(raw[s.name]) if s.constraint is not None else raw[s.name])
                for s in self.param_specs}

    def params(self, x: Optional[Tensor] = None, *, sampling: Optional["WeightSampling"] = None) -> dict:
        """Constrained parameters; x and sampling are ignored here, the hooks of input-dependent flows."""
        names = self._row_names
        if names is None:
            return self.constrain(self.raw_parameters())
        if not names:
            return {}
        # `constrain`'s values (softplus(raw) + lower for a Positive row, raw otherwise) from plain tuples: a compiled
        # step then checks two tuples, not every ParamSpec and constraint object
        return {name: raw if lower is None else softplus_positive(raw, lower)
                for name, raw, lower in zip(names, self.raw.unbind(0), self._row_lower)}

    def _set_constraint_rows(self) -> None:
        """The names and lower bounds `params` reads, where it can bypass `constrain`: this class keeps
        `Flow.constrain` and every constraint is None or a `Positive` (otherwise `_row_names` is None)."""
        self._row_names = self._row_lower = None
        specs = self.param_specs
        if type(self).constrain is not Flow.constrain or \
                not all(s.constraint is None or type(s.constraint) is Positive for s in specs):
            return
        self._row_names = tuple(s.name for s in specs)
        self._row_lower = tuple(None if s.constraint is None else s.constraint.lower for s in specs)

    def raw_parameters(self) -> dict:
        """{name: unconstrained value}, each a view of its row of `raw` (shape `param_shape`)."""
        if not self.param_specs:
            return {}
        raw = self.raw
        return {s.name: raw[i] for i, s in enumerate(self.param_specs)}

    def raw_parameter(self, name: str) -> Tensor:
        """The unconstrained value of parameter `name`: a view of its row of `raw` (differentiate `raw`)."""
        return self.raw[self._row(name)]

    def set_params(self, **values) -> None:
        """Set parameters to constrained values (floats or tensors broadcastable to `param_shape`), in place."""
        with torch.no_grad():
            for name, value in values.items():
                row = self._row(name)
                spec = self.param_specs[row]
                value = torch.as_tensor(value, dtype=PARAMETER_DTYPE)
                try:
                    value = torch.broadcast_to(value, self.param_shape)
                except RuntimeError as err:
                    raise ValueError(f"{type(self).__name__}: {name} of shape {tuple(value.shape)} does not "
                                     f"broadcast to param_shape {tuple(self.param_shape)}") from err
                self.raw[row].copy_(self._unconstrained(spec, value).to(self.raw))

    # ------------------------------------------------------------------ files of earlier versions
    #: how many consecutive stages of a composition this flow was saved as by earlier versions (a SAL: two)
    legacy_stages: int = 1

    def upgrade_state_dict(self, state_dict: dict, prefix: str) -> None:
        """Convert, in place, the entries a file of an earlier version holds for this flow (under `prefix`), before
        they are loaded: the separate `raw_<name>` tensors of files saved before the parameters were packed are
        stacked into `raw`, and a flow an earlier version saved as a composition of its `legacy_stages` stages
        (entries under `flows.0.`, `flows.1.`, ..., none of its own) gets them merged (`merge_legacy_stages`).
        Runs before the children's conversions; override to add a conversion (call super)."""
        if self.param_specs and prefix + "raw" not in state_dict:
            rows = legacy_rows(state_dict, prefix, [s.name for s in self.param_specs])
            if rows is not None:
                state_dict[prefix + "raw"] = torch.stack(rows)
        if self.legacy_stages > 1 and saved_before_packing(state_dict, prefix + "flows.") \
                and not any(prefix + key in state_dict for key in self.state_dict()):
            warn_upgrade(f"the {type(self).__name__} under {prefix or 'the root'!r} was saved as "
                         f"{self.legacy_stages} stages (an earlier layout)")
            self.merge_legacy_stages(state_dict, [f"{prefix}flows.{t}." for t in range(self.legacy_stages)],
                                     state_dict, prefix)

    def merge_legacy_stages(self, source: dict, old_prefixes: list, target: dict, prefix: str) -> None:
        """Move the entries of the `legacy_stages` stages an earlier version saved under `old_prefixes` (popped from
        `source`) to this flow's `prefix` in `target`. Called by a composition loading such a file; for one stage
        it is a rename."""
        (old,) = old_prefixes
        for key in [k for k in source if k.startswith(old)]:
            target[prefix + key[len(old):]] = source.pop(key)

    def _row(self, name: str) -> int:
        for i, spec in enumerate(self.param_specs):
            if spec.name == name:
                return i
        valid = [s.name for s in self.param_specs]
        raise ValueError(f"{type(self).__name__} has no parameter {name!r}; valid: {valid}")

    def _unconstrained(self, spec: ParamSpec, value: Tensor) -> Tensor:
        if spec.constraint is None:
            return value
        if torch.any(value <= spec.constraint.lower):
            raise ValueError(f"{type(self).__name__}: {spec.name} must be > {spec.constraint.lower}, got {_fmt(value)}")
        return spec.constraint.inverse(value)

    def _params_for(self, x, sampling) -> dict:
        # A subclass may override params(x) without the sampling keyword; only pass it when it is set.
        return self.params(x) if sampling is None else self.params(x, sampling=sampling)

    # ------------------------------------------------------------------ public API
    def forward(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True, *,
                sampling: Optional["WeightSampling"] = None) -> Tensor:
        """G(f), broadcasting f against the parameters; validate=False skips the domain check."""
        p = self._params_for(x, sampling)
        if validate:
            self._check_input(f, p)
        return self._forward(f, p)

    def inverse(self, y: Tensor, x: Optional[Tensor] = None, validate: bool = True, *,
                sampling: Optional["WeightSampling"] = None) -> Tensor:
        """G⁻¹(y); validate=True raises a ValueError when y lies outside the codomain."""
        p = self._params_for(x, sampling)
        if validate:
            self._check_output(y, p)
        return self._inverse(y, p)

    def log_abs_det_jacobian(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True, *,
                             sampling: Optional["WeightSampling"] = None) -> Tensor:
        """log|dG/df| element-wise (the Jacobian of a marginal flow is diagonal)."""
        p = self._params_for(x, sampling)
        if validate:
            self._check_input(f, p)
        return self._log_det(f, p)

    def forward_and_log_det(self, f: Tensor, x: Optional[Tensor] = None, validate: bool = True, *,
                            sampling: Optional["WeightSampling"] = None):
        """(G(f), log|dG/df|) with a single evaluation of `params(x)`."""
        p = self._params_for(x, sampling)
        if validate:
            self._check_input(f, p)
        return self._forward_and_log_det(f, p)

    def codomain_bounds(self, x: Optional[Tensor] = None, *, sampling: Optional["WeightSampling"] = None):
        """(low, high) of the open interval G(domain), or None when it is the whole real line."""
        return self._bounds(self._params_for(x, sampling))

    def affine_coefficients(self, x: Optional[Tensor] = None, *, sampling: Optional["WeightSampling"] = None):
        """(a, b) with G(f) = a + b·f exactly, or None when G is not affine."""
        return self._affine(self._params_for(x, sampling))

    def domain_interval(self) -> tuple[Tensor, Tensor]:
        """(low, high) of the open domain: (0, inf) for positive flows, (-inf, inf) otherwise."""
        low = 0.0 if self.domain == "positive" else -math.inf
        return self._constant(low), self._constant(math.inf)

    def fit_codomain_to(self, low: Tensor, high: Tensor) -> None:
        """Adapt parameters so that the codomain contains [low, high], where the family allows it.

        Used by the data initialisation before fitting bounded flows; unbounded flows need nothing.
        """

    def __rshift__(self, other: "Flow") -> "Flow":
        """`a >> b` applies a, then b."""
        return compose(self, other)

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}, param_shape={tuple(self.param_shape)}"

    # ------------------------------------------------------------------ maths (override)
    def _forward(self, f: Tensor, p: dict) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _forward(f, p)")

    def _log_det(self, f: Tensor, p: dict) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _log_det(f, p)")

    def _inverse(self, y: Tensor, p: dict) -> Tensor:
        return monotone_inverse(
            lambda f: self._forward(f, p), lambda f: self._log_det(f, p), y, domain=self.domain, name=self.spec
        )

    def _forward_and_log_det(self, f: Tensor, p: dict):
        return self._forward(f, p), self._log_det(f, p)

    def _affine(self, p: dict):
        return None

    def _constant(self, value: float) -> Tensor:
        return self._anchor.new_full((), value)

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


# ---------------------------------------------------------------------- flows of flows
def _full_line(low, high) -> bool:
    return bool(torch.all(torch.isinf(low) & (low < 0))) and bool(torch.all(torch.isinf(high) & (high > 0)))


class FlowOfFlows(Flow):
    """Base of flows built from child flows `self.flows`: domain, codomain and the nested parameter
    dicts keyed by the child's index (subclasses: `Compose`, `LinearCombination`).

    Args:
        param_shape: as :class:`flowgp.flows.Flow` (subclasses set it from their children).
        **initial: as :class:`flowgp.flows.Flow`; a flow of flows declares no parameters of its own.

    See Also:
        :class:`flowgp.flows.Compose`, :class:`flowgp.flows.LinearCombination`.
    """

    @property
    def domain(self) -> str:
        return self.flows[0].domain

    @property
    def codomain(self) -> str:
        with torch.no_grad():
            bounds = self.codomain_bounds()
        if bounds is None:
            return "real"
        low, high = bounds
        if bool(torch.all(low == 0)) and bool(torch.all(torch.isinf(high))):
            return "positive"
        return "bounded"

    @property
    def _needs_input_check(self) -> bool:
        return any(f._needs_input_check for f in self.flows)

    def constrain(self, raw: dict) -> dict:
        return {str(i): f.constrain(raw[str(i)]) for i, f in enumerate(self.flows)}

    def params(self, x=None, *, sampling=None) -> dict:
        return {str(i): f._params_for(x, sampling) for i, f in enumerate(self.flows)}

    def _bounds_of_image(self, low, high):
        """The codomain from the image (low, high) of the domain: None for the whole real line."""
        return None if _full_line(low, high) else (low, high)


class Compose(FlowOfFlows):
    """f_K = G_{K-1}(...G_0(f_0)) (paper eq. 2), applied in list order: "sal+softplus" = softplus(sal(f)).

    log|G'| is the sum of the stages' log-derivatives at their own inputs; the inverse applies the
    stages' inverses in reverse order. Nested compositions are flattened.

    Args:
        flows: the stages, Flow instances in the order they are applied (at least one).

    Examples:
        >>> import torch
        >>> from flowgp.flows import Compose, SAL, Softplus
        >>> g = Compose([SAL(), Softplus()])  # the same as make_flow("sal+softplus")
        >>> g.spec
        'sal+softplus'
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
        self.param_shape = broadcast_param_shapes(flat)

    def upgrade_state_dict(self, state_dict: dict, prefix: str) -> None:
        """Also renumber the stages of a file saved when some stage (a SAL) was several stages."""
        super().upgrade_state_dict(state_dict, prefix)
        if all(f.legacy_stages == 1 for f in self.flows):
            return
        old = prefix + "flows."
        if not saved_before_packing(state_dict, old):
            return
        warn_upgrade(f"the composition under {prefix or 'the root'!r} was saved when some of its stages were "
                     "several stages (an earlier layout)")
        source = {key: state_dict.pop(key) for key in list(state_dict) if key.startswith(old)}
        j = 0
        for i, flow in enumerate(self.flows):
            flow.merge_legacy_stages(source, [f"{old}{j + t}." for t in range(flow.legacy_stages)], state_dict,
                                     f"{old}{i}.")
            j += flow.legacy_stages
        state_dict.update(source)  # entries no stage claimed: strict loading reports them

    def constructor_arguments(self) -> tuple[list, dict]:
        # The flattened stages: the same flow whatever nesting the call had.
        if type(self).__init__ is Compose.__init__:
            return [list(self.flows)], {}
        return super().constructor_arguments()

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
        return self._bounds_of_image(*self._image(*self.flows[0].domain_interval(), p))

    def _affine(self, p):
        a, b = None, None
        for i, flow in enumerate(self.flows):
            coef = flow._affine(p[str(i)])
            if coef is None:
                return None
            ai, bi = coef
            a, b = (ai, bi) if a is None else (ai + bi * a, bi * b)
        return a, b

    def fit_codomain_to(self, low, high) -> None:
        """Adapt bounded stages, last to first, so that the composition can reach [low, high]."""
        for i in reversed(range(len(self.flows))):
            flow = self.flows[i]
            flow.fit_codomain_to(low, high)
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
    """Composition applying the flows in the given order (same as `flows[0] >> flows[1] >> ...`).

    Args:
        *flows: the stages, Flow instances in the order they are applied.

    See Also:
        :class:`flowgp.flows.Compose`.
    """
    return Compose(flows)
