"""Minibatch samplers: the only way `flowgp.training.loop.train` sees data.

The loop asks a sampler for the batches of the current epoch and never touches the whole data set, so a
data-parallel version only has to wrap the sampler (each rank yields its own share of the rows) and the
gradient reduction. A sampler has `num_data` (N, for the N/B rescaling of the bound), `batch_size`,
`steps_per_epoch`, `device`, iteration over the remaining batches of the current epoch, and
`state_dict()` / `load_state_dict()` that let a resumed run continue in the middle of an epoch with exactly
the rows the uninterrupted run would have used.

Data parallelism (`flowgp.training.distributed`): `shard(rank, world_size)` makes a sampler yield, at every step, only
rank's part of the global batch. `ArrayBatches`, and `BlockBatches` in exact mode (`shard_reads=False`): the part
(`flowgp.training.distributed.local_slice`) of the same global batch every rank draws from the same generator, so
the global batches do not depend on the world size and a run checkpointed with 2 processes resumes with 1 on
exactly the same rows. `BlockBatches` with sharded reads (its default): each rank reads only the blocks dealt to
it and the global batch is the union of the ranks' draws (the same law, other rows; see its doc). Either way the
sampler's state does not depend on the world size, so a checkpoint resumes with any number of processes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["Batch", "ArrayBatches", "BlockBatches", "shard_pieces", "deal_pieces"]


@dataclass(frozen=True)
class Batch:
    """One minibatch: inputs x [B, ...], targets y [B, ...] (or None), `index` [B] the rows it holds in the
    data set (long, on the data's device), and `extra` named tensors of the same rows (e.g. an output index).

    In a data-parallel run a Batch holds one rank's part of a global batch: `global_size` is the number of
    rows of that global batch and `offset` the position of this part's first row in it (None / 0: the batch
    is the whole step)."""

    x: Tensor
    y: Optional[Tensor]
    index: Tensor
    extra: Mapping[str, Tensor] = field(default_factory=dict)
    global_size: Optional[int] = None
    offset: int = 0

    @property
    def step_size(self) -> int:
        """Rows of the whole step across ranks (B of the N / B rescaling)."""
        return self.x.shape[0] if self.global_size is None else int(self.global_size)

    def __len__(self) -> int:
        return self.x.shape[0]


def _part(rows: int, rank: int, world_size: int) -> slice:
    # flowgp.training.distributed.local_slice, written here too because batches sits below distributed in the layers
    return slice(rows * rank // world_size, rows * (rank + 1) // world_size)


def check_shard(rank, world_size, batch_size: int) -> tuple[int, int]:
    """(rank, world_size) checked against a sampler's global batch size; ValueError naming the fix."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or int(value) != value:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    rank, world_size = int(rank), int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size) and world_size >= 1, got rank={rank}, "
                         f"world_size={world_size}")
    if world_size > batch_size:
        raise ValueError(f"the world size {world_size} (--nproc / torchrun processes) is larger than the batch size "
                         f"{batch_size}: every process needs rows of each batch; use batch_size >= {world_size} "
                         "or fewer processes")
    return rank, world_size


def shard_pieces(blocks: list, num_rows: int, world_size: int) -> list:
    """The units dealt to W ranks, per block: each block cut into equal pieces of at most ⌈N / 4W⌉ rows (a
    block of the whole table would otherwise leave ranks without rows); one piece per block for one process."""
    if world_size <= 1:
        return [[(a, b)] for a, b in blocks]
    cap = max(1, math.ceil(num_rows / (4 * world_size)))
    pieces = []
    for a, b in blocks:
        k = math.ceil((b - a) / cap)
        pieces.append([(a + (b - a) * j // k, a + (b - a) * (j + 1) // k) for j in range(k)])
    return pieces


def deal_pieces(pieces: list, world_size: int) -> tuple[list, list]:
    """Deal `pieces` ((start, stop) row ranges, in order) to the rank holding the fewest rows so far (ties: the
    lowest rank): ([the pieces of each rank, in order], [the rows of each rank]). Greedy balancing by rows: the
    shares differ by at most one piece."""
    shares: list = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for a, b in pieces:
        r = loads.index(min(loads))
        shares[r].append((a, b))
        loads[r] += b - a
    return shares, loads


def _rows(name: str, t, n: Optional[int]) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 1:
        raise ValueError(f"{name} must have a leading dimension of rows, got a scalar")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} rows but x has {n}")
    return t


def _checked_batch_size(batch_size, n: int) -> int:
    """Rows per batch: batch_size capped at n (None: all n), ValueError unless a positive integer or None."""
    if batch_size is None:
        return n
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    return min(int(batch_size), n)


def _checked_generator(generator, seed: int) -> torch.Generator:
    """The sampler's generator: `generator`, or a new one seeded with `seed` (TypeError for anything else)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator if generator is not None else torch.Generator().manual_seed(int(seed))


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
        batch = _checked_batch_size(batch_size, n)
        self.batch_size = batch
        self.per_step = bool(per_step)
        self.shuffle = (batch < n or self.per_step) if shuffle is None else bool(shuffle)
        if self.per_step and not self.shuffle:
            raise ValueError("per_step=True draws random subsets; it cannot be combined with shuffle=False")
        self.generator = _checked_generator(generator, seed)
        self._epoch_start = self.generator.get_state()
        self._position = 0
        self._order: Optional[Tensor] = None
        self.rank, self.world_size = 0, 1

    def shard(self, rank: int, world_size: int) -> "ArrayBatches":
        """Yield only `rank`'s part of every global batch (see the module doc); returns self."""
        self.rank, self.world_size = check_shard(rank, world_size, self.batch_size)
        return self

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
        if self.world_size > 1:
            part = _part(stop - start, self.rank, self.world_size)
            local = rows[part] if rows is not None else None
            b = self._batch_local(local, start + part.start, start + part.stop)
            return Batch(b.x, b.y, b.index, b.extra, global_size=stop - start, offset=part.start)
        return self._batch_local(rows, start, stop)

    def _batch_local(self, rows: Optional[Tensor], start: int, stop: int) -> Batch:
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


class BlockBatches:
    """Minibatches streamed from a table too large for memory, read block by block.

    The rows are reached through `source` (e.g. `flowgp.data.sources.NpySource` or `ParquetSource`): its
    `num_rows`, its `blocks` - a list of (start, stop) row ranges it reads efficiently (Parquet row groups,
    slices of a memory-mapped array) - and `read(start, stop) -> (X, y)` numpy arrays. Every epoch visits
    the blocks in a random order and each block's rows in a random order (a two-level shuffle: the usual
    compromise between a full permutation, which needs random row access, and the file order); consecutive
    `batch_size` rows of that order form the global batches. `transform(X, y) -> (x, y)` turns the raw rows
    of one batch into the model's tensors (the estimators standardise there); a transform returning
    (x, y, extra) also gives the batch named tensors of the same rows (`Batch.extra`, e.g. an output index).

    Memory: one block, one batch and the block's permutation, whatever the number of rows.

    Data parallelism, `shard(rank, world_size)` with W = world_size > 1:

    - `shard_reads=True` (default): each rank reads only its share of the blocks. Every epoch the blocks are put
      in an order drawn from the shared generator (the same on every rank) and dealt, in that order, to the rank
      holding the fewest rows so far (the shares differ by at most one block; only when that leaves a rank fewer
      rows than the epoch has steps are the blocks cut into pieces of at most ⌈N / 4W⌉ rows and the pieces
      dealt, a cut block being then read by more than one rank); rank r, holding n_r rows, visits its pieces in
      that order, each piece's rows
      in a random order, and cuts that stream into the epoch's T = ⌈N / B⌉ steps, b_rt = ⌊(t+1) n_r / T⌋ -
      ⌊t n_r / T⌋ rows at step t. The global batch of step t is the union of the ranks' parts (Σ_r b_rt ≈ N / T
      rows, `Batch.global_size`). Preserved from one process: every row exactly once per epoch, T steps per
      epoch, and every row equally likely to fall in each step (the block order is uniform and rows within a
      piece are permuted uniformly), so the minibatch gradient stays unbiased. Not preserved: the very rows of
      each batch (the law of the sampler is the same, its draws are not), and batches of equal size (B except
      the last) become ⌈N / T⌉ or ⌊N / T⌋ spread evenly, still rescaled by N / B_t.
    - `shard_reads=False` (exact mode, for debugging): every rank reads every block in the single-process
      order and transforms only its slice of each global batch; the run reproduces one process to rounding.

    The state is the generator's state at the start of the epoch and the number of batches taken: loading it
    redraws the epoch's orders and skips the blocks already consumed without reading them. Neither depends on
    W, so a checkpoint resumes with any number of processes: at an epoch boundary the next epochs are those of
    a run with the new W from that point; in the middle of an epoch with another W (or another shard_reads)
    the rest of that one epoch is the new schedule's rest, so some of its rows may be seen twice and others
    not at all in that epoch (from the next epoch on, every row once again).
    """

    def __init__(self, source, batch_size: Optional[int], transform, *, generator: Optional[torch.Generator] = None,
                 seed: int = 0, device=None, shard_reads: bool = True):
        for attr in ("num_rows", "blocks", "read"):
            if not hasattr(source, attr):
                raise TypeError(f"source must have num_rows, blocks and read(start, stop) (a flowgp.data.sources "
                                f"source), got {type(source).__name__}")
        n = int(source.num_rows)
        if n < 1:
            raise ValueError("the data source holds no rows")
        self.source = source
        self.transform = transform
        batch = _checked_batch_size(batch_size, n)
        self.batch_size = batch
        self.blocks = [(int(a), int(b)) for a, b in source.blocks]
        self.generator = _checked_generator(generator, seed)
        self._epoch_start = self.generator.get_state()
        self._position = 0
        self._device = torch.device("cpu") if device is None else torch.device(device)
        self.rank, self.world_size = 0, 1
        self.extra: dict = {}
        if not isinstance(shard_reads, bool):
            raise TypeError(f"shard_reads must be True or False, got {shard_reads!r}")
        self.shard_reads = bool(shard_reads)
        self.pieces = shard_pieces(self.blocks, n, 1)

    def shard(self, rank: int, world_size: int) -> "BlockBatches":
        """Yield only `rank`'s part of every global batch (see the class doc for the two modes); returns self."""
        self.rank, self.world_size = check_shard(rank, world_size, self.batch_size)
        self.pieces = shard_pieces(self.blocks, self.num_data, self.world_size)
        return self

    @property
    def sharded(self) -> bool:
        """Whether this rank reads only its share of the blocks (shard_reads and more than one process)."""
        return self.shard_reads and self.world_size > 1

    @property
    def num_data(self) -> int:
        return int(self.source.num_rows)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_data / self.batch_size)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def position(self) -> int:
        return self._position

    def _emit(self, xs, ys, idx, count: int, global_size: Optional[int] = None, offset: int = 0) -> Batch:
        """The batch of the first `count` pending rows: this rank's part of it (exact mode), or all of them as
        this rank's part of a global batch of `global_size` rows starting at `offset` (sharded reads)."""
        import numpy as np

        x_all = np.concatenate(xs) if len(xs) > 1 else xs[0]
        y_all = np.concatenate(ys) if len(ys) > 1 else ys[0]
        i_all = np.concatenate(idx) if len(idx) > 1 else idx[0]
        if global_size is not None:
            part = slice(0, count)
        else:
            part = _part(count, self.rank, self.world_size) if self.world_size > 1 else slice(0, count)
            global_size, offset = (count if self.world_size > 1 else None), part.start
        x, y, *extra = self.transform(x_all[part], y_all[part])
        index = torch.as_tensor(i_all[part], dtype=torch.long, device=self._device)
        rest = (x_all[count:], y_all[count:], i_all[count:])
        batch = Batch(x, y, index, extra[0] if extra else {}, global_size=global_size, offset=offset)
        return batch, rest

    def __iter__(self) -> Iterator[Batch]:
        """The remaining batches of the current epoch (see the class doc)."""
        if self.sharded:
            yield from self._iter_sharded()
            return
        skip_rows = self._position * self.batch_size
        g = self.generator
        g.set_state(self._epoch_start)
        order = torch.randperm(len(self.blocks), generator=g).tolist()
        xs, ys, idx, pending, seen = [], [], [], 0, 0
        for b in order:
            start, stop = self.blocks[b]
            perm = torch.randperm(stop - start, generator=g).numpy()
            first, seen = seen, seen + (stop - start)
            if seen <= skip_rows:
                continue  # consumed before the checkpoint: its order is drawn (to keep the stream) but not read
            x, y = self.source.read(start, stop)
            drop = max(0, skip_rows - first)
            perm = perm[drop:]
            xs.append(x[perm]), ys.append(y[perm]), idx.append(perm + start)
            pending += len(perm)
            del x, y
            while pending >= self.batch_size:
                batch, (rx, ry, ri) = self._emit(xs, ys, idx, self.batch_size)
                xs, ys, idx, pending = [rx], [ry], [ri], pending - self.batch_size
                self._position += 1
                yield batch
        if pending:
            batch, _ = self._emit(xs, ys, idx, pending)
            self._position += 1
            yield batch
        self._position = 0
        self._epoch_start = self.generator.get_state()

    def epoch_plan(self) -> tuple[list, int, list]:
        """The sharded schedule of the current epoch, the same on every rank: (the pieces of each rank in the
        order it visits them, the seed of the pieces' row orders, b [W, T] the rows each rank gives each step).
        Draws from the generator (set to the epoch's start state) one block order and one seed, whatever W."""
        g = self.generator
        g.set_state(self._epoch_start)
        order = torch.randperm(len(self.blocks), generator=g).tolist()
        row_seed = int(torch.randint(0, 2 ** 62, (1,), generator=g))
        steps = self.steps_per_epoch
        shares, loads = deal_pieces([self.blocks[i] for i in order], self.world_size)
        if min(loads) < steps:  # too few blocks to go round: cut them (a cut block may be read by two ranks)
            shares, loads = deal_pieces([p for i in order for p in self.pieces[i]], self.world_size)
        if min(loads) < steps:
            raise ValueError(f"a process holds {min(loads)} rows this epoch, fewer than the {steps} steps of an epoch: "
                             "use a larger batch_size, fewer processes, or shard_reads=False")
        t = torch.arange(steps + 1, dtype=torch.long)
        counts = torch.diff(torch.tensor(loads, dtype=torch.long)[:, None] * t[None, :] // steps, dim=1)
        return shares, row_seed, counts

    def _iter_sharded(self) -> Iterator[Batch]:
        """This rank's parts of the remaining global batches of the epoch (`epoch_plan`)."""
        import numpy as np

        shares, row_seed, counts = self.epoch_plan()
        next_epoch = self.generator.get_state()
        mine = counts[self.rank]
        offsets = counts.cumsum(0) - counts  # rows of the ranks before this one at each step
        totals = counts.sum(0)
        step = self._position
        skip_rows = int(mine[:step].sum())
        xs, ys, idx, pending, seen = [], [], [], 0, 0
        for start, stop in shares[self.rank]:
            first, seen = seen, seen + (stop - start)
            if seen <= skip_rows:
                continue  # consumed before the checkpoint: not read
            perm = np.random.default_rng([row_seed, start]).permutation(stop - start)
            x, y = self.source.read(start, stop)
            perm = perm[max(0, skip_rows - first):]
            xs.append(x[perm]), ys.append(y[perm]), idx.append(perm + start)
            pending += len(perm)
            del x, y
            while step < len(mine) and pending >= int(mine[step]):
                count = int(mine[step])
                batch, (rx, ry, ri) = self._emit(xs, ys, idx, count, global_size=int(totals[step]),
                                                 offset=int(offsets[self.rank, step]))
                xs, ys, idx, pending = [rx], [ry], [ri], pending - count
                step += 1
                self._position = step
                yield batch
        self._position = 0
        self.generator.set_state(next_epoch)
        self._epoch_start = next_epoch

    def state_dict(self) -> dict:
        return {"generator": self._epoch_start.clone(), "position": int(self._position),
                "num_data": self.num_data, "batch_size": self.batch_size, "blocks": len(self.blocks)}

    def load_state_dict(self, state: Mapping) -> None:
        for key, have in (("num_data", self.num_data), ("batch_size", self.batch_size), ("blocks", len(self.blocks))):
            if key in state and state[key] != have:
                raise ValueError(f"the sampler state was saved with {key}={state[key]!r} but this sampler has "
                                 f"{key}={have!r}; use the same data and batch size to resume")
        position = int(state["position"])
        if not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"sampler state position {position} outside [0, {self.steps_per_epoch}]")
        self._epoch_start = state["generator"].cpu().clone()
        self.generator.set_state(self._epoch_start)
        self._position = position
