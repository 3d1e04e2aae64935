"""A prototype for issue 26: the TGP's "sal+softplus" flow with its four scalars in one parameter tensor and one
module, against the registered composition (three modules, four scalar tensors), compiled steps.

    python benchmarks/packed_flow_step.py 20,100        # M values; float32, N = 10 240, B = 512

Each compiled step is timed in interleaved rounds in one process (medians); prints each step and its ratio to
the SVGP's. `PackedSALSoftplus` exists only here (not registered, no inverse or log-det): it measures what the
per-tensor and per-module cost of the composition is worth (docs/results/timing/README.md, "Session 20").
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel
from flowgp.flows.base import Flow
from flowgp.flows.elementwise import _SinhArcsinhMap  # the registered flow's own node: the same arithmetic
from step_time import flowgp_step
from tgp_step_decomposition import step_medians, synthetic_data


class PackedSALSoftplus(Flow):
    """softplus(c + d·sinh(b·arcsinh(f) - a)), b, d > 0 by softplus, from one 4-element raw tensor."""

    name = "packed-sal-softplus"
    codomain = "positive"

    def __init__(self):
        super().__init__()
        unit = math.log(math.expm1(1.0))  # softplus⁻¹(1): b = d = 1, a = c = 0, as the registered defaults
        self.theta = torch.nn.Parameter(torch.tensor([0.0, unit, 0.0, unit], dtype=torch.float64))

    def params(self, x=None, *, sampling=None):
        t = self.theta
        return {"a": t[0], "b": F.softplus(t[1]), "c": t[2], "d": F.softplus(t[3])}

    def _forward(self, f, p):
        y = _SinhArcsinhMap.apply(f, p["a"], p["b"])
        return F.softplus(torch.addcmul(p["c"], p["d"], y), beta=1.0, threshold=40.0)

    def _affine(self, p):
        return None

    def constructor_arguments(self):
        return [], {}


def main():
    inducing = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "20,100").split(",")]
    dtype, n, d, batch = torch.float32, 10_240, 8, 512
    x64, y64, g = synthetic_data(n, d)
    x, y = x64.to(dtype), y64.to(dtype)
    for m in inducing:
        z = x64[torch.randperm(n, generator=g)[:m]]  # models are built in float64, then moved to the dtype
        models = {"svgp": SVGP(make_kernel("rbf", d), z.clone(), GaussianLikelihood(0.05)),
                  "tgp": TGP(make_kernel("rbf", d), z.clone(), make_flow("sal+softplus"), GaussianLikelihood(0.05)),
                  "tgp-packed": TGP(make_kernel("rbf", d), z.clone(), PackedSALSoftplus(), GaussianLikelihood(0.05))}
        steps = {k: flowgp_step(model.to(dtype), x, y, batch, compiled=True) for k, model in models.items()}
        median = step_medians(steps, rounds=11, per_round=60)
        print(f"M={m} " + "  ".join(f"{k} {1e6 * v:.0f}us ({v / median['svgp']:.3f})" for k, v in median.items()),
              flush=True)


if __name__ == "__main__":
    main()
