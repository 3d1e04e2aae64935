import math

import pytest
import torch

from flowgp.numerics.quadrature import expectation, gauss_hermite, log_expectation_exp


def test_gauss_hermite_integrates_gaussian_moments_exactly():
    nodes, weights = gauss_hermite(10)
    assert torch.isclose(weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    # E[z^k] of a standard normal: 0, 1, 0, 3, 0, 15
    for k, expected in enumerate([1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 15.0]):
        assert (weights * nodes**k).sum().item() == pytest.approx(expected, abs=1e-10)


def test_expectation_matches_closed_form_and_monte_carlo():
    mean = torch.tensor([[-1.0, 0.5], [2.0, 0.0]], dtype=torch.float64)
    var = torch.tensor([[0.3, 1.2], [0.05, 2.0]], dtype=torch.float64)
    # E[exp(f)] = exp(mu + var/2) (log-normal mean)
    got = expectation(torch.exp, mean, var, num_points=30)
    torch.testing.assert_close(got, torch.exp(mean + var / 2), rtol=1e-10, atol=0)
    # a non-polynomial, non-closed-form integrand against Monte Carlo
    g = torch.Generator().manual_seed(1)
    samples = mean + var.sqrt() * torch.randn((400_000,) + mean.shape, generator=g, dtype=torch.float64)
    mc = torch.tanh(3 * samples).mean(0)
    quad = expectation(lambda f: torch.tanh(3 * f), mean, var, num_points=60)
    se = torch.tanh(3 * samples).std(0) / math.sqrt(400_000)
    assert torch.all((quad - mc).abs() < 5 * se + 1e-6)


def test_log_expectation_exp_is_log_of_expectation():
    mean = torch.tensor([0.3, -0.2], dtype=torch.float64)
    var = torch.tensor([0.4, 0.9], dtype=torch.float64)
    got = log_expectation_exp(lambda f: -0.5 * f**2, mean, var, num_points=80)
    # ∫ exp(-f²/2) N(f; m, v) df = N(m; 0, 1 + v) · sqrt(2π)
    expected = -0.5 * mean**2 / (1 + var) - 0.5 * torch.log(1 + var)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_bad_number_of_points():
    with pytest.raises(ValueError, match="num_points"):
        gauss_hermite(0)
