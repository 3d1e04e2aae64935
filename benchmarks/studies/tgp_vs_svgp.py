"""Does the TGP's fitted training bound end at or above the bound of the SVGP it contains, and at what cost in fit
time?

Answer (2026-11-25, 1 500 full-batch epochs): with the plain fit (`robust=False`) the TGP ended below the SVGP on
3 of 5 air-quality folds (10 % inducing points); with the robust fit (now the default) on 14 of 14 cases (air
quality folds 0-4, boston, concrete and energy splits 0-2) it ends at or above the SVGP's bound - 0.005 (smallest
margin +0.024 per point), at 1.25-1.74 x the SVGP's fit time on average (max 2.56).

Every row fits one estimator on one split and records its full-data training bound per point (units of y),
train/test RMSE, test NLL per point and the wall seconds of `fit`; the `tgp*` rows also carry the robust fit's
report (the bound of its internal SVGP, of the warm start, after the flow refinement, ...). Rows are JSON lines
appended as they finish; re-running skips the rows already in `--out` (resumable; one job at a time).

Data: air quality (TGP appendix B.5.1: 5 folds of a seeded permutation, `--fractions` of the training points as
inducing points, seeds = CV shuffle and model seed) and UCI splits (`--uci boston,concrete,energy --splits 0-2`,
M = `--uci-inducing`). Variants (`--variants`):

- `svgp`: SVGPRegressor with the same settings (the baseline);
- `tgp-plain`: TGPRegressor(robust=False), the fit before the robust fit existed; `tgp-plain-fixnoise`: the same with the
  paper's fixed-noise schedule (noise held for the first 60 % of the steps, appendix B.5);
- `tgp`: the default TGPRegressor (robust fit);
- ablations, each the default with one ingredient changed: `tgp-nowarm` (no warm start: the flow model alone
  from `flow_init` for all epochs, with natural gradients, plateau stop and keep-best), `tgp-norefine`,
  `tgp-noplateau` (all epochs), `tgp-nokeep`, `tgp-adam` (Adam on q(u) too, no natural gradients), `tgp-lr1` (the flow model's Adam step = lr, not lr/2),
  `tgp-restart-data` (a second start from the data initialisation, best bound kept).

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.studies.tgp_vs_svgp --out docs/results/tgp/robust-fit/airquality.jsonl \\
        --folds 0-4 --epochs 1500 --variants svgp,tgp-plain,tgp
    python -m benchmarks.studies.tgp_vs_svgp --summary docs/results/tgp/robust-fit/airquality.jsonl

`--summary` prints a Markdown table per (dataset, fraction): bound, RMSE, NLL, seconds and the check
"TGP bound >= SVGP bound - 0.005" per split.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

VARIANTS = ("svgp", "svgp-ng", "tgp-plain", "tgp-plain-fixnoise", "tgp", "tgp-nowarm", "tgp-norefine", "tgp-noplateau", "tgp-nokeep", "tgp-adam",
            "tgp-lr1", "tgp-restart-data")
TOLERANCE = 0.005


def _robust(variant: str):
    from flowgp.estimators.regression import RobustFit

    options = {"tgp": {}, "tgp-nowarm": {"warm_start": False, "refine_flow": False},
               "tgp-norefine": {"refine_flow": False}, "tgp-noplateau": {"plateau": None},
               "tgp-nokeep": {"keep_best": False}, "tgp-adam": {"natural_gradient": None},
               "tgp-lr1": {"flow_lr": 1.0},
               "tgp-restart-data": {"restarts": ("data",)}}[variant]
    return RobustFit(**options)


def make(variant: str, flow: str, flow_init: str, m: int, epochs: int, seed: int, batch_size):
    from flowgp import SVGPRegressor, TGPRegressor

    common = dict(num_inducing=m, epochs=epochs, seed=seed, verbose=False, batch_size=batch_size)
    if variant == "svgp":
        return SVGPRegressor(**common)
    if variant == "svgp-ng":  # natural gradients (γ = 1) on q(u): converges where Adam lags at large M
        return SVGPRegressor(natural_gradient=1.0, **common)
    if variant == "tgp-plain":
        return TGPRegressor(flow=flow, flow_init=flow_init, robust=False, **common)
    if variant == "tgp-plain-fixnoise":  # the paper's schedule (appendix B.5): noise held for 60 % of the steps
        return TGPRegressor(flow=flow, flow_init=flow_init, robust=False, fix_noise_fraction=0.6, **common)
    return TGPRegressor(flow=flow, flow_init=flow_init, robust=_robust(variant), **common)


def parse_range(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def jobs(args):
    from flowgp.data.tables import cv_splits, load_air_quality, uci_split

    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    if args.folds:
        x, y = load_air_quality(args.data_dir)
        for seed in parse_range(args.seeds):
            for fold in parse_range(args.folds):
                tr, te = cv_splits(len(y), 5, seed)[fold]
                for fraction in [float(f) for f in args.fractions.split(",")]:
                    m = max(1, int(round(fraction * len(tr))))
                    for variant in variants:
                        key = dict(dataset="airquality", split=fold, seed=seed, fraction=fraction, variant=variant,
                                   epochs=args.epochs, flow=args.flow)
                        yield key, (x[tr], y[tr], x[te], y[te]), m
    for name in [d for d in args.uci.split(",") if d]:
        for split in parse_range(args.splits):
            s = uci_split(name, split, args.data_dir)
            for variant in variants:
                key = dict(dataset=name, split=split, seed=0, fraction=None, variant=variant, epochs=args.epochs,
                           flow=args.flow)
                yield key, (s.x_train, s.y_train, s.x_test, s.y_test), args.uci_inducing


def run_one(key, data, m, args) -> dict:
    xtr, ytr, xte, yte = data
    flow = key["flow"]
    if key["dataset"] != "airquality" and flow.endswith("softplus") and np.any(ytr <= 0):
        flow = "sal"  # UCI targets may be <= 0: the positive flow does not apply
    est = make(key["variant"], flow, args.flow_init, m, key["epochs"], key["seed"], args.batch_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        est.fit(xtr, ytr)
        seconds = time.perf_counter() - start
    n = len(ytr)
    row = dict(key, flow_used=flow, num_inducing=m, n_train=n, fit_seconds=seconds,
               bound=float(est.elbo(xtr, ytr)) / n,
               train_rmse=float(np.sqrt(np.mean((est.predict(xtr) - ytr) ** 2))),
               test_rmse=float(np.sqrt(np.mean((est.predict(xte) - yte) ** 2))),
               test_nll=float(-np.mean(est.log_predictive_density(xte, yte))),
               warned=any("below the SVGP" in str(w.message) for w in caught))
    report = getattr(est, "fit_report_", None)
    if report is not None:
        row["report"] = report
    return row


def summary(paths) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    out = []
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["fraction"], r["epochs"]), []).append(r)
    for (dataset, fraction, epochs), group in groups.items():
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in group)]
        svgp = {(r["split"], r["seed"]): r for r in group if r["variant"] == "svgp"}
        out.append(f"\n### {dataset}" + (f", {fraction:g} inducing" if fraction else "") + f", {epochs} epochs\n")
        out.append("| variant | bound / N (mean) | train RMSE | test RMSE | test NLL | fit s | fit time / SVGP's "
                   "(mean, max) | splits >= SVGP - 0.005 | bound - SVGP per split |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for v in variants:
            rs = sorted((r for r in group if r["variant"] == v), key=lambda r: (r["seed"], r["split"]))
            mean = lambda k: float(np.mean([r[k] for r in rs]))
            diffs = [r["bound"] - svgp[(r["split"], r["seed"])]["bound"] for r in rs if (r["split"], r["seed"]) in svgp]
            ok = sum(d >= -TOLERANCE for d in diffs)
            ratios = [r["fit_seconds"] / svgp[(r["split"], r["seed"])]["fit_seconds"] for r in rs
                      if (r["split"], r["seed"]) in svgp]
            ratio = f"{np.mean(ratios):.2f}, {np.max(ratios):.2f}" if ratios else "-"
            out.append(f"| {v} | {mean('bound'):.4f} | {mean('train_rmse'):.3f} | {mean('test_rmse'):.3f} | "
                       f"{mean('test_nll'):.3f} | {mean('fit_seconds'):.1f} | {ratio} | {ok}/{len(diffs)} | "
                       + " ".join(f"{d:+.3f}" for d in diffs) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="JSONL file (rows appended; existing rows skipped)")
    p.add_argument("--summary", nargs="*", help="print Markdown tables from these JSONL files and exit")
    p.add_argument("--folds", default="", help="air-quality folds, e.g. 0-4 (empty: none)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--fractions", default="0.1")
    p.add_argument("--uci", default="", help="comma-separated UCI names, e.g. boston,concrete,energy")
    p.add_argument("--splits", default="0-2")
    p.add_argument("--uci-inducing", type=int, default=100)
    p.add_argument("--flow", default="sal+softplus")
    p.add_argument("--flow-init", default="identity")
    p.add_argument("--epochs", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--variants", default="svgp,tgp-plain,tgp")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if args.summary is not None:
        print(summary(args.summary))
        return 0
    if not args.out:
        p.error("--out is required unless --summary")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done.add(tuple(r[k] for k in ("dataset", "split", "seed", "fraction", "variant", "epochs", "flow")))
    for key, data, m in jobs(args):
        if tuple(key.values()) in done:
            continue
        row = run_one(key, data, m, args)
        with out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{row['dataset']} split {row['split']} seed {row['seed']} {row['variant']}: bound {row['bound']:.4f} "
              f"test RMSE {row['test_rmse']:.3f} NLL {row['test_nll']:.3f} ({row['fit_seconds']:.1f} s)"
              + (" WARNED" if row["warned"] else ""), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
