"""One way to build a model: a small frozen config per model family and one `build(config, x, y)`.

A config says *what* model to build (kernel, flow, likelihood, sizes); `build` turns it into an initialised,
untrained `torch.nn.Module` for the (already scaled) training data x, y:

    from flowgp.build import SparseGPConfig, build
    model = build(SparseGPConfig(model="tgp", flow="sal", num_inducing=50), x, y, dtype=torch.float64)

Configs take objects or names: a `Flow` / `Kernel` object is used as given (a deep copy is trained, the
caller's object is never modified or rebuilt from its name), a name is resolved through `flowgp.flows.make_flow`
/ `flowgp.gp.kernels.make_kernel` (which read `flowgp.registry`). Parameters are built without touching torch's
default dtype: the data are taken in float64, the model is constructed, then moved with
`.to(dtype=dtype, device=device)` (exact for float64; rounding only for float32).

Randomness: the k-means initial inducing inputs (TGP appendix B.6) use `generator.initial_seed()` as their
seed (0 without a generator); every other initial draw (networks of input-dependent flows and flow
posteriors, latent columns, encoders) comes from `generator` itself where the layer below takes one. A
generator made with `torch.Generator().manual_seed(seed)` reproduces the estimators' fits.

A new model family registers its own builder: `register_builder(MyConfig, fn)` with
`fn(config, x, y, *, dtype, device, generator, **data) -> nn.Module`.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .gp.defaults import DEFAULTS
from .models.deep_gp import FLOW_ROWS

__all__ = ["InputDependence", "SparseGPFields", "SparseGPConfig", "ClassificationConfig", "DeepGPConfig", "LatentDeepGPConfig",
           "AMOGPConfig", "build", "register_builder", "builders", "resolve_flow", "resolve_kernel",
           "resolve_dtype", "DTYPES"]

#: the dtypes a model may be built in, by name or torch dtype
DTYPES = {"float64": torch.float64, "float32": torch.float32, torch.float64: torch.float64,
          torch.float32: torch.float32}


def resolve_dtype(dtype) -> torch.dtype:
    """torch.float64 / torch.float32 from a name or a torch dtype; ValueError otherwise."""
    try:
        return DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}") from None


# ----- configs -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputDependence:
    """A flow whose non-affine stages (which="all": every stage) take their parameters from a network
    θ(x) = NN(x, W) (TGP paper §3.2-3.3). `bayesian` is the treatment of W: "point" (PE-TGP), "mc_dropout"
    (BA-TGP, appendix eq. 20) or "vb" (mean-field q(W)); `prior_precision` is λ of p_λ(W) = N(0, λ⁻¹I)
    (None: 1e-5, or 1 for "vb", appendix B.6)."""

    which: str = "nonlinear"
    hidden: tuple = (50,)
    activation: str = "relu"
    dropout: float = 0.25
    bayesian: str = "mc_dropout"
    prior_precision: float | None = None


@dataclass(frozen=True)
class SparseGPFields:
    """The fields every single-layer sparse GP config shares (the base of SparseGPConfig and ClassificationConfig).

    kernel: a Kernel object or a kernel spec ("rbf", "rbf+linear", ...), with initial `lengthscale` and
    `period` for specs. flow: a Flow or a flow spec ("sal+softplus"). input_dependent: an InputDependence for
    input-dependent flows, with `mc_samples_train` / `mc_samples_predict` draws of W per ELBO / prediction.
    inducing_points: [M, D] initial Z (None: k-means of x, best of `kmeans_restarts`).
    """

    num_inducing: int = DEFAULTS.num_inducing
    kernel: Any = "rbf"
    lengthscale: float = 1.0
    period: float = 1.0
    flow: Any = "identity"
    input_dependent: InputDependence | None = None
    learn_inducing: bool = True
    quadrature_points: int = DEFAULTS.quadrature_points
    mc_samples_train: int = 1
    mc_samples_predict: int = 100
    kmeans_restarts: int = DEFAULTS.kmeans_restarts
    inducing_points: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SparseGPConfig(SparseGPFields):
    """Sparse variational GP regression with a Gaussian likelihood (initial variance `noise`).

    model: "svgp" (Hensman et al. 2013), "tgp" (the prior warped by `flow`, TGP paper §3-4, ELBO appendix
    eq. 14) or "wgp" (v-WGP, §4.3: a GP on T(y) with T = `flow`); `flow` is ignored for "svgp" and
    `input_dependent` is a TGP feature. Other fields: see SparseGPFields.
    """

    model: str = "svgp"
    noise: float = DEFAULTS.noise
    predict_quadrature_points: int = DEFAULTS.predict_quadrature_points


@dataclass(frozen=True)
class ClassificationConfig(SparseGPFields):
    """Sparse GP classification (Hensman et al. 2015), each latent GP warped by `flow` (TGP paper §5.2).

    Two classes: one latent GP with the probit; more: `num_classes` latents with `likelihood` "softmax" or
    "robustmax". num_classes None: max(y) + 1. `mc_samples`: Monte Carlo samples of the multiclass ELL,
    `predict_samples` of the multiclass predictive probabilities. Other fields: see SparseGPFields.
    """

    num_classes: int | None = None
    likelihood: Any = "softmax"
    mc_samples: int = 20
    predict_samples: int = 256


@dataclass(frozen=True)
class DeepGPConfig:
    """Deep GP (DSVI, Salimbeni & Deisenroth 2017; CNF-DGP, Yu et al. 2021), see `models.deep_gp.build_deep_gp`.

    likelihood: a Likelihood object or "gaussian" (initial variance `noise`), "bernoulli", "robustmax",
    "softmax"; num_outputs: GPs of the last layer (None: y.shape[1] for "gaussian", 1 for "bernoulli",
    `num_classes` for the multiclass likelihoods).
    """

    layers: int = 3
    posterior: str = "gaussian"
    num_inducing: int = DEFAULTS.num_inducing
    kernel: str = "rbf"
    hidden_width: int | None = None
    likelihood: Any = "gaussian"
    noise: float = DEFAULTS.noise
    num_classes: int | None = None
    num_outputs: int | None = None
    lengthscale: float = 1.0
    period: float = 1.0
    num_samples: int = 1
    flow_steps: int = 2
    flow_base: str = "network"
    learn_inducing: bool = True
    quadrature_points: int = DEFAULTS.quadrature_points
    predict_quadrature_points: int = DEFAULTS.predict_quadrature_points
    kmeans_restarts: int = DEFAULTS.kmeans_restarts
    # element-wise steps of posterior="cnf" ("entry" or "channel") and how U is drawn in the bound
    # ("coupled", "per-point", "shared"; None: "coupled" for "cnf", "shared" for "cnf-paper", "per-point" else)
    flow_elementwise: str = "entry"
    draws: str | None = None
    # which bound the parameters shared with DSVI follow under draws="coupled" ("dsvi" or "joint"; None: "dsvi"
    # with coupled draws)
    base_gradient: str | None = None
    # rows of each training batch on which the flow's change of the bound is estimated with base_gradient="dsvi"
    # (a random subset; None: every row)
    flow_rows: int | None = FLOW_ROWS
    # the hidden layers' skip-layer connection ("linear", or "conv" for images of `image_shape`)
    skip: str = "linear"
    image_shape: tuple | None = None
    inducing_points: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LatentDeepGPConfig:
    """Latent-variable deep GP trained by importance-weighted VI (DGP-IWVI supplement E.2), see
    `models.latent.model.build_latent_deep_gp`."""

    layers: int = 2
    latent_dim: int = 1
    num_inducing: int = 128
    amortized: bool = True
    hidden_width: int = 5
    kernel: str = "rbf"
    noise: float = 0.01
    num_importance: int = 5
    gradient: str = "dreg"
    #: "bound" (L_K) or "per-slot" (the DREG authors' published objective, not a bound)
    objective: str = "bound"
    learn_inducing: bool = True
    kmeans_restarts: int = DEFAULTS.kmeans_restarts
    hidden_layer: str = "pca"
    q_var_init: float = 1e-5
    hidden_q_var_init: float | None = None
    learn_hidden_variance: bool = True
    encoder_skips: str = "dense"


@dataclass(frozen=True)
class AMOGPConfig:
    """Aligned warped multi-output GP (AMO-GP, Kaiser et al. 2018) for 1-D inputs, see `models.amogp.AMOGP`.

    The initial inducing inputs are evenly spaced: the CP layer's `num_inducing` over the range of x, each
    alignment GP's over the range of its own output's rows, each warping GP's over [-2.5, 2.5]. `build` needs
    the per-row output index as the keyword `output` (integers 0..num_outputs-1).
    """

    num_outputs: int | None = None
    num_inducing: int = 20
    num_inducing_alignment: int = 10
    num_inducing_warping: int = 10
    latent_processes: int = 1
    alignment: bool = True
    warping: bool = True
    lengthscale: float = 0.3
    variance: float = 1.0
    alignment_variance: float = 0.01
    alignment_lengthscale: float = 1.0
    warping_variance: float = 0.05
    warping_lengthscale: float = 1.0
    noise: float = DEFAULTS.noise
    alignment_noise: float = 1e-5
    latent_noise: float = 1e-3
    #: diagonal jitter of the CP layer's K_uu (None: the dtype default, 1e-8 in float64)
    jitter: float | None = None
    #: "latent" (one CP inducing set of `num_inducing` per latent process, on a smoothed latent) or "output" (one
    #: per output, the supplement's); see `models.amogp.AMOGP`
    cp_inducing: str = "latent"
    #: keep the CP layer's inducing inputs on their initial even grid (cp_inducing="latent"; see `models.amogp.AMOGP`)
    cp_grid: bool = False
    inducing_shapes: Any = field(default=None, compare=False, repr=False)


# ----- names or objects ----------------------------------------------------------------------------------------
def resolve_flow(flow, param_shape=()):
    """A private deep copy of a Flow object, or the flow built from a spec string (via the FLOWS registry)."""
    from .flows import Flow, make_flow

    if isinstance(flow, Flow):
        return copy.deepcopy(flow)
    if isinstance(flow, str):
        return make_flow(flow, param_shape=param_shape) if param_shape else make_flow(flow)
    raise TypeError(f"flow must be a spec string such as 'sal+softplus' or a flowgp Flow, got {type(flow).__name__}")


def resolve_kernel(kernel, input_dim: int, batch_shape=(), lengthscale=1.0, period=1.0):
    """A private deep copy of a Kernel object, or the kernel built from a spec string (via the KERNELS registry)."""
    from .gp.kernels import make_kernel

    if isinstance(kernel, str):
        return make_kernel(kernel, input_dim, batch_shape=batch_shape, lengthscale=lengthscale, period=period)
    if isinstance(kernel, torch.nn.Module):
        return copy.deepcopy(kernel)
    raise TypeError(f"kernel must be a kernel spec such as 'rbf' or a flowgp Kernel, got {type(kernel).__name__}")


def _kmeans_seed(generator) -> int:
    return 0 if generator is None else int(generator.initial_seed())


def _initial_inducing(config, x: torch.Tensor, generator) -> torch.Tensor:
    from .gp.inducing import initial_inducing_inputs

    return initial_inducing_inputs(x, config.num_inducing, config.kmeans_restarts, _kmeans_seed(generator),
                                   config.inducing_points)


def _inducing_and_kernel(config: SparseGPFields, x: torch.Tensor, generator, batch_shape=()):
    """The initial inducing inputs Z [M, D] and the kernel (`batch_shape`: one per latent GP) of a sparse GP."""
    z = _initial_inducing(config, x, generator)
    kernel = resolve_kernel(config.kernel, z.shape[-1], batch_shape=batch_shape, lengthscale=config.lengthscale,
                            period=config.period)
    return z, kernel


def _with_input_dependence(flow, spec: InputDependence | None, input_dim: int, generator=None):
    if spec is None:
        return flow
    from .flows.networks import default_prior_precision
    from .flows.conditional import make_input_dependent

    precision = default_prior_precision(spec.bayesian) if spec.prior_precision is None else spec.prior_precision
    return make_input_dependent(flow, input_dim, spec.which, hidden=tuple(spec.hidden), activation=spec.activation,
                                dropout=spec.dropout, bayesian=spec.bayesian, prior_precision=precision,
                                generator=generator)


# ----- builders ------------------------------------------------------------------------------------------------
def _build_sparse(config: SparseGPConfig, x, y, *, generator=None):
    from .gp.likelihoods import GaussianLikelihood
    from .models import SVGP, TGP, WarpedGP

    if config.model not in ("svgp", "tgp", "wgp"):
        raise ValueError(f"SparseGPConfig.model must be 'svgp', 'tgp' or 'wgp', got {config.model!r}")
    z, kernel = _inducing_and_kernel(config, x, generator)
    kw = dict(learn_inducing=config.learn_inducing, quadrature_points=config.quadrature_points,
              predict_quadrature_points=config.predict_quadrature_points)
    likelihood = GaussianLikelihood(noise=config.noise)
    if config.model == "svgp":
        return SVGP(kernel, z, likelihood, **kw)
    flow = resolve_flow(config.flow)
    if config.model == "wgp":
        if config.input_dependent is not None:
            raise ValueError("input_dependent flows are a TGP feature; use SparseGPConfig(model='tgp')")
        return WarpedGP(kernel, z, flow, likelihood, **kw)
    flow = _with_input_dependence(flow, config.input_dependent, z.shape[-1], generator)
    return TGP(kernel, z, flow, likelihood, mc_samples_train=config.mc_samples_train,
               mc_samples_predict=config.mc_samples_predict, **kw)


def _build_classification(config: ClassificationConfig, x, y, *, generator=None):
    from .models.classification import TGPClassification

    num_classes = config.num_classes
    if num_classes is None:
        if y is None:
            raise ValueError("ClassificationConfig.num_classes is None and no labels y were given to infer it")
        num_classes = int(torch.as_tensor(y).max()) + 1
    num_latent = 1 if num_classes == 2 else num_classes
    z, kernel = _inducing_and_kernel(config, x, generator, batch_shape=() if num_latent == 1 else (num_latent,))
    flow = _with_input_dependence(resolve_flow(config.flow, param_shape=(num_latent,)), config.input_dependent,
                                  z.shape[-1], generator)
    return TGPClassification(kernel, z, num_classes, flow=flow, likelihood=config.likelihood,
                             quadrature_points=config.quadrature_points, mc_samples=config.mc_samples,
                             predict_samples=config.predict_samples, learn_inducing=config.learn_inducing,
                             mc_samples_train=config.mc_samples_train, mc_samples_predict=config.mc_samples_predict)


def _deep_likelihood(config: DeepGPConfig, y):
    from .gp.likelihoods import (BernoulliLikelihood, GaussianLikelihood, Likelihood, RobustMaxLikelihood,
                              SoftmaxLikelihood)

    lik = config.likelihood
    if isinstance(lik, Likelihood):
        if config.num_outputs is None:
            raise ValueError("DeepGPConfig with a Likelihood object needs num_outputs (GPs of the last layer)")
        return copy.deepcopy(lik), int(config.num_outputs)
    if lik == "gaussian":
        dim = config.num_outputs or (1 if y is None or y.dim() == 1 else y.shape[-1])
        return GaussianLikelihood(noise=config.noise), int(dim)
    if lik == "bernoulli":
        return BernoulliLikelihood(), 1
    if lik in ("robustmax", "softmax"):
        if config.num_classes is None:
            raise ValueError(f"DeepGPConfig(likelihood={lik!r}) needs num_classes")
        cls = RobustMaxLikelihood if lik == "robustmax" else SoftmaxLikelihood
        return cls(int(config.num_classes)), int(config.num_classes)
    raise ValueError(f"DeepGPConfig.likelihood must be 'gaussian', 'bernoulli', 'robustmax', 'softmax' or a "
                     f"Likelihood, got {lik!r}")


def _build_deep(config: DeepGPConfig, x, y, *, generator=None):
    from .models.deep_gp import build_deep_gp

    likelihood, y_dim = _deep_likelihood(config, y)
    inducing = None if config.inducing_points is None else torch.as_tensor(np.asarray(config.inducing_points),
                                                                           dtype=torch.float64)
    return build_deep_gp(
        x, y_dim, int(config.layers), num_inducing=int(config.num_inducing), kernel=config.kernel,
        hidden_width=config.hidden_width, likelihood=likelihood.to(dtype=x.dtype), posterior=config.posterior,
        lengthscale=config.lengthscale, period=config.period, num_samples=int(config.num_samples),
        kmeans_restarts=config.kmeans_restarts, seed=_kmeans_seed(generator), inducing_points=inducing,
        learn_inducing=config.learn_inducing, flow_steps=int(config.flow_steps), flow_base=config.flow_base,
        quadrature_points=config.quadrature_points, predict_quadrature_points=config.predict_quadrature_points,
        draws=config.draws, base_gradient=config.base_gradient, flow_rows=config.flow_rows,
        flow_elementwise=config.flow_elementwise,
        skip=config.skip,
        image_shape=None if config.image_shape is None else tuple(config.image_shape),
        generator=generator)


def _build_latent(config: LatentDeepGPConfig, x, y, *, generator=None):
    from .models.latent.model import build_latent_deep_gp

    if y is None:
        raise ValueError("a latent deep GP needs the targets y (the amortized q(z) and the PCA means use them)")
    return build_latent_deep_gp(
        x, y, int(config.layers), latent_dim=int(config.latent_dim), num_inducing=int(config.num_inducing),
        amortized=bool(config.amortized), hidden_width=int(config.hidden_width), kernel=config.kernel,
        noise=config.noise, num_importance=int(config.num_importance), gradient=config.gradient,
        objective=config.objective,
        kmeans_restarts=config.kmeans_restarts, learn_inducing=config.learn_inducing, seed=_kmeans_seed(generator),
        hidden_layer=config.hidden_layer, q_var_init=config.q_var_init, hidden_q_var_init=config.hidden_q_var_init,
        learn_hidden_variance=config.learn_hidden_variance, encoder_skips=config.encoder_skips,
        generator=generator)


def _build_amogp(config: AMOGPConfig, x, y, *, generator=None, output=None, input_ranges=None):
    """AMO-GP (supplement §3) with inducing inputs spread evenly: the CP layer's over the range of x, each
    alignment GP's over its output's range (from `input_ranges` [D, 2] when given, e.g. a streamed table's
    ranges while x is a sample of it), the warpings' over [-2.5, 2.5]."""
    from .models.amogp.model import AMOGP

    if config.inducing_shapes is not None:  # structure only (loading saved weights): placeholder Z
        shapes = config.inducing_shapes
        z_a, z_f, z_g = (torch.zeros(tuple(shapes[k]), dtype=torch.float64) for k in ("a", "f", "g"))
        d = None if config.num_outputs is None else int(config.num_outputs)
    else:
        if output is None:
            raise ValueError("building an AMO-GP needs output=: the series index (0..D-1) of every row of x")
        xt = x.reshape(-1).cpu().numpy()
        o = torch.as_tensor(output).reshape(-1).cpu().numpy().astype(np.int64)
        d = int(config.num_outputs) if config.num_outputs is not None else int(o.max()) + 1
        sets = d if config.cp_inducing == "output" else int(config.latent_processes)
        if input_ranges is None:
            input_ranges = [(xt[o == i].min(), xt[o == i].max()) for i in range(d)]
        elif np.shape(input_ranges) != (d, 2):
            raise ValueError(f"input_ranges must have shape [{d}, 2] (min and max of x per output), got "
                             f"{np.shape(input_ranges)}")
        bounds = np.asarray(input_ranges, dtype=np.float64)
        z_f = np.tile(np.linspace(min(xt.min(), bounds.min()), max(xt.max(), bounds.max()), config.num_inducing),
                      (sets, 1))
        z_a = np.stack([np.linspace(lo, hi, config.num_inducing_alignment) for lo, hi in input_ranges])
        z_g = np.tile(np.linspace(-2.5, 2.5, config.num_inducing_warping), (d, 1))
        z_a, z_f, z_g = (torch.as_tensor(z, dtype=torch.float64) for z in (z_a, z_f, z_g))
    return AMOGP(z_a, z_f, z_g, latent_processes=int(config.latent_processes), alignment=bool(config.alignment),
                 warping=bool(config.warping), lengthscale=config.lengthscale, variance=config.variance,
                 alignment_variance=config.alignment_variance, alignment_lengthscale=config.alignment_lengthscale,
                 warping_variance=config.warping_variance, warping_lengthscale=config.warping_lengthscale,
                 noise=config.noise, alignment_noise=config.alignment_noise, latent_noise=config.latent_noise,
                 jitter=config.jitter, cp_inducing=config.cp_inducing, num_outputs=d, cp_grid=bool(config.cp_grid))


_BUILDERS: dict[type, Callable] = {
    SparseGPConfig: _build_sparse,
    ClassificationConfig: _build_classification,
    DeepGPConfig: _build_deep,
    LatentDeepGPConfig: _build_latent,
    AMOGPConfig: _build_amogp,
}


def register_builder(config_type: type, builder: Callable, *, overwrite: bool = False) -> Callable:
    """Make `build` handle configs of `config_type` (a frozen dataclass) with
    `builder(config, x, y, *, generator=None, **data) -> nn.Module` (x, y in float64; `build` moves the result
    to the requested dtype and device). Returns `builder`."""
    if not isinstance(config_type, type) or not dataclasses.is_dataclass(config_type):
        raise TypeError(f"config_type must be a dataclass type, got {config_type!r}")
    if not callable(builder):
        raise TypeError(f"builder must be callable, got {type(builder).__name__}")
    if config_type in _BUILDERS and not overwrite and _BUILDERS[config_type] is not builder:
        raise ValueError(f"a builder for {config_type.__name__} is already registered; pass overwrite=True")
    _BUILDERS[config_type] = builder
    return builder


def builders() -> dict[type, Callable]:
    """A copy of the config type -> builder table."""
    return dict(_BUILDERS)


def _as_float64(a):
    if a is None:
        return None
    t = torch.as_tensor(a)
    return t.to(torch.float64) if t.is_floating_point() else t


def build(config, x, y=None, *, dtype=torch.float64, device="cpu", generator: torch.Generator | None = None,
          **data) -> torch.nn.Module:
    """The untrained model described by `config` for the (scaled) training inputs x [N, D] and targets y.

    Dispatches on type(config) (see `register_builder`); x and float targets are taken in float64 so the
    initial parameters are computed in float64, then the model is moved with `.to(dtype=dtype, device=device)`.
    `generator` seeds the initialisation (k-means restarts use `generator.initial_seed()`). Extra keyword
    tensors (`output=` for AMO-GP) go to the builder. Torch's default dtype and global RNGs are not touched.
    """
    builder = next((_BUILDERS[c] for c in type(config).__mro__ if c in _BUILDERS), None)
    if builder is None:
        raise TypeError(f"no builder for {type(config).__name__}; known configs: "
                        f"{', '.join(c.__name__ for c in _BUILDERS)} (register one with register_builder)")
    torch_dtype = resolve_dtype(dtype)
    x64 = _as_float64(x)
    if x64 is not None:
        x64 = x64.cpu()
    y64 = _as_float64(y)
    if y64 is not None:
        y64 = y64.cpu()
    model = builder(config, x64, y64, generator=generator, **data)
    return model.to(dtype=torch_dtype, device=device)
