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
* `GaussianConvolutionalFlowPosterior` (flowgp's default `posterior="cnf"`): the same convolutional steps
  over a *full-covariance* whitened Gaussian base per layer and output, N(m_ℓd, R_ℓd R_ℓdᵀ) over the M
  inducing values - DSVI's parameterisation, read from the layers' own q(v_ℓ) - so that with identity steps
  (the initialisation) q(U) *is* the DSVI posterior. The KL splits into DSVI's closed form and a Monte Carlo
  term of what the flow T changes (zero at the identity):
      KL[q(U) || p(U)] = KL[q(V) || N(0, I)] - E_q(V)[log|det dT/dV|] - E_q(V)[log N(T(V); 0, I) - log N(V; 0, I)].
  The paper's design (`ConvolutionalFlowPosterior`, diagonal base from φ(Z), one shared draw of U per step)
  stays available as `posterior="cnf-paper"`.
* `LayerwiseFlowPosterior` (the naive design of Fig. 1, an ablation): one flow g_ℓ: R^{M d_ℓ} → R^{M d_ℓ}
  per layer (a dense LU-parameterised linear map and element-wise sinh-arcsinh steps) with a free
  mean-field base, no coupling between layers and no dependence on Z.

`sample(num_samples, inducing_inputs, generator)` returns ([v_ℓ of shape [S, d_ℓ, M]], log q(v) [S]) for the
paper's and the layer-wise flows; the Gaussian-base flow's `draw(layers, num_draws, generator)` returns draws in
the channels-first layout [d_ℓ, M, P] that the per-point bound uses, and its KL split in two.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..flows import SinhArcsinh
from ..numerics.constraints import inv_softplus, softplus_positive

__all__ = ["LULinear", "ConvolutionalFlowPosterior", "GaussianConvolutionalFlowPosterior", "LayerwiseFlowPosterior",
           "FLOW_BASES", "ELEMENTWISE_SHAPES", "standard_normal"]

#: bases π(V) of the convolutional flow: φ_ℓ(Z_ℓ) of eq. 9, or free parameters (ablation)
FLOW_BASES = ("network", "free")
#: parameter sharing of the Gaussian-base flow's element-wise steps: one (a, b) per channel (the paper's) or per entry
ELEMENTWISE_SHAPES = ("channel", "entry")

_LOG_2PI = math.log(2.0 * math.pi)
#: lower bound added to the base distribution's scales σ = softplus(raw) + SCALE_LOWER (keeps log σ finite)
SCALE_LOWER = 1e-10


def standard_normal(shape, like: torch.Tensor, generator=None) -> torch.Tensor:
    """N(0, 1) draws in `like`'s dtype and device for the many per-point draws of U; float64 ones are drawn in
    float32 and widened: a float32 draw is still an exact N(0, 1) sample up to its rounding (2⁻²⁴ relative), and
    torch's CPU sampler is ~5x faster in float32 than in float64 (lower precisions are drawn as they are)."""
    dtype = torch.float32 if like.dtype == torch.float64 else like.dtype
    return torch.randn(tuple(shape), dtype=dtype, device=like.device, generator=generator).to(like.dtype)


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

    def forward_channels_first(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W v along the *first* axis, v [K, ...], and log|det W| of one K-vector).

        The same 1×1 convolution as `forward` for tensors laid out [K, M, P] (channels, inducing points, draws):
        one [K, K] x [K, M·P] product, no transposes. The log-determinant of the whole map is
        (number of K-vectors)·log|det W| (eq. 8); the caller multiplies by M (it is the same for every draw).
        """
        if v.shape[0] != self.dim:
            raise ValueError(f"v must have {self.dim} channels on its first axis, got shape {tuple(v.shape)}")
        out = (self.weight() @ v.reshape(self.dim, -1)).reshape(v.shape)
        return out, self.log_abs_det()


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
                    net.bias[d_out:] = inv_softplus(scale_init)
        else:
            shape = (self.num_inducing, sum(self.dims))
            self.base_mean = nn.Parameter(torch.zeros(shape, dtype=dtype))
            self.base_raw_scale = nn.Parameter(torch.full(shape, inv_softplus(scale_init), dtype=dtype))
        self.flow = _FlowSteps(sum(self.dims), num_steps, nonlinear, w_init, generator, dtype)

    def base(self, inducing_inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """[μ, σ] of π(V), each [M, Σd_ℓ]: layer ℓ's channels from φ_ℓ(Z_ℓ) (eq. 9), or free parameters."""
        if len(inducing_inputs) != len(self.dims):
            raise ValueError(f"expected {len(self.dims)} inducing-input sets, got {len(inducing_inputs)}")
        if self.base_kind == "free":
            return self.base_mean, softplus_positive(self.base_raw_scale, SCALE_LOWER)
        means, scales = [], []
        for net, z, d in zip(self.nets, inducing_inputs, self.dims):
            out = net(z)
            means.append(out[..., :d])
            scales.append(softplus_positive(out[..., d:], SCALE_LOWER))
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


class _SinhArcsinhFunction(torch.autograd.Function):
    """T(x) = sinh(b·asinh(x) - a) element-wise with the per-draw log-Jacobian Σ log T'(x), fused, hand-written backward.

    x [K, M, P] (P draws), a and b broadcastable [K, M or 1, 1]. log T'(x) = log b + log cosh z - ½ log(1 + x²),
    z = b·asinh(x) - a (TGP Table 1). The backward uses
        ∂T/∂x = b cosh z / r,  ∂logT'/∂x = b tanh z / r - x / r²,  r = √(1 + x²),
        ∂T/∂a = -cosh z,       ∂logT'/∂a = -tanh z,
        ∂T/∂b = s cosh z,      ∂logT'/∂b = 1/b + s tanh z,   s = asinh x.
    Autograd through torch.asinh / sinh / log-cosh costs several times more on the K·M·P entries of the per-point
    draws (torch.asinh alone is slow on CPU; here asinh x = sign(x)·log(|x| + r), absolute error ~1e-16), and
    the forward/backward use in-place passes where they can: the step is memory-bound.
    """

    @staticmethod
    def forward(ctx, x, a, b):
        r = (x * x).add_(1.0).sqrt_()
        s = (x.abs() + r).log_().copysign_(x)  # asinh(x), absolute error ~1e-16
        z = torch.addcmul(-a, b, s)
        out, cosh = torch.sinh(z), torch.cosh(z)
        q = cosh / r  # T'(x) / b
        # Σ_entries log b: each (a, b) pair is shared by numel / (P·b.numel()) entries of a draw
        shared = x.numel() // x.shape[-1] // b.numel()
        logdet = q.log().sum((0, 1)) + shared * b.log().sum()
        ctx.save_for_backward(x, s, r, cosh, q, out, a, b)
        return out, logdet

    @staticmethod
    def backward(ctx, g_out, g_logdet):
        x, s, r, cosh, q, out, a, b = ctx.saved_tensors
        g_out = torch.zeros_like(x) if g_out is None else g_out
        g_logdet = x.new_zeros(x.shape[-1]) if g_logdet is None else g_logdet
        tanh = out / cosh
        gl = g_logdet.reshape((1,) * (x.dim() - 1) + (-1,))
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            # b·(ḡ_T cosh z + ḡ_L tanh z)/r - ḡ_L x/r²
            t = (tanh * b).sub_(x / r).div_(r).mul_(gl)
            grad_x = (g_out * q).mul_(b).add_(t)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            u = torch.addcmul(g_out * cosh, gl, tanh)  # ḡ_T cosh z + ḡ_L tanh z
            if ctx.needs_input_grad[1]:
                grad_a = -u.sum_to_size(a.shape)
            if ctx.needs_input_grad[2]:
                shared = x.numel() // x.shape[-1] // b.numel()
                grad_b = (s * u).sum_to_size(b.shape) + shared * g_logdet.sum() / b
        return grad_x, grad_a, grad_b


class SinhArcsinhStep(nn.Module):
    """Element-wise T(x) = sinh(b·asinh(x) - a) on [K, M, P] draws, b = exp(log_b); identity (a = 0, b = 1) at init.

    `param_shape` [K, M, 1] gives each inducing value and channel its own (a, b); [K, 1, 1] one pair per channel.
    `forward(x) -> (T(x), Σ log T'(x) per draw [P])`.
    """

    def __init__(self, param_shape, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(param_shape, dtype=dtype))
        self.log_b = nn.Parameter(torch.zeros(param_shape, dtype=dtype))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _SinhArcsinhFunction.apply(x, self.a, self.log_b.exp())

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """x = sinh((asinh(y) + a) / b)."""
        return torch.sinh((torch.asinh(y) + self.a) / self.log_b.exp())


class GaussianConvolutionalFlowPosterior(nn.Module):
    """q(U) = T_#N(m, R Rᵀ): DSVI's whitened Gaussian base per layer and output, then convolutional flow steps.

    V_ℓd ~ N(m_ℓd, R_ℓd R_ℓdᵀ) over the M whitened inducing values of output d of layer ℓ (the layer's own
    `q_mu`, `q_sqrt`: DSVI's parameterisation, so a fitted DSVI model is a valid starting point); the layers'
    draws are stacked channels-first as a K × M tensor, K = Σd_ℓ, and pushed through `num_steps` steps, each
    a 1×1 convolution W (K × K, LU-parameterised, coupling the layers' outputs: CNF-DGP Fig. 2, eq. 8) followed
    by an element-wise sinh-arcsinh step (TGP Table 1) when `nonlinear`. Every step starts at the identity, so
    at initialisation q(U) is exactly DSVI's Gaussian q(U).

    The KL is split (see the module docstring): `gaussian_kl(layers)` is DSVI's closed form, and the flow's
    correction per draw is c(V) = -log|det dT/dV| - [log N(T(V); 0, I) - log N(V; 0, I)] (= 0 when T = id),
    so KL = gaussian_kl + E[c(V)].

    Args:
        layers: the deep GP's GPLayers (read for widths and M; their q(v) is the base, read at every draw).
        num_steps: convolution steps (each followed by an element-wise step if `nonlinear`).
        nonlinear: add the element-wise sinh-arcsinh steps.
        elementwise: "entry" (default: one (a, b) pair per inducing value and channel, K·M pairs, so each
            inducing value's marginal can be skewed or tailed on its own) or "channel" (one pair per channel,
            the paper's parameter sharing).
    """

    #: DeepGP reads the base from its layers' q(v) (and keeps those parameters trainable)
    gaussian_base = True

    def __init__(self, layers: Sequence[nn.Module], num_steps: int = 2, nonlinear: bool = True,
                 elementwise: str = "entry"):
        super().__init__()
        layers = list(layers)
        self.dims, _, self.num_inducing = _check_layers(layers)
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
        if elementwise not in ELEMENTWISE_SHAPES:
            raise ValueError(f"elementwise must be one of {ELEMENTWISE_SHAPES}, got {elementwise!r}")
        dtype = _layers_dtype(layers)
        k = sum(self.dims)
        self.linear = nn.ModuleList([LULinear(k, init="identity", dtype=dtype) for _ in range(num_steps)])
        shape = (k, self.num_inducing, 1) if elementwise == "entry" else (k, 1, 1)
        self.elementwise = nn.ModuleList([SinhArcsinhStep(shape, dtype) for _ in range(num_steps)]) \
            if nonlinear else nn.ModuleList()

    def is_identity(self) -> bool:
        """Whether every step is exactly the identity (all parameters 0 and the LU signs +1), so q(U) is the base."""
        with torch.no_grad():
            return all(bool((lin.sign > 0).all()) for lin in self.linear) and \
                not any(bool(p.any()) for p in self.parameters())

    def gaussian_kl(self, layers: Sequence[nn.Module]) -> torch.Tensor:
        """KL[q(V) || N(0, I)] of the Gaussian base in closed form (TGP appendix eq. 9), summed over layers."""
        return sum(layer.kl_divergence() for layer in layers)

    def base_draws(self, layers: Sequence[nn.Module], num_draws: int, generator=None) -> torch.Tensor:
        """V = m + R ε for every layer and output, stacked channels-first: [K, M, P] (P = num_draws).

        One [d_ℓ, M, M] x [d_ℓ, M, P] product per layer (a batched GEMM over the outputs).
        """
        layers = list(layers)
        if [layer.output_dim for layer in layers] != self.dims:
            raise ValueError(f"layers have widths {[layer.output_dim for layer in layers]}, the flow was built "
                             f"for {self.dims}")
        eps = standard_normal((sum(self.dims), self.num_inducing, int(num_draws)), layers[0].gp.q_mu, generator)
        parts = []
        for layer, e in zip(layers, torch.split(eps, self.dims, dim=0)):
            parts.append(torch.baddbmm(layer.gp.q_mu.unsqueeze(-1), layer.gp.q_sqrt_tril(), e))  # [d_ℓ, M, P]
        return torch.cat(parts, 0)

    def transform(self, v0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T(V), log|det dT/dV| per draw [P]) for V [K, M, P] (channels-first)."""
        m = v0.shape[1]
        v = v0
        logdet = v0.new_zeros(v0.shape[-1])
        for i, lin in enumerate(self.linear):
            v, ld = lin.forward_channels_first(v)
            logdet = logdet + m * ld  # eq. 8: M·log|det W| for each draw
            if len(self.elementwise):
                v, ld = self.elementwise[i](v)
                logdet = logdet + ld
        return v, logdet

    def draw(self, layers: Sequence[nn.Module], num_draws: int, generator=None):
        """([v_ℓ [d_ℓ, M, P]], Gaussian KL (scalar), flow correction c(V) per draw [P]).

        KL[q(U) || p(U)] = gaussian KL + E[c(V)]; an unbiased estimate averages c over the P draws.
        """
        return self.push(layers, self.base_draws(layers, num_draws, generator))

    def push(self, layers: Sequence[nn.Module], v0: torch.Tensor):
        """([T(V)_ℓ [d_ℓ, M, P]], Gaussian KL, c(V) [P]) for given base draws V [K, M, P] (channels-first).

        For draws of the base made elsewhere (the locally reparameterised draws of `DeepGP`, draws="coupled").
        """
        v, logdet = self.transform(v0)
        # log N(T(V); 0, I) - log N(V; 0, I) = -½ Σ (T(V)² - V²): the constants cancel
        correction = 0.5 * (v.square() - v0.square()).sum((0, 1)) - logdet
        return list(torch.split(v, self.dims, dim=0)), self.gaussian_kl(layers), correction

    def sample(self, num_samples: int, layers: Sequence[nn.Module], generator=None):
        """([v_ℓ [S, d_ℓ, M]], KL estimate): S draws in the layout of the other posteriors' `sample`."""
        vs, kl, correction = self.draw(layers, num_samples, generator)
        return [v.permute(2, 0, 1) for v in vs], kl + correction.mean()


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
            [nn.Parameter(torch.full((m * d,), inv_softplus(scale_init), dtype=dtype)) for d in self.dims]
        )
        self.flows = nn.ModuleList([_FlowSteps(m * d, num_steps, nonlinear, w_init, generator, dtype)
                                    for d in self.dims])

    def sample(self, num_samples: int, inducing_inputs=None, generator=None):
        """([v_ℓ [S, d_ℓ, M]], log q(V) [S]); the inducing inputs are not used by this design."""
        vs, log_q = [], 0.0
        for mean, raw, flow, d in zip(self.base_mean, self.base_raw_scale, self.flows, self.dims):
            scale = softplus_positive(raw, SCALE_LOWER)
            eps = torch.randn((int(num_samples),) + mean.shape, dtype=mean.dtype, device=mean.device,
                              generator=generator)
            v, logdet = flow(mean + scale * eps)  # [S, M·d]
            log_q = log_q + _base_log_prob(eps, scale) - logdet
            vs.append(v.reshape(v.shape[0], self.num_inducing, d).mT)
        return vs, log_q
