"""Would a direct sum over inducing-input pairs (a Gauss transform over their midpoints) make the CP layer's Ψ₂
node cheaper?

Answer (2026-11-27): not enough to matter. The contraction alone takes about 7 ms forward and backward (chunks of
32-2 004 points) against 12.4 ms for the whole series node, so as a node it would save perhaps 2 ms of a 21-23 ms
step (full-batch AMO-GP / MO-GP ratio 3.8-4.0, not 3). Windowing keeps 88-91 % of the pair terms at this
lengthscale. Both forms do N·Mg² work; the grid form (`amogp_grid_midpoints.py`) was the lever. Also measured:
on this CPU exp is faster than exp2 in float64.

For one group with a diagonal W block, tr(Φ_n W) = Σ_{i<=j} w'_ij exp(-(z_i - z_j)²/(4λ_n) - (μ_n - m_ij)²/c2_n)
(m_ij the midpoints, c2_n = λ_n + 2v_n, w' = w with the off-diagonal pairs doubled): a Gauss transform over the
P = Mg(Mg+1)/2 midpoints with no series at all. This times its dense evaluation the way a node would run it, in
chunks of points, on the London fit's sizes (2 004 sorted points, Mg = 50, P = 1 275):
    forward   exponent [chunk, P] = [β μ², -2β μ, β, α]_n · [1, m, m², dz]_p (one K = 4 product), exp in place,
              then [chunk, P] x [P, 4] for t and the three sums the backward needs;
    backward  the exponentials again, then [4, chunk] x [chunk, P] for ∂w', ∂m and ∂dz;
    windowed  the same on the pairs (sorted by midpoint) whose terms exceed e^-40 for some point of the chunk;
and exp against exp2 on 2.5 M values, float64 and float32, for exponents in [-40, 0] and [-700, 0]. Compare with the node's time from
`benchmarks/perf/amogp_psi_node.py` (series of products, forward and backward, Ψ₁ included).

    OMP_NUM_THREADS=1 python -m benchmarks.studies.amogp_pair_transform [--chunks 64,256,2004]
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.lib.timing import median_ms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--points", type=int, default=2004)
    p.add_argument("--inducing", type=int, default=50)
    p.add_argument("--chunks", default="64,256,2004")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, mg, f64 = args.points, args.inducing, torch.float64
    mu = torch.sort(torch.rand(n, generator=g, dtype=f64) * 3.4 - 1.7)[0]
    z = torch.linspace(-1.8, 1.8, mg, dtype=f64)
    rows, cols = torch.triu_indices(mg, mg)
    m, dz = 0.5 * (z[rows] + z[cols]), (z[rows] - z[cols]).square()
    order = torch.argsort(m)  # pairs by midpoint, so that a chunk of sorted points needs a contiguous window
    rows, cols, m, dz = rows[order], cols[order], m[order], dz[order]
    pairs = m.numel()
    beta = -1.0 / (0.09 + 2e-4 * torch.rand(n, generator=g, dtype=f64))  # -1/c2
    alpha = torch.full((n,), -1.0 / (4 * 0.09), dtype=f64)  # -1/(4λ)
    w = torch.randn(pairs, generator=g, dtype=f64)
    basis = torch.stack([torch.ones_like(m), m, m * m, dz])  # [4, P]
    sums = torch.stack([w, w * m, w * m * m, w * dz], 1)  # [P, 4]
    upstream = torch.randn(n, 4, generator=g, dtype=f64)

    def exponentials(s, c, out, window=slice(None)):
        mc, bc, ac = mu[s:s + c], beta[s:s + c], alpha[s:s + c]
        a = torch.stack([bc * mc * mc, -2 * bc * mc, bc, ac], 1)
        return torch.mm(a, basis[:, window], out=out).exp_()

    def windows(chunk):
        """Per chunk of points, the pairs whose every term exceeds e^-40 for some point of it: midpoints within
        sqrt(40 c2) of the chunk's inputs (the dz term only lowers the others further). One host read."""
        starts = torch.arange(0, n, chunk)
        ends = torch.clamp(starts + chunk, max=n) - 1
        reach = (40.0 / (-beta)).sqrt().max()
        lo = torch.searchsorted(m, mu[starts] - reach)
        hi = torch.searchsorted(m, mu[ends] + reach)
        return [slice(a, b) for a, b in zip(lo.tolist(), hi.tolist())]

    def forward_windowed(chunk):
        buf = torch.empty(chunk * pairs, dtype=f64)
        res = torch.empty(n, 4, dtype=f64)
        for s, win in zip(range(0, n, chunk), windows(chunk)):
            c, k = min(chunk, n - s), win.stop - win.start
            torch.mm(exponentials(s, c, buf[:c * k].view(c, k), win), sums[win], out=res[s:s + c])
        return res

    def backward_windowed(chunk):
        buf = torch.empty(chunk * pairs, dtype=f64)
        acc = torch.zeros(4, pairs, dtype=f64)
        for s, win in zip(range(0, n, chunk), windows(chunk)):
            c, k = min(chunk, n - s), win.stop - win.start
            acc[:, win].addmm_(upstream[s:s + c].T, exponentials(s, c, buf[:c * k].view(c, k), win))
        return acc

    def forward(chunk):
        buf = torch.empty(chunk * pairs, dtype=f64)
        res = torch.empty(n, 4, dtype=f64)
        for s in range(0, n, chunk):
            c = min(chunk, n - s)
            torch.mm(exponentials(s, c, buf[:c * pairs].view(c, pairs)), sums, out=res[s:s + c])
        return res

    def backward(chunk):
        buf = torch.empty(chunk * pairs, dtype=f64)
        acc = torch.zeros(4, pairs, dtype=f64)
        for s in range(0, n, chunk):
            c = min(chunk, n - s)
            acc.addmm_(upstream[s:s + c].T, exponentials(s, c, buf[:c * pairs].view(c, pairs)))
        return acc

    print(f"{n} points, Mg = {mg}, P = {pairs} pairs: {n * pairs / 1e6:.2f} M exponentials per pass")
    for chunk in (int(v) for v in args.chunks.split(",")):
        print(f"  chunk {chunk:5d}: forward {median_ms(lambda: forward(chunk)):.2f} ms, "
              f"backward {median_ms(lambda: backward(chunk)):.2f} ms; windowed: forward "
              f"{median_ms(lambda: forward_windowed(chunk)):.2f} ms, backward "
              f"{median_ms(lambda: backward_windowed(chunk)):.2f} ms "
              f"({sum((w.stop - w.start) * min(chunk, n - s) for s, w in zip(range(0, n, chunk), windows(chunk))) / (n * pairs):.0%} "
              f"of the point-pair terms; "
              f"forward agrees to {float((forward_windowed(chunk) - forward(chunk)).abs().max() / forward(chunk).abs().max()):.0e})")
    # exp against exp2 on as many values (the node's exponential paths use exp2 of base-2 exponents), for exponents
    # in [-40, 0] and in [-700, 0] (float32's results are subnormal below about -87, float64's below about -708)
    for dtype in (torch.float64, torch.float32):
        for low in (-40.0, -700.0):
            x = torch.empty(n * pairs, dtype=dtype).uniform_(low, 0.0, generator=g)
            y = torch.empty_like(x)
            print(f"  {str(dtype)[6:]:7s} exponents in [{low:g}, 0]: exp {median_ms(lambda: torch.exp(x, out=y)):.2f} ms, "
                  f"exp2 {median_ms(lambda: torch.exp2(x, out=y)):.2f} ms")

if __name__ == "__main__":
    main()
