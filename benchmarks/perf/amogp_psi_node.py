"""The CP layer's Ψ₂ node alone (`flowgp.models.amogp.psi_statistics.grouped_psi_statistics` with a block-diagonal W), forward
and backward, on inputs shaped like the London fit's (one group of 50 inducing inputs, points sorted by input,
input variances about 1e-3 of the squared lengthscale), for several numbers of points; and the broadcasting
layouts of the series' outer product (whether a layout or smaller chunks would make its passes cheaper: on
2026-11-27 neither did; 5.75 µs per point at 2 004 points, 7.88 at 436).

    OMP_NUM_THREADS=1 python -m benchmarks.perf.amogp_psi_node [--points 436,2004] [--repeats 20]

Prints the median time per call and per point, then the outer product c_nk a_ni of one chunk ([374, 7] by
[374, 50]) three ways: a broadcasting multiply of slices, the same on contiguous copies, and a broadcast copy
scaled in place, each with its result freed at once and with the last 20 results kept alive (fresh memory).
"""
from __future__ import annotations

import argparse

import torch

from flowgp.models.amogp.psi_statistics import grouped_psi_statistics
from benchmarks.lib.timing import median_seconds


def node_inputs(n: int, generator: torch.Generator):
    mean = torch.sort(torch.rand(n, 1, generator=generator, dtype=torch.float64) * 3.4 - 1.7, 0)[0]
    var = 0.09e-3 * (1 + torch.rand(n, 1, generator=generator, dtype=torch.float64))
    z = torch.linspace(-1.8, 1.8, 50, dtype=torch.float64).reshape(1, 50, 1)
    a = torch.randn(1, 50, 50, generator=generator, dtype=torch.float64)
    amp = torch.ones(n, 1, dtype=torch.float64)
    lsq = torch.full((n, 1, 1), 0.09, dtype=torch.float64)
    return [t.requires_grad_() for t in (mean, var, z, a @ a.mT, amp, lsq)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", default="436,2004")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    for n in (int(v) for v in args.points.split(",")):
        inputs = node_inputs(n, g)

        def call():
            psi, phi = grouped_psi_statistics(*inputs, validate=False)
            torch.autograd.grad(psi.sum() + phi.sum(), inputs)

        sec = median_seconds(call, args.repeats)
        print(f"Ψ node, {n} points: {1e3 * sec:.2f} ms per call, {1e6 * sec / n:.2f} µs per point")
    coef, a = torch.randn(1, 2004, 7, dtype=torch.float64), torch.randn(1, 2004, 50, dtype=torch.float64)
    sl = slice(374, 748)
    ways = {
        "broadcasting multiply of slices": lambda: coef[:, sl].unsqueeze(-1) * a[:, sl, None, :],
        "same, contiguous inputs": (lambda c, b: lambda: c * b)(coef[:, sl].unsqueeze(-1).contiguous(),
                                                                a[:, sl, None, :].contiguous()),
        "broadcast copy scaled in place": lambda: a[:, sl, None, :].expand(1, 374, 7, 50).clone().mul_(
            coef[:, sl].unsqueeze(-1)),
    }
    for name, fn in ways.items():
        kept = []

        def keep(fn=fn):
            kept.append(fn())
            if len(kept) > 20:
                kept.pop(0)

        print(f"outer product, {name}: {1e6 * median_seconds(fn, 200):.0f} µs freed at once, "
              f"{1e6 * median_seconds(keep, 200):.0f} µs kept alive")


if __name__ == "__main__":
    main()
