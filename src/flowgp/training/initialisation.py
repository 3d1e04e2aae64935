"""Flow initialisation (TGP appendix B.2-B.4, plus random perturbation), every optimisation run by `train`.

- `init_identity`: G ≈ identity on a grid (appendix eq. 31).
- `init_from_data`: maximum likelihood of the flow on samples y (appendix eqs. 27-30).
- `init_random`: N(0, std²) perturbation of the raw parameters.
- `init_input_dependent`: each network of an input-dependent flow taught the raw parameters θ̂ of its base
  (appendix B.4).
- `init_affine`: G ≈ the affine map β + α·f on an interval (the identity when β = 0, α = 1); exact for flows
  whose family holds that map with an affine stage (SAL).
- `warm_start_from_svgp`: a TGP or v-WGP given a fitted SVGP's inducing inputs, kernel, q(u) and noise with the
  flow at the map that makes it the SVGP (the robust fit of `flowgp.estimators` starts there).

Optimisation runs on the raw parameters through `flowgp.training.loop.train` with a `loss=` hook. Adam (as in the
paper) is guarded (`nonfinite="backoff"`): a step whose loss or gradient is not finite is undone and the step
size halved; the best parameters seen are kept (`keep_best`), and the run stops once the loss stalls
(`EarlyStop`). The data fit (eq. 30) additionally uses L-BFGS, which crosses the curved valleys of these
likelihoods (e.g. SAL's shape/scale trade-off) in a few dozen evaluations where Adam needs thousands; every
L-BFGS result is kept only if it lowers the loss (one `BestParameters` is shared by all phases of a fit).
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .batches import ArrayBatches
from ..flows.base import Flow
from ..flows.conditional import input_dependent_flows, static_flow
from .loop import BestParameters, EarlyStop, train

__all__ = ["init_identity", "init_affine", "init_from_data", "init_random", "init_input_dependent",
           "warm_start_from_svgp"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_NUM_QUANTILES = 256


def _check_flow(flow) -> None:
    if not isinstance(flow, Flow):
        raise TypeError(f"flow must be a flowgp Flow, got {type(flow).__name__}")


def _dtype_device(flow: Flow):
    return flow.dtype, flow.device


class _Objective(nn.Module):
    """The module `train` optimises: the flow's (or network's) parameters, with the loss given by a closure."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[], Tensor]):
        super().__init__()
        self.inner = module
        self.loss_fn = loss_fn

    def trainable(self) -> list:
        return [p for p in self.parameters() if p.requires_grad]


def _loss_hook(objective, batch, num_data, generator):
    return objective.loss_fn()


#: a single dummy row: the flow losses read no minibatch, but `train` always sees data through a sampler
def _no_data(dtype, device):
    return torch.zeros(1, 1, dtype=dtype, device=device)


def _evaluate(loss_fn) -> float:
    """The loss at the current parameters; inf where it is not defined (non-finite or a RuntimeError)."""
    with torch.no_grad():
        try:
            value = float(loss_fn())
        except RuntimeError:  # e.g. a numerical inverse that cannot bracket the data
            return math.inf
    return value if math.isfinite(value) else math.inf


def _consider(objective: _Objective, best: BestParameters) -> float:
    """Evaluate the current point and remember it in `best` if it is the best so far."""
    value = _evaluate(objective.loss_fn)
    best.consider(value, objective.trainable())
    return value


def _run(objective: _Objective, best: BestParameters, **kwargs) -> None:
    """`train` on the objective's loss, guarded, keeping the best point; the module's train/eval mode is kept."""
    was_training = objective.inner.training
    dtype, device = objective.trainable()[0].dtype, objective.trainable()[0].device
    try:
        train(objective, _no_data(dtype, device), loss=_loss_hook, keep_best=best, nonfinite="backoff",
              verbose=False, **kwargs)
    finally:
        objective.inner.train(was_training)


def _adam(objective: _Objective, best: BestParameters, steps: int, lr: float, window: int = 100,
          rel_tol: float = 1e-3, abs_tol: float = 0.0) -> None:
    """Guarded Adam from the current point: stops on a plateau of the best loss or once it is <= abs_tol."""
    _run(objective, best, steps=int(steps), lr=lr, early_stop=EarlyStop(window, rel_tol, abs_tol))


def _lbfgs(objective: _Objective, best: BestParameters, max_iter: int = 100) -> bool:
    """One L-BFGS run (strong-Wolfe line search) from the current point; returns whether it improved `best`."""
    before = best.loss

    def lbfgs(params):
        return torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                 tolerance_grad=1e-10, tolerance_change=1e-14, history_size=20)

    _run(objective, best, steps=1, optimizer=lbfgs)
    return best.loss < before


def init_identity(flow: Flow, low: float = -3.0, high: float = 3.0, num_points: int = 500,
                  steps: int = 2000, lr: float = 0.01) -> float:
    """Fit G ≈ identity on a grid (appendix eq. 31): minimise (1/N) Σ (x_n - G(x_n))² with Adam.

    Stops early once the MSE stalls. For a flow on the positive half-line the grid starts at
    high/num_points instead of low ≤ 0. With param_shape (L,) every output is fitted. Returns the
    final MSE.

    Args:
        flow: the Flow to initialise (in place).
        low, high: the grid's interval.
        num_points: N, points of the grid.
        steps: the most Adam steps.
        lr: Adam's step size.

    Examples:
        >>> from flowgp import make_flow
        >>> from flowgp.training.initialisation import init_identity
        >>> init_identity(make_flow("sal")) < 1e-12  # SAL holds the identity exactly
        True
    """
    _check_flow(flow)
    if not high > low:
        raise ValueError(f"need low < high, got low={low}, high={high}")
    if num_points < 2:
        raise ValueError(f"num_points must be at least 2, got {num_points}")
    if flow.domain == "positive" and low <= 0:
        if high <= 0:
            raise ValueError(f"a flow on the positive half-line needs high > 0, got high={high}")
        low = high / num_points
    dtype, device = _dtype_device(flow)
    x = torch.linspace(low, high, num_points, dtype=dtype, device=device)
    x = x.reshape((num_points,) + (1,) * len(flow.param_shape))

    def loss_fn():
        return torch.mean((flow(x, validate=False) - x) ** 2)

    objective = _Objective(flow, loss_fn)
    if objective.trainable() and steps > 0:
        _adam(objective, BestParameters(), steps, lr, window=100, rel_tol=1e-3, abs_tol=1e-12)
    return _evaluate(loss_fn)


def _normal_log_pdf(z: Tensor) -> Tensor:
    return -0.5 * z * z - _HALF_LOG_2PI


def _validated_data(flow: Flow, y) -> tuple[Tensor, bool]:
    dtype, device = _dtype_device(flow)
    if not isinstance(y, Tensor):
        y = torch.as_tensor(y)
    y = y.detach().to(dtype=dtype, device=device)
    if y.ndim not in (1, 2):
        raise ValueError(f"y must be 1-D [N] or 2-D [N, L], got shape {tuple(y.shape)}")
    if y.shape[0] < 2:
        raise ValueError(f"y needs at least 2 samples, got {y.shape[0]}")
    finite = torch.isfinite(y)
    if not bool(torch.all(finite)):
        raise ValueError(f"y must be finite; got {int((~finite).sum())} NaN/inf values")
    ps = tuple(flow.param_shape)
    if len(ps) > 1:
        raise ValueError(f"init_from_data supports param_shape () or (L,), got {ps}")
    if y.ndim == 2 and len(ps) == 1 and ps[0] not in (1, y.shape[1]):
        raise ValueError(f"y has {y.shape[1]} columns but the flow's param_shape is {ps}")
    per_column = y.ndim == 2 and len(ps) == 1 and ps[0] == y.shape[1] and ps[0] > 1
    if y.ndim == 1 and ps:
        y = y.reshape(-1, *([1] * len(ps)))
    return y, per_column


def init_from_data(flow: Flow, y, steps: int = 2000, lr: float = 0.01, direction: str = "generative") -> float:
    """Fit the flow to samples y by maximum likelihood (appendix eqs. 27-30).

    direction="generative" (TGP prior): G(N(0,1)) should match y; minimises
        -mean[log φ(G⁻¹(y)) - log G'(G⁻¹(y))]            (eq. 30)
    direction="normalizing" (warped likelihood, v-WGP): T(y) should be N(0,1); minimises
        -mean[log φ(T(y)) + log T'(y)].

    y is 1-D [N] or 2-D [N, L] (with param_shape (L,) each column gets its own parameters). A
    bounded-range flow (tanh) whose range misses the data is first moved and widened to cover it.
    The likelihood fit starts from a cheap warm start that matches 256 quantiles of y to normal
    quantiles (no inverse needed) and is kept only if it helps; then L-BFGS, with guarded Adam
    (`steps`, `lr`) as fallback when L-BFGS stalls or leaves the region where the loss is defined.
    Returns the final mean negative log-likelihood.

    Args:
        flow: the Flow to initialise (in place).
        y: the samples, [N] or [N, L] (a tensor or array).
        steps: the most steps of the guarded Adam fallback.
        lr: its step size.
        direction: "generative" (default) or "normalizing", as above.

    See Also:
        :class:`flowgp.TGPRegressor` (``flow_init="data"``).
    """
    _check_flow(flow)
    if direction not in ("generative", "normalizing"):
        raise ValueError(f"direction must be 'generative' or 'normalizing', got {direction!r}")
    y, per_column = _validated_data(flow, y)
    low, high = (y.min(0).values, y.max(0).values) if per_column else (y.min(), y.max())
    if bool(torch.any(high <= low)):
        raise ValueError("y is constant (in some column); a distribution cannot be fitted to it")

    if direction == "generative":
        flow.fit_codomain_to(low, high)
        with torch.no_grad():
            bounds = flow.codomain_bounds()
        if bounds is not None and bool(torch.any((y <= bounds[0]) | (y >= bounds[1]))):
            raise ValueError(
                f"y lies outside the range of the '{flow.spec}' flow (e.g. positive-only flows need y > 0): "
                f"got y in [{y.min().item():.4g}, {y.max().item():.4g}]; the generative initialisation needs "
                "data the flow can produce"
            )

        def nll():
            z = flow.inverse(y, validate=False)
            return -torch.mean(_normal_log_pdf(z) - flow.log_abs_det_jacobian(z, validate=False))
    else:
        try:
            with torch.no_grad():
                flow(y)
        except ValueError as err:
            raise ValueError(f"y is outside the domain of the '{flow.spec}' flow: {err}") from err

        def nll():
            z, log_det = flow.forward_and_log_det(y, validate=False)
            return -torch.mean(_normal_log_pdf(z) + log_det)

    objective = _Objective(flow, nll)
    best = BestParameters()
    start_loss = _consider(objective, best)
    if not objective.trainable() or steps <= 0:
        return start_loss
    _quantile_warm_start(flow, y, direction, steps, lr, objective, best)
    if not _lbfgs(objective, best):
        _adam(objective, best, steps, lr, window=100, rel_tol=1e-4)
        _lbfgs(objective, best)
    return _evaluate(nll)


def _quantile_warm_start(flow: Flow, y: Tensor, direction: str, steps: int, lr: float, objective: _Objective,
                         best: BestParameters) -> None:
    """Least squares between G(normal quantiles) and the data quantiles, forward maps only.

    Well conditioned and cheap even for flows with a numerical inverse; it moves the parameters to
    the right scale before the likelihood fit. Kept only if the likelihood improves.
    """
    n = y.shape[0]
    k = min(n, _NUM_QUANTILES)
    probs = (torch.arange(k, dtype=y.dtype, device=y.device) + 0.5) / k
    q_y = torch.quantile(y, probs, dim=0)  # [k, ...]
    q_z = torch.special.ndtri(probs).reshape(-1, *([1] * (y.ndim - 1)))
    scale = y.std(0).clamp_min(torch.finfo(y.dtype).tiny)

    if direction == "generative":
        def loss_fn():
            return torch.mean(((flow(q_z, validate=False) - q_y) / scale) ** 2)
    else:
        def loss_fn():
            return torch.mean((flow(q_y, validate=False) - q_z) ** 2)

    warm = _Objective(flow, loss_fn)
    warm_best = BestParameters()
    _consider(warm, warm_best)
    if not _lbfgs(warm, warm_best):
        _adam(warm, warm_best, min(steps, 1000), lr, window=100, rel_tol=1e-3)
        _lbfgs(warm, warm_best)
    _consider(objective, best)  # the warm point becomes the best only if its likelihood is better
    best.restore(objective.trainable())


def init_random(flow: Flow, std: float = 0.5, generator: Optional[torch.Generator] = None) -> Flow:
    """Perturb every raw parameter by N(0, std²) noise (the paper's random initialisation); returns flow.

    Args:
        flow: the Flow to perturb (in place).
        std: the standard deviation of the noise on the raw parameters.
        generator: the torch.Generator of the noise (None: torch's global generator).

    See Also:
        :class:`flowgp.TGPRegressor` (``flow_init="random"``).
    """
    _check_flow(flow)
    if not std >= 0:
        raise ValueError(f"std must be non-negative, got {std}")
    with torch.no_grad():
        for p in flow.parameters():
            if generator is not None:
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=generator.device)
                noise = noise.to(p.device)
            else:
                noise = torch.randn(p.shape, dtype=p.dtype, device=p.device)
            p.add_(std * noise)
    return flow


def init_input_dependent(flow: Flow, x: Tensor, epochs: int = 100, batch_size: int = 256, lr: float = 0.01,
                         generator: Optional[torch.Generator] = None, tol: float = 1e-8) -> float:
    """Appendix B.4: fit each network so that NN(x) ≈ θ̂, the raw parameters of its base, by minibatch
    MSE with Adam (dropout active / VB weights sampled, no KL). Initialise the bases first (identity or
    from data on `static_flow(flow)`). The last-layer bias starts at θ̂, which makes the fit short.
    Stops early once an epoch's mean MSE falls to `tol`. Returns the final mean squared error (over networks).

    `generator` orders the rows every epoch and, when the network takes one, draws its dropout masks / weights
    (default: a new generator seeded with 0).

    Args:
        flow: a flow with input-dependent stages (`flowgp.flows.make_input_dependent`).
        x: the inputs [N, D] the networks read.
        epochs: the most passes over x.
        batch_size: rows per step.
        lr: Adam's step size.
        generator: as above.
        tol: the mean squared error at which the fit stops.

    See Also:
        :class:`flowgp.flows.InputDependentFlow`.
    """
    stages = input_dependent_flows(flow)
    if not stages:
        raise ValueError("flow has no input-dependent stage to initialise")
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [N, D], got {type(x).__name__} "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else ''}")
    if int(epochs) != epochs or epochs < 0:
        raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    x = x.detach()
    final = 0.0
    for stage in stages:
        net = stage.network
        target = stage.raw_target().to(net.biases[-1])
        with torch.no_grad():
            net.biases[-1].copy_(target)
        draws = {"generator": generator} if ("generator" in inspect.signature(net.forward).parameters
                                             and generator.device == x.device) else {}

        def loss(objective, batch, num_data, mc_generator, net=net, target=target, draws=draws):
            return (net(batch.x, num_samples=1, sample=True, **draws) - target).square().mean()

        objective = _Objective(net, None)
        if objective.trainable() and epochs > 0:
            was_training = net.training
            sampler = ArrayBatches(x, None, int(batch_size), shuffle=True, generator=generator)
            try:
                train(objective, sampler, epochs=int(epochs), lr=lr, loss=loss, verbose=False,
                      early_stop=EarlyStop(window=None, abs_tol=tol))
            finally:
                net.train(was_training)
        with torch.no_grad():
            loss_value = (net(x, sample=False) - target).square().mean().item()
        final += loss_value / len(stages)
    return final


def _set_affine_stage(flow: Flow, shift: float, scale: float) -> bool:
    """Put β + α·f into the last stage with an output affine map (`Flow.output_affine`: an Affine, a SAL's c + d·H)
    when the rest of the flow, that stage's H included, is at the identity; True if done."""
    stages = list(getattr(flow, "flows", [flow]))
    probe = torch.linspace(-3.0, 3.0, 7, dtype=flow.dtype, device=flow.device)

    def identity(g):
        return torch.allclose(g, probe, rtol=0, atol=1e-12)

    for i in reversed(range(len(stages))):
        stage = stages[i]
        names = getattr(stage, "output_affine", None)
        if names is None or tuple(stage.param_shape) not in ((),):
            continue
        others = stages[:i] + stages[i + 1:]
        with torch.no_grad():
            p = stage.params()
            inner = (stage(probe, validate=False) - p[names[0]]) / p[names[1]]
            if not (identity(inner) and all(o.domain == "real" and identity(o(probe, validate=False))
                                            for o in others)):
                return False
            stage.set_params(**{names[0]: float(shift), names[1]: float(scale)})
        return True
    return False


def init_affine(flow: Flow, shift: float = 0.0, scale: float = 1.0, low: float = -3.0, high: float = 3.0,
                num_points: int = 500, steps: int = 2000, lr: float = 0.01) -> float:
    """Fit G(f) ≈ β + α·f (β = `shift`, α = `scale` > 0) on [low, high]: minimise (1/N) Σ (G(f_n) - β - α f_n)².

    The generalisation of appendix eq. 31 (β = 0, α = 1) used to start a flow-warped GP at a plain GP whose
    targets were shifted and scaled differently: the flow starts at `init_identity`'s point; a flow whose
    other stages are then at the identity and which ends in an affine stage (SAL) takes β, α there exactly;
    any other flow is fitted by L-BFGS (then guarded Adam) on the grid. Returns the final mean squared error.

    Args:
        flow: the Flow to initialise (in place).
        shift: β.
        scale: α > 0.
        low, high: the interval of the fit.
        num_points: points of the grid.
        steps: the most Adam steps of the fallback.
        lr: Adam's step size.

    See Also:
        :func:`flowgp.training.initialisation.init_identity`, :func:`flowgp.training.initialisation.warm_start_from_svgp`.
    """
    _check_flow(flow)
    if not scale > 0:
        raise ValueError(f"scale must be positive (a flow is increasing), got {scale}")
    if not high > low:
        raise ValueError(f"need low < high, got low={low}, high={high}")
    init_identity(flow, low=min(low, -3.0), high=max(high, 3.0))
    dtype, device = _dtype_device(flow)
    x = torch.linspace(low, high, num_points, dtype=dtype, device=device)
    x = x.reshape((num_points,) + (1,) * len(flow.param_shape))

    def loss_fn():
        return torch.mean((flow(x, validate=False) - (shift + scale * x)) ** 2)

    if (shift == 0.0 and scale == 1.0) or _set_affine_stage(flow, shift, scale):
        return _evaluate(loss_fn)
    objective = _Objective(flow, loss_fn)
    if not objective.trainable() or steps <= 0:
        return _evaluate(loss_fn)
    best = BestParameters()
    _consider(objective, best)
    if not _lbfgs(objective, best):
        _adam(objective, best, steps, lr, window=100, rel_tol=1e-4, abs_tol=1e-12)
        _lbfgs(objective, best)
    return _evaluate(loss_fn)


@torch.no_grad()
def warm_start_from_svgp(model: nn.Module, svgp: nn.Module, shift: float = 0.0, scale: float = 1.0,
                         low: float = -3.0, high: float = 3.0) -> float:
    """Start a TGP (or v-WGP) at a fitted SVGP: inducing inputs, kernel, q(u) and noise copied, flow at β + α·f.

    The SVGP was fitted to targets t; `model` sees t' = α t + β (β = `shift`, α = `scale`: the two estimators
    scale y differently when the flow only takes positive values). For a TGP (flow G on the latent) G is set
    to β + α·f on [low, high] (`init_affine`) and the noise to α²σ²: then p(t' | f₀) = N(α t + β; G(f₀), α²σ²)
    is the SVGP's likelihood, and the TGP bound (appendix eq. 14) equals the SVGP's (up to the Jacobian log α
    per point) wherever G is exactly affine. For a v-WGP (warping T of the targets) T is set to
    (t' - β)/α, so that T(t') = t, and the noise is σ². Returns the mean squared error of the flow's fit on
    the interval (0.0 when exact).

    Args:
        model: the TGP or WarpedGP to start (changed in place).
        svgp: the fitted SVGP.
        shift, scale: β and α as above.
        low, high: the interval on which G is fitted to β + α·f.

    See Also:
        :class:`flowgp.estimators.RobustFit` (``warm_start``).
    """
    from ..gp.likelihoods import GaussianLikelihood, WarpedLikelihood

    if not isinstance(getattr(svgp, "likelihood", None), GaussianLikelihood):
        raise TypeError("warm_start_from_svgp needs an SVGP with a GaussianLikelihood to start from")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    model.gp.load_state_dict(svgp.gp.state_dict())
    likelihood = model.likelihood
    if isinstance(likelihood, WarpedLikelihood):
        if not isinstance(likelihood.base, GaussianLikelihood):
            raise TypeError("warm_start_from_svgp needs a TGP with a Gaussian base likelihood")
        likelihood.base.noise = svgp.likelihood.noise * scale ** 2
        with torch.enable_grad():  # input-dependent stages: their bases here, the networks by init_input_dependent
            return init_affine(static_flow(likelihood.flow), shift, scale, low, high)
    flow = getattr(model, "flow", None)
    if not isinstance(flow, Flow) or not isinstance(likelihood, GaussianLikelihood):
        raise TypeError(f"warm_start_from_svgp starts a TGP or a WarpedGP, got {type(model).__name__}")
    likelihood.noise = svgp.likelihood.noise
    lo, hi = (max(shift + scale * low, 1e-6), shift + scale * high) if flow.domain == "positive" else \
        (shift + scale * low, shift + scale * high)
    with torch.enable_grad():
        return init_affine(flow, -shift / scale, 1.0 / scale, lo, hi)
