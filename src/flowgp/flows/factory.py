"""`make_flow`: build flows from spec strings such as "sal+softplus" or "lincomb5", through `flowgp.registry.FLOWS`.

Grammar (case-insensitive, whitespace ignored): stages joined by '+' are applied left to right.
A stage is a name registered in `FLOWS` (or an alias), "lincomb<I>" (eq. 26 with I terms), or
"sum(s1,s2,...)" / "add(s1,s2,...)" for a LinearCombination of sub-specs with / without its own
a_i + b_i coefficients. Every built-in flow's `spec` is written in this grammar, so it round-trips.

The built-in stages are registered here; a user's class registered with `FLOWS.register("mine", MyFlow)` (it is
called as `MyFlow(param_shape=...)`) is then usable as "mine" or "sal+mine". A built-in name cannot be taken.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..registry import FLOWS
from .base import Compose, Flow
from .combination import ArcsinhCombination, LinearCombination
from .elementwise import (SAL, Affine, Arcsinh, BoxCox, Exp, Identity, InverseBoxCox, Log, Sinh, SinhArcsinh,
                          Softplus, Tanh, TukeyGH)

__all__ = ["make_flow", "FLOW_NAMES", "FLOW_ALIASES", "sal"]


def sal(param_shape=()) -> SAL:
    """SAL (Rios & Tobar 2019): sinh-arcsinh followed by an affine map, one stage of TGP eq. 2 (`SAL`)."""
    return SAL(param_shape=param_shape)


_BUILT_IN = (("identity", Identity, ()), ("log", Log, ()), ("exp", Exp, ()), ("softplus", Softplus, ()),
             ("sinh", Sinh, ()), ("arcsinh", Arcsinh, ()), ("affine", Affine, ("l",)),
             ("sinharcsinh", SinhArcsinh, ("sa",)), ("sal", SAL, ()), ("boxcox", BoxCox, ()),
             ("inverseboxcox", InverseBoxCox, ("invboxcox",)), ("tukey", TukeyGH, ()), ("tanh", Tanh, ()),
             ("lincomb", ArcsinhCombination, ()))  # "lincomb" is eq. 26 with I = 3 terms
for _name, _factory, _aliases in _BUILT_IN:
    FLOWS.register(_name, _factory, aliases=_aliases)
del _name, _factory, _aliases


class _RegistryNames(Sequence):
    """Read-only, live tuple-like view of the canonical flow names in `FLOWS`."""

    def __getitem__(self, index):
        return tuple(FLOWS.names())[index]

    def __len__(self) -> int:
        return len(FLOWS)

    def __repr__(self) -> str:
        return repr(tuple(FLOWS.names()))


class _RegistryAliases(Mapping):
    """Read-only, live dict-like view {alias: canonical name} of the flow aliases in `FLOWS`."""

    def __getitem__(self, alias):
        return FLOWS.aliases()[alias]

    def __iter__(self):
        return iter(FLOWS.aliases())

    def __len__(self) -> int:
        return len(FLOWS.aliases())

    def __repr__(self) -> str:
        return repr(FLOWS.aliases())


#: Canonical single-stage names accepted by `make_flow` (a view of `flowgp.registry.FLOWS`).
FLOW_NAMES = _RegistryNames()
#: {alias: canonical name} (a view of `flowgp.registry.FLOWS`).
FLOW_ALIASES = _RegistryAliases()

_LINCOMB = re.compile(r"lincomb(\d*)")
_DEFAULT_LINCOMB_TERMS = 3


def _valid_names() -> str:
    aliases = ", ".join(f"{k} (= {v})" for k, v in FLOWS.aliases().items())
    return (f"valid names: {', '.join(FLOWS.names())}, lincomb<I> (e.g. lincomb5), sum(spec,...), "
            f"add(spec,...); aliases: {aliases}; join stages with '+'; register your own with "
            "flowgp.registry.FLOWS.register(name, FlowClass)")


def _split(text: str, sep: str, spec: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in flow spec {spec!r}")
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '(' in flow spec {spec!r}")
    parts.append(text[start:])
    if any(not p for p in parts):
        raise ValueError(f"empty stage in flow spec {spec!r}; {_valid_names()}")
    return parts


def _make_stage(stage: str, param_shape, spec: str) -> Flow:
    if stage.endswith(")") and "(" in stage:
        head, inner = stage[: stage.index("(")], stage[stage.index("(") + 1: -1]
        if head in ("sum", "add"):
            terms = [_make(s, param_shape, spec) for s in _split(inner, ",", spec)]
            return LinearCombination(terms, coefficients=head == "sum")
        raise ValueError(f"unknown flow {head!r}(...) in spec {spec!r}; {_valid_names()}")
    if stage in FLOWS:
        flow = FLOWS.create(stage, param_shape=param_shape)
        if not isinstance(flow, Flow):
            raise TypeError(f"the flow registered as {stage!r} built a {type(flow).__name__}, not a flowgp Flow")
        return flow
    match = _LINCOMB.fullmatch(stage)
    if match and match.group(1):
        num = int(match.group(1))
        if num < 1:
            raise ValueError(f"lincomb needs at least one term, got {stage!r} in spec {spec!r}")
        return ArcsinhCombination(num, param_shape=param_shape)
    raise ValueError(f"unknown flow {stage!r} in spec {spec!r}; {_valid_names()}")


def _make(text: str, param_shape, spec: str) -> Flow:
    stages = [_make_stage(s, param_shape, spec) for s in _split(text, "+", spec)]
    return stages[0] if len(stages) == 1 else Compose(stages)


def make_flow(spec, param_shape=()) -> Flow:
    """Build a flow from a spec string (see module docstring), or return a Flow instance unchanged.

    Args:
        spec: e.g. "sal+softplus", "tanh", "lincomb5", "boxcox+l", or a Flow.
        param_shape: shape of every parameter, e.g. (L,) for per-output parameters.
    Raises:
        ValueError: unknown names or malformed specs (the message lists the valid names).
        TypeError: spec neither a string nor a Flow.

    Examples:
        >>> from flowgp import make_flow
        >>> make_flow("sal+softplus").codomain
        'positive'
        >>> make_flow("sal", param_shape=(3,)).param_shape
        torch.Size([3])
    """
    if isinstance(spec, Flow):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"flow spec must be a string such as 'sal+softplus' or a Flow, got {type(spec).__name__}")
    text = re.sub(r"\s+", "", spec).lower()
    if not text:
        raise ValueError(f"empty flow spec; {_valid_names()}")
    return _make(text, tuple(param_shape), spec)
