"""The Gaussian-base convolutional flow posterior of deep GPs and per-point draws of U.

posterior="cnf": DSVI's whitened full-covariance Gaussian q(V) per layer and output, then the convolutional flow
steps of CNF-DGP §III (identity at initialisation); KL = closed-form Gaussian KL + E[c(V)] with
c(V) = -log|det dT/dV| - [log N(T(V); 0, I) - log N(V; 0, I)]. Per-point draws: an independent U per data point.
"""
import math

import pytest
import torch

from flowgp.bench.toys import skewed_step_toy
from flowgp.models.cnf_posterior import GaussianConvolutionalFlowPosterior, SinhArcsinhStep
from flowgp.models.deep_gp import GPLayer, build_deep_gp, warm_start_from_gaussian
from flowgp.training.loop import train

DT = torch.float64


def _toy(n=24, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=DT)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=DT)
    return x, y


def _perturb(params, scale, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _perturb_gaussian_q(model, seed=1):
    """A DSVI-like q(v) far from the initial N(0, 1e-5 I): random means, lower factors with diagonal ~0.5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.layers:
            q_mu, q_sqrt = layer.gp.q_mu, layer.gp.q_sqrt
            q_mu.copy_(0.7 * torch.randn(q_mu.shape, generator=g, dtype=DT))
            m = q_sqrt.shape[-1]
            q_sqrt.copy_(0.5 * torch.eye(m, dtype=DT) + 0.1 * torch.randn(q_sqrt.shape, generator=g, dtype=DT))


def _mc_mean(fn, reps, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vals = torch.stack([fn(g) for _ in range(reps)])
    return vals.mean(), vals.std() / math.sqrt(reps), vals.var()


def test_per_point_draws_are_unbiased_and_less_noisy_than_a_shared_draw():
    x, y = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf-paper", flow_base="free")
    _perturb(model.posterior.parameters(), 0.1, seed=2)
    with torch.no_grad():  # a base scale of ~0.7 (not the initial 3e-3), so that the U noise is what varies
        model.posterior.base_raw_scale.fill_(0.0)
    assert model.draws == "shared"  # the paper's estimator (eq. 6) is this posterior's default

    def bound(draws):
        model.draws = draws
        return _mc_mean(lambda g: model.elbo(x, y, num_data=100, generator=g), 200, seed=3)

    shared_mean, shared_se, shared_var = bound("shared")
    point_mean, point_se, point_var = bound("per-point")
    # same expectation (both unbiased for the same bound) within Monte Carlo error ...
    assert abs(point_mean - shared_mean) < 4 * math.hypot(point_se, shared_se)
    # ... but the per-point draws average the U noise over the batch
    assert point_var < 0.5 * shared_var


def test_identity_flow_kl_is_dsvi_closed_form_kl_and_the_bound_is_dsvi_in_expectation():
    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="gaussian")
    _perturb_gaussian_q(dsvi)
    default = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf")
    assert (default.draws, default.base_gradient) == ("coupled", "dsvi")  # "cnf"'s defaults
    flow = warm_start_from_gaussian(build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf",
                                                  draws="per-point"), dsvi)
    assert flow.base_gradient == "joint" and isinstance(flow.posterior, GaussianConvolutionalFlowPosterior)
    closed = sum(layer.kl_divergence() for layer in dsvi.layers)
    vs, kl_gauss, correction = flow.draw_inducing(50, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(kl_gauss, closed, rtol=1e-13, atol=0)
    assert correction.abs().max() < 1e-12  # the flow's Monte Carlo terms vanish at the identity
    _, kl = flow.sample_inducing(7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(kl, closed, rtol=1e-12, atol=0)
    # the draws are the Gaussian base's: V = m + R ε
    assert [tuple(v.shape) for v in vs] == [(2, 5, 50), (1, 5, 50)]
    d_mean, d_se, _ = _mc_mean(lambda g: dsvi.elbo(x, y, num_samples=20, generator=g), 40, seed=4)
    f_mean, f_se, _ = _mc_mean(lambda g: flow.elbo(x, y, num_samples=20, generator=g), 40, seed=5)
    assert abs(d_mean - f_mean) < 4 * math.hypot(d_se, f_se)


def _bound_and_grads(model, x, y, seed, num_samples=3):
    model.zero_grad()
    value = model.elbo(x, y, num_data=60, num_samples=num_samples, generator=torch.Generator().manual_seed(seed))
    value.backward()
    names = [n for n, p in model.named_parameters() if p.grad is not None and not n.startswith("posterior.")]
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if n in names}


def test_coupled_bound_is_exactly_dsvis_estimator_at_the_identity_flow():
    """draws="coupled": DSVI's chain with every point's U locally reparameterised on it, plus the flow's change on
    the same draws. At the identity flow the change is 0 draw by draw, so with the same generator state the value
    and the gradient of every shared parameter (q(v), kernels, Z, likelihood) are DSVI's own, not just equal in
    expectation."""
    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="gaussian")
    _perturb_gaussian_q(dsvi)
    flow = warm_start_from_gaussian(build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="cnf",
                                                  draws="coupled"), dsvi)
    d_value, d_grads = _bound_and_grads(dsvi, x, y, seed=3)
    f_value, f_grads = _bound_and_grads(flow, x, y, seed=3)
    torch.testing.assert_close(f_value, d_value, rtol=1e-12, atol=1e-10)
    assert d_grads.keys() == f_grads.keys() and any("q_sqrt" in n for n in d_grads)
    for name in d_grads:
        torch.testing.assert_close(f_grads[name], d_grads[name], rtol=1e-9, atol=1e-9, msg=name)
    # the flow's own parameters still get a gradient (the change's derivative does not vanish with it)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in flow.posterior.parameters())


def test_dsvi_base_gradient_gives_dsvis_gradients_and_the_flows_own_anywhere():
    """base_gradient="dsvi": the value is the coupled bound, every parameter DSVI also has gets exactly the DSVI
    model's gradient for the same generator state even with the flow far from the identity, and the flow's
    parameters get exactly their gradient under the joint objective (the only term depending on them)."""
    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="gaussian")
    _perturb_gaussian_q(dsvi)

    def flow_model(base_gradient):
        model = warm_start_from_gaussian(build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="cnf",
                                                       draws="coupled", base_gradient=base_gradient), dsvi)
        _perturb(model.posterior.parameters(), 0.3, seed=7)
        return model

    split, joint = flow_model("dsvi"), flow_model("joint")
    d_value, d_grads = _bound_and_grads(dsvi, x, y, seed=3)
    s_value, s_grads = _bound_and_grads(split, x, y, seed=3)
    j_value, j_grads = _bound_and_grads(joint, x, y, seed=3)
    torch.testing.assert_close(s_value, j_value, rtol=1e-12, atol=1e-10)
    assert abs(float(s_value - d_value)) > 1e-3  # the flow is far from the identity: the bounds differ
    assert s_grads.keys() == d_grads.keys()
    for name in d_grads:
        torch.testing.assert_close(s_grads[name], d_grads[name], rtol=1e-9, atol=1e-9, msg=name)
    # ... where the joint objective's gradients of those parameters differ (the flow's change depends on them)
    assert any(not torch.allclose(j_grads[n], d_grads[n], rtol=1e-6, atol=1e-8) for n in d_grads)
    for (name, ps), pj in zip(split.posterior.named_parameters(), joint.posterior.parameters()):
        torch.testing.assert_close(ps.grad, pj.grad, rtol=1e-9, atol=1e-12, msg=name)
    assert any(p.grad.abs().sum() > 0 for p in split.posterior.parameters())
    with torch.no_grad():  # evaluation: the plain bound
        torch.testing.assert_close(split.elbo(x, y, num_data=60, num_samples=3,
                                              generator=torch.Generator().manual_seed(3)), s_value)
    with pytest.raises(ValueError, match="base_gradient"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", draws="per-point",
                      base_gradient="dsvi")
    with pytest.raises(ValueError, match="base_gradient"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", draws="coupled",
                      base_gradient="flow")


def test_flow_rows_estimates_the_flows_change_on_a_subset_without_touching_dsvis_part():
    """flow_rows = b < B: the flow's change Δ of the bound is estimated on b random rows of the batch (scaled by
    N/b), drawn by the coupling's generator. DSVI's part and every shared parameter's gradient are those of the
    full estimator bit for bit, and value and flow gradient stay unbiased (same means over many draws)."""
    import copy

    x, y = _toy(n=16)
    dsvi = build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="gaussian")
    _perturb_gaussian_q(dsvi)
    every = warm_start_from_gaussian(build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="cnf",
                                                   flow_rows=None), dsvi)
    _perturb(every.posterior.parameters(), 0.3, seed=7)
    few = copy.deepcopy(every)
    few.flow_rows = 4
    d_value, d_grads = _bound_and_grads(dsvi, x, y, seed=3)
    for model in (every, few):
        value, grads = _bound_and_grads(model, x, y, seed=3)
        assert abs(float(value - d_value)) > 1e-3  # the flow's change is there
        for name in d_grads:  # DSVI's part: DSVI's gradient exactly, whatever the rows of Δ
            torch.testing.assert_close(grads[name], d_grads[name], rtol=1e-9, atol=1e-9, msg=name)

    def moments(model, reps=200):
        g = torch.Generator().manual_seed(11)
        values, grads = [], []
        for _ in range(reps):
            model.zero_grad()
            value = model.elbo(x, y, num_data=40, num_samples=2, generator=g)
            value.backward()
            values.append(value.detach())
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.posterior.parameters()]))
        values, grads = torch.stack(values), torch.stack(grads)
        return values.mean(), values.std() / math.sqrt(reps), grads.mean(0), grads.std(0) / math.sqrt(reps)

    e_mean, e_se, e_grad, e_gse = moments(every)
    f_mean, f_se, f_grad, f_gse = moments(few)
    assert abs(e_mean - f_mean) < 4 * math.hypot(e_se, f_se)
    z = (e_grad - f_grad) / torch.hypot(e_gse, f_gse).clamp_min(1e-12)
    assert float(z.abs().max()) < 5 and float(z.square().mean()) < 2  # the flow's gradient: same mean
    assert float(f_gse.sum()) > float(e_gse.sum())  # ... from fewer rows, noisier
    with torch.no_grad():  # evaluation uses every row whatever flow_rows is
        g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        torch.testing.assert_close(few.elbo(x, y, num_samples=3, generator=g1),
                                   every.elbo(x, y, num_samples=3, generator=g2), rtol=1e-12, atol=1e-12)
    for bad in (0, -3, 1.5):
        with pytest.raises((ValueError, TypeError), match="flow_rows"):
            build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", flow_rows=bad)


def test_dsvi_base_gradient_follows_a_dsvi_fit_step_by_step_and_selection_keeps_the_bound_above_it():
    """With base_gradient="dsvi" the coupling's own draws come from a generator derived from (not advancing) the
    model's, so the DSVI part consumes a DSVI model's random numbers: trained with the same seed, every shared
    parameter stays on the DSVI fit's trajectory while the flow moves. `select_flow_strength` then scales the flow
    toward the identity where that helps: the selected bound is never below the DSVI fit's on the same draws."""
    from flowgp.models.deep_gp import select_flow_strength

    x, y = _toy(n=40)
    dsvi = build_deep_gp(x, 1, 2, num_inducing=6, kmeans_restarts=1)
    flow = build_deep_gp(x, 1, 2, num_inducing=6, kmeans_restarts=1, posterior="cnf", draws="coupled",
                         base_gradient="dsvi")
    train(dsvi, x, y, epochs=15, batch_size=20, lr=0.03, seed=4, verbose=False)
    train(flow, x, y, epochs=15, batch_size=20, lr=0.03, seed=4, verbose=False)
    shared = dict(dsvi.named_parameters())
    for name, p in flow.named_parameters():
        if not name.startswith("posterior."):
            torch.testing.assert_close(p, shared[name], rtol=0, atol=0, msg=name)  # bit for bit
    assert max(float(p.abs().max()) for p in flow.posterior.parameters()) > 1e-3  # the flow did move
    with torch.no_grad():  # a flow pushed far off: the selection must fall back toward the identity
        for p in flow.posterior.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    scores = select_flow_strength(flow, x, y, num_samples=16, seed=2)
    assert scores["selected"] < 1.0 and scores[scores["selected"]] >= max(scores[0.0], scores[1.0])
    chosen = scores["selected"]
    d_value = float(dsvi.elbo(x, y, num_samples=16, generator=torch.Generator().manual_seed(2))) / x.shape[0]
    assert scores[0.0] == pytest.approx(d_value, rel=1e-9, abs=1e-9)  # λ = 0 is the DSVI fit, draw for draw
    f_value = float(flow.elbo(x, y, num_samples=16, generator=torch.Generator().manual_seed(2))) / x.shape[0]
    # never below the DSVI fit; where λ = 0 is selected the two are the same bound, equal up to rounding (the
    # coupled estimator's terms that cancel at the identity cancel to the last bit only in exact arithmetic)
    assert f_value == pytest.approx(scores[chosen], rel=1e-12) and f_value >= d_value - 1e-12 * abs(d_value)
    with pytest.raises(ValueError, match="Gaussian-base"):
        select_flow_strength(dsvi, x, y)
    # alternatives (e.g. averaged iterates) compete with the trained values; the identity scores as λ = 0 does
    zero = [torch.zeros_like(p) for p in flow.posterior.parameters()]
    trained = [p.detach().clone() for p in flow.posterior.parameters()]
    both = select_flow_strength(flow, x, y, num_samples=16, seed=2, alternatives={"zero": zero, "again": trained})
    assert all(v == pytest.approx(both[0.0], rel=1e-12) for v in both["zero"].values())
    assert both["again"] == {f: pytest.approx(both[f], rel=1e-12) for f in (0.0, 0.125, 0.25, 0.5, 1.0)}
    assert both["source"] == "trained"  # "again" ties with the trained values everywhere: ties go to the trained
    with pytest.raises(ValueError, match="alternatives"):
        select_flow_strength(flow, x, y, alternatives={"bad": zero[:1]})


def test_coupled_and_per_point_bounds_agree_and_coupling_cuts_the_gradient_noise():
    x, y = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=10, kmeans_restarts=1, posterior="cnf")
    _perturb_gaussian_q(model, seed=5)
    _perturb(model.posterior.parameters(), 0.02, seed=6)  # a flow near, not at, the identity

    def stats(draws):
        model.draws = draws
        values, grads = [], []
        g = torch.Generator().manual_seed(7)
        for _ in range(80):
            model.zero_grad()
            value = model.elbo(x, y, num_data=60, num_samples=2, generator=g)
            value.backward()
            values.append(value.detach())
            grads.append(torch.cat([layer.gp.q_sqrt.grad.reshape(-1) for layer in model.layers]))
        values, grads = torch.stack(values), torch.stack(grads)
        return values.mean(), values.std() / math.sqrt(len(values)), grads.var(0).sum()

    c_mean, c_se, c_gvar = stats("coupled")
    p_mean, p_se, p_gvar = stats("per-point")
    assert abs(c_mean - p_mean) < 4 * math.hypot(c_se, p_se)  # both unbiased for the same bound
    print(f"gradient variance coupled / per-point: {c_gvar / p_gvar:.3f}")
    assert c_gvar < 0.2 * p_gvar  # the local reparameterisation of DSVI's base term (measured ~0.02x on boston)


def test_coupled_draws_are_unbiased_far_from_the_identity():
    """The locally reparameterised draws keep V ~ N(m, RRᵀ) and the chain's noise independent whatever the flow:
    with a flow far from the identity (and a 3-layer model, so that draws depend on the chain) the coupled and
    the plain per-point bounds agree within Monte Carlo error."""
    x, y = _toy(n=16)
    model = build_deep_gp(x, 1, 3, num_inducing=6, kmeans_restarts=1, posterior="cnf")
    _perturb_gaussian_q(model, seed=8)
    _perturb(model.posterior.parameters(), 0.3, seed=9)

    def bound(draws):
        model.draws = draws
        return _mc_mean(lambda g: model.elbo(x, y, num_data=40, num_samples=50, generator=g), 60, seed=10)

    (c_mean, c_se, _), (p_mean, p_se, _) = bound("coupled"), bound("per-point")
    assert abs(c_mean - p_mean) < 4 * math.hypot(c_se, p_se)


def test_linear_flow_kl_matches_the_dense_gaussian_kl():
    """With only the 1×1 convolutions (nonlinear=False) q(U) is Gaussian over all K·M entries: the split KL
    (closed form + Monte Carlo correction) must match KL[N(μ_U, Σ_U) || N(0, I)] computed densely."""
    x, _ = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=4, kmeans_restarts=1, posterior="cnf", flow_nonlinear=False)
    _perturb_gaussian_q(model, seed=3)
    post = model.posterior
    _perturb(post.parameters(), 0.3, seed=4)
    k, m = sum(post.dims), post.num_inducing
    # dense moments of V (channels-first [K, M] flattened) and of U = (W ⊗ I_M) V
    mu = torch.cat([layer.gp.q_mu for layer in model.layers], 0).reshape(-1)
    blocks = [r @ r.mT for layer in model.layers for r in layer.gp.q_sqrt_tril()]
    cov = torch.block_diag(*blocks)
    w = torch.eye(k, dtype=DT)
    for lin in post.linear:
        w = lin.weight() @ w
    big = torch.kron(w, torch.eye(m, dtype=DT))
    mu_u, cov_u = big @ mu, big @ cov @ big.mT
    dense = 0.5 * (torch.trace(cov_u) + mu_u @ mu_u - k * m - torch.logdet(cov_u))
    with torch.no_grad():
        _, kl_gauss, corr = model.draw_inducing(200_000, generator=torch.Generator().manual_seed(6))
    se = corr.std() / math.sqrt(corr.numel())
    assert abs(kl_gauss + corr.mean() - dense) < 4 * se + 1e-10


def test_flow_log_determinant_matches_autograd_jacobian():
    x, _ = _toy()
    model = build_deep_gp(x, 1, 2, num_inducing=3, hidden_width=2, kmeans_restarts=1, posterior="cnf")
    post = model.posterior
    _perturb(post.parameters(), 0.3, seed=7)
    k, m = sum(post.dims), post.num_inducing
    v0 = torch.randn(k, m, 2, dtype=DT, generator=torch.Generator().manual_seed(8))
    _, logdet = post.transform(v0)
    for p in range(2):
        jac = torch.autograd.functional.jacobian(
            lambda t: post.transform(t.reshape(k, m, 1))[0].reshape(-1), v0[..., p].reshape(-1))
        torch.testing.assert_close(logdet[p], torch.linalg.slogdet(jac)[1])


@pytest.mark.parametrize("shape", [(3, 4, 1), (3, 1, 1)])
def test_sinh_arcsinh_step_gradients_forward_and_inverse(shape):
    g = torch.Generator().manual_seed(9)
    step = SinhArcsinhStep(shape)
    _perturb(step.parameters(), 0.4, seed=10)
    x = 2 * torch.randn(3, 4, 5, dtype=DT, generator=g)
    out, logdet = step(x)
    a, b = step.a, step.log_b.exp()
    torch.testing.assert_close(out, torch.sinh(b * torch.asinh(x) - a))
    dense = (torch.log(b * torch.cosh(b * torch.asinh(x) - a)) - 0.5 * torch.log1p(x * x)).sum((0, 1))
    torch.testing.assert_close(logdet, dense)
    torch.testing.assert_close(step.inverse(out), x)
    xr = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t, a_, lb: step.forward.__func__(_With(a_, lb), t), (xr, step.a, step.log_b))


class _With:
    """Stand-in module holding given (a, log_b) so that gradcheck differentiates with respect to them."""

    def __init__(self, a, log_b):
        self.a, self.log_b = a, log_b


def test_conditional_per_point_matches_shared_conditional():
    x, _ = _toy(n=6)
    layer = GPLayer(x[:4].clone(), 3, mean_weight=torch.randn(2, 3, dtype=DT, generator=torch.Generator().manual_seed(1)))
    v = torch.randn(2, 3, 4, dtype=DT, generator=torch.Generator().manual_seed(2))  # [S, D_out, M]
    ref_mean, ref_var = layer.conditional(x.expand(2, 6, 2), v)
    cols = v.permute(1, 2, 0).unsqueeze(-1).expand(3, 4, 2, 6).reshape(3, 4, 12)  # sample-major columns
    for inputs in (x, x.expand(2, 6, 2)):
        mean, var = layer.conditional_per_point(inputs, cols)
        torch.testing.assert_close(mean, ref_mean)
        torch.testing.assert_close(var, ref_var)
    with pytest.raises(ValueError, match="draws"):
        layer.conditional_per_point(x, cols[..., :7])
    with pytest.raises(ValueError, match="v must have shape"):
        layer.conditional_per_point(x, cols[:2])


def test_warm_start_and_bad_arguments():
    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1)
    _perturb_gaussian_q(dsvi)
    flow = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf")
    warm_start_from_gaussian(flow, dsvi)
    for a, b in zip(dsvi.layers.parameters(), flow.layers.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert flow.layers[0].gp.q_sqrt.requires_grad  # the base is trained with the flow
    with pytest.raises(ValueError, match="Gaussian-base"):
        warm_start_from_gaussian(build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf-paper"),
                                 dsvi)
    with pytest.raises(ValueError, match="gaussian_model"):
        warm_start_from_gaussian(flow, flow)
    with pytest.raises(ValueError, match="layers"):
        warm_start_from_gaussian(build_deep_gp(x, 1, 3, num_inducing=5, kmeans_restarts=1, posterior="cnf"), dsvi)
    with pytest.raises(ValueError, match="draws"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", draws="each")
    with pytest.raises(ValueError, match="coupled"):  # the coupling needs DSVI's Gaussian base
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf-paper", draws="coupled")
    with pytest.raises(ValueError, match="elementwise"):
        build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf", flow_elementwise="pixel")


def test_flow_posterior_beats_dsvi_where_the_posterior_is_skewed():
    x, y, make = skewed_step_toy()
    evaluate = lambda m: _mc_mean(lambda g: m.elbo(x, y, num_samples=100, generator=g), 2, seed=11)[0]  # noqa: E731
    dsvi = make(flow=False)
    train(dsvi, x, y, epochs=150, lr=0.1, seed=0, verbose=False)
    flow = warm_start_from_gaussian(make(flow=True), dsvi)
    assert abs(evaluate(flow) - evaluate(dsvi)) < 0.15  # the warm-started flow is the DSVI posterior
    train(flow, x, y, epochs=120, lr=0.03, seed=1, verbose=False)
    train(dsvi, x, y, epochs=120, lr=0.02, seed=1, verbose=False)  # DSVI gets the same extra steps
    dsvi_elbo, flow_elbo = evaluate(dsvi), evaluate(flow)
    # measured (benchmarks/studies/cnf_dgp_toy.py, same sizes): DSVI -6.68, flow -5.60 nats
    assert flow_elbo > dsvi_elbo + 0.5


def test_regressor_warm_start_trains_dsvi_then_the_flow_and_refuses_bad_values():
    import numpy as np

    from flowgp import DeepGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(40, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(40)
    est = DeepGPRegressor(layers=2, posterior="cnf", dsvi_warmup=0.5, num_inducing=6, epochs=20, lr=0.03,
                          num_samples_predict=5, kmeans_restarts=1, verbose=False).fit(X, y)
    assert len(est.history_) == 20 and np.isfinite(est.history_).all()  # 10 DSVI epochs, then 10 flow epochs
    assert isinstance(est.model_.posterior, GaussianConvolutionalFlowPosterior)
    assert np.isfinite(est.predict(X[:3])).all()
    with pytest.raises(ValueError, match="dsvi_warmup"):
        DeepGPRegressor(posterior="cnf", dsvi_warmup=1.0).fit(X, y)
    with pytest.raises(ValueError, match="dsvi_warmup"):
        DeepGPRegressor(posterior="cnf-paper", dsvi_warmup=0.5).fit(X, y)
    with pytest.raises(ValueError, match="draws"):
        DeepGPRegressor(posterior="cnf", draws="each").fit(X, y)
    # the fine-tuning set-up the measurements favour: DSVI first, then the flow with coupled draws
    coupled = DeepGPRegressor(layers=2, posterior="cnf", dsvi_warmup=0.5, draws="coupled", num_inducing=6, epochs=20,
                              lr=0.03, num_samples_predict=5, kmeans_restarts=1, verbose=False).fit(X, y)
    assert coupled.model_.draws == "coupled" and np.isfinite(coupled.history_).all()
    assert np.isfinite(coupled.elbo(X, y))


def test_regressor_flow_posterior_never_ends_below_the_dsvi_fit():
    """The invariant through the estimator: with base_gradient="dsvi" the fitted cnf model is the DSVI fit plus a
    flow kept only where it raises the training bound, so its ELBO is at or above the DSVI estimator's (same seed,
    same data, the same evaluation draws for the shared part)."""
    import numpy as np

    from flowgp import DeepGPRegressor

    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(60, 2))
    y = np.sign(X[:, 0]) * np.abs(X[:, 0]) ** 0.5 + 0.1 * rng.standard_normal(60)
    common = dict(layers=2, num_inducing=8, epochs=30, batch_size=20, lr=0.03, num_samples_predict=5,
                  kmeans_restarts=1, verbose=False, seed=5)
    dsvi = DeepGPRegressor(**common).fit(X, y)
    flow = DeepGPRegressor(posterior="cnf", draws="coupled", base_gradient="dsvi", **common).fit(X, y)
    scores = flow.flow_strength_
    kept = scores if scores["source"] == "trained" else scores[scores["source"]]
    assert kept[scores["selected"]] >= scores[0.0] and set(scores["averaged"]) == {0.0, 0.125, 0.25, 0.5, 1.0}
    for a, b in zip(dsvi.model_.layers.parameters(), flow.model_.layers.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the base is the DSVI fit, bit for bit
    assert flow.elbo(X, y) >= dsvi.elbo(X, y) - 1e-9 * abs(dsvi.elbo(X, y))
    with pytest.raises(ValueError, match="base_gradient"):
        DeepGPRegressor(posterior="cnf", draws="per-point", base_gradient="dsvi").fit(X, y)  # needs coupled draws
    with pytest.raises(TypeError, match="flow_selection"):
        DeepGPRegressor(posterior="cnf", flow_selection="yes").fit(X, y)
    with pytest.raises(ValueError, match="flow_lr_scale"):
        DeepGPRegressor(posterior="cnf", flow_lr_scale=0).fit(X, y)
    # the flow steps train at flow_lr_scale x lr in a group of their own, the rest at lr
    opt = flow._optimizer()([p for p in flow.model_.parameters() if p.requires_grad])
    flow_ids = {id(p) for p in flow.model_.posterior.parameters()}
    assert sorted(g["lr"] for g in opt.param_groups) == [0.03 * 0.1, 0.03]
    assert all((id(p) in flow_ids) == (g["lr"] < 0.03) for g in opt.param_groups for p in g["params"])


def test_coupled_evaluation_in_chunks_uses_dsvis_random_numbers(monkeypatch):
    """Without gradients a many-sample bound is evaluated in chunks of samples; the chain noise is still drawn in
    DSVI's order, so at the identity flow the estimate is the DSVI model's for the same generator state (not
    only equal in expectation)."""
    import flowgp.models.deep_gp as deep_gp

    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1)
    _perturb_gaussian_q(dsvi)
    flow = warm_start_from_gaussian(build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf"), dsvi)
    monkeypatch.setattr(deep_gp, "_EVAL_CHUNK_ELEMENTS", 24 * 30 * 3)  # 3 samples per chunk
    with torch.no_grad():
        d = dsvi.elbo(x, y, num_samples=10, generator=torch.Generator().manual_seed(8))
        f = flow.elbo(x, y, num_samples=10, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(f, d, rtol=1e-12, atol=1e-10)


def test_identity_flow_predicts_through_dsvis_marginals():
    """A flow kept at strength 0 is exactly its Gaussian base: its predictions then integrate U per layer as DSVI
    does (the same distribution, the lower-variance estimator), so they equal the DSVI model's for the same
    generator state; any non-zero flow parameter switches back to sampling U."""
    x, y = _toy()
    dsvi = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1)
    _perturb_gaussian_q(dsvi)
    flow = warm_start_from_gaussian(build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf"), dsvi)
    assert flow.posterior.is_identity()
    with torch.no_grad():
        d = dsvi.log_predictive_density(x, y, num_samples=20, generator=torch.Generator().manual_seed(3))
        f = flow.log_predictive_density(x, y, num_samples=20, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(f, d, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(flow.predict(x, 20, torch.Generator().manual_seed(4)),
                                   dsvi.predict(x, 20, torch.Generator().manual_seed(4)), rtol=1e-12, atol=1e-12)
        flow.posterior.elementwise[0].a[0, 0, 0] = 1e-3
    assert not flow.posterior.is_identity()
    assert flow.sample_inducing(3, torch.Generator().manual_seed(0))[0] is not None


@pytest.mark.parametrize("common_noise", [False, True])
def test_control_variate_predictive_is_unbiased_and_less_noisy(common_noise):
    """A flow away from the identity predicts with the signed control variate of `predict_components`: DSVI's
    components under the base, plus the flow's conditionals on coupled draws, minus the base's on the same draws.
    Its predictive density and moments agree in expectation with plain sampling of q(U) (both unbiased for the
    density), with less noise near the identity."""
    x, y = _toy(n=12)
    dsvi = build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1)
    _perturb_gaussian_q(dsvi)
    flow = warm_start_from_gaussian(build_deep_gp(x, 1, 2, num_inducing=5, kmeans_restarts=1, posterior="cnf"), dsvi)
    _perturb(flow.posterior.parameters(), 0.05, seed=9)
    reps, s = 300, 4
    with torch.no_grad():
        cv = torch.stack([flow.log_predictive_density(x, y, s, torch.Generator().manual_seed(r), common_noise).exp()
                          for r in range(reps)])
        vs_moments = []
        plain = []
        for r in range(reps):
            g = torch.Generator().manual_seed(10_000 + r)
            vs, _ = flow.posterior.sample(s, flow.layers, generator=g)
            _, mean, var = flow.propagate(x, s, g, vs)[-1]
            lpd = flow.likelihood.predictive_log_density(y, mean, var, flow.predict_quadrature_points)
            plain.append((torch.logsumexp(lpd, 0) - math.log(s)).exp())
            vs_moments.append(mean.mean(0))
        plain = torch.stack(plain)
        cv_mean = torch.stack([flow.predict(x, s, torch.Generator().manual_seed(r), common_noise)[0]
                               for r in range(reps)])
    se = torch.sqrt(cv.var(0) / reps + plain.var(0) / reps)
    assert ((cv.mean(0) - plain.mean(0)).abs() < 5 * se + 1e-12).all()
    assert cv.var(0).mean() < 0.5 * plain.var(0).mean()  # near the identity the control variate is much quieter
    m_se = torch.sqrt(cv_mean.var(0) / reps + torch.stack(vs_moments).var(0) / reps)
    assert ((cv_mean.mean(0) - torch.stack(vs_moments).mean(0)).abs() < 5 * m_se + 1e-12).all()


def test_selection_keeps_a_flow_only_if_its_gain_replicates_on_fresh_draws():
    """The best of several noisy estimates is biased upward: `select_flow_strength` scores its winner again against
    λ = 0 with fresh random numbers and keeps the flow only if it still wins there. Small random flows around a
    trained DSVI base (fixed seeds): every kept flow beat λ = 0 on the confirmation draws, and at least one winner
    of the first stage was sent back to the identity."""
    from flowgp.models.deep_gp import select_flow_strength

    x, y = _toy(n=40)
    flow = build_deep_gp(x, 1, 2, num_inducing=6, kmeans_restarts=1, posterior="cnf", draws="coupled",
                         base_gradient="dsvi")
    train(flow, x, y, epochs=15, batch_size=20, lr=0.03, seed=4, verbose=False)
    rejected = 0
    for s in range(12):
        values = [0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + s), dtype=p.dtype)
                  for p in flow.posterior.parameters()]
        with torch.no_grad():
            for p, v in zip(flow.posterior.parameters(), values):
                p.copy_(v)
        first = select_flow_strength(flow, x, y, num_samples=4, seed=s, confirm=False)
        with torch.no_grad():
            for p, v in zip(flow.posterior.parameters(), values):
                p.copy_(v)
        out = select_flow_strength(flow, x, y, num_samples=4, seed=s)
        if out["selected"] > 0:
            assert out["confirmation"][out["selected"]] > out["confirmation"][0.0]
            assert out["selected"] == first["selected"]
        elif first["selected"] > 0:
            rejected += 1
            assert out["confirmation"][first["selected"]] <= out["confirmation"][0.0]
            assert all(float(p.abs().max()) == 0.0 for p in flow.posterior.parameters())  # the DSVI posterior
    assert rejected >= 1
