"""Does a fitted latent deep GP's reported bound stay below the evidence?

Answer (2026-11-25, wine-red reference split 0, 300 iterations): yes. L_K per training point rises with K,
-2.119 / -1.965 / -1.946 (s.e. 0.005-0.012) at K = 5 / 20 / 50, as a valid importance-weighted bound must, so the
K = 5 bound training reports stays below the joint-draw estimates of the evidence.

A LatentDeepGPRegressor (2 layers, DREG, K = 5 in training) is fitted on a UCI set's reference split (default
wine-red split 0, `flowgp.bench.uci.reference_split`). On its training rows the importance-weighted bound L_K
(supplement eq. A.9, the hidden layer drawn jointly over the K samples) is then evaluated for K = 5, the bound
training reports, and for larger K. For a valid bound L_K increases with K towards log p(y) (Burda et al.), so
the larger-K values are the joint-draw estimate of the evidence the reported bound must not exceed. With
per-slot draws of the hidden layer (`flowgp.bench.ldgp_ablations.per_slot_hidden_sample`) the K = 5 objective is
not a bound of this kind.
Printed: mean and standard error over `--repeats` evaluations (fresh draws) of L_K / N per K.

    OMP_NUM_THREADS=1 python -m benchmarks.studies.ldgp_fitted_bound --epochs 30 --k 5,20,50
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from flowgp import LatentDeepGPRegressor
from flowgp.bench.uci import reference_split


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="wine-red")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--k", default="5,20,50")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gradient", default="dreg")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    split = reference_split(a.dataset, a.split)
    est = LatentDeepGPRegressor(layers=2, num_inducing=128, num_importance=5, gradient=a.gradient, epochs=a.epochs,
                                batch_size=a.batch_size, verbose=False, kmeans_restarts=2).fit(split.x_train,
                                                                                               split.y_train)
    model = est.model_
    xt = est.scaled_inputs(split.x_train)
    yt = est.scaled_targets(split.y_train, xt.shape[0])
    n = xt.shape[0]
    rows = []
    with torch.no_grad():
        for k in (int(v) for v in a.k.split(",")):
            values = []
            for r in range(a.repeats):
                g = torch.Generator().manual_seed(1000 + r)
                # in chunks of rows: the K x K joint draws per point and output
                total = sum(model.iw_terms(xt[i:i + 256], yt[i:i + 256], k, generator=g).mean(0).sum().item()
                            for i in range(0, n, 256))
                values.append((total - model.kl_divergence().item()) / n)
            mean, se = float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values)))
            rows.append({"K": k, "bound_per_point": mean, "se": se, "values": values})
            print(f"{a.dataset} split {a.split} ({a.epochs} epochs, {a.gradient}): L_{k}/N = {mean:.5f} ± {se:.5f}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"dataset": a.dataset, "split": a.split, "epochs": a.epochs, "gradient": a.gradient,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
