"""The initial Gaussian noise variance of the regression estimators, chosen by measurement.

The estimators standardise the targets, so the initial noise variance is a fraction of the target variance. The
library started from the TGP appendix B.6 value 0.05 (the Salimbeni & Deisenroth protocol, run for 15 000 epochs);
GPflow starts at 1.0 and GPyTorch at softplus(0) = 0.69. This study fits each estimator with its defaults except
`noise` on the standard UCI splits and records, per fit: the training bound per point (standardised targets) after
fixed epoch budgets and at the plateau stop, the time, and the test NLL and RMSE.

    OMP_NUM_THREADS=1 python -m benchmarks.studies.noise_init run --out docs/results/perf/noise-init
    python -m benchmarks.studies.noise_init table docs/results/perf/noise-init/rows.jsonl

Rows are appended to OUT/rows.jsonl; rows already there are skipped (the command resumes).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

NOISES = (0.05, 0.2, 0.5, 1.0)
DATASETS = ("boston", "concrete", "energy", "kin8nm", "power", "wine-red", "yacht")
BUDGETS = (35, 140, None)  # epochs; None: the default cap with the plateau stop


def _estimator(model: str, noise: float, epochs):
    from flowgp.estimators import SVGPRegressor, TGPRegressor

    common = {"noise": noise, "threads": 1, "seed": 0, "verbose": False}
    if epochs is not None:
        common.update(epochs=epochs, early_stop=None)
    if model == "svgp":
        return SVGPRegressor(**common)
    return TGPRegressor(flow="sal+softplus", **common)


def fit_row(dataset: str, split: int, model: str, noise: float, epochs, data_dir=None) -> dict:
    from flowgp.data.tables import uci_split
    from flowgp.reporting.metrics import mean_nll, rmse

    data = uci_split(dataset, split, data_dir)
    est = _estimator(model, noise, epochs)
    began = time.process_time()
    est.fit(data.x_train, data.y_train)
    seconds = time.process_time() - began
    n = len(data.y_train)
    bound = est.elbo(data.x_train, data.y_train) / n + math.log(float(np.std(data.y_train)))
    return {"dataset": dataset, "split": split, "model": model, "noise_init": noise,
            "epochs": "plateau" if epochs is None else epochs, "n_iter": int(getattr(est, "n_iter_", 0) or 0),
            "cpu_seconds": seconds, "bound_per_point": bound,
            "test_nll": mean_nll(est.log_predictive_density(data.x_test, data.y_test)),
            "test_rmse": rmse(data.y_test, est.predict(data.x_test)),
            "noise_fitted": _fitted_noise(est)}


def _fitted_noise(est) -> float | None:
    """The fitted likelihood noise variance in y's units, from the estimator's summary."""
    value = est.summary().to_dict().get("likelihood", {}).get("noise variance")
    return float(value) if isinstance(value, (int, float)) else None


def _key(row) -> tuple:
    return row["dataset"], row["split"], row["model"], row["noise_init"], str(row["epochs"])


def command_run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rows.jsonl"
    done = {_key(json.loads(line)) for line in path.read_text().splitlines()} if path.exists() else set()
    for dataset in args.datasets:
        for split in args.splits:
            for model in args.models:
                for epochs in BUDGETS:
                    for noise in NOISES:
                        key = (dataset, split, model, noise, "plateau" if epochs is None else str(epochs))
                        if key in done:
                            continue
                        row = fit_row(dataset, split, model, noise, epochs, args.data_dir)
                        with path.open("a") as fh:
                            fh.write(json.dumps(row) + "\n")
                        print(json.dumps(row), flush=True)


def command_table(args) -> None:
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines()]
    print("| data set | model | epochs | " + " | ".join(f"noise {v}: bound / NLL / s" for v in NOISES) + " |")
    print("|---|---|---|" + "---|" * len(NOISES))
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["model"], str(r["epochs"])), {}).setdefault(r["noise_init"], []).append(r)
    for (dataset, model, epochs), by_noise in sorted(groups.items()):
        cells = []
        for v in NOISES:
            got = by_noise.get(v, [])
            if not got:
                cells.append("-")
                continue
            mean = lambda k: float(np.mean([g[k] for g in got]))  # noqa: E731
            cells.append(f"{mean('bound_per_point'):.4f} / {mean('test_nll'):.3f} / {mean('cpu_seconds'):.1f}")
        print(f"| {dataset} | {model} | {epochs} | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS))
    p.add_argument("--splits", nargs="+", type=int, default=[0])
    p.add_argument("--models", nargs="+", default=["svgp"], choices=["svgp", "tgp"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="docs/results/perf/noise-init")
    p = sub.add_parser("table")
    p.add_argument("rows")
    args = parser.parse_args(argv)
    command_run(args) if args.command == "run" else command_table(args)


if __name__ == "__main__":
    main()
