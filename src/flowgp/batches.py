"""Minibatch samplers: the only way `flowgp.training.train` sees data.

The loop asks a sampler for the batches of the current epoch and never touches the whole data set, so a
data-parallel version only has to wrap the sampler (each rank yields its own share of the rows) and the
gradient reduction. A sampler has `num_data` (N, for the N/B rescaling of the bound), `batch_size`,
`steps_per_epoch`, `device`, iteration over the remaining batches of the current epoch, and
`state_dict()` / `load_state_dict()` that let a resumed run continue in the middle of an epoch with exactly
the rows the uninterrupted run would have used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["Batch", "ArrayBatches"]


@dataclass(frozen=True)
class Batch:
    """One minibatch: inputs x [B, ...], targets y [B, ...] (or None), `index` [B] the rows it holds in the
    data set (long, on the data's device), and `extra` named tensors of the same rows (e.g. an output index)."""

    x: Tensor
    y: Optional[Tensor]
    index: Tensor
    extra: Mapping[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.x.shape[0]


def _rows(name: str, t, n: Optional[int]) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 1:
        raise ValueError(f"{name} must have a leading dimension of rows, got a scalar")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} rows but x has {n}")
    return t


class ArrayBatches:
    """Minibatches of in-memory tensors, reshuffled every epoch by a torch.Generator.

    Args:
        x: inputs [N, ...]. y: targets [N, ...] or None. extra: named tensors [N, ...] cut like x (passed to
            the model as keyword arguments of the same name, e.g. {"output": o}).
        batch_size: B, None (or >= N) for the full batch. The last batch of an epoch holds the N mod B rest.
        shuffle: draw a new order of the rows at the start of every epoch; None (default) shuffles only when
            B < N (a full batch needs no order, and drawing none keeps the generator untouched).
        per_step: instead of one permutation per epoch, every step takes the first B rows of a fresh random
            permutation (independent subsets without replacement, as the DGP-IWVI code samples its batches).
        generator: the torch.Generator of the orders (CPU); default a new one seeded with `seed`.

    The state (`state_dict`) is the generator's state at the start of the current epoch and the number of
    batches already taken from it: loading it replays the epoch's permutation and continues at that batch.
    """

    def __init__(self, x: Tensor, y: Optional[Tensor] = None, batch_size: Optional[int] = None, *,
                 extra: Optional[Mapping[str, Tensor]] = None, shuffle: Optional[bool] = None,
                 per_step: bool = False, generator: Optional[torch.Generator] = None, seed: int = 0):
        x = _rows("x", x, None)
        n = x.shape[0]
        if n < 1:
            raise ValueError("x holds no rows: a sampler needs at least one data point")
        self.x = x
        self.y = None if y is None else _rows("y", y, n)
        self.extra = {str(k): _rows(f"extra[{k!r}]", v, n) for k, v in dict(extra or {}).items()}
        if batch_size is None:
            batch = n
        elif isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        else:
            batch = min(int(batch_size), n)
        self.batch_size = batch
        self.per_step = bool(per_step)
        self.shuffle = (batch < n or self.per_step) if shuffle is None else bool(shuffle)
        if self.per_step and not self.shuffle:
            raise ValueError("per_step=True draws random subsets; it cannot be combined with shuffle=False")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator if generator is not None else torch.Generator().manual_seed(int(seed))
        self._epoch_start = self.generator.get_state()
        self._position = 0
        self._order: Optional[Tensor] = None

    # ----- sizes ----------------------------------------------------------------------------------------
    @property
    def num_data(self) -> int:
        return self.x.shape[0]

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_data / self.batch_size)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def position(self) -> int:
        """Batches already taken from the current epoch."""
        return self._position

    # ----- iteration ------------------------------------------------------------------------------------
    def _permutation(self) -> Tensor:
        return torch.randperm(self.num_data, generator=self.generator).to(self.device)

    def _batch(self, rows: Optional[Tensor], start: int, stop: int) -> Batch:
        if rows is None:  # rows in data order: slices are views, the full batch is the data itself
            if start == 0 and stop == self.num_data:
                index = torch.arange(self.num_data, device=self.device)
                return Batch(self.x, self.y, index, dict(self.extra))
            sl = slice(start, stop)
            index = torch.arange(start, stop, device=self.device)
            return Batch(self.x[sl], None if self.y is None else self.y[sl], index,
                         {k: v[sl] for k, v in self.extra.items()})
        return Batch(self.x[rows], None if self.y is None else self.y[rows], rows,
                     {k: v[rows] for k, v in self.extra.items()})

    def __iter__(self) -> Iterator[Batch]:
        """The remaining batches of the current epoch; the epoch ends (and the next begins) when it is exhausted."""
        while self._position < self.steps_per_epoch:
            i = self._position
            start, stop = i * self.batch_size, min((i + 1) * self.batch_size, self.num_data)
            if self.per_step:
                rows = self._permutation()[:self.batch_size]
                start, stop = 0, self.batch_size
            elif self.shuffle:
                if self._order is None:
                    self._order = self._permutation()
                rows = self._order[start:stop]
            else:
                rows = None
            batch = self._batch(rows, start, stop)
            self._position += 1
            yield batch
        self._position = 0
        self._order = None
        self._epoch_start = self.generator.get_state()

    # ----- resumable state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """{"generator": state at the start of the current epoch, "position": batches taken from it, sizes}."""
        return {"generator": self._epoch_start.clone(), "position": int(self._position),
                "num_data": self.num_data, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "per_step": self.per_step}

    def load_state_dict(self, state: Mapping) -> None:
        """Continue where `state` was taken: same epoch permutation, next batch."""
        for key in ("num_data", "batch_size", "shuffle", "per_step"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"the sampler state was saved with {key}={state[key]!r} but this sampler has "
                                 f"{key}={getattr(self, key)!r}; use the same data and batch size to resume")
        position = int(state["position"])
        if not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"sampler state position {position} outside [0, {self.steps_per_epoch}]")
        self.generator.set_state(state["generator"].cpu())
        self._epoch_start = self.generator.get_state()
        self._order = None
        self._position = 0
        if position == 0:
            return
        if self.per_step:
            # each step drew one permutation: replay the ones already taken
            for _ in range(position):
                self._permutation()
        elif self.shuffle:
            self._order = self._permutation()
        self._position = position
