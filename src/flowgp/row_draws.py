"""Random draws per row of a minibatch that do not depend on how the batch is split over processes.

Data-parallel training (flowgp.distributed) gives every rank rows offset..offset+n of one global batch of B
rows; a model that draws per row (hidden-layer noise, importance samples, dropout masks, Monte Carlo latents)
then draws for all B rows from the generator every rank holds in the same state, and keeps its own rows' slice.
So a row's draw is the same for any number of processes, and one process (offset 0, B = n) draws as before.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["draw_rows"]


def draw_rows(draw: Callable[[tuple], torch.Tensor], shape: Sequence[int], batch_rows=None,
              dim: int = -2) -> torch.Tensor:
    """`draw(shape)` for a tensor whose axis `dim` holds the batch's rows; with `batch_rows` = (offset, B) the
    rows offset..offset+shape[dim] of `draw` of the same shape with B rows (see the module docstring)."""
    shape = tuple(int(v) for v in shape)
    if batch_rows is None:
        return draw(shape)
    offset, rows = int(batch_rows[0]), int(batch_rows[1])
    dim %= len(shape)
    return draw(shape[:dim] + (rows,) + shape[dim + 1:]).narrow(dim, offset, shape[dim])
