"""What an estimator adds to the work it wraps: per-epoch fit time against the bare training loop, and prediction
time against the same model's forward passes.

Run from the repository root:

    OMP_NUM_THREADS=1 python -m benchmarks.perf.estimator_overhead                 # N = 10 000, D = 8, M = 100
    OMP_NUM_THREADS=1 python -m benchmarks.perf.estimator_overhead --quick         # a few seconds
    python -m benchmarks.perf.estimator_overhead --profile svgp                    # cProfile of one estimator fit

Fit. For each estimator (SVGPRegressor, TGPRegressor(flow="sal+softplus", robust=False), DeepGPRegressor(layers=3);
their defaults otherwise, batch 512, float64, one torch thread) the same model is trained twice: by the estimator's
`fit` and by `flowgp.training.loop.train` on the model `flowgp.build.build(est.config(), ...)` makes from the data
standardised as the estimator does, with the optimiser the estimator's parameters ask for (Adam at `lr`, natural
gradients on q(u) where `natural_gradient` is set). Fixed costs (k-means, standardisation, building) are taken out
by timing a short and a long fit of each and dividing the difference by the difference in epochs trained (the
length of the history, so a plateau stop is accounted for). Estimator and loop runs alternate, `--repeats` times;
the medians and their ratio are reported.

Predict. `predict(X, return_std=True)` on `--predict-rows` rows against the fitted model's `predict` (predictive
mean and variance) on the same rows, already standardised, in chunks of `--chunk` rows; alternating repeats,
medians and ratio.

Times are CPU seconds of this process by default (`--clock cpu`; one torch thread, so that is the work done,
which other jobs on the machine do not inflate as they inflate wall time); `--clock wall` for wall seconds.
Results are written as JSON to docs/results/perf/estimator-overhead/ (`--out`).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import time
from pathlib import Path

import numpy as np
import torch

FOLDER = Path("docs/results/perf/estimator-overhead")
#: the clock every measurement reads: "cpu" (this process's CPU time; one torch thread, so it is the work done,
#: which a machine shared with other jobs does not inflate the way it inflates wall time) or "wall"
CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
now = time.process_time


def data(rows: int, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, size=(rows, dim))
    y = np.exp(0.5 * (np.sin(1.5 * x[:, 0]) + 0.5 * x[:, 1] * x[:, 2]) + 0.3 * rng.standard_normal(rows))
    return x, y


def estimator(kind: str, epochs: int, batch: int):
    from flowgp import DeepGPRegressor, SVGPRegressor, TGPRegressor

    common = dict(num_inducing=100, batch_size=batch, epochs=epochs, seed=0, dtype="float64", verbose=False)
    if kind == "svgp":
        return SVGPRegressor(**common)
    if kind == "tgp":
        return TGPRegressor(flow="sal+softplus", robust=False, **common)
    return DeepGPRegressor(layers=3, **common)


def fit_seconds(kind, x, y, epochs, batch):
    est = estimator(kind, epochs, batch)
    start = now()
    est.fit(x, y)
    return now() - start, len(est.history_), est


def loop_seconds(kind, x, y, epochs, batch):
    """The bare loop on the estimator's model: the same data standardisation, build, flow start and optimiser."""
    from flowgp.build import build
    from flowgp.training.loop import train
    from flowgp.training.natural_gradients import NaturalGradient

    est = estimator(kind, epochs, batch)
    xt = torch.as_tensor((x - x.mean(0)) / x.std(0))
    scale = float(y.std())
    shift = 0.0 if kind == "tgp" else float(y.mean())  # sal+softplus: targets only rescaled, as the estimator does
    yt = torch.as_tensor((y - shift) / scale)[:, None]
    model = build(est.config(), xt, yt, dtype=torch.float64, device="cpu",
                  generator=torch.Generator().manual_seed(0))
    if kind == "tgp":
        from flowgp.training.initialisation import init_identity
        init_identity(model.flow)
    gamma, anneal = est.resolved_natural_gradient(len(xt))  # the estimator's own natural-gradient steps
    natural = None if gamma is None else NaturalGradient([model.gp], lr=gamma, anneal=anneal)
    start = now()
    history = train(model, xt, yt, epochs=epochs, batch_size=batch, lr=est.lr, seed=0, verbose=False,
                    natural_gradient=natural)
    return now() - start, len(history), None


def per_epoch(kind, x, y, short, long, batch, repeats):
    """Median per-epoch seconds of the estimator and of the loop, from alternating (short, long) pairs."""
    out = {"estimator": [], "loop": []}
    for r in range(repeats):
        order = (("estimator", fit_seconds), ("loop", loop_seconds))
        for name, timer in (order if r % 2 == 0 else order[::-1]):
            t0, e0, _ = timer(kind, x, y, short, batch)
            t1, e1, _ = timer(kind, x, y, long, batch)
            out[name].append((t1 - t0) / max(1, e1 - e0))
    est, loop = statistics.median(out["estimator"]), statistics.median(out["loop"])
    return {"estimator_epoch_s": est, "loop_epoch_s": loop, "ratio": est / loop, "samples": out}


def predict_times(kind, x, y, rows, chunk, batch, repeats, epochs):
    _, _, est = fit_seconds(kind, x, y, epochs, batch)
    xp, _ = data(rows, x.shape[1], seed=1)
    xt = est.scaled_inputs(xp)
    model = est.model_

    def raw():
        with torch.no_grad():
            for part in xt.split(chunk):
                if kind == "dgp3":
                    model.predict(part, est.num_samples_predict, torch.Generator().manual_seed(0), common_noise=True)
                else:
                    model.predict(part)

    def wrapped():
        est.predict(xp, return_std=True)

    times = {"estimator": [], "forward": []}
    for r in range(repeats):
        order = (("estimator", wrapped), ("forward", raw))
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            start = now()
            fn()
            times[name].append(now() - start)
    e, f = statistics.median(times["estimator"]), statistics.median(times["forward"])
    return {"rows": rows, "chunk": chunk, "estimator_s": e, "forward_s": f, "ratio": e / f, "samples": times}


def profile(kind, x, y, epochs, batch, top=25):
    prof = cProfile.Profile()
    prof.enable()
    fit_seconds(kind, x, y, epochs, batch)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=["svgp", "tgp", "dgp3"], choices=["svgp", "tgp", "dgp3"])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--short", type=int, default=2, help="epochs of the short fit")
    parser.add_argument("--long", type=int, default=12, help="epochs of the long fit")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--predict-rows", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=10_000, help="rows per forward pass of the bare prediction")
    parser.add_argument("--quick", action="store_true", help="2 000 rows, 1 and 3 epochs, 20 000 predicted rows")
    parser.add_argument("--profile", choices=["svgp", "tgp", "dgp3"], default=None)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    parser.add_argument("--out", default=str(FOLDER))
    args = parser.parse_args(argv)
    global now
    now = CLOCK[args.clock]
    torch.set_num_threads(1)  # this benchmark process only
    if args.quick:
        args.rows, args.short, args.long, args.repeats, args.predict_rows = 2000, 1, 3, 2, 20_000
    x, y = data(args.rows)
    if args.profile:
        profile(args.profile, x, y, args.long, args.batch)
        return
    results = []
    for kind in args.kinds:
        row = {"model": kind, "rows": args.rows, "batch": args.batch, "M": 100, "dtype": "float64",
               "threads": torch.get_num_threads(), "clock": args.clock, "short_epochs": args.short, "long_epochs": args.long,
               "repeats": args.repeats, "machine": platform.node(), "torch": torch.__version__}
        row["fit"] = per_epoch(kind, x, y, args.short, args.long, args.batch, args.repeats)
        row["predict"] = predict_times(kind, x, y, args.predict_rows, args.chunk, args.batch, args.repeats,
                                       args.short)
        results.append(row)
        print(f"{kind}: epoch {1e3 * row['fit']['estimator_epoch_s']:.1f} ms (estimator) vs "
              f"{1e3 * row['fit']['loop_epoch_s']:.1f} ms (train loop), ratio {row['fit']['ratio']:.3f}; "
              f"predict {args.predict_rows} rows {row['predict']['estimator_s']:.2f} s vs "
              f"{row['predict']['forward_s']:.2f} s forward passes, ratio {row['predict']['ratio']:.3f}", flush=True)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
