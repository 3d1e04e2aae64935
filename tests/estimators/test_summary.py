"""A fitted estimator describes itself: summary() in the data's units; sample_y draws from the predictive."""
import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

import flowgp
from flowgp import (AlignedMultiOutputGPRegressor, DeepGPClassifier, DeepGPRegressor, LatentDeepGPRegressor,
                    SVGPClassifier, SVGPRegressor, TGPClassifier, TGPRegressor, WarpedGPRegressor)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.uniform(-2, 2, n), rng.uniform(0, 1, n)])
    return x, np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.standard_normal(n)


def _small(cls, **kw):
    return cls(**{"num_inducing": 8, "epochs": 30, "kmeans_restarts": 1, "verbose": False, **kw})


def _lengthscales(summary, section="kernel", name="lengthscale"):
    return np.array(list(summary[section][name].values()))


# ----- summary ------------------------------------------------------------------------------------------------
def test_svgp_summary_is_the_models_parameters_in_data_units():
    x, y = _data()
    est = _small(SVGPRegressor).fit(x, y)
    s = est.summary(as_dict=True)
    kernel, noise = est.model_.gp.kernel, est.model_.likelihood.noise
    np.testing.assert_allclose(_lengthscales(s), kernel.base.lengthscale.detach().numpy().ravel() * est.x_std_)
    assert s["kernel"]["variance"] == pytest.approx(float(kernel.variance.detach()) * est.y_scale_ ** 2, rel=1e-12)
    assert s["likelihood"]["noise variance"] == pytest.approx(float(noise.detach()) * est.y_scale_ ** 2, rel=1e-12)
    assert s["training"] == {"inducing points": 8, "epochs run": 30,
                             "bound per point": pytest.approx(-est.history_[-1] - math.log(est.y_scale_))}
    assert s["units"]["kernel"]["lengthscale"] == {"x0": "x0's units", "x1": "x1's units"}
    assert s["units"]["likelihood"]["noise variance"] == "y's units²"


@pytest.mark.parametrize("cls", [SVGPRegressor, TGPRegressor])
def test_rescaled_data_rescale_the_summary(cls):
    """Inputs x 10 and targets x 3 (+ 5): the same fit in standardised units, so lengthscales x 10, y's
    variances x 9, the latent f₀'s variance and the flow unchanged, the bound per point down by log 3."""
    x, y = _data()
    options = {"robust": False} if cls is TGPRegressor else {}  # (the robust fit's L-BFGS stage amplifies rounding)
    a = _small(cls, **options).fit(x, y).summary(as_dict=True)
    b = _small(cls, **options).fit(10 * x, 3 * y + 5).summary(as_dict=True)
    np.testing.assert_allclose(_lengthscales(b), 10 * _lengthscales(a), rtol=1e-6)
    assert b["likelihood"]["noise variance"] == pytest.approx(9 * a["likelihood"]["noise variance"], rel=1e-6)
    latent = cls is TGPRegressor
    assert b["kernel"]["variance"] == pytest.approx((1 if latent else 9) * a["kernel"]["variance"], rel=1e-6)
    assert b["training"]["bound per point"] == pytest.approx(a["training"]["bound per point"] - math.log(3),
                                                             abs=1e-6)
    if latent:
        assert a["units"]["kernel"]["variance"] == "latent f₀ (dimensionless)"
        for name in ("a", "b", "c", "d"):
            assert b["flow"][name] == pytest.approx(a["flow"][name], rel=1e-5, abs=1e-8)


def test_summary_names_inputs_by_feature_names_and_prints_a_table():
    x, y = _data()
    est = _small(TGPRegressor, flow="sal").fit(x, y)
    est.feature_names_in_ = np.array(["depth", "time"], dtype=object)
    text = str(est.summary())
    assert text.startswith("TGPRegressor, fitted (flow 'sal', kernel 'rbf')")
    for piece in ("lengthscale[depth]", "lengthscale[time]", "depth's units", "noise variance", "y's units²",
                  "bound per point", "nats, y's units (full-data bound)", "output map"):
        assert piece in text, piece
    assert repr(est.summary()) == text
    flow = est.summary(as_dict=True)["flow"]
    params = est.model_.flow.params()
    assert flow["spec"] == "sal" and all(flow[k] == pytest.approx(float(params[k].detach())) for k in "abcd")


def test_repr_stays_scikit_learns_and_unfitted_summary_says_fit_first():
    est = _small(SVGPRegressor)
    with pytest.raises(NotFittedError, match="fit"):
        est.summary()
    before = repr(est)
    est.fit(*_data())
    assert repr(est) == before == repr(clone(est))


def test_saved_and_loaded_estimator_has_the_same_summary(tmp_path):
    est = _small(SVGPRegressor).fit(*_data())
    back = flowgp.load(est.save(tmp_path / "m.pt"))
    assert back.summary(as_dict=True) == est.summary(as_dict=True)


def test_warped_gp_reports_latent_units_and_the_map_to_y():
    x, y = _data()
    s = _small(WarpedGPRegressor, flow="log").fit(x, np.exp(y)).summary(as_dict=True)
    assert s["units"]["kernel"]["variance"] == s["units"]["likelihood"]["noise variance"] == \
        "z = T(ỹ) (warped, dimensionless)"
    assert s["flow"]["spec"] == "log" and s["flow"]["acts on"].startswith("ỹ = (y - 0) /")


def test_deep_gp_summary_per_layer():
    x, y = _data()
    est = _small(DeepGPRegressor, layers=2, epochs=5).fit(10 * x, y)
    s = est.summary(as_dict=True)
    first, last = est.model_.layers[0].gp.kernel, est.model_.layers[1].gp.kernel
    ls = first.kernels[0].base.lengthscale.detach().numpy()  # [GPs, 1, D]
    np.testing.assert_allclose(_lengthscales(s, "layer 1, GP 2", "rbf lengthscale"), ls[1, 0] * est.x_std_)
    assert s["layer 2"]["variance"] == pytest.approx(float(last.variance.detach()) * est.y_scale_ ** 2)
    assert s["units"]["layer 2"]["lengthscale"] == {"h0": "hidden layer's units", "h1": "hidden layer's units"}
    assert s["training"]["layers"] == 2 and s["training"]["inducing points"] == [8, 8]


def test_latent_deep_gp_names_its_latent_input_and_its_objective():
    x, y = _data()
    est = _small(LatentDeepGPRegressor, layers=2, epochs=3, objective="per-slot", num_samples_predict=50).fit(x, y)
    s = est.summary(as_dict=True)
    assert "objective per point (not a bound)" in s["training"] and "bound per point" not in s["training"]
    assert s["units"]["layer 1, GP 1"]["rbf lengthscale"]["w0"] == "latent input w ~ N(0, I) (dimensionless)"
    assert set(s["layer 1, GP 1"]["rbf lengthscale"]) == {"x0", "x1", "w0"}


@pytest.mark.parametrize("cls", [SVGPClassifier, TGPClassifier, DeepGPClassifier])
def test_classifier_summaries(cls):
    x, y = _data()
    est = _small(cls, epochs=5).fit(x, (y > 0).astype(int))
    s = est.summary(as_dict=True)
    assert "noise variance" not in str(s) and s["units"]["training"]["bound per point"].startswith("nats (")
    sections = [k for k in s if k.startswith(("kernel", "layer"))]
    assert sections and all(set(next(iter(v for v in s[k].values() if isinstance(v, dict)))) == {"x0", "x1"}
                            for k in sections[:1])


def test_amogp_summary_per_output():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 5, (40, 1))
    output = rng.integers(0, 2, 40)
    y = 10 * np.sin(x[:, 0] + output) + rng.standard_normal(40)
    est = AlignedMultiOutputGPRegressor(num_inducing=5, epochs=3, verbose=False).fit(x, y, output)
    s = est.summary(as_dict=True)
    for d in (0, 1):
        assert s[f"output {d}"]["noise variance"] == pytest.approx(
            float(est.model_.noise.detach()[d]) * est.y_std_[d] ** 2)
        assert s[f"output {d}"]["CP smoothing lengthscale"] == pytest.approx(
            float(est.model_.kernel.lengthscale.detach()[d, 0, 0]) * np.ravel(est.x_std_)[0])


# ----- sample_y -----------------------------------------------------------------------------------------------
REGRESSORS = [
    (SVGPRegressor, {}),
    (TGPRegressor, {"flow": "sal"}),
    (WarpedGPRegressor, {"flow": "sal"}),
    (DeepGPRegressor, {"layers": 2, "num_samples_predict": 4000}),
    (LatentDeepGPRegressor, {"layers": 1, "num_samples_predict": 4000}),
]


@pytest.fixture(scope="module")
def fitted():
    x, y = _data()
    return x, {cls: _small(cls, **kw).fit(x, y) for cls, kw in REGRESSORS}


@pytest.mark.parametrize("cls", [cls for cls, _ in REGRESSORS])
def test_sample_y_matches_predict_within_monte_carlo_error(fitted, cls):
    x, models = fitted
    est, rows, s = models[cls], x[:5], 4000
    draws = est.sample_y(rows, n_samples=s, random_state=1)
    assert draws.shape == (5, s)
    mean, std = est.predict(rows, return_std=True)
    centred = draws - draws.mean(1, keepdims=True)
    var = centred.var(1)
    # 5 standard errors of the draws' mean and variance (the latter from their own fourth moment)
    assert np.all(np.abs(draws.mean(1) - mean) < 5 * np.sqrt(var / s))
    assert np.all(np.abs(var - std ** 2) < 5 * np.sqrt((centred ** 4).mean(1) - var ** 2) / np.sqrt(s))


@pytest.mark.parametrize("cls", [cls for cls, _ in REGRESSORS])
def test_sample_y_shapes_and_seeds(fitted, cls):
    x, models = fitted
    est = models[cls]
    one = est.sample_y(x[:3])
    assert one.shape == (3, 1)  # scikit-learn's default: one draw
    a, b = est.sample_y(x[:3], 4, random_state=7), est.sample_y(x[:3], 4, random_state=7)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, est.sample_y(x[:3], 4, random_state=8))
    np.testing.assert_array_equal(est.sample_y(x[:3], 4), est.sample_y(x[:3], 4, random_state=est.seed))
    np.testing.assert_array_equal(est.sample_y(x[:3], 4, random_state=np.random.RandomState(3)),
                                  est.sample_y(x[:3], 4, random_state=np.random.RandomState(3)))


def test_sample_y_draws_functions_jointly_over_the_rows(fitted):
    """Two nearby inputs: their draws move together (correlation of f near 1 for a smooth fit)."""
    x, models = fitted
    est = models[SVGPRegressor]
    draws = est.sample_y(np.array([[0.3, 0.5], [0.3001, 0.5]]), 4000, random_state=0)
    noise = est.summary(as_dict=True)["likelihood"]["noise variance"]
    covariance = np.cov(draws)
    # the two rows share f: their covariance is the total variance less the noise
    assert covariance[0, 1] == pytest.approx(covariance[0, 0] - noise, abs=0.15 * covariance[0, 0])


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (2.5, ValueError)])
def test_sample_y_refuses_a_bad_count(fitted, bad, error):
    x, models = fitted
    with pytest.raises(error, match="n_samples"):
        models[SVGPRegressor].sample_y(x[:2], bad)


def test_sample_y_refuses_a_bad_random_state(fitted):
    x, models = fitted
    with pytest.raises(TypeError, match="random_state"):
        models[SVGPRegressor].sample_y(x[:2], 2, random_state="seed")
