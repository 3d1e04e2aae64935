"""The latent deep GP's per-slot objective (the DREG authors' published training objective, not a bound).

It must equal a per-slot estimator written here from the model's parts on the same draws, never be reported as a
bound, leave the default objective (the importance-weighted bound with joint draws) exactly as it was, and refuse
unknown names.
"""
import math

import numpy as np
import pytest
import torch

from flowgp.bench.models import make_estimator, model_names
from flowgp.bench.presets import get_preset
from flowgp.bench.runner import fit_and_score
from flowgp.estimators.latent import LatentDeepGPRegressor
from flowgp.models.latent.model import OBJECTIVES, LatentDeepGP, build_latent_deep_gp
from flowgp.data.synthetic import make_multimodal_demo

K, S, N_DATA = 4, 3, 100


def _data(n=30, seed=0):
    x, y, _ = make_multimodal_demo(n, seed=seed)
    x = torch.tensor((x - x.mean()) / x.std())
    y = torch.tensor((y - y.mean()) / y.std())[:, None]
    return torch.cat([x, torch.sin(2.0 * x)], 1), y  # two input columns


def _model(hidden_layer="pca", layers=2, objective="per-slot", **kwargs):
    x, y = _data()
    # q(u) wide enough that the hidden draws spread (the defaults start the hidden layers nearly certain)
    model = build_latent_deep_gp(x, y, layers, num_inducing=7, kmeans_restarts=1, seed=0, hidden_layer=hidden_layer,
                                 q_var_init=0.5, hidden_q_var_init=0.2, objective=objective, **kwargs)
    return model, x, y


def _marginals(gp, h):
    """q(f(h)) of a whitened sparse GP from its parts: mean Aᵀm (+ mean function), var k(h, h) - |A|² + |RᵀA|²,
    A = Lz⁻¹ K_Zh; each [..., L]."""
    flat = h.reshape(-1, h.shape[-1])
    kzx = gp.kernel(gp.inducing_points, flat.unsqueeze(-3))  # [Lb, M, P]
    a = torch.linalg.solve_triangular(gp.kzz_cholesky(), kzx, upper=False)
    mean = (gp.q_mu.unsqueeze(-1) * a).sum(-2).mT  # [P, L]
    var = gp.kernel.diag(flat.unsqueeze(-3)) - a.square().sum(-2) + (gp.q_sqrt_tril().mT @ a).square().sum(-2)
    if gp.mean_function is not None:
        mean = mean + gp.mean_function(flat)
    return mean.reshape(h.shape[:-1] + (-1,)), var.mT.clamp_min(1e-12).reshape(h.shape[:-1] + (-1,))


def _per_slot_reference(model, x, y, generator, detach_q=False):
    """(N/B) Σ_n mean_s log (1/K) Σ_k w_{n,k} - Σ KL with every hidden layer drawn per slot, written out: z_k =
    μ + σ ε_k, each slot's hidden values f_k = mean + sd·ε from their own marginal (then the concat layer's fixed
    projections), the last layer's Gaussian expectation in closed form. Draws in the model's order: ε of z
    [S, K, B, Q], then each hidden layer's ε [S, K, B, outputs]. Returns (value, log w [S, K, B], z)."""
    mean_z, std_z = model.qz(x, y, None)
    b, q = x.shape[0], mean_z.shape[-1]
    z = mean_z + std_z * torch.randn((S, K, b, q), dtype=x.dtype, generator=generator)
    h = torch.cat([x.expand(S, K, b, x.shape[-1]), z], -1)
    for layer in model.layers[:-1]:
        f_mean, f_var = _marginals(layer.gp, h)
        g = f_mean + f_var.sqrt() * torch.randn(f_mean.shape, dtype=x.dtype, generator=generator)
        h = h @ layer.passthrough + g @ layer.mixing if hasattr(layer, "mixing") else g
    f_mean, f_var = _marginals(model.layers[-1].gp, h)
    noise = model.likelihood.noise
    ell = (-0.5 * torch.log(2 * math.pi * noise) - ((y - f_mean).square() + f_var) / (2 * noise)).sum(-1)
    mu, sd = (mean_z.detach(), std_z.detach()) if detach_q else (mean_z, std_z)
    log_prior = (-0.5 * z.square() - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_q = (-0.5 * ((z - mu) / sd).square() - sd.log() - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_w = ell + log_prior - log_q  # [S, K, B]
    terms = torch.logsumexp(log_w, 1) - math.log(K)
    return N_DATA / b * terms.mean(0).sum() - model.kl_divergence(), log_w, z


def _encoder_grads(model, value):
    model.zero_grad()
    value.backward()
    return [p.grad.clone() for p in model.qz.parameters()]


@pytest.mark.parametrize("hidden_layer,layers", [("pca", 2), ("concat", 2), ("pca", 3)])
def test_per_slot_objective_equals_a_direct_per_slot_estimator_with_its_reg_and_d23_gradients(hidden_layer, layers):
    model, x, y = _model(hidden_layer, layers)
    value = model.per_slot_objective(x, y, num_data=N_DATA, num_importance=K, gradient="reg", num_samples=S,
                                     generator=torch.Generator().manual_seed(5))
    reference, _, _ = _per_slot_reference(model, x, y, torch.Generator().manual_seed(5))
    torch.testing.assert_close(value, reference, rtol=1e-10, atol=1e-9)
    # the per-slot draws are not the joint ones: on the same generator the bound is another number, and lower
    bound = model.elbo(x, y, num_data=N_DATA, num_importance=K, num_samples=S,
                       generator=torch.Generator().manual_seed(5))
    assert value.item() > bound.item()
    # REG: plain autograd of the same value
    model_grads = _encoder_grads(model, value)
    reference_grads = _encoder_grads(model, _per_slot_reference(model, x, y, torch.Generator().manual_seed(5))[0])
    for got, want in zip(model_grads, reference_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
    # DREG: per slot log w_k depends on z_k alone, so every DREG name is eq. D.23, Σ_k sg(w̃_k²) ∇ log w_k with
    # log q at fixed parameters (the authors' code), summed over points and samples with the objective's weights
    _, log_w, _ = _per_slot_reference(model, x, y, torch.Generator().manual_seed(5), detach_q=True)
    weights = torch.softmax(log_w.detach(), 1)
    d23 = _encoder_grads(model, N_DATA / x.shape[0] / S * (weights.square() * log_w).sum())
    for gradient in ("dreg", "dreg-eps", "dreg-d23"):
        dreg_value = model.per_slot_objective(x, y, num_data=N_DATA, num_importance=K, gradient=gradient,
                                              num_samples=S, generator=torch.Generator().manual_seed(5))
        torch.testing.assert_close(dreg_value, reference, rtol=1e-10, atol=1e-9)
        for got, want in zip(_encoder_grads(model, dreg_value), d23):
            torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_per_slot_draws_slice_a_split_batch_like_one_process():
    model, x, y = _model("concat")
    with torch.no_grad():
        whole = model.iw_terms(x, y, K, num_samples=S, generator=torch.Generator().manual_seed(2), per_slot=True)
        parts = [model.iw_terms(x[a:b], y[a:b], K, num_samples=S, generator=torch.Generator().manual_seed(2),
                                per_slot=True, batch_rows=(a, x.shape[0])) for a, b in ((0, 11), (11, x.shape[0]))]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-12, atol=1e-12)


def test_training_objective_follows_the_models_objective_and_elbo_stays_the_bound():
    per_slot, x, y = _model(objective="per-slot")
    bound, _, _ = _model(objective="bound")

    def at(method):
        return method(x, y, num_data=N_DATA, num_importance=K, generator=torch.Generator().manual_seed(1))

    with torch.no_grad():
        assert torch.equal(at(per_slot.training_objective), at(per_slot.per_slot_objective))
        assert torch.equal(at(per_slot.elbo), at(bound.elbo))  # the same parameters: elbo is the bound for both
        assert torch.equal(at(bound.training_objective), at(bound.elbo))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_fit_trains_the_objective_it_names(objective, monkeypatch):
    """Every training step of the estimator evaluates the chosen objective (the loop calls `training_objective`),
    and the per-slot fit never evaluates the bound while it trains."""
    calls = {"elbo": 0, "per_slot_objective": 0}
    for name in calls:
        original = getattr(LatentDeepGP, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LatentDeepGP, name, counted)
    x, y = _data()
    est = LatentDeepGPRegressor(num_inducing=5, epochs=3, batch_size=10, num_samples_predict=20, seed=0,
                                verbose=False, objective=objective).fit(x.numpy(), y[:, 0].numpy())
    steps = 3 * 3  # epochs × ceil(30 rows / batch of 10)
    assert len(est.history_) == steps
    trained, other = ("elbo", "per_slot_objective") if objective == "bound" else ("per_slot_objective", "elbo")
    assert calls == {trained: steps, other: 0}


def test_default_objective_is_the_bound_bit_for_bit():
    """The model and estimator built without `objective` train and report exactly what objective="bound" does
    (and what they did before the option existed: L_K with joint draws through `elbo`)."""
    default, x, y = _model(hidden_layer="concat", objective="bound")
    x0, y0 = _data()
    implicit = build_latent_deep_gp(x0, y0, 2, num_inducing=7, kmeans_restarts=1, seed=0, hidden_layer="concat",
                                    q_var_init=0.5, hidden_q_var_init=0.2)
    assert implicit.objective == "bound" and LatentDeepGP.__init__.__defaults__[-1] == "bound"
    for gradient in ("reg", "dreg"):
        values = []
        for model in (default, implicit):
            value = model.training_objective(x, y, num_data=N_DATA, num_importance=K, gradient=gradient,
                                             generator=torch.Generator().manual_seed(3))
            values.append((value.detach(), _encoder_grads(model, value)))
        assert torch.equal(values[0][0], values[1][0])
        assert all(torch.equal(a, b) for a, b in zip(values[0][1], values[1][1]))
    xn, yn = x.numpy(), y[:, 0].numpy()
    fits = [LatentDeepGPRegressor(num_inducing=6, epochs=2, batch_size=10, num_samples_predict=20, seed=0,
                                  verbose=False, **extra).fit(xn, yn) for extra in ({}, {"objective": "bound"})]
    assert [float(h) for h in fits[0].history_] == [float(h) for h in fits[1].history_]
    assert fits[0].elbo(xn, yn) == fits[1].elbo(xn, yn) == fits[0].training_objective(xn, yn)


def test_a_per_slot_fit_reports_an_objective_never_a_bound(capsys):
    x, y, _ = make_multimodal_demo(40, seed=1)
    x = np.concatenate([x, np.sin(x)], 1)
    split = type("Split", (), {"x_train": x[:30], "y_train": y[:30], "x_test": x[30:], "y_test": y[30:]})()
    est = make_estimator("ldgp2-reg-per-slot", get_preset("tiny"), 5, 0, 30)
    assert (est.objective, est.gradient, est.layers) == ("per-slot", "reg", 2)
    est.set_params(verbose=True, num_samples_predict=20)
    row = fit_and_score(est, split)
    assert row["objective"] == "per-slot"
    assert row["train_objective"] == est.training_objective(split.x_train, split.y_train)
    assert not [key for key in row if "elbo" in key or "bound" in key]
    # the progress bar names the objective and never calls it a bound
    err = capsys.readouterr().err
    assert "per-slot objective" in err and "bound" not in err.lower() and "elbo" not in err.lower()
    bound_est = make_estimator("ldgp2-reg", get_preset("tiny"), 5, 0, 30)
    bound_row = fit_and_score(bound_est, split)
    assert "train_elbo" in bound_row and "objective" not in bound_row and "train_objective" not in bound_row


def test_named_per_slot_models_fix_the_objective():
    names = {f"ldgp{n}-{g}-per-slot" for n in (2, 3, 4) for g in ("reg", "dreg")}
    assert names <= set(model_names()) and "ldgp1-reg-per-slot" not in model_names()
    est = make_estimator("ldgp3-dreg-per-slot", get_preset("reference"), 128, 4, 1000)
    assert (est.layers, est.gradient, est.objective, est.hidden_layer, est.natgrad) == (3, "dreg", "per-slot",
                                                                                        "concat", True)
    assert make_estimator("ldgp2-dreg", get_preset("reference"), 128, 4, 1000).objective == "bound"
    with pytest.raises(TypeError, match="objective"):  # the name fixes it
        from flowgp.registry import MODELS
        MODELS.get("ldgp2-reg-per-slot")(objective="bound")


@pytest.mark.parametrize("bad", ["joint", "per_slot", "elbo", None, 1])
def test_an_unknown_objective_is_a_value_error_naming_the_choices(bad):
    x, y = _data(12)
    match = r"objective must be one of \(?'bound', 'per-slot'\)?"
    assert OBJECTIVES == ("bound", "per-slot")
    with pytest.raises(ValueError, match=match):
        build_latent_deep_gp(x, y, 2, num_inducing=4, kmeans_restarts=1, objective=bad)
    model, _, _ = _model(objective="bound")
    with pytest.raises(ValueError, match=match):
        LatentDeepGP(list(model.layers), model.qz, objective=bad)
    with pytest.raises(ValueError, match=match):  # before any work: nothing is fitted
        est = LatentDeepGPRegressor(objective=bad, verbose=False)
        est.fit(x.numpy(), y[:, 0].numpy())
    assert not hasattr(est, "model_")
