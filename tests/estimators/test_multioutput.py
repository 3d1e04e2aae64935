"""The AMO-GP estimator (flowgp.estimators.multioutput): each series standardised with its own shift and scale
and predicted in its own units, the Gaussian interval in closed form, a saved file that predicts the same, and the
`output` argument checked before any work."""
import numpy as np
import pytest
from scipy.stats import norm

from flowgp import AlignedMultiOutputGPRegressor

FAST = dict(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, epochs=5, num_samples=5,
            verbose=False)


def _data(n=25):
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 5, (2, n)), axis=1)
    # two series on very different scales: 0 around 0 (unit size), 1 around 100 (size 10)
    y = np.concatenate([np.sin(t[0]), 100 + 10 * np.sin(t[1] + 0.3)]) + 0.05 * rng.standard_normal(2 * n)
    return t.reshape(-1, 1), y, np.repeat([0, 1], n)


@pytest.fixture(scope="module")
def fitted():
    X, y, o = _data()
    return AlignedMultiOutputGPRegressor(**FAST).fit(X, y, o), X, y, o


def test_each_series_is_standardised_alone_and_predicted_in_its_units(fitted):
    est, X, y, o = fitted
    np.testing.assert_allclose(est.y_mean_, [y[o == 0].mean(), y[o == 1].mean()], rtol=1e-12)
    np.testing.assert_allclose(est.y_std_, [y[o == 0].std(), y[o == 1].std()], rtol=1e-12)
    mean, std = est.predict(X, o, return_std=True)
    assert mean.shape == std.shape == (len(y),) and (std > 0).all()
    for i in (0, 1):  # even after a few epochs the predictions sit in the series' own range
        assert abs(mean[o == i].mean() - y[o == i].mean()) < y[o == i].std()
    assert std[o == 1].mean() > 5 * std[o == 0].mean()  # series 1 is ten times larger


def test_the_gaussian_interval_is_the_mean_plus_minus_the_normal_quantile(fitted):
    est, X, _, o = fitted
    mean, std = est.predict(X[:6], o[:6], return_std=True)
    lo, hi = est.predict_interval(X[:6], o[:6], level=0.9)
    np.testing.assert_allclose(lo, mean - norm.ppf(0.95) * std, rtol=1e-12)
    np.testing.assert_allclose(hi, mean + norm.ppf(0.95) * std, rtol=1e-12)
    with pytest.raises(ValueError, match="method must be 'gaussian' or 'samples'"):
        est.predict_interval(X[:6], o[:6], method="exact")


def test_a_saved_model_predicts_the_same(fitted, tmp_path):
    est, X, y, o = fitted
    loaded = AlignedMultiOutputGPRegressor.load(est.save(tmp_path / "amogp.pt"))
    for a, b in zip(loaded.predict(X, o, return_std=True), est.predict(X, o, return_std=True)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("output, match", [
    (None, "output is required"), (np.zeros((3, 1), dtype=int), "output must be 1-D"),
    (np.zeros(2, dtype=int), "output has 2 entries but X has 3 rows"), (np.array([0.5, 0, 1]), "integer"),
    (np.array([0, 1, 2]), r"lie in 0..1"),
])
def test_the_output_argument_is_checked(fitted, output, match):
    est, X, _, _ = fitted
    with pytest.raises(ValueError, match=match):
        est.predict(X[:3], output)


def test_inputs_must_be_one_dimensional():
    X, y, o = _data(8)
    with pytest.raises(ValueError, match="exactly one feature"):
        AlignedMultiOutputGPRegressor(**FAST).fit(np.hstack([X, X]), y, o)
