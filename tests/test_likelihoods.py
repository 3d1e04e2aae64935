import math

import pytest
import torch

from flowgp.likelihoods import GaussianLikelihood, Likelihood
from flowgp.quadrature import expectation


def test_gaussian_closed_forms_match_quadrature():
    lik = GaussianLikelihood(noise=0.3).double()
    y = torch.tensor([[0.2], [-1.0], [3.0]], dtype=torch.float64)
    mean = torch.tensor([[0.0], [0.5], [2.0]], dtype=torch.float64)
    var = torch.tensor([[0.1], [1.5], [0.01]], dtype=torch.float64)
    quad = Likelihood.expected_log_prob(lik, y, mean, var, num_points=20)
    torch.testing.assert_close(lik.expected_log_prob(y, mean, var), quad, rtol=1e-12, atol=1e-12)
    quad_lpd = Likelihood.predictive_log_density(lik, y, mean, var, num_points=200)
    torch.testing.assert_close(lik.predictive_log_density(y, mean, var), quad_lpd, rtol=1e-6, atol=1e-8)
    assert lik.noise.item() == pytest.approx(0.3)


def test_noise_setter_and_validation():
    lik = GaussianLikelihood(noise=0.1, num_outputs=2).double()
    lik.noise = 0.5
    torch.testing.assert_close(lik.noise, torch.full((2,), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="noise"):
        GaussianLikelihood(noise=0.0)


def test_log_prob_is_normal_density():
    lik = GaussianLikelihood(noise=2.0).double()
    got = lik.log_prob(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    assert got.item() == pytest.approx(-0.5 * math.log(2 * math.pi * 2.0) - 0.25)
