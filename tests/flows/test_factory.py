"""make_flow (flowgp.flows.factory): spec strings, aliases and sums build the right flows; an unknown name, a
malformed spec or a non-flow object is a clear error."""
import pytest
import torch

from flowgp.flows import Affine, Tanh, make_flow


def test_make_flow_names_aliases_and_errors():
    assert make_flow("SAL + Softplus").spec == "sal+softplus"
    assert make_flow("l").spec == "affine" and make_flow("sa").spec == "sinharcsinh"
    assert make_flow("invboxcox").spec == "inverseboxcox"
    assert make_flow("lincomb").spec == "lincomb3" and make_flow("lincomb5").spec == "lincomb5"
    assert make_flow("sum(sal+softplus, tanh)").spec == "sum(sal+softplus,tanh)"
    flow = Tanh()
    assert make_flow(flow) is flow
    with pytest.raises(ValueError, match="unknown flow 'foo'.*valid names: identity"):
        make_flow("sal+foo")
    for bad in ("", "sal+", "sum(sal", "lincomb0", "sum()"):
        with pytest.raises(ValueError):
            make_flow(bad)
    for bad in (3, None, ["sal"], torch.nn.Linear(1, 1)):
        with pytest.raises(TypeError):
            make_flow(bad)
    with pytest.raises(TypeError, match="unknown parameters"):
        Affine(scale=2.0)
    with pytest.raises(ValueError, match="b must be > 0"):
        Affine(b=-1.0)
