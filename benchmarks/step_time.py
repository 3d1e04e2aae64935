"""Time one training step (minibatch ELBO, backward, Adam update) of flowgp's SVGP and TGP and GPyTorch's SVGP.

Run from the repository root (GPyTorch is a dev-only dependency):

    pip install gpytorch
    python benchmarks/step_time.py                 # N=10000, D=8, B=512, M in {20,100,500}, float32/float64
    python benchmarks/step_time.py --repeats 50 --json results.json --device cuda

Every configuration builds the same sizes for all three models in the same process and reports the
median step time over `--repeats` steps after warm-up (the models timed in alternating blocks of 10 steps),
with the ratios TGP/SVGP and flowgp-SVGP/GPyTorch-SVGP.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from flowgp import TGP, SVGP, GaussianLikelihood, make_flow, make_kernel


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_interleaved(steps, repeats, warmup, device, block=10):
    """Median seconds per step of each closure in `steps`, timed in alternating blocks of `block` steps.

    Alternating blocks expose every model to the same drift in machine load and clock speed, so the
    ratios stay meaningful on a shared machine; within a block the model steps back to back as in
    training (warm caches), and the first step of each block is run untimed so the switch is not counted.
    """
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    while min(len(t) for t in times.values()) < repeats:
        for name, step in steps.items():
            step()
            for _ in range(min(block, repeats - len(times[name]))):
                _sync(device)
                start = time.perf_counter()
                step()
                _sync(device)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _batches(x, y, batch, generator):
    """Random minibatches of `batch` rows forever (the whole data every time when batch >= N)."""
    n = x.shape[0]
    while True:
        if batch >= n:
            yield x, y
            continue
        idx = torch.randint(0, n, (batch,), generator=generator).to(x.device)
        yield x[idx], y[idx]


def flowgp_step(model, x, y, batch, lr=0.01, seed=0):
    """One training step (minibatch ELBO, backward, Adam update) of a flowgp model, as a closure."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    batches = _batches(x, y, batch, torch.Generator().manual_seed(seed))
    n = x.shape[0]

    def step():
        xb, yb = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = -model.elbo(xb, yb, num_data=n)
        loss.backward()
        opt.step()

    return step


def gpytorch_step(z, x, y, batch, lr=0.01, seed=0):
    import gpytorch

    class Model(gpytorch.models.ApproximateGP):
        def __init__(self, z):
            dist = gpytorch.variational.CholeskyVariationalDistribution(z.shape[0])
            strategy = gpytorch.variational.VariationalStrategy(self, z, dist, learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=z.shape[1]))

        def forward(self, xb):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(xb), self.covar_module(xb))

    model = Model(z.clone()).to(device=x.device, dtype=x.dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device=x.device, dtype=x.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    opt = torch.optim.Adam(list(model.parameters()) + list(likelihood.parameters()), lr=lr)
    batches = _batches(x, y[:, 0], batch, torch.Generator().manual_seed(seed))
    model.train()
    likelihood.train()

    def step():
        xb, yb = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = -mll(model(xb), yb)
        loss.backward()
        opt.step()

    return step


def run(num_data=10_000, dim=8, batch=512, inducing=(20, 100, 500), dtypes=("float32", "float64"),
        repeats=30, warmup=5, device="cpu", quadrature_points=20, peer=True):
    device = torch.device(device)
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
        y = torch.sin(x[:, :1]) + 0.1 * torch.randn(num_data, 1, generator=g, dtype=torch.float64)
        x, y = x.to(device, dtype), y.to(device, dtype)
        for m in inducing:
            z = x[torch.randperm(num_data, generator=g)[:m].to(device)].clone()
            svgp = SVGP(make_kernel("rbf", dim), z, GaussianLikelihood(0.05)).to(device, dtype)
            tgp = TGP(make_kernel("rbf", dim), z, make_flow("sal+softplus"), GaussianLikelihood(0.05),
                      quadrature_points=quadrature_points).to(device, dtype)
            row = {"dtype": dtype_name, "M": m, "N": num_data, "D": dim, "B": batch, "device": str(device)}
            steps = {"svgp_ms": flowgp_step(svgp, x, y, batch), "tgp_ms": flowgp_step(tgp, x, y, batch)}
            if peer:
                steps["gpytorch_svgp_ms"] = gpytorch_step(z, x, y, batch)
            row.update({k: 1e3 * v for k, v in _time_interleaved(steps, repeats, warmup, device).items()})
            row["tgp_over_svgp"] = row["tgp_ms"] / row["svgp_ms"]
            if peer:
                row["flowgp_over_gpytorch"] = row["svgp_ms"] / row["gpytorch_svgp_ms"]
            rows.append(row)
            print(_format(row), flush=True)
    return rows


def _format(r):
    text = (f"{r['dtype']:>8} M={r['M']:>4}  flowgp SVGP {r['svgp_ms']:8.2f} ms  TGP {r['tgp_ms']:8.2f} ms  "
            f"TGP/SVGP {r['tgp_over_svgp']:5.2f}")
    if "gpytorch_svgp_ms" in r:
        text += f"  GPyTorch SVGP {r['gpytorch_svgp_ms']:8.2f} ms  flowgp/GPyTorch {r['flowgp_over_gpytorch']:5.2f}"
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-data", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--inducing", default="20,100,500")
    p.add_argument("--dtypes", default="float32,float64")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-peer", action="store_true", help="skip GPyTorch")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = p.parse_args()
    rows = run(a.num_data, a.dim, a.batch, tuple(int(m) for m in a.inducing.split(",")), tuple(a.dtypes.split(",")),
               a.repeats, a.warmup, a.device, peer=not a.no_peer)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
