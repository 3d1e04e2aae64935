"""Where does the TGP's compiled step spend its time beyond the SVGP's: the quadrature, the flow's arithmetic, or
its parameters (each measured by removing it)?

Answer (2026-11-29, float32, N = 10 240, B = 512): mostly the flow's arithmetic. Of the TGP's 119 µs over the
SVGP at M = 20 (ratio 1.264; 1.131 at M = 100): the Gauss-Hermite machinery about 15 µs, the sinh-arcsinh +
affine + softplus arithmetic at the 10 240 nodes about 73 µs, the four scalar parameters about 31 µs (8 µs each).
The parameters' share led to the one-tensor flow layout (`packed_flow_step.py`).

    python -m benchmarks.studies.tgp_step_decomposition                 # float32, N = 10 240, B = 512, M = 20 and 100

Compiled steps (flowgp.training.compiled, as `benchmarks/perf/step_time.py --compile` times them), interleaved rounds, medians:
- svgp: the SVGP (closed-form expected log-likelihood);
- affine-quad-frozen: a TGP with an affine flow evaluated by quadrature (closed_form_affine=False), its
  parameters frozen: the Gauss-Hermite machinery alone;
- affine-quad: the same with its two parameters trained: the cost of two scalar parameter tensors;
- softplus: a parameter-free softplus flow by quadrature;
- sal+softplus-frozen: the benchmark's TGP flow with its four parameters frozen: the flow's arithmetic;
- sal+softplus: the benchmark's TGP (`step_time.py`'s "tgp").
Prints each step in µs and its ratio to the SVGP step; `--json` writes them. Run on a quiet machine.
"""
from __future__ import annotations

import argparse
import json

import torch

from benchmarks.lib.steps import flowgp_step, step_medians, synthetic_data
from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel

VARIANTS = (("svgp", None, False), ("affine-quad-frozen", "affine", True), ("affine-quad", "affine", False),
            ("softplus", "softplus", False), ("sal+softplus-frozen", "sal+softplus", True),
            ("sal+softplus", "sal+softplus", False))


def build(flow, frozen, z, dim):
    if flow is None:
        return SVGP(make_kernel("rbf", dim), z.clone(), GaussianLikelihood(0.05))
    model = TGP(make_kernel("rbf", dim), z.clone(), make_flow(flow), GaussianLikelihood(0.05),
                closed_form_affine=False)
    for p in model.flow.parameters():
        p.requires_grad_(not frozen)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inducing", default="20,100")
    p.add_argument("--num-data", type=int, default=10_240)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--steps", type=int, default=60, help="steps per round and model (their median is kept)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    n, d = args.num_data, args.dim
    x, y, g = synthetic_data(n, d)
    rows = []
    for m in (int(v) for v in args.inducing.split(",")):
        z = x[torch.randperm(n, generator=g)[:m]].clone()
        steps = {name: flowgp_step(build(flow, frozen, z, d).to(dtype), x.to(dtype), y.to(dtype), args.batch,
                                   compiled=True) for name, flow, frozen in VARIANTS}
        median = step_medians(steps, args.rounds, args.steps)
        row = {"M": m, "N": n, "B": args.batch, "dtype": args.dtype, "threads": torch.get_num_threads(),
               "step_us": {k: 1e6 * v for k, v in median.items()},
               "over_svgp": {k: v / median["svgp"] for k, v in median.items()}}
        rows.append(row)
        print(f"M = {m}: " + "  ".join(f"{k} {1e6 * v:.0f} µs ({v / median['svgp']:.3f})" for k, v in median.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
