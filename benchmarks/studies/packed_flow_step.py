"""The TGP's "sal+softplus" flow as one SAL stage (its four scalars in one parameter tensor, two modules: the
layout since session 21) against the same map built as three stages with four scalar tensors
("sinharcsinh+affine+softplus", how "sal+softplus" was built before), compiled training steps (issue 26).

    python benchmarks/packed_flow_step.py 20,100        # M values; float32, N = 10 240, B = 512

Each compiled step is timed in interleaved rounds in one process (medians); prints each step and its ratio to
the SVGP's (docs/results/timing/README.md, sessions 20 and 21).
"""
from __future__ import annotations

import sys

import torch

from benchmarks.lib.steps import flowgp_step, step_medians, synthetic_data
from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel

FLOWS = {"tgp": "sal+softplus", "tgp-3-stages": "sinharcsinh+affine+softplus"}


def main():
    inducing = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "20,100").split(",")]
    dtype, n, d, batch = torch.float32, 10_240, 8, 512
    x64, y64, g = synthetic_data(n, d)
    x, y = x64.to(dtype), y64.to(dtype)
    for m in inducing:
        z = x64[torch.randperm(n, generator=g)[:m]]  # models are built in float64, then moved to the dtype
        models = {"svgp": SVGP(make_kernel("rbf", d), z.clone(), GaussianLikelihood(0.05))}
        models.update({k: TGP(make_kernel("rbf", d), z.clone(), make_flow(spec), GaussianLikelihood(0.05))
                       for k, spec in FLOWS.items()})
        steps = {k: flowgp_step(model.to(dtype), x, y, batch, compiled=True) for k, model in models.items()}
        median = step_medians(steps, rounds=11, per_round=60)
        print(f"M={m} " + "  ".join(f"{k} {1e6 * v:.0f}us ({v / median['svgp']:.3f})" for k, v in median.items()),
              flush=True)


if __name__ == "__main__":
    main()
