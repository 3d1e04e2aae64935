"""Ψ-statistics (supplement A.3) against Monte Carlo under q(a), and their point-mass limit."""
import pytest
import torch

from flowgp.convolution import ConvolutionKernel
from flowgp.psi_statistics import cp_psi_statistics, se_psi_statistics

NUM_MC = 100_000


def _assert_within_se(closed, samples, k=4.5):
    """closed vs the MC mean of `samples` [S, ...], elementwise within k standard errors (+ tiny slack)."""
    mean = samples.mean(0)
    se = samples.std(0) / samples.shape[0] ** 0.5
    bad = (closed - mean).abs() > k * se + 1e-9
    assert not bad.any(), f"max |z| = {((closed - mean).abs() / (se + 1e-300)).max():.2f}"


def test_se_statistics_match_monte_carlo(float64_default):
    g = torch.Generator().manual_seed(0)
    n, m, dx = 3, 4, 2
    mean = torch.randn(n, dx, generator=g)
    var = 0.5 * torch.rand(n, dx, generator=g) + 0.05
    z = torch.randn(m, dx, generator=g)
    variance, ls = torch.tensor(1.3), torch.tensor([0.7, 1.4])
    stats, xi = se_psi_statistics(mean, var, z, variance, ls, with_mean=True)
    a = mean + var.sqrt() * torch.randn(NUM_MC, n, dx, generator=g)  # [S, N, D]
    k = variance * torch.exp(-0.5 * ((a.unsqueeze(-2) - z) / ls).square().sum(-1))  # [S, N, M]
    torch.testing.assert_close(stats.psi0, torch.full((n,), 1.3))
    _assert_within_se(stats.psi1, k)
    _assert_within_se(stats.psi2, k.unsqueeze(-1) * k.unsqueeze(-2))
    _assert_within_se(xi, a.unsqueeze(-2) * k.unsqueeze(-1))


@pytest.mark.parametrize("latents", [1, 2])
def test_cp_statistics_match_monte_carlo(float64_default, latents):
    g = torch.Generator().manual_seed(latents)
    kern = ConvolutionKernel(3, 1, latents, lengthscale=0.9)
    with torch.no_grad():
        kern.raw_lengthscale.add_(0.4 * torch.randn(kern.raw_lengthscale.shape, generator=g))
        kern.raw_variance.add_(0.4 * torch.randn(kern.raw_variance.shape, generator=g))
    n = 4
    out = torch.tensor([0, 1, 2, 1])
    mean = torch.randn(n, 1, generator=g)
    var = 0.4 * torch.rand(n, 1, generator=g) + 0.02
    z = torch.linspace(-1.5, 1.5, 5)[:, None]
    zo = torch.tensor([0, 1, 2, 2, 0])
    stats = cp_psi_statistics(kern, mean, var, out, z, zo)
    a = mean + var.sqrt() * torch.randn(NUM_MC, n, 1, generator=g)
    with torch.no_grad():
        k = kern(a, out, z, zo)  # [S, N, M]
        kaa = kern.diag(mean, out)
    torch.testing.assert_close(stats.psi0, kaa)
    _assert_within_se(stats.psi1, k)
    _assert_within_se(stats.psi2, k.unsqueeze(-1) * k.unsqueeze(-2))


def test_point_mass_reduces_to_kernel(float64_default):
    kern = ConvolutionKernel(2, 1, 2, lengthscale=0.6)
    x = torch.randn(5, 1)
    out = torch.tensor([0, 1, 1, 0, 1])
    z = torch.randn(3, 1)
    zo = torch.tensor([1, 0, 1])
    stats = cp_psi_statistics(kern, x, torch.zeros_like(x), out, z, zo)
    kxz = kern(x, out, z, zo)
    torch.testing.assert_close(stats.psi1, kxz)
    torch.testing.assert_close(stats.psi2, kxz.unsqueeze(-1) * kxz.unsqueeze(-2))
    se = se_psi_statistics(x, torch.zeros_like(x), z, 2.0, torch.tensor([0.5]))
    kse = 2.0 * torch.exp(-0.5 * (x - z.mT).square() / 0.25)
    torch.testing.assert_close(se.psi1, kse)


def test_gradcheck_psi2(float64_default):
    kern = ConvolutionKernel(2, 1, 1, lengthscale=0.8)
    out, zo = torch.tensor([0, 1]), torch.tensor([1, 0, 0])
    z = torch.randn(3, 1)
    mean = torch.randn(2, 1, requires_grad=True)
    var = (0.3 * torch.ones(2, 1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, v: cp_psi_statistics(kern, m, v, out, z, zo).psi2, (mean, var))


def test_bad_input_refused(float64_default):
    with pytest.raises(ValueError, match="non-negative"):
        se_psi_statistics(torch.zeros(2, 1), -torch.ones(2, 1), torch.zeros(3, 1), 1.0, 1.0)
    with pytest.raises(ValueError, match="same shape"):
        se_psi_statistics(torch.zeros(2, 1), torch.ones(3, 1), torch.zeros(3, 1), 1.0, 1.0)
