import math

import pytest
import torch
from torch import nn

from flowgp.compat import SavedFileUpgradeWarning
from flowgp.flows import make_flow
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
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
        vals = tgp.likelihood.base.log_prob(y, tgp.flow(f))
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
        ystar = tgp.likelihood.base.sample(tgp.flow(f0), generator=g)
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


# ---------------------------------------------------------------- input-dependent / Bayesian flows
from flowgp.flows import InputDependentFlow, make_input_dependent  # noqa: E402
from flowgp.training.initialisation import init_random  # noqa: E402
from flowgp.numerics.quadrature import gh_points  # noqa: E402


def _id_tgp(bayesian="mc_dropout", dropout=0.25, seed=0, **tgp_kw):
    x, y, g = _data(seed=seed)
    flow = make_input_dependent(make_flow("sal"), 2, hidden=(5,), activation="tanh", dropout=dropout,
                                bayesian=bayesian)
    model = TGP(make_kernel("rbf", 2), x[:8].clone(), flow, GaussianLikelihood(0.1), **tgp_kw)
    _perturb(model, g)
    return model, x, y


def test_constant_network_tgp_equals_plain_tgp():
    _, plain, x, y = _pair("sal", closed_form_affine=False)
    init_random(plain.flow, std=0.3, generator=torch.Generator().manual_seed(2))
    plain_state = {k: v.clone() for k, v in plain.state_dict().items()}
    flow = make_input_dependent(plain.flow, 2, hidden=(4,), dropout=0.5)
    model = TGP(make_kernel("rbf", 2), x[:8].clone(), flow, GaussianLikelihood(0.1), mc_samples_train=3,
                mc_samples_predict=4)
    model.load_state_dict(plain_state, strict=False)  # GP, likelihood and the bases (shared with plain)
    flow.network.set_constant_(flow.raw_target())
    with torch.no_grad():
        for mode in (model.train, model.eval):
            mode()
            plain.eval()
            torch.testing.assert_close(model.expected_log_likelihood(x, y), plain.expected_log_likelihood(x, y))
        model.eval()
        penalty = flow.network.penalty()
        torch.testing.assert_close(model.elbo(x, y), plain.elbo(x, y) - penalty)
        for a, b in zip(model.predict(x), plain.predict(x)):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(model.log_predictive_density(x, y), plain.log_predictive_density(x, y))
        plain.predict_quadrature_points = 20  # mixture quantiles use 20 nodes per W draw
        torch.testing.assert_close(model.predict_quantiles(x, [0.1, 0.9]), plain.predict_quantiles(x, [0.1, 0.9]))


def test_mc_dropout_with_zero_dropout_equals_point_estimate():
    model, x, y = _id_tgp("mc_dropout", dropout=0.0, mc_samples_predict=7)
    model.eval()
    with torch.no_grad():
        ba = (model.predict(x), model.log_predictive_density(x, y), model.elbo(x, y))
        for stage in [m for m in model.flow.modules() if isinstance(m, InputDependentFlow)]:
            stage.network.bayesian = "point"
        pe = (model.predict(x), model.log_predictive_density(x, y), model.elbo(x, y))
    for a, b in zip(ba[0], pe[0]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ba[1], pe[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ba[2], pe[2], rtol=1e-12, atol=1e-12)
    # With dropout the two predictions differ (MC mixture vs one deterministic pass).
    model2, x, y = _id_tgp("mc_dropout", dropout=0.5, mc_samples_predict=7)
    model2.eval()
    with torch.no_grad():
        lpd_ba = model2.log_predictive_density(x, y)
        model2.flow.network.bayesian = "point"
        assert not torch.allclose(lpd_ba, model2.log_predictive_density(x, y))


def test_bayesian_prediction_is_the_eq20_mixture():
    """Fixed network draws: predictions equal the average over plain TGPs, one per draw (appendix eq. 20)."""
    model, x, y = _id_tgp("vb", dropout=0.0, mc_samples_predict=3)
    model.eval()
    stage = model.flow
    draws = torch.randn(3, stage.num_raw, generator=torch.Generator().manual_seed(5))
    stage.network.forward = lambda xx, num_samples=1, sample=True, generator=None, **kw: draws[:, None, :].expand(
        3, xx.shape[0], -1)
    with torch.no_grad():
        mean, var = model.predict(x)
        lpd = model.log_predictive_density(x, y)
        per_draw = []
        for s in range(3):
            plain = TGP(make_kernel("rbf", 2), x[:8].clone(), make_flow("sal"), GaussianLikelihood(0.1),
                        closed_form_affine=False)
            plain.load_state_dict({k: v for k, v in model.state_dict().items() if "network" not in k},
                                  strict=False)
            plain.flow.raw.copy_(model.flow.base.raw)  # the shared affine map (c, d)
            plain.flow.raw_parameter("a").copy_(draws[s, 0])  # the network gives the SAL's (a, b)
            plain.flow.raw_parameter("b").copy_(draws[s, 1])
            f, w = gh_points(*plain.gp.marginals(x), 20)  # quantiles use 20 nodes per W draw
            per_draw.append((plain.predict(x), plain.log_predictive_density(x, y), plain.flow(f), w))
    m = torch.stack([p[0][0] for p in per_draw])
    v = torch.stack([p[0][1] for p in per_draw])
    torch.testing.assert_close(mean, m.mean(0))
    torch.testing.assert_close(var, (v + m.square()).mean(0) - m.mean(0).square())
    lp = torch.stack([p[1] for p in per_draw])
    torch.testing.assert_close(lpd, torch.logsumexp(lp, 0) - math.log(3))
    with torch.no_grad():
        q = model.predict_quantiles(x, [0.3])[0]
    noise_sd = model.likelihood.base.noise.sqrt()
    cdf = torch.stack([(w * torch.special.ndtr((q - g) / noise_sd)).sum(0) for _, _, g, w in per_draw]).mean(0)
    torch.testing.assert_close(cdf, torch.full_like(cdf, 0.3), rtol=0, atol=1e-8)


def test_input_dependent_ell_is_one_batched_pass():
    """S weight draws x Q nodes x N points in one network call (no loop over points or samples)."""
    model, x, y = _id_tgp("mc_dropout", mc_samples_train=4, quadrature_points=7)
    calls = []
    model.flow.network.register_forward_hook(lambda mod, inp, out: calls.append(tuple(out.shape)))
    model.train()
    ell = model.expected_log_likelihood(x, y)
    assert ell.shape == (30, 1)
    assert calls == [(4, 30, 2)]
    # Deterministic path: the batched ELL equals the per-point ELL.
    model.flow.network.bayesian = "point"
    model.eval()
    with torch.no_grad():
        full = model.expected_log_likelihood(x, y)
        single = torch.cat([model.expected_log_likelihood(x[i:i + 1], y[i:i + 1]) for i in range(5)])
    torch.testing.assert_close(full[:5], single)


def test_input_dependent_ell_gradcheck_float64():
    """gradcheck of the VB ELL (S = 2 reparameterised draws, quadrature) w.r.t. q_mu and q(W)'s parameters."""
    model, x, y = _id_tgp("vb", dropout=0.0, mc_samples_train=2, quadrature_points=5)
    x, y = x[:6], y[:6]
    model.train()
    names = ["gp.q_mu", "likelihood.flow.network.weights.0",
             "likelihood.flow.network.weight_raw_std.1", "likelihood.flow.network.biases.1"]
    params = dict(model.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)

    class Wrapper(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, xx, yy):
            return self.m.expected_log_likelihood(xx, yy)

    wrapper = Wrapper(model)

    def ell(*values):
        torch.manual_seed(11)  # the same W draws at every evaluation
        return torch.func.functional_call(wrapper, {"m." + n: v for n, v in zip(names, values)}, (x, y))
    assert torch.autograd.gradcheck(ell, inputs, atol=1e-6)


def test_elbo_subtracts_the_network_penalty():
    for bayesian, dropout in (("point", 0.25), ("vb", 0.0)):
        model, x, y = _id_tgp(bayesian, dropout=dropout)
        model.flow.network.bayesian = bayesian
        model.eval()
        with torch.no_grad():
            torch.manual_seed(0)
            value = model.elbo(x, y, num_data=90)
            torch.manual_seed(0)
            ell = model.expected_log_likelihood(x, y).sum() * 3
            expected = ell - model.gp.kl_divergence() - model.flow.network.penalty()
        torch.testing.assert_close(value, expected)
        assert model.flow_penalty() > 0


def test_input_dependent_tgp_options_are_checked():
    x, y, _ = _data()
    flow = make_input_dependent(make_flow("sal"), 2)
    with pytest.raises(ValueError, match="mc_samples_train must be a positive integer"):
        TGP(make_kernel("rbf", 2), x[:8], flow, mc_samples_train=0)
    with pytest.raises(ValueError, match="mc_samples_predict must be a positive integer"):
        TGP(make_kernel("rbf", 2), x[:8], flow, mc_samples_predict=2.5)
    model = TGP(make_kernel("rbf", 2), x[:8], flow)
    model.eval()
    with pytest.raises(NotImplementedError, match="mixture over W"):
        model.predict_latent_quantiles(x, [0.5])
    assert model.sample_f(x, 3).shape == (3, 30, 1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bayesian,dropout", [("mc_dropout", 0.25), ("vb", 0.0)])
def test_input_dependent_tgp_runs_on_cuda(bayesian, dropout):
    model, x, y = _id_tgp(bayesian, dropout=dropout, mc_samples_train=2, mc_samples_predict=5)
    cpu_state = {k: v.clone() for k, v in model.state_dict().items()}
    model = model.to("cuda")
    x, y = x.cuda(), y.cuda()
    model.train()
    loss = -model.elbo(x, y)
    loss.backward()
    assert torch.isfinite(loss) and model.gp.q_mu.grad.device.type == "cuda"
    model.eval()
    with torch.no_grad():
        mean, var = model.predict(x)
        lpd = model.log_predictive_density(x, y)
    assert mean.device.type == "cuda" and bool(torch.all(var > 0)) and bool(torch.all(torch.isfinite(lpd)))
    # Deterministic (PE) prediction agrees with the CPU model.
    if bayesian == "mc_dropout":
        model.flow.network.bayesian = "point"
        cpu_model, _, _ = _id_tgp(bayesian, dropout=dropout)
        cpu_model.load_state_dict(cpu_state)
        cpu_model.flow.network.bayesian = "point"
        cpu_model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model.predict(x)[0].cpu(), cpu_model.predict(x.cpu())[0])


# ---------------------------------------------------------------- TGP = SVGP + WarpedLikelihood
from flowgp.numerics.constraints import Positive  # noqa: E402
from flowgp.flows import Flow, ParamSpec  # noqa: E402
from flowgp.gp.likelihoods import WarpedLikelihood  # noqa: E402
from flowgp.training.loop import train  # noqa: E402


class _UserFlow(Flow):
    """A flow class written outside flowgp: G(f) = s + f + c f³, c > 0 (strictly increasing)."""

    name = "user_cubic"
    param_specs = (ParamSpec("c", Positive(), 0.05), ParamSpec("s", None, 0.0))

    def _forward(self, f, p):
        return p["s"] + f + p["c"] * f ** 3

    def _log_det(self, f, p):
        return torch.log1p(3.0 * p["c"] * f.square())


def test_tgp_is_svgp_with_a_warped_likelihood():
    svgp, tgp, x, y = _pair("sal+softplus", closed_form_affine=False)
    assert isinstance(tgp.likelihood, WarpedLikelihood) and tgp.flow is tgp.likelihood.flow
    plain = SVGP(make_kernel("rbf", 2), x[:8].clone(), WarpedLikelihood(tgp.flow, GaussianLikelihood(0.1)))
    plain.load_state_dict(tgp.state_dict())
    xs = x[:6]
    with torch.no_grad():
        torch.testing.assert_close(plain.elbo(x, y), tgp.elbo(x, y), rtol=1e-12, atol=0)
        for a, b in zip(plain.predict(xs), tgp.predict(xs)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
        torch.testing.assert_close(plain.predict_quantiles(xs, [0.2]), tgp.predict_quantiles(xs, [0.2]))
    # a state dict of the pre-WarpedLikelihood layout ("flow.*", "likelihood.raw_noise") still loads
    legacy = {("flow." + k[len("likelihood.flow."):] if k.startswith("likelihood.flow.") else
               "likelihood.raw_noise" if k == "likelihood.base.raw_noise" else k): v.clone() + 0.01
              for k, v in tgp.state_dict().items()}
    fresh = TGP(make_kernel("rbf", 2), x[:8].clone(), make_flow("sal+softplus"), GaussianLikelihood(0.1))
    with pytest.warns(SavedFileUpgradeWarning, match="flow outside the likelihood"):
        fresh.load_state_dict(legacy)  # strict: every key finds its new place
    torch.testing.assert_close(fresh.likelihood.base.raw_noise, legacy["likelihood.raw_noise"])


def test_user_flow_class_trains_and_predicts_in_tgp():
    x, y, _ = _data(n=40)
    model = TGP(make_kernel("rbf", 2), x[:8].clone(), _UserFlow(), GaussianLikelihood(0.2))
    start = {k: v.clone() for k, v in model.likelihood.flow.state_dict().items()}
    history = train(model, x, y, epochs=30, lr=0.02, verbose=False)
    assert history[-1] < history[0]
    assert any(not torch.equal(start[k], v) for k, v in model.flow.state_dict().items())  # the flow learned
    with torch.no_grad():
        mean, var = model.predict(x[:5])
        q = model.predict_quantiles(x[:5], [0.05, 0.95])
        lpd = model.log_predictive_density(x[:5], y[:5])
    assert bool(torch.all(var > 0)) and bool(torch.all(torch.isfinite(lpd)))
    assert bool(torch.all(q[0] < mean)) and bool(torch.all(mean < q[1]))
    assert model.sample_f(x[:5], 2).shape == (2, 5, 1)


def test_every_elbo_takes_a_generator_and_the_bound_is_minibatch_bound():
    svgp, tgp, x, y = _pair("sal")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model in (svgp, tgp):
            full = model.elbo(x, y, generator=g)
            ell = model.expected_log_likelihood(x, y).sum()
            torch.testing.assert_close(model.elbo(x[:10], y[:10], num_data=30, generator=g),
                                       model.expected_log_likelihood(x[:10], y[:10]).sum() * 3
                                       - model.gp.kl_divergence())
            torch.testing.assert_close(full, ell - model.gp.kl_divergence())
    assert svgp.validate(x) is x
