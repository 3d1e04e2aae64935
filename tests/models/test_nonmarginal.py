"""Non-marginal flows and the Monte Carlo ELBO of TGP appendix A.2.6."""
import math

import pytest
import torch

from flowgp.flows import make_flow
from flowgp.training.initialisation import init_random
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import TGP, InducingModulatedFlow, MarginalFlowAdapter, NonMarginalTGP
from flowgp.training.loop import train


def _setup(n=15, m=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 4 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    y = torch.tanh(torch.sin(2 * x)) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    kernel = make_kernel("rbf", 1)
    z = torch.linspace(0, 4, m, dtype=torch.float64)[:, None]
    tgp = TGP(kernel, z, make_flow("sal"), GaussianLikelihood(0.1)).double()
    with torch.no_grad():
        tgp.gp.q_mu.copy_(torch.randn(1, m, generator=g, dtype=torch.float64))
        tgp.gp.q_sqrt.copy_(0.4 * torch.eye(m, dtype=torch.float64) + 0.1 * torch.randn(m, m, generator=g,
                                                                                           dtype=torch.float64).tril())
    init_random(tgp.flow, std=0.3, generator=g)
    return tgp, x, y


def _share(model, tgp):
    model.gp = tgp.gp
    model.likelihood = tgp.likelihood.base  # the TGP warps through its likelihood; share the base
    return model


def test_mc_path_with_a_marginal_flow_agrees_with_the_analytic_tgp_elbo():
    tgp, x, y = _setup()
    mc = _share(NonMarginalTGP(tgp.gp.kernel, tgp.gp.inducing_points.detach(), MarginalFlowAdapter(tgp.flow),
                               mc_samples=20).double(), tgp)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        analytic = tgp.elbo(x, y)
        draws = torch.stack([mc.expected_log_likelihood(x, y, generator=g).sum() - mc.gp.kl_divergence()
                             for _ in range(400)])
    se = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - analytic) < 4 * se, (draws.mean(), analytic, se)
    assert se < 0.05 * abs(analytic)  # the check is informative, not vacuous


def test_modulated_flow_with_zero_gains_is_its_base_flow_and_agrees_with_tgp():
    tgp, x, y = _setup(seed=2)
    flow = InducingModulatedFlow(tgp.flow, 1).double()
    mc = _share(NonMarginalTGP(tgp.gp.kernel, tgp.gp.inducing_points.detach(), flow, mc_samples=10).double(), tgp)
    with torch.no_grad():
        u, mean, _ = mc.conditional_draws(x, 3)
        f = torch.randn(3, x.shape[0], 1, dtype=torch.float64)
        torch.testing.assert_close(flow(f, u, mean, x), tgp.flow(f))
        g = torch.Generator().manual_seed(3)
        draws = torch.stack([mc.expected_log_likelihood(x, y, generator=g).sum() for _ in range(300)])
        analytic = tgp.expected_log_likelihood(x, y).sum()
    assert abs(draws.mean() - analytic) < 4 * draws.std() / math.sqrt(len(draws))


def test_conditional_draws_reproduce_the_marginals_of_q():
    # u₀ ~ q(u₀) then f₀,n | u₀: the mixture has exactly the mean and variance of q(f₀,n) (appendix eq. 17)
    tgp, x, _ = _setup(seed=4)
    mc = _share(NonMarginalTGP(tgp.gp.kernel, tgp.gp.inducing_points.detach()).double(), tgp)
    with torch.no_grad():
        _, cond_mean, cond_var = mc.conditional_draws(x, 200000, generator=torch.Generator().manual_seed(0))
        mean, var = tgp.gp.marginals(x)
    torch.testing.assert_close(cond_mean.mean(0), mean, rtol=0, atol=0.01)
    torch.testing.assert_close(cond_mean.var(0) + cond_var, var, rtol=0.02, atol=1e-3)


def test_modulated_flow_is_invertible_increasing_and_depends_on_u():
    tgp, x, _ = _setup(seed=5)
    flow = InducingModulatedFlow("sal", 1, shift_gain=0.7, log_scale_gain=-0.4).double()
    mc = NonMarginalTGP(tgp.gp.kernel, tgp.gp.inducing_points.detach(), flow).double()
    mc.gp = tgp.gp
    with torch.no_grad():
        u, mean, _ = mc.conditional_draws(x, 4)
        f = torch.randn(4, x.shape[0], 1, dtype=torch.float64)
        out = flow(f, u, mean, x)
        torch.testing.assert_close(flow.inverse(out, u, mean, x), f)
        assert torch.all(flow(f + 1e-3, u, mean, x) > out)
        # same f₀, different u₀ draws give different f_K: the flow is not marginal
        assert not torch.allclose(out[0], flow(f[:1], u[1:2], mean[1:2], x)[0])


def test_training_the_mc_elbo_moves_the_u_dependent_parameters():
    tgp, x, y = _setup(seed=6)
    flow = InducingModulatedFlow("sal", 1).double()
    model = NonMarginalTGP(make_kernel("rbf", 1), tgp.gp.inducing_points.detach(), flow,
                           GaussianLikelihood(0.1), mc_samples=4).double()
    history = train(model, x, y, epochs=40, lr=0.02, verbose=False)
    assert all(math.isfinite(h) for h in history)
    assert history[-1] < history[0]
    assert flow.shift_gain.abs().item() > 0 or flow.log_scale_gain.abs().item() > 0
    mean, var = model.predict(x)
    assert mean.shape == (x.shape[0], 1) and torch.all(var > 0)
    assert torch.isfinite(model.log_predictive_density(x, y)).all()
    assert model.sample_f(x, 3).shape == (3, x.shape[0], 1)


def test_nonmarginal_refuses_bad_input():
    kernel = make_kernel("rbf", 1)
    z = torch.zeros(3, 1, dtype=torch.float64)
    with pytest.raises(TypeError, match="NonMarginalFlow"):
        NonMarginalTGP(kernel, z, flow=3.0)
    with pytest.raises(ValueError, match="mc_samples"):
        NonMarginalTGP(kernel, z, mc_samples=0)
    with pytest.raises(ValueError, match="positive inputs"):
        InducingModulatedFlow("log")
    model = NonMarginalTGP(kernel, z).double()
    with pytest.raises(ValueError, match="full_cov"):
        model.sample_f(torch.zeros(2, 1, dtype=torch.float64), full_cov=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nonmarginal_elbo_runs_on_cuda():
    tgp, x, y = _setup()
    model = NonMarginalTGP(make_kernel("rbf", 1), tgp.gp.inducing_points.detach(), InducingModulatedFlow("sal", 1),
                           GaussianLikelihood(0.1)).double().cuda()
    assert torch.isfinite(model.elbo(x.cuda(), y.cuda()))
