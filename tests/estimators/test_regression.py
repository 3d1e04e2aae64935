import numpy as np
import pytest
from sklearn.base import clone

import flowgp
from flowgp import SVGPRegressor, TGPRegressor, WarpedGPRegressor


def _data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(n, 2))
    y = 5.0 + 3.0 * np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.2 * rng.standard_normal(n)
    return x, y


FAST = dict(num_inducing=10, epochs=60, verbose=False)


def test_identity_tgp_estimator_equals_svgp_estimator():
    x, y = _data()
    svgp = SVGPRegressor(**FAST).fit(x, y)
    tgp = TGPRegressor(flow="identity", **FAST).fit(x, y)
    mean_s, std_s = svgp.predict(x, return_std=True)
    mean_t, std_t = tgp.predict(x, return_std=True)
    np.testing.assert_allclose(mean_t, mean_s, rtol=1e-8)
    np.testing.assert_allclose(std_t, std_s, rtol=1e-8)
    np.testing.assert_allclose(tgp.elbo(x, y), svgp.elbo(x, y), rtol=1e-8)
    np.testing.assert_allclose(tgp.log_predictive_density(x, y), svgp.log_predictive_density(x, y), rtol=1e-8)


@pytest.mark.parametrize("cls,kw", [(SVGPRegressor, {}), (TGPRegressor, {"flow": "sal"}),
                                    (WarpedGPRegressor, {"flow": "sal", "flow_init": "data"})])
def test_estimator_contract(cls, kw, tmp_path):
    x, y = _data()
    est = cls(**FAST, **kw)
    assert est.fit(x, y) is est
    mean, std = est.predict(x[:7], return_std=True)
    assert mean.shape == (7,) and std.shape == (7,) and np.all(std > 0)
    lower, upper = est.predict_interval(x[:7], level=0.9)
    assert np.all(lower < mean) and np.all(mean < upper)
    lpd = est.log_predictive_density(x[:7], y[:7])
    assert lpd.shape == (7,) and np.all(np.isfinite(lpd))
    assert np.isfinite(est.elbo(x, y))
    assert est.score(x, y) > 0.8  # R² on a smooth function the GP fits well
    assert est.sample_f(x[:4], num_samples=3).shape == (3, 4)
    # the fit is reproducible for a fixed seed
    again = clone(est).fit(x, y)
    np.testing.assert_allclose(again.predict(x[:7]), mean, rtol=1e-10)
    # save/load round trip with weights_only loading
    path = est.save(tmp_path / "model.pt")
    loaded = cls.load(path)
    assert type(loaded) is cls
    np.testing.assert_allclose(loaded.predict(x[:7]), mean, rtol=1e-12)
    np.testing.assert_allclose(flowgp.load(path).log_predictive_density(x[:7], y[:7]), lpd, rtol=1e-12)
    # the bench's one-call summary is the three predictions
    summary = est.predictive_summary(x[:7], y[:7], 0.9)
    assert sorted(summary) == ["log_density", "lower", "mean", "upper"]
    for got, want in zip((summary[k] for k in ("log_density", "mean", "lower", "upper")), (lpd, mean, lower, upper)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_log_density_accounts_for_target_scaling():
    # the same data in other units: densities shift by exactly -log(scale)
    x, y = _data()
    a = SVGPRegressor(**FAST).fit(x, y)
    b = SVGPRegressor(**FAST).fit(x, 10 * y)
    np.testing.assert_allclose(b.log_predictive_density(x, 10 * y), a.log_predictive_density(x, y) - np.log(10),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(b.predict(x), 10 * a.predict(x), rtol=1e-6)


def test_positive_flows_keep_predictions_positive():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 5, size=(100, 1))
    y = np.exp(np.sin(2 * x[:, 0])) * rng.lognormal(0, 0.1, 100)
    tgp = TGPRegressor(flow="sal+softplus", **FAST).fit(x, y)
    assert tgp.y_shift_ == 0.0  # positive codomain: targets rescaled, never shifted
    lower, _ = tgp.predict_interval(x, 0.99)
    wgp = WarpedGPRegressor(flow="log", flow_init="none", **FAST).fit(x, y)
    lower_w, _ = wgp.predict_interval(x, 0.99)
    assert np.all(wgp.predict(x) > 0) and np.all(lower_w > 0)
    assert np.all(tgp.sample_f(x, 5) > 0)


def test_float32_fit_works():
    x, y = _data()
    est = TGPRegressor(flow="sal", dtype="float32", **FAST).fit(x, y)
    assert est.model_.gp.q_mu.dtype.__str__() == "torch.float32"
    assert np.all(np.isfinite(est.predict(x)))


@pytest.mark.parametrize(
    "make,match,err",
    [
        (lambda x, y: SVGPRegressor(**FAST).fit(np.where(x > 2.9, np.nan, x), y), "NaN", ValueError),
        (lambda x, y: SVGPRegressor(**FAST).fit(x, y[:-1]), "rows", ValueError),
        (lambda x, y: SVGPRegressor(**FAST).fit(x[:1], y[:1]), "at least 2", ValueError),
        (lambda x, y: SVGPRegressor(**FAST).fit(x[:, 0], y), "2-D", ValueError),
        (lambda x, y: SVGPRegressor(kernel="squiggle", **FAST).fit(x, y), "squiggle", ValueError),
        (lambda x, y: TGPRegressor(flow="squiggle", **FAST).fit(x, y), "squiggle", ValueError),
        (lambda x, y: TGPRegressor(flow=3, **FAST).fit(x, y), "flow", TypeError),
        (lambda x, y: WarpedGPRegressor(flow="log", **FAST).fit(x, y - 10), "positive", ValueError),
        (lambda x, y: SVGPRegressor(dtype="float16", **FAST).fit(x, y), "dtype", ValueError),
        (lambda x, y: TGPRegressor(flow_init="magic", **FAST).fit(x, y), "flow_init", ValueError),
        (lambda x, y: SVGPRegressor(**FAST).predict(x), "not fitted", RuntimeError),
        (lambda x, y: SVGPRegressor(**FAST).fit(x, y).predict(x[:, :1]), "features", ValueError),
    ],
)
def test_bad_inputs_raise_clear_errors(make, match, err):
    x, y = _data(n=30)
    with pytest.raises(err, match=match):
        make(x, y)


def test_load_rejects_other_files(tmp_path):
    import torch

    path = tmp_path / "other.pt"
    torch.save({"hello": 1}, path)
    with pytest.raises(ValueError, match="not a flowgp"):
        flowgp.load(path)
    x, y = _data(n=30)
    est = TGPRegressor(flow="sal", **FAST).fit(x, y)
    est.save(tmp_path / "tgp.pt")
    with pytest.raises(ValueError, match="TGPRegressor"):
        WarpedGPRegressor.load(tmp_path / "tgp.pt")


# ---------------------------------------------------------------- input-dependent / Bayesian flows
ID_FAST = dict(num_inducing=10, epochs=60, verbose=False, kmeans_restarts=1, input_dependent=True, hidden=(8,),
               mc_samples_predict=10, flow_init_epochs=20)


@pytest.mark.parametrize("bayesian,dropout", [("point", 0.25), ("mc_dropout", 0.25), ("vb", 0.0)])
def test_input_dependent_estimator_fits_and_round_trips(bayesian, dropout, tmp_path):
    x, y = _data()
    est = TGPRegressor(bayesian=bayesian, dropout=dropout, mc_samples_train=2, **ID_FAST).fit(x, y)
    assert est.model_.input_dependent
    assert est.score(x, y) > 0.8
    mean, std = est.predict(x[:7], return_std=True)
    np.testing.assert_allclose(est.predict(x[:7]), mean, rtol=1e-12)  # seeded W draws: repeatable
    lpd = est.log_predictive_density(x[:7], y[:7])
    assert np.all(np.isfinite(lpd)) and np.all(std > 0)
    lower, upper = est.predict_interval(x[:7], level=0.9)
    assert np.all(lower < mean) and np.all(mean < upper)
    path = est.save(tmp_path / "id.pt")
    loaded = flowgp.load(path)
    params = loaded.get_params()
    for key in ("input_dependent", "hidden", "activation", "dropout", "bayesian", "mc_samples_train",
                "mc_samples_predict", "prior_precision", "flow_init_epochs"):
        assert params[key] == est.get_params()[key], key
    np.testing.assert_allclose(loaded.predict(x[:7]), mean, rtol=1e-12)
    np.testing.assert_allclose(loaded.log_predictive_density(x[:7], y[:7]), lpd, rtol=1e-12)


def test_mc_dropout_estimator_with_zero_dropout_equals_point_estimate():
    x, y = _data()
    pe = TGPRegressor(bayesian="point", dropout=0.0, **ID_FAST).fit(x, y)
    ba = TGPRegressor(bayesian="mc_dropout", dropout=0.0, **ID_FAST).fit(x, y)
    np.testing.assert_allclose(ba.predict(x), pe.predict(x), rtol=1e-10)
    np.testing.assert_allclose(ba.log_predictive_density(x, y), pe.log_predictive_density(x, y), rtol=1e-10)


@pytest.mark.parametrize("kw,match", [
    (dict(bayesian="laplace"), "bayesian must be one of"),
    (dict(bayesian="vb", dropout=0.25), "uses no dropout"),
    (dict(activation="sigmoid"), "activation must be one of"),
    (dict(hidden=(0,)), "hidden must list"),
    (dict(dropout=1.5), "dropout must lie in"),
    (dict(mc_samples_train=0), "mc_samples_train"),
    (dict(mc_samples_predict=2.5), "mc_samples_predict"),
    (dict(prior_precision=-1.0), "prior_precision"),
    (dict(input_dependent="some"), "input_dependent must be"),
    (dict(flow="affine"), "no non-affine stage"),
])
def test_input_dependent_options_are_refused_clearly(kw, match):
    x, y = _data(n=30)
    with pytest.raises(ValueError, match=match):
        TGPRegressor(**{**ID_FAST, **kw}).fit(x, y)


def test_warping_functions_are_in_target_units():
    x, y = _data()
    est = TGPRegressor(bayesian="mc_dropout", **ID_FAST).fit(x, y)
    out = est.warping_functions(x[:3], f_grid=np.linspace(-2, 2, 9), num_samples=20)
    assert out["point"].shape == out["mean"].shape == out["std"].shape == (9, 3)
    assert np.all(np.diff(out["point"], axis=0) > 0)
    assert 0 < np.median(out["point"]) < 12  # y ≈ 5 + 3 sin(x) in its own units
    with pytest.raises(ValueError, match="input_dependent=True"):
        TGPRegressor(flow="sal", **FAST).fit(x, y).warping_functions(x[:2])


# ----- range checks: refuse what would silently give wrong answers -------------------------
@pytest.mark.parametrize("flow", ["softplus", "exp", "tanh", "sal+softplus"])
def test_wgp_refuses_a_warping_whose_range_is_not_the_real_line(flow):
    """z = T(y) is Gaussian, so T must map onto every real value: T⁻¹ of the predictive would be NaN otherwise."""
    X = np.linspace(0, 1, 20)[:, None]
    y = 1.0 + np.sin(6 * X[:, 0]) ** 2
    est = WarpedGPRegressor(flow=flow, num_inducing=4, epochs=2, verbose=False)
    with pytest.raises(ValueError, match="whole real line"):
        est.fit(X, y)
    assert not hasattr(est, "model_")  # refused before any training
    from flowgp.models import WarpedGP
    from flowgp.gp.kernels import make_kernel
    import torch
    with pytest.raises(ValueError, match="whole real line"):
        WarpedGP(make_kernel("rbf", 1), torch.zeros(3, 1, dtype=torch.float64), flow)


@pytest.mark.parametrize("flow", ["softplus", "exp", "sal+softplus"])
def test_tgp_with_a_positive_flow_refuses_non_positive_targets(flow):
    X = np.linspace(0, 1, 20)[:, None]
    y = np.sin(6 * X[:, 0]) - 5.0
    est = TGPRegressor(flow=flow, num_inducing=4, epochs=2, verbose=False)
    with pytest.raises(ValueError, match="only takes positive values.*shift y"):
        est.fit(X, y)
    assert np.isfinite(TGPRegressor(flow=flow, num_inducing=4, epochs=2, verbose=False)
                       .fit(X, y + 10.0).predict(X[:3])).all()  # positive targets still fit


@pytest.mark.parametrize("name", ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "DeepGPRegressor",
                                  "LatentDeepGPRegressor"])
def test_quantile_levels_outside_zero_one_are_refused_by_every_regressor(name):
    """predict_quantiles(X, [1.5]) returned NaN for SVGP and v-WGP; every estimator now refuses a
    level outside (0, 1) (NaN included) with the levels in the message, and predict_interval a bad `level`."""
    import flowgp

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (30, 2))
    y = np.exp(np.sin(2 * X[:, 0]))  # positive: every flow applies
    kwargs = dict(num_samples_predict=5) if "Deep" in name else {}
    est = getattr(flowgp, name)(num_inducing=4, epochs=2, verbose=False, kmeans_restarts=1, **kwargs).fit(X, y)
    for levels in ([1.5], [0.0, 0.5], [0.5, 1.0], [-0.1], [float("nan")]):
        with pytest.raises(ValueError, match=r"\(0, 1\)"):
            est.predict_quantiles(X[:3], levels)
    for level in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"\(0, 1\)"):
            est.predict_interval(X[:3], level)
    assert np.isfinite(est.predict_quantiles(X[:3], [0.1, 0.9])).all()


def test_svgp_natural_gradient_fits_many_inducing_points_where_adam_lags():
    """natural_gradient=1.0: the exact q(u) update of the Gaussian likelihood every step, so with M = N the
    bound after 30 epochs is far above Adam's (Adam moves M + M(M+1)/2 variational numbers at lr)."""
    from flowgp import SVGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (60, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(60)
    common = dict(num_inducing=60, epochs=30, verbose=False, kmeans_restarts=1)
    adam = SVGPRegressor(natural_gradient=None, **common).fit(X, y)
    natural = SVGPRegressor(natural_gradient=1.0, **common).fit(X, y)
    assert natural.elbo(X, y) > adam.elbo(X, y) + 20
    for bad in (0.0, 1.5, True, "1"):
        with pytest.raises(ValueError, match="natural_gradient"):
            SVGPRegressor(natural_gradient=bad, **common).fit(X, y)


def test_deep_gp_files_saved_with_the_old_warm_start_name_still_load(tmp_path):
    """The deep estimators' `warm_start` became `dsvi_warmup` (scikit-learn reserves the name); a file saved
    before the rename stores params['warm_start'] and must load, with the value moved to the new name."""
    from flowgp import DeepGPRegressor
    from flowgp.training.checkpoint import atomic_save, safe_load

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (20, 2))
    y = np.sin(2 * X[:, 0])
    est = DeepGPRegressor(layers=2, num_inducing=4, epochs=2, num_samples_predict=5, verbose=False,
                          kmeans_restarts=1).fit(X, y)
    path = tmp_path / "new.pt"
    est.save(path)
    state = safe_load(path)
    state["params"]["warm_start"] = state["params"].pop("dsvi_warmup")  # the file an older version wrote:
    del state["format_version"]  # ... without a format version (version 1)
    old = tmp_path / "old.pt"
    atomic_save(state, old)
    from flowgp.compat import SavedFileUpgradeWarning

    with pytest.warns(SavedFileUpgradeWarning, match="warm_start -> dsvi_warmup"):
        loaded = DeepGPRegressor.load(old)
    assert loaded.dsvi_warmup == est.dsvi_warmup and "warm_start" not in loaded.get_params()
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
