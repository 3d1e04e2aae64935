"""Normalizing-flow posteriors over deep-GP inducing outputs (flowgp.models.cnf_posterior, CNF-DGP §III)."""
import math

import pytest
import torch

from flowgp.models.cnf_posterior import ConvolutionalFlowPosterior, LayerwiseFlowPosterior, LULinear, _FlowSteps
from flowgp.models.deep_gp import DeepGP, GPLayer, build_deep_gp


def _toy(n=30, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def _perturb(module, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _mvn_log_prob(u, mean, cov):
    """Sum over the leading M axis of log N(u_m; mean_m, cov_m); u [S, M, K]."""
    chol = torch.linalg.cholesky(cov)
    diff = (u - mean).unsqueeze(-1)
    sol = torch.linalg.solve_triangular(chol, diff, upper=False).squeeze(-1)
    logdet = 2 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
    k = u.shape[-1]
    return (-0.5 * (sol.square().sum(-1) + logdet + k * math.log(2 * math.pi))).sum(-1)


def test_conv_log_det_matches_dense_jacobian(float64_default):
    conv = LULinear(3, init="orthogonal", generator=torch.Generator().manual_seed(1))
    _perturb(conv)
    m = 4
    v = torch.randn(m, 3)
    jac = torch.autograd.functional.jacobian(lambda t: conv(t.reshape(1, m, 3))[0].reshape(-1), v.reshape(-1))
    sign, logabs = torch.linalg.slogdet(jac)  # dense (M·K) x (M·K) Jacobian
    _, logdet = conv(v.unsqueeze(0))
    torch.testing.assert_close(logdet, logabs)
    torch.testing.assert_close(logdet, m * torch.linalg.slogdet(conv.weight())[1])  # eq. 8: M log|det W|


def test_flow_steps_log_det_matches_dense_jacobian_and_invert(float64_default):
    steps = _FlowSteps(3, num_steps=2, nonlinear=True, init="orthogonal", generator=torch.Generator().manual_seed(2))
    _perturb(steps, 0.2, seed=3)
    m = 3
    v = torch.randn(1, m, 3)
    jac = torch.autograd.functional.jacobian(lambda t: steps(t.reshape(1, m, 3))[0].reshape(-1), v.reshape(-1))
    _, logdet = steps(v)
    torch.testing.assert_close(logdet[0], torch.linalg.slogdet(jac)[1])
    u, _ = steps(v)
    torch.testing.assert_close(steps.inverse(u), v)


def test_lu_linear_identity_init_and_gradcheck(float64_default):
    lin = LULinear(4)
    torch.testing.assert_close(lin.weight(), torch.eye(4))
    assert lin.log_abs_det() == 0
    _perturb(lin)
    v = torch.randn(2, 5, 4, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, lo, up, s: _apply(lin, t, lo, up, s),
                                    (v, lin.lower, lin.upper, lin.log_s))


def _apply(lin, v, lower, upper, log_s):
    out, logdet = lin(v)
    return out, logdet


def _one_layer(posterior_kwargs, d_out=2, m=5, noise=0.1):
    x, y = _toy()
    y = torch.cat([y, -y], 1)[:, :d_out]
    z = x[:m].clone()
    layer = GPLayer(z, d_out, lengthscale=0.9)
    post = ConvolutionalFlowPosterior([layer], **posterior_kwargs)
    from flowgp.gp.likelihoods import GaussianLikelihood

    model = DeepGP([layer], GaussianLikelihood(noise=noise, num_outputs=d_out), posterior=post)
    return model, x, y


def test_identity_flow_equals_gaussian_posterior_and_mc_elbo_is_unbiased(float64_default):
    """W = I and no element-wise steps: q(V) is the base N(μ, diag σ²), so the MC ELBO averages to the
    closed-form ELBO of the Gaussian posterior with q_mu = μ, q_sqrt = diag σ (CNF-DGP eq. 6 vs eq. 3)."""
    model, x, y = _one_layer(dict(num_steps=1, nonlinear=False))
    post = model.posterior
    _perturb(post.nets, 0.3, seed=4)  # non-trivial base mean and scale from φ(Z)
    with torch.no_grad():
        post.nets[0].bias[2:] += 0.5
    layer = model.layers[0]
    mean, scale = post.base([layer.gp.inducing_points])  # [M, d]
    gauss_layer = GPLayer(layer.gp.inducing_points.detach(), 2, lengthscale=0.9)
    with torch.no_grad():
        gauss_layer.gp.q_mu.copy_(mean.mT)
        gauss_layer.gp.q_sqrt.copy_(torch.diag_embed(scale.mT))
    gauss = DeepGP([gauss_layer], model.likelihood)
    exact = gauss.elbo(x, y)

    # the flow's density is the base density exactly
    g = torch.Generator().manual_seed(0)
    vs, log_q = post.sample(4000, [layer.gp.inducing_points], generator=g)
    base = torch.distributions.Normal(mean.mT, scale.mT)
    torch.testing.assert_close(log_q, base.log_prob(vs[0]).sum((-2, -1)))
    # per-sample MC ELBO terms: ELL given v minus log q(v) - log p(v)
    _, m_, v_ = model.propagate(x, 4000, g, vs)[-1]
    ell = model.expected_log_likelihood(y, m_, v_)
    log_p = (-0.5 * (vs[0].square() + math.log(2 * math.pi))).sum((-2, -1))
    est = ell - (log_q - log_p)
    se = est.std() / math.sqrt(len(est))
    assert abs(est.mean() - exact) < 4 * se, (est.mean().item(), exact.item(), se.item())
    assert se < 0.05 * abs(exact)  # the test has power: the standard error is small
    # and the model's own ELBO estimator agrees in expectation too
    many = torch.stack([model.elbo(x, y, num_samples=200, generator=torch.Generator().manual_seed(k))
                        for k in range(5)])
    assert abs(many.mean() - exact) < 6 * se * math.sqrt(4000 / 1000)


def test_linear_flow_density_is_the_gaussian_pushforward(float64_default):
    """Non-identity W without element-wise steps: u_m = W v_m, so q(u_m) = N(W μ_m, W diag σ²_m Wᵀ)."""
    model, _, _ = _one_layer(dict(num_steps=2, nonlinear=False, w_init="orthogonal",
                                  generator=torch.Generator().manual_seed(3)), d_out=3)
    post = model.posterior
    _perturb(post.flow, 0.2, seed=5)
    _perturb(post.nets, 0.3, seed=6)
    z = [model.layers[0].gp.inducing_points]
    vs, log_q = post.sample(50, z, generator=torch.Generator().manual_seed(1))
    w = post.flow.linear[1].weight() @ post.flow.linear[0].weight()
    mean, scale = post.base(z)  # [M, K]
    cov = w @ torch.diag_embed(scale.square()) @ w.mT  # [M, K, K]
    u = vs[0].mT  # [S, M, K]
    torch.testing.assert_close(log_q, _mvn_log_prob(u, mean @ w.mT, cov))
    torch.testing.assert_close(post.log_prob(vs, z), log_q)


def test_nonlinear_flow_log_prob_matches_sample_and_gradients_flow(float64_default):
    x, y = _toy()
    model = build_deep_gp(x, 1, 3, num_inducing=6, hidden_width=2, posterior="cnf-paper", kmeans_restarts=1)
    post = model.posterior
    assert sum(post.dims) == 2 + 2 + 1
    _perturb(post.flow, 0.1, seed=7)
    z = [l.gp.inducing_points for l in model.layers]
    vs, log_q = post.sample(7, z, generator=torch.Generator().manual_seed(2))
    assert [v.shape for v in vs] == [(7, 2, 6), (7, 2, 6), (7, 1, 6)]
    torch.testing.assert_close(post.log_prob(vs, z), log_q)
    elbo = model.elbo(x, y, num_samples=2)
    elbo.backward()
    assert torch.isfinite(elbo)
    assert post.flow.linear[0].lower.grad.abs().sum() > 0
    assert post.flow.elementwise[0].raw.grad[1].abs().sum() > 0  # row 1: the sinh-arcsinh's b
    assert all(net.hidden.weight.grad.abs().sum() > 0 for net in post.nets)
    assert all(l.gp.q_mu.grad is None for l in model.layers)  # the Gaussian q is unused and frozen
    assert model.layers[0].gp.kernel.kernels[0].raw_variance.grad is not None


def test_layerwise_flow_log_det_and_shapes(float64_default):
    x, y = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=3, hidden_width=2, posterior="flow-layerwise", kmeans_restarts=1)
    post = model.posterior
    assert isinstance(post, LayerwiseFlowPosterior)
    assert post.flows[0].linear[0].dim == 3 * 2  # R^{M d_ℓ} -> R^{M d_ℓ}
    _perturb(post, 0.1, seed=8)
    vs, log_q = post.sample(5, generator=torch.Generator().manual_seed(3))
    assert [v.shape for v in vs] == [(5, 2, 3), (5, 1, 3)] and log_q.shape == (5,)
    flow = post.flows[0]
    v = torch.randn(1, 6)
    jac = torch.autograd.functional.jacobian(lambda t: flow(t.reshape(1, 6))[0].reshape(-1), v.reshape(-1))
    torch.testing.assert_close(flow(v)[1][0], torch.linalg.slogdet(jac)[1])
    assert torch.isfinite(model.elbo(x, y, num_samples=2))


def test_predictions_with_flow_posterior(float64_default):
    x, y = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=4, posterior="cnf", kmeans_restarts=1)
    mean, var = model.predict(x[:5], num_samples=9)
    assert mean.shape == var.shape == (5, 1) and (var > 0).all()
    assert model.log_predictive_density(x[:5], y[:5], num_samples=9).shape == (5, 1)


def test_bad_input_is_refused(float64_default):
    x, _ = _toy()
    a = GPLayer(x[:4].clone(), 2)
    b = GPLayer(torch.randn(5, 2), 1)
    with pytest.raises(ValueError, match="same M"):
        ConvolutionalFlowPosterior([a, b])
    per_output = GPLayer(torch.randn(2, 4, 2), 2)
    with pytest.raises(ValueError, match="shared"):
        ConvolutionalFlowPosterior([per_output])
    with pytest.raises(ValueError, match="init"):
        LULinear(3, init="random")
    with pytest.raises(ValueError, match="num_steps"):
        ConvolutionalFlowPosterior([a], num_steps=0)
    with pytest.raises(ValueError, match="scale_init"):
        LayerwiseFlowPosterior([a], scale_init=0.0)
    post = ConvolutionalFlowPosterior([a])
    with pytest.raises(ValueError, match="inducing-input"):
        post.sample(2, [])


def test_free_base_ablation_samples_from_its_own_parameters(float64_default):
    """base="free": π(V) = N(μ, diag σ²) with μ, σ free [M, Σd] parameters (no φ(Z)); W = I without element-wise
    steps leaves log q equal to the base density, and μ, σ get gradients from the MC ELBO."""
    model, x, y = _one_layer(dict(num_steps=1, nonlinear=False, base="free"), d_out=2, m=5)
    post = model.posterior
    assert not hasattr(post, "nets") and tuple(post.base_mean.shape) == (5, 2)
    with torch.no_grad():
        post.base_mean.copy_(torch.arange(10.0).reshape(5, 2) / 10)
        post.base_raw_scale.fill_(0.0)  # σ = softplus(0) = log 2
    z = [model.layers[0].gp.inducing_points]
    mean, scale = post.base(z)
    torch.testing.assert_close(mean, post.base_mean)
    torch.testing.assert_close(scale, torch.full((5, 2), math.log(2.0)), atol=1e-9, rtol=0)
    vs, log_q = post.sample(300, z, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(log_q, torch.distributions.Normal(mean.mT, scale.mT).log_prob(vs[0]).sum((-2, -1)))
    torch.testing.assert_close(vs[0].mean(0), mean.mT, atol=4 * math.log(2.0) / math.sqrt(300), rtol=0)
    model.elbo(x, y, num_samples=3).backward()
    assert post.base_mean.grad.abs().sum() > 0 and post.base_raw_scale.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="base"):
        ConvolutionalFlowPosterior(model.layers, base="mlp")
    with pytest.raises(ValueError, match="flow_base"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", flow_base="mlp")
    deep = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf-paper", flow_base="free")
    assert deep.posterior.base_kind == "free" and tuple(deep.posterior.base_mean.shape) == (5, 3)
