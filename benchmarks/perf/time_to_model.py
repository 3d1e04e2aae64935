"""Time to a converged model: wall seconds until the training bound per point is within 0.01 nats of the best
bound any method reaches in a long run, for flowgp's estimators (their defaults at run time) and GPyTorch's
documented recipes, measured in the same process.

Run from the repository root (GPyTorch is a dev-only dependency, the 'bench' extra):

    OMP_NUM_THREADS=1 python -m benchmarks.perf.time_to_model run              # every row not yet written
    OMP_NUM_THREADS=1 python -m benchmarks.perf.time_to_model run --quick      # 1 000 rows, 2 epochs, to a temp folder
    python -m benchmarks.perf.time_to_model report                             # table, ratios, figure, README
    python -m benchmarks.perf.time_to_model check                              # the two SVGP bounds agree

Families and recipes (M = 100 inducing inputs per layer, batch 512, float64, one torch thread):

- svgp: `flowgp` (SVGPRegressor with its defaults), `gpytorch-adam` (ApproximateGP + CholeskyVariationalDistribution
  + VariationalStrategy, Adam lr 0.01 on everything: GPyTorch's SVGP regression example) and `gpytorch-ngd`
  (NaturalVariationalDistribution, gpytorch.optim.NGD γ = 0.1 on q(u) with num_data = N, Adam lr 0.01 on the
  hyperparameters and the likelihood: GPyTorch's natural-gradient example). GPyTorch's models use a zero mean
  and an ARD RBF kernel with an output scale, so that they are the model flowgp fits (its examples use a constant
  mean), and start from the same k-means inducing inputs as flowgp (`flowgp.gp.inducing.kmeans_inducing_points`,
  same seed and restarts; the k-means time is counted in every recipe).
- tgp: `flowgp` (TGPRegressor(flow="sal+softplus") with its defaults).
- dgp3: `flowgp` (DeepGPRegressor(layers=3), DSVI, its defaults) and `gpytorch-deepgp` (GPyTorch's DeepGP example:
  DeepGPLayer with CholeskyVariationalDistribution, linear mean in the hidden layers and constant mean in the last,
  ScaleKernel(RBF ARD), DeepApproximateMLL(VariationalELBO), 10 likelihood samples, Adam lr 0.01; three layers,
  hidden width flowgp's, the first layer's inducing inputs flowgp's k-means centres, the later ones drawn from
  N(0, 1) as the example does).

Each run trains for the estimator's default `epochs` (every recipe gets the same cap, `--epochs` overrides it) or
`--time-cap` seconds of training, whichever ends first. While it trains, the bound per point on the whole training
set is evaluated (no gradients; deep GPs: 10 Monte Carlo samples from a generator with a fixed seed, so every
evaluation of a run uses the same draws) whenever the run's training clock has advanced by 5 % (at least 0.2 s)
since the last evaluation, and after every training stage; the clock is paused while it evaluates, so the recorded
seconds are training time only (k-means, standardisation, the estimators' own stage bookkeeping included). flowgp's
estimators are observed by wrapping `flowgp.training.loop.train` as the estimators call it (a callback chained after
their own; the robust TGP's stages, SVGP stage included, all traced: the warm start reproduces the SVGP's bound, so
the SVGP stage's bound is the bound of the TGP it hands on).

Bounds are in nats per training point in the units of the standardised targets (every method divides y by the same
std(y)); GPyTorch's VariationalELBO with a Gaussian likelihood is the bound flowgp's SVGP maximises (`check`
evaluates both on identical parameters). The target of a family on a data set is the best bound any run of that
family (for tgp: of tgp or svgp, which it contains) reached, minus 0.01; a run's time to model is the training time
at its first evaluation at or above the target (over-estimated by at most one evaluation interval, 5 %). The
report also gives each run's time to within 0.01 of its own best.

One JSON row per (data set, family, recipe, seed) is written to `--out` (default docs/results/perf/time-to-model/rows)
when its run ends; rows already there are skipped, so an interrupted run is continued by running the command again.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

FOLDER = Path("docs/results/perf/time-to-model")
TOLERANCE = 0.01
DATASETS = ("kin8nm", "power", "synthetic")
RUNS = (("svgp", "flowgp"), ("svgp", "gpytorch-adam"), ("svgp", "gpytorch-ngd"), ("tgp", "flowgp"),
        ("dgp3", "flowgp"), ("dgp3", "gpytorch-deepgp"))
#: families whose models a family contains (its target is the best bound of either)
CONTAINS = {"tgp": ("svgp",)}
EVAL_SAMPLES = 10
EVAL_CHUNK = 4096


# ----- data -----------------------------------------------------------------------------------------------------
def synthetic(rows: int = 100_000, dim: int = 8, seed: int = 0):
    """A positive, skewed regression set: y = exp(0.5 g(x) + 0.3 ε) with g smooth in 8 inputs (a log-normal noise
    that a warping flow can model and an SVGP cannot)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, size=(rows, dim))
    g = np.sin(1.5 * x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + np.cos(x[:, 3] + x[:, 4]) - 0.3 * x[:, 5] ** 2
    g = g + 0.2 * x[:, 6:].sum(1)
    return x, np.exp(0.5 * g + 0.3 * rng.standard_normal(rows))


def load(name: str, quick: bool, data_dir=None):
    """(X, y) training rows: the UCI sets' standard split 0 (training part), or the synthetic set."""
    if name == "synthetic":
        x, y = synthetic(1000 if quick else 100_000)
    else:
        from flowgp.data.tables import uci_split

        split = uci_split(name, 0, data_dir)
        x, y = split.x_train, split.y_train
        if quick:
            x, y = x[:1000], y[:1000]
    return np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64)


# ----- the clock and the trace ------------------------------------------------------------------------------------
class Trace:
    """Training clock (paused while bounds are evaluated) and the (seconds, bound per point) it records."""

    def __init__(self, time_cap: float, growth: float = 1.05, min_gap: float = 0.2):
        self.start = time.perf_counter()
        self.paused = 0.0
        self.points = []
        self.time_cap, self.growth, self.min_gap = time_cap, growth, min_gap
        self.next_at = 0.0
        self.steps = 0

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def due(self) -> bool:
        return self.seconds() >= self.next_at

    def capped(self) -> bool:
        return self.seconds() >= self.time_cap

    def record(self, evaluate, stage: str = "") -> float:
        """Evaluate `evaluate()` (bound per point) with the clock paused; returns the bound."""
        now = self.seconds()
        began = time.perf_counter()
        value = float(evaluate())
        self.paused += time.perf_counter() - began
        self.points.append([now, value, self.steps, stage])
        self.next_at = max(now * self.growth, now + self.min_gap)
        return value


def chunked_bound(evaluate_chunk, x, y) -> float:
    """Σ_c (n_c / N) · b_c for chunks c of the rows, where b_c = evaluate_chunk(x_c, y_c) is the chunk's bound per
    point scaled to the whole set (ELL_c / n_c - KL / N): the bound per point on all rows."""
    n = x.shape[0]
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, EVAL_CHUNK):
            xc, yc = x[start:start + EVAL_CHUNK], y[start:start + EVAL_CHUNK]
            total += float(evaluate_chunk(xc, yc)) * xc.shape[0] / n
    return total


def flowgp_bound(model, x, y) -> float:
    """flowgp model's bound per point on (x, y) (deep GPs: EVAL_SAMPLES draws from a generator seeded 12345)."""
    n = x.shape[0]
    deep = "num_samples" in inspect.signature(model.elbo).parameters
    was_training = model.training
    model.eval()
    try:
        def chunk(xc, yc):
            g = torch.Generator(device=xc.device).manual_seed(12345)
            extra = {"num_samples": EVAL_SAMPLES} if deep else {}
            return model.elbo(xc, yc, num_data=n, generator=g, **extra) / n
        return chunked_bound(chunk, x, y)
    finally:
        model.train(was_training)


class _Chain:
    """The estimator's own callback, then the trace's."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, step, loss, model):
        stop = bool(self.first(step, loss, model)) if self.first is not None else False
        return bool(self.second(step, loss, model)) or stop


@contextlib.contextmanager
def traced_training(trace: Trace):
    """Every `train` call the flowgp estimators make, traced: the bound on the call's data is recorded whenever the
    trace is due and after the call; the call is stopped once the trace's time cap is reached."""
    import flowgp.estimators as estimators_package
    from flowgp.training import loop

    original = loop.train

    def wrapper(model, x=None, y=None, *args, **kwargs):
        if not isinstance(x, torch.Tensor):  # a streamed sampler: not traced
            return original(model, x, y, *args, **kwargs)
        stage = kwargs.get("desc", "training")

        def evaluate():
            return flowgp_bound(model, x, y)

        def after_step(step, loss, m):
            trace.steps += 1
            if trace.due():
                trace.record(evaluate, stage)
            return trace.capped()

        kwargs["callback"] = _Chain(kwargs.get("callback"), after_step)
        try:
            return original(model, x, y, *args, **kwargs)
        finally:
            trace.record(evaluate, stage + " (end)")

    modules = [m for name, m in sys.modules.items()
               if name.startswith(estimators_package.__name__) and getattr(m, "train", None) is original]
    for m in modules:
        m.train = wrapper
    try:
        yield
    finally:
        for m in modules:
            m.train = original


# ----- flowgp's estimators -----------------------------------------------------------------------------------------
def flowgp_estimator(family: str, settings: dict):
    from flowgp import DeepGPRegressor, SVGPRegressor, TGPRegressor

    common = dict(num_inducing=settings["M"], batch_size=settings["batch"], seed=settings["seed"], dtype="float64",
                  verbose=False)
    if settings.get("epochs") is not None:
        common["epochs"] = settings["epochs"]
    common.update(settings.get("flowgp_params") or {})
    if family == "svgp":
        return SVGPRegressor(**common)
    if family == "tgp":
        return TGPRegressor(flow="sal+softplus", **common)
    return DeepGPRegressor(layers=3, **common)


def default_epochs(family: str) -> int:
    return int(flowgp_estimator(family, {"M": 100, "batch": 512, "seed": 0}).get_params()["epochs"])


def run_flowgp(family, x, y, settings, trace: Trace) -> dict:
    est = flowgp_estimator(family, settings)
    with traced_training(trace):
        est.fit(x, y)
    xt, yt = est.scaled_inputs(x), est.scaled_targets(y)
    # the fitted estimator's model (a robust fit keeps its best state) in the model's units of y
    trace.record(lambda: flowgp_bound(est.model_, xt, yt), "fitted")
    params = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
              for k, v in est.get_params().items()}
    return {"estimator": type(est).__name__, "params": params,
            "fit_report": getattr(est, "fit_report_", None) and json.loads(json.dumps(est.fit_report_, default=str))}


# ----- GPyTorch's recipes ------------------------------------------------------------------------------------------
def gpytorch_svgp(z, natural: bool):
    import gpytorch

    class Model(gpytorch.models.ApproximateGP):
        def __init__(self, z):
            m = z.shape[0]
            dist = (gpytorch.variational.NaturalVariationalDistribution(m) if natural
                    else gpytorch.variational.CholeskyVariationalDistribution(m))
            strategy = gpytorch.variational.VariationalStrategy(self, z, dist, learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=z.shape[1]))

        def forward(self, xb):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(xb), self.covar_module(xb))

    return Model(z)


def gpytorch_deep(z, hidden_width: int, layers: int = 3):
    """GPyTorch's DeepGP example, with `layers` layers: hidden layers of `hidden_width` GPs (linear mean), the last
    one GP (constant mean)."""
    import gpytorch
    from gpytorch.models.deep_gps import DeepGP, DeepGPLayer

    class Layer(DeepGPLayer):
        def __init__(self, input_dims, output_dims, inducing, mean_type):
            batch_shape = torch.Size([]) if output_dims is None else torch.Size([output_dims])
            dist = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[-2], batch_shape=batch_shape)
            strategy = gpytorch.variational.VariationalStrategy(self, inducing, dist, learn_inducing_locations=True)
            super().__init__(strategy, input_dims, output_dims)
            self.mean_module = (gpytorch.means.ConstantMean(batch_shape=batch_shape) if mean_type == "constant"
                                else gpytorch.means.LinearMean(input_dims, batch_shape=batch_shape))
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(batch_shape=batch_shape, ard_num_dims=input_dims),
                batch_shape=batch_shape)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    class Model(DeepGP):
        def __init__(self):
            super().__init__()
            m, d = z.shape
            hidden = []
            dims = d
            for ell in range(layers - 1):
                inducing = (z.expand(hidden_width, m, d).clone() if ell == 0
                            else torch.randn(hidden_width, m, dims, dtype=z.dtype))
                hidden.append(Layer(dims, hidden_width, inducing, "linear"))
                dims = hidden_width
            self.hidden = torch.nn.ModuleList(hidden)
            self.last = Layer(dims, None, torch.randn(m, dims, dtype=z.dtype), "constant")
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()

        def forward(self, x):
            for layer in self.hidden:
                x = layer(x)
            return self.last(x)

    return Model()


def gpytorch_bound(mll, model, x, y, deep: bool) -> float:
    """The bound per point on all rows: Σ_c (n_c / N) mll(model(x_c), y_c) (deep: EVAL_SAMPLES draws, seed 12345)."""
    import gpytorch

    with torch.random.fork_rng(), gpytorch.settings.num_likelihood_samples(EVAL_SAMPLES):
        torch.manual_seed(12345)
        return chunked_bound(lambda xc, yc: mll(model(xc), yc), x, y)


def run_gpytorch(recipe, x_raw, y_raw, settings, trace: Trace) -> dict:
    """GPyTorch's recipe on the same standardised data flowgp's estimators see (inputs per feature, targets by
    their mean and std), with a plain minibatch loop of shuffled batches (GPyTorch's examples use a DataLoader)."""
    import gpytorch
    from flowgp.gp.defaults import DEFAULTS
    from flowgp.gp.inducing import kmeans_inducing_points
    from flowgp.models.deep_gp import hidden_layer_width

    std = np.where(x_raw.std(0) > 0, x_raw.std(0), 1.0)
    x = torch.as_tensor((x_raw - x_raw.mean(0)) / std)
    y = torch.as_tensor((y_raw - y_raw.mean()) / y_raw.std())
    n, batch = x.shape[0], min(settings["batch"], x.shape[0])
    z = torch.as_tensor(kmeans_inducing_points(x, settings["M"], DEFAULTS.kmeans_restarts, settings["seed"]))
    deep = recipe == "gpytorch-deepgp"
    with torch.random.fork_rng():
        torch.manual_seed(settings["seed"])
        if deep:
            model = gpytorch_deep(z, hidden_layer_width(x.shape[1], 1)).double()
            likelihood = model.likelihood
            mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(likelihood, model, num_data=n))
            optimisers = [torch.optim.Adam(model.parameters(), lr=0.01)]
        else:
            model = gpytorch_svgp(z, natural=recipe == "gpytorch-ngd").double()
            likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
            mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=n)
            if recipe == "gpytorch-ngd":
                optimisers = [gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=0.1),
                              torch.optim.Adam([{"params": model.hyperparameters()},
                                                {"params": likelihood.parameters()}], lr=0.01)]
            else:
                optimisers = [torch.optim.Adam([{"params": model.parameters()},
                                                {"params": likelihood.parameters()}], lr=0.01)]
        model.train()
        likelihood.train()
        g = torch.Generator().manual_seed(settings["seed"])
        evaluate = lambda: gpytorch_bound(mll, model, x, y, deep)  # noqa: E731
        samples = gpytorch.settings.num_likelihood_samples(10) if deep else contextlib.nullcontext()
        epochs = settings["epochs"]
        with samples:
            for epoch in range(epochs):
                order = torch.randperm(n, generator=g)
                for start in range(0, n, batch):
                    rows = order[start:start + batch]
                    for opt in optimisers:
                        opt.zero_grad()
                    loss = -mll(model(x[rows]), y[rows])
                    loss.backward()
                    for opt in optimisers:
                        opt.step()
                    trace.steps += 1
                    if trace.due():
                        trace.record(evaluate, "training")
                    if trace.capped():
                        break
                if trace.capped():
                    break
        trace.record(evaluate, "fitted")
    return {"epochs_run": epoch + 1}


# ----- running ------------------------------------------------------------------------------------------------------
def row_path(out: Path, dataset, family, recipe, seed) -> Path:
    return out / f"{dataset}__{family}__{recipe}__seed{seed}.json"


def library_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_one(dataset, family, recipe, seed, args) -> dict:
    x, y = load(dataset, args.quick, args.data_dir)
    epochs = args.epochs if args.epochs is not None else (2 if args.quick else default_epochs(family))
    settings = {"M": 100, "batch": 512, "seed": seed, "epochs": epochs if (args.epochs is not None or args.quick)
                else None, "flowgp_params": _parse_params(args.flowgp_params)}
    time_cap = args.time_cap
    trace = Trace(time_cap)
    with torch.random.fork_rng():  # GPyTorch draws from the global RNG; nothing leaks to the next run
        if recipe == "flowgp":
            extra = run_flowgp(family, x, y, settings, trace)
        else:
            extra = run_gpytorch(recipe, x, y, {**settings, "epochs": epochs}, trace)
    seconds = [p[0] for p in trace.points]
    return {"dataset": dataset, "family": family, "recipe": recipe, "seed": seed, "rows": int(x.shape[0]),
            "features": int(x.shape[1]), "M": 100, "batch": 512, "dtype": "float64",
            "threads": torch.get_num_threads(), "epochs_cap": epochs, "time_cap_s": time_cap, "quick": args.quick,
            "train_seconds": max(seconds), "eval_seconds": trace.paused, "trace": trace.points,
            "best_bound": max(p[1] for p in trace.points), "final_bound": trace.points[-1][1],
            "log_y_std": math.log(float(y.std())), "flowgp_commit": library_commit(),
            "torch": torch.__version__, "gpytorch": _gpytorch_version(), "machine": platform.node(), **extra}


def _parse_params(items) -> dict:
    """--flowgp-params NAME=VALUE ...: estimator arguments that replace flowgp's defaults (numbers as floats)."""
    out = {}
    for item in items or ():
        name, _, value = item.partition("=")
        if not name or not value:
            raise ValueError(f"--flowgp-params takes NAME=VALUE, got {item!r}")
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def _gpytorch_version():
    try:
        import gpytorch
        return gpytorch.__version__
    except ImportError:
        return None


def command_run(args):
    torch.set_num_threads(1)  # this benchmark process only: one torch thread for every recipe
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for dataset in args.datasets:
        for family, recipe in RUNS:
            if family not in args.families or recipe not in args.recipes:
                continue
            for seed in args.seeds:
                path = row_path(out, dataset, family, recipe, seed)
                if path.exists():
                    print(f"skip {path.name} (written)", flush=True)
                    continue
                began = time.perf_counter()
                row = run_one(dataset, family, recipe, seed, args)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(row, indent=1))
                os.replace(tmp, path)
                print(f"{path.name}: best {row['best_bound']:.4f} final {row['final_bound']:.4f} after "
                      f"{row['train_seconds']:.1f} s training ({time.perf_counter() - began:.1f} s wall)", flush=True)


# ----- checking the two bounds agree -----------------------------------------------------------------------------
def command_check(args):
    """flowgp's SVGP bound and GPyTorch's VariationalELBO on identical parameters (after a short flowgp fit)."""
    import gpytorch
    from flowgp import SVGPRegressor

    torch.set_num_threads(1)
    x, y = load("kin8nm", True, args.data_dir)
    est = SVGPRegressor(num_inducing=20, batch_size=256, epochs=20, verbose=False).fit(x, y)
    gp = est.model_.gp
    xt, yt = est.scaled_inputs(x), est.scaled_targets(y)
    model = gpytorch_svgp(gp.inducing_points.detach().clone(), natural=False).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    with torch.no_grad():
        # GPyTorch sets q(u) to the prior at its first call in training mode unless told it is set already
        model.variational_strategy.variational_params_initialized.fill_(1)
        q = {name.rsplit(".", 1)[-1]: p for name, p in model.named_parameters()}
        q["variational_mean"].copy_(gp.q_mu[0])
        q["chol_variational_covar"].copy_(gp.q_sqrt_tril()[0])
        model.covar_module.outputscale = gp.kernel.variance.reshape(())
        model.covar_module.base_kernel.lengthscale = gp.kernel.base.lengthscale.reshape(1, -1)
        likelihood.noise = est.model_.likelihood.noise.reshape(1)
    model.train()
    likelihood.train()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=xt.shape[0])
    ours = flowgp_bound(est.model_, xt, yt)
    theirs = gpytorch_bound(mll, model, xt, yt[:, 0], False)
    print(json.dumps({"flowgp": ours, "gpytorch": theirs, "difference": ours - theirs}))


# ----- report -------------------------------------------------------------------------------------------------------
def load_rows(folder: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def targets(rows) -> dict:
    """(dataset, family) -> best bound per point any run of the family (or a family it contains) reached."""
    best = {}
    for r in rows:
        key = (r["dataset"], r["family"])
        best[key] = max(best.get(key, -math.inf), r["best_bound"])
    out = dict(best)
    for (dataset, family), value in best.items():
        for inner in CONTAINS.get(family, ()):
            if (dataset, inner) in best:
                out[(dataset, family)] = max(value, best[(dataset, inner)])
    return out


def time_to(trace, target):
    for seconds, bound, *_ in trace:
        if bound >= target:
            return seconds
    return None


def summarise(rows) -> list:
    best = targets(rows)
    table = []
    for r in rows:
        ref = best[(r["dataset"], r["family"])]
        table.append({"dataset": r["dataset"], "family": r["family"], "recipe": r["recipe"], "seed": r["seed"],
                      "rows": r["rows"], "reference": ref, "best": r["best_bound"], "final": r["final_bound"],
                      "train_s": r["train_seconds"], "to_target_s": time_to(r["trace"], ref - TOLERANCE),
                      "to_own_best_s": time_to(r["trace"], r["best_bound"] - TOLERANCE)})
    return table


def _fmt(v, digits=1):
    return "not reached" if v is None else f"{v:.{digits}f}"


def _ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"


def ratios(table) -> list:
    """Per data set (seed 0 rows): flowgp SVGP / best GPyTorch SVGP, TGP / flowgp SVGP, DSVI-3 / GPyTorch DeepGP."""
    at = {(t["dataset"], t["family"], t["recipe"]): t["to_target_s"] for t in table if t["seed"] == 0}
    lines = []
    for dataset in sorted({t["dataset"] for t in table}):
        peers = [at.get((dataset, "svgp", r)) for r in ("gpytorch-adam", "gpytorch-ngd")]
        peers = [p for p in peers if p is not None]
        best_peer = min(peers) if peers else None
        svgp = at.get((dataset, "svgp", "flowgp"))
        lines.append((dataset, _ratio(svgp, best_peer), _ratio(at.get((dataset, "tgp", "flowgp")), svgp),
                      _ratio(at.get((dataset, "dgp3", "flowgp")), at.get((dataset, "dgp3", "gpytorch-deepgp")))))
    return lines


def plot(rows, path: Path):
    from matplotlib.figure import Figure

    best = targets(rows)
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in rows)]
    families = ("svgp", "tgp", "dgp3")
    fig = Figure(figsize=(4.2 * len(datasets), 3.4 * len(families)))
    for i, family in enumerate(families):
        for j, dataset in enumerate(datasets):
            ax = fig.add_subplot(len(families), len(datasets), i * len(datasets) + j + 1)
            runs = [r for r in rows if r["dataset"] == dataset and r["family"] == family and r["seed"] == 0]
            if not runs:
                ax.set_title(f"{family}, {dataset}")
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            if (dataset, family) in best:
                ref = best[(dataset, family)]
                ax.axhspan(ref - TOLERANCE, ref, color="0.85", label=f"within {TOLERANCE} of the best")
            for r in runs:
                t = np.array([p[0] for p in r["trace"]])
                b = np.array([p[1] for p in r["trace"]])
                ax.plot(np.maximum(t, 1e-2), b, "-", lw=1.2, label=r["recipe"])
            if (dataset, family) in best:
                ref = best[(dataset, family)]
                lowest_end = min(r["trace"][-1][1] for r in runs)  # a run that ends far below stays in view
                ax.set_ylim(min(ref - 0.5, lowest_end - 0.1), ref + 0.05)
            ax.set_xscale("log")
            ax.set_xlabel("training time (s, log scale)")
            ax.set_ylabel("bound per point (nats)")
            ax.set_title(f"{family}, {dataset}")
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def command_report(args):
    folder = Path(args.out)
    rows = [r for r in load_rows(folder) if args.quick or not r.get("quick")]
    table = summarise(rows)
    lines = ["| data set | N | family | recipe | seed | best bound | target | time to target (s) | "
             "time to own best − 0.01 (s) | training time (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in sorted(table, key=lambda t: (t["dataset"], t["family"], t["recipe"], t["seed"])):
        lines.append(f"| {t['dataset']} | {t['rows']:,} | {t['family']} | {t['recipe']} | {t['seed']} | "
                     f"{t['best']:.4f} | {t['reference'] - TOLERANCE:.4f} | {_fmt(t['to_target_s'])} | "
                     f"{_fmt(t['to_own_best_s'])} | {t['train_s']:.1f} |")
    lines += ["", "| data set | flowgp SVGP / best GPyTorch SVGP | TGP / flowgp SVGP | DSVI-3 / GPyTorch DeepGP |",
              "|---|---|---|---|"]
    lines += [f"| {d} | {a} | {b} | {c} |" for d, a, b, c in ratios(table)]
    text = "\n".join(lines)
    if rows:
        plot(rows, folder.parent / "bound_vs_seconds.png")
    readme = folder.parent / "README.md"
    marker = "<!-- table: generated by `python -m benchmarks.perf.time_to_model report` -->"
    head = readme.read_text().split(marker)[0] if readme.exists() else ""
    readme.write_text(head + marker + "\n\n" + text + "\n")
    print(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="train every (data set, family, recipe, seed) not yet written")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--families", nargs="+", default=["svgp", "tgp", "dgp3"])
    p.add_argument("--recipes", nargs="+", default=sorted({r for _, r in RUNS}))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--epochs", type=int, default=None, help="epoch cap of every recipe (default: the estimator's)")
    p.add_argument("--time-cap", type=float, default=3600.0, help="training seconds after which a run stops")
    p.add_argument("--flowgp-params", nargs="*", default=[], metavar="NAME=VALUE",
                   help="flowgp estimator arguments instead of the defaults (an ablation; give its own --out)")
    p.add_argument("--quick", action="store_true", help="1 000 rows, 2 epochs, rows in the temp folder: proves the script runs")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None)
    p = sub.add_parser("report", help="table, ratios, figure and README from the rows")
    p.add_argument("--out", default=str(FOLDER / "rows"))
    p.add_argument("--quick", action="store_true", help="include rows of --quick runs (from a --quick folder)")
    p = sub.add_parser("check", help="flowgp's SVGP bound and GPyTorch's ELBO on identical parameters")
    p.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.out is None:
            args.out = (str(Path(tempfile.gettempdir()) / "flowgp-time-to-model-quick") if args.quick
                        else str(FOLDER / "rows"))
        command_run(args)
    elif args.command == "report":
        command_report(args)
    else:
        command_check(args)


if __name__ == "__main__":
    main()
