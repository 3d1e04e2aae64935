"""The numerical inverse of flows without a closed-form one (flowgp.flows.numerical): it fails loudly outside the
range, finds roots over many decades on a positive domain, gives NaN for non-finite targets, and its gradients are
the implicit-function ones."""
import math

import pytest
import torch

from flowgp.flows import LinearCombination, Tanh, make_flow, monotone_inverse
from flowgp.training.initialisation import init_random


def test_numerical_inverse_fails_loudly_and_respects_the_domain(float64_default):
    bounded = LinearCombination([Tanh(), Tanh(c=1.0)])
    with pytest.raises(ValueError, match="lie in"):
        bounded.inverse(torch.tensor([5.0]))
    with pytest.raises(RuntimeError, match="numerical inverse of the sum\\(tanh,tanh\\) flow failed"):
        bounded.inverse(torch.tensor([0.1, 5.0]), validate=False)
    # Positive domain: roots spanning many decades (G = log, so x = exp(y)).
    y = torch.tensor([-300.0, -30.0, 0.0, 30.0, 300.0])
    x = monotone_inverse(torch.log, lambda t: -torch.log(t), y, domain="positive", name="log")
    torch.testing.assert_close(x, torch.exp(y), rtol=1e-12, atol=0)
    # Non-finite targets give NaN rather than an error or garbage.
    x = monotone_inverse(torch.sinh, lambda t: torch.log(torch.cosh(t)), torch.tensor([1.0, math.nan]))
    assert x[0].item() == pytest.approx(math.asinh(1.0)) and math.isnan(x[1].item())


def test_numerical_inverse_gradient_is_the_implicit_one(float64_default):
    flow = init_random(make_flow("tukey"), std=0.5, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([-2.0, 0.3, 4.0], requires_grad=True)
    x = flow.inverse(y)
    x.sum().backward()
    # dx/dy = 1 / G'(x) and dx/dθ = -(∂G/∂θ) / G'(x).
    torch.testing.assert_close(y.grad, torch.exp(-flow.log_abs_det_jacobian(x.detach())))
    (grads,) = torch.autograd.grad(flow(x.detach()).sum(), flow.raw)  # rows (g, h)
    weights = torch.exp(-flow.log_abs_det_jacobian(x.detach()))
    per_point = [torch.autograd.grad(flow(x.detach()[i]), flow.raw)[0] for i in range(3)]
    expected = -sum(per_point[i] * weights[i] for i in range(3))
    torch.testing.assert_close(flow.raw.grad, expected)
    assert bool(torch.all(torch.isfinite(grads)))
