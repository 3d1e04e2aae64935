import math

import pytest
import torch
from torch import nn

from flowgp.flows import make_flow
from flowgp.kernels import make_kernel
from flowgp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP, TGP, WarpedGP

pytestmark = pytest.mark.usefixtures("float64_default")


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, :1]) + 0.3 * x[:, 1:] + 0.1 * torch.randn(n, 1, generator=g)
    return x, y, g


def _perturb(model, g):
    """Move every parameter away from its initial value so identities are tested at generic points."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("q_sqrt"):
                p.copy_(torch.tril(0.2 * torch.randn(p.shape, generator=g)))
                p.diagonal(dim1=-2, dim2=-1).abs_().add_(0.1)
            elif not name.endswith("inducing_points"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def _pair(flow="identity", seed=0, **tgp_kw):
    x, y, g = _data(seed=seed)
    z = x[:8].clone()
    svgp = SVGP(make_kernel("rbf", 2), z, GaussianLikelihood(0.1))
    _perturb(svgp, g)
    tgp = TGP(make_kernel("rbf", 2), z, make_flow(flow), GaussianLikelihood(0.1), **tgp_kw)
    tgp.load_state_dict(svgp.state_dict(), strict=False)
    return svgp, tgp, x, y


@pytest.mark.parametrize("closed_form", [True, False])
def test_tgp_with_identity_flow_reproduces_svgp(closed_form):
    svgp, tgp, x, y = _pair(closed_form_affine=closed_form)
    xs = torch.linspace(-3, 3, 17)[:, None].repeat(1, 2)
    ys = torch.cos(xs[:, :1])
    with torch.no_grad():
        torch.testing.assert_close(tgp.elbo(x, y), svgp.elbo(x, y), rtol=1e-8, atol=0)
        for a, b in zip(tgp.predict(xs), svgp.predict(xs)):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
        lpd_tol = 1e-8 if closed_form else 1e-4  # quadrature of a Gaussian density is not exact
        torch.testing.assert_close(tgp.log_predictive_density(xs, ys), svgp.log_predictive_density(xs, ys),
                                   rtol=lpd_tol, atol=lpd_tol)
        q_t = tgp.predict_quantiles(xs, [0.025, 0.5, 0.975])
        q_s = svgp.predict_quantiles(xs, [0.025, 0.5, 0.975])
        torch.testing.assert_close(q_t, q_s, rtol=1e-6 if closed_form else 1e-4, atol=1e-6 if closed_form else 1e-4)


def test_affine_flow_closed_form_equals_quadrature():
    _, tgp_q, x, y = _pair("affine", closed_form_affine=False)
    _, tgp_c, _, _ = _pair("affine", closed_form_affine=True)
    with torch.no_grad():
        for t in (tgp_q, tgp_c):
            t.flow.load_state_dict({k: v + 0.4 for k, v in t.flow.state_dict().items()})
        torch.testing.assert_close(tgp_q.elbo(x, y), tgp_c.elbo(x, y), rtol=1e-10, atol=0)
        for a, b in zip(tgp_q.predict(x), tgp_c.predict(x)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_svgp_with_inducing_at_data_and_optimal_q_equals_exact_gp():
    x, y, _ = _data(n=25)
    noise = 0.05
    model = SVGP(make_kernel("rbf", 2, lengthscale=0.9), x, GaussianLikelihood(noise), jitter=1e-10)
    kernel = model.gp.kernel
    with torch.no_grad():
        kxx = kernel(x)
        lz = torch.linalg.cholesky(kxx + 1e-10 * torch.eye(25))
        # optimal whitened q(v): posterior of v ~ N(0, I) with y = Lz v + ε
        precision = torch.eye(25) + lz.T @ lz / noise
        s = torch.linalg.inv(precision)
        m = s @ lz.T @ y[:, 0] / noise
        model.gp.q_mu.copy_(m[None])
        model.gp.q_sqrt.copy_(torch.linalg.cholesky(s)[None])
        exact = torch.distributions.MultivariateNormal(torch.zeros(25), kxx + noise * torch.eye(25)).log_prob(y[:, 0])
        elbo = model.elbo(x, y)
    torch.testing.assert_close(elbo, exact, rtol=1e-6, atol=1e-6)
    # and the predictive mean equals the exact GP posterior mean
    xs = torch.randn(6, 2)
    with torch.no_grad():
        exact_mean = kernel(xs, x) @ torch.linalg.solve(kxx + noise * torch.eye(25), y)
        torch.testing.assert_close(model.predict(xs)[0], exact_mean, rtol=1e-5, atol=1e-6)


def test_minibatch_elbo_is_unbiased_for_full_batch():
    svgp, _, x, y = _pair()
    with torch.no_grad():
        full = svgp.elbo(x, y)
        parts = [svgp.elbo(x[i:i + 5], y[i:i + 5], num_data=30) for i in range(0, 30, 5)]
    # averaging the N/B-scaled ELL over a partition recovers the full ELL (the KL appears once per call)
    kl = svgp.gp.kl_divergence()
    torch.testing.assert_close(sum(p + kl for p in parts) / 6 - kl, full)


class _ElboOf(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return self.model.elbo(x, y)


@pytest.mark.parametrize("flow", ["identity", "sal+softplus", "tanh"])
def test_elbo_gradcheck(flow):
    x, y, g = _data(n=6)
    model = TGP(make_kernel("rbf", 2), x[:3].clone(), make_flow(flow), GaussianLikelihood(0.2),
                quadrature_points=7, closed_form_affine=False)
    _perturb(model, g)
    wrapper = _ElboOf(model)
    names = [n for n, _ in wrapper.named_parameters()]
    values = tuple(p.detach().clone().requires_grad_(True) for _, p in wrapper.named_parameters())

    def f(*ps):
        return torch.func.functional_call(wrapper, dict(zip(names, ps)), (x, y))

    assert torch.autograd.gradcheck(f, values, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_tgp_expected_log_likelihood_agrees_with_monte_carlo():
    _, tgp, x, y = _pair("sal+softplus")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        tgp.flow.load_state_dict({k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in tgp.flow.state_dict().items()})
        quad = tgp.expected_log_likelihood(x, y)
        mean, var = tgp.gp.marginals(x)
        f = mean + var.sqrt() * torch.randn((200_000,) + mean.shape, generator=g)
        vals = tgp.likelihood.log_prob(y, tgp.flow(f))
        mc, se = vals.mean(0), vals.std(0) / math.sqrt(200_000)
    assert torch.all((quad - mc).abs() < 5 * se + 1e-8)


def test_tgp_predictions_agree_with_sampling():
    _, tgp, x, _ = _pair("sal+softplus")
    g = torch.Generator().manual_seed(6)
    xs = x[:5]
    with torch.no_grad():
        mean, var = tgp.predict(xs)
        q = tgp.predict_quantiles(xs, [0.05, 0.5, 0.95])
        f0 = tgp.gp.sample(xs, 200_000, generator=g)
        ystar = tgp.likelihood.sample(tgp.flow(f0), generator=g)
    torch.testing.assert_close(mean, ystar.mean(0), rtol=0, atol=5 * (var / 200_000).sqrt().max().item())
    torch.testing.assert_close(var, ystar.var(0), rtol=0.02, atol=1e-4)
    emp = torch.quantile(ystar[:, :, 0], torch.tensor([0.05, 0.5, 0.95]), dim=0)
    torch.testing.assert_close(q[..., 0], emp, rtol=0, atol=0.02)
    lq = tgp.predict_latent_quantiles(xs, [0.5])
    torch.testing.assert_close(lq[0], tgp.flow(tgp.gp.marginals(xs).mean))


def test_tgp_rejects_positive_domain_flow_and_bad_inputs():
    x, y, _ = _data()
    with pytest.raises(ValueError, match="positive"):
        TGP(make_kernel("rbf", 2), x[:4], "log")
    with pytest.raises(ValueError, match="nope|valid"):
        TGP(make_kernel("rbf", 2), x[:4], "nope")
    model = SVGP(make_kernel("rbf", 2), x[:4])
    bad = x.clone()
    bad[3, 1] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        model.elbo(bad, y)
    with pytest.raises(ValueError, match="shape"):
        model.elbo(x, y[:-1])
    with pytest.raises(ValueError, match="features"):
        model.predict(x[:, :1])
    with pytest.raises(TypeError, match="torch.Tensor"):
        model.elbo(x.numpy(), y)


def test_warped_gp_with_log_flow_is_svgp_on_log_targets():
    x, y, g = _data()
    y_pos = torch.exp(y)
    z = x[:8].clone()
    svgp = SVGP(make_kernel("rbf", 2), z, GaussianLikelihood(0.1))
    _perturb(svgp, g)
    wgp = WarpedGP(make_kernel("rbf", 2), z, "log", GaussianLikelihood(0.1))
    wgp.load_state_dict(svgp.state_dict(), strict=False)
    with torch.no_grad():
        # L̄ = L(T(Y)) + log J_Y with T = log: log J_Y = -Σ log y
        torch.testing.assert_close(wgp.elbo(x, y_pos), svgp.elbo(x, y) - y.sum())
        torch.testing.assert_close(wgp.log_predictive_density(x, y_pos), svgp.log_predictive_density(x, y) - y)
        q = wgp.predict_quantiles(x, [0.025, 0.975])
        torch.testing.assert_close(q, torch.exp(svgp.predict_quantiles(x, [0.025, 0.975])))
        mean, var = wgp.predict(x)
        m, v = svgp.predict(x)
        torch.testing.assert_close(mean, torch.exp(m + v / 2), rtol=1e-8, atol=0)  # log-normal mean
        torch.testing.assert_close(wgp.predict_median(x), torch.exp(m))
    with pytest.raises(ValueError, match="positive|> 0"):
        wgp.elbo(x, y - 10)
