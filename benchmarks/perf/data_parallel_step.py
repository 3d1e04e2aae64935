"""Where a data-parallel SVGP step spends its time: compute, the one all-reduce, and waiting for the other rank.

    OMP_NUM_THREADS=1 python -m benchmarks.perf.data_parallel_step --inducing 100            # one process
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/perf/data_parallel_step.py --inducing 100                                   # two (gloo)

Each process takes its share (batch / world size) of a global minibatch of an SVGP (flowgp.SVGP, RBF kernel,
float64, one thread), backpropagates, and sums the gradients and the loss over ranks with
`flowgp.training.distributed.all_reduce_gradients` (one flat all-reduce, as `flowgp.training.loop.train` does), then takes a
fused Adam step. Printed per rank: the 10th/50th/90th percentiles of the compute (bound and backward), of the
all-reduce call (its latency plus the wait for the slower rank) and of the whole step. The speed-up of P
processes is the one-process median step over the P-process one; on a machine whose step time jitters, each
step waits for the slower rank, which the all-reduce column shows.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from flowgp import SVGP, GaussianLikelihood, make_kernel
from flowgp.training.distributed import all_reduce_gradients, init_from_env, shutdown
from flowgp.training.loop import default_optimizer


def percentiles(values, qs=(0.1, 0.5, 0.9)):
    ordered = sorted(values)
    return [ordered[int(q * (len(ordered) - 1))] for q in qs]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--batch", type=int, default=4096, help="global batch (split over the ranks)")
    p.add_argument("--num-data", type=int, default=20000)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    world = init_from_env()
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.num_data, 8, generator=g, dtype=torch.float64)
        y = torch.sin(x[:, :1])
        model = SVGP(make_kernel("rbf", 8), x[:args.inducing].clone(), GaussianLikelihood(0.05)).double()
        params = list(model.parameters())
        opt = default_optimizer(params, 0.01)
        local = args.batch // world.size
        stamps = []
        for _ in range(args.warmup + args.steps):
            idx = torch.randint(0, args.num_data, (args.batch,), generator=g)[world.rank * local:(world.rank + 1) * local]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = -model.elbo(x[idx], y[idx], num_data=args.num_data) * (local / args.batch)
            loss.backward()
            t1 = time.perf_counter()
            all_reduce_gradients(params, world, loss=loss)
            t2 = time.perf_counter()
            opt.step()
            stamps.append((t0, t1, t2))
        stamps = stamps[args.warmup:]
        compute = [b - a for a, b, _ in stamps]
        reduce = [c - b for _, b, c in stamps]
        step = [stamps[i + 1][0] - stamps[i][0] for i in range(len(stamps) - 1)]
        row = {"rank": world.rank, "world": world.size, "inducing": args.inducing, "batch": args.batch}
        for name, values in (("compute", compute), ("all_reduce", reduce), ("step", step)):
            row[name + "_ms_p10_p50_p90"] = [round(1e3 * v, 2) for v in percentiles(values)]
        print(json.dumps(row), flush=True)
    finally:
        shutdown()


if __name__ == "__main__":
    main()
