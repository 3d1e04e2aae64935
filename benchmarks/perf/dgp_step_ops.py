"""Operations per training step of flowgp's deep GPs: DSVI ("dgpL") against the flow posterior ("cnf-dgpL").

Where a step is bound by kernel launches (a GPU at these sizes: docs/results/perf/gpu), its time follows the number of
aten operations it dispatches rather than its arithmetic, so the count is the CPU-side proxy for the flow
posterior's GPU step ratio to DSVI; printed with the ratio of the two counts. Same synthetic problem as `dgp_step_time.py` (N = 10 000, D = 8, B = 512, M = 100, hidden width 8).

    OMP_NUM_THREADS=1 python -m benchmarks.perf.dgp_step_ops [--layers 3] [--top 12]

Prints the aten operations of one training step (forward, backward, optimiser) of each model and, for the flow
posterior, the flowgp source lines that dispatch the most ("<backward/optimiser>" for those outside flowgp).
"""
from __future__ import annotations

import argparse
import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.lib.steps import flowgp_step
from flowgp.models.deep_gp import build_deep_gp


class CountOps(TorchDispatchMode):
    """Counts every aten call, by the innermost flowgp frame that made it."""

    def __init__(self):
        super().__init__()
        self.by_line = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frames = [f for f in traceback.extract_stack() if "/flowgp/" in f.filename]
        where = f"{frames[-1].filename.split('/flowgp/')[-1]}:{frames[-1].lineno}" if frames else "<backward/optimiser>"
        self.by_line[where] += 1
        return func(*args, **(kwargs or {}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, 8, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :1]) * torch.cos(x[:, 1:2]) + 0.1 * torch.randn(10_000, 1, generator=g, dtype=torch.float64)
    z = x[torch.randperm(10_000, generator=g)[:100]].clone()
    counts = {}
    for posterior, name in (("gaussian", "dgp"), ("cnf", "cnf-dgp")):
        model = build_deep_gp(x, 1, args.layers, inducing_points=z, posterior=posterior, hidden_width=8)
        step = flowgp_step(model, x, y, 512)
        for _ in range(3):  # past the first steps' one-off work
            step()
        with CountOps() as mode:
            step()
        counts[name] = mode
        print(f"{name}{args.layers}: {sum(mode.by_line.values())} aten operations per step")
    ratio = sum(counts["cnf-dgp"].by_line.values()) / sum(counts["dgp"].by_line.values())
    print(f"cnf-dgp{args.layers} / dgp{args.layers}: {ratio:.2f}")
    print(f"cnf-dgp{args.layers}, the lines dispatching the most:")
    for where, n in counts["cnf-dgp"].by_line.most_common(args.top):
        print(f"  {n:5d}  {where}")


if __name__ == "__main__":
    main()
