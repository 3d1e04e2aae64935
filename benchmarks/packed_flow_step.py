"""A prototype for issue 26: the TGP's "sal+softplus" flow with its four scalars in one parameter tensor and one
module, against the registered composition (three modules, four scalar tensors), compiled steps.

    python benchmarks/packed_flow_step.py 20,100        # M values; float32, N = 10 240, B = 512

Each compiled step is timed in interleaved rounds in one process (medians); prints each step and its ratio to
the SVGP's. `PackedSALSoftplus` exists only here (not registered, no inverse or log-det): it measures what the
per-tensor and per-module cost of the composition is worth (docs/results/timing/README.md, "Session 20").
"""
import sys, statistics, time, torch
import torch.nn.functional as F
sys.path.insert(0, "benchmarks")
from step_time import flowgp_step
from flowgp import TGP, SVGP, GaussianLikelihood, make_flow, make_kernel
from flowgp.flows.base import Flow
from flowgp.flows.elementwise import _SinhArcsinhMap

class PackedSALSoftplus(Flow):
    name = "packed-sal-softplus"
    codomain = "positive"
    def __init__(self):
        super().__init__()
        # raw a, raw b (softplus⁻¹(1)), raw c, raw d (softplus⁻¹(1))
        inv1 = float(torch.log(torch.expm1(torch.tensor(1.0, dtype=torch.float64))))
        self.theta = torch.nn.Parameter(torch.tensor([0.0, inv1, 0.0, inv1], dtype=torch.float64))
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

M_list = [int(v) for v in sys.argv[1].split(",")]
dt = torch.float32
g = torch.Generator().manual_seed(0)
n, d = 10240, 8
x = torch.randn(n, d, generator=g, dtype=torch.float64); y = torch.sin(x[:, :1]) + 0.1*torch.randn(n, 1, generator=g, dtype=torch.float64)
for M in M_list:
    z = x[torch.randperm(n, generator=g)[:M]].clone()
    steps = {"svgp": flowgp_step(SVGP(make_kernel("rbf", d), z.clone(), GaussianLikelihood(0.05)).to(dt), x.to(dt), y.to(dt), 512, compiled=True),
             "tgp": flowgp_step(TGP(make_kernel("rbf", d), z.clone(), make_flow("sal+softplus"), GaussianLikelihood(0.05)).to(dt), x.to(dt), y.to(dt), 512, compiled=True),
             "tgp-packed": flowgp_step(TGP(make_kernel("rbf", d), z.clone(), PackedSALSoftplus(), GaussianLikelihood(0.05)).to(dt), x.to(dt), y.to(dt), 512, compiled=True)}
    per = {k: [] for k in steps}
    for s in steps.values():
        for _ in range(20): s()
    for r in range(11):
        for k, s in steps.items():
            ts = []
            for _ in range(60):
                t = time.perf_counter(); s(); ts.append(time.perf_counter() - t)
            per[k].append(statistics.median(ts))
    med = {k: statistics.median(v)*1e6 for k, v in per.items()}
    print(f"M={M} " + "  ".join(f"{k} {v:.0f}us ({v/med['svgp']:.3f})" for k, v in med.items()), flush=True)
