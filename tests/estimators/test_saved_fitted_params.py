"""A saved model is the fitted model: save() records the parameters the model was fitted with (the snapshot
taken at fit), not a set_params made after it (which scikit-learn allows without a refit)."""
import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

import flowgp
from flowgp import DeepGPRegressor, SVGPClassifier, SVGPRegressor

FAST = dict(num_inducing=6, epochs=15, verbose=False, kmeans_restarts=1)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    return x, np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=n)


def _round_trip(est, tmp_path):
    est.save(tmp_path / "m.pt")
    return flowgp.load(tmp_path / "m.pt")


def test_regressor_saved_after_a_kernel_change_keeps_its_fitted_kernel(tmp_path):
    x, y = _data()
    est = SVGPRegressor(kernel="rbf", **FAST).fit(x, y)
    fitted = est.predict(x, return_std=True)
    est.set_params(kernel="matern32")
    loaded = _round_trip(est, tmp_path)
    assert est.kernel == "matern32" and loaded.kernel == "rbf"
    for a, b in zip(loaded.predict(x, return_std=True), fitted):
        np.testing.assert_array_equal(a, b)


def test_classifier_saved_after_a_likelihood_change_keeps_its_fitted_likelihood(tmp_path):
    x, _ = _data(60)
    labels = np.digitize(x[:, 0] + 0.3 * x[:, 1], [-0.5, 0.5])  # three classes
    est = SVGPClassifier(likelihood="softmax", mc_samples=4, predict_samples=32, **FAST).fit(x, labels)
    fitted = est.predict_proba(x)
    est.set_params(likelihood="robustmax")
    loaded = _round_trip(est, tmp_path)
    assert loaded.likelihood == "softmax"
    np.testing.assert_array_equal(loaded.predict_proba(x), fitted)


def test_deep_gp_saved_after_a_layers_change_loads_as_fitted(tmp_path):
    x, y = _data()
    est = DeepGPRegressor(layers=2, num_samples_predict=8, predict_quadrature_points=20, **FAST).fit(x, y)
    fitted = est.predict(x)
    est.set_params(layers=3)
    loaded = _round_trip(est, tmp_path)  # the file of the 2-layer model it is
    assert loaded.layers == 2 and len(loaded.model_.layers) == 2
    np.testing.assert_array_equal(loaded.predict(x), fitted)


def test_a_refit_records_its_own_parameters(tmp_path):
    x, y = _data()
    est = SVGPRegressor(kernel="rbf", **FAST).fit(x, y)
    est.set_params(kernel="matern32").fit(x, y)
    assert est.fitted_params_["kernel"] == "matern32"
    np.testing.assert_array_equal(_round_trip(est, tmp_path).predict(x), est.predict(x))


def test_a_refit_that_fails_leaves_no_model_to_save(tmp_path):
    x, y = _data()
    est = SVGPRegressor(**FAST).fit(x, y)
    est.set_params(kernel="matern32")
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(x, bad)
    # never the rbf model of the first fit under the second fit's parameters or scaling
    with pytest.raises(NotFittedError):
        est.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
