"""How far does a reference-preset latent DGP get on power when a GPU buys it more iterations, and what does the
supplement's budget cost there? (The supplement trains 300 000 iterations; a CPU fit here affords 10 000.)

Answer (2026-11-27, one H200 shared by seven fits): REG over power splits 0-4 at 4 811-10 013 iterations scored
0.131 on average (0.099-0.170; Table 1: 0.211), DREG over splits 0-2 at 3 400-4 114 iterations 0.105 (0.208).
Alone on the GPU an iteration costs 27.2 ms (REG) and 52.8 ms (DREG): 300 000 iterations are 2.3 h and 4.4 h per
split. One fit: the reference preset on one split, sized to a wall-clock budget.

    FLOWGP_DATA=../shared/data python -m benchmarks.studies.ldgp_gpu_fit --device cuda --dataset power --split 0 \
        --model ldgp2-reg --seconds 240 --json OUT/ldgp_power_reg.json

The reference preset of `flowgp bench uci --preset reference` (M = 128, batch 512, K = 5, natural gradients for
the last layer, learning rates annealed by 0.98 per 1 000 iterations, 10 000 samples of z per test point), the
authors' split (`reference_split`, of the rows in the authors' order as the bench's reference presets since
2026-11-29; `--row-order file` for the file's order of the runs before) and the bench's seed rule (seed = split).
A short probe fit times an epoch on this device; the real fit then gets as many epochs as `--seconds` allows
(at most `--max-epochs`; or `--epochs`), starting again from the initialisation. The annealing follows the
iteration count, so a longer budget is the same schedule run further, as in the supplement. `--checkpoint FILE`
keeps the training state (and resumes from it), for `benchmarks/studies/ldgp_anneal_tail.py`. Prints and writes:
iterations, seconds per iteration, and the standardised test log-likelihood (-nll + log y_scale, the
supplement's Table 1 units), RMSE, 95 % coverage, and the same log-likelihood by the authors' public script's
KDE (`standardised_test_ll_kde`).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.runner import evaluate_regression
from flowgp.bench.uci import load_split, reference_row_order


def build(model, epochs, split, device, n):
    est = make_estimator(model, get_preset("reference", epochs=epochs), 128, split, n)
    est.device = device
    est.verbose = False
    return est


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="power")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--model", default="ldgp2-reg")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seconds", type=float, default=240.0, help="wall-clock budget of the real fit")
    p.add_argument("--probe-epochs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=None, help="epochs of the real fit (default: from --seconds)")
    p.add_argument("--max-epochs", type=int, default=None,
                   help="at most this many epochs when they come from --seconds (589 = the CPU rows' 10 013 "
                        "iterations on power)")
    p.add_argument("--row-order", choices=("file", "authors"), default=None,
                   help="rows of the data file in its own order or the authors' (default: the bench's reference "
                        "protocol's, authors' where flowgp ships their order: power)")
    p.add_argument("--json", default=None)
    p.add_argument("--checkpoint", default=None,
                   help="keep the real fit's training state in this file (resumes from it when it exists; "
                        "`ldgp_anneal_tail.py --checkpoint` continues a finished fit); --epochs then required")
    p.add_argument("--no-score", action="store_true", help="train only (no 10 000-sample scoring)")
    p.add_argument("--save", default=None,
                   help="save the fitted estimator there (flowgp.load reads it) for later scoring ablations")
    args = p.parse_args(argv)
    if args.checkpoint and args.epochs is None:
        p.error("--checkpoint needs --epochs (a probe-sized fit would not resume to the same schedule)")

    row_order = args.row_order or reference_row_order(args.dataset)
    split = load_split(args.dataset, args.split, protocol="reference", row_order=row_order)
    n = len(split.y_train)
    est0 = build(args.model, 1, args.split, args.device, n)
    per_epoch = math.ceil(n / est0.batch_size)
    if args.epochs is None:
        start = time.perf_counter()
        build(args.model, args.probe_epochs, args.split, args.device, n).fit(split.x_train, split.y_train)
        probe = (time.perf_counter() - start) / args.probe_epochs  # set-up included: errs on the short side
        epochs = max(1, int(args.seconds / probe))
        if args.max_epochs is not None:
            epochs = min(epochs, args.max_epochs)
        print(f"probe: {probe:.3f} s per epoch ({per_epoch} iterations) on {args.device}; fitting {epochs} epochs",
              flush=True)
    else:
        epochs = args.epochs
    est = build(args.model, epochs, args.split, args.device, n)
    est.checkpoint = args.checkpoint
    start = time.perf_counter()
    est.fit(split.x_train, split.y_train)
    train_seconds = time.perf_counter() - start
    if args.save:
        est.save(args.save)
    if args.no_score:
        print(f"trained {epochs * per_epoch} iterations in {train_seconds:.1f} s (this process)", flush=True)
        return
    start = time.perf_counter()
    scores = evaluate_regression(est, split.x_test, split.y_test)
    y_scale = float(np.std(split.y_train))
    row = {"dataset": args.dataset, "split": args.split, "row_order": row_order, "model": args.model,
           "device": args.device,
           "epochs": epochs, "iterations": epochs * per_epoch, "train_seconds": round(train_seconds, 1),
           "ms_per_iteration": round(1e3 * train_seconds / (epochs * per_epoch), 2),
           "predict_seconds": round(time.perf_counter() - start, 1), **scores, "y_scale": y_scale,
           "standardised_test_ll": -scores["nll"] + math.log(y_scale)}
    if "nll_kde" in scores:  # the authors' public script's KDE estimate of the same (flowgp.gp.prediction)
        row["standardised_test_ll_kde"] = -scores["nll_kde"] + math.log(y_scale)
    print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
