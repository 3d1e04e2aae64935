"""G-SP baseline (TGP appendix A.5.1): Gaussian variational family over a flow-transformed prior."""
import math

import pytest
import torch

from flowgp.training.initialisation import init_random
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import GSP, SVGP
from flowgp.training.loop import train


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 4 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    y = torch.tanh(2 * torch.sin(2 * x)) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return x, y, g


def _randomise_q(gp, g):
    m = gp.q_mu.shape[-1]
    with torch.no_grad():
        gp.q_mu.copy_(torch.randn(1, m, generator=g, dtype=torch.float64))
        gp.q_sqrt.copy_(0.4 * torch.eye(m, dtype=torch.float64)
                        + 0.1 * torch.randn(m, m, generator=g, dtype=torch.float64).tril())


def test_identity_flow_gives_exactly_the_svgp_elbo():
    x, y, g = _data()
    z = torch.linspace(0, 4, 5, dtype=torch.float64)[:, None]
    svgp = SVGP(make_kernel("rbf", 1), z, GaussianLikelihood(0.1)).double()
    _randomise_q(svgp.gp, g)
    gsp = GSP(make_kernel("rbf", 1), z, "identity", GaussianLikelihood(0.1), mc_samples=3).double()
    gsp.load_state_dict(svgp.state_dict(), strict=False)
    with torch.no_grad():
        for seed in range(3):  # exact per draw (the MC terms cancel), not only in expectation
            value = gsp.elbo(x, y, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(value, svgp.elbo(x, y), rtol=1e-9, atol=1e-8)


def test_identity_flow_with_optimal_q_recovers_the_exact_log_marginal_likelihood():
    # Z = X and q(u) = the exact posterior: the bound is tight, ELBO = log N(y; 0, K + σ² I)
    x, y, _ = _data(n=8)
    noise = 0.1
    kernel = make_kernel("rbf", 1)
    gsp = GSP(kernel, x.clone(), "identity", GaussianLikelihood(noise), learn_inducing=False,
              conditional_jitter=1e-8).double()
    with torch.no_grad():
        k = kernel(x) + 1e-10 * torch.eye(8, dtype=torch.float64)
        lz = torch.linalg.cholesky(k)
        cov_y = k + noise * torch.eye(8, dtype=torch.float64)
        post_mean = k @ torch.linalg.solve(cov_y, y)
        post_cov = k - k @ torch.linalg.solve(cov_y, k)
        v_mean = torch.linalg.solve_triangular(lz, post_mean, upper=False)
        a = torch.linalg.solve_triangular(lz, post_cov, upper=False)
        v_cov = torch.linalg.solve_triangular(lz, a.mT, upper=False)
        gsp.gp.q_mu.copy_(v_mean.mT)
        gsp.gp.q_sqrt.copy_(torch.linalg.cholesky(0.5 * (v_cov + v_cov.mT)).unsqueeze(0))
        exact = torch.distributions.MultivariateNormal(torch.zeros(8, dtype=torch.float64), cov_y).log_prob(y[:, 0])
        torch.testing.assert_close(gsp.elbo(x, y), exact, rtol=1e-5, atol=1e-5)


def test_affine_flow_monte_carlo_agrees_with_its_closed_form():
    x, y, g = _data(seed=1)
    z = torch.linspace(0, 4, 5, dtype=torch.float64)[:, None]
    gsp = GSP(make_kernel("rbf", 1), z, "affine", GaussianLikelihood(0.1), mc_samples=20,
              conditional_jitter=1e-4).double()
    _randomise_q(gsp.gp, g)
    with torch.no_grad():
        gsp.flow.raw.copy_(torch.tensor([0.4, 0.3]))  # raw (a, b): a constrained b far from 1, a real change of scale
        exact = gsp.affine_expected_elbo(x, y)
        gen = torch.Generator().manual_seed(2)
        draws = torch.stack([gsp.elbo(x, y, generator=gen) for _ in range(300)])
    se = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - exact) < 4 * se + 1e-8, (draws.mean(), exact, se)
    assert se > 0  # a non-identity flow leaves Monte Carlo noise: the agreement is not automatic


def test_sal_flow_is_trainable_and_predicts_like_svgp():
    x, y, _ = _data(n=20, seed=3)
    z = torch.linspace(0, 4, 6, dtype=torch.float64)[:, None]
    gsp = GSP(make_kernel("rbf", 1), z, "sal", GaussianLikelihood(0.05), mc_samples=4).double()
    init_random(gsp.flow, std=0.1, generator=torch.Generator().manual_seed(0))
    history = train(gsp, x, y, epochs=60, lr=0.02, verbose=False)
    assert all(math.isfinite(h) for h in history) and history[-1] < history[0]
    assert any(p.grad is not None for p in gsp.flow.parameters())
    mean, var = gsp.predict(x)
    svgp_mean, svgp_var = SVGP.predict(gsp, x)  # prediction follows the SVGP (appendix eq. 25)
    torch.testing.assert_close(mean, svgp_mean)
    assert torch.isfinite(gsp.log_predictive_density(x, y)).all()


def test_gsp_refuses_bad_input():
    kernel = make_kernel("rbf", 1)
    z = torch.zeros(3, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="real line onto the real line"):
        GSP(kernel, z, "softplus")
    with pytest.raises(ValueError, match="real line onto the real line"):
        GSP(kernel, z, "tanh")
    with pytest.raises(ValueError, match="unknown flow"):
        GSP(kernel, z, "nope")
    with pytest.raises(ValueError, match="single output"):
        GSP(kernel, z, "sal", num_outputs=2)
    gsp = GSP(kernel, z, "sal", max_points=10).double()
    x = torch.zeros(11, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="max_points"):
        gsp.elbo(x, torch.zeros(11, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="minibatch"):
        gsp.elbo(x[:5], torch.zeros(5, 1, dtype=torch.float64), num_data=100)
    big = GSP(kernel, z, "sal").double()
    with pytest.raises(ValueError, match="2000"):
        big.elbo(torch.zeros(2001, 1, dtype=torch.float64), torch.zeros(2001, 1, dtype=torch.float64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gsp_affine_closed_form_on_cuda():
    x, y, g = _data()
    z = torch.linspace(0, 4, 5, dtype=torch.float64)[:, None]
    gsp = GSP(make_kernel("rbf", 1), z, "affine", GaussianLikelihood(0.1)).double()
    _randomise_q(gsp.gp, g)
    cpu = gsp.affine_expected_elbo(x, y)
    gpu = gsp.cuda().affine_expected_elbo(x.cuda(), y.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu)
