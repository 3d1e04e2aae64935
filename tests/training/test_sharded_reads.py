"""Sharded reading (flowgp.training.batches.BlockBatches with shard_reads, flowgp.estimators.table_scan): with W
processes each reads only its blocks, yet every row is visited once per epoch, each row is equally likely to fall
in each step, the bytes read per process fall as 1/W, and the statistics merged across processes equal one pass.

The ranks are simulated in one process: `shard(rank, W)` on one sampler per rank (the schedule is a function of
the shared generator only, so the ranks need no communication to agree on it)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from flowgp.data.sources import ArraySource, ParquetSource, merge_scans, scan, scan_blocks  # noqa: E402
from flowgp.estimators.table_scan import blocks_of_rank, scan_table  # noqa: E402
from flowgp.training.batches import BlockBatches  # noqa: E402
from flowgp.training.distributed import World  # noqa: E402


def _identity(x, y):
    return torch.as_tensor(x), torch.as_tensor(y)


def _array(n=1000, block_rows=64, seed=0):
    a = np.random.default_rng(seed).normal(size=(n, 3)) * [1.0, 1e3, 2.0] + [5.0, -1e4, 0.0]
    return ArraySource(a, 2, ["x0", "x1"], "y", block_rows=block_rows)


def _parquet(tmp_path, n=1200, groups=(100, 300, 50, 250, 200, 300)):
    """A folder of two Parquet files whose row groups differ in size (the deal balances rows, not groups)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 2))
    y = x[:, 0] - x[:, 1] + 0.1 * rng.normal(size=n)
    folder = tmp_path / "table"
    folder.mkdir()
    start = 0
    for f, sizes in enumerate((groups[:3], groups[3:])):
        rows = sum(sizes)
        table = pa.table({"a": x[start:start + rows, 0], "b": x[start:start + rows, 1], "y": y[start:start + rows]})
        with pq.ParquetWriter(str(folder / f"part{f}.parquet"), table.schema) as w:
            offset = 0
            for size in sizes:
                w.write_table(table.slice(offset, size))
                offset += size
        start += rows
    return folder


def _epoch(samplers):
    """One epoch of every rank's sampler, step by step: [[batch of rank 0, batch of rank 1, ...], ...]."""
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1, "the ranks must take the same number of steps"
    return list(zip(*per_rank))


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_ranks_visit_every_row_once_per_epoch(world_size):
    source = _array()
    ranks = [BlockBatches(source, 100, _identity, seed=4).shard(r, world_size) for r in range(world_size)]
    for _ in range(3):
        steps = _epoch(ranks)
        assert len(steps) == ranks[0].steps_per_epoch == 10
        rows = np.concatenate([b.index.numpy() for step in steps for b in step])
        assert np.array_equal(np.sort(rows), np.arange(source.num_rows))  # the multiset of rows, once each
        for step in steps:  # the parts are those of one global batch
            sizes = [len(b) for b in step]
            assert {b.step_size for b in step} == {sum(sizes)}
            assert [b.offset for b in step] == list(np.cumsum([0] + sizes[:-1]))
            for b in step:  # the rows carry their own data
                assert torch.equal(b.x, torch.as_tensor(source.array[b.index.numpy()][:, :2]))


def test_each_rank_reads_its_share_of_the_bytes(tmp_path):
    folder = _parquet(tmp_path)
    total = sum(ParquetSource(folder, "y").group_bytes)
    for world_size in (1, 2, 4):
        sources = [ParquetSource(folder, "y") for _ in range(world_size)]
        ranks = [BlockBatches(s, 60, _identity, seed=0).shard(r, world_size) for r, s in enumerate(sources)]
        _epoch(ranks)
        read = [s.bytes_read for s in sources]
        assert sum(read) == total  # every row group read once per epoch, by one rank
        # balanced by rows: each rank within one row group (here the largest) of the even share
        assert max(read) - min(read) <= max(sources[0].group_bytes) * (1 if world_size < 4 else 2)
        assert sum(s.rows_read for s in sources) == sources[0].num_rows
    # exact mode: every rank reads the whole table
    exact = [ParquetSource(folder, "y") for _ in range(2)]
    _epoch([BlockBatches(s, 60, _identity, seed=0, shard_reads=False).shard(r, 2) for r, s in enumerate(exact)])
    assert [s.bytes_read for s in exact] == [total, total]


def test_a_row_falls_in_each_step_equally_often():
    """Chi-square test of the step in which a row is visited over 600 epochs (6 steps: 5 degrees of freedom),
    for rows at the start, middle and end of blocks and of the table; the seed is fixed, so the test is
    deterministic. (A sampler that kept the blocks in file order would put each row in the same step every
    epoch: a statistic of 3000.)"""
    n, batch, epochs = 120, 20, 600
    source = _array(n, block_rows=10)
    ranks = [BlockBatches(source, batch, _identity, seed=11).shard(r, 2) for r in range(2)]
    rows = [0, 5, 9, 10, 59, 60, 64, 119]
    counts = np.zeros((len(rows), n // batch))
    first_half = []
    for _ in range(epochs):
        for t, step in enumerate(_epoch(ranks)):
            index = np.concatenate([b.index.numpy() for b in step])
            counts[:, t] += np.isin(rows, index)
            if t == 0:
                first_half.append(((index < n // 2).sum(), len(index)))
    assert counts.sum(1).tolist() == [epochs] * len(rows)
    expected = epochs / counts.shape[1]
    chi2 = ((counts - expected) ** 2 / expected).sum(1)
    # the 0.999 quantile of chi-square(5) is 20.5: a failure of any of the 8 rows has probability < 1%
    assert chi2.max() < 20.5, chi2
    # the first step's batch draws from both halves of the table alike: mean share 1/2 within 3 standard errors
    share = np.array([a / b for a, b in first_half])
    assert abs(share.mean() - 0.5) < 3 * share.std() / np.sqrt(epochs)


def test_too_few_rows_per_rank_is_refused():
    source = _array(9, block_rows=1)  # 5 steps of 2 rows, but one rank can only hold 4 rows
    sampler = BlockBatches(source, 2, _identity).shard(1, 2)
    with pytest.raises(ValueError, match="batch_size"):
        list(sampler)
    with pytest.raises(TypeError, match="shard_reads"):
        BlockBatches(source, 2, _identity, shard_reads="yes")


def test_resume_within_an_epoch_and_with_another_number_of_processes():
    source = _array(600, block_rows=50)
    reference = [BlockBatches(source, 60, _identity, seed=3).shard(r, 2) for r in range(2)]
    epochs = [_epoch(reference) for _ in range(2)]
    # interrupted after 4 steps of the first epoch, resumed with the same W: the same rows from there on
    first = [BlockBatches(source, 60, _identity, seed=3).shard(r, 2) for r in range(2)]
    iters = [iter(s) for s in first]
    for _ in range(4):
        [next(i) for i in iters]
    states = [s.state_dict() for s in first]
    assert states[0]["position"] == 4
    resumed = [BlockBatches(source, 60, _identity, seed=99).shard(r, 2) for r in range(2)]
    for s, st in zip(resumed, states):
        s.load_state_dict(st)
    rest = _epoch(resumed)
    assert len(rest) == len(epochs[0]) - 4
    for got, want in zip(rest, epochs[0][4:]):
        for a, b in zip(got, want):
            assert torch.equal(a.index, b.index)
    # at the epoch boundary the state does not depend on W: a run resumed with 3 processes visits every row once
    boundary = resumed[0].state_dict()
    assert boundary["position"] == 0
    three = [BlockBatches(source, 60, _identity).shard(r, 3) for r in range(3)]
    for s in three:
        s.load_state_dict(boundary)
    rows = np.concatenate([b.index.numpy() for step in _epoch(three) for b in step])
    assert np.array_equal(np.sort(rows), np.arange(600))
    # and the generator moves on alike whatever W: the next epoch starts from the same state
    assert torch.equal(three[0].state_dict()["generator"], reference[0].state_dict()["generator"])


def test_exact_mode_slices_the_single_process_batches():
    source = _array(300, block_rows=40)
    single = list(BlockBatches(source, 50, _identity, seed=2))
    parts = [list(BlockBatches(source, 50, _identity, seed=2, shard_reads=False).shard(r, 2)) for r in range(2)]
    for whole, a, b in zip(single, *parts):
        assert torch.equal(torch.cat([a.index, b.index]), whole.index)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_merged_statistics_equal_one_pass(world_size):
    source = _array(2000, block_rows=100)
    reference = scan(source, 50)  # the sequential one-pass scan (algorithm R for its sample)
    parts = [scan_blocks(source, blocks_of_rank(source.blocks, World(r, world_size)), 50, seed=7)
             for r in range(world_size)]
    assert sorted(i for p in parts for i in p.digests) == list(range(len(source.blocks)))  # a partition
    merged = merge_scans(parts[::-1], 50)  # in any order
    one = scan_table(source, 50, 7, world=World())
    for name in ("x_mean", "x_std"):
        np.testing.assert_allclose(getattr(merged, name), getattr(reference, name), rtol=1e-12, atol=0)
    for name in ("y_mean", "y_std", "y_min", "y_max"):
        assert getattr(merged, name) == pytest.approx(getattr(reference, name), rel=1e-12, abs=1e-15)
    assert merged.num_rows == 2000
    # the sample and the digest do not depend on who read which block
    assert np.array_equal(merged.sample_x, one.sample_x) and np.array_equal(merged.sample_y, one.sample_y)
    assert merged.digest == one.digest
    rows = np.flatnonzero((source.array[:, :2][:, None, :] == merged.sample_x[None]).all(-1).any(1))
    assert len(rows) == 50  # 50 distinct rows of the table


def test_merged_group_moments_and_labels_equal_one_pass():
    rng = np.random.default_rng(5)
    x = np.column_stack([rng.normal(size=900), rng.integers(0, 3, 900)])
    y = rng.integers(0, 4, 900).astype(float) + x[:, 1]
    source = ArraySource(np.column_stack([x, y]), 2, ["x", "o"], "y", block_rows=70)
    reference = scan(source, 30, max_labels=10, group_feature=1)
    parts = [scan_blocks(source, blocks_of_rank(source.blocks, World(r, 2)), 30, max_labels=10, group_feature=1)
             for r in range(2)]
    merged = merge_scans(parts, 30, max_labels=10)
    assert np.array_equal(merged.y_values, reference.y_values)
    assert np.array_equal(merged.groups["count"], reference.groups["count"])
    for key in ("y_mean", "y_std", "x_min", "x_max"):
        np.testing.assert_allclose(merged.groups[key], reference.groups[key], rtol=1e-12, atol=1e-15)


def test_a_bottom_k_sample_is_uniform():
    """Each row's inclusion frequency over 400 seeds is S / N: a chi-square over 10 groups of rows."""
    source = _array(200, block_rows=16)
    hits = np.zeros(200)
    for seed in range(400):
        stats = merge_scans([scan_blocks(source, range(len(source.blocks)), 20, seed=seed)], 20)
        hits[np.flatnonzero((source.array[:, :2][:, None, :] == stats.sample_x[None]).all(-1).any(1))] += 1
    assert hits.sum() == 400 * 20
    groups = hits.reshape(10, 20).sum(1)
    expected = 400 * 20 / 10
    assert ((groups - expected) ** 2 / expected).sum() < 27.9  # 0.999 quantile of chi-square(9)


def test_a_bad_row_is_named_with_its_position_in_the_table():
    a = np.random.default_rng(0).normal(size=(100, 3))
    a[73, 0] = np.nan
    source = ArraySource(a, 2, ["x0", "x1"], "y", block_rows=16)
    with pytest.raises(ValueError, match="row 73"):
        scan_blocks(source, [4], 10)
