"""Scale: k-means on a bounded sample of rows, a Cholesky jitter that remembers its level and warns
once per fit, and prediction in chunks of bounded memory that does not depend on which rows are predicted
together."""
import warnings

import numpy as np
import pytest
import torch

from flowgp.gp.inducing import KMEANS_MAX_ROWS, kmeans_inducing_points
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.numerics.linalg import CholeskyJitterWarning, JitterMemory, robust_cholesky
from flowgp.models import SVGP
from flowgp.training.loop import train


# ----- k-means on a bounded sample -------------------------------------------------------------------------
def _record_kmeans(monkeypatch):
    from sklearn.cluster import KMeans

    seen = []
    original = KMeans.fit

    def fit(self, X, *args, **kwargs):
        seen.append((np.asarray(X).shape[0], self.n_init))
        return original(self, X, *args, **kwargs)

    monkeypatch.setattr(KMeans, "fit", fit)
    return seen


def test_kmeans_on_large_n_uses_a_bounded_sample_and_one_restart(monkeypatch):
    seen = _record_kmeans(monkeypatch)
    x = np.random.default_rng(0).normal(size=(KMEANS_MAX_ROWS + 5000, 2))
    z = kmeans_inducing_points(x, 4)
    assert seen == [(KMEANS_MAX_ROWS, 1)]
    assert z.shape == (4, 2) and np.isfinite(z).all()
    np.testing.assert_array_equal(z, kmeans_inducing_points(x, 4))  # seeded: the same sample every time
    assert not np.array_equal(z, kmeans_inducing_points(x, 4, seed=1))


def test_kmeans_on_small_n_is_unchanged(monkeypatch):
    from sklearn.cluster import KMeans

    x = np.random.default_rng(1).normal(size=(300, 3))
    expected = KMeans(n_clusters=6, n_init=10, random_state=0).fit(x).cluster_centers_
    seen = _record_kmeans(monkeypatch)
    np.testing.assert_array_equal(kmeans_inducing_points(x, 6), expected)
    assert seen == [(300, 10)]


def test_kmeans_row_bound_is_configurable_and_validated(monkeypatch):
    seen = _record_kmeans(monkeypatch)
    x = np.random.default_rng(2).normal(size=(500, 2))
    kmeans_inducing_points(x, 3, restarts=4, max_rows=100, large_restarts=None)
    kmeans_inducing_points(x, 3, restarts=4, max_rows=None)
    assert seen == [(100, 4), (500, 4)]
    with pytest.raises(ValueError, match="max_rows"):
        kmeans_inducing_points(x, 3, max_rows=0)
    with pytest.raises(ValueError, match="large_restarts"):
        kmeans_inducing_points(x, 3, large_restarts=0)


# ----- jitter memory ---------------------------------------------------------------------------------------
def _nearly_singular(n=4):
    return torch.ones(n, n, dtype=torch.float64) - 1e-9 * torch.eye(n, dtype=torch.float64)  # eigenvalue -1e-9


def test_zero_jitter_can_grow():
    with pytest.warns(CholeskyJitterWarning):
        chol = robust_cholesky(_nearly_singular(), jitter=0.0)
    assert torch.isfinite(chol).all()


def test_jitter_memory_starts_from_the_last_working_level_and_warns_once():
    memory = JitterMemory()
    with pytest.warns(CholeskyJitterWarning):
        first = robust_cholesky(_nearly_singular(), jitter=1e-12, memory=memory)
    assert memory.level is not None and memory.level > 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = robust_cholesky(_nearly_singular(), jitter=1e-12, memory=memory)
        # even a matrix that needs more jitter still grows, silently within the same fit
        worse = torch.ones(4, 4, dtype=torch.float64) - 1e-5 * torch.eye(4, dtype=torch.float64)
        robust_cholesky(worse, jitter=1e-12, memory=memory)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert memory.level > 1e-5
    memory.start_fit()
    with pytest.warns(CholeskyJitterWarning):
        robust_cholesky(torch.ones(4, 4, dtype=torch.float64) - 0.5 * torch.eye(4, dtype=torch.float64),
                        jitter=1e-12, memory=memory)


def test_well_conditioned_factor_is_unchanged_by_memory():
    a = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    k = a @ a.T + torch.eye(5, dtype=torch.float64)
    memory = JitterMemory()
    torch.testing.assert_close(robust_cholesky(k, memory=memory), robust_cholesky(k), rtol=0, atol=0)
    assert memory.level is None


def test_fit_with_singular_kzz_warns_once_not_once_per_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, dtype=torch.float64, generator=gen)
    y = torch.sin(6 * x)
    z = torch.cat([x[:5], x[:5]])  # duplicated inducing points: K_ZZ is singular at every step
    model = SVGP(make_kernel("rbf", 1), z, GaussianLikelihood(0.1), jitter=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, x, y, epochs=15, verbose=False, lr=0.01)
        train(model, x, y, epochs=5, verbose=False, lr=0.01)
    jitter_warnings = [w for w in caught if issubclass(w.category, CholeskyJitterWarning)]
    assert 1 <= len(jitter_warnings) <= 2, [str(w.message) for w in jitter_warnings]
    assert model.gp.jitter_memory.level > 0


# ----- prediction in chunks of bounded memory --------------------------------------------------------------
from flowgp.estimators import (DeepGPRegressor, LatentDeepGPRegressor, SVGPRegressor,  # noqa: E402
                               TGPRegressor, WarpedGPRegressor)
from flowgp.estimators.chunking import chunk_rows, map_row_chunks  # noqa: E402

TINY = dict(num_inducing=5, epochs=3, verbose=False, kmeans_restarts=1)
ESTIMATORS = {
    "svgp": lambda: SVGPRegressor(**TINY),
    "tgp": lambda: TGPRegressor(flow="sal", **TINY),
    "tgp-input-dependent": lambda: TGPRegressor(flow="sal", input_dependent=True, hidden=(4,), mc_samples_predict=4,
                                                flow_init_epochs=2, **TINY),
    "wgp": lambda: WarpedGPRegressor(flow="sal", **TINY),
    "dgp": lambda: DeepGPRegressor(layers=2, num_samples_predict=6, **TINY),
    "ldgp": lambda: LatentDeepGPRegressor(layers=2, num_samples_predict=6, hidden_width=2, **TINY),
}
#: predictions that draw nothing at random: row-wise results must not depend on which rows come together
DETERMINISTIC = ("svgp", "tgp", "wgp")
#: Monte Carlo predictions whose draws are shared by every row (common random numbers replayed from the seed)
ROW_WISE = DETERMINISTIC + ("dgp",)


def _regression_data(n=23):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(n, 2))
    return x, np.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.05 * rng.normal(size=n)


def _spy_rows(monkeypatch, model):
    """Record the number of rows of every x the fitted model is asked to predict at."""
    seen = []
    for name in ("predict", "predict_quantiles", "log_predictive_density", "sample_f", "sample_y", "prior_marginals"):
        original = getattr(model, name, None)
        if original is None:
            continue

        def spy(x, *args, _original=original, **kwargs):
            seen.append(x.shape[0])
            return _original(x, *args, **kwargs)

        monkeypatch.setattr(model, name, spy)
    return seen


def _row_wise_outputs(est, x, y):
    out = {"mean": est.predict(x), "std": est.predict(x, return_std=True)[1],
           "quantiles": est.predict_quantiles(x, [0.1, 0.5, 0.9]), "interval": np.stack(est.predict_interval(x, 0.8)),
           "lpd": est.log_predictive_density(x, y)}
    if not isinstance(est, (SVGPRegressor,)) or isinstance(est, (DeepGPRegressor, LatentDeepGPRegressor)):
        out["sample_f"] = est.sample_f(x, 3, seed=4)
    return out


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_regression_prediction_runs_in_bounded_chunks(name, monkeypatch):
    x, y = _regression_data()
    est = ESTIMATORS[name]().fit(x, y)
    whole = _row_wise_outputs(est, x, y)
    est.predict_memory = 1  # smallest budget: one row per chunk
    seen = _spy_rows(monkeypatch, est.model_)
    chunked = _row_wise_outputs(est, x, y)
    assert seen and max(seen) == 1, seen
    for key, value in whole.items():
        assert chunked[key].shape == value.shape and np.isfinite(chunked[key]).all(), key
        if name in ROW_WISE and key != "sample_f":
            np.testing.assert_allclose(chunked[key], value, rtol=1e-10, atol=1e-10, err_msg=key)


@pytest.mark.parametrize("name", ROW_WISE)
def test_row_wise_predictions_do_not_depend_on_the_other_rows(name):
    x, y = _regression_data()
    est = ESTIMATORS[name]().fit(x, y)
    together = _row_wise_outputs(est, x, y)
    order = np.random.default_rng(1).permutation(len(x))[:9]
    subset = _row_wise_outputs(est, x[order], y[order])
    for key, value in together.items():
        if key == "sample_f":  # draws independent across rows: a row's draw depends on its position
            continue
        np.testing.assert_allclose(subset[key], value[..., order], rtol=1e-10, atol=1e-10, err_msg=key)
    alone = est.predict_quantiles(x[3:4], [0.2, 0.7])
    np.testing.assert_allclose(alone[:, 0], est.predict_quantiles(x, [0.2, 0.7])[:, 3], rtol=1e-10, atol=1e-10)


def test_chunk_helpers():
    assert chunk_rows(100, 8, budget=8 * 100 * 4 * 10) == 10
    assert chunk_rows(10**9, 8, budget=10) == 1
    with pytest.raises(ValueError, match="budget"):
        chunk_rows(10, budget=0)
    calls = []

    def f(a, b):
        calls.append(a.shape[0])
        return a + b, (a * b).unsqueeze(1)

    a, b = torch.arange(10.0), torch.ones(10)
    s, p = map_row_chunks(f, [a, b], 4)
    assert calls == [4, 4, 2]
    torch.testing.assert_close(s, a + 1)
    torch.testing.assert_close(p, a[:, None])
    calls.clear()
    map_row_chunks(f, [a, b], 10)
    assert calls == [10]  # one call when everything fits
    # rows on dim 1 of the output (quantiles [P, N]): chunks land in their own columns, last chunk short
    q = map_row_chunks(lambda x: torch.stack([x, 2 * x]), [a], 3, dim=1)
    torch.testing.assert_close(q, torch.stack([a, 2 * a]))


_PEAK_SCRIPT = r"""
import resource, sys
import numpy as np
from flowgp.estimators import DeepGPRegressor
rng = np.random.default_rng(0)
x = rng.uniform(-2, 2, size=(60, 2)); y = np.sin(x[:, 0])
est = DeepGPRegressor(layers=2, num_inducing=40, num_samples_predict=50, epochs=1, verbose=False,
                      kmeans_restarts=1).fit(x, y)
est.predict_memory = 16 * 2**20
big = rng.uniform(-2, 2, size=(5000, 2))
est.predict(big[:100], return_std=True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mean, std = est.predict(big, return_std=True)
q = est.predict_quantiles(big, [0.05, 0.95])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert np.isfinite(mean).all() and np.isfinite(q).all()
print((after - before) / 1024)
"""


def test_deep_gp_prediction_peak_memory_is_bounded():
    """Unchunked, this prediction raises the peak resident memory by about 250 MB ([S=50, N=5 000, M=40]
    tensors and their temporaries); within a 16 MB budget it grows by a few MB."""
    import os
    import subprocess
    import sys

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grown_mb = float(out.stdout.strip().splitlines()[-1])
    assert grown_mb < 80, f"prediction raised the peak resident memory by {grown_mb:.0f} MB"


@pytest.mark.parametrize("name, likelihood, classes", [("SVGPClassifier", None, 2), ("SVGPClassifier", "softmax", 3),
                                                       ("TGPClassifier", None, 2)])
def test_classifier_prediction_chunks_follow_predict_memory(name, likelihood, classes, monkeypatch):
    """The classifiers sized chunks as a fixed 2 048 rows; they now follow `predict_memory` as the regressors do,
    and the probabilities do not depend on the chunking (draws shared by every row)."""
    import flowgp

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (40, 2))
    y = np.digitize(x[:, 0], np.linspace(-2, 2, classes + 1)[1:-1])
    kwargs = dict(num_inducing=5, epochs=3, verbose=False, kmeans_restarts=1)
    if likelihood:
        kwargs["likelihood"] = likelihood
    est = getattr(flowgp, name)(**kwargs).fit(x, y)
    seen = []
    original = est.model_.predict_proba

    def spy(x, *args, **kwargs):
        seen.append(x.shape[0])
        return original(x, *args, **kwargs)

    monkeypatch.setattr(est.model_, "predict_proba", spy)
    whole, lpd = est.predict_proba(x), est.log_predictive_density(x, y)
    assert seen == [40, 40]  # the default budget holds these rows at once
    est.predict_memory = 1
    seen.clear()
    chunked = est.predict_proba(x)
    assert seen == [1] * 40
    np.testing.assert_allclose(chunked, whole, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(est.log_predictive_density(x, y), lpd, rtol=1e-12, atol=1e-14)
