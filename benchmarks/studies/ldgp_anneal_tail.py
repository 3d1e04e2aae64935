"""Is the gap of a reference-preset latent DGP to the supplement's power score the step-size schedule, or the
number of iterations?

Answer (2026-11-28, power split 0, from the bench's 10 013-iteration fit at 0.1126): the iterations. 3 000 more
iterations at a tenth of the step gain what 3 000 at the full step gain (0.1202 against 0.1204); the curve
keeps rising, 0.1252 / 0.1333 / 0.1387 at 15 013 / 20 013 / 30 013 with the preset's decay, at a slope that bends
from 0.055 to 0.031 per decade. The full 300 016 iterations on this split later reached 0.157 (0.211 in Table 1).

The supplement trains 300 000 iterations with Adam 0.005 and natural-gradient 0.01 both decayed by 0.98 per
1 000 iterations, so its last 100 000 iterations run at step sizes 1e-4 to 1e-5 of a kind the CPU rows (10 000
iterations, still at 0.8 x the first step) never reach. A test log-likelihood scored at a large step size is
the log-likelihood of one noisy iterate. This script separates "more iterations" from "smaller steps": it loads
the model state of a `flowgp bench uci --preset reference` checkpoint (runs/bench/<name of OUT>/*.pt of a bench run in progress),
scores the test set, continues training for `--iterations` at step sizes `--factor` x the preset's (Adam and
natural gradient alike; fixed, or with `--decay` decayed as the preset decays them), and scores again with the
same z draws (same generator seed).

    FLOWGP_DATA=../shared/data OMP_NUM_THREADS=1 python -m benchmarks.studies.ldgp_anneal_tail \\
        --checkpoint CKPT.pt --model ldgp2-dreg-eps --dataset power --split 0 --iterations 1000 --factor 0.1 \\
        --samples 2000 --out runs/ldgp-anneal-tail/anneal-tail.jsonl

One JSON line per scoring (label "start" / "tail"), with the standardised test log-likelihood
(mean log p(y*) + log y_scale), the tail's mean training loss per row over its first and last tenth, timings.
`--at` scores at more tail iterations on the way (a learning curve past the checkpoint); `--save` keeps the model
state of the last milestone for a later tail; `--gradient reg` trains the tail with the REG estimator (a third of
DREG's cost; the same bound). `--plot PNG` draws the rows of `--out`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch


def plot(path: Path, out: Path, extra: list[tuple[str, int, float]] = (), reference: float | None = None) -> None:
    """Test log-likelihood against total iterations (checkpoint step + tail iterations) of the rows in `path`,
    one line per (checkpoint, step factor); `extra` adds (label, iterations, value) points, e.g. bench rows."""
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fig = Figure(figsize=(6, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    groups: dict[tuple, list] = {}
    for r in rows:
        start = r["checkpoint_step"]
        groups.setdefault((r["dataset"], r["split"], start, r.get("factor"), r.get("decay", False)), []).append(
            (start + r.get("tail_iterations", 0), r["test_ll_std"]))
    starts = {k[:3]: v for k, v in groups.items() if k[3] is None}
    for key, pts in groups.items():
        if key[3] is None:
            continue
        pts = sorted(starts.get(key[:3], []) + pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=f"{key[0]} {key[1]}: tail at {key[3]} x the step" + (", decayed" if key[4] else ""))
    for label, iterations, value in extra:
        ax.plot([iterations], [value], marker="s", linestyle="none", label=label)
    if reference is not None:
        ax.axhline(reference, color="k", linestyle="--", linewidth=1, label=f"paper (300 000 iterations): {reference}")
    ax.set_xscale("log")
    ax.set_xlabel("iterations")
    ax.set_ylabel("test log-likelihood (standardised)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    from flowgp.training.batches import ArrayBatches
    from flowgp.training.checkpoint import atomic_save, safe_load
    from flowgp.bench.models import make_estimator
    from flowgp.bench.presets import get_preset
    from flowgp.bench.uci import load_split
    from flowgp.training.natural_gradients import NaturalGradient
    from flowgp.training.loop import step_lr, train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a bench training checkpoint (runs/bench/<name of OUT>/*.pt)")
    parser.add_argument("--plot", metavar="PNG", help="only draw the rows of --out to PNG (with --point ...)")
    parser.add_argument("--point", action="append", default=[], metavar="LABEL:ITERATIONS:VALUE",
                        help="an extra point for --plot, e.g. a bench row")
    parser.add_argument("--reference", type=float, help="--plot: the paper's value, drawn as a line")
    parser.add_argument("--model", default="ldgp2-dreg-eps", help="the bench model the checkpoint was made with (its name labels the rows)")
    parser.add_argument("--dataset", default="power")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--factor", type=float, default=0.1, help="tail step sizes = factor x the preset's")
    parser.add_argument("--at", default=None, help="comma-separated tail iterations to score at (default: the end)")
    parser.add_argument("--gradient", default=None, help="override the model's q(z) gradient estimator")
    parser.add_argument("--samples", type=int, default=2000, help="z samples per test point for both scorings")
    parser.add_argument("--inducing", type=int, default=128)
    parser.add_argument("--decay", action="store_true",
                        help="decay the tail's step sizes by the preset's 0.98 per 1000 iterations (as a longer "
                             "bench fit would; --factor is then the step at the checkpoint, 0.98^(step/1000))")
    parser.add_argument("--save", help="write the model state at every milestone to this file (atomically), "
                                       "a --checkpoint for a later tail (Adam's moments start afresh)")
    parser.add_argument("--skip-start", action="store_true", help="do not score the checkpoint itself")
    parser.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--data-dir", default=os.environ.get("FLOWGP_DATA"))
    args = parser.parse_args(argv)
    if args.plot:
        extra = [(p.rsplit(":", 2)[0], int(p.rsplit(":", 2)[1]), float(p.rsplit(":", 2)[2])) for p in args.point]
        plot(Path(args.out), Path(args.plot), extra, args.reference)
        return 0
    if not args.checkpoint:
        parser.error("--checkpoint is required to train (or give --plot)")
    torch.set_num_threads(1)

    state = safe_load(args.checkpoint)  # a bench checkpoint or a --save file: both checksummed
    split = load_split(args.dataset, args.split, args.data_dir, protocol="reference")
    n = len(split.y_train)
    preset = get_preset("reference")
    est = make_estimator(args.model, get_preset("reference", epochs=1), args.inducing, args.split, n)
    est.set_params(num_samples_predict=args.samples, verbose=False)
    if args.gradient is not None:
        est.set_params(gradient=args.gradient)
    # one epoch (an estimator trains at least one): builds the model and the scalings, whose trained weights the
    # checkpoint's replace
    est.fit(split.x_train, split.y_train)
    est.model_.load_state_dict(state["model"])
    xt = est.scaled_inputs(split.x_train)
    yt = est.scaled_targets(split.y_train, xt.shape[0])
    batch = preset.batch_for(n)

    def score(label, extra):
        t0 = time.perf_counter()
        lpd = est.log_predictive_density(split.x_test, split.y_test)
        row = {"dataset": args.dataset, "split": args.split, "model": args.model, "label": label,
               "checkpoint_step": int(state["step"]), "samples": args.samples,
               "test_ll_std": float(lpd.mean() + math.log(est.y_scale_)), "nll": float(-lpd.mean()),
               "y_scale": float(est.y_scale_), "score_seconds": time.perf_counter() - t0, **extra}
        with Path(args.out).open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    if not args.skip_start:
        score("start", {})
    natgrad = NaturalGradient([est.model_.layers[-1].gp], lr=est.natgrad_lr * args.factor) if est.natgrad else None
    sampler = ArrayBatches(xt, yt, batch, per_step=batch < n, seed=args.split + 1000)
    milestones = {args.iterations} | ({int(v) for v in args.at.split(",")} if args.at else set())
    t0 = time.perf_counter()
    losses: list[float] = []  # the step's negative bound per data point (train's loss is scaled to all n rows)

    def tail_score(step, loss, model):
        losses.append(float(loss) / n)
        if step + 1 in milestones:
            if args.save:
                atomic_save({"model": est.model_.state_dict(), "step": int(state["step"]) + step + 1}, args.save)
            k = max(1, len(losses) // 10)
            score("tail", {"tail_iterations": step + 1, "factor": args.factor, "decay": bool(args.decay),
                           "tail_gradient": est.gradient,
                           "tail_seconds": time.perf_counter() - t0,
                           "tail_neg_bound_first_last_tenth": [sum(losses[:k]) / k, sum(losses[-k:]) / k]})
        return False

    train(est.model_, sampler, steps=args.iterations, lr=est.lr * args.factor, natural_gradient=natgrad,
          schedule=step_lr(1000, 0.98) if args.decay else None, seed=args.split + 1000, verbose=True, desc="tail",
          callback=tail_score)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
