"""Compositions and linear combinations of flows (flowgp.flows.combination): the chain rule for the log-det, the
inverse in reverse order, flattening, affine coefficients of affine compositions, a common domain required."""
import pytest
import torch

from flowgp.flows import Affine, Compose, Exp, Identity, LinearCombination, Log, Tanh, compose, make_flow
from flowgp.training.initialisation import init_random


def _random(name, seed=0):
    return init_random(make_flow(name), std=0.5, generator=torch.Generator().manual_seed(seed))


def test_composition_order_log_det_and_inverse(float64_default):
    a, b = _random("arcsinh"), _random("tanh", seed=3)
    both = a >> b
    assert isinstance(both, Compose) and both.spec == "arcsinh+tanh"
    f = 1.5 * torch.randn(9, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(both(f), b(a(f)))
    torch.testing.assert_close(both.log_abs_det_jacobian(f), a.log_abs_det_jacobian(f) + b.log_abs_det_jacobian(a(f)))
    torch.testing.assert_close(both.inverse(both(f)), f)
    assert len(compose(both, Exp(), both).flows) == 5  # nested compositions flatten
    with pytest.raises(TypeError):
        compose(a, "tanh")


def test_affine_coefficients_of_composite_affine_maps(float64_default):
    for flow in (Affine(a=1.0, b=2.0) >> Identity() >> Affine(a=-3.0, b=0.5),
                 LinearCombination([Affine(a=1.0, b=2.0), Identity()])):
        init_random(flow, generator=torch.Generator().manual_seed(0))
        a, b = flow.affine_coefficients()
        f = torch.linspace(-2, 2, 5)
        torch.testing.assert_close(a + b * f, flow(f))
    assert (Identity() >> Identity()).is_identity and not Affine().is_identity
    a, b = Identity().double().affine_coefficients()
    assert a.dtype == b.dtype == torch.float64  # constants follow the module's dtype


def test_linear_combination_needs_a_common_domain():
    with pytest.raises(ValueError, match="share a domain"):
        LinearCombination([Log(), Tanh()])
    with pytest.raises(ValueError):
        LinearCombination([])
