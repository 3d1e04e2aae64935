"""Bytes read per process per epoch against the number of processes W, the epoch time for W = 1, 2, and the
inputs of the cost model of docs/large-data-cost-model.md.

    OMP_NUM_THREADS=1 python -m benchmarks.perf.sharded_reads --out docs/results/perf/sharded-reads

1. A Parquet file of --rows rows (8 features and a target, float64) in row groups of --group-rows rows.
2. Bytes read: W = 1, 2, 4 ranks simulated in this process (`BlockBatches.shard(rank, W)` on one ParquetSource per
   rank); each rank's `bytes_read` counter (compressed column-chunk bytes of the row groups it reads, from the
   file's metadata) after one epoch, with sharded reads and in exact mode (`shard_reads=False`).
3. Epoch time: one epoch of an SVGP (--inducing inducing points, global batch --batch) with `flowgp.training.loop.train`
   over the streamed file, in 1 process and in 2 gloo processes (fork), sharded reads; plus the cost model's inputs:
   the time to read and decode the file (s / byte), the compute per row of a step, and the time of an all-reduce
   of the parameter vector and of a 16x larger one (latency and bandwidth) between 2 processes.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from flowgp.build import SparseGPConfig, build
from flowgp.data.sources import ParquetSource
from flowgp.training.batches import BlockBatches
from flowgp.training.distributed import World, all_reduce_sum
from flowgp.training.loop import train


def write_table(path, rows, group_rows, seed=0):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (rows, 8))
    y = np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] ** 2 + 0.1 * rng.standard_normal(rows)
    table = pa.table({**{f"x{j}": x[:, j] for j in range(8)}, "y": y})
    pq.write_table(table, str(path), row_group_size=group_rows)


def tensors(x, y):
    return torch.as_tensor(x), torch.as_tensor(y)[:, None]


def bytes_per_rank(path, world_size, batch, shard_reads=True):
    sources = [ParquetSource(path, "y") for _ in range(world_size)]
    for rank, source in enumerate(sources):
        sampler = BlockBatches(source, batch, tensors, seed=0, shard_reads=shard_reads).shard(rank, world_size)
        for _ in sampler:
            pass
    return [s.bytes_read for s in sources], [s.rows_read for s in sources], sum(sources[0].group_bytes)


def model_for(source, inducing):
    x, y = source.read(*source.blocks[0])
    return build(SparseGPConfig(model="svgp", num_inducing=inducing, kmeans_restarts=1), torch.as_tensor(x[:4000]),
                 torch.as_tensor(y[:4000])[:, None], generator=torch.Generator().manual_seed(0))


def epoch_time(path, batch, inducing, world):
    """Seconds of one training epoch of this rank (after a warm-up epoch), and the model's parameter count."""
    source = ParquetSource(path, "y")
    model = model_for(source, inducing)
    sampler = BlockBatches(source, batch, tensors, seed=1)
    train(model, x=sampler, epochs=1, lr=0.01, verbose=False, world=world)  # warm-up
    start = time.perf_counter()
    train(model, x=sampler, epochs=1, lr=0.01, verbose=False, world=world)
    return time.perf_counter() - start, sum(p.numel() for p in model.parameters())


def allreduce_times(world, sizes, repeats=200):
    out = {}
    for size in sizes:
        t = torch.zeros(size, dtype=torch.float64)
        for _ in range(10):
            all_reduce_sum(t, world)
        start = time.perf_counter()
        for _ in range(repeats):
            all_reduce_sum(t, world)
        out[size] = (time.perf_counter() - start) / repeats
    return out


def _worker(rank, path, batch, inducing, init, out):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        world = World(rank, 2)
        seconds, params = epoch_time(path, batch, inducing, world)
        reduce = allreduce_times(world, [params, 16 * params])
        torch.save({"epoch": seconds, "params": params, "allreduce": reduce}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def read_seconds(path):
    """Seconds per byte to read and decode every row group once (one process)."""
    source = ParquetSource(path, "y")
    start = time.perf_counter()
    for a, b in source.blocks:
        source.read(a, b)
    return (time.perf_counter() - start) / source.bytes_read, source.bytes_read


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200000)
    p.add_argument("--group-rows", type=int, default=10000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--inducing", type=int, default=50)
    p.add_argument("--out", default="docs/results/perf/sharded-reads")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "table.parquet")
        write_table(path, args.rows, args.group_rows)
        rows = []
        for w in (1, 2, 4):
            for mode in (True, False):
                read, nrows, total = bytes_per_rank(path, w, args.batch, mode)
                for r, (b, n) in enumerate(zip(read, nrows)):
                    rows.append({"world_size": w, "shard_reads": mode, "rank": r, "bytes_read": b, "rows_read": n,
                                 "table_bytes": total, "fraction": b / total})
        per_byte, total = read_seconds(path)
        one, params = epoch_time(path, args.batch, args.inducing, World())
        torch.multiprocessing.start_processes(_worker, args=(path, args.batch, args.inducing,
                                                             os.path.join(tmp, "init"), tmp),
                                              nprocs=2, join=True, start_method="fork")
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    two = max(r["epoch"] for r in ranks)
    reduce = {int(k): max(r["allreduce"][k] for r in ranks) for k in ranks[0]["allreduce"]}
    summary = {"rows": args.rows, "group_rows": args.group_rows, "batch": args.batch, "inducing": args.inducing,
               "parameters": params, "table_bytes": total, "read_seconds_per_byte": per_byte,
               "epoch_seconds": {"1": one, "2": two}, "allreduce_seconds": reduce,
               "threads": 1, "cpu_count": os.cpu_count()}
    import csv

    with open(out / "bytes_per_rank.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
