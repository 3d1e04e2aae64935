"""Why does the CNF-DGP paper's flow posterior trail DSVI at the quick budget?

Answer (2026-11-24, 2 layers, split 0, one fit per variant): mainly gradient noise. One sample of U per step,
shared by the batch, reaches a training ELBO of +0.640 per point on energy against DSVI's +1.289; 5 and 20
samples per step reach +0.989 and +1.051, free base parameters instead of the eq. 9 network +0.931 (+1.146 with
5 samples). On boston the network does not matter (-0.599 to -0.470 against DSVI's -0.397). At ten times the
budget DSVI stays ahead too. The paper's design is `posterior="cnf-paper"` since; `posterior="cnf"` (the `gcnf*`
variants here) builds on DSVI's Gaussian base instead.

Run from the repository root (one fit per variant and split, resumable, rows appended to --out):

    OMP_NUM_THREADS=1 python -m benchmarks.studies.cnf_dgp_ablation --dataset energy --splits 0 --layers 2

Every variant is the bench's `cnf-dgpL` quick fit (1 500 Adam steps, lr 0.01, M = 100, batch 512, same seed and
split) with one change, set against DSVI (`dgpL`, closed-form q(U) per layer) on the same split:
- `cnf-s1`: the bench's CNF-DGP, one sample of U per step (the CNF paper's eq. 6 estimator);
- `cnf-s5`, `cnf-s20`: 5 or 20 samples of U per step (less gradient noise; same model);
- `cnf-free`, `cnf-free-s5`: the base's mean and scale are free [M, Σd] parameters instead of the two-layer
  network φ_ℓ(Z_ℓ) of eq. 9 (an ablation of the parameterisation, the flow steps unchanged).
These six are the CNF paper's design, `cnf-paper-dgpL` today. The Gaussian-base flow (`cnf-dgpL`):
- `gcnf`: DSVI's full-covariance Gaussian base + two convolutional/sinh-arcsinh steps, one U per data point;
- `gcnf-coupled`, `gcnf-coupled-warm80`: the same with draws="coupled" (DSVI's chain with locally
  reparameterised draws of U), from the start or after 80 % of the steps as DSVI;
- `gcnf-dsvi-base`: coupled draws, with everything DSVI also has (base q(v), kernels, Z, likelihood) following
  DSVI's bound on the same draws and only the flow steps following the flow's change of it (base_gradient="dsvi"),
  then the flow scaled toward the identity where that raises the training bound (flow_selection, every cnf
  variant since the strength selection exists; `-raw` without it);
- `gcnf-channel`: its element-wise steps share (a, b) per channel (the paper's sharing) instead of per entry;
- `gcnf-warm50`, `gcnf-warm80`: the first 50 % / 80 % of the steps train the DSVI model, the flow starts there.
The training ELBO (standardised targets, per point) says how far each variant got with the same budget; the
test NLL follows it.
"""
from __future__ import annotations

import argparse

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.report import standardised_elbo
from flowgp.bench.results import ResultStore
from flowgp.bench.runner import fit_and_score, limit_threads, parse_int_list
from flowgp.bench.uci import load_split

# variant -> (posterior family, estimator attributes changed from the bench's cnf-dgpL / dgpL)
# (the paper's variants are `cnf-paper-dgpL`; the rows of docs/results/cnf-dgp/paper-design-ablation/ were made with them)
VARIANTS = {
    "dsvi": ("dgp", {}),
    "cnf-s1": ("cnf-paper-dgp", {}),
    "cnf-s5": ("cnf-paper-dgp", {"num_samples_train": 5}),
    "cnf-s20": ("cnf-paper-dgp", {"num_samples_train": 20}),
    "cnf-free": ("cnf-paper-dgp", {"flow_base": "free"}),
    "cnf-free-s5": ("cnf-paper-dgp", {"flow_base": "free", "num_samples_train": 5}),
    # the Gaussian-base flow (DSVI's q(U) + convolutional steps, one draw of U per point)
    "gcnf": ("cnf-dgp", {}),
    "gcnf-channel": ("cnf-dgp", {"flow_elementwise": "channel"}),
    "gcnf-warm50": ("cnf-dgp", {"dsvi_warmup": 0.5}),
    "gcnf-warm80": ("cnf-dgp", {"dsvi_warmup": 0.8}),
    # the flow's bound without the DSVI coupling (one pathwise draw of U per point): the default before it
    "gcnf-coupled": ("cnf-dgp", {"draws": "coupled"}),
    "gcnf-coupled-warm80": ("cnf-dgp", {"draws": "coupled", "dsvi_warmup": 0.8}),
    # coupled draws, the parameters DSVI also has trained on DSVI's bound, the flow on its change of it
    "gcnf-dsvi-base": ("cnf-dgp", {"draws": "coupled", "base_gradient": "dsvi"}),
    "gcnf-dsvi-base-raw": ("cnf-dgp", {"draws": "coupled", "base_gradient": "dsvi", "flow_selection": False}),
}


def fit_variant(dataset, split_index, layers, variant, data_dir=None, preset="quick"):
    family, changes = VARIANTS[variant]
    split = load_split(dataset, split_index, data_dir, 0)
    n = len(split.y_train)
    est = make_estimator(f"{family}{layers}", get_preset(preset), min(100, n), split_index, n, task="regression")
    est.set_params(**changes, verbose=False)
    row = fit_and_score(est, split, "regression")
    row["elbo_per_point_std"] = standardised_elbo({**row, "n_train": n}) / n
    return {"dataset": dataset, "split": split_index, "layers": layers, "variant": variant, "preset": preset, **row}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="energy")
    p.add_argument("--splits", default="0")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="runs/cnf-dgp-ablation/ablation.jsonl")
    a = p.parse_args()
    limit_threads()
    # one line per finished fit (the bench's store: torn-line repair, fsync): an interrupted run resumes here
    store = ResultStore(a.out, ("dataset", "split", "layers", "variant"))
    for split_index in parse_int_list(a.splits, "split"):
        for variant in a.variants.split(","):
            if variant not in VARIANTS:
                raise SystemExit(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
            if store.is_done({"dataset": a.dataset, "split": split_index, "layers": a.layers, "variant": variant}):
                continue
            row = fit_variant(a.dataset, split_index, a.layers, variant, a.data_dir)
            store.append(row)
            print(f"{a.dataset} split {split_index} L={a.layers} {variant:12s} ELBO/n {row['elbo_per_point_std']:+.3f} "
                  f"NLL {row['nll']:.3f} RMSE {row['rmse']:.3f} ({row['train_seconds']:.0f} s)", flush=True)
    print("\n| dataset | L | variant | splits | training ELBO / point (std.) | test NLL | test RMSE |")
    print("|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        rs = [r for r in store.rows
              if r["dataset"] == a.dataset and r["layers"] == a.layers and r["variant"] == variant]
        if rs:
            mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
            print(f"| {a.dataset} | {a.layers} | {variant} | {len(rs)} | {mean('elbo_per_point_std'):+.3f} | "
                  f"{mean('nll'):.3f} | {mean('rmse'):.3f} |")


if __name__ == "__main__":
    main()
