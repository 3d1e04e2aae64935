"""Deep GPs with doubly-stochastic VI (flowgp.models.deep_gp)."""
import copy
import math

import pytest
import torch

from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP
from flowgp.models.deep_gp import (DeepGP, GPLayer, build_deep_gp, gaussian_mixture_quantiles,
                                   hidden_layer_width, linear_mean_weight)


def _toy(n=60, d=2, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=dtype)
    return x, y


def _randomise_q(gp, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gp.q_mu.copy_(torch.randn(gp.q_mu.shape, generator=g, dtype=gp.q_mu.dtype))
        gp.q_sqrt.copy_(0.3 * torch.randn(gp.q_sqrt.shape, generator=g, dtype=gp.q_sqrt.dtype).tril()
                        + 0.5 * torch.eye(gp.q_sqrt.shape[-1], dtype=gp.q_sqrt.dtype))


def test_one_layer_dgp_equals_svgp(float64_default):
    x, y = _toy()
    z = x[:7].clone()
    kernel = make_kernel("rbf", 2, batch_shape=(1,), lengthscale=0.8, variance=1.3)
    svgp = SVGP(copy.deepcopy(kernel), z, GaussianLikelihood(noise=0.1))
    _randomise_q(svgp.gp)
    layer = GPLayer(z, 1, kernel=copy.deepcopy(kernel))
    layer.gp.load_state_dict(svgp.gp.state_dict())
    dgp = DeepGP([layer], copy.deepcopy(svgp.likelihood))
    for s in (1, 5):  # the only layer's expectation is closed form: no Monte Carlo error at all
        torch.testing.assert_close(dgp.elbo(x, y, num_data=200, num_samples=s), svgp.elbo(x, y, num_data=200))
    m_dgp, v_dgp = dgp.predict(x, num_samples=4)
    m_svgp, v_svgp = svgp.predict(x)
    torch.testing.assert_close(m_dgp, m_svgp)
    torch.testing.assert_close(v_dgp, v_svgp)
    torch.testing.assert_close(dgp.log_predictive_density(x, y, num_samples=3), svgp.log_predictive_density(x, y))
    torch.testing.assert_close(dgp.predict_quantiles(x, [0.1, 0.5, 0.9], num_samples=2),
                               svgp.predict_quantiles(x, [0.1, 0.5, 0.9]), atol=1e-7, rtol=1e-7)


def test_one_layer_gradients_match_svgp(float64_default):
    x, y = _toy()
    z = x[:5].clone()
    kernel = make_kernel("rbf", 2, batch_shape=(1,))
    svgp = SVGP(copy.deepcopy(kernel), z, GaussianLikelihood(noise=0.1))
    _randomise_q(svgp.gp)
    layer = GPLayer(z, 1, kernel=copy.deepcopy(kernel))
    layer.gp.load_state_dict(svgp.gp.state_dict())
    dgp = DeepGP([layer], copy.deepcopy(svgp.likelihood))
    dgp.elbo(x, y).backward()
    svgp.elbo(x, y).backward()
    for (name, p), q in zip(layer.gp.named_parameters(), svgp.gp.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes(dtype):
    x, y = _toy(dtype=dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = build_deep_gp(x, 1, 3, num_inducing=6, hidden_width=3, kmeans_restarts=1)
    finally:
        torch.set_default_dtype(previous)
    outs = model.propagate(x, num_samples=4)
    assert [o[0].shape for o in outs] == [(4, 60, 3), (4, 60, 3), (4, 60, 1)]
    assert all(t.dtype == dtype for o in outs for t in o)
    elbo = model.elbo(x, y, num_samples=2)
    assert elbo.dtype == dtype and elbo.dim() == 0 and torch.isfinite(elbo)
    mean, var = model.predict(x[:5], num_samples=7)
    assert mean.shape == var.shape == (5, 1) and mean.dtype == dtype and (var > 0).all()
    assert model.log_predictive_density(x[:5], y[:5], num_samples=7).shape == (5, 1)
    assert model.sample_f(x[:5], num_samples=3).shape == (3, 5, 1)
    assert model.predict_quantiles(x[:5], [0.25, 0.75], num_samples=7).shape == (2, 5, 1)


def test_layer_marginal_trick_samples_have_the_layer_moments(float64_default):
    x, _ = _toy(n=4)
    layer = GPLayer(x[:3].clone(), 2, mean_weight=torch.eye(2), white_variance=1e-6)
    _randomise_q(layer.gp)
    g = torch.Generator().manual_seed(3)
    sample, mean, var = layer(x, generator=g, num_samples=20000)
    assert sample.shape == (20000, 4, 2)
    se = (var[0] / 20000).sqrt()
    assert ((sample.mean(0) - mean[0]).abs() < 5 * se).all()
    torch.testing.assert_close(sample.var(0), var[0], rtol=0.06, atol=0)
    # the linear mean function is part of the marginal mean: identity weight adds x itself
    no_mean = GPLayer(x[:3].clone(), 2, white_variance=1e-6)
    no_mean.gp.load_state_dict(layer.gp.state_dict(), strict=False)
    torch.testing.assert_close(mean[0] - x, no_mean.gp.marginals(x).mean)


def test_conditional_matches_gaussian_marginal_with_zero_variance(float64_default):
    """With S -> 0 the Gaussian q(v) collapses onto q_mu: p(f | v = q_mu) has the same marginals."""
    x, _ = _toy(n=9)
    layer = GPLayer(x[:4].clone(), 3, mean_weight=torch.randn(2, 3), white_variance=1e-6, q_var_init=1e-30)
    with torch.no_grad():
        layer.gp.q_mu.normal_()
    mean, var = layer.gp.marginals(x)
    cm, cv = layer.conditional(x, layer.gp.q_mu.detach().unsqueeze(0))
    torch.testing.assert_close(cm[0], mean)
    torch.testing.assert_close(cv.expand_as(cm)[0], var)


def test_conditional_gradcheck(float64_default):
    x, _ = _toy(n=5)
    layer = GPLayer(x[:3].clone(), 2, mean_weight=torch.randn(2, 2))
    v = torch.randn(2, 2, 3, requires_grad=True)
    xs = x.unsqueeze(0).expand(2, 5, 2).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: layer.conditional(a, b), (xs, v))


def test_elbo_gradients_are_reparameterised(float64_default):
    """Same generator seed -> same ELBO, and gradients reach every layer through the sampled hidden layers."""
    x, y = _toy()
    model = build_deep_gp(x, 1, 3, num_inducing=5, hidden_width=2, kmeans_restarts=1)
    e1 = model.elbo(x, y, num_samples=2, generator=torch.Generator().manual_seed(5))
    e2 = model.elbo(x, y, num_samples=2, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(e1, e2)
    e1.backward()
    for ell, layer in enumerate(model.layers):
        assert layer.gp.q_mu.grad is not None and layer.gp.q_mu.grad.abs().sum() > 0, ell
        assert layer.gp.inducing_points.grad.abs().sum() > 0, ell


def test_mean_function_initialisation(float64_default):
    x = torch.randn(50, 4) @ torch.diag(torch.tensor([3.0, 2.0, 0.5, 0.1]))
    w = linear_mean_weight(x, 2)
    assert w.shape == (4, 2)
    torch.testing.assert_close(w.mT @ w, torch.eye(2))  # orthonormal principal directions
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    torch.testing.assert_close((w.mT @ vh[:2].mT).abs(), torch.eye(2))
    torch.testing.assert_close(linear_mean_weight(x, 4), torch.eye(4))
    torch.testing.assert_close(linear_mean_weight(x, 6), torch.cat([torch.eye(4), torch.zeros(4, 2)], 1))


def test_builder_structure(float64_default):
    x, _ = _toy(n=40, d=20)
    model = build_deep_gp(x, 1, 3, num_inducing=8, kmeans_restarts=1)
    assert hidden_layer_width(20) == 16 and hidden_layer_width(8) == 8 and hidden_layer_width(3, 5) == 5
    assert [(l.input_dim, l.output_dim) for l in model.layers] == [(20, 16), (16, 16), (16, 1)]
    assert all(l.num_inducing == 8 for l in model.layers)
    assert model.layers[-1].gp.mean_function is None
    assert all(l.gp.mean_function is not None for l in model.layers[:-1])
    # the hidden layers' Z are the input k-means centres pushed through the mean projections
    w0 = model.layers[0].gp.mean_function.weight
    torch.testing.assert_close(model.layers[1].gp.inducing_points, model.layers[0].gp.inducing_points @ w0)
    # white jitter on hidden layers only: it shows in k(x, x) but not in k(x, z)
    k0, k2 = model.layers[0].gp.kernel, model.layers[2].gp.kernel
    xs = x[:3]
    gap = k0.diag(xs) - k0(xs, xs.clone() + 0).diagonal(dim1=-2, dim2=-1)
    torch.testing.assert_close(gap, torch.full_like(gap, 1e-6), atol=1e-9, rtol=0)
    assert not any("White" in type(m).__name__ for m in k2.modules())


def test_training_improves_fit(float64_default):
    x, y = _toy(n=80, d=1)
    torch.manual_seed(0)
    model = build_deep_gp(x, 1, 2, num_inducing=10, kmeans_restarts=1)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    first = None
    for _ in range(150):
        opt.zero_grad()
        loss = -model.elbo(x, y)
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    assert loss.item() < first - 50
    with torch.no_grad():
        mean, _ = model.predict(x, num_samples=20)
    rmse = (mean - y).square().mean().sqrt()
    assert rmse < 0.2  # the noise std is 0.1, the target std ~0.7


def test_mixture_quantiles_invert_the_mixture_cdf(float64_default):
    mean = torch.tensor([[0.0, 1.0], [2.0, -1.0], [-3.0, 0.5]])  # 3 components, 2 points
    var = torch.tensor([[1.0, 0.5], [0.3, 2.0], [1.5, 0.1]])
    probs = [0.05, 0.5, 0.9]
    q = gaussian_mixture_quantiles(mean, var, probs)
    cdf = torch.special.ndtr((q.unsqueeze(1) - mean) / var.sqrt()).mean(1)
    torch.testing.assert_close(cdf, torch.tensor(probs).unsqueeze(-1).expand(3, 2), atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="quantile"):
        gaussian_mixture_quantiles(mean, var, [0.0, 0.5])


def test_log_predictive_density_is_log_mean_of_component_densities(float64_default):
    x, y = _toy(n=6)
    model = build_deep_gp(x, 1, 2, num_inducing=4, hidden_width=2, kmeans_restarts=1)
    mean, var = model.predict_f_samples(x, num_samples=5, generator=torch.Generator().manual_seed(2))
    total = var + model.likelihood.noise
    dens = torch.exp(-0.5 * ((y - mean).square() / total + total.log() + math.log(2 * math.pi)))
    expected = dens.mean(0).log()
    got = model.log_predictive_density(x, y, num_samples=5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(got, expected)


def test_classification_likelihoods(float64_default):
    from flowgp.gp import likelihoods as lk

    x, y = _toy(n=30)
    labels = (y[:, 0] > 0).double().unsqueeze(-1)
    model = build_deep_gp(x, 1, 2, num_inducing=5, likelihood=lk.BernoulliLikelihood(), kmeans_restarts=1)
    assert torch.isfinite(model.elbo(x, labels, num_samples=2))
    classes = (y[:, 0] > 0).long() + (y[:, 0] > 0.5).long()
    for lik in (lk.RobustMaxLikelihood(3), lk.SoftmaxLikelihood(3)):
        model = build_deep_gp(x, 3, 2, num_inducing=5, likelihood=lik, kmeans_restarts=1)
        elbo = model.elbo(x, classes, num_samples=2)
        assert elbo.dim() == 0 and torch.isfinite(elbo)
        lpd = model.log_predictive_density(x, classes, num_samples=4)
        assert lpd.shape == (30,) and (lpd <= 0).all()


def test_bad_input_is_refused(float64_default):
    x, y = _toy(n=20)
    model = build_deep_gp(x, 1, 2, num_inducing=4, kmeans_restarts=1)
    with pytest.raises(ValueError, match="features"):
        model.elbo(x[:, :1], y)
    with pytest.raises(ValueError, match="num_samples"):
        model.elbo(x, y, num_samples=0)
    with pytest.raises(ValueError, match="shape"):
        model.elbo(x, y[:10])
    with pytest.raises(TypeError, match="torch.Tensor"):
        model.predict(x.numpy())
    with pytest.raises(ValueError, match="posterior"):
        build_deep_gp(x, 1, 2, num_inducing=4, posterior="mcmc", kmeans_restarts=1)
    with pytest.raises(ValueError, match="num_layers"):
        build_deep_gp(x, 1, 0, num_inducing=4, kmeans_restarts=1)
    layers = [GPLayer(x[:3], 3), GPLayer(torch.randn(3, 2), 1)]
    with pytest.raises(ValueError, match="outputs 3"):
        DeepGP(layers)
    with pytest.raises(ValueError, match="mean_weight"):
        GPLayer(x[:3], 2, mean_weight=torch.eye(3))
    with pytest.raises(ValueError, match="shape"):
        layers[0].conditional(x, torch.zeros(1, 2, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("posterior", ["gaussian", "cnf", "cnf-paper"])
def test_cuda_elbo_and_predict(posterior):
    x, y = _toy(dtype=torch.float64)
    model = build_deep_gp(x.cuda(), 1, 2, num_inducing=5, posterior=posterior, kmeans_restarts=1)
    elbo = model.elbo(x.cuda(), y.cuda(), num_samples=2)
    elbo.backward()
    assert elbo.device.type == "cuda" and torch.isfinite(elbo)
    mean, var = model.predict(x[:4].cuda(), num_samples=5, generator=torch.Generator(device="cuda").manual_seed(0))
    assert mean.device.type == "cuda" and mean.shape == (4, 1)


# ----- one objective, explicit randomness and dtype -----------------------------------------------------
@pytest.mark.parametrize("posterior", ["gaussian", "cnf", "cnf-paper", "flow-layerwise"])
def test_builder_and_elbo_leave_global_state_untouched(posterior):
    import numpy as np

    x, y = _toy(n=30)
    torch_state, np_state, dtype = torch.get_rng_state(), np.random.get_state(), torch.get_default_dtype()
    model = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior=posterior,
                          generator=torch.Generator().manual_seed(1))
    model.elbo(x, y, num_samples=2, generator=torch.Generator().manual_seed(2)).backward()
    model.predict(x[:3], num_samples=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], np_state[1]) and torch.get_default_dtype() == dtype


def test_builder_randomness_comes_from_the_generator_or_the_seed():
    x, _ = _toy(n=30)

    def params(**kw):
        model = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf-paper", **kw)
        return [p.detach().clone() for p in model.parameters()]

    same = params(seed=4, generator=torch.Generator().manual_seed(4))
    for a, b in zip(same, params(seed=4)):  # no generator: one seeded with `seed` (which also seeds k-means)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    other = params(seed=4, generator=torch.Generator().manual_seed(5))
    assert any(not torch.equal(a, b) for a, b in zip(same, other))
    with pytest.raises(TypeError, match="generator"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, generator=4)


def test_cnf_base_network_draws_nn_linears_initialisation_from_the_generator():
    from flowgp.models.cnf_posterior import _BaseNet

    net = _BaseNet(3, 4, hidden=16, generator=torch.Generator().manual_seed(7))
    with torch.random.fork_rng():
        torch.manual_seed(7)  # nn.Linear's own init draws from the global RNG: the same draws, in the same order
        ref = torch.nn.Linear(3, 16, dtype=torch.float64)
        readout = torch.empty(4, 16, dtype=torch.float64).uniform_(-1.0, 1.0)
    torch.testing.assert_close(net.hidden.weight, ref.weight, rtol=0, atol=0)
    torch.testing.assert_close(net.hidden.bias, ref.bias, rtol=0, atol=0)
    torch.testing.assert_close(net.readout, readout, rtol=0, atol=0)


def test_builder_dtype_device_and_parameters_independent_of_default_dtype():
    x, y = _toy(n=30, dtype=torch.float64)  # the default dtype is float32 here
    model = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf")
    assert all(p.dtype == torch.float64 for p in model.parameters())
    low = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", dtype=torch.float32,
                        device="cpu")
    assert all(p.dtype == torch.float32 for p in low.parameters())
    # built in float64 and cast at the end: float32 parameters are the float64 ones rounded
    for a, b in zip(model.parameters(), low.parameters()):
        torch.testing.assert_close(a.to(torch.float32), b, rtol=0, atol=0)
    assert low.elbo(x.float(), y.float(), generator=torch.Generator().manual_seed(0)).dtype == torch.float32


def test_elbo_is_the_minibatch_bound_and_validate_checks_inputs(float64_default):
    x, y = _toy(n=40)
    model = build_deep_gp(x, 1, 2, num_inducing=6, kmeans_restarts=1)
    for i, layer in enumerate(model.layers):
        _randomise_q(layer.gp, seed=i)
    xb, yb = x[:10], y[:10]
    e1 = model.elbo(xb, yb, num_samples=3, generator=torch.Generator().manual_seed(1))
    e4 = model.elbo(xb, yb, num_data=40, num_samples=3, generator=torch.Generator().manual_seed(1))
    kl = sum(layer.kl_divergence() for layer in model.layers)
    # (N/B) Σ_batch ell - KL with N = B and N = 4B: e4 = 4 (e1 + KL) - KL
    torch.testing.assert_close(e4, 4 * (e1 + kl) - kl)
    assert model.validate(x) is not None
    with pytest.raises(ValueError, match="features"):
        model.validate(x[:, :1])
    with pytest.raises(ValueError, match="num_data"):
        model.elbo(xb, yb, num_data=0)


@pytest.mark.parametrize("common_noise", [False, True])
def test_propagate_draws_every_layer_as_the_layers_draw_themselves(common_noise):
    """`propagate` draws all layers' ε up front (`layer_noise`, one graph break under torch.compile): the same
    numbers as calling each layer with the generator in turn, so fits and published results are unchanged."""
    x, _ = _toy(n=30, d=3)
    model = build_deep_gp(x, 1, 3, num_inducing=6, generator=torch.Generator().manual_seed(0))
    chain = model.propagate(x, 4, generator=torch.Generator().manual_seed(7), common_noise=common_noise)
    g = torch.Generator().manual_seed(7)
    h = x
    for layer, (sample, mean, var) in zip(model.layers, chain):
        want = layer(h, generator=g, num_samples=4, common_noise=common_noise)
        for got, ref in zip((sample, mean, var), want):
            assert torch.equal(got, ref)
        h = want[0]
    with pytest.raises(ValueError, match="eps must have shape"):
        model.layers[0](x, num_samples=4, eps=torch.zeros(4, 30, 99, dtype=x.dtype))


def test_compiled_deep_gp_bound_breaks_its_graph_once_whatever_the_depth():
    """A draw from a torch.Generator is a graph break; drawing every layer's noise in one call keeps the number
    of breaks independent of the depth (it was one per layer, a compiled graph per layer)."""
    import torch._dynamo

    x, y = _toy(n=30, d=3)
    breaks = {}
    for depth in (1, 3):
        model = build_deep_gp(x, 1, depth, num_inducing=6, generator=torch.Generator().manual_seed(0))
        explanation = torch._dynamo.explain(lambda a, b: model.elbo(a, b, num_data=30,
                                                                    generator=torch.Generator().manual_seed(1)))(x, y)
        breaks[depth] = explanation.graph_break_count
    assert breaks[3] == breaks[1]
