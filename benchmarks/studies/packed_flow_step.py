"""Is the TGP's compiled step cheaper with its "sal+softplus" flow as one SAL stage (four scalars in one parameter
tensor, two modules) than as three stages with four scalar tensors ("sinharcsinh+affine+softplus")?

Answer (2026-11-29, float32, N = 10 240, B = 512, three repeats): yes. TGP / SVGP compiled 1.221-1.230 against
1.266-1.277 at M = 20 and 1.103-1.120 against 1.115-1.136 at M = 100 (20-25 µs a step at M = 20). "sal+softplus"
has been built as one SAL stage since.

    python -m benchmarks.studies.packed_flow_step 20,100        # M values; float32, N = 10 240, B = 512

Each compiled step is timed in interleaved rounds in one process (medians); prints each step and its ratio to
the SVGP's.
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
