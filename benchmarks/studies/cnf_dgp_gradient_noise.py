"""Why did the flow posterior with per-point draws of U trail DSVI, and do coupled draws fix it?

Answer (2026-11-25, boston split 0, 2 layers, identity flow at a fitted DSVI state): the gradient with respect to
the Gaussian base is far noisier with per-point draws. Summed gradient variance: DSVI 644.7 (SNR 1.33), per-point
draws 32 910 (51 x, SNR 0.031), coupled draws 613.6 (SNR 1.42), for the same bound (-1.056 to -1.058 per point).
Coupled draws (`draws="coupled"`, the default of `posterior="cnf"` since) remove the handicap.

Run from the repository root (CPU, about a minute):

    OMP_NUM_THREADS=1 python -m benchmarks.studies.cnf_dgp_gradient_noise --dataset boston --layers 2 \
        --json runs/cnf-dgp-gradient-noise/gradient_noise.json

A DSVI deep GP is fitted on split 0 of a UCI set (`--steps` Adam steps, full batch), a `posterior="cnf"` model
is warm-started from it (`warm_start_from_gaussian`: identity flow steps, so q(U) is exactly DSVI's), and the
bound's gradient with respect to the Gaussian base (every layer's q_mu and q_sqrt) is drawn `--repeats`
times on the full training set under three estimators of the same bound:

* ``dsvi``: the DSVI model itself (per-point marginals of f, U integrated out: a local reparameterisation);
* ``coupled``: the flow model with draws="coupled" (DSVI's estimator of the base + the flow's change on
  coupled per-point chains; the default of posterior="cnf");
* ``per-point``: the flow model with one pathwise draw of U per point (draws="per-point").

It prints, per estimator, the bound's mean and standard deviation per point and the gradient's total variance
and signal-to-noise ratio |E g|² / Σ Var g, at the identity flow and again with the flow's parameters moved
off the identity by Gaussian noise of scale `--perturb` (a flow that has started to learn).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.cnf_dgp import standardised_split, warm_started_flow  # cnf_dgp_finetune.py's data and start
from flowgp.models.deep_gp import build_deep_gp
from flowgp.training.loop import train


def gradient_stats(model, x, y, repeats, seed):
    params = [p for layer in model.layers for p in (layer.gp.q_mu, layer.gp.q_sqrt)]
    g = torch.Generator().manual_seed(seed)
    grads, values = [], []
    for _ in range(repeats):
        model.zero_grad()
        value = model.elbo(x, y, num_data=x.shape[0], generator=g)
        value.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
        values.append(value.item() / x.shape[0])
    grads = torch.stack(grads)
    mean, var = grads.mean(0), grads.var(0)
    return {"elbo_per_point": float(np.mean(values)), "elbo_sd_per_point": float(np.std(values)),
            "grad_total_variance": float(var.sum()), "grad_mean_norm2": float(mean.square().sum()),
            "snr": float(mean.square().sum() / var.sum())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="boston")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--perturb", type=float, default=0.05)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    x, y = standardised_split(args.dataset, args.data_dir)
    dsvi = build_deep_gp(x, 1, args.layers, num_inducing=100, kmeans_restarts=3)
    train(dsvi, x, y, epochs=args.steps, lr=0.01, seed=0, verbose=False)
    rows = {}
    for label, scale in (("identity flow", 0.0), (f"flow perturbed by {args.perturb}", args.perturb)):
        models = {"dsvi": dsvi}
        for draws in ("coupled", "per-point"):
            flow = warm_started_flow(x, args.layers, draws, dsvi)
            if scale:
                g = torch.Generator().manual_seed(1)
                with torch.no_grad():
                    for p in flow.posterior.parameters():
                        p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
            models[draws] = flow
        if scale:
            del models["dsvi"]  # DSVI has no flow to perturb: its row above is the reference
        rows[label] = {name: gradient_stats(m.train(), x, y, args.repeats, seed=2) for name, m in models.items()}
        for name, r in rows[label].items():
            print(f"[{label}] {name:9s} ELBO/pt {r['elbo_per_point']:+.4f} (sd {r['elbo_sd_per_point']:.4f})  "
                  f"grad var {r['grad_total_variance']:.4g}  SNR {r['snr']:.4g}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": rows}, indent=1))
        print("wrote", args.json)


if __name__ == "__main__":
    main()
