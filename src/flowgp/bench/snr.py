"""`flowgp bench snr`: signal-to-noise ratio of the q(z) gradient estimators vs K (DGP-IWVI/DREG supplement Fig. 3).

For every depth: fit a latent-variable deep GP on the demo data set (supplement E.25-E.28) with the
importance-weighted bound (`--train-iterations` Adam steps, K = `--train-importance`, gradient
`--train-gradient`; the fitted model is saved in OUT and reused on a rerun), then for every K and estimator
measure `flowgp.models.latent.diagnostics.gradient_snr` (E.3: `--repeats` gradient draws at `--points` random training
points, |mean|/std per q(z) parameter, averaged over parameters then points). Rows (dataset, layers,
num_importance, gradient, snr, ...) are appended to OUT/snr.jsonl (resumable: finished rows are skipped) and
OUT/snr.png plots SNR vs K on log axes, one line per estimator and depth.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from .results import ResultStore, read_rows

NAME = "snr"
HELP = "SNR of the REG/DREG q(z) gradient estimators vs the number of importance samples K (supplement Fig. 3)"

_DATASETS = ("demo",)
_KEYS = ("dataset", "layers", "num_importance", "gradient", "repeats", "points", "seed")


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be a comma-separated list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--{name} needs positive integers, got {text!r}")
    return values


def add_arguments(parser) -> None:
    parser.add_argument("--dataset", default="demo", help=f"data set: one of {', '.join(_DATASETS)}")
    parser.add_argument("--layers", default="1,2,3,4", help="comma-separated depths")
    parser.add_argument("--num-importance", default="1,2,5,10,20,50", help="comma-separated K values")
    parser.add_argument("--gradient", default="reg,dreg", help="comma-separated estimators (reg, dreg; ablations dreg-eps: the joint draw's ε held fixed, dreg-d23: D.23 taken literally)")
    parser.add_argument("--out", required=True, help="output folder (snr.jsonl, snr.png, fitted models)")
    parser.add_argument("--repeats", type=int, default=1000, help="gradient draws Q per point (paper: 1000)")
    parser.add_argument("--points", type=int, default=10, help="random training points (paper: 10)")
    parser.add_argument("--num-data", type=int, default=2000, help="size of the demo data set (paper: 2000)")
    parser.add_argument("--num-inducing", type=int, default=128, help="inducing points per layer (paper: 128)")
    parser.add_argument("--train-iterations", type=int, default=5000, help="Adam steps to fit each depth")
    parser.add_argument("--train-importance", type=int, default=10, help="K used while fitting")
    parser.add_argument("--train-gradient", default="dreg", help="estimator used while fitting")
    parser.add_argument("--batch-size", type=int, default=256, help="minibatch size while fitting")
    parser.add_argument("--lr", type=float, default=0.005, help="Adam step (paper: 0.005)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")


def _fit_or_load(depth: int, args, x, y, out: Path):
    from ..estimators.latent import LatentDeepGPRegressor

    path = out / f"ldgp{depth}-{args.train_gradient}-k{args.train_importance}-seed{args.seed}.pt"
    if path.exists():
        return LatentDeepGPRegressor.load(path), 0.0
    n = x.shape[0]
    epochs = max(1, int(round(args.train_iterations * args.batch_size / n)))
    est = LatentDeepGPRegressor(layers=depth, num_importance=args.train_importance, gradient=args.train_gradient,
                                num_inducing=args.num_inducing, batch_size=args.batch_size, epochs=epochs,
                                lr=args.lr, seed=args.seed, verbose=not args.quiet)
    start = time.perf_counter()
    est.fit(x, y)
    seconds = time.perf_counter() - start
    est.save(path)
    return est, seconds


def run(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..models.latent.diagnostics import gradient_snr
    from ..models.latent.model import check_gradient
    from ..data.synthetic import make_multimodal_demo

    if args.dataset not in _DATASETS:
        raise ValueError(f"--dataset must be one of {_DATASETS}, got {args.dataset!r}")
    depths = _int_list(args.layers, "layers")
    ks = _int_list(args.num_importance, "num-importance")
    gradients = [check_gradient(g.strip()) for g in str(args.gradient).split(",") if g.strip()]
    check_gradient(args.train_gradient)
    if args.repeats < 2 or args.points < 1:
        raise ValueError("--repeats must be >= 2 and --points >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with ResultStore(out / "snr.jsonl", _KEYS, wait=getattr(args, "wait", False)) as store:
        x, y, _ = make_multimodal_demo(args.num_data, seed=args.seed)
        jobs = [(d, k, g) for d in depths for k in ks for g in gradients]
        bar = tqdm(total=len(jobs), desc="snr", disable=args.quiet)
        for depth in depths:
            todo = [(k, g) for k in ks for g in gradients
                    if not store.is_done(_row(args, depth, k, g))]
            bar.update(len(ks) * len(gradients) - len(todo))
            if not todo:
                continue
            est, fit_seconds = _fit_or_load(depth, args, x, y, out)
            xt = est.scaled_inputs(x)
            yt = est.scaled_targets(y, x.shape[0])
            train_bound = est.elbo(x, y) / x.shape[0]
            for k, g in todo:
                start = time.perf_counter()
                snr, details = gradient_snr(est.model_, xt, yt, k, g, repeats=args.repeats, points=args.points,
                                            seed=args.seed, return_details=True)
                row = {**_row(args, depth, k, g), "snr": snr, "snr_per_point": details["per_point"],
                       "num_parameters": details["num_parameters"], "seconds": time.perf_counter() - start,
                       "train_bound_per_point": train_bound, "train_iterations": args.train_iterations,
                       "train_importance": args.train_importance, "train_gradient": args.train_gradient,
                       "fit_seconds": fit_seconds, "threads": torch.get_num_threads()}
                store.append(row)
                bar.update(1)
        bar.close()
        rows = [r for r in read_rows(out / "snr.jsonl") if r.get("dataset") == args.dataset]
        plot(rows, out / "snr.png")
        _print_table(rows)
    return 0


def _row(args, depth, k, g) -> dict:
    return {"dataset": args.dataset, "layers": depth, "num_importance": k, "gradient": g,
            "repeats": args.repeats, "points": args.points, "seed": args.seed}


def _print_table(rows) -> None:
    if not rows:
        return
    ks = sorted({r["num_importance"] for r in rows})
    print("layers gradient " + " ".join(f"K={k:<7d}" for k in ks))
    for depth in sorted({r["layers"] for r in rows}):
        for g in sorted({r["gradient"] for r in rows}):
            vals = {r["num_importance"]: r["snr"] for r in rows if r["layers"] == depth and r["gradient"] == g}
            print(f"{depth:<6d} {g:<8s} " + " ".join(f"{vals[k]:<9.4f}" if k in vals else " " * 9 for k in ks))


def plot(rows, path) -> None:
    """SNR vs K on log axes, one line per (estimator, depth) as in supplement Fig. 3."""
    from ..reporting.plotting import snr_figure

    snr_figure(rows, path)
    with open(Path(path).with_suffix(".json"), "w") as fh:
        json.dump([{k: r[k] for k in ("layers", "num_importance", "gradient", "snr")} for r in rows], fh, indent=1)
