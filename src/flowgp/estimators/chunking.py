"""Prediction over rows in chunks of bounded memory, shared by every regression estimator.

A prediction's working memory grows linearly in the number of rows N (the projection A = Lz⁻¹ K_ZX is
[M, N] per sample, a deep GP pushes S samples of every row through every layer, the quantile solver holds
[P, N, ...] mixtures), so 200 000 rows can ask for gigabytes at once. Rows are independent given the fitted
model, so predicting them in chunks and concatenating gives the same answer within a bounded budget.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["PREDICT_MEMORY_BYTES", "FAST_CHUNK_ROWS", "chunk_rows", "map_row_chunks", "inducing_row_elements"]

#: default working-memory budget of one prediction call (bytes); an estimator's `predict_memory` overrides it
PREDICT_MEMORY_BYTES = 256 * 2**20

#: most rows per chunk whatever the memory budget: past about 10 000 rows a chunk's [rows, M] kernel matrices
#: leave the CPU's caches and every row costs more (SVGP, M = 100, one thread: 200 000 rows predicted in 0.21 s of
#: CPU time in chunks of 5 000-10 000 rows, 0.38 s in the 19 784-row chunks the 256 MB budget allowed;
#: benchmarks/perf/estimator_overhead.py)
FAST_CHUNK_ROWS = 8192

#: temporaries per estimated element (kernel matrices, their squares and exponentials, broadcast copies)
_TEMPORARIES = 4


def chunk_rows(row_elements: int, itemsize: int = 8, budget: int | None = None) -> int:
    """Rows per chunk such that rows × row_elements × itemsize × (a few temporaries) stays within `budget` bytes
    (default PREDICT_MEMORY_BYTES), and at most FAST_CHUNK_ROWS (larger chunks are slower per row); at least one
    row."""
    budget = PREDICT_MEMORY_BYTES if budget is None else budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"the prediction memory budget must be a positive number of bytes, got {budget!r}")
    per_row = max(1, int(row_elements)) * max(1, int(itemsize)) * _TEMPORARIES
    return max(1, min(budget // per_row, FAST_CHUNK_ROWS))


def inducing_row_elements(model) -> int:
    """Floats one row (one sample) of a prediction holds for the projections onto every layer's inducing inputs:
    the sum of M + D over the model's `inducing_points` parameters [..., M, D] (at least 1)."""
    shapes = [p.shape for name, p in model.named_parameters() if name.endswith("inducing_points")]
    total = sum(shape[-2] + shape[-1] for shape in shapes) if shapes else 1
    if getattr(getattr(model, "posterior", None), "gaussian_base", False):
        # a Gaussian-base flow predicts with coupled draws of U per point (DeepGP.predict_components): Rᵀa, ξ and
        # V of every layer per row and sample
        total += 3 * sum(layer.output_dim * layer.num_inducing for layer in model.layers)
    return total


def map_row_chunks(function: Callable, tensors: Sequence[torch.Tensor], rows: int, dim: int = 0):
    """function(*chunk) for consecutive chunks of at most `rows` rows (dimension 0 of every tensor),
    concatenated along `dim` (the row dimension of the outputs; tuples of outputs are concatenated elementwise).

    `function` is called exactly once, on the whole input, when it fits in one chunk, so that small predictions
    are the same computation as before chunking existed.

    The outputs are written into tensors allocated once, after the first chunk, rather than collected and
    concatenated: many small per-chunk outputs kept alive between the chunks' large, freed temporaries split
    the allocator's free blocks, so each new chunk took fresh memory and the peak grew with the number of rows
    (DeepGPRegressor.predict on 20 000 rows: 1 453 MB collected, 741 MB written in place; 2 000 rows: 756 MB).
    """
    n = tensors[0].shape[0]
    if n <= rows:
        return function(*tensors)
    first = function(*(t[:rows] for t in tensors))
    single = not isinstance(first, tuple)
    outputs = []
    for part in ((first,) if single else first):
        shape = list(part.shape)
        shape[dim] = n
        out = part.new_empty(shape)
        out.narrow(dim, 0, part.shape[dim]).copy_(part)
        outputs.append(out)
    del first, part
    for start in range(rows, n, rows):
        result = function(*(t[start:start + rows] for t in tensors))
        for out, part in zip(outputs, (result,) if single else result):
            out.narrow(dim, start, part.shape[dim]).copy_(part)
        del result, part
    return outputs[0] if single else tuple(outputs)
