"""The stepper: a non-finite step is backed off (learning rate halved, parameters untouched) or raised."""
import math

import pytest
import torch

from flowgp.training.distributed import World
from flowgp.training.stepper import Optimisers, Stepper


def test_stepper_backs_off_a_non_finite_step():
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    adam = torch.optim.Adam([w], lr=0.1)
    values = iter([math.nan, 2.0])

    def objective(batch):
        return (w - 3.0).square().sum() * next(values)

    stepper = Stepper(objective, Optimisers([w], adam, None, [adam], []), None, True, World(), [[0.1]], 1)
    assert stepper.step(None, 0) == (math.inf, False)
    assert w.item() == 1.0 and adam.param_groups[0]["lr"] == 0.05
    value, taken = stepper.step(None, 1)
    assert taken and value == 8.0 and w.item() != 1.0
    raising = Stepper(lambda batch: w.sum() * math.nan, Optimisers([w], adam, None, [adam], []), None, False,
                      World(), [[0.1]], 1)
    with pytest.raises(FloatingPointError, match="nonfinite='backoff'"):
        raising.step(None, 0)
