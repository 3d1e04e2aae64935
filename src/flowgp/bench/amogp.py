"""`flowgp bench amogp`: aligned warped multi-output GPs on an artificial set and London PM2.5.

(a) artificial: one latent function l(a) = sin(a) + 0.5 sin(2.3 a) seen by 3 outputs through different nonlinear
    alignments a_d(t) and monotone warpings g_d; output 2 has no training data in t ∈ [5, 8). Gap RMSE and
    mean log predictive density of AMO-GP vs MO-GP (CP kernel alone) vs an independent SVGP on output 2;
    PNGs of the three layers per output with the true alignments/warpings (mapped to the model's standardised
    units) and of the gap predictions.
(b) pm25: the four-site hourly London file; a window of `--days` days from `--start`; a contiguous block of
    `--holdout-hours` hours of one site (`--site`) is held out (rows with NaN dropped; the few non-positive
    values are kept, every model here has a Gaussian likelihood). Test log-likelihood (mean per point) and RMSE
    of AMO-GP vs MO-GP vs an independent SVGP vs a 2-layer DSVI deep GP on the held-out site, `--seeds` seeds.

Rows go to `<out>/amogp.jsonl` (resumable: finished rows are skipped), a Markdown table to `<out>/amogp.md`,
PNGs next to them. `--device cuda` fits on a GPU and `--nproc N` data-parallel in N processes (every model here
trains on the training engine; rank 0 writes the rows, table and figures); rows record `device` and `world_size`
(key fields; rows written before them count as cpu and 1).
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from types import MappingProxyType

import numpy as np

from ..data.csv import csv_columns, read_csv
from ..registry import MODELS
from .models import is_multi_output  # (importing it registers the named models in MODELS)
from .results import read_rows
from .runner import ENGINE_KEY_DEFAULTS, add_engine_arguments, engine_store, engine_world_size, place_estimator

NAME = "amogp"
HELP = "AMO-GP (Kaiser et al. 2018): artificial gap experiment and London PM2.5 hold-out block, vs MO-GP/SVGP/deep GP"

KEY_FIELDS = ("experiment", "model", "seed", "epochs", "device", "world_size")
#: rows written before `device` and `world_size` existed ran on the CPU in one process
KEY_DEFAULTS = ENGINE_KEY_DEFAULTS
_PM25 = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "air_quality" / \
    "london_aurn_pm25_hourly_2018_2019.csv"


def add_arguments(parser) -> None:
    parser.add_argument("--experiment", choices=("artificial", "pm25", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=5, help="seeds for pm25 (artificial uses --artificial-seeds)")
    parser.add_argument("--artificial-seeds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=150, help="AMO-GP epochs (minibatches of --batch-size)")
    parser.add_argument("--baseline-epochs", type=int, default=300, help="epochs of MO-GP / SVGP / deep GP")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--num-inducing", type=int, default=20, help="CP inducing points per output")
    parser.add_argument("--data", default=str(_PM25), help="the four-site hourly PM2.5 CSV")
    parser.add_argument("--start", default="2019-03-15 00:00:00", help="first hour of the PM2.5 window")
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--site", default="n_kensington", help="site with the held-out block")
    parser.add_argument("--holdout-hours", type=int, default=48)
    parser.add_argument("--models", default="amogp,mogp,svgp,dgp", help="pm25 models (comma separated)")
    parser.add_argument("--pm25-lengthscale", type=float, default=0.1,
                        help="initial lengthscale in standardised time (0.1 of a two-week window ≈ 10 hours)")
    parser.add_argument("--natural-gradient", type=float, default=0.0,
                        help="γ of natural-gradient steps on every AMO-GP layer's q(u); 0 (default): Adam alone, "
                             "the protocol of the committed tables")
    parser.add_argument("--tol", type=float, default=None,
                        help="plateau stop of the AMO-GP family (rel. tolerance over 50 epochs); default: none")
    parser.add_argument("--cp-inducing", default="output", choices=("output", "latent"),
                        help="CP inducing sets of the AMO-GP family: --num-inducing per output (default, the "
                             "supplement's) or per latent process")
    parser.add_argument("--natural-gradient-layers", default="all", choices=("all", "latent"),
                        help="the layers whose q(u) take natural-gradient steps (with --natural-gradient)")
    parser.add_argument("--alignment-noise", type=float, default=1e-3,
                        help="initial alignment noise σ²_a of the AMO-GP family (default 1e-3: the committed "
                             "protocol; the estimator's default is now 1e-5)")
    parser.add_argument("--cp-grid", action="store_true",
                        help="CP inducing inputs kept on their even grid (the estimator's cp_grid; with "
                             "--cp-inducing latent)")
    parser.add_argument("--start-from-mogp", action="store_true",
                        help="AMO-GP starts from the fitted MO-GP (the estimator's start_from_mogp)")
    parser.add_argument("--out", default="bench-results/amogp")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")
    add_engine_arguments(parser)


# ----- artificial data ---------------------------------------------------------------------------------------
def _latent(a):
    return np.sin(a) + 0.5 * np.sin(2.3 * a)


ALIGN = (lambda t: t, lambda t: t + 0.6 * np.sin(0.4 * t), lambda t: 0.8 * t + 1.0 + 0.03 * t ** 2)
WARP = (lambda f: f, lambda f: 1.5 * np.tanh(f), lambda f: np.exp(0.8 * f) - 1.0)
GAP = (5.0, 8.0)  # output 2 then misses the latent peak near a = 8.6 (t ≈ 7.4)


def artificial_data(seed: int = 0, n: int = 120, noise: float = 0.05):
    """(X, y, output) training rows and the gap test rows of output 2 (times t in [0, 10])."""
    rng = np.random.default_rng(seed)
    tr, te = ([], [], []), ([], [], [])
    for d in range(3):
        t = np.sort(rng.uniform(0, 10, n))
        y = WARP[d](_latent(ALIGN[d](t))) + noise * rng.standard_normal(n)
        gap = (t >= GAP[0]) & (t < GAP[1]) if d == 2 else np.zeros(n, bool)
        for store, sel in ((tr, ~gap), (te, gap)):
            store[0].append(t[sel])
            store[1].append(y[sel])
            store[2].append(np.full(sel.sum(), d))
    tr = (np.concatenate(tr[0])[:, None], np.concatenate(tr[1]), np.concatenate(tr[2]))
    te = (np.concatenate(te[0])[:, None], np.concatenate(te[1]), np.concatenate(te[2]))
    return tr, te


# ----- PM2.5 -------------------------------------------------------------------------------------------------
def pm25_data(path, start: str, days: int, site: str, holdout_hours: int):
    """Window of `days` days from `start`; the middle `holdout_hours` hours of `site` are the test block."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; pass --data")
    header = csv_columns(path, label=f"--data {path}")
    sites = header[1:]
    if site not in sites:
        raise ValueError(f"--site must be one of {sites}, got {site!r}")
    # a site's missing hours are NaN (left out of its training rows below)
    vals, (stamps,) = read_csv(path, sites, header[:1], label=f"--data {path}", names=header, missing="nan")
    t0 = datetime.fromisoformat(start)
    times = np.array([(datetime.fromisoformat(r) - t0).total_seconds() / 3600.0 for r in stamps])
    sel = (times >= 0) & (times < 24 * days)
    if not sel.any():
        raise ValueError(f"no rows in the window starting {start}")
    times, vals = times[sel], vals[sel]
    mid = 24 * days / 2
    block = (times >= mid - holdout_hours / 2) & (times < mid + holdout_hours / 2)
    tr, te = ([], [], []), ([], [], [])
    for d, name in enumerate(sites):
        ok = np.isfinite(vals[:, d])
        test = ok & block if name == site else np.zeros_like(ok)
        train = ok & ~test
        for store, s in ((tr, train), (te, test)):
            store[0].append(times[s])
            store[1].append(vals[s, d])
            store[2].append(np.full(s.sum(), d))
    pack = [(np.concatenate(a)[:, None], np.concatenate(b), np.concatenate(c)) for a, b, c in (tr, te)]
    return pack[0], pack[1], sites, sites.index(site)


# ----- models ------------------------------------------------------------------------------------------------
def _variants() -> dict:
    """AMO-GP family of `flowgp.registry.MODELS`: name -> (alignment, warping, trained in minibatches for
    --epochs (else full batch for --baseline-epochs)). The ablations separate the two layers and the protocol."""
    entries = ((name, MODELS.get(name)) for name in MODELS.names())
    return {name: (entry.fixed["alignment"], entry.fixed["warping"], getattr(entry, "meta", {}).get("minibatch", True))
            for name, entry in entries if is_multi_output(entry)}


#: a read-only view of the registry's AMO-GP entries (the registry is the one table)
AMOGP_VARIANTS = MappingProxyType(_variants())


def _minibatch(model: str) -> bool:
    """Whether `model` trains in minibatches for --epochs (else full batch for --baseline-epochs)."""
    return AMOGP_VARIANTS.get(model, (None, None, False))[2]


def _fit_eval(model, seed, train, test, target, args, lengthscale, num_inducing):
    """Fit one model and score it on `test` (rows of output `target`); returns a result dict."""
    X, y, o = train
    Xt, yt, ot = test
    verbose = not args.quiet
    t0 = time.time()
    entry = MODELS.get(model)  # ValueError naming the valid models for an unknown name
    if model in AMOGP_VARIANTS:
        minibatch = AMOGP_VARIANTS[model][2]
        est = entry(num_inducing=num_inducing, num_inducing_alignment=8, num_inducing_warping=8,
                    epochs=args.epochs if minibatch else args.baseline_epochs,
                    batch_size=args.batch_size if minibatch else None, lr=args.lr, seed=seed,
                    lengthscale=lengthscale, num_samples=500, verbose=verbose,
                    natural_gradient=getattr(args, "natural_gradient", 0.0) or None,
                    natural_gradient_layers=getattr(args, "natural_gradient_layers", "all"),
                    tol=getattr(args, "tol", None), cp_inducing=getattr(args, "cp_inducing", "output"),
                    start_from_mogp=bool(getattr(args, "start_from_mogp", False)),
                    cp_grid=bool(getattr(args, "cp_grid", False)),  # the committed protocol: trained unless asked
                    alignment_noise=float(getattr(args, "alignment_noise", 1e-3)))
        place_estimator(est, getattr(args, "device", "cpu")).fit(X, y, o)
        mean = est.predict(Xt, ot)
        lpd = est.log_predictive_density(Xt, yt, ot, method="mc")
        lpd_gauss = est.log_predictive_density(Xt, yt, ot, method="gaussian")
        extra = {"test_ll_gaussian": float(lpd_gauss.mean()), "final_neg_elbo_per_point": est.history_[-1],
                 "epochs_run": len(est.history_), "cp_inducing": est.cp_inducing, "cp_grid": est.resolved_cp_grid()}
    elif model in ("svgp", "dgp"):  # single-output baselines on the target output (the deep GP with 2 layers)
        sel = o == target
        est = entry(num_inducing=min(num_inducing * 2, int(sel.sum())), epochs=args.baseline_epochs, lr=args.lr,
                    seed=seed, lengthscale=lengthscale, verbose=verbose, kmeans_restarts=3,
                    **({"layers": 2} if model == "dgp" else {}))
        place_estimator(est, getattr(args, "device", "cpu")).fit(X[sel], y[sel])
        mean = est.predict(Xt)
        lpd = est.log_predictive_density(Xt, yt)
        extra = {}
    else:
        raise ValueError(f"model {model!r} is not part of this benchmark; choose from "
                         f"{', '.join(AMOGP_VARIANTS)}, svgp, dgp")
    return est, {"rmse": float(np.sqrt(np.mean((mean - yt) ** 2))), "test_ll": float(np.mean(lpd)),
                 "train_seconds": round(time.time() - t0, 2), "n_train": int(len(y)), "n_test": int(len(yt)), **extra}


def _plots_artificial(est, train, test, out_dir, seed):
    from ..reporting.plotting import amogp_alignments_figure

    X, y, o = train
    xm, xs = est.x_mean_, est.x_std_
    lat = _latent(ALIGN[0](X[o == 0, 0]))
    lm, ls = lat.mean(), lat.std()
    true = {d: {"a": (lambda xx, d=d: (ALIGN[d](xx * xs + xm) - xm) / xs),
                "f": (lambda aa: (_latent(aa * xs + xm) - lm) / ls),
                "g": (lambda ff, d=d: (WARP[d](ff * ls + lm) - est.y_mean_[d]) / est.y_std_[d])} for d in range(3)}
    grid = np.linspace(0, 10, 300)
    est.plot_layers(grid, path=out_dir / f"artificial_layers_seed{seed}.png", X=X, y=y, output=o,
                    true_functions=true, output_names=["output 0", "output 1", "output 2 (gap)"])
    # learned vs true alignments in the units of t (identifiable up to the shared latent's affine freedom)
    alignments = [(*est.layers(grid, d)["alignment"], ALIGN[d](grid)) for d in range(3)]
    Xt, yt, ot = test
    prediction = est.predict(grid[:, None], np.full(len(grid), 2), return_std=True)
    amogp_alignments_figure(grid, alignments, prediction, (X[o == 2, 0], y[o == 2]), (Xt[:, 0], yt), GAP,
                            path=out_dir / f"artificial_alignments_seed{seed}.png")


def _plot_pm25(ests, train, test, sites, target, out_dir, seed):
    from ..reporting.plotting import pm25_holdout_figure

    X, y, o = train
    Xt, yt, _ = test
    lo, hi = Xt[:, 0].min() - 72, Xt[:, 0].max() + 72
    grid = np.linspace(max(lo, 0), hi, 300)
    sel = (o == target) & (X[:, 0] > lo) & (X[:, 0] < hi)
    predictions = {}
    for name, est in ests.items():
        if name in AMOGP_VARIANTS:
            predictions[name] = est.predict(grid[:, None], np.full(len(grid), target), return_std=True)
        else:
            predictions[name] = est.predict(grid[:, None], return_std=True)
    pm25_holdout_figure(grid, predictions, (X[sel, 0], y[sel]), (Xt[:, 0], yt),
                        f"{sites[target]}: held-out block (seed {seed})",
                        path=out_dir / f"pm25_holdout_seed{seed}.png")


def _engine_label(row) -> str:
    """'' for a row fitted on the CPU in one process, else ' (device, W processes)': a table row per engine."""
    device, size = row.get("device", "cpu"), row.get("world_size", 1)
    return "" if (device, size) == ("cpu", 1) else f" ({device}, {size} processes)"


def _table(rows) -> str:
    lines = []
    for exp in ("artificial", "pm25"):
        rs = [r for r in rows if r["experiment"] == exp]
        if not rs:
            continue
        lines += [f"### {exp}", "",
                  "| model | epochs | seeds | RMSE (mean ± sd) | test log-lik per point (mean ± sd) | train s (median) |",
                  "|---|---|---|---|---|---|"]
        for m, ep, where in dict.fromkeys((r["model"], r["epochs"], _engine_label(r)) for r in rs):
            sub = [r for r in rs if r["model"] == m and r["epochs"] == ep and _engine_label(r) == where]
            rm = np.array([r["rmse"] for r in sub])
            ll = np.array([r["test_ll"] for r in sub])
            secs = float(np.median([r["train_seconds"] for r in sub]))
            lines.append(f"| {m}{where} | {ep} | {len(sub)} | {rm.mean():.3f} ± {rm.std():.3f} | "
                         f"{ll.mean():.3f} ± {ll.std():.3f} | {secs:.0f} |")
        lines.append("")
    return "\n".join(lines)


def run(args) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = {"device": getattr(args, "device", "cpu"), "world_size": engine_world_size(args)}
    with engine_store(args, out_dir / "amogp.jsonl", KEY_FIELDS, KEY_DEFAULTS) as store:
        main = store.is_main  # rank 0 writes the rows, figures and table; every rank takes part in every fit
        if args.experiment in ("artificial", "both"):
            train, test = artificial_data(0)
            for seed in range(args.artificial_seeds):
                for model in ("amogp", "mogp", "svgp"):
                    job = {"experiment": "artificial", "model": model, "seed": seed,
                           "epochs": args.epochs if _minibatch(model) else args.baseline_epochs, **engine}
                    if store.is_done(job):
                        continue
                    est, res = _fit_eval(model, seed, train, test, 2, args, lengthscale=0.2,
                                         num_inducing=args.num_inducing)
                    if model == "amogp" and main:
                        _plots_artificial(est, train, test, out_dir, seed)
                    store.append({**job, **res, "lr": args.lr, "batch_size": args.batch_size if _minibatch(model) else None,
                                  "natural_gradient": getattr(args, "natural_gradient", 0.0),
                                  "tol": getattr(args, "tol", None)})
                    if main:
                        print(f"artificial {model} seed {seed}: gap RMSE {res['rmse']:.3f}, test ll {res['test_ll']:.3f}")
        if args.experiment in ("pm25", "both"):
            train, test, sites, target = pm25_data(args.data, args.start, args.days, args.site, args.holdout_hours)
            models = [m.strip() for m in args.models.split(",") if m.strip()]
            for seed in range(args.seeds):
                ests = {}
                for model in models:
                    job = {"experiment": "pm25", "model": model, "seed": seed,
                           "epochs": args.epochs if _minibatch(model) else args.baseline_epochs, **engine}
                    if store.is_done(job):
                        continue
                    est, res = _fit_eval(model, seed, train, test, target, args, lengthscale=args.pm25_lengthscale,
                                         num_inducing=args.num_inducing)
                    ests[model] = est
                    store.append({**job, **res, "site": args.site, "start": args.start, "days": args.days,
                                  "holdout_hours": args.holdout_hours, "lr": args.lr,
                                  "batch_size": args.batch_size if _minibatch(model) else None,
                                  "natural_gradient": getattr(args, "natural_gradient", 0.0),
                                  "tol": getattr(args, "tol", None)})
                    if not main:
                        continue
                    print(f"pm25 {model} seed {seed}: RMSE {res['rmse']:.3f}, test ll {res['test_ll']:.3f}")
                    if model == "amogp" and seed == 0:
                        est.plot_layers(np.linspace(0, 24 * args.days, 400), path=out_dir / "pm25_layers_seed0.png",
                                        X=train[0], y=train[1], output=train[2], output_names=sites)
                if ests and seed == 0 and main:
                    _plot_pm25(ests, train, test, sites, target, out_dir, seed)
        if main:
            rows = read_rows(out_dir / "amogp.jsonl")
            (out_dir / "amogp.md").write_text(_table(rows))
            print(_table(rows))
    return 0
