"""Ablation for the five-inducing-point claim where it fails (energy, yacht): the input-dependent flow's network
size, one factor at a time, with everything else the bench's quick protocol (`flowgp bench uci --preset quick`).

The bench's PE-TGP / BA-TGP use one hidden layer of 50 ReLU units (appendix B); this study refits them at M = 5 with
(50,), (200,) and (50, 50) hidden units, next to the SVGP at M = 5 and M = 100 refitted by the same code, on the
standard splits, and writes one JSON row per fit (test NLL, RMSE, training bound):

    OMP_NUM_THREADS=1 python -m benchmarks.studies.tgp_network_size run \\
        --out docs/results/tgp/inducing-sweep-uci/network-size
    python -m benchmarks.studies.tgp_network_size table docs/results/tgp/inducing-sweep-uci/network-size/rows.jsonl

Rows already in the file are skipped (the command resumes).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HIDDEN = ((50,), (200,), (50, 50))


def fit_row(dataset: str, split: int, model: str, m: int, hidden, data_dir=None) -> dict:
    from flowgp.bench.models import make_estimator
    from flowgp.bench.presets import get_preset
    from flowgp.bench.runner import fit_and_score
    from flowgp.bench.uci import load_split

    preset = get_preset("quick")
    data = load_split(dataset, split, data_dir, seed=0)
    est = make_estimator(model, preset, m, split, len(data.y_train), task="regression", threads=1)
    if hidden is not None:
        est.set_params(hidden=tuple(hidden))
    scores = fit_and_score(est, data, "regression")
    return {"dataset": dataset, "split": split, "model": model, "num_inducing": m,
            "hidden": list(hidden) if hidden is not None else None, **scores}


def _jobs(datasets, splits):
    for dataset in datasets:
        for split in splits:
            yield dataset, split, "svgp", 100, None
            yield dataset, split, "svgp", 5, None
            for model in ("pe-tgp", "ba-tgp"):
                for hidden in HIDDEN:
                    yield dataset, split, model, 5, hidden


def command_run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rows.jsonl"
    key = lambda r: (r["dataset"], r["split"], r["model"], r["num_inducing"], str(r["hidden"]))  # noqa: E731
    done = {key(json.loads(x)) for x in path.read_text().splitlines()} if path.exists() else set()
    for dataset, split, model, m, hidden in _jobs(args.datasets, args.splits):
        if (dataset, split, model, m, str(list(hidden) if hidden else None)) in done:
            continue
        row = fit_row(dataset, split, model, m, hidden, args.data_dir)
        with path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{dataset} {split} {model} M={m} hidden={hidden}: NLL {row['nll']:.3f}", flush=True)


def command_table(args) -> None:
    rows = [json.loads(x) for x in Path(args.rows).read_text().splitlines()]
    groups = {}
    for r in rows:
        label = f"{r['model']} M={r['num_inducing']}" + (f" hidden {tuple(r['hidden'])}" if r["hidden"] else "")
        groups.setdefault((r["dataset"], label), []).append(r["nll"])
    print("| data set | model | test NLL, mean ± s.e. (splits) |\n|---|---|---|")
    for (dataset, label), values in sorted(groups.items()):
        se = np.std(values, ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
        print(f"| {dataset} | {label} | {np.mean(values):.3f} ± {se:.3f} ({len(values)}) |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("--datasets", nargs="+", default=["energy", "yacht"])
    p.add_argument("--splits", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="docs/results/tgp/inducing-sweep-uci/network-size")
    p = sub.add_parser("table")
    p.add_argument("rows")
    args = parser.parse_args(argv)
    command_run(args) if args.command == "run" else command_table(args)


if __name__ == "__main__":
    main()
