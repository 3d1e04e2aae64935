"""Is the CP layer's Ψ node cheaper when its inducing inputs are a fixed uniform grid, and does it give the same
numbers?

Answer (2026-11-27, 2 004 points, Mg = 50, forward + backward): yes. The grid form agrees with the series node
to 2e-13 in values and every gradient; by hand it takes 5.0-5.8 ms against the series node's 11.2-13.6 ms
(plain autograd 8.6-11.0 ms, compiled 4.4-5.0 ms). It became `flowgp.models.amogp.psi_grid` and the AMO-GP
default (`cp_grid`), which brought the full-batch AMO-GP / MO-GP step ratio from 4.0-4.4 to 2.6-3.2.

The derivation:

On a grid z_i = a + i·h the Mg(Mg+1)/2 midpoints (z_i + z_j)/2 take only 2Mg - 1 values a + s·h/2 (s = i + j),
and (z_i - z_j)² = d²h² (d = |i - j|), so for one group with a diagonal W block (w = ½(W + Wᵀ))
    tr(Φ_n W) / (c_n² sqrt(λ_n/c2_n)) = Σ_s Ŵ_s(λ_n) exp(-(μ_n - a - s h/2)²/c2_n),
    Ŵ_s(λ) = Σ_d A_ds exp(-d²h²/(4λ)),   A_ds = Σ_{i+j=s, |i-j|=d} w_ij,
with c2_n = λ_n + 2v_n: one [N, Mg] x [Mg, 2Mg - 1] product and [N, 2Mg - 1] element-wise work per step instead of
N·Mg² (no series, no κ). The inducing inputs are then not trained. This checks it against
`flowgp.models.amogp.psi_statistics.grouped_psi_statistics` (values and every gradient, float64) and times forward + backward
on the London fit's sizes (2 004 sorted points, Mg = 50), with plain autograd, compiled (`torch.compile`), and as
`flowgp.models.amogp.psi_grid.grid_psi_statistics` (the same formulas with a hand-written backward).

    OMP_NUM_THREADS=1 python -m benchmarks.studies.amogp_grid_midpoints [--points 2004] [--inducing 50] [--no-compile]
"""
from __future__ import annotations

import argparse
import time

import torch

from flowgp.models.amogp.psi_grid import grid_psi_statistics
from flowgp.models.amogp.psi_statistics import grouped_psi_statistics
from benchmarks.lib.timing import median_ms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, default=2004)
    p.add_argument("--inducing", type=int, default=50)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    f64, n, mg = torch.float64, args.points, args.inducing
    g = torch.Generator().manual_seed(0)
    mu = torch.sort(torch.rand(n, generator=g, dtype=f64) * 3.4 - 1.7)[0].requires_grad_()
    var = (0.09e-3 * (1 + torch.rand(n, generator=g, dtype=f64))).requires_grad_()
    lsq = torch.full((n,), 0.09, dtype=f64, requires_grad=True)
    amp = torch.ones(n, dtype=f64, requires_grad=True)
    start, step = -1.8, 3.6 / (mg - 1)
    z = start + step * torch.arange(mg, dtype=f64)
    root = torch.randn(mg, mg, generator=g, dtype=f64)
    w = (root @ root.T).requires_grad_()
    i, j = torch.meshgrid(torch.arange(mg), torch.arange(mg), indexing="ij")
    cell = ((i - j).abs() * (2 * mg - 1) + (i + j)).reshape(-1)  # (d, s) of each (i, j)
    mids = start + 0.5 * step * torch.arange(2 * mg - 1, dtype=f64)
    gaps2 = (step * torch.arange(mg, dtype=f64)).square()
    params = [mu, var, lsq, amp, w]

    def grid_node():
        ws = 0.5 * (w + w.T)
        a = ws.new_zeros(mg * (2 * mg - 1)).index_add(0, cell, ws.reshape(-1)).view(mg, 2 * mg - 1)
        c1, c2 = lsq + var, lsq + 2 * var
        psi1 = (amp * (lsq / c1).sqrt())[:, None] * torch.exp(-0.5 * (mu[:, None] - z).square() / c1[:, None])
        wh = torch.exp((-0.25 / lsq)[:, None] * gaps2) @ a  # Ŵ_s(λ_n), [N, 2Mg - 1]
        t = (wh * torch.exp(-(mu[:, None] - mids).square() / c2[:, None])).sum(-1)
        return psi1, amp.square() * (lsq / c2).sqrt() * t

    def series_node():
        psi1, phi = grouped_psi_statistics(mu[:, None], var[:, None], z.view(1, mg, 1), w.view(1, mg, mg),
                                           amp[:, None], lsq.view(n, 1, 1), validate=False)
        return psi1[:, 0], phi

    grid = (torch.tensor([start], dtype=f64), torch.tensor([step], dtype=f64))

    def library_node():  # flowgp.models.amogp.psi_grid: the same formulas with the chain rule by hand
        psi1, phi = grid_psi_statistics(mu[:, None], var[:, None], *grid, w.view(1, mg, mg), amp[:, None],
                                        lsq.view(n, 1, 1), validate=False)
        return psi1[:, 0], phi

    def gradients(node):
        psi1, phi = node()
        return [psi1.detach(), phi.detach()] + list(torch.autograd.grad(psi1.sum() + phi.sum(), params))

    names = ["psi1", "tr(ΦW)", "∂μ", "∂v", "∂λ", "∂c", "∂W"]
    ref, new = gradients(series_node), gradients(grid_node)
    worst = max((float((a - b).abs().max() / a.abs().max()), name) for a, b, name in zip(ref, new, names))
    print(f"{n} points, Mg = {mg}: grid node against the series node, largest relative difference "
          f"{worst[0]:.1e} ({worst[1]})")
    print(f"  series node (today's, inducing inputs free)  {median_ms(lambda: gradients(series_node)):6.2f} ms")
    print(f"  grid node, autograd                          {median_ms(lambda: gradients(grid_node)):6.2f} ms")
    lib = gradients(library_node)
    agree = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(ref, lib))
    print(f"  grid node, flowgp.models.amogp.psi_grid (by hand)          {median_ms(lambda: gradients(library_node)):6.2f} ms "
          f"(agrees with the series node to {agree:.0e})")
    if not args.no_compile:
        compiled = torch.compile(grid_node)
        start_c = time.perf_counter()
        check = gradients(compiled)
        seconds = time.perf_counter() - start_c
        agree = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(new, check))
        print(f"  grid node, compiled                          {median_ms(lambda: gradients(compiled)):6.2f} ms "
              f"(compiled in {seconds:.1f} s; agrees with autograd to {agree:.0e})")


if __name__ == "__main__":
    main()
