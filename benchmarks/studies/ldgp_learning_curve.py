"""How does the reference-preset latent DGP's standardised test log-likelihood grow with iterations, and is the
gap to the supplement's Table 1 the budget?

Answer (2026-11-25 to 2026-11-30): on wine-red the budget explains it: split 0 climbs from -0.898 (REG) at 3 000
iterations to +0.662 at 10 000, above Table 1's 0.568 (DREG +0.792 against 0.611). On power the curve rises about
0.055 nats per decade and bends: REG on split 0 reaches 0.157 at the full 300 016 iterations (Table 1: 0.211).
With the DREG authors' per-slot hidden-layer draw (`--draws per-slot`, an ablation of an objective that is not a
bound) and their K = 50 / batch 64 the fit reproduces their power scores: 0.2535 at their full budget on their
split 8 (theirs 0.2556).

Fits one model of `flowgp bench uci --preset reference` (default ldgp2-dreg on wine-red, the authors' split 0)
for `--iterations` iterations and, at each of `--at` iterations, scores the test set as supplement E.3 does
(`--samples` draws of z ~ p(z) per test point, chunked): one JSON line per milestone in OUT/curve.jsonl
(iterations, test_ll_std = mean log p(y*) + log y_scale, nll in y units, train bound per point
(`train_neg_objective_per_point` instead under `--draws per-slot`, whose objective is not a bound), seconds).
Training checkpoints to STATE/<model>-<dataset>-<split>.ckpt every 100 iterations (`--state-dir`, by default
runs/<name of OUT> under the current directory: the state of a run in progress, kept apart from its results and
deleted once the run is done), so an interrupted run resumes
(milestones already in the JSONL are not scored again); the budget (`--iterations`) must stay the same for a
resume, unless `--extend` is given: then a checkpoint of a shorter run (finished or not) is carried on to the new
budget with its optimiser states, on the trajectory a run given that budget from the start would take (the
schedule depends on the step alone). OUT/curve.png plots the curve (`--reference` draws the paper's value as a
line); `--plot-only` redraws it from the rows so far, e.g. while a long run is still going, and prints the slope
per decade of iterations (least squares in log10(iterations)) over each model's last three milestones
(`--with` adds another folder's rows, `--only-split` keeps one split's).
`--rescore R` trains nothing: it scores the checkpoint's current state (in STATE) R times with R prediction seeds (the
DREG authors score each fit 10 times) and writes a line to OUT/rescore.jsonl (each score, their range and sd, and the
per-point median and lower quantiles of log p(y*) in standardised units) and the per-point values to an .npz.

    PYTHONPATH=src python -m benchmarks.studies.ldgp_learning_curve --out docs/results/ldgp/table1-uci/curve \\
        --model ldgp2-dreg --dataset wine-red --split 0 --iterations 3000 --at 300,1000,2000,3000
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.ldgp_runs import fit_from_state
from flowgp.bench.ldgp_ablations import estimator_with
from flowgp.bench.uci import row_order_of


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _setting(row: dict) -> tuple:
    """A row's (K, batch, row order, encoder skips, seed, training draw); rows written before these were recorded
    are the preset's (5, 512, the file's order, dense skips, seed = split, the joint draw)."""
    return (row.get("num_importance", 5), row.get("batch_size", 512), row_order_of(row),
            row.get("encoder_skips", "dense"), row.get("seed", row["split"]), row.get("draws", "joint"))


def _label(row: dict) -> str:
    """A curve's name: the model, K and the batch where they are not the preset's (5, 512), the row order if not
    the file's, the encoder's skips if not dense, the training draw if not joint, the seed if not the split's."""
    k, b, rows, skips, seed, draws = _setting(row)
    label = row["model"] if (k, b) == (5, 512) else f"{row['model']} K={k} batch={b}"
    label = label if rows == "file" else f"{label} rows={rows}"
    label = label if skips == "dense" else f"{label} encoder={skips}"
    label = label if draws == "joint" else f"{label} draws={draws}"
    return label if seed == row["split"] else f"{label} seed={seed}"


def _curves(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{name: (iterations, standardised test LL) in order} with one curve per run; the name adds the dataset and
    split when the rows hold more than one (a folder of fits on several splits), so no line joins two splits."""
    runs = {(r["dataset"], r["split"]) for r in rows}
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        name = _label(r) if len(runs) == 1 else f"{_label(r)} {r['dataset']} split {r['split']}"
        curves.setdefault(name, []).append((r["iterations"], r["test_ll_std"]))
    return {name: sorted(pts) for name, pts in sorted(curves.items())}


def slope_per_decade(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of the test log-likelihood against log10(iterations) through `points`."""
    x = np.log10([p[0] for p in points])
    y = np.asarray([p[1] for p in points], dtype=float)
    return float(np.polyfit(x, y, 1)[0])


def plot(rows: list[dict], path: Path, reference: float | None = None) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.8))
    ax = fig.add_subplot(1, 1, 1)
    for model, pts in _curves(rows).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=model)
    if reference is not None:
        ax.axhline(reference, color="k", linestyle="--", linewidth=1, label=f"paper (300 000 iterations): {reference}")
    ax.set_xlabel("iterations")
    ax.set_ylabel("test log-likelihood (standardised)")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=7)  # below: never over the curves
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def rescore(est, split, args, setting, out: Path) -> int:
    """Score the state in `est.checkpoint` `args.rescore` times without training (`fit_from_state`), each score
    drawing its z's from another prediction seed."""
    from flowgp.training.checkpoint import safe_load

    source = Path(est.checkpoint)
    if not source.exists():
        raise SystemExit(f"--rescore: no checkpoint {source}; give the run's --out, --model, --split and settings")
    state = safe_load(source)
    fit_from_state(est, state, split)
    log_scale = math.log(est.y_scale_)
    scores, per_point = [], []
    for r in range(args.rescore):
        est.set_params(seed=r)  # the prediction draws only: the fitted state is loaded above
        lpd = est.log_predictive_density(split.x_test, split.y_test) + log_scale
        per_point.append(lpd)
        scores.append(float(lpd.mean()))
        print(f"score {r}: {scores[-1]:+.4f}", flush=True)
    per_point = np.stack(per_point)
    mean_point = per_point.mean(0)
    row = {"model": args.model, "dataset": args.dataset, "split": args.split, "iterations": int(state["step"]),
           **dict(zip(("num_importance", "batch_size", "row_order", "encoder_skips", "seed", "draws"), setting)),
           "samples": args.samples, "scores": scores, "score_range": max(scores) - min(scores),
           "score_sd": float(np.std(scores, ddof=1)) if len(scores) > 1 else None,
           "per_point_median": float(np.median(mean_point)),
           "per_point_quantiles": {q: float(np.quantile(mean_point, float(q))) for q in ("0.01", "0.05", "0.25")},
           "per_point_sd_over_scores": float(per_point.std(0, ddof=1).mean()) if len(scores) > 1 else None}
    with (out / "rescore.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    np.savez(out / f"{source.stem}-step{state['step']}-rescore.npz", per_point=per_point, y_test=split.y_test)
    print(json.dumps(row), flush=True)
    return 0


def main(argv=None) -> int:
    from flowgp.bench.models import make_estimator
    from flowgp.bench.presets import get_preset
    from flowgp.bench.uci import load_split, reference_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--state-dir", default=None,
                        help="folder of the run's training checkpoint (default: runs/<name of OUT> under the current "
                             "directory)")
    parser.add_argument("--model", default="ldgp2-dreg")
    parser.add_argument("--dataset", default="wine-red")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--at", default="300,1000,2000,3000", help="comma-separated iterations to score at")
    parser.add_argument("--samples", type=int, default=10000, help="z samples per test point (E.3: 10000)")
    parser.add_argument("--inducing", type=int, default=128)
    parser.add_argument("--num-importance", type=int, default=None,
                        help="importance samples K (default: the model's, 5; the authors' Table 1 runs: 50)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="minibatch size (default: the reference preset's, 512; the authors' Table 1 runs: 64)")
    parser.add_argument("--encoder-skips", default=None, choices=("dense", "residual"),
                        help="q(z) network's skips (default: the estimator's, dense; the DREG authors': residual)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the fit's seed (inducing points, q(z) network, minibatches, samples; default: the "
                             "split, as the bench); another seed on the same split measures fit-to-fit spread")
    parser.add_argument("--data-dir", default=os.environ.get("FLOWGP_DATA"))
    parser.add_argument("--row-order", default=None,
                        help="'authors' (the permutation flowgp ships, bench.uci.authors_row_order) or a .npy "
                             "permutation: entry i is the row of uci/<dataset>/data.txt that is row i of the "
                             "authors' download, so the split holds their points (bench.uci.reference_split)")
    parser.add_argument("--draws", default="joint", choices=("joint", "per-slot"),
                        help="the hidden layer's draw over the K slots in training: flowgp's joint draw, or the "
                             "DREG authors' per-slot marginals (an ablation: ldgp_k_finetune.per_slot_hidden_sample)")
    parser.add_argument("--reference", type=float, default=None, help="the paper's value, drawn as a line")
    parser.add_argument("--plot-only", action="store_true", help="only redraw OUT/curve.png from the rows so far")
    parser.add_argument("--with", dest="with_rows", action="append", default=[], metavar="CURVE.jsonl",
                        help="with --plot-only: also draw these rows (another folder's curve.jsonl), e.g. another "
                             "K and batch on the same split")
    parser.add_argument("--png", default="curve.png", help="with --plot-only: the figure's name in OUT")
    parser.add_argument("--only-split", type=int, default=None,
                        help="with --plot-only: draw only this split's rows (e.g. one split of a folder of many)")
    parser.add_argument("--rescore", type=int, default=0, metavar="R",
                        help="train nothing: score the checkpoint's current state R times, prediction seeds "
                             "0..R-1 (same --iterations, K, batch, row order and seed as the run that wrote it)")
    parser.add_argument("--extend", action="store_true",
                        help="carry a checkpoint of a shorter run on to --iterations (extend_checkpoint=True)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.plot_only:
        rows = _rows(out / "curve.jsonl") + [r for path in args.with_rows for r in _rows(Path(path))]
        if args.only_split is not None:
            rows = [r for r in rows if r["split"] == args.only_split]
        if not rows:
            parser.error(f"--plot-only: no rows in {out / 'curve.jsonl'}")
        for model, pts in _curves(rows).items():
            print(model, " ".join(f"{i}:{v:.4f}" for i, v in pts))
            if len(pts) >= 3:
                print(f"{model}: {slope_per_decade(pts[-3:]):+.4f} per decade over the last three milestones")
        out.mkdir(parents=True, exist_ok=True)
        plot(rows, out / args.png, args.reference)
        return 0
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "curve.jsonl"
    if args.row_order is None:
        split, rows_tag = load_split(args.dataset, args.split, args.data_dir, protocol="reference"), None
    elif args.row_order == "authors":
        split = load_split(args.dataset, args.split, args.data_dir, protocol="reference", row_order="authors")
        rows_tag = "authors"
    else:
        split = reference_split(args.dataset, args.split, args.data_dir, row_order=np.load(args.row_order))
        rows_tag = Path(args.row_order).stem
    n = len(split.y_train)
    overrides = {} if args.batch_size is None else {"batch_size": args.batch_size}
    preset = get_preset("reference", **overrides)
    per_epoch = math.ceil(n / preset.batch_for(n))
    epochs = math.ceil(args.iterations / per_epoch)
    seed = args.split if args.seed is None else args.seed
    est = make_estimator(args.model, get_preset("reference", epochs=epochs, **overrides), args.inducing, seed, n)
    # a run with another K, batch or row order keeps its own checkpoint and is labelled in its rows
    tag = "".join(f"-{k}{v}" for k, v in (("k", args.num_importance), ("b", args.batch_size), ("rows-", rows_tag),
                                          ("enc-", args.encoder_skips),
                                          ("seed", None if seed == args.split else seed),
                                          ("draws-", None if args.draws == "joint" else args.draws)) if v is not None)
    est.set_params(num_samples_predict=args.samples, verbose=False, extend_checkpoint=args.extend,
                   checkpoint=str(state_dir(args) / f"{args.model}-{args.dataset}-{args.split}{tag}.ckpt"))
    if args.num_importance is not None:
        est.set_params(num_importance=args.num_importance)
    if args.encoder_skips is not None:
        est.set_params(encoder_skips=args.encoder_skips)
    if args.draws == "per-slot":
        est = estimator_with(est, per_slot=True)
    setting = (est.num_importance, preset.batch_for(n), rows_tag or "file", est.encoder_skips, seed, args.draws)
    if args.rescore:
        return rescore(est, split, args, setting, out)
    done = {r["iterations"] for r in _rows(rows_path) if r["model"] == args.model and r["dataset"] == args.dataset
            and r["split"] == args.split and _setting(r) == setting}
    milestones = sorted({int(v) for v in args.at.split(",")} | {epochs * per_epoch})
    start = time.perf_counter()

    def score(step, loss, model):
        iterations = step + 1
        if iterations not in milestones or iterations in done:
            return False
        t0 = time.perf_counter()
        lpd = est.log_predictive_density(split.x_test, split.y_test)
        row = {"model": args.model, "dataset": args.dataset, "split": args.split, "iterations": iterations,
               "test_ll_std": float(lpd.mean() + math.log(est.y_scale_)), "nll": float(-lpd.mean()),
               "y_scale": float(est.y_scale_),
               # the per-slot ablation trains an objective that is not a bound: its loss is never called one
               ("train_neg_bound_per_point" if args.draws == "joint" else "train_neg_objective_per_point"):
                   float(loss) / n,
               "samples": args.samples, "num_inducing": args.inducing,
               **dict(zip(("num_importance", "batch_size", "row_order", "encoder_skips", "seed", "draws"), setting)),
               "score_seconds": time.perf_counter() - t0, "elapsed_seconds": time.perf_counter() - start}
        with rows_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        done.add(iterations)
        print(json.dumps(row), flush=True)
        return False

    est.fit(split.x_train, split.y_train, callback=score)
    plot(_rows(rows_path), out / "curve.png", args.reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
