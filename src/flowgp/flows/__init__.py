"""Marginal (element-wise, strictly increasing) flows of the transformed GP (paper §3, appendix B).

Build them from spec strings with `make_flow("sal+softplus")` (names resolved through
`flowgp.registry.FLOWS`), compose them with `a >> b`, save them with `flow_to_record` /
`flow_from_record`, and initialise them with `flowgp.training.initialisation` (init_identity, init_from_data, init_random).
Write your own by subclassing `Flow` (see `flowgp.flows.base` for the contract).
"""
from .base import Compose, Flow, FlowOfFlows, ParamSpec, asinh, compose
from .combination import ArcsinhCombination, LinearCombination
from .conditional import InputDependentFlow, input_dependent_flows, make_input_dependent, static_flow
from .elementwise import (SAL, Affine, Arcsinh, BoxCox, Exp, Identity, InverseBoxCox, Log, Sinh, SinhArcsinh,
                          Softplus, Tanh, TukeyGH)
from .factory import FLOW_ALIASES, FLOW_NAMES, make_flow
from .numerical import monotone_inverse
from .sampling import WeightSampling
from .serialization import flow_from_record, flow_to_record

__all__ = [
    "Flow", "ParamSpec", "FlowOfFlows", "Identity", "Log", "Exp", "Softplus", "Sinh", "Arcsinh", "Affine",
    "SinhArcsinh", "SAL", "BoxCox", "InverseBoxCox", "TukeyGH", "Tanh", "Compose", "compose", "LinearCombination",
    "ArcsinhCombination", "make_flow", "FLOW_NAMES", "FLOW_ALIASES",
    "monotone_inverse", "InputDependentFlow", "make_input_dependent", "static_flow",
    "input_dependent_flows", "WeightSampling", "flow_to_record",
    "flow_from_record", "asinh",
]
