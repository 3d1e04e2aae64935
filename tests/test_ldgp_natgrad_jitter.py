"""benchmarks/ldgp_natgrad_jitter.py: the scalar recursion of GPflow 1's jittered natural-gradient step."""
import numpy as np
import pytest
import torch

from flowgp.training.natural_gradients import natural_gradient_step


@pytest.fixture(scope="module")
def probe(benchmark_script):
    return benchmark_script("ldgp_natgrad_jitter")


def test_recursion_follows_flowgps_natural_gradient_step_with_the_jitter_added(probe):
    """On a conjugate bound, ℒ(m, S) = -KL(N(m, S) || N(m*, S*)) with diagonal S*, iterating
    `natural_gradient_step` and then taking chol(S + εI) as GPflow 1 does gives the recursion's s and m/m*."""
    s_star = torch.tensor([7e-6, 1e-3, 0.3], dtype=torch.float64)
    m_star = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    m = torch.zeros(1, 3, dtype=torch.float64)
    r = torch.eye(3, dtype=torch.float64).unsqueeze(0)
    gamma, eps, steps = 0.05, 1e-6, 200
    for _ in range(steps):
        m_ = m.clone().requires_grad_(True)
        r_ = r.clone().requires_grad_(True)
        cov = r_.tril() @ r_.tril().mT
        diff = m_ - m_star
        # loss = KL(q || N(m*, S*)) up to a constant
        loss = 0.5 * ((torch.diagonal(cov, dim1=-2, dim2=-1) / s_star).sum() + (diff * diff / s_star).sum()
                      - torch.logdet(cov[0]))
        grad_m, grad_r = torch.autograd.grad(loss, (m_, r_))
        m, r, used = natural_gradient_step(m, r, grad_m, grad_r, gamma)
        assert used == gamma
        r = torch.linalg.cholesky(r @ r.mT + eps * torch.eye(3, dtype=torch.float64))
    s_ref, ratio_ref = probe.jittered_natgrad(s_star.numpy(), steps, gamma=gamma, decay=1.0, jitter=eps)
    np.testing.assert_allclose(torch.diagonal(r @ r.mT, dim1=-2, dim2=-1)[0].numpy(), s_ref, rtol=1e-6)
    np.testing.assert_allclose(m[0].numpy(), ratio_ref * m_star.numpy(), rtol=1e-6, atol=1e-12)


def test_constant_step_reaches_the_closed_form_fixed_point_and_no_jitter_reaches_the_optimum(probe):
    s_star = np.array([7e-6, 1e-4, 5e-3, 0.5])
    s, ratio = probe.jittered_natgrad(s_star, 4000, gamma=0.01, decay=1.0)
    np.testing.assert_allclose(s, probe.fixed_point(s_star, 0.01), rtol=1e-6)
    np.testing.assert_allclose(ratio, 1.0, atol=0.02)  # the mean stays at m* (module docstring)
    s0, ratio0 = probe.jittered_natgrad(s_star, 4000, gamma=0.01, decay=1.0, jitter=0.0)
    np.testing.assert_allclose(s0, s_star, rtol=1e-9)
    np.testing.assert_allclose(ratio0, 1.0, rtol=1e-9)
    # annealing γ lets the small eigenvalues grow: the reason this probe exists
    late, _ = probe.jittered_natgrad(s_star[:1], 300016)
    assert late[0] > 50 * s_star[0]


def test_jittered_state_moves_only_the_last_layers_q_u(probe):
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(1, 4, 4, dtype=torch.float64, generator=gen).tril() * 0.01 + 0.001 * torch.eye(4, dtype=torch.float64)
    state = {"layers.1.gp.q_sqrt": r, "layers.1.gp.q_mu": torch.randn(1, 4, dtype=torch.float64, generator=gen),
             "likelihood.raw_noise": torch.tensor(0.3)}
    new, growth = probe.jittered_state(state, 300016)
    assert new["likelihood.raw_noise"] is state["likelihood.raw_noise"]
    old_eig = torch.linalg.eigvalsh(r @ r.mT)
    new_eig = torch.linalg.eigvalsh(new["layers.1.gp.q_sqrt"] @ new["layers.1.gp.q_sqrt"].mT)
    np.testing.assert_allclose(np.sort(new_eig.flatten().numpy()), np.sort((old_eig.flatten().numpy() * growth)),
                               rtol=1e-6)
    assert growth.min() > 1.0
    with pytest.raises(ValueError, match="s_star must be positive"):
        probe.jittered_natgrad([0.0], 1)
