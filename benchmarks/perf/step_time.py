"""Time one training step (minibatch ELBO, backward, Adam update) of flowgp's SVGP and TGP and GPyTorch's SVGP.

Run from the repository root (GPyTorch is a dev-only dependency):

    pip install gpytorch
    python -m benchmarks.perf.step_time                 # N=10000, D=8, B=512, M in {20,100,500}, float32/float64
    python -m benchmarks.perf.step_time --repeats 50 --json results.json --device cuda
    python -m benchmarks.perf.step_time --threads 1 --compile   # also the compiled step (flowgp.training.compiled)
    python -m benchmarks.perf.step_time --threads 1 --clock cpu # CPU time per step: for a loaded machine

Every configuration builds the same sizes for all the models in the same process and reports the
median step time over `--repeats` steps after warm-up (the models timed in alternating blocks of 10 steps),
with the ratios TGP/SVGP and flowgp-SVGP/GPyTorch-SVGP. Every model, GPyTorch's included, is updated by the
optimiser `flowgp.training.loop.train` uses by default (`default_optimizer`: fused Adam), so the ratios compare
the models' bounds and gradients, not optimisers.

The "limit" column is the time the arithmetic the whitened SVGP step cannot avoid would take at the GEMM
rate measured in the same run (the best of a few 2048³ matmuls in the step's dtype, on its device, timed
before and after that dtype's configurations). The FLOPs counted (`essential_flops`) are
    6·M²·B   forward A = Lz⁻¹ K_ZX and Rᵀ A (two triangular [M, M] x [M, B] products, M²B each),
             backward twice that (the gradients of both products with respect to both operands);
    2·M³     Cholesky of K_ZZ (M³/3), its backward (about M³), S = R Rᵀ and its backward (M³/3 + 1/3 M³);
    6·M·B·D  the cross-covariance K_ZX (one [B, D] x [D, M] product forward, two backward);
element-wise passes (exp, the Gaussian expected log-likelihood) and the optimiser's update are not counted,
so step / limit >= 1 only approximately bounds what any implementation can reach.

With --compile the flowgp steps are also timed through `flowgp.training.compiled.CompiledObjective` (torch.compile
of the whole bound, forward and backward); its compilation time is reported on its own (compile_s), with
the end-to-end time of a 1000-step fit it implies next to the eager one (an estimate from step times;
`benchmarks/perf/compiled_fit_time.py` times whole fits, eager, compiled and compile="auto", each in a fresh process).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.lib.steps import batches, flowgp_step, sync, time_interleaved
from benchmarks.lib.steps import clock as timer_for
from flowgp import TGP, SVGP, GaussianLikelihood, make_flow, make_kernel
from flowgp.training.compiled import compile_unavailable_reason
from flowgp.training.loop import default_optimizer

GEMM_SIZE = 2048


def essential_flops(m: int, b: int, d: int) -> float:
    """FLOPs the whitened SVGP step cannot avoid (see the module docstring): 6 M²B + 2 M³ + 6 MBD."""
    return 6.0 * m * m * b + 2.0 * m ** 3 + 6.0 * m * b * d


def gemm_rate(dtype, device, repeats=5, size=GEMM_SIZE, clock_kind="wall") -> float:
    """FLOP/s of the best of `repeats` [size, size] x [size, size] matmuls (2·size³ FLOPs each)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g, dtype=dtype).to(device)
    b = torch.randn(size, size, generator=g, dtype=dtype).to(device)
    out = torch.empty(size, size, dtype=dtype, device=device)
    torch.matmul(a, b, out=out)
    best = float("inf")
    now = timer_for(clock_kind)
    for _ in range(repeats):
        sync(device)
        start = now()
        torch.matmul(a, b, out=out)
        sync(device)
        best = min(best, now() - start)
    return 2.0 * size ** 3 / best


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
    # the same optimiser as flowgp's steps (fused Adam): the ratio compares the models' steps, not optimisers
    opt = default_optimizer(list(model.parameters()) + list(likelihood.parameters()), lr)
    minibatches = batches(x, y[:, 0], batch, torch.Generator().manual_seed(seed))
    model.train()
    likelihood.train()

    def step():
        xb, yb = next(minibatches)
        opt.zero_grad(set_to_none=True)
        loss = -mll(model(xb), yb)
        loss.backward()
        opt.step()

    return step


def run(num_data=10_000, dim=8, batch=512, inducing=(20, 100, 500), dtypes=("float32", "float64"),
        repeats=30, warmup=5, device="cpu", quadrature_points=20, peer=True, compiled=False, fit_steps=1000,
        clock="wall", compile_mode=None):
    device = torch.device(device)
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and device.type != "cpu":
        raise ValueError("clock='cpu' times CPU work only; use clock='wall' on CUDA")
    if compiled:
        reason = compile_unavailable_reason(device)
        if reason is not None:
            print(f"--compile skipped: {reason}", flush=True)
            compiled = False
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        rate_before = gemm_rate(dtype, device, clock_kind=clock)
        dtype_rows = []
        g = torch.Generator().manual_seed(0)
        x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
        y = torch.sin(x[:, :1]) + 0.1 * torch.randn(num_data, 1, generator=g, dtype=torch.float64)
        x, y = x.to(device, dtype), y.to(device, dtype)
        for m in inducing:
            z = x[torch.randperm(num_data, generator=g)[:m].to(device)].clone()

            def build(kind):
                if kind == "svgp":
                    return SVGP(make_kernel("rbf", dim), z, GaussianLikelihood(0.05)).to(device, dtype)
                return TGP(make_kernel("rbf", dim), z, make_flow("sal+softplus"), GaussianLikelihood(0.05),
                           quadrature_points=quadrature_points).to(device, dtype)

            svgp, tgp = build("svgp"), build("tgp")
            row = {"dtype": dtype_name, "M": m, "N": num_data, "D": dim, "B": batch, "device": str(device),
                   "threads": torch.get_num_threads()}
            steps = {"svgp_ms": flowgp_step(svgp, x, y, batch), "tgp_ms": flowgp_step(tgp, x, y, batch)}
            if peer:
                steps["gpytorch_svgp_ms"] = gpytorch_step(z, x, y, batch)
            if compiled:
                # fresh compiler caches for every configuration: past dynamo's recompile limit (8 graphs per
                # function in one process) later configurations would run eagerly while reported as compiled
                torch._dynamo.reset()
                for name in ("svgp", "tgp"):
                    step = flowgp_step(build(name), x, y, batch, compiled=True, compile_mode=compile_mode)
                    steps[f"{name}_compiled_ms"] = step
                    row[f"{name}_compile_s"] = step.compiler.compile_seconds  # wall time, whatever the clock
                    row[f"{name}_compile_failure"] = step.compiler.failure
            row["clock"] = clock
            if compiled:
                row["compile_mode"] = compile_mode or "default"
            row.update({k: 1e3 * v for k, v in time_interleaved(steps, repeats, warmup, device, clock_kind=clock).items()})
            row["tgp_over_svgp"] = row["tgp_ms"] / row["svgp_ms"]
            if peer:
                row["flowgp_over_gpytorch"] = row["svgp_ms"] / row["gpytorch_svgp_ms"]
            row["essential_gflop"] = essential_flops(m, batch, dim) / 1e9
            if compiled:
                row["tgp_over_svgp_compiled"] = row["tgp_compiled_ms"] / row["svgp_compiled_ms"]
                if peer:
                    row["compiled_over_gpytorch"] = row["svgp_compiled_ms"] / row["gpytorch_svgp_ms"]
                row["fit_steps"] = fit_steps
                row["eager_fit_s"] = fit_steps * row["svgp_ms"] / 1e3
                row["compiled_fit_s"] = row["svgp_compile_s"] + fit_steps * row["svgp_compiled_ms"] / 1e3
            dtype_rows.append(row)
        rate = max(rate_before, gemm_rate(dtype, device, clock_kind=clock))
        for row in dtype_rows:
            row["gemm_gflops"] = rate / 1e9
            row["limit_ms"] = 1e3 * row["essential_gflop"] * 1e9 / rate
            row["svgp_over_limit"] = row["svgp_ms"] / row["limit_ms"]
            if compiled:
                row["compiled_over_limit"] = row["svgp_compiled_ms"] / row["limit_ms"]
            print(_format(row), flush=True)
        rows.extend(dtype_rows)
    return rows


def _format(r):
    text = (f"{r['dtype']:>8} M={r['M']:>4}  flowgp SVGP {r['svgp_ms']:8.2f} ms  TGP {r['tgp_ms']:8.2f} ms  "
            f"TGP/SVGP {r['tgp_over_svgp']:5.2f}")
    if "gpytorch_svgp_ms" in r:
        text += f"  GPyTorch SVGP {r['gpytorch_svgp_ms']:8.2f} ms  flowgp/GPyTorch {r['flowgp_over_gpytorch']:5.2f}"
    if "limit_ms" in r:
        text += (f"  limit {r['limit_ms']:7.2f} ms ({r['essential_gflop']:.3f} GFLOP at {r['gemm_gflops']:.0f} "
                 f"GFLOP/s)  step/limit {r['svgp_over_limit']:6.2f}")
    if "svgp_compiled_ms" in r:
        text += (f"\n{'':>15}compiled: SVGP {r['svgp_compiled_ms']:8.2f} ms  TGP {r['tgp_compiled_ms']:8.2f} ms  "
                 f"TGP/SVGP {r['tgp_over_svgp_compiled']:5.2f}  step/limit {r['compiled_over_limit']:6.2f}")
        if "compiled_over_gpytorch" in r:
            text += f"  compiled/GPyTorch {r['compiled_over_gpytorch']:5.2f}"
        text += (f"  compile {r['svgp_compile_s']:.1f} s (TGP {r['tgp_compile_s']:.1f} s); {r['fit_steps']}-step fit "
                 f"{r['compiled_fit_s']:.1f} s compiled vs {r['eager_fit_s']:.1f} s eager")
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-data", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--inducing", default="20,100,500")
    p.add_argument("--dtypes", default="float32,float64")
    # 200: with 30 (three blocks of 10 per model) the compiled TGP / SVGP ratio moved by 0.1 from run to run on the
    # project's 2-core CPU (M = 100: 0.98 and 1.07 in two runs, docs/results/perf/step-time/README.md, 2026-11-29)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-peer", action="store_true", help="skip GPyTorch")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--compile", action="store_true", help="also time the compiled flowgp steps")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of the compiled steps (e.g. reduce-overhead: CUDA graphs on a GPU)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or this process's CPU time (with --threads 1: robust to a loaded machine)")
    p.add_argument("--fit-steps", type=int, default=1000, help="fit length for the compiled end-to-end estimate")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = p.parse_args()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    rows = run(a.num_data, a.dim, a.batch, tuple(int(m) for m in a.inducing.split(",")), tuple(a.dtypes.split(",")),
               a.repeats, a.warmup, a.device, peer=not a.no_peer, compiled=a.compile, fit_steps=a.fit_steps,
               clock=a.clock, compile_mode=a.compile_mode)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
