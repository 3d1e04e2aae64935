"""Latent-variable deep GPs trained with importance-weighted VI (DGP-IWVI/DREG supplement, sections A, C, D, E).

A latent z_n ~ p(z) = N(0, I) is concatenated to x_n at the input of the first layer. With K samples
(z_{n,k}, f⁽¹⁾_k) per point, the partially collapsed bound of eq. A.9 is

    L_K = Σ_n E[ log (1/K) Σ_k w_{n,k} ] - Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)],
    log w_{n,k} = E_{q(f⁽ᴸ⁾ | f⁽ᴸ⁻¹⁾_k)}[log p(y_n | f⁽ᴸ⁾)] + log p(z_{n,k}) - log q(z_{n,k})       (C.16)

with the last layer's expectation in closed form for a Gaussian likelihood. Gradients of the q(z)
parameters φ are either the reparameterised IW gradient "reg" (C.17: plain autograd of L_K) or "dreg"
(D.23): Σ_k w̃_k² ∂log w_k/∂z_k ∂z_k/∂φ, w̃ the normalised weights, log q evaluated with φ held fixed.
DREG is implemented by (i) stopping the gradient through φ inside log q and (ii) a hook multiplying the
gradient reaching z_k by w̃_k (detached): autograd of L_K already carries w̃_k ∂log w_k/∂z_k there, and z
is the only path from φ into log w. Model, kernel and layer parameters never pass through z, so they
keep the usual IW gradient Σ_k w̃_k ∇ log w_k, and the returned value is L_K itself in both cases.

Layers follow the flowgp deep-GP layer protocol (`flowgp.models.deep_gp.GPLayer`):
`layer(h [S, N, D_in], generator=None) -> (sample, mean, var)`, each [S, N, D_out], and `layer.kl_divergence()`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..encoders import AmortizedLatentEncoder, FreeLatent, normal_log_prob
from ..likelihoods import GaussianLikelihood, Likelihood
from ..objective import minibatch_bound
from ..prediction import check_probabilities, gaussian_mixture_quantiles
from ._checks import as_inputs, as_targets

__all__ = ["LatentDeepGP", "build_latent_deep_gp", "GRADIENT_ESTIMATORS",
           "check_num_importance", "check_gradient"]

GRADIENT_ESTIMATORS = ("reg", "dreg")
#: cap on (samples × points × inducing) elements per chunk in prediction and diagnostics
_CHUNK_ELEMENTS = 2_000_000


def check_num_importance(value, name: str = "num_importance") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (the number K of importance samples), got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (K = 1 gives the plain ELBO), got {value}")
    return value


def check_gradient(value) -> str:
    if value not in GRADIENT_ESTIMATORS:
        raise ValueError(f"gradient must be one of {GRADIENT_ESTIMATORS}, got {value!r}")
    return value


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class LatentDeepGP(nn.Module):
    """Deep GP with a latent input z ~ N(0, I) concatenated to x, trained on the IW bound L_K (eq. A.9).

    Args:
        layers: deep-GP layers (first layer's input dimension D + latent_dim, last layer's output L).
        qz: q(z) module, `qz(x, y, indices) -> (mean [B, Q], std [B, Q])` (AmortizedLatentEncoder/FreeLatent).
        likelihood: Gaussian by default (the last layer's expectation is then in closed form).
        num_importance: default K in `elbo`.  gradient: default estimator for q(z), "reg" or "dreg".
    """

    def __init__(self, layers: Sequence[nn.Module], qz: nn.Module, likelihood: Likelihood | None = None,
                 num_importance: int = 1, gradient: str = "dreg"):
        super().__init__()
        if len(layers) < 1:
            raise ValueError("layers must hold at least one deep-GP layer")
        if not isinstance(qz, (AmortizedLatentEncoder, FreeLatent)):
            raise TypeError(f"qz must be an AmortizedLatentEncoder or FreeLatent, got {type(qz).__name__}")
        self.layers = nn.ModuleList(layers)
        self.qz = qz
        if likelihood is None:  # in the layers' dtype, whatever torch's default dtype is
            dtype = next((p.dtype for p in self.layers.parameters()), torch.float64)
            likelihood = GaussianLikelihood(noise=0.01).to(dtype)
        self.likelihood = likelihood
        self.num_importance = check_num_importance(num_importance)
        self.gradient = check_gradient(gradient)

    # ----- sizes -------------------------------------------------------------------------------------
    @property
    def latent_dim(self) -> int:
        return self.qz.latent_dim

    @property
    def amortized(self) -> bool:
        return isinstance(self.qz, AmortizedLatentEncoder)

    def validate(self, x, y=None):
        """x checked as [N, D] observed inputs (and y as [N, L] targets): x, or (x, y).

        Raises TypeError/ValueError naming the argument on a non-tensor, a wrong shape or non-finite values.
        """
        x = as_inputs(x, self.layers[0].input_dim - self.latent_dim)
        if y is None:
            return x
        num_outputs = y.shape[-1] if isinstance(y, torch.Tensor) and y.dim() == 2 else 1
        return x, as_targets(y, x.shape[0], num_outputs)

    # ----- forward pieces ----------------------------------------------------------------------------
    def kl_divergence(self) -> torch.Tensor:
        """Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)] over the layers."""
        return sum(layer.kl_divergence() for layer in self.layers)

    def last_layer_marginals(self, h: torch.Tensor, generator=None):
        """Propagate inputs h [T, B, D + Q] by sampling through all but the last layer (marginal trick);
        return the last layer's Gaussian marginals q(f⁽ᴸ⁾ | f⁽ᴸ⁻¹⁾) as (mean, var), each [T, B, L]."""
        for layer in self.layers[:-1]:
            h, _, _ = layer(h, generator=generator)
        _, mean, var = self.layers[-1](h, generator=generator)
        return mean, var

    def q_params(self, x, y, indices=None):
        """(μ, σ) of q(z_n) for the batch, each [B, Q]."""
        return self.qz(x, y, indices)

    def log_weights(self, x, y, num_importance: int, num_samples: int = 1, indices=None, q_params=None,
                    detach_q: bool = False, generator: torch.Generator | None = None):
        """log w_{s,k,n} of eq. C.16 for S outer × K importance samples: returns (log_w [S, K, B], z [S, K, B, Q]).

        `q_params` overrides (μ, σ) with tensors broadcasting to [S, B, Q] (used to take per-sample gradients);
        `detach_q` evaluates log q(z) with μ, σ held fixed (the DREG form, eq. D.23).
        """
        k = check_num_importance(num_importance)
        s = _check_positive_int(num_samples, "num_samples")
        mean, std = self.q_params(x, y, indices) if q_params is None else q_params
        b, q = x.shape[0], self.latent_dim
        mean = mean.expand(s, b, q).unsqueeze(1)  # [S, 1, B, Q]
        std = std.expand(s, b, q).unsqueeze(1)
        eps = torch.randn((s, k, b, q), dtype=x.dtype, device=x.device, generator=generator)
        z = mean + std * eps  # reparameterised (eq. C.13)
        h = torch.cat([x.expand(s * k, b, x.shape[-1]), z.reshape(s * k, b, q)], dim=-1)
        f_mean, f_var = self.last_layer_marginals(h, generator)
        ell = self.likelihood.expected_log_prob(y, f_mean, f_var).sum(-1).reshape(s, k, b)
        log_q = normal_log_prob(z, mean.detach(), std.detach()) if detach_q else normal_log_prob(z, mean, std)
        return ell + normal_log_prob(z) - log_q, z

    def iw_terms(self, x, y, num_importance: int, gradient: str = "reg", num_samples: int = 1, indices=None,
                 q_params=None, generator=None) -> torch.Tensor:
        """Per-sample, per-point log (1/K) Σ_k w_k, [S, B], whose gradient is the chosen estimator for q(z)."""
        gradient = check_gradient(gradient)
        dreg = gradient == "dreg"
        log_w, z = self.log_weights(x, y, num_importance, num_samples, indices, q_params, dreg, generator)
        if dreg and z.requires_grad:
            weights = torch.softmax(log_w.detach(), dim=1).unsqueeze(-1)  # w̃_k, [S, K, B, 1]
            # autograd brings w̃_k ∂log w_k/∂z_k to z_k; one more factor w̃_k gives eq. D.23
            z.register_hook(lambda g: g * weights)
        return torch.logsumexp(log_w, dim=1) - math.log(log_w.shape[1])

    # ----- objectives ---------------------------------------------------------------------------------
    def elbo(self, x, y, num_data: int | None = None, indices=None, num_importance: int | None = None,
             gradient: str | None = None, num_samples: int = 1,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Minibatch estimate of L_K (eq. A.9) scaled to the data set: (N/B) Σ_n mean_s log (1/K) Σ_k w - Σ KL.

        The per-point term is the log-mean-weight of `iw_terms`, assembled by `flowgp.objective.minibatch_bound`.
        Its value is L_K for both estimators; its gradient w.r.t. q(z)'s parameters is REG (C.17) or DREG (D.23).
        Every draw (z and the hidden layers) comes from `generator` (torch's global RNG when None).
        """
        x, y = self.validate(x, y)
        k = self.num_importance if num_importance is None else num_importance
        terms = self.iw_terms(x, y, k, self.gradient if gradient is None else gradient, num_samples, indices,
                              generator=generator)
        return minibatch_bound(terms.mean(0), [self.kl_divergence()], num_data, x.shape[0])

    def plain_elbo(self, x, y, num_data: int | None = None, indices=None, num_samples: int = 1,
                   analytic_kl: bool = False, generator=None) -> torch.Tensor:
        """Standard ELBO (eq. A.3 with the last layer collapsed): E_q[log F + log p(z) - log q(z)] - Σ KL.

        Monte Carlo over S samples (so with the same samples it equals L_1); `analytic_kl` uses the closed-form
        KL[q(z_n) || N(0, I)] instead of its one-sample estimate. Draws come from `generator`.
        """
        x, y = self.validate(x, y)
        log_w, z = self.log_weights(x, y, 1, num_samples, indices, generator=generator)
        if analytic_kl:
            mean, std = self.q_params(x, y, indices)
            kl_z = 0.5 * (mean.square() + std.square() - 1.0 - 2.0 * std.log()).sum(-1)  # [B]
            log_w = log_w - normal_log_prob(z) + normal_log_prob(z, mean, std) - kl_z
        return minibatch_bound(log_w.mean((0, 1)), [self.kl_divergence()], num_data, x.shape[0])

    # ----- prediction (z from the prior, supplement E.3) ----------------------------------------------
    def _chunk(self, num_points: int) -> int:
        m = max(getattr(layer, "num_inducing", 128) for layer in self.layers)
        return max(1, _CHUNK_ELEMENTS // max(1, num_points * m))

    def prior_marginals(self, x, num_samples: int, generator=None):
        """Last-layer marginals with z ~ p(z) = N(0, I): yields (mean, var) chunks of shape [s, N, L]."""
        x = self.validate(x)
        total = _check_positive_int(num_samples, "num_samples")
        chunk = self._chunk(x.shape[0])
        done = 0
        while done < total:
            s = min(chunk, total - done)
            z = torch.randn((s, x.shape[0], self.latent_dim), dtype=x.dtype, device=x.device, generator=generator)
            yield self.last_layer_marginals(torch.cat([x.expand(s, *x.shape), z], dim=-1), generator)
            done += s

    def log_predictive_density(self, x, y, num_samples: int = 1000, generator=None) -> torch.Tensor:
        """log p(y*_n | x*_n) ≈ log (1/S) Σ_s p(y*_n | z_s, f⁽ᴸ⁻¹⁾_s), z_s ~ p(z) (supplement E.3), [N].

        The last layer is integrated exactly (N(y; μ_s, v_s + σ²)), a lower-variance form of E.3's estimator.
        """
        x, y = self.validate(x, y)
        parts = []
        for mean, var in self.prior_marginals(x, num_samples, generator):
            parts.append(self.likelihood.predictive_log_density(y, mean, var).sum(-1))  # [s, N]
        log_p = torch.cat(parts, 0)
        return torch.logsumexp(log_p, 0) - math.log(log_p.shape[0])

    def predict(self, x, num_samples: int = 1000, generator=None):
        """Mean and variance of the (mixture) predictive p(y* | x*), each [N, L]."""
        first = second = 0.0
        count = 0
        for mean, var in self.prior_marginals(x, num_samples, generator):
            y_mean, y_var = self.likelihood.predictive_moments(mean, var)
            first = first + y_mean.sum(0)
            second = second + (y_var + y_mean.square()).sum(0)
            count += mean.shape[0]
        first, second = first / count, second / count
        return first, (second - first.square()).clamp_min(0)

    def sample_y(self, x, num_samples: int = 1, generator=None) -> torch.Tensor:
        """Draws y* ~ p(y* | x*) (multimodal through z): [num_samples, N, L]."""
        out = []
        for mean, var in self.prior_marginals(x, num_samples, generator):
            f = mean + var.sqrt() * torch.randn(mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
            out.append(self.likelihood.sample(f, generator=generator))
        return torch.cat(out, 0)

    def predict_quantiles(self, x, probs, num_samples: int = 1000, generator=None, iterations: int = 60):
        """Quantiles of the Gaussian-mixture predictive at `probs` by bisection of its CDF: [P, N, L]."""
        probs = check_probabilities(probs, x)
        with torch.no_grad():
            means, sds = [], []
            for mean, var in self.prior_marginals(x, num_samples, generator):
                means.append(mean)
                sds.append((var + self.likelihood.noise).sqrt())
            mean, sd = torch.cat(means, 0), torch.cat(sds, 0)  # [S, N, L]
            return gaussian_mixture_quantiles(mean, sd.square(), probs, iterations)


# ----- construction (supplement E.2) ------------------------------------------------------------------
def build_latent_deep_gp(
    x: torch.Tensor,
    y: torch.Tensor,
    num_layers: int,
    latent_dim: int = 1,
    num_inducing: int = 128,
    amortized: bool = True,
    hidden_width: int = 5,
    kernel: str = "rbf",
    noise: float = 0.01,
    num_importance: int = 1,
    gradient: str = "dreg",
    white_variance: float = 1e-6,
    q_var_init: float = 1e-5,
    kmeans_restarts: int = 10,
    learn_inducing: bool = True,
    seed: int = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device=None,
) -> LatentDeepGP:
    """A LatentDeepGP initialised as in supplement E.2.

    RBF-ARD kernels with lengthscales √D_in; M inducing inputs per layer from k-means of x (all of x when
    M ≥ N), the latent columns drawn from N(0, 1); hidden layers of `hidden_width` GPs with a fixed linear
    mean (first principal directions of the layer input, identity/zero-padded when widening); a zero-mean
    last layer; Gaussian likelihood with variance `noise` (0.01); q(z) amortized by the E.2 network or free.

    Every draw (the latent columns and the encoder's Glorot initialisation) comes from `generator` (a CPU
    generator), by default `torch.Generator().manual_seed(seed)` (`seed` also seeds k-means); torch's and
    NumPy's global RNGs are never touched. The model is built in x's dtype and moved to `dtype` / `device` at the end (default: x's).
    """
    from ..inducing import kmeans_inducing_points
    from .deep_gp import GPLayer, linear_mean_weight

    x = as_inputs(x)
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    y = as_targets(y, x.shape[0], y.shape[-1])
    num_layers = _check_positive_int(num_layers, "num_layers")
    if isinstance(latent_dim, bool) or not isinstance(latent_dim, int):
        raise TypeError(f"latent_dim must be an int, got {type(latent_dim).__name__}")
    if latent_dim < 1:
        raise ValueError(f"latent_dim must be >= 1 (the latent input's dimension), got {latent_dim}")
    check_num_importance(num_importance)
    check_gradient(gradient)
    hidden_width = _check_positive_int(hidden_width, "hidden_width")
    n, d = x.shape
    y_dim = y.shape[1]
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed))
    z_x = torch.as_tensor(kmeans_inducing_points(x, min(num_inducing, n), kmeans_restarts, seed), dtype=x.dtype)
    z_lat = torch.randn((z_x.shape[0], latent_dim), dtype=x.dtype, generator=generator)
    z_run = torch.cat([z_x, z_lat], dim=1).to(x.device)
    # the layer inputs' principal directions use a prior draw of the latent column
    x_run = torch.cat([x, torch.randn((n, latent_dim), dtype=x.dtype, generator=generator).to(x.device)], dim=1)
    layers = []
    for ell in range(num_layers):
        last = ell == num_layers - 1
        d_in = x_run.shape[1]
        d_out = y_dim if last else hidden_width
        weight = None if last else linear_mean_weight(x_run - x_run.mean(0), d_out)
        layer = GPLayer(z_run, d_out, kernel=kernel, mean_weight=weight,
                        white_variance=None if last else white_variance, lengthscale=math.sqrt(d_in),
                        q_var_init=q_var_init, learn_inducing=learn_inducing)
        layers.append(layer.to(device=x.device, dtype=x.dtype))
        if not last:
            x_run, z_run = x_run @ weight, z_run @ weight
    qz = AmortizedLatentEncoder(d, y_dim, latent_dim, generator=generator, dtype=x.dtype) if amortized \
        else FreeLatent(n, latent_dim, dtype=x.dtype)
    likelihood = GaussianLikelihood(noise=noise, num_outputs=y_dim)
    model = LatentDeepGP(layers, qz, likelihood, num_importance=num_importance, gradient=gradient)
    return model.to(device=x.device if device is None else device, dtype=x.dtype if dtype is None else dtype)
