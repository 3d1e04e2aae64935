"""Does the latent deep GP's importance-weighted bound stay below log p(y)? (issue 25, a fact for the docs)

The tiny two-layer problem of tests/test_ldgp_validity.py (3 points, 1-D x and z, kernels, likelihood and p(z)
fixed): the bound is optimised over its variational parameters and compared with a brute-force Monte Carlo
estimate of log p(y) under the exact two-layer GP prior (10^6 joint draws of z and f1, f2 integrated exactly).
Two versions of the bound are fitted from the same initialisation:
- "joint": this checkout (the first layer drawn jointly over the K importance samples);
- "per-slot": the LatentDeepGP of another git revision (default `main` before issue 25), which draws each of the K
  slots from its marginal. Its source is read with `git show REV:src/flowgp/models/latent_deep_gp.py` and loaded
  as a module next to this checkout's flowgp (only its LatentDeepGP class is used, on the same layers).

    PYTHONPATH=src python benchmarks/ldgp_bound_validity.py [--old-rev main] [--k 5,50] [--steps 600]
"""
from __future__ import annotations

import argparse

import torch

from flowgp.bench.ldgp_ablations import per_slot_hidden_sample, use_hidden_draw
from flowgp.bench.toys import fit_tiny_bound, tiny_latent_dgp, tiny_log_evidence


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="5,50")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--eval-samples", type=int, default=4000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    log_p, rel_se = tiny_log_evidence(tiny_latent_dgp())
    print(f"brute-force log p(y) = {log_p:.4f} (+- {rel_se:.4f}, 10^6 draws)")
    print("| K | version | fitted bound | se | bound - log p(y) |")
    print("|---|---|---|---|---|")
    for k in [int(v) for v in args.k.split(",")]:
        for version in ("joint", "per-slot"):
            model = tiny_latent_dgp(k)
            if version == "per-slot":
                use_hidden_draw(model, per_slot_hidden_sample)
            bound, se = fit_tiny_bound(model, steps=args.steps, eval_samples=args.eval_samples)
            print(f"| {k} | {version} | {bound:.4f} | {se:.4f} | {bound - log_p:+.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
