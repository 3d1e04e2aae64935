"""One registry for flow names (flowgp.registry.FLOWS): make_flow resolves every stage name through it."""
import pytest
import torch

from flow_user_classes import Cubic
from flowgp.flows import FLOW_ALIASES, FLOW_NAMES, Compose, SinhArcsinh, make_flow
from flowgp.registry import FLOWS

BUILT_IN = ("identity", "log", "exp", "softplus", "sinh", "arcsinh", "affine", "sinharcsinh", "sal", "boxcox",
            "inverseboxcox", "tukey", "tanh", "lincomb")


def test_every_built_in_stage_is_registered_and_the_views_follow_the_registry():
    assert tuple(FLOW_NAMES) == BUILT_IN == tuple(FLOWS.names())[:len(BUILT_IN)]
    assert dict(FLOW_ALIASES) == {"l": "affine", "sa": "sinharcsinh", "invboxcox": "inverseboxcox"}
    for name in BUILT_IN:
        assert make_flow(name).spec.startswith(name if name not in ("sal", "lincomb") else
                                               {"sal": "sal", "lincomb": "lincomb3"}[name])
    with pytest.raises(TypeError):
        FLOW_ALIASES["x"] = "affine"  # read-only views
    with pytest.raises(TypeError):
        FLOW_NAMES[0] = "x"


def test_a_registered_user_flow_works_in_specs():
    FLOWS.register("mine", Cubic, aliases=("cub",))
    try:
        assert "mine" in FLOW_NAMES and FLOW_ALIASES["cub"] == "mine"
        flow = make_flow("sal + Mine", param_shape=(2,))
        assert isinstance(flow, Compose) and type(flow.flows[1]) is Cubic
        assert flow.flows[1].param_shape == (2,)
        assert type(make_flow("cub")) is Cubic
        torch.testing.assert_close(make_flow("sum(mine,sa)")(torch.zeros(3)), torch.zeros(3))
    finally:
        FLOWS.unregister("mine")
    assert "mine" not in FLOW_NAMES
    with pytest.raises(ValueError, match="unknown flow 'mine'"):
        make_flow("mine")


def test_built_in_names_cannot_be_taken_and_unknown_names_list_the_registry():
    for name in ("sal", "SAL", "l", "tanh"):
        with pytest.raises(ValueError, match="already registered"):
            FLOWS.register(name, Cubic)
    with pytest.raises(ValueError, match="already registered"):
        FLOWS.register("other", Cubic, aliases=("sa",))
    assert FLOWS.get("sa") is SinhArcsinh and "other" not in FLOWS
    FLOWS.register("listed", Cubic)
    try:
        with pytest.raises(ValueError, match=r"unknown flow 'nope'.*valid names: identity, .*tanh, lincomb, listed"):
            make_flow("sal+nope")
    finally:
        FLOWS.unregister("listed")


def test_a_registered_factory_must_build_a_flow():
    FLOWS.register("notaflow", lambda param_shape=(): torch.nn.Identity())
    try:
        with pytest.raises(TypeError, match="not a flowgp Flow"):
            make_flow("notaflow")
    finally:
        FLOWS.unregister("notaflow")
