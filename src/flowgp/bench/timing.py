"""`flowgp bench timing`: training and prediction wall time per model on one UCI split (paper Fig. 11).

After one untimed warm-up fit per model, every model trains for the same number of epochs with the same minibatch size and M; repeats are
interleaved (model A, model B, A, B, ...) so slow drifts of a shared machine hit all models alike. Rows go to
OUT/timing.jsonl; the summary prints medians and each model's ratio to the first model in `--models`.
Run it on a quiet machine: timings of concurrent jobs mean little, so there is no --jobs here. `--device cuda`
times the fits on a GPU and `--nproc N` data-parallel in N processes (rank 0 writes the rows); rows record
`device` and `world_size` (key fields; rows written before them count as cpu and 1), and the summary takes the rows
of the device and world size asked.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from ..cli.options import add_threads_option
from .runner import (ENGINE_KEY_DEFAULTS, add_engine_arguments, engine_store, engine_world_size, limit_threads,
                     parse_name_list, place_estimator)

NAME = "timing"
HELP = "training/prediction wall time of several models on one dataset (medians and ratios, paper Fig. 11)"
KEY_FIELDS = ("dataset", "model", "num_inducing", "epochs", "batch_size", "repeat", "split", "tag", "device",
              "world_size")
#: rows written before `device` and `world_size` existed ran on the CPU in one process
KEY_DEFAULTS = ENGINE_KEY_DEFAULTS


def add_arguments(parser) -> None:
    parser.add_argument("--dataset", default="energy", help="UCI dataset (default energy, as in the paper)")
    parser.add_argument("--models", default="svgp,tgp", help="models to time; ratios are against the first")
    parser.add_argument("--inducing", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=200, help="epochs for every model (same for all)")
    parser.add_argument("--batch-size", type=int, default=None, help="minibatch size (default: full batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="free label kept in the rows (e.g. the machine)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="bench-results/timing")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")
    add_threads_option(parser)
    add_engine_arguments(parser)


def summarise(rows: list[dict], models: list[str] | None = None) -> list[dict]:
    """Median train/predict seconds per model and their ratios to the first model (in `models` order)."""
    models = models or list(dict.fromkeys(r["model"] for r in rows))
    out = []
    for m in models:
        rs = [r for r in rows if r["model"] == m]
        if rs:
            out.append({"model": m, "repeats": len(rs),
                        "train_median_s": statistics.median(r["train_seconds"] for r in rs),
                        "predict_median_s": statistics.median(r["predict_seconds"] for r in rs),
                        "train_s_per_epoch": statistics.median(r["train_seconds"] / max(r["epochs"], 1) for r in rs)})
    if out:
        base = out[0]
        for s in out:
            s["train_ratio"] = s["train_median_s"] / base["train_median_s"]
            s["predict_ratio"] = s["predict_median_s"] / base["predict_median_s"]
    return out


def run(args) -> int:
    from .models import make_estimator, model_names
    from .presets import get_preset
    from .runner import fit_and_score
    from .uci import load_split

    if args.repeats < 1 or args.epochs < 1:
        raise ValueError("--repeats and --epochs must be >= 1")
    models = parse_name_list(args.models, known=model_names(), what="model")
    limit_threads()
    split = load_split(args.dataset, args.split, args.data_dir)
    n = len(split.y_train)
    preset = get_preset("quick", epochs=args.epochs, batch_size=args.batch_size or n, kmeans_restarts=1)
    engine = {"device": args.device, "world_size": engine_world_size(args)}

    def estimator(model, budget):
        return place_estimator(make_estimator(model, budget, min(args.inducing, n), args.seed, n,
                                              threads=args.threads), args.device)

    with engine_store(args, Path(args.out) / "timing.jsonl", KEY_FIELDS, KEY_DEFAULTS) as store:
        # Untimed warm-up fit per model: first calls pay one-off costs (lazy imports, allocator growth).
        warm = get_preset("quick", epochs=1, batch_size=preset.batch_for(n), kmeans_restarts=1)
        for model in models:
            estimator(model, warm).fit(split.x_train, split.y_train)
        for rep in range(args.repeats):
            for model in models:
                key = {"dataset": args.dataset, "model": model, "num_inducing": args.inducing, "epochs": args.epochs,
                       "batch_size": preset.batch_for(n), "repeat": rep, "split": args.split, "tag": args.tag,
                       **engine}
                if store.is_done(key):
                    continue
                scores = fit_and_score(estimator(model, preset), split)
                store.append({**key, **scores, "n_train": n})
                if not args.quiet and store.is_main:
                    print(f"repeat {rep} {model}: train {scores['train_seconds']:.2f}s predict "
                          f"{scores['predict_seconds']:.3f}s", file=sys.stderr)
        if store.is_main:
            _print_summary(args, store.rows, models, engine)
    return 0


def _print_summary(args, rows, models, engine) -> None:
    """The medians and ratios of this run's rows: its dataset, budget, tag, device and world size."""
    rows = [r for r in rows if r["dataset"] == args.dataset and r["epochs"] == args.epochs
            and r["num_inducing"] == args.inducing and r.get("tag", "") == args.tag
            and all(r.get(k, KEY_DEFAULTS[k]) == v for k, v in engine.items())]
    print(f"{'model':<10}{'train median s':>16}{'ratio':>8}{'predict median s':>18}{'ratio':>8}")
    for s in summarise(rows, models):
        print(f"{s['model']:<10}{s['train_median_s']:>16.3f}{s['train_ratio']:>8.2f}"
              f"{s['predict_median_s']:>18.4f}{s['predict_ratio']:>8.2f}")
