"""What does the default robust TGP fit cost next to the default SVGP fit, per stage, at a given epoch budget?

Fits `SVGPRegressor()` and `TGPRegressor(flow="sal+softplus")` (robust by default) with M = 100, batches of
512, float64, one torch thread, on a synthetic set (x ~ N(0, I) in D = 8, y = softplus(2 f(x) + 0.3 ε) + 0.001
with f = sin(x₁) + x₂ / 2: positive and skewed, so the flow has work to do), alternating SVGP and TGP fits per
repeat so machine load hits both alike. Prints per fit: wall seconds, epochs trained (`n_iter_`), the training
bound per point (`elbo / N` in the units of y), and for the TGP the ratio to the SVGP's seconds and its stages'
wall seconds (`fit_report_["seconds"]`); CPU seconds of the process (one torch thread) as well, the robust measure
on a shared machine.

Run from the repository root:
`OMP_NUM_THREADS=1 python -m benchmarks.perf.robust_tgp_cost --n 10000 --epochs 50 200`
(`--n 2000 --epochs 1000` for the 1 000-epoch point on a shared 2-core machine).

Results (2026-12-07, 2-core machine shared with other jobs, load average 11-16; one fit each; CPU seconds):

    N       epochs   SVGP CPU s   TGP CPU s   ratio   n_iter SVGP / TGP   bound SVGP / TGP
    10 000      50        9.0        10.1      1.13        50 / 50         0.0725 / 0.2218
    10 000     200       27.8        31.8      1.14       200 / 200        0.2486 / 0.2783
     2 000     200        5.3         7.9      1.49       200 / 200       -0.0236 / 0.1820
     2 000   1 000       17.4        20.9      1.20       600 / 740        0.1998 / 0.2742

The previous defaults (Adam for the SVGP, a 200-iteration L-BFGS refinement, the SVGP stage without plateau stop,
the best state checked every epoch), same script, N = 10 000, 50 epochs: SVGP 6.4 s, TGP 13.8 s, ratio 2.16
(bounds 0.0356 / 0.2222). The 1 000-epoch point uses N = 2 000 to fit the shared machine.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from flowgp.estimators import SVGPRegressor, TGPRegressor


def synthetic(n: int, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    f = np.sin(x[:, 0]) + 0.5 * x[:, 1]
    y = np.logaddexp(0.0, 2.0 * f + 0.3 * rng.standard_normal(n)) + 1e-3
    return x, y


def timed_fit(est, x, y):
    """(wall seconds, CPU seconds of this process) of est.fit(x, y). On one torch thread the CPU seconds hardly
    depend on what else the machine runs; the wall seconds do (several-fold on a loaded shared machine)."""
    start, cpu = time.perf_counter(), time.process_time()
    est.fit(x, y)
    return time.perf_counter() - start, time.process_time() - cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--no-early-stop", action="store_true", help="early_stop=None for both estimators")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # this benchmark process only
    x, y = synthetic(args.n)
    extra = {"early_stop": None} if args.no_early_stop else {}
    common = dict(num_inducing=100, batch_size=args.batch_size, seed=0, verbose=False, **extra)
    print(f"N={args.n} D=8 M=100 batch={args.batch_size} float64 threads=1 early_stop="
          f"{'None' if args.no_early_stop else 'auto'}", flush=True)
    for epochs in args.epochs:
        for r in range(args.repeats):
            svgp = SVGPRegressor(epochs=epochs, **common)
            t_svgp, c_svgp = timed_fit(svgp, x, y)
            tgp = TGPRegressor(flow="sal+softplus", epochs=epochs, **common)
            t_tgp, c_tgp = timed_fit(tgp, x, y)
            b_svgp, b_tgp = svgp.elbo(x, y) / args.n, tgp.elbo(x, y) / args.n
            # (n_iter_ and the stages' seconds exist from this release on; older code prints epochs of history_)
            stages = " ".join(f"{k}={v:.1f}s" for k, v in tgp.fit_report_.get("seconds", {}).items())
            print(f"epochs={epochs} repeat={r}: CPU SVGP {c_svgp:.1f}s TGP {c_tgp:.1f}s ratio {c_tgp / c_svgp:.2f} | "
                  f"wall: SVGP {t_svgp:.1f}s n_iter={getattr(svgp, 'n_iter_', len(svgp.history_))} bound={b_svgp:.4f} | "
                  f"TGP {t_tgp:.1f}s n_iter={getattr(tgp, 'n_iter_', len(tgp.history_))} bound={b_tgp:.4f} ratio={t_tgp / t_svgp:.2f} | "
                  f"{stages} svgp_epochs={tgp.fit_report_.get('svgp_epochs')} "
                  f"refine_evals={tgp.fit_report_.get('refine_evaluations')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
