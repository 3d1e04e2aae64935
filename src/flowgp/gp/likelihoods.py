"""Likelihoods p(y | f) with their expectations under Gaussian marginals q(f) = N(mean, var).

Shapes: y, f, mean and var broadcast element-wise; outputs are log-densities per element (sum over
data and outputs is the caller's job). `f` may carry extra leading dimensions (quadrature nodes,
Monte Carlo samples).

Likelihoods compose the way GPflow's do: `WarpedLikelihood(flow, base)` is p(y | f₀, x) = base(y | G(f₀)),
the TGP likelihood (Maroñas et al. 2021), so TGP = SVGP + WarpedLikelihood. A likelihood whose density
depends on the inputs sets `accepts_inputs = True`; models then pass `x=` (and a `generator=`) to its
expected_log_prob / predictive_moments / predictive_log_density / predictive_quantiles, and subtract its
`kl_terms()` (e.g. the penalty of an input-dependent flow's network) from their bound.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..compat import nest_entries
from .defaults import DEFAULTS
from ..numerics.constraints import Positive
from ..flows import Flow, make_flow
from ..flows import WeightSampling, input_dependent_flows
from .prediction import (check_probabilities, flow_log_predictive_density, flow_mixture_quantiles,
                         flow_predictive_moments, likelihood_mixture_quantiles, normal_quantiles)
from ..numerics.quadrature import expectation, gauss_hermite, gh_points, log_expectation_exp
from ..registry import LIKELIHOODS

__all__ = ["Likelihood", "GaussianLikelihood", "WarpedLikelihood"]

_LOG_2PI = math.log(2.0 * math.pi)


class Likelihood(nn.Module):
    """Base class: subclasses give `log_prob(y, f)`; expectations default to Gauss-Hermite quadrature.

    Optional pieces a subclass may add: `conditional_moments(f)` (E[y | f], Var[y | f]: enables the default
    predictive moments and quantiles), `cdf(y, f)` (P(Y <= y | f): enables predictive quantiles), closed
    forms of any expectation. `accepts_inputs` (False here) tells models whether to pass x.

    See Also:
        :class:`flowgp.GaussianLikelihood`, :class:`flowgp.gp.likelihoods.WarpedLikelihood`,
        :class:`flowgp.gp.likelihoods.BernoulliLikelihood`.
    """

    #: whether the density depends on the inputs x (models pass x=, generator= only when True)
    accepts_inputs: bool = False

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def expected_log_prob(self, y, mean, var, num_points: int = 20) -> torch.Tensor:
        """E_{q(f)}[log p(y | f)] (the ELL integrand of TGP appendix eq. 14 with G = I)."""
        return expectation(lambda f: self.log_prob(y, f), mean, var, num_points)

    def log_prob_at_nodes(self, y, f, weights) -> torch.Tensor:
        """Σ_q w_q log p(y | f_q) over the leading node axis of f ([Q, ...]; weights [Q, 1, ...]): the
        quadrature sum of an expected log-likelihood at given nodes (e.g. warped ones, TGP appendix eq. 14)."""
        return (weights * self.log_prob(y, f)).sum(0)

    def conditional_moments(self, f):
        """E[y | f] and Var[y | f] (used for predictive moments through a flow)."""
        raise NotImplementedError(f"{type(self).__name__} does not define conditional_moments(f)")

    def predictive_moments(self, mean, var, num_points: int = 100):
        """E[y*] and Var[y*] under f ~ N(mean, var) by Gauss-Hermite quadrature of conditional_moments."""
        f, w = gh_points(mean, var, num_points)
        cond_mean, cond_var = self.conditional_moments(f)
        first = (w * cond_mean).sum(0)
        second = (w * (cond_mean.square() + cond_var)).sum(0)
        return first, (second - first.square()).clamp_min(0)

    def predictive_log_density(self, y, mean, var, num_points: int = 100) -> torch.Tensor:
        """log ∫ p(y | f) N(f; mean, var) df (appendix eq. 19) by quadrature with log-sum-exp."""
        return log_expectation_exp(lambda f: self.log_prob(y, f), mean, var, num_points)

    def predictive_quantiles(self, mean, var, probs, num_points: int = 100) -> torch.Tensor:
        """Quantiles [P, ...] of ∫ p(y | f) N(f; mean, var) df: the quadrature mixture inverted (flowgp.gp.prediction.mixture_quantiles)."""
        probs = check_probabilities(probs, mean)
        with torch.no_grad():
            f, w = gh_points(mean, var, num_points)
            return likelihood_mixture_quantiles(self, f, w, probs)

    def transform(self, f, x=None, sampling=None, generator=None):
        """The function value the density reads, f_K = G(f₀); the identity for a plain likelihood."""
        return f

    def latent_quantiles(self, mean, var, probs, x=None):
        """Quantiles [P, ...] of the transformed latent f_K under f₀ ~ N(mean, var) (f₀'s own here)."""
        return normal_quantiles(mean, var, probs)

    def kl_terms(self) -> list:
        """Global terms the bound subtracts (KL of the likelihood's own random parameters); none here."""
        return []


class GaussianLikelihood(Likelihood):
    """p(y | f) = N(y; f, σ²), σ² stored through a softplus with a floor (one noise per output).

    Args:
        noise: initial σ² of every output, in the units of the (standardised) targets; must exceed
            `noise_floor`. Default 0.05 (TGP appendix B.6).
        num_outputs: L, the number of outputs, each with its own σ².
        noise_floor: lower bound of σ² (the softplus constraint's floor).
        dtype: dtype of the parameter; default float64.
        device: device of the parameter (None: torch's default).

    Examples:
        >>> from flowgp import GaussianLikelihood
        >>> GaussianLikelihood(noise=0.1, num_outputs=2).noise.detach()
        tensor([0.1000, 0.1000], dtype=torch.float64)
    """

    def __init__(self, noise: float = DEFAULTS.noise, num_outputs: int = 1, noise_floor: float = 1e-6,
                 dtype: torch.dtype = torch.float64, device=None):
        super().__init__()
        if not noise > noise_floor:
            raise ValueError(f"noise must be > noise_floor={noise_floor}, got {noise}")
        self._positive = Positive(lower=noise_floor)
        raw = self._positive.inverse(torch.full((num_outputs,), float(noise), dtype=torch.float64))
        # built in float64 and cast once: `model.to(dtype)` later is exact for float64
        self.raw_noise = nn.Parameter(raw.to(dtype=dtype, device=device))

    @property
    def noise(self) -> torch.Tensor:
        """σ², shape [L] (broadcasts against [..., N, L])."""
        return self._positive(self.raw_noise)

    @noise.setter
    def noise(self, value) -> None:
        value = torch.as_tensor(value, dtype=self.raw_noise.dtype, device=self.raw_noise.device)
        with torch.no_grad():
            self.raw_noise.copy_(self._positive.inverse(value).expand_as(self.raw_noise))

    def log_prob(self, y, f):
        noise = self.noise
        return -0.5 * (_LOG_2PI + noise.log() + (y - f).square() / noise)

    def expected_log_prob(self, y, mean, var, num_points: int = 20):
        """Closed form: -½ log 2πσ² - ((y - μ)² + v) / 2σ²."""
        noise = self.noise
        return -0.5 * (_LOG_2PI + noise.log() + ((y - mean).square() + var) / noise)

    def log_prob_at_nodes(self, y, f, weights):
        """Σ_q w_q log N(y; f_q, σ²) = -½ (Σ_q w_q) log 2πσ² - Σ_q w_q (y - f_q)² / 2σ²: only the squared
        residual is formed per node (three passes over [Q, ...] forward instead of six)."""
        noise = self.noise
        return -0.5 * ((_LOG_2PI + noise.log()) * weights.sum(0) + (weights * (y - f).square()).sum(0) / noise)

    def conditional_moments(self, f):
        """E[y | f] and Var[y | f]."""
        return f, self.noise.expand_as(f)

    def predictive_moments(self, mean, var, num_points: int = 100):
        """Mean and variance of y* = f + ε under f ~ N(mean, var) (closed form; num_points is unused)."""
        return mean, var + self.noise

    def predictive_quantiles(self, mean, var, probs, num_points: int = 100):
        """Exact quantiles of N(mean, var + σ²), [P, ...]."""
        return normal_quantiles(mean, var + self.noise, probs)

    def predictive_log_density(self, y, mean, var, num_points: int = 100):
        """Closed form log N(y; μ, v + σ²)."""
        total = var + self.noise
        return -0.5 * (_LOG_2PI + total.log() + (y - mean).square() / total)

    def cdf(self, y, f):
        """P(Y <= y | f), used to invert mixture CDFs for predictive quantiles."""
        return torch.special.ndtr((y - f) / self.noise.sqrt())

    def sample(self, f, generator: torch.Generator | None = None):
        eps = torch.randn(f.shape, dtype=f.dtype, device=f.device, generator=generator)
        return f + self.noise.sqrt() * eps


# ----------------------------------------------------------------------------------------------------
# Classification likelihoods (TGP paper §5.2, appendix B.6: probit for binary, softmax for multiclass;
# robust max of Hernández-Lobato et al. 2011 for deep GP classification).
# ----------------------------------------------------------------------------------------------------
__all__ += ["BernoulliLikelihood", "SoftmaxLikelihood", "RobustMaxLikelihood"]


def _labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Integer class indices in [0, C) as int64 (accepts float tensors holding whole numbers)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor of class indices, got {type(y).__name__}")
    if y.is_floating_point():
        if not torch.all(y == y.round()):
            raise ValueError("y must hold integer class indices 0..C-1, got non-integer values")
        y = y.long()
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"y must hold class indices in [0, {num_classes}), got range [{int(y.min())}, {int(y.max())}]")
    return y


class BernoulliLikelihood(Likelihood):
    """p(y | f) = Φ((2y - 1) f) for y ∈ {0, 1} (probit link, TGP appendix B.6).

    `f` and `y` broadcast element-wise (e.g. f [Q, N, 1], y [N, 1]). The ELL has no closed form and uses
    Gauss-Hermite quadrature (base class); the predictive p(y=1) = Φ(μ / sqrt(1 + σ²)) is exact.

    See Also:
        :class:`flowgp.SVGPClassifier`, :class:`flowgp.TGPClassifier` (binary targets use it).
    """

    def log_prob(self, y, f):
        return torch.special.log_ndtr((2.0 * y - 1.0) * f)

    def predictive_prob(self, mean, var):
        """p(y* = 1) = ∫ Φ(f) N(f; μ, σ²) df = Φ(μ / sqrt(1 + σ²))."""
        return torch.special.ndtr(mean / torch.sqrt(1.0 + var))

    def predictive_log_density(self, y, mean, var, num_points: int = 100):
        """Closed form log Φ((2y - 1) μ / sqrt(1 + σ²))."""
        return torch.special.log_ndtr((2.0 * y - 1.0) * mean / torch.sqrt(1.0 + var))

    def conditional_moments(self, f):
        p = torch.special.ndtr(f)
        return p, p * (1.0 - p)


class SoftmaxLikelihood(Likelihood):
    """Categorical p(y = c | f) = softmax(f)_c over C independent latents (TGP appendix B.6).

    `f` has shape [..., C] (classes last) and y [...] holds class indices; log_prob returns [...].
    Expectations under q(f) = Π_c N(μ_c, σ²_c) use reparameterised Monte Carlo (S samples, batched).

    Args:
        num_classes: C ≥ 2, the number of classes (one latent GP each).

    See Also:
        :class:`flowgp.gp.likelihoods.RobustMaxLikelihood`; :class:`flowgp.SVGPClassifier` (``likelihood=``).
    """

    def __init__(self, num_classes: int):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        self.num_classes = num_classes

    def log_prob(self, y, f):
        y = _labels(y, self.num_classes)
        logp = torch.log_softmax(f, dim=-1)
        index = y.expand(logp.shape[:-1]).unsqueeze(-1)
        return torch.gather(logp, -1, index).squeeze(-1)

    def _samples(self, mean, var, num_samples, generator):
        eps = torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        return mean + var.clamp_min(0).sqrt() * eps

    def expected_log_prob(self, y, mean, var, num_samples: int = 20, generator=None):
        """(1/S) Σ_s log softmax(μ + σ ε_s)_y, ε_s ~ N(0, I): unbiased and reparameterised. Returns [...]."""
        return self.log_prob(y, self._samples(mean, var, num_samples, generator)).mean(0)

    def predictive_probs(self, mean, var, num_samples: int = 100, generator=None):
        """p(y* = c) ≈ (1/S) Σ_s softmax(f_s)_c; sums to one over the last dimension."""
        return torch.softmax(self._samples(mean, var, num_samples, generator), dim=-1).mean(0)

    def predictive_log_density(self, y, mean, var, num_samples: int = 100, generator=None):
        probs = self.predictive_probs(mean, var, num_samples, generator)
        y = _labels(y, self.num_classes)
        return torch.gather(probs, -1, y.unsqueeze(-1)).squeeze(-1).log()


class RobustMaxLikelihood(Likelihood):
    """Robust max (Hernández-Lobato et al. 2011): p(y = c | f) = 1 - ε if c = argmax f, else ε / (C - 1).

    With independent q(f_c) = N(μ_c, σ²_c), P(argmax f = y) = ∫ N(t; μ_y, σ²_y) Π_{c≠y} Φ((t - μ_c)/σ_c) dt,
    a one-dimensional integral done by Gauss-Hermite quadrature; then
    E[log p(y | f)] = P·log(1 - ε) + (1 - P)·log(ε / (C - 1)). `f` has shape [..., C], y [...].

    Args:
        num_classes: C ≥ 2, the number of classes (one latent GP each).
        epsilon: ε in (0, 1 - 1/C), the probability mass given to the other classes; default 1e-3.

    See Also:
        :class:`flowgp.gp.likelihoods.SoftmaxLikelihood`; :class:`flowgp.SVGPClassifier` (``likelihood=``).
    """

    def __init__(self, num_classes: int, epsilon: float = 1e-3):
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        if not 0.0 < epsilon < 1.0 - 1.0 / num_classes:
            raise ValueError(f"epsilon must lie in (0, 1 - 1/C) = (0, {1 - 1 / num_classes:.4g}), got {epsilon}")
        self.num_classes = num_classes
        self.epsilon = float(epsilon)

    def _log_levels(self):
        return math.log1p(-self.epsilon), math.log(self.epsilon / (self.num_classes - 1))

    def expected_log_prob_from_argmax_probability(self, p: torch.Tensor) -> torch.Tensor:
        """E[log p(y | f)] = P·log(1 - ε) + (1 - P)·log(ε/(C-1)) for P = P(argmax f = y) computed elsewhere
        (e.g. under warped latents, where P needs the flow: `TGPClassification`)."""
        hit, miss = self._log_levels()
        return p * hit + (1.0 - p) * miss

    def log_prob(self, y, f):
        y = _labels(y, self.num_classes)
        top = f.argmax(-1)
        hit, miss = self._log_levels()
        return torch.where(top == y, f.new_tensor(hit), f.new_tensor(miss))

    def prob_argmax(self, y, mean, var, num_points: int = 20):
        """P(argmax_c f_c = y) under independent Gaussians, [...] (quadrature over f_y)."""
        y = _labels(y, self.num_classes)
        std = var.clamp_min(1e-12).sqrt()
        idx = y.expand(mean.shape[:-1]).unsqueeze(-1)
        mu_y = torch.gather(mean, -1, idx)  # [..., 1]
        sd_y = torch.gather(std, -1, idx)
        nodes, weights = gauss_hermite_nodes(num_points, mean)
        weights = weights.squeeze(-1)  # [Q, 1, ...] against the class-free result [...]
        t = mu_y.unsqueeze(0) + sd_y.unsqueeze(0) * nodes  # [Q, ..., 1]
        log_cdf = torch.special.log_ndtr((t - mean.unsqueeze(0)) / std.unsqueeze(0))  # [Q, ..., C]
        # the class y itself must not enter the product
        own = torch.zeros_like(mean, dtype=torch.bool).scatter(-1, idx, True)
        log_cdf = log_cdf.masked_fill(own.unsqueeze(0), 0.0)
        return (weights * log_cdf.sum(-1).exp()).sum(0)

    def expected_log_prob(self, y, mean, var, num_points: int = 20):
        """E_q[log p(y | f)] = P·log(1 - ε) + (1 - P)·log(ε/(C-1)), P = P(argmax = y) by 1-D quadrature."""
        p = self.prob_argmax(y, mean, var, num_points)
        hit, miss = self._log_levels()
        return p * hit + (1.0 - p) * miss

    def predictive_probs(self, mean, var, num_points: int = 20):
        """p(y* = c) = ε/(C-1) + (1 - ε - ε/(C-1))·P(argmax = c), [..., C]; sums to one."""
        c = self.num_classes
        labels = torch.arange(c, device=mean.device).view((c,) + (1,) * (mean.dim() - 1))
        p = self.prob_argmax(labels, mean.unsqueeze(0).expand((c,) + mean.shape),
                             var.unsqueeze(0).expand((c,) + var.shape), num_points)  # [C, ...]
        p = p.movedim(0, -1)
        low = self.epsilon / (c - 1)
        return low + (1.0 - self.epsilon - low) * p

    def predictive_log_density(self, y, mean, var, num_points: int = 20):
        p = self.prob_argmax(y, mean, var, num_points)
        low = self.epsilon / (self.num_classes - 1)
        return (low + (1.0 - self.epsilon - low) * p).log()


def gauss_hermite_nodes(num_points: int, like: torch.Tensor):
    """Standard-normal nodes z_q and weights w_q shaped [Q, 1, ..., 1] to broadcast against `like` + [1]."""
    nodes, weights = gauss_hermite(num_points, like.dtype, like.device)
    shape = (num_points,) + (1,) * like.dim()
    return nodes.view(shape), weights.view(shape)


# ----------------------------------------------------------------------------------------------------
# The flow-warped likelihood of the transformed GP (TGP paper §3, eq. 2-3; appendix A.2.5, A.3, A.4)
# ----------------------------------------------------------------------------------------------------
def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class WarpedLikelihood(Likelihood):
    """p(y | f₀, x) = base(y | G_{θ(x)}(f₀)): a monotone flow G applied to the GP's latent f₀, then `base`.

    With q(f₀,n) = N(mean, var) from any sparse GP this gives the TGP bound and predictive (Maroñas et al.
    2021): ELL_n = E_{q(f₀,n)}[log base(y_n | G(f₀,n))] by Gauss-Hermite quadrature (appendix eq. 14), or
    exactly E_{N(a + b·mean, b²·var)}[log base(y | f)] when G(f) = a + b f (`closed_form_affine`); the
    predictive ∫ base(y* | G(f₀)) q(f₀) df₀ (appendix eq. 19) by quadrature, its quantiles by inverting the
    quadrature mixture CDF (`flowgp.gp.prediction.likelihood_mixture_quantiles`).

    Input-dependent flows G_{θ(x, W)} (paper §3.2-3.3, `flowgp.flows.conditional`) average S draws of the
    network weights W (appendix A.3): (1/S) Σ_s Σ_q w_q log base(y | G_{θ(x, W_s)}(f_q)), one batched tensor
    [Q, S, N, L]; predictions are the mixture of appendix eq. 20 over S draws (BA-TGP, VB) or one
    deterministic pass (PE-TGP); `kl_terms()` holds KL[q(W)||p(W)] (VB) or λ/2·||W||² (point / MC dropout),
    which the model subtracts from its bound.

    Args:
        flow: a Flow (or spec string) from the real line (f₀ takes every real value).
        base: the likelihood of y given the warped value (default GaussianLikelihood()).
        closed_form_affine: use the exact expectations when G is affine (same value, no quadrature).
        mc_samples_train: W draws per ELL evaluation in training mode (input-dependent flows).
        mc_samples_predict: W draws in predictions when every network predicts stochastically.
        mixture_quantile_points: nodes per W draw for quantiles with S > 1 draws: the quantile solver costs S·Q per
            point and step, and the Monte Carlo error over W dominates the quadrature error of 20 nodes.

    Every method that evaluates the density takes keyword `x` (the inputs, needed by input-dependent
    flows) and `sampling` (an object with `num_samples` and `stochastic`, e.g. flowgp.flows.WeightSampling,
    or a (num_samples, stochastic) pair; None: the defaults above) and `generator` (the torch.Generator of
    the W draws when `sampling` does not carry one).

    See Also:
        :class:`flowgp.TGP` (the model that uses it), :func:`flowgp.make_flow` (the flows).
    """

    accepts_inputs = True

    def __init__(self, flow: Flow | str = "identity", base: Likelihood | None = None, *,
                 closed_form_affine: bool = True, mc_samples_train: int = 1, mc_samples_predict: int = 100,
                 mixture_quantile_points: int = 20):
        super().__init__()
        mc_samples_train = _positive_int("mc_samples_train", mc_samples_train)
        mc_samples_predict = _positive_int("mc_samples_predict", mc_samples_predict)
        mixture_quantile_points = _positive_int("mixture_quantile_points", mixture_quantile_points)
        flow = make_flow(flow)  # a Flow is used as it is; a spec string is built; anything else: TypeError
        if flow.domain != "real":
            raise ValueError(
                f"flow '{flow.spec}' needs positive inputs but the GP prior f₀ takes every real value; "
                "use it as the likelihood warping of WarpedGP, or a positive-enforcing flow such as 'softplus'"
            )
        base = GaussianLikelihood() if base is None else base
        if not isinstance(base, Likelihood):
            raise TypeError(f"base must be a flowgp Likelihood, got {type(base).__name__}")
        if base.accepts_inputs:
            raise TypeError(f"base {type(base).__name__} depends on the inputs itself; compose the flows instead, "
                            "e.g. WarpedLikelihood(g1 >> g2, base)")
        self.flow = flow
        self.base = base
        self.closed_form_affine = bool(closed_form_affine)
        self.mc_samples_train = mc_samples_train
        self.mc_samples_predict = mc_samples_predict
        self.mixture_quantile_points = mixture_quantile_points

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "flow":
            # the input-dependent stages, found once: walking the module tree every step is per-step overhead
            object.__setattr__(self, "_stages", tuple(input_dependent_flows(value)))
            # whether the flow was found not affine: asking again costs every stage's parameter transforms
            # each step (the quadrature then gives the same value as a closed form would, to rounding)
            object.__setattr__(self, "_not_affine", False)

    # ------------------------------------------------------------------ input-dependent flows
    @property
    def input_dependent(self) -> bool:
        """Whether some stage of the flow takes its parameters from a network of x."""
        return bool(self._stages)

    def kl_terms(self) -> list:
        """[KL[q(W)||p(W)] or λ/2·||W||²] per network of an input-dependent stage (appendix A.3); [] without."""
        return [stage.network.penalty() for stage in self._stages]

    def draws(self, train: bool, sampling=None, generator: torch.Generator | None = None,
              batch_rows=None) -> WeightSampling:
        """How the networks draw W: `sampling` when given (a WeightSampling or a (S, stochastic) pair), else
        S = mc_samples_train stochastic draws in training, S = mc_samples_predict in predictions, or one
        deterministic pass (PE prediction) when some network predicts deterministically."""
        if isinstance(sampling, WeightSampling):
            return sampling
        if sampling is not None:
            num, stochastic = sampling
            return WeightSampling(num, bool(stochastic), generator, rows_share_draws=not train)
        if train:
            return WeightSampling(self.mc_samples_train, True, generator, batch_rows=batch_rows)
        if all(stage.network.stochastic_prediction for stage in self._stages):
            # predictions: each sample is one network for every row (row-order/subset invariant predictions)
            return WeightSampling(self.mc_samples_predict, True, generator, rows_share_draws=True)
        return WeightSampling(1, False, generator)

    def _nodes(self, mean, var, x, num_points: int, sampling: WeightSampling):
        """G_{θ(x, W_s)}(f_q) at Gauss-Hermite nodes of q(f₀): values [Q, S, N, L], weights [Q, 1, 1, 1]."""
        f, w = gh_points(mean, var, num_points)
        return self.flow(f.unsqueeze(1), x, validate=False, sampling=sampling), w.unsqueeze(1)

    def _affine(self, mean, var, x):
        """(a + b·mean, b²·var) when G(f) = a + b f (then q(G(f₀)) is Gaussian), else None."""
        if not self.closed_form_affine or self._stages or self._not_affine:
            return None
        coefficients = self.flow.affine_coefficients(x)
        if coefficients is None:
            object.__setattr__(self, "_not_affine", True)
            return None
        a, b = coefficients
        return a + b * mean, b.square() * var

    # ------------------------------------------------------------------ the density
    def transform(self, f, x=None, sampling=None, generator: torch.Generator | None = None):
        """f_K = G_{θ(x)}(f₀); input-dependent flows use one W draw per leading sample of f ([S, N, L])."""
        if not self._stages:
            return self.flow(f, x, validate=False)
        if sampling is None:
            sampling = self.draws(False, generator=generator)
            if sampling.stochastic:
                sampling = WeightSampling(f.shape[0], True, generator)
        return self.flow(f, x, validate=False, sampling=self.draws(False, sampling, generator))

    def log_prob(self, y, f, x=None, sampling=None):
        """log base(y | G(f)) (input-dependent flows: the network's own mode unless `sampling` is given)."""
        if sampling is None:
            return self.base.log_prob(y, self.flow(f, x, validate=False))
        return self.base.log_prob(y, self.flow(f, x, validate=False, sampling=self.draws(False, sampling)))

    def conditional_moments(self, f, x=None):
        """E[y | f₀] and Var[y | f₀] = the base's moments at G(f₀)."""
        return self.base.conditional_moments(self.flow(f, x, validate=False))

    def cdf(self, y, f, x=None):
        """P(Y <= y | f₀) = base.cdf(y, G(f₀))."""
        return self.base.cdf(y, self.flow(f, x, validate=False))

    def sample(self, f, x=None, generator: torch.Generator | None = None):
        """y ~ base(· | G(f₀))."""
        return self.base.sample(self.flow(f, x, validate=False), generator=generator)

    # ------------------------------------------------------------------ expectations under q(f₀)
    def expected_log_prob(self, y, mean, var, num_points: int = 20, *, x=None, sampling=None, generator=None,
                          batch_rows=None):
        """E_{q(f₀)}[log base(y | G(f₀))] (appendix eq. 14; averaged over S draws of W, appendix A.3).
        batch_rows: (offset, B) of these rows in a global batch split over processes (their dropout masks are
        then the whole batch's, sliced: flows.WeightSampling)."""
        if self._stages:
            g, w = self._nodes(mean, var, x, num_points, self.draws(self.training, sampling, generator, batch_rows))
            return self.base.log_prob_at_nodes(y, g, w).mean(0)
        affine = self._affine(mean, var, x)
        if affine is not None:
            return self.base.expected_log_prob(y, *affine)
        f, w = gh_points(mean, var, num_points)
        return self.base.log_prob_at_nodes(y, self.flow(f, x, validate=False), w)

    def predictive_moments(self, mean, var, num_points: int = 100, *, x=None, sampling=None, generator=None):
        """E[y*] and Var[y*] under ∫ base(y* | G(f₀)) q(f₀) df₀ by quadrature (paper §4.5; eq. 20 mixture)."""
        affine = self._affine(mean, var, x)
        if affine is not None:
            return self.base.predictive_moments(*affine)
        if not self._stages:
            return flow_predictive_moments(self.flow, self.base, mean, var, x, num_points)
        g, w = self._nodes(mean, var, x, num_points, self.draws(False, sampling, generator))
        cond_mean, cond_var = self.base.conditional_moments(g)
        first = (w * cond_mean).sum(0).mean(0)
        second = (w * (cond_mean.square() + cond_var)).sum(0).mean(0)
        return first, (second - first.square()).clamp_min(0)

    def predictive_log_density(self, y, mean, var, num_points: int = 100, *, x=None, sampling=None,
                               generator=None):
        """log ∫ base(y* | G(f₀)) q(f₀) df₀ (appendix eq. 19; eq. 20 over W draws), quadrature + log-sum-exp."""
        affine = self._affine(mean, var, x)
        if affine is not None:
            return self.base.predictive_log_density(y, *affine)
        if not self._stages:
            return flow_log_predictive_density(self.flow, self.base, y, mean, var, x, num_points)
        g, w = self._nodes(mean, var, x, num_points, self.draws(False, sampling, generator))
        log_terms = w.log() + self.base.log_prob(y, g)
        return torch.logsumexp(log_terms.flatten(0, 1), dim=0) - math.log(g.shape[1])

    def predictive_quantiles(self, mean, var, probs, num_points: int = 100, *, x=None, sampling=None,
                             generator=None):
        """Quantiles [P, ...] of the predictive mixture Σ_{q,s} (w_q / S) base(y* | G_s(f_q)) (flowgp.gp.prediction.mixture_quantiles)."""
        if not self._stages:
            return flow_mixture_quantiles(self.flow, self.base, mean, var, probs, x, num_points)
        probs = check_probabilities(probs, mean)
        with torch.no_grad():
            sampling = self.draws(False, sampling, generator)
            if sampling.num_samples > 1:
                num_points = min(num_points, self.mixture_quantile_points)
            g, w = self._nodes(mean, var, x, num_points, sampling)
            num_samples = g.shape[1]
            w = (w / num_samples).expand(-1, num_samples, *w.shape[2:]).flatten(0, 1)  # [Q·S, 1, ...]
            return likelihood_mixture_quantiles(self.base, g.flatten(0, 1), w, probs)

    def latent_quantiles(self, mean, var, probs, x=None):
        """Quantiles of f_K = G(f₀): exactly G(quantile of f₀), since G is increasing."""
        if not self._stages:
            return self.flow(normal_quantiles(mean, var, probs), x, validate=False)
        if self.draws(False).stochastic:
            raise NotImplementedError(
                "latent quantiles of a Bayesian input-dependent flow are a mixture over W; use sample_f, or "
                "switch the networks to bayesian='point' for the deterministic (PE-TGP) warping")
        return self.flow(normal_quantiles(mean, var, probs), x, validate=False,
                         sampling=WeightSampling(1, False))

    # ------------------------------------------------------------------ state dicts of the pre-likelihood TGP
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # TGP models saved before the flow moved into the likelihood stored the base likelihood's entries
        # directly under the likelihood ("likelihood.raw_noise"): read them as the base's. No warning: it is also
        # the layout of an SVGP's likelihood, whose state a TGP may load on purpose (a warm start)
        nest_entries(state_dict, prefix, "base", ("flow", "base"), None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# names of the likelihoods (the one name-to-class table; `flowgp.registry.LIKELIHOODS`)
LIKELIHOODS.register("gaussian", GaussianLikelihood, aliases=("normal",))
LIKELIHOODS.register("bernoulli", BernoulliLikelihood, aliases=("probit",))
LIKELIHOODS.register("softmax", SoftmaxLikelihood)
LIKELIHOODS.register("robustmax", RobustMaxLikelihood)
LIKELIHOODS.register("warped", WarpedLikelihood)
