"""flowgp.training.initialisation: the flow initialisers run on training.train (guarded Adam, L-BFGS, best point).

The recovery tests of each initialiser live beside their flows (tests/flows/test_elementwise.py,
tests/flows/test_conditional.py); these check the guards the training loop now provides."""
import math

import pytest
import torch

from flowgp.flows import make_flow, make_input_dependent
from flowgp.training.initialisation import init_from_data, init_identity, init_input_dependent, init_random

pytestmark = pytest.mark.usefixtures("float64_default")


def _grid_mse(flow):
    x = torch.linspace(-3, 3, 500)
    with torch.no_grad():
        return torch.mean((flow(x, validate=False) - x) ** 2).item()


def test_identity_fit_with_a_reckless_step_size_keeps_the_best_point():
    flow = init_random(make_flow("sal+tanh"), std=0.5, generator=torch.Generator().manual_seed(0))
    start = _grid_mse(flow)
    mse = init_identity(flow, lr=20.0, steps=300)  # Adam jumps about: the end point is not the best one
    assert math.isfinite(mse) and mse <= start
    assert mse == pytest.approx(_grid_mse(flow), rel=1e-12)  # the returned value is that of the kept point


def test_data_fit_never_ends_worse_than_it_started():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(200, generator=g).exp()
    flow = init_random(make_flow("sal"), std=0.3, generator=torch.Generator().manual_seed(2))
    z = flow.inverse(y, validate=False)
    start = -torch.mean(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - flow.log_abs_det_jacobian(z, validate=False))
    nll = init_from_data(flow, y, steps=50)
    assert nll <= start.item()


def test_input_dependent_fit_is_reproducible_for_a_generator():

    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(3))
    results = []
    for _ in range(2):
        torch.manual_seed(0)  # the network's initial weights (the test's own, not the initialiser's, draws)
        flow = make_input_dependent(make_flow("sal"), 2, hidden=(8,))
        torch.manual_seed(1)
        mse = init_input_dependent(flow, x, epochs=5, batch_size=16, generator=torch.Generator().manual_seed(4))
        results.append((mse, [p.detach().clone() for p in flow.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.equal(a, b)

