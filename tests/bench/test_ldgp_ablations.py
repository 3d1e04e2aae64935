"""flowgp.bench.ldgp_ablations: the hidden-layer draws the studies compare with flowgp's joint draw (the pathwise
map draws the same law; the DREG authors' per-slot draw is independent over K and lifts the per-point term above
the bound), an estimator whose fit gets a trained state and the per-slot draw, and the recursion of GPflow 1's
jittered natural-gradient step."""
import math

import numpy as np
import pytest
import torch

from flowgp.bench import ldgp_ablations as ab
from flowgp.estimators.latent import LatentDeepGPRegressor
from flowgp.models.latent.model import build_latent_deep_gp
from flowgp.training.natural_gradients import natural_gradient_step


# ----- the pathwise map ---------------------------------------------------------------------------------------
def test_pathwise_map_draws_the_law_of_the_cholesky_draw():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, dtype=torch.float64, generator=gen)
    model = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=8, kmeans_restarts=1, hidden_layer="pca",
                                 hidden_q_var_init=0.3, seed=0)
    layer, draws, k = model.layers[0], 20000, 4
    z = torch.tensor([[-0.3], [-0.2], [0.4], [1.5]], dtype=torch.float64)
    h = torch.cat([x[:1].expand(k, 1), z], 1).expand(draws, k, 2)
    with torch.no_grad():
        ref = model.joint_hidden_sample(layer, h, torch.Generator().manual_seed(1))  # [T, K, L]
        path = ab.pathwise_hidden_sample(model, layer, h, torch.Generator().manual_seed(2))
    for out in range(ref.shape[-1]):
        a, b = ref[..., out], path[..., out]
        sd = a.std(0)
        assert torch.all((a.mean(0) - b.mean(0)).abs() < 5 * math.sqrt(2) * sd / math.sqrt(draws)), out
        cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
        se = ((sd[:, None] * sd[None]).square() + cov_a.square()).sqrt() * math.sqrt(2 / draws)
        assert torch.all((cov_a - cov_b).abs() < 5 * se), (out, cov_a - cov_b, se)
    assert (ref.std(0) > 0.1).all()  # a non-trivial spread, so the comparison can fail


def test_pathwise_map_refuses_what_it_does_not_draw():
    x = torch.randn(20, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=6, kmeans_restarts=1, hidden_layer="pca", seed=0)
    h = torch.zeros(3, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="REG"):
        ab.pathwise_hidden_sample(model, model.layers[0], h, parts={})


# ----- the DREG authors' per-slot draw ------------------------------------------------------------------------
def test_per_slot_draws_are_independent_over_k_where_the_joint_draw_is_one_function():
    """Five slots at the same input (x, z): the joint draw gives five equal values (one function at one input),
    the per-slot draw five independent ones with the same marginal mean and variance."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, dtype=torch.float64, generator=gen)
    model = build_latent_deep_gp(x, torch.sin(x[:, :1]), 2, num_inducing=8, kmeans_restarts=1, seed=0)
    with torch.no_grad():  # a q(u) of the hidden layer far from its 1e-10 start, so the draw has spread
        gp = model.layers[0].gp
        gp.q_sqrt.copy_(0.5 * torch.eye(gp.q_sqrt.shape[-1], dtype=torch.float64).expand_as(gp.q_sqrt))
    h = torch.cat([x[:1], torch.zeros(1, 1, dtype=torch.float64)], 1).expand(4000, 5, 3)  # [T, K, D + Q]
    layer = model.layers[0]
    with torch.no_grad():
        joint = model.joint_hidden_sample(layer, h, torch.Generator().manual_seed(1))
        per_slot = ab.per_slot_hidden_sample(model, layer, h, torch.Generator().manual_seed(1))
    # slot 0 against slot 3, first output
    corr_joint = np.corrcoef(joint[:, 0, 0].numpy(), joint[:, 3, 0].numpy())[0, 1]
    corr_slot = np.corrcoef(per_slot[:, 0, 0].numpy(), per_slot[:, 3, 0].numpy())[0, 1]
    assert corr_joint > 0.99
    assert abs(corr_slot) < 0.06
    assert torch.allclose(joint.mean(0), per_slot.mean(0), atol=0.06)
    assert torch.allclose(joint.var(0), per_slot.var(0), rtol=0.1)
    with pytest.raises(ValueError, match="per-slot draws"):
        ab.per_slot_hidden_sample(model, layer, h, batch_rows=(5, 10))


def test_estimator_with_changes_only_the_models_training_draw_and_loads_a_state():
    x = np.random.default_rng(0).normal(size=(40, 2))
    y = np.sin(x[:, 0])
    est = LatentDeepGPRegressor(num_inducing=6, epochs=1, batch_size=20, num_samples_predict=50, seed=0,
                                gradient="reg")
    est.fit(x, y)
    altered = ab.estimator_with(est, state=est.model_.state_dict(), per_slot=True)
    assert isinstance(altered, LatentDeepGPRegressor) and altered.get_params() == est.get_params()
    altered.set_params(epochs=1, lr=1e-12, natgrad=False)  # a step that changes nothing: the loaded state stays
    altered.fit(x, y)
    for name, value in est.model_.state_dict().items():
        assert torch.allclose(altered.model_.state_dict()[name], value, atol=1e-9), name
    assert altered.model_.joint_hidden_sample.__func__ is ab.per_slot_hidden_sample
    assert "joint_hidden_sample" not in vars(est.model_)  # the original estimator's model is untouched
    np.testing.assert_allclose(altered.log_predictive_density(x[:5], y[:5]), est.log_predictive_density(x[:5], y[:5]),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="per-slot draws: REG"):  # DREG needs the joint draw's pieces
        ab.estimator_with(est.set_params(gradient="dreg"), per_slot=True).fit(x, y)


# ----- the per-point terms under either draw ------------------------------------------------------------------
@pytest.fixture
def model_and_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, dtype=torch.float64, generator=gen)
    y = torch.sin(2 * x[:, :1])
    model = build_latent_deep_gp(x, y, 2, num_inducing=6, kmeans_restarts=1, seed=0, noise=0.1)
    with torch.no_grad():  # a hidden q(u) with spread, so the two draws differ
        gp = model.layers[0].gp
        gp.q_sqrt.copy_(0.7 * torch.eye(gp.q_sqrt.shape[-1], dtype=torch.float64).expand_as(gp.q_sqrt))
    return model, x, y


def test_the_joint_term_is_the_models_own_and_the_model_keeps_its_joint_draw(model_and_data):
    model, x, y = model_and_data
    joint = ab.per_point_terms(model, x, y, 5, False, 3, torch.Generator().manual_seed(4), chunk=5)
    g = torch.Generator().manual_seed(4)  # one stream through the chunks, as per_point_terms draws them
    with torch.no_grad():
        own = torch.cat([model.iw_terms(x[i:i + 5], y[i:i + 5], 5, "reg", 3, generator=g).mean(0)
                         for i in range(0, 12, 5)])
    torch.testing.assert_close(joint, own)
    ab.per_point_terms(model, x, y, 5, True, 3, torch.Generator().manual_seed(4))
    assert "joint_hidden_sample" not in vars(model)  # the per-slot draw was on this call only


def test_per_slot_and_joint_agree_at_k1_and_the_per_slot_term_exceeds_the_bound_at_larger_k(model_and_data):
    """K = 1: one slot, so both draws have the same law (the plain ELBO's term). K = 20: the per-slot term
    averages over function draws inside the log, and sits above the joint-draw bound at every point."""
    model, x, y = model_and_data
    g = torch.Generator().manual_seed(1)
    one_joint = ab.per_point_terms(model, x, y, 1, False, 4000, g)
    one_slot = ab.per_point_terms(model, x, y, 1, True, 4000, g)
    assert (one_slot - one_joint).abs().mean() < 0.06
    many_joint = ab.per_point_terms(model, x, y, 20, False, 400, g)
    many_slot = ab.per_point_terms(model, x, y, 20, True, 400, g)
    assert (many_slot - many_joint).mean() > 0.15
    assert (many_slot > many_joint).all()


# ----- GPflow 1's jittered natural-gradient step --------------------------------------------------------------
def test_recursion_follows_flowgps_natural_gradient_step_with_the_jitter_added():
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
    s_ref, ratio_ref = ab.jittered_natgrad(s_star.numpy(), steps, gamma=gamma, decay=1.0, jitter=eps)
    np.testing.assert_allclose(torch.diagonal(r @ r.mT, dim1=-2, dim2=-1)[0].numpy(), s_ref, rtol=1e-6)
    np.testing.assert_allclose(m[0].numpy(), ratio_ref * m_star.numpy(), rtol=1e-6, atol=1e-12)


def test_constant_step_reaches_the_closed_form_fixed_point_and_no_jitter_reaches_the_optimum():
    s_star = np.array([7e-6, 1e-4, 5e-3, 0.5])
    s, ratio = ab.jittered_natgrad(s_star, 4000, gamma=0.01, decay=1.0)
    np.testing.assert_allclose(s, ab.jittered_natgrad_fixed_point(s_star, 0.01), rtol=1e-6)
    np.testing.assert_allclose(ratio, 1.0, atol=0.02)  # the mean stays at m* (module docstring)
    s0, ratio0 = ab.jittered_natgrad(s_star, 4000, gamma=0.01, decay=1.0, jitter=0.0)
    np.testing.assert_allclose(s0, s_star, rtol=1e-9)
    np.testing.assert_allclose(ratio0, 1.0, rtol=1e-9)
    # annealing γ lets the small eigenvalues grow: the reason the study exists
    late, _ = ab.jittered_natgrad(s_star[:1], 300016)
    assert late[0] > 50 * s_star[0]


def test_jittered_state_moves_only_the_last_layers_q_u():
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(1, 4, 4, dtype=torch.float64, generator=gen).tril() * 0.01 + 0.001 * torch.eye(4, dtype=torch.float64)
    state = {"layers.1.gp.q_sqrt": r, "layers.1.gp.q_mu": torch.randn(1, 4, dtype=torch.float64, generator=gen),
             "likelihood.raw_noise": torch.tensor(0.3)}
    new, growth = ab.jittered_state(state, 300016)
    assert new["likelihood.raw_noise"] is state["likelihood.raw_noise"]
    old_eig = torch.linalg.eigvalsh(r @ r.mT)
    new_eig = torch.linalg.eigvalsh(new["layers.1.gp.q_sqrt"] @ new["layers.1.gp.q_sqrt"].mT)
    np.testing.assert_allclose(np.sort(new_eig.flatten().numpy()), np.sort((old_eig.flatten().numpy() * growth)),
                               rtol=1e-6)
    assert growth.min() > 1.0
    with pytest.raises(ValueError, match="s_star must be positive"):
        ab.jittered_natgrad([0.0], 1)


def test_hidden_draw_swaps_one_instances_draw_for_a_with_block_only():
    x = torch.randn(20, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=6, kmeans_restarts=1, seed=0)
    other = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=6, kmeans_restarts=1, seed=0)
    with ab.hidden_draw(model, ab.per_slot_hidden_sample):
        assert model.joint_hidden_sample.__func__ is ab.per_slot_hidden_sample
        assert "joint_hidden_sample" not in vars(other)
    assert "joint_hidden_sample" not in vars(model)
    assert ab.use_hidden_draw(model, ab.pathwise_hidden_sample) is model
    ab.use_hidden_draw(model, None)
    assert "joint_hidden_sample" not in vars(model)
