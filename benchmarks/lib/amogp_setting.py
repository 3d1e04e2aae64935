"""The AMO-GP setting the AMO-GP step-time script and studies share: the four London PM2.5 sites of the shared
data, 2019-03-01 00:00 + 21 days hourly, `AlignedMultiOutputGPRegressor(num_inducing=50)`'s model after a few
epochs of its own fit (`add_state_arguments`, `data`, `model_and_tensors`)."""
from __future__ import annotations

from pathlib import Path

from flowgp import AlignedMultiOutputGPRegressor
from flowgp.bench.amogp import pm25_data

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".." / "shared" / "data" / "air_quality" / "london_aurn_pm25_hourly_2018_2019.csv"


def add_state_arguments(p, cp_choices=("output", "latent"), cp_grid="default"):
    """The arguments that fix the model and its state (data window, sizes, dtype, initial lengthscale, epochs of the
    estimator's own fit): shared by perf/amogp_step_time.py and the AMO-GP studies that start from the same state."""
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--start", default="2019-03-01 00:00:00")
    p.add_argument("--days", type=int, default=21)
    p.add_argument("--num-inducing", type=int, default=50, help="CP inducing points per set (see --cp-inducing)")
    p.add_argument("--start-epochs", type=int, default=1,
                   help="epochs of the estimator's own fit before the steps are timed (1: at the initialisation; "
                        "a few hundred: at a fitted state, whose shorter lengthscales and spread input variances "
                        "change which Ψ₂ path is fastest)")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--lengthscale", type=float, default=0.3,
                   help="initial CP lengthscale (standardised time; 0.3 is the estimator's default)")
    p.add_argument("--cp-inducing", default="latent", choices=list(cp_choices),
                   help="CP inducing sets per latent process (the estimator's default) or per output (the "
                        "supplement's); --num-inducing points per set, both models")
    p.add_argument("--cp-grid", default=cp_grid, choices=["default", "on", "off"],
                   help="the estimator's cp_grid for both models: its default (on with latent sets: CP inducing "
                        "inputs fixed on their even grid), on, or off (trained inducing inputs)")


def data(args):
    # holdout_hours=0: nothing held out, the whole window trains
    (X, y, o), _, sites, _ = pm25_data(args.data, args.start, args.days, "eltham", 0)
    return X, y, o


def cp_grid_option(args):
    """The estimator's cp_grid for `--cp-grid` (None: its default)."""
    return {"default": None, "on": True, "off": False}[getattr(args, "cp_grid", "default")]


def model_and_tensors(layers, X, y, o, args):
    """The estimator's own model after `--start-epochs` epochs of its fit (1: freshly initialised) and its tensors."""
    est = AlignedMultiOutputGPRegressor(num_inducing=args.num_inducing, alignment=layers, warping=layers,
                                        epochs=args.start_epochs,
                                        verbose=False, dtype=args.dtype, lengthscale=args.lengthscale,
                                        cp_inducing=args.cp_inducing, cp_grid=cp_grid_option(args))
    est.fit(X, y, o)
    xt, ot, _ = est.scaled_inputs(X, o)
    yt = est.tensor((y - est.y_mean_[o]) / est.y_std_[o])
    return est.model_, xt, yt, ot
