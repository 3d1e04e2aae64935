"""Convolution-process kernel: closed form vs the convolution integral, PSD joint Gram, SE special case."""
import math

import pytest
import torch

from flowgp.models.amogp.convolution import ConvolutionKernel
from flowgp.gp.kernels import make_kernel


def _random_kernel(d, r, dx, seed):
    g = torch.Generator().manual_seed(seed)
    k = ConvolutionKernel(d, dx, r)
    with torch.no_grad():
        k.raw_lengthscale.copy_(torch.randn(k.raw_lengthscale.shape, generator=g, dtype=torch.float64) * 0.7 - 0.5)
        k.raw_variance.copy_(torch.randn(k.raw_variance.shape, generator=g, dtype=torch.float64))
    return k


def test_cross_covariance_matches_convolution_integral_1d(float64_default):
    k = _random_kernel(3, 2, 1, seed=1)
    z = torch.linspace(-15, 15, 20001)
    x1 = torch.tensor([[-0.7], [0.2], [1.1]])
    x2 = torch.tensor([[0.5], [-1.3], [0.0], [2.0]])
    out1 = torch.tensor([0, 1, 2])
    out2 = torch.tensor([2, 0, 1, 1])
    numeric = torch.zeros(3, 4)
    for n in range(3):
        for m in range(4):
            for r in range(2):
                t1 = k.smoothing_kernel((x1[n] - z)[:, None], int(out1[n]), r)
                t2 = k.smoothing_kernel((x2[m] - z)[:, None], int(out2[m]), r)
                numeric[n, m] += torch.trapezoid(t1 * t2, z)
    closed = k(x1, out1, x2, out2)
    torch.testing.assert_close(closed, numeric, rtol=1e-6, atol=1e-9)


def test_cross_covariance_matches_convolution_integral_2d(float64_default):
    k = _random_kernel(2, 1, 2, seed=2)
    g = torch.linspace(-12, 12, 801)
    zz = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    x1, x2 = torch.tensor([[0.3, -0.4]]), torch.tensor([[-0.5, 0.6]])
    t1 = k.smoothing_kernel(x1 - zz, 0, 0)
    t2 = k.smoothing_kernel(x2 - zz, 1, 0)
    dz = (g[1] - g[0]) ** 2
    numeric = (t1 * t2).sum() * dz
    closed = k(x1, torch.tensor([0]), x2, torch.tensor([1]))[0, 0]
    torch.testing.assert_close(closed, numeric, rtol=1e-6, atol=1e-10)


def test_latent_inducing_covariances_match_convolution_integrals(float64_default):
    """u_r = T_u * w_r with unit variance: cov[f_d(x), u_r(z)] and cov[u_r(z), u_r(z')] by quadrature."""
    k = _random_kernel(3, 2, 1, seed=3)
    lu = torch.tensor([[0.35], [0.8]])  # [R, Dx]
    s = torch.linspace(-15, 15, 20001)

    def t_u(tau, r):  # amplitude from v_u = s_u² sqrt(π) ℓ_u = 1
        return torch.exp(-0.5 * (tau / lu[r]).square()) / torch.sqrt(math.sqrt(math.pi) * lu[r])

    x, out = torch.tensor([-0.7, 0.2, 1.1]), torch.tensor([0, 2, 1])
    z = torch.tensor([[0.5, -1.3], [0.0, 0.4]])  # [R, M]
    amp, lsq = k.inducing_parameters(out, lu)
    closed = amp[..., None] * torch.exp(-0.5 * (x[None, :, None] - z[:, None, :]).square() / lsq)  # [R, N, M]
    kuu = k.inducing_covariance(z.unsqueeze(-1), lu)
    for r in range(2):
        for n in range(3):
            for m in range(2):
                numeric = torch.trapezoid(k.smoothing_kernel((x[n] - s)[:, None], int(out[n]), r)
                                          * t_u(z[r, m] - s, r), s)
                torch.testing.assert_close(closed[r, n, m], numeric, rtol=1e-6, atol=1e-9)
        for i in range(2):
            for j in range(2):
                numeric = torch.trapezoid(t_u(z[r, i] - s, r) * t_u(z[r, j] - s, r), s)
                torch.testing.assert_close(kuu[r, i, j], numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_joint_gram_is_psd_for_random_hyperparameters(float64_default, seed):
    d, r, dx = 4, 3, 2
    k = _random_kernel(d, r, dx, seed=10 + seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, dx, generator=g)
    out = torch.randint(0, d, (40,), generator=g)
    gram = k(x, out)
    torch.testing.assert_close(gram, gram.mT)
    eig = torch.linalg.eigvalsh(gram)
    assert eig.min() > -1e-10 * eig.max()
    torch.testing.assert_close(torch.diagonal(gram), k.diag(x, out))
    # zero-lag output covariance is PSD too
    assert torch.linalg.eigvalsh(k.output_covariance()).min() > -1e-10


def test_single_output_is_rbf_with_sqrt2_lengthscale(float64_default):
    k = ConvolutionKernel(1, 2, 1, lengthscale=0.8, variance=1.7)
    rbf = make_kernel("rbf", 2, lengthscale=0.8, variance=1.7)
    x = torch.randn(7, 2)
    out = torch.zeros(7, dtype=torch.long)
    torch.testing.assert_close(k(x, out), rbf(x))
    torch.testing.assert_close(k.lengthscale[0, 0], torch.full((2,), 0.8 / math.sqrt(2)))


def test_gradients_gradcheck(float64_default):
    k = _random_kernel(2, 2, 1, seed=3)
    out1, out2 = torch.tensor([0, 1, 1]), torch.tensor([1, 0])
    x1 = torch.randn(3, 1, requires_grad=True)
    x2 = torch.randn(2, 1, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: k(a, out1, b, out2), (x1, x2))


def test_batched_leading_dims(float64_default):
    k = _random_kernel(2, 2, 1, seed=4)
    x = torch.randn(5, 3, 1)
    z = torch.randn(4, 1)
    out, zo = torch.tensor([0, 1, 0]), torch.tensor([0, 0, 1, 1])
    batched = k(x, out, z, zo)
    assert batched.shape == (5, 3, 4)
    torch.testing.assert_close(batched[2], k(x[2], out, z, zo))


def test_bad_input_refused(float64_default):
    k = ConvolutionKernel(2, 1, 1)
    x = torch.randn(3, 1)
    with pytest.raises(ValueError, match="0..1"):
        k(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="shape"):
        k(x, torch.tensor([0, 1]))
    with pytest.raises(TypeError):
        k(x, [0, 1, 1])
    with pytest.raises(ValueError, match="latent_processes"):
        ConvolutionKernel(2, 1, 0)
