"""AMO-GP: reduction to a sparse GP, lower bound on the exact marginal likelihood, predictions, estimator."""
import math

import numpy as np
import pytest
import torch

from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP
from flowgp.models.amogp.model import AMOGP


def _z(d, m, lo=-2.0, hi=2.0):
    return torch.linspace(lo, hi, m).expand(d, m).clone()


def _set_random_q(ind, gen, scale=0.3):
    with torch.no_grad():
        ind.q_mu.copy_(torch.randn(ind.q_mu.shape, generator=gen))
        ind.q_sqrt.copy_(torch.eye(ind.q_sqrt.shape[-1]) * 0.5 + scale * torch.randn(ind.q_sqrt.shape, generator=gen))


def _svgp_twin(model, noise):
    """A flowgp SVGP with the same kernel (RBF, lengthscale sqrt(2)ℓ), Z, q(u) and noise as a 1-output MO-GP."""
    ls = float(model.kernel.lengthscale[0, 0, 0].detach()) * math.sqrt(2)
    var = float(model.kernel.variance[0, 0].detach())
    svgp = SVGP(make_kernel("rbf", 1, lengthscale=ls, variance=var), model.latent.z[0].detach(),
                GaussianLikelihood(noise=noise))
    with torch.no_grad():
        svgp.gp.q_mu.copy_(model.latent.q_mu)
        svgp.gp.q_sqrt.copy_(model.latent.q_sqrt_tril())
    return svgp


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    return x, y


@pytest.mark.parametrize("cp", ["output", "latent"])
def test_identity_layers_one_output_is_exactly_svgp(float64_default, cp):
    """One output, identity layers: the MO-GP is the sparse GP. With cp_inducing="latent" and ℓ_u = ℓ_d,
    u = f / sqrt(v) at the inducing inputs, so with the same whitened q(v) the bound and predictions are the
    sparse GP's exactly too (the scale of u cancels in L v)."""
    x, y = _data()
    out = torch.zeros(30, dtype=torch.long)
    model = AMOGP(None, _z(1, 7), None, alignment=False, warping=False, lengthscale=0.9, variance=1.3, noise=0.1,
                  cp_inducing=cp, num_outputs=1)
    _set_random_q(model.latent, torch.Generator().manual_seed(1))
    svgp = _svgp_twin(model, 0.1)
    torch.testing.assert_close(model.elbo(x, y, out), svgp.elbo(x, y[:, None]))
    mean, var = model.predict_y(x, out)
    ref_mean, ref_var = svgp.predict(x)
    torch.testing.assert_close(mean, ref_mean[:, 0])
    torch.testing.assert_close(var, ref_var[:, 0])
    lpd = model.log_predictive_density(x, y, out, method="gaussian")
    torch.testing.assert_close(lpd, svgp.log_predictive_density(x, y[:, None])[:, 0])
    if cp == "latent":
        torch.testing.assert_close(model.inducing_lengthscale, model.kernel.lengthscale[0])
        # a smoother u is a different (valid) family: the bound changes
        _move_inducing_lengthscale(model)
        assert abs(model.elbo(x, y, out).item() - svgp.elbo(x, y[:, None]).item()) > 1e-3


def test_latent_inducing_variables_are_well_conditioned(float64_default):
    """One latent, four outputs with their inducing inputs at the same places: per-output sets are nearly
    linearly dependent (scaled copies of one smoothed process), one set on the latent is not."""
    kw = {"alignment": False, "warping": False, "lengthscale": 0.5}
    by_output = AMOGP(None, _z(4, 10), None, **kw)
    on_latent = AMOGP(None, _z(1, 10), None, cp_inducing="latent", num_outputs=4, **kw)
    with torch.no_grad():
        assert torch.linalg.cond(by_output.cp_kuu()[0]) > 1e15
        assert torch.linalg.cond(on_latent.cp_kuu()[0]) < 1e8
        assert on_latent.cp_kuu().shape == (1, 10, 10) and by_output.cp_kuu().shape == (1, 40, 40)


def test_alignment_point_mass_limit_recovers_svgp(float64_default):
    """Alignment GP with q(a) -> δ(x): the bound and predictions converge to the sparse GP's."""
    x, y = _data()
    out = torch.zeros(30, dtype=torch.long)
    ref = AMOGP(None, _z(1, 7), None, alignment=False, warping=False, lengthscale=0.9, noise=0.1)
    _set_random_q(ref.latent, torch.Generator().manual_seed(2))
    target = _svgp_twin(ref, 0.1).elbo(x, y[:, None]).item()
    gaps = []
    for eps in (1e-2, 1e-3, 1e-4):
        model = AMOGP(_z(1, 8), _z(1, 7), None, alignment=True, warping=False, lengthscale=0.9, noise=0.1,
                      alignment_variance=eps ** 2, alignment_noise=eps, alignment_lengthscale=2.0)
        model.latent.load_state_dict(ref.latent.state_dict())
        with torch.no_grad():
            model.align.q_sqrt.copy_(torch.eye(8))  # whitened q(v) = p(v): KL = 0
        bound = model.elbo(x, y, out).item()
        gaps.append(abs(target - bound))
        mean, var = model.predict_y(x, out)
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 1e-2
    ref_mean, ref_var = ref.predict_y(x, out)
    torch.testing.assert_close(mean, ref_mean, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(var, ref_var, atol=1e-3, rtol=1e-3)


def _exact_log_marginal(model, x, y, out, num_samples, gen):
    """log p(y) of the full hierarchy by Monte Carlo over (a, f); y | f is Gaussian (warping GP + noise)."""
    d_count = model.num_outputs
    s = num_samples
    avar, als = model._align_params()
    wvar, wls = model._warp_params()
    a = torch.zeros(s, x.shape[0])
    for d in range(d_count):
        idx = (out == d).nonzero()[:, 0]
        xd = x[idx]
        k = avar[d] * torch.exp(-0.5 * (xd - xd.mT).square() / als[d] ** 2)
        cov = k + model.alignment_noise[d] * torch.eye(len(idx))
        a[:, idx] = xd[:, 0] + (torch.linalg.cholesky(cov) @ torch.randn(s, len(idx), 1, generator=gen))[..., 0]
    kf = model.kernel(a.unsqueeze(-1), out) + torch.diag(model.latent_noise[out])
    f = (torch.linalg.cholesky(kf) @ torch.randn(s, x.shape[0], 1, generator=gen))[..., 0]
    logp = torch.zeros(s)
    for d in range(d_count):
        idx = (out == d).nonzero()[:, 0]
        fd = f[:, idx]
        kg = wvar[d] * torch.exp(-0.5 * (fd.unsqueeze(-1) - fd.unsqueeze(-2)).square() / wls[d] ** 2)
        cov = kg + model.noise[d] * torch.eye(len(idx))
        logp = logp + torch.distributions.MultivariateNormal(fd, cov).log_prob(y[idx])
    lme = torch.logsumexp(logp, 0) - math.log(s)
    w = torch.exp(logp - lme)
    return lme.item(), (w.std() / math.sqrt(s)).item()


@pytest.mark.parametrize("cp", ["output", "latent"])
def test_bound_below_exact_log_marginal_likelihood(float64_default, cp):
    x = torch.tensor([[-1.0], [0.5], [-0.3], [1.2]])
    out = torch.tensor([0, 0, 1, 1])
    y = torch.tensor([0.4, -0.8, 0.9, -0.2])
    zf, kw = _cp_sets(cp, 2, 1, 4)
    model = AMOGP(_z(2, 4), zf, _z(2, 4), lengthscale=1.0, noise=0.05, alignment_variance=0.1,
                  alignment_noise=0.01, warping_variance=0.1, latent_noise=0.01, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(150):
        opt.zero_grad()
        (-model.elbo(x, y, out)).backward()
        opt.step()
    with torch.no_grad():
        bound = model.elbo(x, y, out).item()
        exact, se = _exact_log_marginal(model, x, y, out, 100_000, torch.Generator().manual_seed(0))
    assert bound <= exact + 4 * se
    assert exact - bound < 10.0  # and not vacuous: the optimised bound is within a few nats


def _cp_sets(cp, d, r, m):
    """z_latent and the matching constructor arguments for cp_inducing=cp (one row per output or per latent)."""
    return _z(d if cp == "output" else r, m), {"cp_inducing": cp, "num_outputs": d, "latent_processes": r}


def _move_inducing_lengthscale(model):
    """Latent inducing variables smoother than the outputs' smoothing kernels (not the initial ℓ_u = ℓ_d)."""
    if model.cp_inducing == "latent":
        with torch.no_grad():
            model.raw_inducing_lengthscale.add_(0.4)


@pytest.mark.parametrize("cp", ["output", "latent"])
def test_minibatch_bound_is_unbiased(float64_default, cp):
    x, y = _data(24)
    out = torch.arange(24) % 3
    zf, kw = _cp_sets(cp, 3, 2, 6)
    model = AMOGP(_z(3, 5), zf, _z(3, 5), alignment_variance=0.1, warping_variance=0.1, **kw)
    _set_random_q(model.latent, torch.Generator().manual_seed(3), 0.1)
    _move_inducing_lengthscale(model)
    full = model.elbo(x, y, out)
    perm = torch.randperm(24)
    parts = [model.elbo(x[i], y[i], out[i], num_data=24) for i in perm.split(8)]
    # to rounding: with per-output sets this K_uu is ill-conditioned (|W| up to 2e8, tr(Φ_n W) ≈ 5e8 cancelling to
    # O(1)), and the Ψ₂ contraction's series (flowgp.models.amogp.psi_statistics) is centred on each batch's couplings, so a
    # batch rounds its points differently from the full set: 1 ulp of tr(Φ_n W) is 1e-7 of this bound
    torch.testing.assert_close(torch.stack(parts).mean(), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cp", ["output", "latent"])
def test_propagated_moments_match_hierarchy_samples(float64_default, cp):
    """With warping fixed to the identity the propagated Gaussian has the exact moments of y*."""
    zf, kw = _cp_sets(cp, 2, 2, 6)
    model = AMOGP(_z(2, 5), zf, None, warping=False, alignment_variance=0.2, alignment_noise=0.05,
                  lengthscale=0.8, **kw)
    gen = torch.Generator().manual_seed(4)
    _set_random_q(model.latent, gen)
    _move_inducing_lengthscale(model)
    _set_random_q(model.align, gen)
    x = torch.tensor([[-1.0], [0.3], [1.5]])
    out = torch.tensor([0, 1, 1])
    with torch.no_grad():
        mean, var = model.predict_y(x, out)
        smp = model.sample(x, out, 40_000, generator=gen)
    mc_mean = smp["y_mean"].mean(0)
    se = smp["y_mean"].std(0) / 200
    assert torch.all((mean - mc_mean).abs() < 4.5 * se)
    mc_var = smp["y_var"].mean(0) + smp["y_mean"].var(0)
    torch.testing.assert_close(var, mc_var, rtol=0.05, atol=0.0)


def test_warping_layer_moments_match_monte_carlo(float64_default):
    """Moments of ĝ(f) = f + g̃(f) under a Gaussian q(f) and q(u_g) (identity-mean Ψ-statistics)."""
    g = torch.Generator().manual_seed(6)
    model = AMOGP(_z(2, 4), _z(2, 4), _z(2, 5), warping_variance=0.3)
    _set_random_q(model.warp, g)
    m, v, out = torch.tensor([0.3, -0.5, 1.0]), torch.tensor([0.2, 0.5, 0.1]), torch.tensor([0, 1, 1])
    with torch.no_grad():
        hyp = model._hyper()
        mean, var = model._warping_layer(model._posteriors(hyp)["g"], m, v, out, model._point_values(hyp, out))
        f = m + v.sqrt() * torch.randn(100_000, 3, generator=g)
        _, _, kinv, chol = model._sampling_posteriors()["g"]
        beta = model.warp.sample_beta(chol, 100_000, g)[:, out]
        wv, wl = model._warp_params()
        k = wv[out, None] * torch.exp(-0.5 * (f.unsqueeze(-1) - model.warp.z[out][..., 0]).square() / wl[out, None] ** 2)
        cond = wv[out] - torch.einsum("snm,nmk,snk->sn", k, kinv[out], k)
        gm = f + (k * beta).sum(-1)
    assert torch.all((mean - gm.mean(0)).abs() < 4.5 * gm.std(0) / math.sqrt(100_000))
    torch.testing.assert_close(var, gm.var(0) + cond.mean(0), rtol=0.02, atol=0.0)


def test_full_model_predictions_and_samples_are_consistent(float64_default):
    model = AMOGP(_z(2, 5), _z(2, 6), _z(2, 5), alignment_variance=0.1, warping_variance=0.1)
    x = torch.linspace(-1, 1, 5)[:, None]
    out = torch.tensor([0, 1, 0, 1, 1])
    with torch.no_grad():
        layers = model.predict_layers(x, out)
        smp = model.sample(x, out, 4000, generator=torch.Generator().manual_seed(0))
        lpd = model.log_predictive_density(x, torch.zeros(5), out, num_samples=500)
    assert set(layers) == {"a", "f", "y"}
    assert all(v[0].shape == (5,) and torch.all(v[1] >= 0) for v in layers.values())
    assert smp["g"].shape == (4000, 5) and torch.isfinite(lpd).all()
    # the prior-like model (q(u) ≈ 0): alignment means ≈ identity, warped mean ≈ latent mean
    torch.testing.assert_close(layers["a"][0], x[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(smp["y_mean"].mean(0), layers["y"][0], atol=0.1, rtol=0)


def test_model_bad_input_refused(float64_default):
    model = AMOGP(_z(2, 4), _z(2, 4), _z(2, 4))
    x, y = _data(6)
    with pytest.raises(ValueError, match="0..1"):
        model.elbo(x, y, torch.tensor([0, 1, 2, 0, 1, 0]))
    with pytest.raises(ValueError, match="shape"):
        model.elbo(x, y[:5], torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        model.elbo(x, y, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D inputs"):
        model.elbo(torch.zeros(6, 2), y, torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="z_alignment"):
        AMOGP(_z(3, 4), _z(2, 4), _z(2, 4))
    with pytest.raises(ValueError, match="cp_inducing must be 'output'"):
        AMOGP(_z(2, 4), _z(2, 4), _z(2, 4), cp_inducing="shared")
    with pytest.raises(ValueError, match="num_outputs"):
        AMOGP(_z(2, 4), _z(1, 4), _z(2, 4), cp_inducing="latent")
    with pytest.raises(ValueError, match=r"latent_processes=2"):
        AMOGP(_z(2, 4), _z(1, 4), _z(2, 4), cp_inducing="latent", num_outputs=2, latent_processes=2)
    with pytest.raises(ValueError, match="does not match z_latent"):
        AMOGP(_z(2, 4), _z(2, 4), _z(2, 4), num_outputs=3)
    with pytest.raises(ValueError, match="z_alignment"):
        AMOGP(_z(3, 4), _z(1, 4), _z(2, 4), cp_inducing="latent", num_outputs=2)


# ----- estimator -----------------------------------------------------------------------------------------
def _series(seed=0, gap=False, shift=0.2, freq=1.0, n=40):
    rng = np.random.default_rng(seed)
    xs, ys, os_ = [], [], []
    for d in range(2):
        t = np.sort(rng.uniform(0, 6, n))
        if gap and d == 1:
            t = t[(t < 2) | (t > 4)]
        xs.append(t)
        ys.append((1 + d) * np.sin(freq * t + shift * d) + 0.05 * rng.standard_normal(len(t)) + 3 * d)
        os_.append(np.full(len(t), d))
    return np.concatenate(xs)[:, None], np.concatenate(ys), np.concatenate(os_)


@pytest.mark.parametrize("cp", ["output", "latent"])
def test_estimator_fit_predict_save_load(tmp_path, cp):
    import flowgp
    from flowgp import AlignedMultiOutputGPRegressor

    X, y, o = _series()
    est = AlignedMultiOutputGPRegressor(num_inducing=8, num_inducing_alignment=4, num_inducing_warping=4,
                                        epochs=15, batch_size=None, verbose=False, num_samples=50, cp_inducing=cp)
    est.fit(X, y, o)
    assert est.model_.latent.z.shape[:2] == ((1, 16) if cp == "output" else (1, 8))
    mean, std = est.predict(X[:5], o[:5], return_std=True)
    assert mean.shape == (5,) and np.all(std > 0)
    lo, hi = est.predict_interval(X[:5], o[:5])
    assert np.all(lo < mean) and np.all(mean < hi)
    lo2, hi2 = est.predict_interval(X[:5], o[:5], method="samples")
    assert np.all(lo2 < hi2)
    lpd = est.log_predictive_density(X, y, o)
    assert lpd.shape == (len(y),) and np.isfinite(lpd).all()
    assert np.isfinite(est.score(X, y, o)) and np.isfinite(est.elbo(X, y, o))
    lay = est.layers(np.linspace(0, 6, 7), 1, f_grid=np.linspace(-2, 2, 5))
    assert lay["alignment"][0].shape == (7,) and lay["warping"][1].shape == (5,) and np.all(lay["warping"][1] > 0)
    path = est.save(tmp_path / "amogp.pt")
    for loaded in (AlignedMultiOutputGPRegressor.load(path), flowgp.load(path)):
        np.testing.assert_allclose(loaded.predict(X[:5], o[:5]), mean)
        np.testing.assert_allclose(loaded.log_predictive_density(X, y, o), lpd)


def test_files_saved_before_cp_inducing_load_with_per_output_sets(tmp_path):
    """Files written before `cp_inducing` existed hold per-output CP sets; the default is now "latent"."""
    from flowgp import AlignedMultiOutputGPRegressor
    from flowgp.compat import SavedFileUpgradeWarning
    from flowgp.training.checkpoint import atomic_save, safe_load

    X, y, o = _series()
    est = AlignedMultiOutputGPRegressor(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, epochs=3,
                                        batch_size=None, verbose=False, cp_inducing="output").fit(X, y, o)
    state = safe_load(est.save(tmp_path / "new.pt"))
    del state["params"]["cp_inducing"], state["format_version"]  # a file of format version 1
    atomic_save(state, tmp_path / "old.pt")
    with pytest.warns(SavedFileUpgradeWarning, match="cp_inducing="):
        loaded = AlignedMultiOutputGPRegressor.load(tmp_path / "old.pt")
    assert loaded.cp_inducing == "output" and AlignedMultiOutputGPRegressor().cp_inducing == "latent"
    np.testing.assert_allclose(loaded.predict(X[:5], o[:5]), est.predict(X[:5], o[:5]))


def test_files_saved_before_cp_grid_load_with_trained_inducing_inputs(tmp_path):
    """Files written before `cp_grid` existed trained their CP inducing inputs (no longer a grid): they load with
    cp_grid=False and predict as saved."""
    from flowgp import AlignedMultiOutputGPRegressor
    from flowgp.compat import SavedFileUpgradeWarning
    from flowgp.training.checkpoint import atomic_save, safe_load

    X, y, o = _series()
    est = AlignedMultiOutputGPRegressor(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, epochs=30,
                                        batch_size=None, verbose=False, cp_grid=False).fit(X, y, o)
    z = est.model_.latent.z[0, :, 0]
    assert ((z[1:] - z[:-1]) - (z[1] - z[0])).abs().max() > 1e-6  # trained: no longer evenly spaced
    state = safe_load(est.save(tmp_path / "new.pt"))
    del state["params"]["cp_grid"], state["format_version"]  # a file of format version 1
    atomic_save(state, tmp_path / "old.pt")
    with pytest.warns(SavedFileUpgradeWarning, match="cp_grid="):
        loaded = AlignedMultiOutputGPRegressor.load(tmp_path / "old.pt")
    assert loaded.cp_grid is False and not loaded.model_.cp_grid and AlignedMultiOutputGPRegressor().cp_grid is None
    np.testing.assert_allclose(loaded.predict(X[:5], o[:5]), est.predict(X[:5], o[:5]))


def test_start_from_copies_the_shared_cp_layer(float64_default):
    gen = torch.Generator().manual_seed(5)
    kw = {"cp_inducing": "latent", "num_outputs": 2}
    mogp = AMOGP(None, _z(1, 6), None, alignment=False, warping=False, **kw)
    _set_random_q(mogp.latent, gen)
    with torch.no_grad():
        for p in (mogp.kernel.raw_lengthscale, mogp.raw_inducing_lengthscale, mogp.offset, mogp.raw_noise):
            p.add_(torch.randn(p.shape, generator=gen))
    amogp = AMOGP(_z(2, 4), _z(1, 6), _z(2, 4), **kw)
    align_before = {k: v.clone() for k, v in amogp.state_dict().items() if k.startswith(("align", "warp"))}
    amogp.start_from(mogp)
    for k, v in mogp.state_dict().items():
        torch.testing.assert_close(amogp.state_dict()[k], v, rtol=0, atol=0)
    for k, v in align_before.items():  # alignments and warpings keep their initial near-identity
        torch.testing.assert_close(amogp.state_dict()[k], v, rtol=0, atol=0)
    with pytest.raises(ValueError, match="same CP layer"):
        amogp.start_from(AMOGP(None, _z(1, 5), None, alignment=False, warping=False, **kw))
    with pytest.raises(ValueError, match="same CP layer"):
        amogp.start_from(AMOGP(None, _z(2, 6), None, alignment=False, warping=False))
    with pytest.raises(TypeError, match="AMOGP"):
        amogp.start_from(object())


def test_estimator_starts_from_the_fitted_mogp():
    from flowgp import AlignedMultiOutputGPRegressor

    X, y, o = _series(gap=True)
    kw = dict(num_inducing=10, num_inducing_alignment=4, num_inducing_warping=4, epochs=30, batch_size=None,
              verbose=False, tol=None)
    warm = AlignedMultiOutputGPRegressor(start_from_mogp=True, **kw).fit(X, y, o)
    cold = AlignedMultiOutputGPRegressor(**kw).fit(X, y, o)
    assert len(warm.mogp_history_) == 30 and cold.mogp_history_ == []
    # the AMO-GP starts where the fitted MO-GP's CP layer is, far better than from the prior
    assert warm.history_[0] < cold.history_[0] - 1.0
    assert min(warm.history_) < min(cold.history_)
    mogp_only = AlignedMultiOutputGPRegressor(alignment="identity", warping="identity", start_from_mogp=True,
                                              **kw).fit(X, y, o)
    assert mogp_only.mogp_history_ == []  # nothing to start from: the MO-GP is fitted once


def test_nested_bound_pays_for_a_sparse_cp_layer(float64_default):
    """AMO-GP started from a fitted MO-GP (near-identity alignments and warpings) ends below the MO-GP's bound by
    roughly the CP layer's Nyström residual over σ²_f (benchmarks/studies/amogp_nested_bound.py): a few nats with a
    dense CP layer, tens with a sparse one. The richer prior does not give a bound that contains the MO-GP's."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, generator=g) * 4 - 2
    out = torch.arange(60) % 2
    y = torch.sin(3 * x[:, 0]) * (1 + out) + 0.1 * torch.randn(60, generator=g)

    def fit(model, lr):
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for _ in range(600):
            opt.zero_grad()
            (-model.elbo(x, y, out)).backward()
            opt.step()
        with torch.no_grad():
            return model.elbo(x, y, out).item()

    gaps = {}
    for m in (3, 12):
        kw = {"cp_inducing": "latent", "num_outputs": 2, "lengthscale": 0.5}
        mogp = AMOGP(None, _z(1, m), None, alignment=False, warping=False, noise=0.05, **kw)
        bound_mogp = fit(mogp, 0.03)
        amogp = AMOGP(_z(2, 4), _z(1, m), _z(2, 4), alignment_variance=1e-6, alignment_noise=1e-6,
                      warping_variance=1e-6, latent_noise=1e-3, **kw)
        amogp.start_from(mogp)
        gaps[m] = fit(amogp, 0.01) - bound_mogp
    assert -5.0 < gaps[12] < 0.0  # dense CP layer: the two bounds nearly meet
    assert gaps[3] < gaps[12] - 20.0  # sparse: the residual's price at 1/σ²_f


def test_default_num_inducing_keeps_the_count_per_output():
    from flowgp import AlignedMultiOutputGPRegressor

    est = AlignedMultiOutputGPRegressor()
    assert est.resolved_num_inducing(4) == 80  # 20 per output on one latent
    assert AlignedMultiOutputGPRegressor(latent_processes=2).resolved_num_inducing(3) == 30
    assert AlignedMultiOutputGPRegressor(cp_inducing="output").resolved_num_inducing(4) == 20
    assert AlignedMultiOutputGPRegressor(num_inducing=7).resolved_num_inducing(4) == 7


def test_mogp_fills_a_gap_from_the_other_output():
    """Two correlated series, one with a gap: the MO-GP (CP kernel) beats an independent sparse GP there."""
    from flowgp import AlignedMultiOutputGPRegressor, SVGPRegressor

    X, y, o = _series(1, gap=True, shift=0.0, freq=2.5, n=60)
    rng = np.random.default_rng(5)
    xt = np.sort(rng.uniform(2.1, 3.9, 30))[:, None]
    yt = 2 * np.sin(2.5 * xt[:, 0]) + 3
    mogp = AlignedMultiOutputGPRegressor(num_inducing=15, alignment="identity", warping="identity", epochs=300,
                                         batch_size=None, lr=0.03, lengthscale=0.3, verbose=False)
    mogp.fit(X, y, o)
    svgp = SVGPRegressor(num_inducing=12, epochs=300, lr=0.03, verbose=False, lengthscale=0.3)
    svgp.fit(X[o == 1], y[o == 1])
    rmse_mo = np.sqrt(np.mean((mogp.predict(xt, np.ones(30, int)) - yt) ** 2))
    rmse_ind = np.sqrt(np.mean((svgp.predict(xt) - yt) ** 2))
    assert rmse_mo < 0.5 * rmse_ind


def test_estimator_bad_input_refused():
    from flowgp import AlignedMultiOutputGPRegressor

    X, y, o = _series()
    est = AlignedMultiOutputGPRegressor(epochs=1, verbose=False, num_outputs=3)
    with pytest.raises(ValueError, match=r"output\(s\) \[2\]"):
        est.fit(X, y, o)
    est = AlignedMultiOutputGPRegressor(epochs=1, verbose=False, num_inducing=4, num_inducing_alignment=3,
                                        num_inducing_warping=3)
    with pytest.raises(ValueError, match="output has"):
        est.fit(X, y, o[:-1])
    with pytest.raises(ValueError, match="y has"):
        est.fit(X, y[:-1], o)
    with pytest.raises(ValueError, match="integer"):
        est.fit(X, y, o + 0.5)
    with pytest.raises(RuntimeError, match="not fitted"):
        est.predict(X, o)
    with pytest.raises(ValueError, match="alignment"):
        AlignedMultiOutputGPRegressor(alignment="spline").fit(X, y, o)
    with pytest.raises(ValueError, match="cp_inducing"):
        AlignedMultiOutputGPRegressor(cp_inducing="outputs").fit(X, y, o)
    est.fit(X, y, o)
    with pytest.raises(ValueError, match="0..1"):
        est.predict(X[:3], [0, 1, 2])
    with pytest.raises(ValueError, match="output is required"):
        est.predict(X[:3], None)


def test_bench_data_builders():
    from flowgp.bench.amogp import _PM25, GAP, artificial_data, pm25_data

    (X, y, o), (Xt, yt, ot) = artificial_data(0)
    in_gap = (X[:, 0] >= GAP[0]) & (X[:, 0] < GAP[1])
    assert not np.any(in_gap & (o == 2)) and np.any(in_gap & (o != 2))
    assert np.all(ot == 2) and len(yt) > 10
    if not _PM25.exists():
        pytest.skip("PM2.5 data file not available")
    (X, y, o), (Xt, yt, ot), sites, target = pm25_data(_PM25, "2019-03-15 00:00:00", 14, "n_kensington", 48)
    assert sites[target] == "n_kensington" and np.all(ot == target) and 0 < len(yt) <= 48
    assert np.isfinite(y).all() and np.isfinite(yt).all() and set(np.unique(o)) == {0, 1, 2, 3}
    block = (X[:, 0] >= Xt[:, 0].min()) & (X[:, 0] <= Xt[:, 0].max())
    assert not np.any(block & (o == target)) and np.any(block & (o != target))
    with pytest.raises(ValueError, match="--site"):
        pm25_data(_PM25, "2019-03-15 00:00:00", 14, "nowhere", 48)


@pytest.mark.parametrize("model", ["amogp-aligned", "amogp-warped", "mogp-minibatch", "amogp-fullbatch"])
def test_bench_ablation_variants_set_layers_and_protocol(model):
    from types import SimpleNamespace

    from flowgp.bench.amogp import AMOGP_VARIANTS, _fit_eval, artificial_data

    train, test = artificial_data(0, n=30)
    args = SimpleNamespace(epochs=2, baseline_epochs=3, batch_size=16, lr=0.01, quiet=True)
    est, res = _fit_eval(model, 0, train, test, 2, args, lengthscale=0.2, num_inducing=6)
    alignment, warping, minibatch = AMOGP_VARIANTS[model]
    assert (est.alignment, est.warping) == (alignment, warping)
    assert (est.epochs, est.batch_size) == ((2, 16) if minibatch else (3, None))
    assert np.isfinite(res["rmse"]) and np.isfinite(res["test_ll"])
    with pytest.raises(ValueError, match="amogp-aligned"):
        _fit_eval("amogp-misaligned", 0, train, test, 2, args, lengthscale=0.2, num_inducing=6)


# ----- shared q(u), kernels and objective --------------------------------------------------------------
def test_shared_whitened_q_and_kernels_and_minibatch_bound(float64_default):
    from flowgp.gp.kernels import Scale
    from flowgp.gp.variational import WhitenedGaussian

    model = AMOGP(_z(2, 5), _z(2, 6), _z(2, 4), latent_processes=2, alignment_variance=0.07,
                  warping_lengthscale=1.3)
    assert all(isinstance(s, WhitenedGaussian) for s in (model.latent, model.align, model.warp))
    assert isinstance(model.align_kernel, Scale) and isinstance(model.warp_kernel, Scale)
    torch.testing.assert_close(model._align_params()[0], torch.full((2,), 0.07))
    torch.testing.assert_close(model._warp_params()[1], torch.full((2,), 1.3))
    x, y = _data(20)
    out = torch.arange(20) % 2
    e1 = model.elbo(x, y, out)
    e3 = model.elbo(x, y, out, num_data=60, generator=torch.Generator().manual_seed(0))
    kl = model.kl_divergence()
    torch.testing.assert_close(e3, 3 * (e1 + kl) - kl)
    torch.testing.assert_close(kl, sum(s.kl_divergence() for s in (model.latent, model.align, model.warp)))


def test_parameters_follow_the_inducing_inputs_dtype_and_old_files_load():
    from flowgp.compat import SavedFileUpgradeWarning
    from flowgp.numerics.constraints import Positive

    z = _z(2, 5).double()  # the default dtype is float32 here
    model = AMOGP(z, z, z, alignment_variance=0.07, warping_lengthscale=1.3)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x, y = _data(20)
    out = torch.arange(20) % 2
    x, y = x.double(), y.double()
    # a state dict written before the SE hyperparameters moved into flowgp.gp.kernels (raw [D], softplus + lower)
    old = {k: v for k, v in model.state_dict().items() if "_kernel." not in k}
    old["raw_align_variance"] = Positive(1e-10).inverse(model._align_params()[0].detach())
    old["raw_align_lengthscale"] = Positive(1e-6).inverse(model._align_params()[1].detach())
    old["raw_warp_variance"] = Positive(1e-10).inverse(model._warp_params()[0].detach())
    old["raw_warp_lengthscale"] = Positive(1e-6).inverse(model._warp_params()[1].detach())
    fresh = AMOGP(z, z, z)
    with pytest.warns(SavedFileUpgradeWarning, match="AMO-GP was saved before"):
        fresh.load_state_dict(old)
    torch.testing.assert_close(fresh.elbo(x, y, out), model.elbo(x, y, out))


def _latent_layer(model, mean, var, out):
    """(mean, var, ΨCΨᵀ) of the CP layer under q(a_n) = N(mean, var), as the bound evaluates it."""
    hyp = model._hyper()
    return model._latent_layer(model._posteriors(hyp)["f"], mean, var, model._point_values(hyp, out),
                               random_input=True)


@pytest.mark.parametrize("latents", [1, 2])
def test_latent_layer_grouped_contract_equals_materialised_psi2(float64_default, latents):
    """The CP layer's tr(Φ_n W) by groups (inducing inputs per output and latent) equals the contraction of
    the materialised Ψ-statistics of flowgp.models.amogp.psi_statistics.cp_psi_statistics."""
    from flowgp.models.amogp.psi_statistics import cp_psi_statistics

    gen = torch.Generator().manual_seed(latents)
    model = AMOGP(_z(3, 4), _z(3, 5) + 0.1 * torch.randn(3, 5, generator=gen), None, warping=False,
                  latent_processes=latents, lengthscale=0.7)
    with torch.no_grad():
        model.kernel.raw_lengthscale.add_(0.3 * torch.randn(model.kernel.raw_lengthscale.shape, generator=gen))
    _set_random_q(model.latent, gen)
    out = torch.tensor([0, 2, 1, 1, 0, 2])
    mean = torch.randn(6, generator=gen)
    var = 0.3 * torch.rand(6, generator=gen)
    m, v, pc = _latent_layer(model, mean, var, out)
    stats = cp_psi_statistics(model.kernel, mean[:, None], var[:, None], out, model.latent.z[0], model.latent_output)
    alpha, cov, kinv, _ = model._sampling_posteriors()["f"]  # InducingSet.posterior, autograd's path
    w = alpha[0][:, None] * alpha[0][None, :] + cov[0] - kinv[0]
    expected = stats.psi0 + torch.einsum("nij,ij->n", stats.psi2, w) - (stats.psi1 @ alpha[0]).square()
    torch.testing.assert_close(m, stats.psi1 @ alpha[0])
    torch.testing.assert_close(v, expected.clamp_min(0.0))


@pytest.mark.parametrize("latents", [1, 2])
def test_latent_inducing_layer_equals_materialised_psi_statistics(float64_default, latents):
    """cp_inducing="latent": Ψ₁ and tr(Φ_n W) of the CP layer (groups = latents, per-point prefactors and
    lengthscales) equal eq. 24-25 materialised over the stacked latent inducing sets, with W's cross-latent
    blocks α_r α_r'ᵀ (q(u) is independent across latents, its mean is not zero)."""
    from flowgp.models.amogp.psi_statistics import gaussian_psi1, gaussian_psi2

    gen = torch.Generator().manual_seed(10 + latents)
    model = AMOGP(_z(3, 4), _z(latents, 5) + 0.1 * torch.randn(latents, 5, generator=gen), None, warping=False,
                  latent_processes=latents, lengthscale=0.7, cp_inducing="latent", num_outputs=3)
    with torch.no_grad():
        model.kernel.raw_lengthscale.add_(0.3 * torch.randn(model.kernel.raw_lengthscale.shape, generator=gen))
        model.raw_inducing_lengthscale.add_(0.3 * torch.randn(model.raw_inducing_lengthscale.shape, generator=gen))
    _set_random_q(model.latent, gen)
    out = torch.tensor([0, 2, 1, 1, 0, 2])
    mean = torch.randn(6, generator=gen)
    var = 0.3 * torch.rand(6, generator=gen)
    m, v, pc = _latent_layer(model, mean, var, out)
    amp, lsq = model.kernel.inducing_parameters(out, model.inducing_lengthscale)  # [R, N], [R, N, 1]
    amp = amp.T.repeat_interleave(5, 1)  # [N, R·M]
    lsq = lsq.transpose(0, 1).repeat_interleave(5, 1)  # [N, R·M, 1]
    z = model.latent.z.reshape(-1, 1)
    psi1 = gaussian_psi1(mean[:, None], var[:, None], z, amp, lsq)
    psi2 = gaussian_psi2(mean[:, None], var[:, None], z, amp, lsq)
    alpha, cov, kinv, _ = model._sampling_posteriors()["f"]
    a = alpha.reshape(-1)
    w = a[:, None] * a[None, :] + torch.block_diag(*cov) - torch.block_diag(*kinv)
    expected = model.kernel.variance.sum(-1)[out] + torch.einsum("nij,ij->n", psi2, w) - (psi1 @ a).square()
    torch.testing.assert_close(m, psi1 @ a)
    torch.testing.assert_close(v, expected.clamp_min(0.0))
    torch.testing.assert_close(pc, torch.einsum("ni,ij,nj->n", psi1, torch.block_diag(*cov), psi1))


def test_estimator_natural_gradient_full_batch_and_plateau_stop():
    from flowgp import AlignedMultiOutputGPRegressor

    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 6, 60))
    X = np.concatenate([t, t])[:, None]
    o = np.repeat([0, 1], 60)
    y = np.concatenate([np.sin(t), np.sin(t + 0.3)]) + 0.05 * rng.standard_normal(120)
    kw = dict(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, epochs=40, lr=0.02, verbose=False,
              warping="identity")
    est = AlignedMultiOutputGPRegressor(natural_gradient=0.5, tol=None, **kw)
    assert est.resolved_batch_size(120) is None and est.resolved_batch_size(10_000) == 256
    est.fit(X, y, o)
    adam = AlignedMultiOutputGPRegressor(natural_gradient=None, tol=None, **kw).fit(X, y, o)
    assert est.history_[-1] < adam.history_[-1]  # natural gradients reach a better bound in the same steps
    # full batch: every history entry is the exact -bound per point, and the fit ends at the lowest one
    overshoot = AlignedMultiOutputGPRegressor(natural_gradient=1.0, tol=None, **kw).fit(X, y, o)
    per_point = -(overshoot.elbo(X, y, o) + np.log(overshoot.y_std_[o]).sum()) / len(y)
    assert per_point == pytest.approx(min(overshoot.history_), rel=1e-9)
    stopped = AlignedMultiOutputGPRegressor(natural_gradient=0.5, tol=1e6, patience=5, **{**kw, "epochs": 200})
    assert len(stopped.fit(X, y, o).history_) == 10  # first window is the baseline, the second shows no gain
    for bad in (dict(natural_gradient=2.0), dict(natural_gradient_layers="some"), dict(tol=-1.0),
                dict(batch_size="full"), dict(patience=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AlignedMultiOutputGPRegressor(**{**kw, **bad}).fit(X, y, o)


def test_monte_carlo_predictions_are_chunked_and_independent_of_the_other_rows():
    """Bounded memory, row invariance: predict_interval(method="samples") and the Monte Carlo lpd held
    [S, N, M] draws for all rows at once (20 000 rows: 6 GB) with per-row noise, so a row's result depended on
    the rows predicted with it. Chunks now replay the generator with draws common to the rows."""
    rng = np.random.default_rng(0)
    X = np.sort(rng.uniform(0, 10, 60))[:, None]
    o = np.arange(60) % 2
    y = np.sin(X[:, 0] + o) + 0.1 * rng.standard_normal(60)
    from flowgp import AlignedMultiOutputGPRegressor

    est = AlignedMultiOutputGPRegressor(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4,
                                        epochs=5, verbose=False, num_samples=30).fit(X, y, o)
    lo, hi = est.predict_interval(X, o, method="samples")
    lpd = est.log_predictive_density(X, y, o)
    est.predict_memory = 1  # one row per chunk
    lo1, hi1 = est.predict_interval(X, o, method="samples")
    np.testing.assert_allclose(lo1, lo, rtol=1e-9)
    np.testing.assert_allclose(hi1, hi, rtol=1e-9)
    np.testing.assert_allclose(est.log_predictive_density(X, y, o), lpd, rtol=1e-9)
    order = rng.permutation(60)[:17]
    np.testing.assert_allclose(est.log_predictive_density(X[order], y[order], o[order]), lpd[order], rtol=1e-9)
    assert np.all(lo < hi)


# ----- the bound's nodes with hand-written backwards ---------------------------------------------------------
def _reference_elbo(model, x, y, out, num_data):
    """The bound as the module docstring writes it, through autograd only: InducingSet.posterior, Φ_n
    materialised per point (flowgp.models.amogp.psi_statistics.gaussian_psi1/psi2/psi_mean) and the KL of kl_divergence."""
    from flowgp.models.amogp.psi_statistics import gaussian_psi1, gaussian_psi2, gaussian_psi_mean

    def moments(psi, phi, psi0, alpha, cov, kinv, mean_in=None, var_in=None, xi=None):
        w = alpha[..., :, None] * alpha[..., None, :] + cov - kinv
        psi_a = (psi * alpha).sum(-1)
        var = psi0 + (phi * w).sum((-1, -2)) - psi_a.square()
        mean = psi_a
        if mean_in is not None:
            mean = mean + mean_in
        if xi is not None:
            var = var + var_in + 2.0 * ((xi * alpha).sum(-1) - mean_in * psi_a)
        pc = torch.einsum("...m,...mk,...k->...", psi, cov, psi).clamp_min(0.0)
        return mean, var.clamp_min(0.0), pc

    def own_se(mean, var, ind, kern, alpha, cov, kinv, with_mean):
        s2, ls = kern.variance.reshape(-1)[out], kern.base.lengthscale.reshape(-1)[out]
        z = ind.z[out]  # [B, M, 1]
        amp = s2[:, None, None].expand(-1, 1, z.shape[1])
        lsq = ls.square()[:, None, None, None].expand(-1, 1, z.shape[1], 1)
        m, v = mean[:, None, None], var[:, None, None]
        psi = gaussian_psi1(m, v, z, amp, lsq)  # [B, 1, M]
        phi = gaussian_psi2(m, v, z, amp, lsq)[:, 0]
        xi = gaussian_psi_mean(m, v, z, psi, lsq)[:, 0, :, 0] if with_mean else None
        return moments(psi[:, 0], phi, s2, alpha[out], cov[out], kinv[out], mean, var, xi)

    xs = x[:, 0]
    penalty = torch.zeros_like(xs)
    if model.alignment:
        alpha, cov, kinv, _ = model.align.posterior(model.align_kernel(model.align.z))
        m, v, pc = own_se(xs, torch.zeros_like(xs), model.align, model.align_kernel, alpha, cov, kinv, False)
        penalty = penalty + (v - pc) / (2.0 * model.alignment_noise[out])
        a_mean, a_var = m, pc + model.alignment_noise[out]
    else:
        a_mean, a_var = xs, torch.zeros_like(xs)
    alpha, cov, kinv, _ = model.latent.posterior(model.cp_kuu())
    a, c, k = alpha.reshape(-1), torch.block_diag(*cov), torch.block_diag(*kinv)
    if model.cp_inducing == "latent":
        amp, lsq = model.kernel.inducing_parameters(out, model.inducing_lengthscale)  # [R, B], [R, B, 1]
        mf = model.latent.z.shape[1]
        amp, lsq = amp.T.repeat_interleave(mf, 1), lsq.transpose(0, 1).repeat_interleave(mf, 1)
        z = model.latent.z.reshape(-1, 1)
        psi = gaussian_psi1(a_mean[:, None], a_var[:, None], z, amp, lsq)
        phi = gaussian_psi2(a_mean[:, None], a_var[:, None], z, amp, lsq)
    else:
        from flowgp.models.amogp.psi_statistics import cp_psi_statistics

        stats = cp_psi_statistics(model.kernel, a_mean[:, None], a_var[:, None], out, model.latent.z[0],
                                  model.latent_output)
        psi, phi = stats.psi1, stats.psi2
    m, v, pc = moments(psi, phi, model.kernel.variance.sum(-1)[out], a, c, k)
    if model.warping:
        penalty = penalty + (v - pc) / (2.0 * model.latent_noise[out])
        f_mean, f_var = m, pc + model.latent_noise[out]
        alpha, cov, kinv, _ = model.warp.posterior(model.warp_kernel(model.warp.z))
        m, v, _ = own_se(f_mean, f_var, model.warp, model.warp_kernel, alpha, cov, kinv, True)
    mean = m + model.offset[out]
    s2 = model.noise[out]
    ell = -0.5 * torch.log(2.0 * math.pi * s2) - ((y - mean).square() + v) / (2.0 * s2)
    return (ell - penalty).sum() * num_data / x.shape[0] - model.kl_divergence()


def _random_model(cp, latents, alignment, warping, seed):
    """A small well-conditioned AMO-GP with every parameter moved off its initial value."""
    d = 3
    z_latent = _z(latents, 6) if cp == "latent" else _z(d, 3, -1.5, 1.5) + 0.5 * torch.arange(d)[:, None]
    model = AMOGP(_z(d, 5), z_latent, _z(d, 5, -1.5, 2.5), latent_processes=latents, alignment=alignment,
                  warping=warping, lengthscale=0.8, alignment_variance=0.1, warping_variance=0.2, noise=0.1,
                  alignment_noise=0.05, latent_noise=0.05, cp_inducing=cp, num_outputs=d)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("q_mu"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("q_sqrt"):
                p.copy_(0.5 * torch.eye(p.shape[-1]) + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.mark.parametrize("cp,latents", [("latent", 1), ("latent", 2), ("output", 1), ("output", 2)])
@pytest.mark.parametrize("layers", [(True, True), (True, False), (False, True), (False, False)])
def test_bound_and_gradients_equal_the_materialised_reference(float64_default, cp, latents, layers):
    """The bound (one node per posterior, the Ψ-statistics contractions with hand-written backwards, base-2
    exponentials) equals the module docstring's bound through autograd with materialised Φ_n, value and every
    parameter's gradient to rounding, on a minibatch."""
    model = _random_model(cp, latents, *layers, seed=latents + 2 * layers[0] + 4 * layers[1])
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=gen) * 4 - 2
    out = torch.randint(0, 3, (40,), generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.3 * out + 0.1 * torch.randn(40, generator=gen)
    params = [p for _, p in sorted(model.named_parameters())]
    bound = model.elbo(x, y, out, num_data=100)
    ref = _reference_elbo(model, x, y, out, 100)
    torch.testing.assert_close(bound, ref, rtol=1e-10, atol=0.0)
    grads = torch.autograd.grad(bound, params, allow_unused=True, materialize_grads=True)
    ref_grads = torch.autograd.grad(ref, params, allow_unused=True, materialize_grads=True)
    for (name, _), a, b in zip(sorted(model.named_parameters()), grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * float(b.abs().max()) + 1e-12, msg=name)


def test_posterior_node_matches_autograd_and_gradcheck(float64_default):
    """_WhitenedPosterior: (α, C, Δ, W, KL) equal InducingSet.posterior's and gaussian_kl_whitened's through
    autograd, with gradcheck of the hand-written backward (K_uu through its symmetric part, as a kernel gives
    it) for every subset of outputs."""
    from flowgp.models.amogp.model import _WhitenedPosterior
    from flowgp.gp.variational import gaussian_kl_whitened

    gen = torch.Generator().manual_seed(3)
    g, m = 2, 4
    a = torch.randn(g, m, m, generator=gen)
    kuu = (a @ a.mT + m * torch.eye(m)).requires_grad_()
    mu = torch.randn(g, m, generator=gen).requires_grad_()
    r = (torch.randn(g, m, m, generator=gen).tril() + 2 * torch.eye(m)).requires_grad_()

    def node(k, mu_, r_):
        return _WhitenedPosterior.apply(0.5 * (k + k.mT), mu_, r_, None, None)[:5]

    def reference(k, mu_, r_):
        chol = torch.linalg.cholesky(0.5 * (k + k.mT) + 1e-8 * torch.eye(m))
        x = torch.linalg.solve_triangular(chol, torch.eye(m).expand(g, m, m), upper=False)
        alpha = (x.mT @ mu_[..., None])[..., 0]
        cov = x.mT @ r_ @ r_.mT @ x
        delta = cov - x.mT @ x
        return alpha, cov, delta, alpha[..., :, None] * alpha[..., None, :] + delta, gaussian_kl_whitened(mu_, r_)

    for o1, o2 in zip(node(kuu, mu, r), reference(kuu, mu, r)):
        torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(node, (kuu, mu, r))
    probes = [torch.randn(t.shape, generator=gen) for t in node(kuu, mu, r)]
    for used in ([0], [1], [2], [3], [4], [0, 3], [1, 2, 4]):
        lhs = sum((t * probes[i]).sum() for i, t in enumerate(node(kuu, mu, r)) if i in used)
        rhs = sum((t * probes[i]).sum() for i, t in enumerate(reference(kuu, mu, r)) if i in used)
        for u, v in zip(torch.autograd.grad(lhs, (kuu, mu, r), allow_unused=True, materialize_grads=True),
                        torch.autograd.grad(rhs, (kuu, mu, r), allow_unused=True, materialize_grads=True)):
            torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-10)


def test_alignment_node_gradcheck(float64_default):
    """_AlignmentMoments (Ψ of each point under its own output's SE kernel, Ψα, ΨCΨᵀ, ΨΔΨᵀ and the clamps):
    gradcheck of the hand-written backward, the table C and Δ kept symmetric as the posterior gives them."""
    from flowgp.models.amogp.model import _AlignmentMoments

    gen = torch.Generator().manual_seed(4)
    d, m, b = 3, 4, 9
    x = torch.randn(b, generator=gen).requires_grad_()
    out = torch.tensor([0, 1, 2, 2, 1, 0, 0, 2, 1])
    z = torch.randn(d, m, generator=gen).requires_grad_()
    variance = (0.5 + torch.rand(d, generator=gen)).requires_grad_()
    coef = (-0.5 - torch.rand(d, generator=gen)).requires_grad_()
    alpha = torch.randn(d, m, 1, generator=gen).requires_grad_()
    a = torch.randn(d, m, m, generator=gen)
    cov = (a @ a.mT).requires_grad_()
    delta = (cov.detach() - 2.0 * torch.eye(m)).requires_grad_()

    def node(x_, z_, v_, c_, al, co, de):
        table = torch.cat([al, 0.5 * (co + co.mT), 0.5 * (de + de.mT)], -1)
        return _AlignmentMoments.apply(x_, out, z_, v_, c_, table)

    assert torch.autograd.gradcheck(node, (x, z, variance, coef, alpha, cov, delta))


def test_batched_posteriors_factorise_each_layer_on_its_own_after_a_failure(float64_default):
    """Alignment and warping sets go through one batched node; when the batched first Cholesky attempt fails,
    each layer's K_uu is factorised on its own (robust_cholesky's retries), so a retry of one layer adds no jitter
    to the other's."""
    from flowgp.numerics.linalg import CholeskyJitterWarning, robust_cholesky
    from flowgp.models.amogp.model import _WhitenedPosterior

    m = 4
    good = (torch.eye(m) + 0.1 * torch.ones(m, m)).expand(2, m, m)
    bad = (torch.ones(m, m) - 1e-7 * torch.eye(m)).expand(2, m, m)  # indefinite: needs more jitter than 1e-8
    kuu = torch.cat([good, bad])
    mu, r = torch.zeros(4, m), torch.eye(m).expand(4, m, m).clone()
    with pytest.warns(CholeskyJitterWarning):
        chol = _WhitenedPosterior.apply(kuu, mu, r, None, (2, 2))[5]
    torch.testing.assert_close(chol[:2], robust_cholesky(good))
    with pytest.warns(CholeskyJitterWarning):
        torch.testing.assert_close(chol[2:], robust_cholesky(bad))


def test_bound_in_float32():
    """The bound's nodes run in the parameters' dtype: float32 agrees with float64 to float32 accuracy."""
    model = _random_model("latent", 1, True, True, seed=5)
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(30, 1, generator=gen, dtype=torch.float64) * 4 - 2)
    out = torch.randint(0, 3, (30,), generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(30, generator=gen, dtype=torch.float64)
    model = model.double()
    ref = model.elbo(x, y, out).item()
    bound = model.float().elbo(x.float(), y.float(), out)
    assert bound.dtype == torch.float32
    assert abs(bound.item() - ref) < 1e-3 * abs(ref)
    bound.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("alignment", [False, True])
@pytest.mark.parametrize("cp", ["output", "latent"])
def test_cp_kernel_values_below_the_floor_are_zeros_and_change_nothing(float64_default, cp, alignment, monkeypatch):
    """The deterministic CP layer (the MO-GP's) takes K_fu entries below e^-100 as exact zeros
    (`flowgp.models.amogp.psi_statistics.exp_or_zero`), so that no subnormal number (slow CPU arithmetic) enters its products:
    the bound and its gradients are those without the floor to rounding, and the materialised reference's to the
    conditioning of this short-lengthscale K_uu. With an alignment layer the CP input is random and the floor
    acts inside the Ψ-statistics node (Ψ₁ and the series' factors)."""
    from flowgp.models.amogp import psi_statistics

    d = 2
    z = _z(1, 40) if cp == "latent" else _z(d, 20)
    model = AMOGP(_z(d, 5) if alignment else None, z, None, alignment=alignment, warping=False, lengthscale=0.03,
                  alignment_variance=0.01, alignment_noise=1e-4, noise=0.1, cp_inducing=cp, num_outputs=d)
    gen = torch.Generator().manual_seed(3)
    _set_random_q(model.latent, gen)
    x = torch.linspace(-4, 4, 60)[:, None]  # points up to 2 beyond the inducing inputs: exponents below -1 000
    out = torch.arange(60) % d
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(60, generator=gen)
    psi = model._cp_psi1(x[:, 0], torch.zeros(60), model._cp_groups(out))  # the plain formula
    tiny = (psi > 0) & (psi < math.exp(-100.0))
    assert tiny.any() and (psi[psi > 0] < torch.finfo(psi.dtype).tiny).any()  # the test reaches subnormal values
    params = [p for _, p in sorted(model.named_parameters())]

    def bound_and_grads():
        bound = model.elbo(x, y, out, num_data=60)
        return bound, torch.autograd.grad(bound, params, allow_unused=True, materialize_grads=True)

    bound, grads = bound_and_grads()
    monkeypatch.setattr(psi_statistics, "_ZERO_EXPONENT", -math.inf)
    unfloored, unfloored_grads = bound_and_grads()
    torch.testing.assert_close(bound, unfloored, rtol=1e-14, atol=0.0)
    for (name, _), a, b in zip(sorted(model.named_parameters()), grads, unfloored_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14 * float(b.abs().max()) + 1e-300, msg=name)
    torch.testing.assert_close(bound, _reference_elbo(model, x, y, out, 60), rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("layers", [(True, True), (True, False)])
def test_grid_inducing_inputs_give_the_same_bound_and_stay_fixed(float64_default, layers):
    """cp_grid=True (inducing inputs kept on their even grid, the midpoint form of `flowgp.models.amogp.psi_grid`) gives the
    bound and every other parameter's gradient of the same model with free inducing inputs, and the materialised
    reference's; the grid itself gets no gradient."""
    free = _random_model("latent", 1, *layers, seed=11)
    with torch.no_grad():
        free.latent.z.copy_(_z(1, 6).unsqueeze(-1))  # back on the grid (_random_model moves every parameter)
    grid = AMOGP(_z(3, 5), _z(1, 6), _z(3, 5, -1.5, 2.5), alignment=layers[0], warping=layers[1],
                 cp_inducing="latent", num_outputs=3, cp_grid=True)
    grid.load_state_dict(free.state_dict())
    assert not grid.latent.z.requires_grad
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=gen) * 4 - 2
    out = torch.randint(0, 3, (40,), generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.3 * out + 0.1 * torch.randn(40, generator=gen)
    names = [n for n, p in sorted(free.named_parameters()) if n != "latent.z"]
    b_free, b_grid = free.elbo(x, y, out, num_data=100), grid.elbo(x, y, out, num_data=100)
    torch.testing.assert_close(b_grid, b_free, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(b_grid, _reference_elbo(grid, x, y, out, 100), rtol=1e-10, atol=0.0)
    free_params, grid_params = dict(free.named_parameters()), dict(grid.named_parameters())
    g_free = torch.autograd.grad(b_free, [free_params[n] for n in names], allow_unused=True, materialize_grads=True)
    g_grid = torch.autograd.grad(b_grid, [grid_params[n] for n in names], allow_unused=True, materialize_grads=True)
    for name, a, b in zip(names, g_grid, g_free):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11 * float(b.abs().max()) + 1e-13, msg=name)


def test_grid_inducing_inputs_bad_input_and_estimator():
    x, out = torch.linspace(-1, 1, 8)[:, None], torch.arange(8) % 2
    uneven = AMOGP(_z(2, 5), torch.tensor([[0.0, 0.1, 0.5, 0.6]]), None, warping=False, cp_inducing="latent",
                   num_outputs=2, cp_grid=True)
    with pytest.raises(ValueError, match="evenly spaced"):
        uneven.elbo(x, torch.sin(x[:, 0]), out, num_data=8)
    with pytest.raises(ValueError, match="cp_inducing='latent'"):
        AMOGP(_z(2, 5), _z(2, 4), None, warping=False, cp_inducing="output", cp_grid=True)
    model = AMOGP(_z(2, 5), _z(1, 6), None, warping=False, cp_inducing="latent", num_outputs=2, cp_grid=True)
    model.elbo(x, torch.sin(x[:, 0]), out, num_data=8)
    with torch.no_grad():
        model.latent.z[0, 2, 0] += 0.05  # an edit (or a loaded state) that leaves the grid is refused, not used
    with pytest.raises(ValueError, match="evenly spaced"):
        model.elbo(x, torch.sin(x[:, 0]), out, num_data=8)
    with pytest.raises(TypeError, match="cp_grid must be a bool"):
        AMOGP(_z(2, 5), _z(1, 4), None, warping=False, cp_inducing="latent", num_outputs=2, cp_grid=1)
    from flowgp.estimators import AlignedMultiOutputGPRegressor

    X, y, o = _series()
    with pytest.raises(TypeError, match="cp_grid must be None, True or False"):
        AlignedMultiOutputGPRegressor(cp_grid="yes", epochs=1, verbose=False).fit(X, y, o)
    with pytest.raises(ValueError, match="cp_grid=True needs cp_inducing='latent'"):
        AlignedMultiOutputGPRegressor(cp_grid=True, cp_inducing="output", epochs=1, verbose=False).fit(X, y, o)
    # the default: on for AMO-GP with latent sets, off for the MO-GP and for per-output sets
    assert AlignedMultiOutputGPRegressor().resolved_cp_grid()
    assert not AlignedMultiOutputGPRegressor(alignment="identity", warping="identity").resolved_cp_grid()
    assert not AlignedMultiOutputGPRegressor(cp_inducing="output").resolved_cp_grid()
    assert not AlignedMultiOutputGPRegressor(cp_grid=False).resolved_cp_grid()
    est = AlignedMultiOutputGPRegressor(num_inducing=8, cp_grid=True, epochs=15, verbose=False).fit(X, y, o)
    z = est.model_.latent.z[0, :, 0]
    gaps = z[1:] - z[:-1]
    torch.testing.assert_close(gaps, gaps[:1].expand_as(gaps), rtol=1e-12, atol=0.0)  # still the initial grid
    assert np.isfinite(est.predict(X[:5], o[:5])).all()
