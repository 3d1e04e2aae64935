"""CNF-DGP Table I: why the training ELBO of our deep GPs falls with depth on boston, where the paper's rises.

One fit per (variant, depth, split): the bench's `dgpL` / `cnf-dgpL` estimator (`make_estimator`, preset and seed as
`flowgp bench uci`, so the quick default reproduces the bench row) with one change, scored by the bench's
`fit_and_score`. Each row adds what the question needs beside the bench's columns:

- `history`: the training objective every `--every` steps, the single-sample estimate of the ELBO per point on
  standardised targets (the negated loss of `flowgp.training.loop.train`), i.e. the learning curve;
- `kl_per_layer`: KL[q(v_ℓ) || N(0, I)] of every layer (nats; invariant to the targets' scale), and
  `expected_loglik_std` = ELBO_std + Σ KL, the data term on standardised targets (ELBO_std = train_elbo + N log s);
- `noise_std`: the fitted likelihood variance on standardised targets.

Run from the repository root (resumable: a (variant, layers, split, epochs) already in --out is skipped):

    OMP_NUM_THREADS=1 python -m benchmarks.studies.cnf_dgp_depth_trend --variant default --layers 2,5 --splits 0 \
        --epochs 1500 --out docs/results/cnf-dgp/table1-depth-trend/ablation.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path

import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.report import standardised_elbo
from flowgp.bench.runner import fit_and_score, limit_threads, parse_int_list
from flowgp.bench.uci import load_split

# variant -> estimator attributes changed from the bench's quick dgpL (num_inducing is a bench argument)
VARIANTS = {
    "default": {},
    "m128": {},                          # IPVI's code: 128 inducing points (set through --inducing)
    "width30": {"hidden_width": 30},     # wider hidden layers than D = 13
}
# variant -> (initial q(v) = N(0, var I) of the hidden layers, of the last layer, hidden layers' initial kernel
# variance or None for the bench's); the estimators start every layer's q(v) at 1e-5 and every kernel variance at 1
INITS = {
    "qvar-1": (1.0, 1.0, None),          # every q(v) at the prior: KL 0 at the start, hidden layers start noisy
    "salimbeni-init": (1e-10, 1.0, None),  # the DSVI code's run script: hidden q_sqrt x 1e-5, last layer at the prior
    # hidden layers start at their identity mean with KL 0: q(v) at the prior and a small kernel variance, so an
    # L-layer model starts where the shallower one does (the extra layers cost nothing until they are used)
    "identity-start": (1.0, 1e-5, 1e-2),
}
VARIANTS.update({name: {} for name in INITS})


@contextlib.contextmanager
def initial_q(variant):
    """Build the deep GPs of this block with the variant's initial q(v) (the estimators have no such option)."""
    if variant not in INITS:
        yield
        return
    import flowgp.models.deep_gp as deep_gp

    hidden, last, hidden_kernel_variance = INITS[variant]
    original = deep_gp.build_deep_gp

    def build(*args, **kwargs):
        model = original(*args, **kwargs)
        with torch.no_grad():
            for i, layer in enumerate(model.layers):
                q_sqrt = layer.gp.q_sqrt
                eye = torch.eye(q_sqrt.shape[-1], dtype=q_sqrt.dtype, device=q_sqrt.device)
                is_last = i == len(model.layers) - 1
                q_sqrt.copy_(math.sqrt(last if is_last else hidden) * eye.expand_as(q_sqrt))
                if hidden_kernel_variance is not None and not is_last:
                    layer.gp.kernel.kernels[0].variance = hidden_kernel_variance  # the scaled RBF of RBF + White
        return model

    deep_gp.build_deep_gp = build
    try:
        yield
    finally:
        deep_gp.build_deep_gp = original


def decomposition(est) -> dict:
    """KL per layer (nats) and the fitted noise variance, standardised targets."""
    model = est.model_
    with torch.no_grad():
        kls = [float(layer.kl_divergence().sum()) for layer in model.layers]
        noise = [float(v) for v in model.likelihood.noise.reshape(-1)]
    return {"kl_per_layer": kls, "noise_std": noise}


def fit_one(dataset, split_index, layers, variant, epochs, model="dgp", inducing=100, data_dir=None, every=50):
    split = load_split(dataset, split_index, data_dir, 0)
    n = len(split.y_train)
    preset = get_preset("quick", epochs=epochs)
    est = make_estimator(f"{model}{layers}", preset, min(inducing, n), split_index, n, task="regression")
    est.set_params(**VARIANTS[variant], verbose=False)
    with initial_q(variant):
        row = fit_and_score(est, split, "regression")
    row.update(dataset=dataset, split=split_index, layers=layers, model=f"{model}{layers}", variant=variant,
               epochs=int(est.epochs), num_inducing=min(inducing, n), n_train=n)
    elbo_std = standardised_elbo(row)
    row["elbo_std"] = elbo_std
    row.update(decomposition(est))
    row["expected_loglik_std"] = elbo_std + sum(row["kl_per_layer"])
    hist = [-float(h) for h in est.history_]
    row["history_every"] = every
    row["history"] = [sum(hist[i:i + every]) / len(hist[i:i + every]) for i in range(0, len(hist), every)]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="boston")
    p.add_argument("--splits", default="0")
    p.add_argument("--layers", default="2,5")
    p.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    p.add_argument("--model", default="dgp", choices=["dgp", "cnf-dgp", "cnf-paper-dgp"])
    p.add_argument("--epochs", type=int, default=1500)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    limit_threads()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["variant"], r["model"], r["split"], r["epochs"], r["num_inducing"]))
    for layers in parse_int_list(args.layers):
        for s in parse_int_list(args.splits):
            key = (args.variant, f"{args.model}{layers}", s, args.epochs, args.inducing)
            if key in done:
                continue
            row = fit_one(args.dataset, s, layers, args.variant, args.epochs, args.model, args.inducing,
                          args.data_dir)
            with out.open("a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            print(f"{row['variant']} {row['model']} split {s} epochs {row['epochs']}: ELBO_std {row['elbo_std']:.1f} "
                  f"KL {[round(k, 1) for k in row['kl_per_layer']]} noise {row['noise_std']}", flush=True)


if __name__ == "__main__":
    main()
