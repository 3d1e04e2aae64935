"""Prediction chunks: bounded in memory and in rows (large chunks are slower per row on a CPU)."""
import numpy as np

from flowgp import SVGPRegressor
from flowgp.estimators.chunking import FAST_CHUNK_ROWS, PREDICT_MEMORY_BYTES, chunk_rows


def test_chunk_rows_never_exceed_the_fast_size():
    # a cheap row: the memory budget alone would allow far more rows than FAST_CHUNK_ROWS
    assert PREDICT_MEMORY_BYTES // (100 * 8 * 4) > FAST_CHUNK_ROWS
    assert chunk_rows(100, 8) == FAST_CHUNK_ROWS
    # an expensive row is still sized by the budget
    assert chunk_rows(10**6, 8) == PREDICT_MEMORY_BYTES // (10**6 * 8 * 4)


def test_svgp_predicts_many_rows_in_fast_chunks_with_the_same_answer(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (60, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(60)
    est = SVGPRegressor(num_inducing=5, epochs=2, verbose=False, kmeans_restarts=1).fit(x, y)
    rows = 2 * FAST_CHUNK_ROWS + 5
    xp = rng.uniform(-2, 2, (rows, 2))
    seen = []
    original = est.model_.predict

    def spy(x, *args, **kwargs):
        seen.append(x.shape[0])
        return original(x, *args, **kwargs)

    monkeypatch.setattr(est.model_, "predict", spy)
    mean, std = est.predict(xp, return_std=True)
    assert seen == [FAST_CHUNK_ROWS, FAST_CHUNK_ROWS, 5]
    seen.clear()
    alone_mean, alone_std = est.predict(xp[-7:], return_std=True)
    assert seen == [7]
    np.testing.assert_allclose(alone_mean, mean[-7:], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(alone_std, std[-7:], rtol=1e-12, atol=1e-14)
