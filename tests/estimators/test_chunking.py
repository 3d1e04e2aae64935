"""Prediction in row chunks of bounded memory (flowgp.estimators.chunking): the rows per chunk in closed form,
chunked results equal to one call, a single call when everything fits, and the memory estimate of a model.

Prediction chunks: bounded in memory and in rows (large chunks are slower per row on a CPU)."""

import numpy as np
import pytest
import torch

from flowgp.estimators.chunking import (FAST_CHUNK_ROWS, PREDICT_MEMORY_BYTES, chunk_rows, inducing_row_elements,
                                       map_row_chunks)
from flowgp.gp.kernels import make_kernel
from flowgp.models import SVGP
from flowgp import SVGPRegressor


def test_rows_per_chunk_keep_the_budget():
    assert chunk_rows(100, 8, budget=32_000) == 32_000 // (100 * 8 * 4) == 10
    assert chunk_rows(10**9, 8, budget=1024) == 1  # at least one row
    assert chunk_rows(100) == min(PREDICT_MEMORY_BYTES // (100 * 8 * 4), FAST_CHUNK_ROWS)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="memory budget must be a positive number of bytes"):
            chunk_rows(100, 8, budget=bad)


def test_chunked_results_equal_one_call_for_tensors_and_tuples():
    x = torch.randn(23, 3, dtype=torch.float64)
    w = torch.randn(23, dtype=torch.float64)
    calls = []

    def fn(a, b):
        calls.append(a.shape[0])
        return a * b[:, None], (a.sum(-1) + b)[None].expand(2, -1)  # outputs with the rows on dims 0 and 1

    whole = fn(x, w)
    calls.clear()
    first, second = map_row_chunks(lambda a, b: fn(a, b)[0], [x, w], rows=5), \
        map_row_chunks(lambda a, b: fn(a, b)[1], [x, w], rows=5, dim=1)
    torch.testing.assert_close(first, whole[0], rtol=0, atol=0)
    torch.testing.assert_close(second, whole[1], rtol=0, atol=0)
    assert calls == [5, 5, 5, 5, 3] * 2
    both = map_row_chunks(lambda a, b: (a * b[:, None], a.sum(-1)), [x, w], rows=4)
    torch.testing.assert_close(both[1], x.sum(-1), rtol=0, atol=0)


def test_one_call_on_the_whole_input_when_it_fits():
    x = torch.randn(6, 2)
    seen = []
    out = map_row_chunks(lambda a: seen.append(a) or a + 1, [x], rows=6)
    assert len(seen) == 1 and seen[0] is x and torch.equal(out, x + 1)


def test_row_elements_count_the_inducing_inputs():
    model = SVGP(make_kernel("rbf", 3), torch.randn(7, 3, dtype=torch.float64))
    assert inducing_row_elements(model) == 7 + 3
    assert inducing_row_elements(torch.nn.Linear(2, 2)) == 1  # no inducing inputs: at least one element


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
