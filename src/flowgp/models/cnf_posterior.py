"""Normalizing-flow posteriors q(U) over all deep-GP layers' inducing outputs (Yu et al. 2021, CNF-DGP).

U = G(V) with V ~ π(V), so log q(U) = log π(V) - log|det dG/dV| (CNF-DGP eq. 5) and the ELBO (eq. 6) is
estimated by Monte Carlo. Both flows act on the *whitened* inducing outputs v_ℓ (u_ℓ = L_ℓ v_ℓ with
L_ℓ Lᵀ_ℓ = K_{Z_ℓ Z_ℓ}); the whitening map is linear with a q-independent Jacobian, so KL[q(U) || p(U)] =
KL[q(V') || N(0, I)] and nothing else changes.

* `ConvolutionalFlowPosterior` (§III, Fig. 2): the layers' v_ℓ [M, d_ℓ] are stacked as an M × 1 × Σd_ℓ
  tensor (every layer must have the same M); each step is a 1×1 convolution with an invertible K × K
  kernel W, K = Σd_ℓ, parameterised as W = P L (U + diag(s)) (P a fixed permutation, L unit lower, U strict
  upper) so that log|det dG/dV| = M·Σ log|s_k| (eq. 8), followed by an element-wise sinh-arcsinh step per
  channel (Table 1 of the TGP paper) so that the family is non-Gaussian. The base π(V_ℓ) = N(μ_ℓ, diag σ²_ℓ)
  takes [μ_ℓ, σ_ℓ] = φ_ℓ(Z_ℓ) from a separate two-layer network per layer (256 hidden units, leaky ReLU; eq. 9).
* `LayerwiseFlowPosterior` (the naive design of Fig. 1, an ablation): one flow g_ℓ: R^{M d_ℓ} → R^{M d_ℓ}
  per layer (a dense LU-parameterised linear map and element-wise sinh-arcsinh steps) with a free
  mean-field base, no coupling between layers and no dependence on Z.

`sample(num_samples, inducing_inputs, generator)` returns ([v_ℓ of shape [S, d_ℓ, M]], log q(v) [S]).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..flows import SinhArcsinh

__all__ = ["LULinear", "ConvolutionalFlowPosterior", "LayerwiseFlowPosterior", "FLOW_BASES"]

#: bases π(V) of the convolutional flow: φ_ℓ(Z_ℓ) of eq. 9, or free parameters (ablation)
FLOW_BASES = ("network", "free")

_LOG_2PI = math.log(2.0 * math.pi)


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class LULinear(nn.Module):
    """Invertible linear map v ↦ W v on the last axis, W = P L (U + diag(sign·exp(log_s))); log|det W| = Σ log_s.

    Used on [..., M, K] tensors it is exactly a 1×1 convolution of an M × 1 × K tensor with a K × K kernel
    (CNF-DGP Fig. 2), whose log-Jacobian over all M·K entries is M·log|det W| (eq. 8).

    Args:
        dim: K.
        init: "identity" (W = I: the flow starts as the mean-field Gaussian base) or "orthogonal" (a random
            rotation, LU-factorised as in Glow).
        generator: RNG for the orthogonal init (torch's global RNG when None).
        dtype: dtype of the parameters (float64; cast the module afterwards for float32).
    """

    def __init__(self, dim: int, init: str = "identity", generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if init == "identity":
            perm = torch.arange(dim)
            lower = torch.zeros(dim, dim, dtype=dtype)
            upper = torch.zeros(dim, dim, dtype=dtype)
            diag = torch.ones(dim, dtype=dtype)
        elif init == "orthogonal":
            q, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=dtype, generator=generator))
            p, lower, upper = torch.linalg.lu(q)
            perm = p.argmax(-1)  # (P B)[i] = B[perm[i]]
            diag = torch.diagonal(upper).clone()
        else:
            raise ValueError(f"init must be 'identity' or 'orthogonal', got {init!r}")
        self.dim = dim
        self.register_buffer("perm", perm)
        self.register_buffer("sign", torch.sign(diag))
        self.register_buffer("_lower_mask", torch.ones(dim, dim, dtype=dtype).tril(-1), persistent=False)
        self.register_buffer("_eye", torch.eye(dim, dtype=dtype), persistent=False)
        self.lower = nn.Parameter(lower * self._lower_mask)
        self.upper = nn.Parameter(upper * self._lower_mask.mT)
        self.log_s = nn.Parameter(diag.abs().log())

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        lower = self.lower * self._lower_mask + self._eye
        upper = self.upper * self._lower_mask.mT + torch.diag(self.sign * self.log_s.exp())
        return lower, upper

    def weight(self) -> torch.Tensor:
        """W = P L (U + diag(s)), [K, K]."""
        lower, upper = self._factors()
        return (lower @ upper)[self.perm]

    def log_abs_det(self) -> torch.Tensor:
        """log|det W| = Σ_k log|s_k| in O(K)."""
        return self.log_s.sum()

    def forward(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W v along the last axis, log|det| of the whole map = (number of K-vectors)·log|det W|)."""
        copies = v[0].numel() // self.dim if v.dim() > 1 else 1
        lower, upper = self._factors()
        # (W v)ᵀ = vᵀ Uᵀ Lᵀ Pᵀ applied factor by factor: O(K²) per vector instead of forming W in O(K³), which
        # matters for the layer-wise flow where K = M·d_ℓ runs into the thousands
        out = (v @ upper.mT @ lower.mT)[..., self.perm]
        return out, copies * self.log_abs_det()

    def inverse(self, u: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve(self.weight(), u.unsqueeze(-1)).squeeze(-1)


class _FlowSteps(nn.Module):
    """G = ∘_i (sinh-arcsinh_i ∘ linear_i): `num_steps` linear steps, each followed (if nonlinear) by an
    element-wise sinh-arcsinh step with per-channel parameters (identity at initialisation)."""

    def __init__(self, dim: int, num_steps: int, nonlinear: bool, init: str, generator=None,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        self.linear = nn.ModuleList([LULinear(dim, init=init, generator=generator, dtype=dtype)
                                     for _ in range(num_steps)])
        # identity-initialised (no draws), so the cast to `dtype` is exact
        self.elementwise = nn.ModuleList([SinhArcsinh(param_shape=(dim,)).to(dtype) for _ in range(num_steps)]) \
            if nonlinear else nn.ModuleList()

    def forward(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(G(v), log|det dG/dv| per sample [S]) for v [S, ..., dim]."""
        logdet = v.new_zeros(v.shape[0])
        for i, lin in enumerate(self.linear):
            v, ld = lin(v)
            logdet = logdet + ld
            if len(self.elementwise):
                v, ld = self.elementwise[i].forward_and_log_det(v, validate=False)
                logdet = logdet + ld.reshape(ld.shape[0], -1).sum(-1)
        return v, logdet

    def inverse(self, u: torch.Tensor) -> torch.Tensor:
        for i in reversed(range(len(self.linear))):
            if len(self.elementwise):
                u = self.elementwise[i].inverse(u, validate=False)
            u = self.linear[i].inverse(u)
        return u


def _base_log_prob(eps: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """log N(μ + σ ε; μ, diag σ²) summed over all but the sample axis: Σ -½ε² - ½log 2π - log σ."""
    per = -0.5 * (eps.square() + _LOG_2PI) - scale.log()
    return per.reshape(per.shape[0], -1).sum(-1)


def _check_layers(layers) -> tuple[list[int], list[int], int]:
    layers = list(layers)
    if not layers:
        raise ValueError("a flow posterior needs at least one layer")
    dims, in_dims, ms = [], [], set()
    for i, layer in enumerate(layers):
        z = layer.gp.inducing_points
        if z.dim() != 2:
            raise ValueError(
                f"layer {i} has per-output inducing inputs {tuple(z.shape)}; flow posteriors need Z shared by "
                "the layer's outputs ([M, D_in])"
            )
        dims.append(layer.output_dim)
        in_dims.append(layer.input_dim)
        ms.add(z.shape[0])
    if len(ms) != 1:
        raise ValueError(
            f"layers have different numbers of inducing points {sorted(ms)}; the convolutional flow stacks them "
            "as an M x 1 x sum(d) tensor, so every layer needs the same M"
        )
    return dims, in_dims, ms.pop()


def _layers_dtype(layers) -> torch.dtype:
    """The dtype of the layers' inducing inputs: the flow's parameters are built in it."""
    return next(iter(layers)).gp.inducing_points.dtype


class _BaseNet(nn.Module):
    """φ(z) = W₂ LeakyReLU(W₁ z + b₁) / H + b₂: the two-layer network of eq. 9 with H hidden units.

    The 1/H on the read-out is a reparameterisation, not a different family: without it every Adam step moves
    each output by up to lr·Σ_h |h| (about a hundred times lr with H = 256), far too large for whitened inducing
    outputs of order one, and training stalls; with it an output moves by about lr per step, as a free
    parameter would.
    """

    def __init__(self, d_in: int, d_out: int, hidden: int = 256, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        # nn.Linear's own initialisation would draw from torch's global RNG: skip it and draw the same
        # distributions (Kaiming-uniform weight with a = √5, uniform bias ±1/√fan_in, as nn.Linear.reset_parameters)
        # from `generator`, in the same order, so a generator seeded like the global RNG gives the same network
        self.hidden = nn.utils.skip_init(nn.Linear, d_in, hidden, dtype=dtype)
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.hidden.weight, a=math.sqrt(5), generator=generator)
            bound = 1.0 / math.sqrt(d_in) if d_in > 0 else 0.0
            self.hidden.bias.uniform_(-bound, bound, generator=generator)
        self.readout = nn.Parameter(torch.empty(d_out, hidden, dtype=dtype).uniform_(-1.0, 1.0, generator=generator))
        self.bias = nn.Parameter(torch.zeros(d_out, dtype=dtype))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.hidden(z))
        return h @ self.readout.mT / self.readout.shape[-1] + self.bias


class ConvolutionalFlowPosterior(nn.Module):
    """CNF-DGP q(U) (§III): base N(φ_ℓ(Z_ℓ)) per layer, stacked to [M, Σd_ℓ], then 1×1 convolutions + SAL steps.

    Args:
        layers: the deep GP's GPLayers (read for widths, input widths and M; not stored).
        num_steps: number of 1×1-convolution steps (each followed by an element-wise step if `nonlinear`).
        nonlinear: add element-wise sinh-arcsinh steps (False with W = I gives exactly a mean-field Gaussian).
        hidden: width of the two-layer networks φ_ℓ (paper: 256).
        scale_init: initial base σ (√q_var_init, matching the Gaussian posterior's S = 1e-5 I).
        w_init: "identity" or "orthogonal" for the convolution kernels.
        generator: RNG of the networks' and the orthogonal kernels' initialisation (torch's global RNG when None).
        base: "network" (the paper's eq. 9: [μ_ℓ, σ_ℓ] = φ_ℓ(Z_ℓ)) or "free" (an ablation: μ and σ are free
            [M, Σd_ℓ] parameters, as in the layer-wise flow; the flow steps are the same).
        Parameters take the dtype of the layers' inducing inputs.
    """

    def __init__(self, layers: Sequence[nn.Module], num_steps: int = 2, nonlinear: bool = True, hidden: int = 256,
                 scale_init: float = math.sqrt(1e-5), w_init: str = "identity", generator=None,
                 base: str = "network"):
        super().__init__()
        layers = list(layers)
        self.dims, in_dims, self.num_inducing = _check_layers(layers)
        if not scale_init > 0:
            raise ValueError(f"scale_init must be > 0, got {scale_init}")
        if base not in FLOW_BASES:
            raise ValueError(f"base must be 'network' (eq. 9) or 'free', got {base!r}")
        self.base_kind = base
        dtype = _layers_dtype(layers)
        if base == "network":
            self.nets = nn.ModuleList([_BaseNet(d_in, 2 * d_out, hidden, generator, dtype)
                                       for d_in, d_out in zip(in_dims, self.dims)])
            with torch.no_grad():  # start near μ = 0, σ = scale_init (the Gaussian posterior's initial state)
                for net, d_out in zip(self.nets, self.dims):
                    net.bias[:d_out] = 0.0
                    net.bias[d_out:] = _inverse_softplus(scale_init)
        else:
            shape = (self.num_inducing, sum(self.dims))
            self.base_mean = nn.Parameter(torch.zeros(shape, dtype=dtype))
            self.base_raw_scale = nn.Parameter(torch.full(shape, _inverse_softplus(scale_init), dtype=dtype))
        self.flow = _FlowSteps(sum(self.dims), num_steps, nonlinear, w_init, generator, dtype)

    def base(self, inducing_inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """[μ, σ] of π(V), each [M, Σd_ℓ]: layer ℓ's channels from φ_ℓ(Z_ℓ) (eq. 9), or free parameters."""
        if len(inducing_inputs) != len(self.dims):
            raise ValueError(f"expected {len(self.dims)} inducing-input sets, got {len(inducing_inputs)}")
        if self.base_kind == "free":
            return self.base_mean, F.softplus(self.base_raw_scale) + 1e-10
        means, scales = [], []
        for net, z, d in zip(self.nets, inducing_inputs, self.dims):
            out = net(z)
            means.append(out[..., :d])
            scales.append(F.softplus(out[..., d:]) + 1e-10)
        return torch.cat(means, -1), torch.cat(scales, -1)

    def sample(self, num_samples: int, inducing_inputs: Sequence[torch.Tensor], generator=None):
        """([v_ℓ [S, d_ℓ, M]], log q(V) [S]) with log q = log π(V₀) - log|det dG/dV₀| (eq. 5)."""
        mean, scale = self.base(inducing_inputs)
        eps = torch.randn((int(num_samples),) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        v, logdet = self.flow(mean + scale * eps)  # [S, M, K]: the M x 1 x K tensor without its singleton axis
        log_q = _base_log_prob(eps, scale) - logdet
        return [part.mT for part in torch.split(v, self.dims, dim=-1)], log_q

    def log_prob(self, vs: Sequence[torch.Tensor], inducing_inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """log q(V) [S] of given whitened inducing outputs (v_ℓ [S, d_ℓ, M]), through the inverse flow."""
        u = torch.cat([v.mT for v in vs], -1)
        v0 = self.flow.inverse(u)
        _, logdet = self.flow(v0)
        mean, scale = self.base(inducing_inputs)
        return _base_log_prob((v0 - mean) / scale, scale) - logdet


class LayerwiseFlowPosterior(nn.Module):
    """The naive layer-wise flow of CNF-DGP Fig. 1 (ablation): independent g_ℓ on R^{M d_ℓ} per layer.

    Base N(μ_ℓ, diag σ²_ℓ) with free parameters; g_ℓ = `num_steps` dense LU-linear maps on the flattened
    M·d_ℓ vector, each followed by element-wise sinh-arcsinh steps if `nonlinear`. O((M d_ℓ)²) per sample.
    """

    def __init__(self, layers: Sequence[nn.Module], num_steps: int = 2, nonlinear: bool = True,
                 scale_init: float = math.sqrt(1e-5), w_init: str = "identity", generator=None):
        super().__init__()
        layers = list(layers)
        self.dims, _, self.num_inducing = _check_layers(layers)
        if not scale_init > 0:
            raise ValueError(f"scale_init must be > 0, got {scale_init}")
        m = self.num_inducing
        dtype = _layers_dtype(layers)
        self.base_mean = nn.ParameterList([nn.Parameter(torch.zeros(m * d, dtype=dtype)) for d in self.dims])
        self.base_raw_scale = nn.ParameterList(
            [nn.Parameter(torch.full((m * d,), _inverse_softplus(scale_init), dtype=dtype)) for d in self.dims]
        )
        self.flows = nn.ModuleList([_FlowSteps(m * d, num_steps, nonlinear, w_init, generator, dtype)
                                    for d in self.dims])

    def sample(self, num_samples: int, inducing_inputs=None, generator=None):
        """([v_ℓ [S, d_ℓ, M]], log q(V) [S]); the inducing inputs are not used by this design."""
        vs, log_q = [], 0.0
        for mean, raw, flow, d in zip(self.base_mean, self.base_raw_scale, self.flows, self.dims):
            scale = F.softplus(raw) + 1e-10
            eps = torch.randn((int(num_samples),) + mean.shape, dtype=mean.dtype, device=mean.device,
                              generator=generator)
            v, logdet = flow(mean + scale * eps)  # [S, M·d]
            log_q = log_q + _base_log_prob(eps, scale) - logdet
            vs.append(v.reshape(v.shape[0], self.num_inducing, d).mT)
        return vs, log_q
