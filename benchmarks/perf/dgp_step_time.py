"""Deep-GP training-step and prediction time: flowgp DSVI / CNF deep GPs vs GPyTorch's DeepGP and flowgp's TGP.

Run from the repository root (GPyTorch is a dev-only dependency):

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.perf.dgp_step_time
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.perf.dgp_step_time --rounds 3 --steps 10   # quicker

Part 1 (synthetic, N=10000, D=8, B=512, M=100, one sample): median time of one training step (minibatch
ELBO, backward, Adam update) of 2- and 3-layer flowgp DSVI ("dgpL"), flow-posterior ("cnf-dgpL": DSVI's Gaussian
base + convolutional flow steps with the defaults of the DSVI-base training: coupled draws, DSVI's own
chain for the shared parameters; "cnf-perpoint-dgpL" one pathwise draw of U per point, the earlier default) and the
CNF paper's ("cnf-paper-dgpL", one shared draw)
deep GPs, GPyTorch's
DeepGP with the same layers, widths (hidden width min(D, 16) = 8), M, batch and one likelihood sample, and
flowgp's TGP (one SAL flow). The peers are interleaved: every round times every model for `--steps` steps and
the reported value is the median over rounds of each round's median, which keeps slow drifts from load on a
shared machine out of the ratios. Ratios printed: flowgp DGP / GPyTorch DGP, DGP / TGP, and the flow
posteriors / DSVI (the aims: cnf-dgp3/dgp3 <= 1.5, dgp3/gpytorch-dgp3 <= 0.7). With --compile the DSVI
step is also timed through flowgp.training.compiled ("dgpL-compiled"; compilation time in the row's "compile").

Part 2 (energy, TGP paper Fig. 11): training-step time (full batch of the 691 training points, M=100) and
prediction time on the 77 test points (mean, variance and log density; the DGP with 100 samples, the TGP
with 100 Gauss-Hermite points) of the 3-layer DSVI deep GP against the TGP.

Results go to a JSON file with `--json PATH` (nothing is written without it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.lib.steps import batches, flowgp_step, interleaved  # perf/step_time.py's step
from flowgp import TGP, GaussianLikelihood, make_flow, make_kernel
from flowgp.data.tables import standardize, uci_split
from flowgp.models.deep_gp import build_deep_gp
from flowgp.training.loop import default_optimizer



def gpytorch_dgp(x, z, num_layers, width, lr=0.01):
    """GPyTorch's DeepGP with the flowgp layer layout: RBF-ARD (scaled) per output, linear mean on hidden layers
    (zero on the last), the same M inducing inputs (shared by the outputs of a layer), whitened Cholesky q(u)."""
    import gpytorch
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer

    class Layer(DeepGPLayer):
        def __init__(self, d_in, d_out, z_init, last):
            batch = torch.Size([d_out]) if d_out > 1 else torch.Size([])
            m = z_init.shape[0]
            dist = gpytorch.variational.CholeskyVariationalDistribution(m, batch_shape=batch)
            zb = z_init.expand(batch + z_init.shape).clone() if d_out > 1 else z_init.clone()
            strategy = gpytorch.variational.VariationalStrategy(self, zb, dist, learn_inducing_locations=True)
            super().__init__(strategy, d_in, None if d_out == 1 else d_out)
            self.mean_module = gpytorch.means.ZeroMean() if last else gpytorch.means.LinearMean(d_in, batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d_in, batch_shape=batch), batch_shape=batch)

        def forward(self, h):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(h), self.covar_module(h))

    class Model(DeepGP):
        def __init__(self):
            super().__init__()
            dims = [x.shape[1]] + [width] * (num_layers - 1) + [1]
            zs = [z]
            for _ in range(num_layers - 1):
                zs.append(torch.randn(z.shape[0], width, dtype=z.dtype))
            self.layers_ = torch.nn.ModuleList(
                [Layer(dims[i], dims[i + 1], zs[i], i == num_layers - 1) for i in range(num_layers)])
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()

        def forward(self, h):
            for layer in self.layers_:
                h = layer(h)
            return h

    model = Model().to(device=x.device, dtype=x.dtype)
    mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, x.shape[0]))
    opt = default_optimizer(model.parameters(), lr)  # the optimiser of flowgp's steps (fused Adam)
    model.train()
    return model, mll, opt


def gpytorch_step(x, y, z, num_layers, width, batch):
    import gpytorch

    model, mll, opt = gpytorch_dgp(x, z, num_layers, width)
    minibatches = batches(x, y[:, 0], batch, torch.Generator().manual_seed(0))

    def step():
        xb, yb = next(minibatches)
        with gpytorch.settings.num_likelihood_samples(1):
            opt.zero_grad(set_to_none=True)
            loss = -mll(model(xb), yb)
            loss.backward()
            opt.step()

    return step


#: (posterior, bench name, draws) of the flowgp deep GPs timed in part 1
POSTERIORS = (("gaussian", "dgp", None), ("cnf", "cnf-dgp", None), ("cnf", "cnf-perpoint-dgp", "per-point"),
              ("cnf-paper", "cnf-paper-dgp", None))


def synthetic(args, device, dtype):
    g = torch.Generator().manual_seed(0)
    n, d = args.num_data, args.dim
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :1]) * torch.cos(x[:, 1:2]) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    x, y = x.to(device, dtype), y.to(device, dtype)
    z = x[torch.randperm(n, generator=g)[: args.inducing].to(device)].clone()
    width = min(d, 16)
    fns = {}
    compile_info = {}
    # models are built from float64 data (no global default dtype) and then moved to the timed dtype
    x64, z64 = x.to(torch.float64), z.to(torch.float64)
    for layers in args.layer_counts:
        for post, name, draws in POSTERIORS:
            if name not in args.models:
                continue
            model = build_deep_gp(x64, 1, layers, inducing_points=z64, posterior=post, hidden_width=width,
                                  draws=draws)
            fns[f"{name}{layers}"] = flowgp_step(model.to(device, dtype), x, y, args.batch)
        if args.compile:
            # the DSVI step through flowgp.training.compiled (torch.compile of bound and backward); compile time apart
            torch._dynamo.reset()
            model = build_deep_gp(x64, 1, layers, inducing_points=z64, posterior="gaussian", hidden_width=width)
            step = flowgp_step(model.to(device, dtype), x, y, args.batch, compiled=True,
                               compile_mode=args.compile_mode)
            fns[f"dgp{layers}-compiled"] = step
            compile_info[f"dgp{layers}"] = {"compile_s": step.compiler.compile_seconds,
                                            "failure": step.compiler.failure,
                                            "mode": args.compile_mode or "default"}
        if not args.no_peer:
            fns[f"gpytorch-dgp{layers}"] = gpytorch_step(x, y, z, layers, width, args.batch)
    tgp = TGP(make_kernel("rbf", d), z64, make_flow("sal"), GaussianLikelihood(0.05)).to(device, dtype)
    fns["tgp"] = flowgp_step(tgp, x, y, args.batch)
    med, per = interleaved(fns, args.rounds, args.steps, args.warmup, device)
    row = {"part": "synthetic", "dtype": str(dtype).replace("torch.", ""), "N": n, "D": d, "B": args.batch,
           "M": args.inducing, "hidden_width": width, "samples": 1,
           "step_ms": {k: 1e3 * v for k, v in med.items()},
           "round_medians_ms": {k: [1e3 * t for t in v] for k, v in per.items()}}
    ratios = {}
    for layers in args.layer_counts:
        # the aims: the flow posterior's step <= 1.5x DSVI's, DSVI's <= 0.7x GPyTorch's
        for name in ("cnf-dgp", "cnf-perpoint-dgp", "cnf-paper-dgp"):
            if f"{name}{layers}" in med and f"dgp{layers}" in med:
                ratios[f"{name}{layers}/dgp{layers}"] = med[f"{name}{layers}"] / med[f"dgp{layers}"]
        for name in ("dgp", "cnf-dgp", "cnf-paper-dgp"):
            key = f"{name}{layers}"
            if key not in med:
                continue
            if f"gpytorch-dgp{layers}" in med:
                ratios[f"{key}/gpytorch-dgp{layers}"] = med[key] / med[f"gpytorch-dgp{layers}"]
            ratios[f"{key}/tgp"] = med[key] / med["tgp"]
        if args.compile and f"dgp{layers}" in med:
            ratios[f"dgp{layers}-compiled/dgp{layers}"] = med[f"dgp{layers}-compiled"] / med[f"dgp{layers}"]
            if f"gpytorch-dgp{layers}" in med:
                ratios[f"dgp{layers}-compiled/gpytorch-dgp{layers}"] = (med[f"dgp{layers}-compiled"]
                                                                        / med[f"gpytorch-dgp{layers}"])
    row["ratios"] = ratios
    if args.compile:
        row["compile"] = compile_info
    return row


def _load_energy(split=0):
    """Energy's standard split, inputs and target standardised with the training statistics only."""
    sp = uci_split("energy", split)
    x_tr, x_te, _, _ = standardize(sp.x_train, sp.x_test)
    y_tr, y_te, _, _ = standardize(sp.y_train[:, None], sp.y_test[:, None])
    return tuple(torch.tensor(a) for a in (x_tr, y_tr, x_te, y_te))


def energy(args, device):
    from flowgp.gp.inducing import kmeans_inducing_points

    xtr, ytr, xte, yte = (t.to(device) for t in _load_energy())
    z = torch.as_tensor(kmeans_inducing_points(xtr, args.inducing, 1, 0), device=device)
    dgp = build_deep_gp(xtr, 1, 3, inducing_points=z).to(device, torch.float64)
    tgp = TGP(make_kernel("rbf", xtr.shape[1]), z, make_flow("sal"), GaussianLikelihood(0.05)).to(device, torch.float64)
    n = xtr.shape[0]
    train = {"dgp3": flowgp_step(dgp, xtr, ytr, n), "tgp": flowgp_step(tgp, xtr, ytr, n)}

    def predict_dgp():
        with torch.no_grad():
            dgp.predict(xte, num_samples=100)
            dgp.log_predictive_density(xte, yte, num_samples=100)

    def predict_tgp():
        with torch.no_grad():
            tgp.predict(xte)
            tgp.log_predictive_density(xte, yte)

    tmed, _ = interleaved(train, args.rounds, args.steps, args.warmup, device)
    pmed, _ = interleaved({"dgp3": predict_dgp, "tgp": predict_tgp}, args.rounds, args.predict_steps, 1, device)
    return {"part": "energy", "N_train": n, "N_test": xte.shape[0], "D": xtr.shape[1], "M": z.shape[0],
            "hidden_width": dgp.layers[0].output_dim, "batch": n, "dgp_predict_samples": 100,
            "tgp_predict_quadrature": tgp.predict_quadrature_points,
            "train_step_ms": {k: 1e3 * v for k, v in tmed.items()},
            "predict_ms": {k: 1e3 * v for k, v in pmed.items()},
            "dgp3_over_tgp_train": tmed["dgp3"] / tmed["tgp"], "dgp3_over_tgp_predict": pmed["dgp3"] / pmed["tgp"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-data", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--dtypes", default="float64")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--predict-steps", type=int, default=3, help="timed predictions per round (part 2)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", default="2,3", help="depths timed in part 1")
    p.add_argument("--models", default=",".join(name for _, name, _ in POSTERIORS),
                   help="flowgp deep GPs timed in part 1 (GPyTorch's and the TGP always, unless --no-peer)")
    p.add_argument("--no-peer", action="store_true", help="skip GPyTorch")
    p.add_argument("--no-energy", action="store_true", help="skip part 2")
    p.add_argument("--compile", action="store_true",
                   help="also time the DSVI step compiled (flowgp.training.compiled; the aim: dgp3 <= 0.5x GPyTorch)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of the compiled DSVI step (e.g. reduce-overhead: CUDA graphs on a GPU)")
    p.add_argument("--json", default=None, help="also write the rows and the run's conditions to this JSON file")
    p.add_argument("--note", default="", help="conditions of the run, stored in the JSON (e.g. 'other jobs paused')")
    a = p.parse_args()
    a.layer_counts = tuple(int(v) for v in a.layers.split(","))
    a.models = tuple(a.models.split(","))
    unknown = set(a.models) - {name for _, name, _ in POSTERIORS}
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; choose from {[name for _, name, _ in POSTERIORS]}")
    device = torch.device(a.device)
    rows = []
    for dt in a.dtypes.split(","):
        row = synthetic(a, device, getattr(torch, dt))
        rows.append(row)
        print(f"[synthetic {row['dtype']}] step ms: " + ", ".join(f"{k} {v:.2f}" for k, v in row["step_ms"].items()))
        print("  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in row["ratios"].items()), flush=True)
    if not a.no_energy:
        row = energy(a, device)
        rows.append(row)
        print(f"[energy] train step ms {row['train_step_ms']}, predict ms {row['predict_ms']}")
        print(f"  DGP3/TGP train {row['dgp3_over_tgp_train']:.2f}x, predict {row['dgp3_over_tgp_predict']:.2f}x")
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "machine": platform.machine(),
            "device": str(device), "cpu_count": os.cpu_count(),
            "note": a.note}
    try:
        import gpytorch

        meta["gpytorch"] = gpytorch.__version__
    except ImportError:
        pass
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
