"""`flowgp bench ldgp-demo`: a latent-variable deep GP against a DSVI deep GP on the bimodal demo data
(DGP-IWVI/DREG supplement E.25-E.28, Fig. 7).

Fits a 2-layer latent-variable deep GP (importance-weighted bound, DREG by default) and a 2-layer DSVI deep GP
without a latent input on 2 000 training points, reports the test log-likelihood per point on 1 000 fresh points
(E.3: z ~ p(z), log-mean-exp over samples) and draws `sample_y` draws over the training data, with the share of
draws nearer the second mode (the data hold 40 % there). Writes OUT/latent_dgp_demo.json and
OUT/latent_dgp_demo.png. `--device cuda` fits on a GPU and `--nproc N` data-parallel in N processes (rank 0 writes
the files); the JSON records `device` and `world_size`.

    flowgp bench ldgp-demo --iterations 3000 --out runs/ldgp-demo
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .runner import add_engine_arguments, engine_world, engine_world_size, limit_threads, place_estimator

NAME = "ldgp-demo"
HELP = "latent-variable vs DSVI deep GP on the bimodal demo data (DGP-IWVI/DREG supplement Fig. 7)"
#: the share of the demo data's points on the second mode (supplement E.27)
MODE2_SHARE_OF_DATA = 0.4


def add_arguments(parser) -> None:
    parser.add_argument("--iterations", type=int, default=3000, help="minibatch steps of each fit")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-inducing", type=int, default=64)
    parser.add_argument("--num-importance", type=int, default=5)
    parser.add_argument("--gradient", default="dreg", help="the latent DGP's q(z) gradient estimator (reg, dreg)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--test-samples", type=int, default=2000, help="z samples for the test log-likelihood")
    parser.add_argument("--train-points", type=int, default=2000)
    parser.add_argument("--test-points", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-results/ldgp-demo")
    add_engine_arguments(parser)


def mode_share(x, draws) -> float:
    """Share of draws nearer f₂ (E.26) than f₁ (E.25), each mode's curve including the mean noise 0.2·e^½;
    x [n, 1], draws [S, n]."""
    shift = 0.2 * np.exp(0.5)
    f1 = (np.sin(4 * x) / 3 + shift)[:, 0]
    f2 = (9 * x**2 / 30 + 1.5 + shift)[:, 0]
    return float(np.mean(np.abs(draws - f2) < np.abs(draws - f1)))


def models(args, num_train: int) -> dict:
    """The two estimators of the figure, with the same budget (`--iterations` steps of `--batch-size`)."""
    from ..estimators import DeepGPRegressor, LatentDeepGPRegressor

    epochs = max(1, round(args.iterations * args.batch_size / num_train))
    common = dict(num_inducing=args.num_inducing, batch_size=args.batch_size, epochs=epochs, lr=args.lr,
                  seed=args.seed, verbose=False)
    return {"latent_dgp2": LatentDeepGPRegressor(layers=2, num_importance=args.num_importance,
                                                 gradient=args.gradient, num_samples_predict=args.test_samples,
                                                 **common),
            "dsvi_dgp2": DeepGPRegressor(layers=2, hidden_width=5, num_samples_predict=args.test_samples, noise=0.01,
                                         **common)}


def fit_and_draw(est, x, y, x_test, y_test, grid) -> tuple[dict, np.ndarray]:
    """Fit one estimator; its scores and 30 predictive draws of y over `grid`."""
    from ..estimators import LatentDeepGPRegressor

    start = time.perf_counter()
    est.fit(x, y)
    fit_seconds = time.perf_counter() - start
    lpd = est.log_predictive_density(x_test, y_test)
    if isinstance(est, LatentDeepGPRegressor):
        draws = est.sample_y(grid, 30, random_state=1).T  # [draws, grid]
    else:  # DSVI: f samples plus Gaussian noise
        f = est.sample_f(grid, 30, seed=1)
        noise_sd = float(est.model_.likelihood.noise.detach().sqrt()) * est.y_scale_
        draws = f + noise_sd * np.random.default_rng(1).standard_normal(f.shape)
    scores = {"test_log_likelihood": float(lpd.mean()), "test_log_likelihood_se": float(lpd.std() / np.sqrt(len(lpd))),
              "rmse": float(np.sqrt(np.mean((est.predict(x_test) - y_test) ** 2))),
              "mode2_share_of_draws": mode_share(grid, draws), "fit_seconds": fit_seconds,
              "final_neg_bound_per_point": float(np.mean(est.history_[-50:]))}
    return scores, draws


def run(args) -> int:
    import torch

    from ..data.synthetic import make_multimodal_demo

    if min(args.iterations, args.batch_size, args.train_points, args.test_points, args.test_samples) < 1:
        raise ValueError("--iterations, --batch-size, --train-points, --test-points and --test-samples must be >= 1")
    limit_threads()
    x, y, _ = make_multimodal_demo(args.train_points, seed=args.seed)
    x_test, y_test, _ = make_multimodal_demo(args.test_points, seed=args.seed + 1)
    estimators = {name: place_estimator(est, args.device) for name, est in models(args, len(y)).items()}
    settings = {k: v for k, v in vars(args).items() if k not in ("bench_run", "bench_command", "launched_by_nproc")}
    result = {"settings": settings, "iterations": args.iterations,
              "epochs": estimators["latent_dgp2"].epochs, "num_train": len(y), "num_test": len(y_test),
              "threads": torch.get_num_threads(), "device": args.device, "world_size": engine_world_size(args),
              "models": {}, "mode2_share_of_data": MODE2_SHARE_OF_DATA}
    grid = np.linspace(-2, 2, 200)[:, None]
    panels = []
    titles = {"latent_dgp2": f"2-layer latent DGP (IWVI, {args.gradient.upper()}, K={args.num_importance})",
              "dsvi_dgp2": "2-layer DSVI DGP (no latent input)"}
    with engine_world(args) as world:  # every process takes part in each fit; rank 0 writes the files
        for name, est in estimators.items():
            scores, draws = fit_and_draw(est, x, y, x_test, y_test, grid)
            result["models"][name] = scores
            if world.is_main:
                print(name, json.dumps(scores), flush=True)
            panels.append((f"{titles[name]}\ntest log-lik {scores['test_log_likelihood']:.3f} / point", draws))
    if world.is_main:
        _write(args, x, y, grid, panels, result)
    return 0


def _write(args, x, y, grid, panels, result) -> None:
    """OUT/latent_dgp_demo.png and OUT/latent_dgp_demo.json."""
    from ..reporting.plotting import latent_demo_figure

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    latent_demo_figure(x[:, 0], y, grid[:, 0], panels, path=out / "latent_dgp_demo.png")
    (out / "latent_dgp_demo.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'latent_dgp_demo.json'} and {out / 'latent_dgp_demo.png'}")
