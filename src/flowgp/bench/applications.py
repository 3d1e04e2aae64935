"""`flowgp bench airquality` and `flowgp bench rainfall`: the TGP paper's applications (appendix B.5).

Protocol (B.5): shuffle, 5-fold cross-validation, 2 seeds, SVGP vs TGP vs v-WGP with positive-enforcing
flows, each with two optimisation schemes: everything learnt jointly (`fix_noise_fraction` 0) and the
likelihood noise held fixed for the first 60 % of iterations (0.6). RBF lengthscale 0.1, noise 1.0, Adam 0.01.
Air quality: 5 %, 10 % and 100 % of the training points as inducing points, 10 000 epochs; rainfall:
20 000 epochs (inducing fraction not stated; the paper preset uses 100 %). RMSE mean ± std over flows, folds and seeds
(`flowgp bench report`).

Flows are written as the TGP's generative map G (latent -> y), e.g. "sal+softplus:data" = SAL then softplus,
initialised from data. A v-WGP warps the targets with T = G^-1 instead; flowgp has no inverse-softplus flow,
so for the v-WGP the softplus stage is replaced by its positive-domain counterpart log and the SAL stages are
applied after it (T = "log+sal" for G = "sal+softplus"; SAL is closed under inversion). Rows record both
(`flow` = G as asked, `warp` = the T actually used).

`--preset quick` (cheap): 1 000 epochs (air-quality fits with M > 200, i.e. the 100 % case, 200 epochs),
the main paper's flows only (air quality: sal+softplus from data; rainfall: softplus and sal+softplus), seed 0
only (5 folds), only the fixed-noise scheme, and rainfall at 25 % inducing points (M = 93) instead of 100 %.
Measured per epoch (one torch thread, full batch, while ~6 other jobs shared the 2 cores; expect ~2-3x less on
a quiet machine): M = N = 595 (air quality) 0.47 s for SVGP/TGP and 0.75 s for v-WGP, M = 373 (rainfall)
0.15-0.39 s, M = 60 0.03-0.04 s; a rainfall fit at M = 93 for 1 000 epochs took 7-10 s. So airquality quick
(30 fits at M <= 60 of ~7 s, 15 at M = 595 of 30-150 s) takes ≈ 10-30 min and rainfall quick (25 fits)
≈ 4 min on one job; about half with `--jobs 2`.

Input: air quality -> hours since start (1-D); rainfall -> station coordinates (x_km, y_km). `--protocol official`
runs rainfall on the official SIC97 split (100 train / 367 test stations) instead of CV.
"""
from __future__ import annotations


import numpy as np

from ..cli.options import add_threads_option
from .runner import (ENGINE_KEY_DEFAULTS, add_checkpoint_argument, add_engine_arguments, engine_world_size,
                     parse_int_list, parse_name_list, place_estimator, run_suite)

KEY_FIELDS = ("dataset", "model", "flow", "flow_init", "inducing_fraction", "fix_noise_fraction", "seed", "fold",
              "protocol", "preset", "device", "world_size")
# rows written before `device` and `world_size` existed ran on the CPU in one process
KEY_DEFAULTS = dict(ENGINE_KEY_DEFAULTS)

# Flow configurations per application (appendix B.5.1 / B.5.2): "G-spec:init".
PAPER_FLOWS = {
    "airquality": "sal+softplus:random,sal+softplus:data,sal+sal+softplus:data",
    "rainfall": "softplus:identity,sal+softplus:data,sal+softplus:identity,sal+sal+softplus:identity,"
                "sal+sal+softplus:data",
}
# What the main paper's Fig. 6 / Table 4 shows: one flow (sal+softplus from data); rainfall also softplus.
QUICK_FLOWS = {"airquality": "sal+softplus:data", "rainfall": "softplus:identity,sal+softplus:data"}
PAPER_FRACTIONS = {"airquality": "0.05,0.1,1.0", "rainfall": "1.0"}
QUICK_FRACTIONS = {"airquality": "0.05,0.1,1.0", "rainfall": "0.25"}
# Seeds and noise schemes: the paper's full grid, or (quick/tiny) one seed with the noise held fixed for 60 %.
GRID = {True: {"seeds": "0-1", "schemes": "0,0.6"}, False: {"seeds": "0", "schemes": "0.6"}}


def wgp_warp(g_spec: str) -> str:
    """T for a v-WGP given the generative positive flow G: softplus -> log, then the other stages reversed."""
    stages = [s.strip() for s in g_spec.split("+") if s.strip()]
    if not stages or stages[-1] != "softplus":
        raise ValueError(f"positive-enforcing flows here end in softplus, got '{g_spec}'")
    return "+".join(["log"] + stages[-2::-1])


def parse_flows(text: str) -> list[tuple[str, str]]:
    out = []
    for item in parse_name_list(text, what="flow"):
        spec, _, init = item.partition(":")
        init = init or "identity"
        if init not in ("identity", "data", "random"):
            raise ValueError(f"flow init must be identity, data or random, got '{item}'")
        wgp_warp(spec)  # positive-enforcing check
        out.append((spec, init))
    return out


def _load(dataset: str, data_dir):
    from ..data.tables import load_air_quality, load_rainfall

    if dataset == "airquality":
        x, y = load_air_quality(data_dir)
        return x, y, None
    return load_rainfall(data_dir)


def _work(job: dict) -> dict:
    from ..data.tables import Split, cv_splits
    from .models import make_estimator
    from .presets import get_application_preset
    from .runner import fit_and_score

    x, y, is_train = _load(job["dataset"], job["data_dir"])
    if job["protocol"] == "official":
        tr, te = np.flatnonzero(is_train), np.flatnonzero(~is_train)
    else:
        tr, te = cv_splits(len(y), 5, job["seed"])[job["fold"]]
    split = Split(x[tr], y[tr], x[te], y[te])
    preset = get_application_preset(job["dataset"], job["preset_name"], epochs=job["epochs_override"],
                                     fix_noise_fraction=job["fix_noise_fraction"])
    m = max(1, min(len(tr), int(round(job["inducing_fraction"] * len(tr)))))
    options = {}
    if job["model"] == "tgp":
        options = {"flow": job["flow"], "flow_init": job["flow_init"]}
    elif job["model"] == "wgp":
        options = {"flow": wgp_warp(job["flow"]), "flow_init": job["flow_init"]}
    est = make_estimator(job["model"], preset, m, job["seed"], len(tr), threads=job.get("threads"), **options)
    est = place_estimator(est, job.get("device", "cpu"))
    row = {k: job[k] for k in KEY_FIELDS}
    row.update(num_inducing=m, epochs=int(est.epochs), n_train=len(tr), n_test=len(te),
               warp=options.get("flow", "none") if job["model"] == "wgp" else None,
               **fit_and_score(est, split, checkpoint=job.get("checkpoint")))
    return row


def _add(parser, dataset: str) -> None:
    parser.add_argument("--models", default="svgp,tgp,wgp", help="svgp, tgp and/or wgp")
    parser.add_argument("--flows", default=None,
                        help=f"G-spec:init list (default: paper '{PAPER_FLOWS[dataset]}'; quick '{QUICK_FLOWS[dataset]}')")
    parser.add_argument("--inducing-fractions", default=None,
                        help=f"inducing points as fractions of the training set (default: paper "
                             f"'{PAPER_FRACTIONS[dataset]}'; quick '{QUICK_FRACTIONS[dataset]}')")
    parser.add_argument("--noise-schemes", default=None,
                        help="fix_noise_fraction values: 0 = joint, 0.6 = noise fixed for 60%% of iterations "
                             "(default: paper '0,0.6'; quick '0.6')")
    parser.add_argument("--seeds", default=None, help="CV shuffling/model seeds (default: paper '0-1'; quick '0')")
    parser.add_argument("--folds", default="0-4", help="which of the 5 folds to run")
    if dataset == "rainfall":
        parser.add_argument("--protocol", default="cv", choices=["cv", "official"],
                            help="cv: 5-fold CV (paper); official: SIC97 train100/test367")
    parser.add_argument("--preset", default="quick", choices=["paper", "quick", "tiny"])
    parser.add_argument("--epochs", type=int, default=None, help="override the preset's epochs")
    parser.add_argument("--jobs", type=int, default=1)
    add_threads_option(parser)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=f"bench-results/{dataset}")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")
    add_checkpoint_argument(parser)
    add_engine_arguments(parser)


def build_jobs(args, dataset: str) -> list[dict]:
    from .presets import get_application_preset

    get_application_preset(dataset, args.preset)
    models = parse_name_list(args.models, known=("svgp", "tgp", "wgp"), what="model")
    paper = args.preset == "paper"
    flows = parse_flows(args.flows or (PAPER_FLOWS if paper else QUICK_FLOWS)[dataset])
    try:
        fractions = [float(v) for v in parse_name_list(
            args.inducing_fractions or (PAPER_FRACTIONS if paper else QUICK_FRACTIONS)[dataset], what="fraction")]
        schemes = [float(v) for v in parse_name_list(args.noise_schemes or GRID[paper]["schemes"],
                                                     what="noise scheme")]
    except ValueError:
        raise ValueError("--inducing-fractions and --noise-schemes take comma-separated numbers") from None
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError("--inducing-fractions must lie in (0, 1]")
    if any(not 0 <= s <= 1 for s in schemes):
        raise ValueError("--noise-schemes must lie in [0, 1]")
    seeds = parse_int_list(args.seeds or GRID[paper]["seeds"], "seed")
    protocol = getattr(args, "protocol", "cv")
    folds = [0] if protocol == "official" else parse_int_list(args.folds, "fold")
    if any(not 0 <= f < 5 for f in folds):
        raise ValueError("--folds must lie in 0-4 (5-fold CV)")
    _load(dataset, args.data_dir)  # fail fast on a missing/malformed file
    preset = args.preset if args.epochs is None else f"{args.preset}-e{args.epochs}"
    jobs = []
    for seed in seeds:
        for fold in folds:
            for frac in fractions:
                for scheme in schemes:
                    for model in models:
                        for spec, init in (flows if model != "svgp" else [("none", "none")]):
                            jobs.append({"dataset": dataset, "model": model, "flow": spec, "flow_init": init,
                                         "inducing_fraction": frac, "fix_noise_fraction": scheme, "seed": seed,
                                         "fold": fold, "protocol": protocol, "preset": preset,
                                         "data_dir": args.data_dir, "epochs_override": args.epochs,
                                         "preset_name": args.preset, "device": getattr(args, "device", "cpu"),
                                         "world_size": engine_world_size(args),
                                         "threads": getattr(args, "threads", None)})
    return jobs


def _runner(dataset: str):
    def run(args) -> int:
        return run_suite(args, build_jobs(args, dataset), _work, KEY_FIELDS, dataset, key_defaults=KEY_DEFAULTS)

    return run


SUBCOMMANDS = (
    ("airquality", "London PM2.5 application (appendix B.5.1): 5-fold CV x 2 seeds, SVGP/TGP/v-WGP",
     lambda p: _add(p, "airquality"), _runner("airquality")),
    ("rainfall", "SIC97 Swiss rainfall application (appendix B.5.2): 5-fold CV x 2 seeds, SVGP/TGP/v-WGP",
     lambda p: _add(p, "rainfall"), _runner("rainfall")),
)
