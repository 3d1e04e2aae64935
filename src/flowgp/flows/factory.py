"""`make_flow`: build flows from spec strings such as "sal+softplus" or "lincomb5".

Grammar (case-insensitive, whitespace ignored): stages joined by '+' are applied left to right.
A stage is a name from FLOW_NAMES (or an alias), "lincomb<I>" (eq. 26 with I terms), or
"sum(s1,s2,...)" / "add(s1,s2,...)" for a LinearCombination of sub-specs with / without its own
a_i + b_i coefficients. Every flow's `spec` is written in this grammar, so it round-trips.
"""
from __future__ import annotations

import re

from .base import Flow
from .combination import ArcsinhCombination, Compose, LinearCombination
from .elementwise import (Affine, Arcsinh, BoxCox, Exp, Identity, InverseBoxCox, Log, Sinh, SinhArcsinh,
                          Softplus, Tanh, TukeyGH)

__all__ = ["make_flow", "FLOW_NAMES", "FLOW_ALIASES"]

_SIMPLE = {
    "identity": Identity, "log": Log, "exp": Exp, "softplus": Softplus, "sinh": Sinh, "arcsinh": Arcsinh,
    "affine": Affine, "sinharcsinh": SinhArcsinh, "boxcox": BoxCox, "inverseboxcox": InverseBoxCox,
    "tukey": TukeyGH, "tanh": Tanh,
}

#: Canonical single-stage names accepted by `make_flow` ("lincomb" means eq. 26 with I = 3).
FLOW_NAMES = (
    "identity", "log", "exp", "softplus", "sinh", "arcsinh", "affine", "sinharcsinh", "sal",
    "boxcox", "inverseboxcox", "tukey", "tanh", "lincomb",
)
FLOW_ALIASES = {"l": "affine", "sa": "sinharcsinh", "invboxcox": "inverseboxcox"}

_LINCOMB = re.compile(r"lincomb(\d*)")
_DEFAULT_LINCOMB_TERMS = 3


def _valid_names() -> str:
    aliases = ", ".join(f"{k} (= {v})" for k, v in FLOW_ALIASES.items())
    return (f"valid names: {', '.join(FLOW_NAMES)}, lincomb<I> (e.g. lincomb5), sum(spec,...), "
            f"add(spec,...); aliases: {aliases}; join stages with '+'")


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
    name = FLOW_ALIASES.get(stage, stage)
    if name in _SIMPLE:
        return _SIMPLE[name](param_shape=param_shape)
    if name == "sal":
        # Rios & Tobar (2019): sinh-arcsinh followed by an affine map, one stage of eq. 2.
        return Compose([SinhArcsinh(param_shape=param_shape), Affine(param_shape=param_shape)])
    match = _LINCOMB.fullmatch(name)
    if match:
        num = int(match.group(1)) if match.group(1) else _DEFAULT_LINCOMB_TERMS
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
    """
    if isinstance(spec, Flow):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"flow spec must be a string such as 'sal+softplus' or a Flow, got {type(spec).__name__}")
    text = re.sub(r"\s+", "", spec).lower()
    if not text:
        raise ValueError(f"empty flow spec; {_valid_names()}")
    return _make(text, tuple(param_shape), spec)
