"""The Flow contract (flowgp.flows.base) for user-defined flows, alone and inside every built-in construction.

The built-in flows are checked in test_elementwise.py and test_combination.py (every registered name and several
compositions); here the same identities - inverse(forward(f)) = f, log|G'| = log of the autograd derivative,
broadcasting shapes, gradients - for classes written outside flowgp, which follow only the documented contract (param_specs, _forward, _log_det,
optionally _inverse).
"""
import pytest
import torch
from torch.func import functional_call

from flow_testing import perturb
from flow_user_classes import Cubic, Scale
from flowgp.flows import (Affine, Compose, Flow, InputDependentFlow, LinearCombination, SinhArcsinh, Tanh,
                          WeightSampling, make_flow, make_input_dependent)

pytestmark = pytest.mark.usefixtures("float64_default")


BUILDERS = {
    "cubic": lambda shape: Cubic(param_shape=shape),
    "scale": lambda shape: Scale(shift=0.5, param_shape=shape),
    "cubic>>sal": lambda shape: Cubic(param_shape=shape) >> make_flow("sal", param_shape=shape),
    "sa>>scale>>cubic": lambda shape: Compose([SinhArcsinh(param_shape=shape), Scale(-1.0, param_shape=shape),
                                               Cubic(param_shape=shape)]),
    "sum(cubic,scale,tanh)": lambda shape: LinearCombination([Cubic(param_shape=shape), Scale(param_shape=shape),
                                                              Tanh(param_shape=shape)]),
    "make_flow(cubic)+softplus": lambda shape: make_flow(Cubic(param_shape=shape)) >> make_flow("softplus"),
}


def _inputs(shape, seed=1):
    return 1.5 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", BUILDERS)
def test_inverse_log_det_and_shapes(case):
    flow = perturb(BUILDERS[case](()))
    f = _inputs((6, 4))
    y = flow(f)
    torch.testing.assert_close(flow.inverse(y), f, rtol=1e-8, atol=1e-9)
    t = f.clone().requires_grad_(True)
    (deriv,) = torch.autograd.grad(flow(t).sum(), t)
    assert bool(torch.all(deriv > 0))
    torch.testing.assert_close(flow.log_abs_det_jacobian(f), torch.log(deriv), rtol=1e-8, atol=1e-9)
    g, ld = flow.forward_and_log_det(f)
    torch.testing.assert_close(g, y)
    torch.testing.assert_close(ld, torch.log(deriv), rtol=1e-8, atol=1e-9)
    # Per-output parameters broadcast against [..., N, 1] inputs and really differ per output.
    per_output = perturb(BUILDERS[case]((3,)), seed=2)
    x = _inputs((7, 5, 1))
    out = per_output(x)
    assert out.shape == per_output.log_abs_det_jacobian(x).shape == (7, 5, 3)
    assert per_output.inverse(out).shape == (7, 5, 3)
    assert not torch.allclose(out[..., 0], out[..., 1])


@pytest.mark.parametrize("case", ["cubic", "scale", "cubic>>sal"])
def test_gradients_with_respect_to_parameters(case):
    flow = perturb(BUILDERS[case](()))
    names = [n for n, _ in flow.named_parameters()]
    raws = [p.detach().clone().requires_grad_(True) for _, p in flow.named_parameters()]
    f = _inputs((4,)).requires_grad_(True)

    def forward(f, *raws):
        return functional_call(flow, dict(zip(names, raws)), (f,))

    def inverse(y, *raws):
        return functional_call(_Inverse(flow), {"flow." + n: r for n, r in zip(names, raws)}, (y,))

    assert torch.autograd.gradcheck(forward, (f, *raws))
    assert torch.autograd.gradcheck(inverse, (flow(f).detach().requires_grad_(True), *raws))


class _Inverse(torch.nn.Module):
    def __init__(self, flow):
        super().__init__()
        self.flow = flow

    def forward(self, y):
        return self.flow.inverse(y)


def test_user_flow_is_returned_by_make_flow_and_keeps_its_class():
    flow = Cubic()
    assert make_flow(flow) is flow
    assert type((flow >> Affine()).flows[0]) is Cubic
    assert flow.dtype == torch.float64 and flow.device.type == "cpu"


@pytest.mark.parametrize("param_shape", [(), (2,)])
def test_user_flow_becomes_input_dependent(param_shape):
    """A constant network reproduces the plain user flow; the rows follow x otherwise (paper §3.2)."""
    base = perturb(Cubic(param_shape=param_shape))
    flow = make_input_dependent(base >> Scale(param_shape=param_shape), 3, hidden=(5,), dropout=0.0,
                                bayesian="point", generator=torch.Generator().manual_seed(0))
    assert isinstance(flow, Compose) and isinstance(flow.flows[0], InputDependentFlow)
    assert isinstance(flow.flows[1], InputDependentFlow)  # Scale is not declared affine: it is wrapped too
    x = torch.randn(6, 3)
    f = _inputs((6, 2))
    plain = base >> flow.flows[1].base
    for stage in flow.flows:
        stage.network.set_constant_(stage.raw_target())
    deterministic = WeightSampling(stochastic=False)
    torch.testing.assert_close(flow(f, x, sampling=deterministic), plain(f))
    torch.testing.assert_close(flow.inverse(plain(f), x, sampling=deterministic), f)
    perturb(flow.flows[0].network, seed=3)
    varied = flow(f, x, sampling=deterministic)
    assert not torch.allclose(varied, plain(f))
    torch.testing.assert_close(flow.inverse(varied, x, sampling=deterministic), f)


def test_contract_errors_name_the_missing_method():
    class Incomplete(Flow):
        pass

    with pytest.raises(NotImplementedError, match="Incomplete must implement _forward"):
        Incomplete()(torch.zeros(2))
