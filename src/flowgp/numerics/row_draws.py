"""Random draws per row of a minibatch that do not depend on how the batch is split over processes.

Data-parallel training (flowgp.training.distributed) gives every rank rows offset..offset+n of one global batch of B
rows; a model that draws per row (hidden-layer noise, importance samples, dropout masks, Monte Carlo latents)
then draws for all B rows from the generator every rank holds in the same state, and keeps its own rows' slice.
So a row's draw is the same for any number of processes, and one process (offset 0, B = n) draws as before.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import torch

__all__ = ["draw_rows", "derived_generator", "generator_copy"]


# not traced by torch.compile: `draw` takes a torch.Generator, which is a graph break wherever it is called, and
# tracing the rest specialised on `dim` and the shape, so every layer's call recompiled this frame until dynamo's
# recompile limit (8) and a deep GP's compiled step logged the limit and ran it eagerly from then on anyway
@torch.compiler.disable
def draw_rows(draw: Callable[[tuple], torch.Tensor], shape: Sequence[int], batch_rows=None,
              dim: int = -2) -> torch.Tensor:
    """`draw(shape)` for a tensor whose axis `dim` holds the batch's rows; with `batch_rows` = (offset, B) the
    rows offset..offset+shape[dim] of `draw` of the same shape with B rows (see the module docstring), and with
    `batch_rows` = (index, B), index a long tensor of shape[dim] row numbers, those rows of it (e.g. a random
    subset of the global batch, of which this process holds some)."""
    shape = tuple(int(v) for v in shape)
    if batch_rows is None:
        return draw(shape)
    where, rows = batch_rows[0], int(batch_rows[1])
    dim %= len(shape)
    full = draw(shape[:dim] + (rows,) + shape[dim + 1:])
    if isinstance(where, torch.Tensor):
        return full.index_select(dim, where)
    return full.narrow(dim, int(where), shape[dim])


def _parent(generator, device):
    if generator is not None:
        return generator
    if device.type == "cpu":
        return torch.default_generator
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


# not traced by torch.compile: reading a generator's state is a graph break anyway, and tracing into it made the
# compiled deep-GP step guard on the state's bytes and recompile at every step until its recompile limit
@torch.compiler.disable
def generator_copy(generator: torch.Generator | None, device) -> torch.Generator:
    """A new generator on `device` in `generator`'s current state (None: torch's default generator of that
    device, read only): it replays the draws `generator` is about to make."""
    device = torch.device(device)
    copy = torch.Generator(device=device)
    copy.set_state(_parent(generator, device).get_state())
    return copy


@torch.compiler.disable  # as `generator_copy`
def derived_generator(generator: torch.Generator | None, device) -> torch.Generator:
    """A new generator on `device` seeded from a hash of `generator`'s current state, which is read, not advanced
    (None: torch's default generator of that device, read only).

    For draws that must not shift a stream another computation shares: a deep GP's coupled flow draws come from
    here so that its DSVI part consumes exactly the random numbers a DSVI model would. The derived draws are a
    deterministic function of the parent's state, so a run resumed from a checkpoint (which holds the parent's
    state) repeats them without storing anything more.
    """
    device = torch.device(device)
    digest = hashlib.blake2b(_parent(generator, device).get_state().cpu().numpy().tobytes(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)
