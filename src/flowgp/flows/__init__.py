"""Marginal (element-wise, strictly increasing) flows of the transformed GP (paper §3, appendix B).

Build them from spec strings with `make_flow("sal+softplus")`, compose them with `a >> b`, and
initialise them with `flowgp.initialisation` (init_identity, init_from_data, init_random).
"""
from .base import Flow, ParamSpec
from .combination import ArcsinhCombination, Compose, LinearCombination, compose
from .conditional import (InputDependentFlow, input_dependent_flows, make_input_dependent, static_flow,
                          weight_sampling)
from .elementwise import (Affine, Arcsinh, BoxCox, Exp, Identity, InverseBoxCox, Log, Sinh, SinhArcsinh,
                          Softplus, Tanh, TukeyGH)
from .factory import FLOW_ALIASES, FLOW_NAMES, make_flow
from .numerical import monotone_inverse

__all__ = [
    "Flow", "ParamSpec", "Identity", "Log", "Exp", "Softplus", "Sinh", "Arcsinh", "Affine", "SinhArcsinh",
    "BoxCox", "InverseBoxCox", "TukeyGH", "Tanh", "Compose", "compose", "LinearCombination",
    "ArcsinhCombination", "make_flow", "FLOW_NAMES", "FLOW_ALIASES",
    "monotone_inverse", "InputDependentFlow", "make_input_dependent", "static_flow",
    "input_dependent_flows", "weight_sampling",
]
