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


def epoch_time(path, batch, inducing, world, repeats=3):
    """Seconds of one training epoch of this rank (the fastest of `repeats`, after a warm-up epoch; the machine is
    shared), the seconds of its reading and decoding, and the model's parameter count."""
    source = ParquetSource(path, "y")
    model = model_for(source, inducing)
    sampler = BlockBatches(source, batch, tensors, seed=1)
    train(model, x=sampler, epochs=1, lr=0.01, verbose=False, world=world)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        train(model, x=sampler, epochs=1, lr=0.01, verbose=False, world=world)
        times.append(time.perf_counter() - start)
    return min(times), sum(p.numel() for p in model.parameters())


def allreduce_times(world, sizes, repeats=300):
    """Median seconds of one all-reduce of `size` float64 values, per size (the median: the machine is shared)."""
    out = {}
    for size in sizes:
        t = torch.zeros(size, dtype=torch.float64)
        for _ in range(10):
            all_reduce_sum(t, world)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            all_reduce_sum(t, world)
            times.append(time.perf_counter() - start)
        out[size] = float(np.median(times))
    return out


def calibrate(summary):
    """The cost model's constants from the measurements (see docs/large-data-cost-model.md):
    c_byte (s / byte read and decoded), c_row (s of compute per row of a step), and the all-reduce's latency alpha
    (s per message) and bandwidth beta (bytes / s) from the two sizes measured between 2 processes, a ring
    all-reduce of n float64 values between W processes costing 2 (W - 1) alpha + 2 (W - 1) / W * 8 n / beta."""
    rows, steps = summary["rows"], summary["steps_per_epoch"]
    c_byte = summary["read_seconds_per_byte"]
    read = c_byte * summary["table_bytes"]
    c_row = (summary["epoch_seconds"]["1"] - read) / rows
    (n1, t1), (n2, t2) = sorted((int(k), v) for k, v in summary["allreduce_seconds"].items())
    # W = 2: t = 2 alpha + 8 n / beta
    inv_beta = max((t2 - t1) / (8 * (n2 - n1)), 0.0)
    alpha = max((t1 - 8 * n1 * inv_beta) / 2, 0.0)
    return {"c_byte": c_byte, "c_row": c_row, "bytes_per_row": summary["table_bytes"] / rows, "alpha": alpha,
            "beta": 1 / inv_beta if inv_beta > 0 else float("inf"), "parameters": summary["parameters"],
            "read_share_of_epoch_1": read / summary["epoch_seconds"]["1"], "steps_per_epoch": steps}


def predict(constants, rows, nodes, local_batch, alpha=None, beta=None):
    """Epoch seconds on `nodes` processes (one per node) at `rows` rows, each process taking `local_batch` rows a
    step: reading and compute of N / W rows, plus one all-reduce of the parameter vector per step."""
    alpha = constants["alpha"] if alpha is None else alpha
    beta = constants["beta"] if beta is None else beta
    w, n = nodes, constants["parameters"]
    steps = -(-rows // (local_batch * w))
    per_row = constants["c_row"] + constants["bytes_per_row"] * constants["c_byte"]
    reduce = 2 * (w - 1) * alpha + 2 * (w - 1) / w * 8 * n / beta
    return {"nodes": w, "rows": rows, "local_batch": local_batch, "steps": steps,
            "compute_and_io_s": rows / w * per_row, "allreduce_s": steps * reduce,
            "epoch_s": rows / w * per_row + steps * reduce}


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
               "threads": 1, "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
               "steps_per_epoch": -(-args.rows // args.batch)}
    constants = calibrate(summary)
    summary["cost_model"] = constants
    # a cluster network (assumed, not measured here): 25 us latency per message, 1.25 GB/s (10 GbE)
    summary["predictions"] = [
        {**predict(constants, 10 ** 8, w, args.batch, alpha=a, beta=b), "network": name}
        for name, a, b in (("measured loopback", None, None), ("10 GbE (assumed)", 25e-6, 1.25e9))
        for w in (1, 2, 8, 16, 32, 64)]
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
