"""How far does the DREG authors' per-slot objective sit above the valid bound on a fitted model, per training
point?

Answer (2026-11-30, power, the authors' splits 5 and 8, 1 000 training rows): on fits of the valid bound the two
terms differ by 0.005-0.010 nats per point; on fits trained with the per-slot objective at K = 50 / batch 64 by
0.43-0.60 (0.598 ± 0.080 on split 8 at 201 943 iterations, the fit that scores 0.2515 on the test set). By the
valid bound that fit is 0.53 nats per point worse than the preset's; the per-slot term approaches the log
predictive density of the training rows (0.223 against 0.255): a predictive-log-likelihood objective, not a bound.

The DREG authors' code draws the hidden layer per slot (`flowgp.bench.ldgp_ablations.per_slot_hidden_sample`): each of the K
values f(x_n, z_{n,k}) from its own marginal. With the joint draw, the per-point term log (1/K) Σ_k w_k is, in
expectation, E_f[log (1/K) Σ_k w_k(f)]: the log inside the expectation over the hidden function, a lower bound
on log p(y_n | x_n) (eq. C.12). Drawn per slot, as K grows the K slots average over function draws as well, and
the term tends to log E_f E_z[exp E_g log p(y_n | g)], g the last layer at f(x_n, z): close to the log predictive
density of y_n under the fitted model (the quantity the test set scores, there with z from the prior). The
per-slot objective is in this sense a predictive-log-likelihood objective for the hidden layer, not a bound.

This script loads a checkpoint's fitted state (nothing trained: `ldgp_learning_curve.fit_from_state`) and, on a
fixed random subsample of the training rows, estimates per point and in standardised units:
- the joint-draw term E[log (1/K) Σ_k w_k] (what flowgp trains) and the per-slot term (what the authors train)
  for every K of `--num-importance`, each averaged over `--repeats` draws;
- the log predictive density of the same rows with `--samples` draws of z from the prior (as the test scores).
The KL terms are the same for both objectives and left out of the terms; the row gives Σ KL / N beside them, so
joint_per_point - kl_per_point is the valid bound per training point (in expectation, on the subsample). One JSON
row per checkpoint and K goes to OUT/objective_gap.jsonl (appended).

    FLOWGP_DATA=../shared/data python -m benchmarks.studies.ldgp_objective_gap \\
        --checkpoint docs/results/ldgp/table1-uci/power-per-slot/ldgp2-reg-power-8-k50-b64-rows-authors-draws-per-slot.ckpt \\
        --split 8 --row-order authors --fit-num-importance 50 --batch-size 64 --iterations 300000 \\
        --out docs/results/ldgp/table1-uci/objective-gap
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.ldgp_runs import checkpoint_parser, fit_from_state, reference_estimator, split_and_checkpoint
from flowgp.bench.ldgp_ablations import per_point_terms


def main(argv=None) -> int:
    p = checkpoint_parser(__doc__.splitlines()[0], "an ldgp_learning_curve.py checkpoint of ldgp2-reg")
    p.add_argument("--out", required=True)
    p.add_argument("--fit-num-importance", type=int, required=True, help="the K the checkpoint was trained with")
    p.add_argument("--batch-size", type=int, required=True, help="the batch the checkpoint was trained with")
    p.add_argument("--iterations", type=int, required=True, help="the --iterations of the run that wrote it")
    p.add_argument("--num-importance", default="5,50", help="comma-separated K to evaluate both terms at")
    p.add_argument("--rows", type=int, default=1000, help="training rows in the subsample (seeded, fixed)")
    p.add_argument("--repeats", type=int, default=8, help="draws averaged per point for each term")
    p.add_argument("--samples", type=int, default=10000, help="z samples per point of the log predictive density")
    args = p.parse_args(argv)
    split, n, saved = split_and_checkpoint(args)
    est, _, _ = reference_estimator(n, args.split, args.batch_size, args.iterations,
                                    num_importance=args.fit_num_importance, num_samples_predict=args.samples,
                                    verbose=False)
    t0 = time.perf_counter()
    fit_from_state(est, saved, split)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(args.rows, n), replace=False))
    x_sub, y_sub = split.x_train[rows], split.y_train[rows]
    x = est.scaled_inputs(x_sub)
    y = est.scaled_targets(y_sub, x.shape[0])
    lpd = float(np.mean(est.log_predictive_density(x_sub, y_sub))) + math.log(est.y_scale_)  # standardised
    with torch.no_grad():
        kl = float(est.model_.kl_divergence())  # the inducing outputs' KL, the same in both objectives
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in (int(v) for v in args.num_importance.split(",")):
        g = torch.Generator().manual_seed(k)
        joint = per_point_terms(est.model_, x, y, k, False, args.repeats, g)
        slot = per_point_terms(est.model_, x, y, k, True, args.repeats, g)
        gap = slot - joint
        row = {"checkpoint": args.checkpoint, "step": int(saved["step"]), "dataset": args.dataset,
               "split": args.split, "row_order": args.row_order, "fit_num_importance": args.fit_num_importance,
               "fit_batch_size": args.batch_size, "num_importance": k, "rows": len(rows), "repeats": args.repeats,
               "samples": args.samples, "joint_per_point": float(joint.mean()),
               "per_slot_per_point": float(slot.mean()),
               "gap_mean": float(gap.mean()), "gap_se": float(gap.std() / math.sqrt(len(gap))),
               "gap_median": float(gap.median()), "log_predictive_per_point": lpd,
               "n_train": n, "kl_per_point": kl / n,
               "elapsed_seconds": time.perf_counter() - t0}
        with (out / "objective_gap.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
