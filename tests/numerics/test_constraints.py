"""The one positive-parameter convention (`flowgp.numerics.constraints`): x = softplus(raw) + lower, optionally
max(x, floor), stored as raw = inv_softplus(x - lower); every positive parameter of the library goes through it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flowgp.models.cnf_posterior import SCALE_LOWER
from flowgp.models.latent.encoders import STD_FLOOR, FreeLatent
from flowgp.numerics.constraints import Positive, inv_softplus, softplus_positive


def test_softplus_positive_is_softplus_plus_lower_then_floor():
    raw = torch.linspace(-40.0, 40.0, 201, dtype=torch.float64)
    assert torch.equal(softplus_positive(raw), F.softplus(raw))
    assert torch.equal(softplus_positive(raw, 1e-6), F.softplus(raw) + 1e-6)
    assert torch.equal(softplus_positive(raw, floor=1e-3), F.softplus(raw).clamp_min(1e-3))
    lower = torch.tensor([0.0, 1e-8, 0.5], dtype=torch.float64)
    assert torch.equal(softplus_positive(raw[:, None], lower), F.softplus(raw[:, None]) + lower)
    assert torch.equal(Positive(lower=0.25)(raw), softplus_positive(raw, 0.25))


@pytest.mark.parametrize("value", [1e-12, 1e-5, math.sqrt(1e-5), 0.05, 1.0, 30.0])
def test_inv_softplus_inverts_for_numbers_and_tensors(value):
    as_float = inv_softplus(value)
    assert isinstance(as_float, float)
    assert as_float == value + math.log(-math.expm1(-value))
    assert math.isclose(float(F.softplus(torch.tensor(as_float, dtype=torch.float64))), value, rel_tol=1e-12)
    tensor = inv_softplus(torch.tensor(value, dtype=torch.float64))
    assert tensor.dtype == torch.float64 and math.isclose(float(tensor), as_float, rel_tol=1e-12)
    assert torch.allclose(Positive(lower=1e-13).inverse(torch.tensor(value + 1e-13, dtype=torch.float64)), tensor)


def test_softplus_positive_traces_without_graph_breaks():
    # no Python branch on a tensor's value: one graph under torch.compile's fullgraph mode
    compiled = torch.compile(lambda r: softplus_positive(r, 1e-6, floor=1e-3), backend="eager", fullgraph=True)
    raw = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(compiled(raw), (F.softplus(raw) + 1e-6).clamp_min(1e-3))


def test_free_latent_std_is_floored_softplus():
    latent = FreeLatent(num_data=4, latent_dim=2)
    with torch.no_grad():
        latent.raw_std.copy_(torch.tensor([[-50.0, -3.0], [0.0, 1.0], [20.0, 40.0], [-14.0, -13.0]]))
    _, std = latent(torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.float64))
    assert torch.equal(std, F.softplus(latent.raw_std).clamp_min(STD_FLOOR))
    assert std.min() == STD_FLOOR  # softplus(-50) underflows below the floor


def test_a_number_and_its_tensor_inverse_give_the_cnf_base_its_initial_scale():
    scale_init = math.sqrt(1e-5)
    assert softplus_positive(torch.tensor(inv_softplus(scale_init), dtype=torch.float64), SCALE_LOWER).item() \
        == pytest.approx(scale_init + SCALE_LOWER, rel=1e-12)
