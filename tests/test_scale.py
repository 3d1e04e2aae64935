"""Issue 23, "Scale": k-means on a bounded sample of rows, a Cholesky jitter that remembers its level and warns
once per fit, and prediction in chunks of bounded memory that does not depend on which rows are predicted
together."""
import warnings

import numpy as np
import pytest
import torch

from flowgp.inducing import KMEANS_MAX_ROWS, kmeans_inducing_points
from flowgp.kernels import make_kernel
from flowgp.likelihoods import GaussianLikelihood
from flowgp.linalg import CholeskyJitterWarning, JitterMemory, robust_cholesky
from flowgp.models import SVGP
from flowgp.training import train


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
