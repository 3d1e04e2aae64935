"""Aligned warped multi-output GP (AMO-GP; Kaiser et al. 2018) with nested variational compression.

Output d is y_d = g_d(f_d(a_d(x))) + b_d + noise (b_d a learned constant per output) with (supplement eq. 9)
    a_d = â_d(x) + ε_a,  â_d ~ GP(x, k_a,d)       alignment, prior mean the identity, noise σ²_a,d
    f_d = f̂_d(a) + ε_f,  f̂ ~ CP(T_{d,r}, w_r)   shared convolution-process layer (flowgp.models.amogp.convolution)
    y_d = ĝ_d(f_d) + ε_y, ĝ_d ~ GP(f, k_g,d)     warping, prior mean the identity, noise σ²_y,d
with whitened inducing variables for every alignment, one set per output for the CP layer and every warping.

Bound (supplement eqs. 11-22, re-derived here for identity mean functions). Each layer sees its input as
q(h_n) = N(μ_n, v_n) and, with α = K_uu⁻¹ m_u, C = K_uu⁻¹ S_u K_uu⁻¹ and the Ψ-statistics ψ, Ψ, Φ of
flowgp.models.amogp.psi_statistics, has the exact moments of its noise-free output ĥ_n
    mean_n = [μ_n] + Ψ_n α
    var_n  = ψ_n - tr(K_uu⁻¹ Φ_n) + tr(Φ_n (ααᵀ + C)) - (Ψ_n α)² [+ v_n + 2 (Ξ_n α - μ_n Ψ_n α)]
(bracketed terms only with an identity mean; Ξ = E[h k(h, Z)]). Pointwise Jensen bounds on p(h | u) (eq. 12),
Jensen over q(h_{n}) (eq. 19) and integration of u against q(u) give
    L = Σ_n [ -½ log 2πσ²_y - ((y_n - mean_n^g)² + var_n^g)/(2σ²_y)
              - (var_n^a - Ψ_n^a C_a Ψ_n^aᵀ)/(2σ²_a) - (var_n^f - Ψ_n^f C_f Ψ_n^fᵀ)/(2σ²_f) ]
        - Σ KL[q(u) || p(u)],
and the next layer's input is q(h_n) = N(mean_n, σ² + Ψ_n C Ψ_nᵀ). Here var - ΨCΨᵀ is the sum of eq. 22's
trace terms (ψ - tr(K⁻¹Φ)) + tr((Φ - ΨᵀΨ)K⁻¹(mmᵀ + S)K⁻¹). With a deterministic input (the alignment layer)
Φ = ΨᵀΨ and this is eq. 15. The bound is a sum over points, so it is minibatched with the N/B scaling.

Predictions (A.4): the propagated Gaussian approximation matches the exact moments of each layer given a
Gaussian input (var_n above plus the layer noise), layer by layer; `sample` draws through the hierarchy
(u ~ q(u) per sample, then each layer's conditional at the sampled inputs), which also gives a Monte Carlo
log predictive density.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from ...gp.defaults import DEFAULTS
from ...compat import convert_entries
from ...numerics.constraints import Positive, softplus_positive
from .convolution import ConvolutionKernel, check_output_index
from ...gp.kernels import LENGTHSCALE_CONSTRAINT, RBF, VARIANCE_CONSTRAINT, Scale
from ...numerics.linalg import cholesky_gradient_to_matrix, lower_inverse, robust_cholesky
from ...gp.objective import minibatch_bound
from .psi_grid import grid_psi_statistics
from .psi_statistics import exp_or_zero, gaussian_psi1, grouped_psi_statistics, own_group_psi_statistics
from ...gp.variational import WhitenedGaussian, gaussian_kl_whitened
from ..protocol import TrainsItsBound

__all__ = ["AMOGP", "InducingSet", "Posterior", "layer_curves"]

_NOISE = Positive(lower=1e-8)
_INDUCING_LS = Positive(lower=1e-6)  # smoothing lengthscales of the latent inducing variables (cp_inducing="latent")


class Posterior(NamedTuple):
    """Kernel-space q(u) of G inducing sets (`InducingSet.bound_posterior`), each batched over G.

    Args:
        alpha: [G, M], α = K⁻¹ m_u.
        cov: [G, M, M], C = K⁻¹ S_u K⁻¹.
        delta: [G, M, M], Δ = C - K⁻¹.
        weight: [G, M, M], W = ααᵀ + C - K⁻¹.
        kl: [], Σ_g KL[q(u_g) || p(u_g)] (None: counted in another layer's entry).
        chol: [G, M, M], L with K_uu = LLᵀ (not differentiable).

    See Also:
        :class:`flowgp.models.amogp.InducingSet`.
    """
    alpha: torch.Tensor  # [G, M]     α = K⁻¹ m_u
    cov: torch.Tensor  # [G, M, M]    C = K⁻¹ S_u K⁻¹
    delta: torch.Tensor  # [G, M, M]  Δ = C - K⁻¹
    weight: torch.Tensor  # [G, M, M] W = ααᵀ + C - K⁻¹
    kl: torch.Tensor | None  # []     Σ_g KL[q(u_g) || p(u_g)] (None: counted in another layer's entry)
    chol: torch.Tensor  # [G, M, M]   L (K_uu = LLᵀ), not differentiable


class _WhitenedPosterior(torch.autograd.Function):
    """(α, C, Δ, W, KL, L) of G whitened inducing sets, with a backward written by hand.

    With K_uu = L Lᵀ (robust_cholesky, jitter included), X = L⁻¹, u = L v and q(v) = N(m, S), S = R Rᵀ:
        α = K⁻¹ m_u = Xᵀ m,   C = K⁻¹ S_u K⁻¹ = Xᵀ S X,   Δ = C - Xᵀ X,   W = ααᵀ + Δ,
        KL = ½ Σ_g (tr S + mᵀm - M - log|S|)                          (TGP appendix eq. 9, gaussian_kl_whitened).
    Backward: with the upstream gradients folded onto (α, C, K⁻¹), ᾱ' = ᾱ + (W̄ + W̄ᵀ)α, Δ̄' = Δ̄ + W̄, C̄' = C̄ + Δ̄'
    and K̄⁻¹ = -Δ̄', and P = X (C̄' + C̄'ᵀ) Xᵀ,
        ∂/∂m = X ᾱ' + k̄ m,   ∂/∂R = P R + k̄ (R - diag(1/R_ii)),
        Lᵀ ∂/∂L = H = -m (X ᾱ')ᵀ - S P + X (Δ̄' + Δ̄'ᵀ) Xᵀ    (dX = -X dL X, and L X = I),
    and ∂/∂K_uu = Xᵀ Ψ(H) X (`flowgp.numerics.linalg.cholesky_gradient_to_matrix`). One node with a few [M, M] products
    in place of autograd's graph through the factorisation, the inverses, their products and the KL.
    """

    @staticmethod
    def forward(ctx, kuu, q_mu, q_sqrt, jitter, segments):
        if segments is None:
            chol = robust_cholesky(kuu, jitter=jitter)
        else:
            # several layers' sets in one batch: factorised together when the first attempt succeeds for all,
            # and each on its own otherwise, so that one layer's retry does not add jitter to the others
            try:
                chol = robust_cholesky(kuu, jitter=jitter, max_tries=1)
            except RuntimeError:
                chol = torch.cat([robust_cholesky(part, jitter=jitter) for part in kuu.split(segments)])
        x = lower_inverse(chol)
        xt = x.mT
        alpha = torch.bmm(xt, q_mu.unsqueeze(-1)).squeeze(-1)
        lr = torch.bmm(xt, q_sqrt)
        cov = torch.bmm(lr, lr.mT)
        delta = torch.baddbmm(cov, xt, x, alpha=-1.0)  # C - K⁻¹
        weight = torch.baddbmm(delta, alpha.unsqueeze(-1), alpha.unsqueeze(-2))
        kl = gaussian_kl_whitened(q_mu, q_sqrt)
        ctx.save_for_backward(x, chol, q_mu, q_sqrt, alpha)
        ctx.mark_non_differentiable(chol)
        ctx.set_materialize_grads(False)
        return alpha, cov, delta, weight, kl, chol

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_alpha, g_cov, g_delta, g_weight, g_kl, _):
        x, chol, q_mu, q_sqrt, alpha = ctx.saved_tensors
        if g_weight is not None:
            g_w_alpha = torch.bmm(g_weight + g_weight.mT, alpha.unsqueeze(-1)).squeeze(-1)
            g_alpha = g_w_alpha if g_alpha is None else g_alpha + g_w_alpha
            g_delta = g_weight if g_delta is None else g_delta + g_weight
        g_c = g_delta if g_cov is None else (g_cov if g_delta is None else g_cov + g_delta)
        grad_m = grad_r = h = None
        if g_c is not None:
            # X (C̄' + C̄'ᵀ) Xᵀ and X (Δ̄' + Δ̄'ᵀ) Xᵀ as one batched pair of products
            sym = g_c + g_c.mT if g_delta is None else torch.cat([g_c + g_c.mT, g_delta + g_delta.mT])
            xx = x if g_delta is None else x.repeat(2, 1, 1)
            prod = torch.bmm(torch.bmm(xx, sym), xx.mT)
            p, xd = (prod, None) if g_delta is None else prod.chunk(2)
            grad_r = torch.bmm(p, q_sqrt)
            h = -torch.bmm(q_sqrt, torch.bmm(q_sqrt.mT, p))  # -S P
            if xd is not None:
                h = h + xd
        if g_alpha is not None:
            xa = torch.bmm(x, g_alpha.unsqueeze(-1))  # X ᾱ', [G, M, 1]
            grad_m = xa.squeeze(-1)
            outer = q_mu.unsqueeze(-1) * xa.mT
            h = -outer if h is None else h - outer
        if g_kl is not None:
            grad_m = g_kl * q_mu if grad_m is None else grad_m + g_kl * q_mu
            g_r_kl = g_kl * (q_sqrt - torch.diag_embed(torch.diagonal(q_sqrt, dim1=-2, dim2=-1).reciprocal()))
            grad_r = g_r_kl if grad_r is None else grad_r + g_r_kl
        grad_k = None if h is None else cholesky_gradient_to_matrix(x, h, chol)
        return grad_k, grad_m, grad_r, None, None


class InducingSet(WhitenedGaussian):
    """G independent sets of M inducing variables at inputs Z [G, M, Dx]: u_g = L_g v_g with the shared whitened
    q(v_g) = N(m_g, R_g R_gᵀ) of `flowgp.gp.variational.WhitenedGaussian` (KL[q(u) || p(u)] = KL[q(v) || N(0, I)]).

    The Ψ-statistics bound works in kernel space, so `posterior(K_uu)` also gives α = K⁻¹m_u, C = K⁻¹S_uK⁻¹, K⁻¹.

    Args:
        z: initial inducing inputs [G, M, Dx] (trained).
        q_var_init: initial whitened S = q_var_init·I.
        jitter: K_uu's diagonal jitter (None: the dtype default of robust_cholesky).

    See Also:
        :class:`flowgp.models.amogp.Posterior`, :class:`flowgp.models.amogp.AMOGP`.
    """

    def __init__(self, z: torch.Tensor, q_var_init: float, jitter: float | None = None):
        super().__init__(z.shape[0], z.shape[1], q_var_init, dtype=z.dtype, device=z.device)
        self.z = nn.Parameter(z.detach().clone())  # [G, M, Dx]
        self.jitter = jitter  # K_uu's diagonal jitter (None: the dtype default of robust_cholesky)

    def posterior(self, kuu: torch.Tensor):
        """α = K⁻¹m_u = L⁻ᵀ m, C = K⁻¹ S_u K⁻¹ = L⁻ᵀ S L⁻¹, K⁻¹ and L, each batched over G."""
        chol = robust_cholesky(kuu, jitter=self.jitter)
        linv = lower_inverse(chol)
        alpha = (linv.mT @ self.q_mu.unsqueeze(-1)).squeeze(-1)
        lr = linv.mT @ self.q_sqrt_tril()
        return alpha, lr @ lr.mT, linv.mT @ linv, chol

    def bound_posterior(self, kuu: torch.Tensor) -> Posterior:
        """α, C, Δ = C - K⁻¹, W = ααᵀ + Δ, the KL and L from one `_WhitenedPosterior` node (what the bound and the
        moment-matched predictions need; `posterior` gives K⁻¹ and a differentiable L for sampling)."""
        return Posterior(*_WhitenedPosterior.apply(kuu, self.q_mu, self.q_sqrt_tril(), self.jitter, None))

    def sample_beta(self, chol, num_samples, generator=None):
        """β = K⁻¹ u for u ~ q(u): L⁻ᵀ (m + R ε), shape [S, G, M]."""
        v = self.sample_whitened(num_samples, generator)  # m + R ε, [S, G, M]
        return torch.linalg.solve_triangular(chol.mT, v.unsqueeze(-1), upper=True).squeeze(-1)


def _se_kernel(num_outputs: int, variance: float, lengthscale: float, dtype: torch.dtype) -> Scale:
    """D scalar-input SE kernels σ²_d exp(-(x - x')²/(2ℓ_d²)), one per output (flowgp.gp.kernels, batch (D,))."""
    return Scale(RBF(1, lengthscale=lengthscale, batch_shape=(num_outputs,), dtype=dtype), variance,
                 batch_shape=(num_outputs,), dtype=dtype)


def _per_point_psi(x, z, variance, lengthscale):
    """k_d(n)(x_n, z) of each point n under its own output's SE kernel (Ψ₁ of a point mass, supplement eq. 24):
    x [..., N], z [N, M, 1], variance and lengthscale [N] -> [..., N, M] (for `AMOGP.sample`)."""
    amp = variance[:, None, None].expand(z.shape[0], 1, z.shape[1])  # [N, 1, M]
    lsq = lengthscale.square()[:, None, None, None].expand(z.shape[0], 1, z.shape[1], 1)  # [N, 1, M, 1]
    mean = x[..., None, None]  # [..., N, 1, 1]: each point is its own batch of one input
    return gaussian_psi1(mean, torch.zeros_like(mean), z, amp, lsq)[..., 0, :]


#: state-dict keys of the SE hyperparameters before they moved into flowgp.gp.kernels, and their constraints then
_OLD_SE_KEYS = {"raw_align_variance": ("align_kernel.raw_variance", 1e-10),
                "raw_align_lengthscale": ("align_kernel.base.raw_lengthscale", 1e-6),
                "raw_warp_variance": ("warp_kernel.raw_variance", 1e-10),
                "raw_warp_lengthscale": ("warp_kernel.base.raw_lengthscale", 1e-6)}


def _upgrade_state_dict(module, state_dict, prefix, *args):
    """Load files saved before the alignment / warping SE kernels became flowgp.gp.kernels modules: raw [D]
    values (softplus + lower bound of that time) become the kernels' raw [D, 1, 1] parameters."""
    conversions = {old: (new, _se_kernel_raw(new, lower)) for old, (new, lower) in _OLD_SE_KEYS.items()}
    convert_entries(state_dict, prefix, conversions,
                    "this AMO-GP was saved before its alignment / warping SE kernels were kernel modules")


def _se_kernel_raw(new: str, lower: float):
    """The conversion of one old raw [D] SE-kernel value (softplus + `lower`) to the kernel's raw [D, 1, 1]."""
    constraint = LENGTHSCALE_CONSTRAINT if new.endswith("lengthscale") else VARIANCE_CONSTRAINT
    return lambda raw: constraint.inverse(Positive(lower=lower)(raw)).reshape(-1, 1, 1)


def _se_gram(z, variance, coef):
    """K_uu of D scalar-input SE kernels, σ²_d exp(-(z_di - z_dj)²/(2ℓ_d²)) for z [D, M] and coef = -½/ℓ² [D]:
    [D, M, M] (σ² folded into the exponent, as `flowgp.gp.kernels.Scale` does)."""
    return torch.exp(torch.addcmul(variance.log().view(-1, 1, 1), (z.unsqueeze(-1) - z.unsqueeze(-2)).square(),
                                   coef.view(-1, 1, 1)))


class _AlignmentMoments(torch.autograd.Function):
    """Moments of the alignment layer at deterministic inputs, one node with a backward written by hand.

    Point n (output d = out[n], input x_n) sees its own output's SE kernel σ²_d exp(c_d (x - z)²), c_d = -½/ℓ_d²:
        Ψ_n = σ²_d exp(c_d (x_n - z_d)²)   [M],   y_n = Ψ_n [α_d | C_d | Δ_d]   (table [D, M, 1 + 2M]),
        mean = x + Ψα,   var = max(σ²_d + ΨΔΨᵀ, 0),   pc = max(ΨCΨᵀ, 0)
    (eq. 15's pieces with Φ_n = Ψ_nᵀΨ_n: ψ0 + ΨWΨᵀ - (Ψα)² = ψ0 + ΨΔΨᵀ for W = ααᵀ + Δ, no (Ψα)² to cancel).
    Backward, with the clamps' masks in ḡ_var and ḡ_pc: ȳ = [ḡ_mean | ḡ_pc Ψ | ḡ_var Ψ],
        Ψ̄ = T ȳ + ḡ_pc (CΨ) + ḡ_var (ΔΨ),   T̄_d = Σ_{n: out[n]=d} Ψ_n ȳ_nᵀ,   ū = Ψ̄ ∘ Ψ,
        σ̄²_d = Σ_n (ḡ_var + Ψ̄·Ψ/σ²),   c̄_d = Σ_n Σ_m ū (x - z)²,   z̄_d = -Σ_n 2 c ū (x - z),
        x̄ = ḡ_mean + Σ_m 2 c ū (x - z)
    (Ψ̄·Ψ/σ² written as Σ_m Ψ̄ e, e = exp(c (x - z)²), so that σ² = 0 is no division).
    The per-output products Ψ_n T_d(n), T_d(n) ȳ_n and Σ_n Ψ_n ȳ_nᵀ run as single products over all D tables with
    the point's own block picked (or, for T̄, Ψ placed in it): no per-point copy of T, [B, M, 1 + 2M], in memory.
    """

    @staticmethod
    def forward(ctx, x, out, z, variance, coef, table):
        d, m = z.shape
        b, k = x.shape[0], table.shape[-1]
        s2, c = variance[out], coef[out]
        dx = x.unsqueeze(-1) - z[out]  # [B, M]
        e = torch.exp(c.unsqueeze(-1) * dx.square())
        psi = s2.unsqueeze(-1) * e
        # Ψ_n T_d for every output d, the point's own kept: [B, M] x [M, D·(1 + 2M)]
        y = (psi @ table.transpose(0, 1).reshape(m, d * k)).view(b, d, k)
        y = y.gather(1, out.view(b, 1, 1).expand(b, 1, k)).squeeze(1)  # [B, 1 + 2M]
        quad = _quadratic_forms(y, psi, 2)  # Ψ C Ψᵀ, Ψ Δ Ψᵀ
        var = s2 + quad[:, 1]
        ctx.save_for_backward(out, z, dx, e, psi, table, y, s2, c, var, quad[:, 0])
        return x + y[:, 0], var.clamp_min(0.0), quad[:, 0].clamp_min(0.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_mean, g_var, g_pc):
        out, z, dx, e, psi, table, y, s2, c, var, pc = ctx.saved_tensors
        d, m = z.shape
        b, k = psi.shape[0], table.shape[-1]
        g_var = g_var * (var >= 0)  # clamp_min's gradient mask
        g_pc = g_pc * (pc >= 0)
        g_y = torch.cat([g_mean.unsqueeze(-1), g_pc.unsqueeze(-1) * psi, g_var.unsqueeze(-1) * psi], -1)
        # T_d ȳ for every d, the point's own kept: [B, 1 + 2M] x [1 + 2M, D·M]
        g_psi = (g_y @ table.permute(2, 0, 1).reshape(k, d * m)).view(b, d, m)
        g_psi = g_psi.gather(1, out.view(b, 1, 1).expand(b, 1, m)).squeeze(1)  # T ȳ, [B, M]
        g_psi += (y[:, 1:].view(-1, 2, m) * torch.stack([g_pc, g_var], -1).unsqueeze(-1)).sum(1)
        # T̄_d = Σ_{n: out[n]=d} Ψ_n ȳ_nᵀ: Ψ_n placed in its output's block of a [B, D·M] matrix, one product
        placed = psi.new_zeros(b, d, m).scatter_(1, out.view(b, 1, 1).expand(b, 1, m), psi.unsqueeze(1))
        g_table = (placed.view(b, d * m).T @ g_y).view(d, m, k)
        u = g_psi * psi
        dx2 = dx.square()
        g_c = (u * dx2).sum(-1)
        g_s2 = g_var + (g_psi * e).sum(-1)
        g_dx = 2.0 * c.unsqueeze(-1) * u * dx  # ∂/∂(x - z)
        g_z = torch.zeros_like(z).index_add_(0, out, -g_dx)
        g_variance = torch.zeros(d, dtype=psi.dtype, device=psi.device).index_add_(0, out, g_s2)
        g_coef = torch.zeros(d, dtype=psi.dtype, device=psi.device).index_add_(0, out, g_c)
        g_x = g_mean + g_dx.sum(-1) if ctx.needs_input_grad[0] else None
        return g_x, None, g_z, g_variance, g_coef, g_table


def _quadratic_forms(y, psi, count):
    """Ψ_n Q_k Ψ_nᵀ, k < count, [B, count], from y = Ψ [.. | Q_1 | ... | Q_count] (the last count·M columns of y,
    [B, ·]) and Ψ [B, M]: one product for all k."""
    b, m = psi.shape
    return (y[:, -count * m:].view(b, count, m) * psi.unsqueeze(1)).sum(-1)


def _check_grid(z: torch.Tensor) -> None:
    """ValueError unless every row of z [R, M] is an evenly spaced increasing grid of at least 2 points."""
    if z.shape[-1] < 2:
        raise ValueError(f"cp_grid=True needs at least 2 inducing inputs per latent process, got {z.shape[-1]}")
    gaps = z[:, 1:] - z[:, :-1]
    # evenly spaced up to the rounding of the inputs themselves (torch.linspace's, in z's dtype)
    tol = 64 * torch.finfo(z.dtype).eps * z.abs().amax(-1, keepdim=True)
    if not bool((gaps > 0).all()) or bool(((gaps - gaps[:, :1]).abs() > tol).any()):
        raise ValueError("z_latent: with cp_grid=True each row must be an evenly spaced increasing grid "
                         "(e.g. torch.linspace(lo, hi, M))")


class AMOGP(TrainsItsBound, nn.Module):
    """AMO-GP over D outputs with 1-D inputs (module docstring for the bound and predictions).

    Args:
        z_alignment: [D, M_a] initial inducing inputs of the alignment GPs (ignored if alignment=False).
        z_latent: [D, M_f] initial inducing inputs of the CP layer, one set per output.
        z_warping: [D, M_g] initial inducing inputs of the warping GPs (ignored if warping=False).
        latent_processes: R white-noise latents of the CP layer.
        alignment, warping: False fixes that layer to the identity (no GP, no noise): both False is the
            MO-GP (a sparse GP with the CP kernel), warping=False alone the aligned-only ablation.
        lengthscale, variance: initial CP auto-covariance lengthscale and variance per output.
        alignment_variance, alignment_lengthscale: initial SE hyperparameters of the alignment GPs.
        warping_variance, warping_lengthscale: initial SE hyperparameters of the warping GPs.
        noise: initial σ²_y.
        alignment_noise, latent_noise: initial σ²_a and σ²_f (only with the GP layers).
        q_var_init: initial whitened S = q_var_init·I for every inducing set.
        jitter: diagonal jitter of the CP layer's K_uu (None: the dtype default of robust_cholesky).
        cp_inducing: where the CP layer's inducing variables live. "output" (the supplement's choice, §3.1: one
            set u_{f,d} per output, z_latent [D, M_f]); "latent": one set per latent process on a smoothed copy
            of the latent with a learned smoothing lengthscale (Álvarez et al. 2010, flowgp.models.amogp.convolution),
            z_latent [R, M_f], `num_outputs` required. The prior is the same; only the variational family
            differs. With one latent the outputs are smoothed copies of one process, so per-output sets are
            nearly linearly dependent (cond(K_uu) 1e17-1e19 on the London data, docs/results/amogp); the
            latent sets are not, and R·M_f of them cost (D/R)² less Ψ₂ work than D·M_f per-output ones.
        cp_grid: with cp_inducing="latent", keep the CP layer's inducing inputs fixed on the evenly spaced grid
            z_latent gives (each row must be one), untrained. On a grid the M² pairs of inducing inputs have 2M - 1
            midpoints, and the bound's Ψ₂ contraction is one [B, 2M-1] x [2M-1, M] product per latent
            (`flowgp.models.amogp.psi_grid`) instead of B·M² terms: a full-batch step costs about 0.7 of one with trained
            inducing inputs, for a slightly looser bound (docs/results/amogp, "Inducing inputs on a grid").
        num_outputs: D, required with cp_inducing="latent" (else the rows of z_latent).

    See Also:
        :class:`flowgp.AlignedMultiOutputGPRegressor` (its estimator), :func:`flowgp.models.amogp.layer_curves`.
    """

    def __init__(self, z_alignment, z_latent, z_warping, latent_processes: int = 1, alignment: bool = True,
                 warping: bool = True, lengthscale: float = 1.0, variance: float = 1.0,
                 alignment_variance: float = 0.05, alignment_lengthscale: float = 1.0,
                 warping_variance: float = 0.05, warping_lengthscale: float = 1.0, noise: float = DEFAULTS.noise,
                 alignment_noise: float = 1e-3, latent_noise: float = 1e-3, q_var_init: float = 1e-5,
                 jitter: float | None = None, cp_inducing: str = "output", num_outputs: int | None = None,
                 cp_grid: bool = False):
        super().__init__()
        # parameters in the inducing inputs' dtype when a floating tensor is given, float64 otherwise
        dtype = z_latent.dtype if isinstance(z_latent, torch.Tensor) and z_latent.is_floating_point() \
            else torch.float64
        self._dtype = dtype
        z_latent = torch.as_tensor(z_latent, dtype=dtype)
        if cp_inducing not in ("output", "latent"):
            raise ValueError(f"cp_inducing must be 'output' (one inducing set per output, the supplement's) or "
                             f"'latent' (one per latent process), got {cp_inducing!r}")
        self.cp_inducing = cp_inducing
        if not isinstance(cp_grid, bool):
            raise TypeError(f"cp_grid must be a bool, got {type(cp_grid).__name__}")
        if cp_grid and cp_inducing != "latent":
            raise ValueError("cp_grid=True needs cp_inducing='latent' (one grid per latent process)")
        self.cp_grid = cp_grid
        if z_latent.dim() != 2:
            rows = "num_outputs" if cp_inducing == "output" else "latent_processes"
            raise ValueError(f"z_latent must have shape [{rows}, M_f], got {tuple(z_latent.shape)}")
        if cp_inducing == "output":
            d, mf = z_latent.shape
            if num_outputs is not None and num_outputs != d:
                raise ValueError(f"num_outputs={num_outputs!r} does not match z_latent's {d} rows (one per output)")
        else:
            if z_latent.shape[0] != latent_processes:
                raise ValueError(f"with cp_inducing='latent', z_latent must have shape [latent_processes="
                                 f"{latent_processes}, M_f], got {tuple(z_latent.shape)}")
            if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1:
                raise ValueError(f"with cp_inducing='latent', num_outputs (a positive integer) is required, got "
                                 f"{num_outputs!r}")
            d = num_outputs
        self.num_outputs = d
        self.register_buffer("_output_ids", torch.arange(d), persistent=False)
        self.alignment, self.warping = bool(alignment), bool(warping)
        self.kernel = ConvolutionKernel(d, 1, latent_processes, lengthscale=lengthscale, variance=variance,
                                        dtype=dtype)
        # jitter: of the CP layer's K_uu (None: the dtype default). With one latent process and per-output sets
        # at the same places K_uu is close to singular (benchmarks/studies/amogp_sensitivity.py)
        if cp_inducing == "output":
            self.latent = InducingSet(z_latent.reshape(1, d * mf, 1), q_var_init, jitter)
            self.register_buffer("latent_output", torch.arange(d).repeat_interleave(mf), persistent=False)
        else:
            self.latent = InducingSet(z_latent.unsqueeze(-1), q_var_init, jitter)
            if cp_grid:
                # not trained; checked to be a grid where the bound first uses it (a model being loaded is built
                # on placeholder inputs before its state arrives)
                self.latent.z.requires_grad_(False)
                self._grid_checked = None  # a copy of the inducing inputs last found to be a grid
            # u_r starts as smooth as the outputs' smoothing kernels of latent r
            self.raw_inducing_lengthscale = nn.Parameter(_INDUCING_LS.inverse(self.kernel.lengthscale[0].detach()))
        self.raw_noise = nn.Parameter(_NOISE.inverse(torch.full((d,), float(noise), dtype=dtype)))
        # a constant mean b_d per output (y_d = g_d(f_d(a_d(x))) + b_d + ε): the zero-mean CP layer ties the
        # outputs' levels together otherwise, and standardising each series cannot remove an offset in a gap
        self.offset = nn.Parameter(torch.zeros(d, dtype=dtype))
        if self.alignment:
            z_a = self._check_z(z_alignment, "z_alignment")
            self.align = InducingSet(z_a.unsqueeze(-1), q_var_init)
            self.align_kernel = _se_kernel(d, alignment_variance, alignment_lengthscale, dtype)
            self.raw_align_noise = nn.Parameter(_NOISE.inverse(torch.full((d,), alignment_noise, dtype=dtype)))
        if self.warping:
            z_g = self._check_z(z_warping, "z_warping")
            self.warp = InducingSet(z_g.unsqueeze(-1), q_var_init)
            self.warp_kernel = _se_kernel(d, warping_variance, warping_lengthscale, dtype)
            self.raw_latent_noise = nn.Parameter(_NOISE.inverse(torch.full((d,), latent_noise, dtype=dtype)))
        # lower bounds of the positive hyperparameters `_hyper` transforms in one softplus (the SE kernels' and the
        # noises' constraints, in the order of `_hyper_raw`)
        floors = [torch.full((p.numel(),), c.lower, dtype=dtype) for p, c in self._hyper_raw()]
        self.register_buffer("_hyper_floor", torch.cat(floors), persistent=False)
        self.register_load_state_dict_pre_hook(_upgrade_state_dict)

    def _check_z(self, z, name):
        z = torch.as_tensor(z, dtype=self._dtype)
        if z.dim() != 2 or z.shape[0] != self.num_outputs:
            raise ValueError(f"{name} must have shape [{self.num_outputs}, M], got {tuple(z.shape)}")
        return z

    # ----- constrained parameters ----------------------------------------------------------------------
    @property
    def noise(self):
        return _NOISE(self.raw_noise)

    @property
    def alignment_noise(self):
        return _NOISE(self.raw_align_noise) if self.alignment else None

    @property
    def latent_noise(self):
        return _NOISE(self.raw_latent_noise) if self.warping else None

    def _align_params(self):
        """(σ²_a,d, ℓ_a,d) of the alignment kernels, each [D]."""
        return self.align_kernel.variance.reshape(-1), self.align_kernel.base.lengthscale.reshape(-1)

    def _warp_params(self):
        """(σ²_g,d, ℓ_g,d) of the warping kernels, each [D]."""
        return self.warp_kernel.variance.reshape(-1), self.warp_kernel.base.lengthscale.reshape(-1)

    #: state-dict prefixes of what an MO-GP and an AMO-GP with the same CP sets share (see `start_from`)
    _SHARED_STATE = ("kernel.", "latent.", "raw_inducing_lengthscale", "offset", "raw_noise")

    def start_from(self, other: "AMOGP") -> None:
        """Copy the CP layer (kernel, inducing inputs and q(u), latent smoothing lengthscales), the offsets b_d and
        the output noise σ²_y of `other`, e.g. the MO-GP (identity layers) fitted first on the same data: AMO-GP
        then starts from the model it extends, with its alignments and warpings at their initial near-identity."""
        if not isinstance(other, AMOGP):
            raise TypeError(f"other must be an AMOGP, got {type(other).__name__}")
        if (other.cp_inducing, other.num_outputs, other.kernel.latent_processes, tuple(other.latent.z.shape)) != (
                self.cp_inducing, self.num_outputs, self.kernel.latent_processes, tuple(self.latent.z.shape)):
            raise ValueError("other must have the same CP layer (cp_inducing, outputs, latents, inducing inputs) "
                             "to start from it")
        state = {k: v for k, v in other.state_dict().items() if k.startswith(self._SHARED_STATE)}
        self.load_state_dict(state, strict=False)

    def kl_divergence(self) -> torch.Tensor:
        """Σ KL[q(u) || p(u)] over the CP layer's, the alignments' and the warpings' inducing sets."""
        kl = self.latent.kl_divergence()
        if self.alignment:
            kl = kl + self.align.kl_divergence()
        if self.warping:
            kl = kl + self.warp.kl_divergence()
        return kl

    # ----- checks -------------------------------------------------------------------------------------
    def validate(self, x, out, y=None):
        """x checked as [N, 1] inputs, out as [N] output indices (and y as [N] targets): (x, out) or (x, out, y).

        Raises TypeError/ValueError naming the argument on a non-tensor, a wrong shape or non-finite values.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[1] != 1:
            raise ValueError(f"x must have shape [N, 1] (AMO-GP takes 1-D inputs), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError("x contains NaN or inf; drop or impute those rows first")
        out = check_output_index(out, x.shape[0], self.num_outputs)
        if y is None:
            return x, out
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if y.dim() == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have shape [{x.shape[0]}] to match x, got {tuple(y.shape)}")
        if not torch.isfinite(y).all():
            raise ValueError("y contains NaN or inf; drop or impute those rows first")
        return x, out, y

    # ----- layers (shared by the bound and the predictions) -------------------------------------------
    @property
    def inducing_lengthscale(self):
        """Smoothing lengthscales ℓ_{u,r} [R, 1] of the latent inducing variables (cp_inducing="latent")."""
        return _INDUCING_LS(self.raw_inducing_lengthscale) if self.cp_inducing == "latent" else None

    @property
    def cp_inducing_shape(self) -> tuple:
        """The shape of `z_latent` as the constructor takes it: [D, M_f] ("output") or [R, M_f] ("latent")."""
        if self.cp_inducing == "latent":
            return tuple(self.latent.z.shape[:2])
        return (self.num_outputs, self.latent.z.shape[1] // self.num_outputs)

    def cp_kuu(self, inducing_lengthscale=None) -> torch.Tensor:
        """K_uu of the CP layer's inducing sets, [G, M, M]: one [D·M_f]² block over all outputs
        (cp_inducing="output") or one [M_f]² block per latent ("latent"; `inducing_lengthscale` [R, 1] when
        already at hand, else `self.inducing_lengthscale`)."""
        if self.cp_inducing == "latent":
            ls = self.inducing_lengthscale if inducing_lengthscale is None else inducing_lengthscale
            return self.kernel.inducing_covariance(self.latent.z, ls)
        return self.kernel(self.latent.z[0], self.latent_output).unsqueeze(0)

    def _cp_groups(self, out):
        """The CP layer's inducing inputs in groups with one prefactor and squared lengthscale per (point, group):
        (z [G, Mg, 1], amp [B, G], lsq [B, G, 1], repeats). cp_inducing="output": groups (latent r, output p),
        whose Ψ₁ columns are summed over r (`repeats` = R); "latent": one group per latent (`repeats` = 1)."""
        b, r = out.shape[0], self.kernel.latent_processes
        if self.cp_inducing == "latent":
            amp, lsq = self.kernel.inducing_parameters(out, self.inducing_lengthscale)  # [R, B], [R, B, 1]
            return self.latent.z, amp.transpose(0, 1), lsq.transpose(0, 1), 1
        d = self.num_outputs
        amp, lsq = self.kernel.pair_parameters(out, torch.arange(d, device=out.device))  # [R, B, D(, 1)]
        z = self.latent.z[0].reshape(d, -1, 1).repeat(r, 1, 1)
        return z, amp.transpose(0, 1).reshape(b, r * d), lsq.transpose(0, 1).reshape(b, r * d, 1), r

    def _cp_psi1(self, mean, var, groups):
        """Ψ₁ of the CP layer, [..., B, M_total], for inputs N(mean, var) ([..., B]; var 0 gives K_fu)."""
        z, amp, lsq, repeats = groups
        mg = z.shape[1]
        psi1 = gaussian_psi1(mean[..., None], var[..., None], z.reshape(-1, 1), amp.repeat_interleave(mg, -1),
                             lsq.repeat_interleave(mg, -2))  # [..., B, G·Mg]
        return psi1.unflatten(-1, (repeats, -1)).sum(-2)

    def _cp_posterior(self, post):
        """(α [M_total], C, K⁻¹ [M_total, M_total]) of the CP layer with its inducing sets stacked (for sampling)."""
        alpha, cov, kinv, _ = post["f"]
        if alpha.shape[0] == 1:
            return alpha[0], cov[0], kinv[0]
        return alpha.reshape(-1), torch.block_diag(*cov), torch.block_diag(*kinv)

    def _sampling_posteriors(self):
        """`InducingSet.posterior` of every layer ((α, C, K⁻¹, L), differentiable through L): for `sample`."""
        post = {"f": self.latent.posterior(self.cp_kuu())}
        if self.alignment:
            post["a"] = self.align.posterior(self.align_kernel(self.align.z))  # K_uu [D, M, M]
        if self.warping:
            post["g"] = self.warp.posterior(self.warp_kernel(self.warp.z))
        return post

    def _hyper_raw(self):
        """(raw parameter, constraint) of the hyperparameters `_hyper` transforms together: the alignment and
        warping SE variances and lengthscales (variances of both layers first, so that the two layers' values
        lie side by side), the noises and the latent inducing lengthscales."""
        pairs = []
        kernels = [k for k, on in ((getattr(self, "align_kernel", None), self.alignment),
                                   (getattr(self, "warp_kernel", None), self.warping)) if on]
        pairs += [(k.raw_variance, VARIANCE_CONSTRAINT) for k in kernels]
        pairs += [(k.base.raw_lengthscale, LENGTHSCALE_CONSTRAINT) for k in kernels]
        pairs.append((self.raw_noise, _NOISE))
        if self.alignment:
            pairs.append((self.raw_align_noise, _NOISE))
        if self.warping:
            pairs.append((self.raw_latent_noise, _NOISE))
        if self.cp_inducing == "latent":
            pairs.append((self.raw_inducing_lengthscale, _INDUCING_LS))
        return pairs

    def _hyper(self) -> dict:
        """The constrained hyperparameters, each through its transform once per evaluation: the amogp-owned and
        SE-kernel ones in one softplus (`_hyper_raw`; every property read would run one each), the SE kernels'
        exponent factors -½/ℓ², and the CP layer's Ψ parameters per output (gathered per point by
        `_point_values`)."""
        raw = self._hyper_raw()
        layers = [name for name, on in (("align", self.alignment), ("warp", self.warping)) if on]
        d, count = self.num_outputs, len(layers)
        sizes = [count * d] * (2 if count else 0) + [r.numel() for r, _ in raw[2 * count:]]
        vals = list(softplus_positive(torch.cat([r.reshape(-1) for r, _ in raw]), self._hyper_floor).split(sizes))
        hyp = {}
        if count:
            var, ls = vals.pop(0), vals.pop(0)  # [count·D] each, the layers in `layers` order
            coef = -0.5 / ls.square()
            hyp["se_var"], hyp["se_coef"] = var, coef
            for name, v, l_, c in zip(layers, var.view(count, d).unbind(0), ls.view(count, d).unbind(0),
                                      coef.view(count, d).unbind(0)):
                hyp[name + "_var"], hyp[name + "_ls"], hyp[name + "_coef"] = v, l_, c
        hyp["noise"] = vals.pop(0)
        if self.alignment:
            hyp["align_noise"] = vals.pop(0)
        if self.warping:
            hyp["latent_noise"] = vals.pop(0)
            hyp["warp_lsq"] = hyp["warp_ls"].square()
        hyp["psi0_f"] = self.kernel.variance.sum(-1)
        outputs = self._output_ids
        if self.cp_inducing == "latent":
            hyp["inducing_ls"] = vals.pop(0).view(self.raw_inducing_lengthscale.shape)
            amp, lsq = self.kernel.inducing_parameters(outputs, hyp["inducing_ls"])  # [R, D], [R, D, 1]
            hyp["cp_amp"], hyp["cp_lsq"] = amp.transpose(0, 1), lsq[..., 0].transpose(0, 1)  # [D, R]
        else:
            amp, lsq = self.kernel.pair_parameters(outputs, outputs)  # [R, D, D], [R, D, D, 1]
            r = self.kernel.latent_processes
            hyp["cp_amp"] = amp.transpose(0, 1).reshape(d, -1)  # [D, R·D]: point's output, group (r, d')
            hyp["cp_lsq"] = lsq.transpose(0, 1).reshape(d, r * d)
        return hyp

    def _point_values(self, hyp, out):
        """Every per-output quantity the layers read per point, gathered with one index: a dict of [B] tensors
        (and "cp_amp", "cp_lsq" [B, G] for the CP layer's groups)."""
        names = ["noise", "offset", "psi0_f"] + (["align_noise"] if self.alignment else []) + (
            ["warp_var", "warp_lsq", "latent_noise"] if self.warping else [])
        scalars = torch.stack([self.offset if n == "offset" else hyp[n] for n in names], -1)  # [D, K]
        g = hyp["cp_amp"].shape[-1]
        table = torch.cat([scalars, hyp["cp_amp"], hyp["cp_lsq"]], -1).index_select(0, out)
        vals, amp, lsq = table.split([len(names), g, g], -1)
        pts = dict(zip(names, vals.unbind(-1)))
        pts["cp_amp"], pts["cp_lsq"] = amp, lsq
        return pts

    def _posteriors(self, hyp=None):
        """`InducingSet.bound_posterior` (α, C, Δ, W, KL, L) of the CP layer ("f"), the alignments ("a") and the
        warpings ("g"). Alignment and warping sets of the same size go through one batched node (the "a" entry
        then carries both layers' KL and the "g" entry's is None)."""
        hyp = self._hyper() if hyp is None else hyp
        post = {"f": self.latent.bound_posterior(self.cp_kuu(hyp.get("inducing_ls")))}
        sets = [(name, ind) for name, ind, on in (("a", getattr(self, "align", None), self.alignment),
                                                  ("g", getattr(self, "warp", None), self.warping)) if on]
        if not sets:
            return post
        z = [ind.z[..., 0] for _, ind in sets]
        if len(sets) == 2 and z[0].shape == z[1].shape:
            d = self.num_outputs
            kuu = _se_gram(torch.cat(z), hyp["se_var"], hyp["se_coef"])  # K_uu [2D, M, M] (= the SE kernels')
            both = _WhitenedPosterior.apply(kuu, torch.cat([ind.q_mu for _, ind in sets]),
                                            torch.cat([ind.q_sqrt_tril() for _, ind in sets]), None, (d, d))
            parts = [t.split(d) for t in both[:4]]
            post["a"] = Posterior(*(t[0] for t in parts), both[4], both[5][:d])
            post["g"] = Posterior(*(t[1] for t in parts), None, both[5][d:])
            return post
        for (name, ind), zs in zip(sets, z):
            layer = "align" if name == "a" else "warp"
            post[name] = ind.bound_posterior(_se_gram(zs, hyp[layer + "_var"], hyp[layer + "_coef"]))
        return post

    def _alignment_layer(self, p: Posterior, hyp, x, out):
        """Moments (mean, var, ΨCΨᵀ) of â at deterministic x [B]: eq. 15's pieces (`_AlignmentMoments`)."""
        table = torch.cat([p.alpha.unsqueeze(-1), p.cov, p.delta], -1)  # [D, M, 1 + 2M]
        return _AlignmentMoments.apply(x, out, self.align.z[..., 0], hyp["align_var"], hyp["align_coef"], table)

    def _cp_weight(self, p: Posterior):
        """W over the CP layer's groups: [G, Mg, Mg] block-diagonal (one latent set: W itself) or [G, Mg, G, Mg]."""
        if self.cp_inducing == "latent":
            if p.alpha.shape[0] == 1:
                return p.weight
            # one set per latent: q(u) is independent across latents but its mean is not zero, so W's cross-latent
            # blocks are α_r α_r'ᵀ
            r, mg = p.alpha.shape
            eye = torch.eye(r, dtype=p.alpha.dtype, device=p.alpha.device)
            outer = p.alpha[:, :, None, None] * p.alpha[None, None]  # [R, Mg, R, Mg]
            return outer + p.delta.unsqueeze(2) * eye[:, None, :, None]
        r, d = self.kernel.latent_processes, self.num_outputs
        w = p.weight[0]  # [D·Mf, D·Mf] over (output, point); the groups are (latent, output)
        return w.reshape(1, d, -1, 1, d, w.shape[-1] // d).repeat(r, 1, 1, r, 1, 1).reshape(
            r * d, -1, r * d, w.shape[-1] // d)

    def _latent_layer(self, p: Posterior, mean, var, pts, random_input: bool):
        """Moments (mean, var, ΨCΨᵀ) of f̂ under q(a_n) = N(mean, var) with the CP Ψ-statistics (A.3) evaluated
        by groups of inducing inputs (`flowgp.models.amogp.psi_statistics.grouped_psi_statistics`). `random_input` False: var
        is 0 (a deterministic input, Φ_n = Ψ_nᵀΨ_n, var = ψ0 + Ψ Δ Ψᵀ as in the alignment layer)."""
        amp, lsq = pts["cp_amp"], pts["cp_lsq"]  # [B, G]
        if self.cp_inducing == "latent":
            z, repeats = self.latent.z, 1  # [R, Mg, 1]
        else:
            d = self.num_outputs
            repeats = self.kernel.latent_processes
            z = self.latent.z[0].reshape(d, -1, 1).repeat(repeats, 1, 1)  # [R·D, Mf, 1], groups (latent, output)
        b = mean.shape[0]
        weight = self._cp_weight(p) if random_input else None
        if random_input and self.cp_grid and weight.dim() == 3:
            # fixed evenly spaced inducing inputs: the midpoint form of `flowgp.models.amogp.psi_grid` (same values)
            zs = z[..., 0].detach()
            seen = self._grid_checked
            if seen is None or seen.device != zs.device or seen.dtype != zs.dtype or not torch.equal(zs, seen):
                _check_grid(zs)  # again after anything wrote the inducing inputs (a loaded state, an edit)
                self._grid_checked = zs.clone()
            psi, phi_w = grid_psi_statistics(mean.unsqueeze(-1), var.unsqueeze(-1), zs[:, 0], zs[:, 1] - zs[:, 0],
                                             weight, amp, lsq.unsqueeze(-1), validate=False)
        elif random_input:
            psi, phi_w = grouped_psi_statistics(mean.unsqueeze(-1), var.unsqueeze(-1), z, weight, amp,
                                                lsq.unsqueeze(-1), validate=False)
        else:  # point masses: Ψ₁ = K_fu
            # exact zeros below e^-100 (`exp_or_zero`): subnormal values slowed the per-output MO-GP's fitted
            # full-batch step by about a fifth (the GEMMs of ΨCΨᵀ and their backward)
            psi = amp.unsqueeze(-1) * exp_or_zero((mean[:, None, None] - z[..., 0]).square()
                                                  * (-0.5 / lsq).unsqueeze(-1))
        psi = psi.reshape(b, repeats, -1).sum(1) if repeats > 1 else psi.flatten(1)  # [B, M_total]
        one = p.alpha.shape[0] == 1
        alpha, cov = (p.alpha[0], p.cov[0]) if one else (p.alpha.reshape(-1), torch.block_diag(*p.cov))
        # Ψα, ΨCΨᵀ and ΨΔΨᵀ from separate products: one product with [α | C | Δ] and slices of it costs the
        # backward a zero-filled [B, 1 + 2M] gradient per slice
        psi_a = psi @ alpha
        pc = ((psi @ cov) * psi).sum(-1)
        if random_input:
            var = pts["psi0_f"] + phi_w - psi_a.square()
        else:
            delta = p.delta[0] if one else torch.block_diag(*p.delta)
            var = pts["psi0_f"] + ((psi @ delta) * psi).sum(-1)
        return psi_a, var.clamp_min(0.0), pc.clamp_min(0.0)

    def _warping_layer(self, p: Posterior, mean, var, out, pts):
        """Moments (mean, var) of ĝ(f) + f under q(f_n) = N(mean, var) with SE Ψ-statistics and Ξ for the identity
        mean: point n sees only its own output's warping GP (one lengthscale per output), so eq. 25's contraction
        runs over that output's [M_g, M_g] block (`flowgp.models.amogp.psi_statistics.own_group_psi_statistics`). With
        Ξ_n,i = Ψ_n,i (λ μ_n + v_n z_i)/(λ + v_n),
            Ξ_n α - μ_n Ψ_n α = v_n (Ψ_n (α ∘ z) - μ_n Ψ_n α)/(λ + v_n),
            var_n = ψ0 + tr(Φ_n W) - (Ψ_n α)² + v_n + 2 (Ξ_n α - μ_n Ψ_n α).
        """
        z = self.warp.z  # [D, Mg, 1]
        lam = pts["warp_lsq"]
        psi, phi_w = own_group_psi_statistics(mean.unsqueeze(-1), var.unsqueeze(-1), z, p.weight, pts["warp_var"],
                                              lam.unsqueeze(-1), out)  # [B, Mg], [B]
        table = torch.stack([p.alpha, p.alpha * z[..., 0]], -1)[out]  # [B, Mg, 2]: α, α ∘ z of each point's output
        psi_a, psi_az = (psi.unsqueeze(-1) * table).sum(1).unbind(-1)
        xi_term = torch.addcmul(psi_az, mean, psi_a, value=-1.0) * (2.0 * var / (lam + var))
        out_var = (pts["warp_var"] + phi_w + var + xi_term).addcmul_(psi_a, psi_a, value=-1.0)
        return mean + psi_a, out_var.clamp_min(0.0)

    def _propagate(self, x, out, post, hyp, exact: bool):
        """Run the three layers. exact=False: the bound's inputs N(mean, σ² + ΨCΨᵀ) and its penalties;
        exact=True: moment matching (input variance = exact var + σ²). Returns per-layer moments, the per-point
        compression penalty (None without alignment and warping) and the per-point values of `_point_values`."""
        pts = self._point_values(hyp, out)
        penalty = None
        layers = {}
        if self.alignment:
            m, v, pc = self._alignment_layer(post["a"], hyp, x[:, 0], out)
            s2 = pts["align_noise"]
            penalty = (v - pc) / (2.0 * s2)
            layers["a"] = (m, v)
            a_mean, a_var = m, (v if exact else pc) + s2
        else:
            a_mean, a_var = x[:, 0], torch.zeros_like(x[:, 0])
            layers["a"] = (a_mean, a_var)
        # with an alignment layer the CP input is random (its variance includes σ²_a > 0)
        m, v, pc = self._latent_layer(post["f"], a_mean, a_var, pts, random_input=self.alignment)
        layers["f"] = (m, v)
        if not self.warping:
            layers["g"] = (m, v)
            return layers, penalty, pts
        s2 = pts["latent_noise"]
        pen_f = (v - pc) / (2.0 * s2)
        penalty = pen_f if penalty is None else penalty + pen_f
        f_mean, f_var = m, (v if exact else pc) + s2
        layers["f_input"] = (f_mean, f_var)
        layers["g"] = self._warping_layer(post["g"], f_mean, f_var, out, pts)  # σ²_f > 0
        return layers, penalty, pts

    # ----- bound ---------------------------------------------------------------------------------------
    def _bound_terms(self, x, y, out):
        """(ell [B], penalty [B] or None, Σ KL): the bound's pieces from one pass over the posteriors."""
        hyp = self._hyper()
        post = self._posteriors(hyp)
        layers, penalty, pts = self._propagate(x, out, post, hyp, exact=False)
        mean, var = layers["g"]
        mean = mean + pts["offset"]
        s2 = pts["noise"]
        ell = -0.5 * torch.log(2.0 * math.pi * s2) - ((y - mean).square() + var) / (2.0 * s2)
        kl = post["f"].kl
        for name in ("a", "g"):
            if name in post and post[name].kl is not None:
                kl = kl + post[name].kl
        return ell, penalty, kl

    def elbo_terms(self, x, y, out):
        """Per-point expected log-likelihood and compression penalty, each [B] (no KL, no scaling)."""
        ell, penalty, _ = self._bound_terms(x, y, out)
        return ell, torch.zeros_like(ell) if penalty is None else penalty

    def elbo(self, x: torch.Tensor, y: torch.Tensor, output: torch.Tensor, num_data: int | None = None,
             generator: torch.Generator | None = None, batch_rows=None, indices=None):
        """Nested variational compression bound (supplement eq. 22), minibatch-scaled by num_data / B.

        Per-point terms (expected log-likelihood minus compression penalties) and the KL terms (of
        `kl_divergence`, here from the posteriors' node) are assembled by `flowgp.gp.objective.minibatch_bound`. The
        bound is closed form: `generator`, `batch_rows` and `indices` are accepted (the common elbo signature,
        flowgp.models.protocol.TrainableModel) and unused.
        """
        x, output, y = self.validate(x, output, y)
        ell, penalty, kl = self._bound_terms(x, y, output)
        return minibatch_bound(ell if penalty is None else ell - penalty, [kl], num_data, x.shape[0])

    # ----- predictions ---------------------------------------------------------------------------------
    def predict_layers(self, x, output, chunk: int = 512):
        """Propagated Gaussian approximation (A.4): dict of (mean, var) [N] for â (alignment, noise-free),
        f̂ (latent CP output at the propagated alignment) and y (warped output, noise included)."""
        x, output = self.validate(x, output)
        hyp = self._hyper()
        post = self._posteriors(hyp)
        res = {"a": [], "f": [], "y": []}
        for i in range(0, x.shape[0], chunk):
            xs, os_ = x[i:i + chunk], output[i:i + chunk]
            layers, _, pts = self._propagate(xs, os_, post, hyp, exact=True)
            res["a"].append(layers["a"])
            res["f"].append(layers["f"])
            m, v = layers["g"]
            res["y"].append((m + pts["offset"], v + pts["noise"]))
        return {k: (torch.cat([p[0] for p in v]), torch.cat([p[1] for p in v])) for k, v in res.items()}

    def predict(self, x, output, generator=None):
        """The model's predictions (flowgp.models.protocol.TrainableModel): `predict_y`; closed form, so
        `generator` is unused."""
        return self.predict_y(x, output)

    def predict_y(self, x, output):
        """Moment-matched predictive mean and variance of y* per point, each [N]."""
        return self.predict_layers(x, output)["y"]

    def alignment_function(self, x, d: int):
        """q(â_d(x)) at deterministic inputs x [N, 1]: (mean, var) [N] (identity when alignment=False)."""
        out = torch.full((x.shape[0],), int(d), dtype=torch.long, device=x.device)
        x, out = self.validate(x, out)
        if not self.alignment:
            return x[:, 0], torch.zeros_like(x[:, 0])
        hyp = self._hyper()
        return self._alignment_layer(self._posteriors(hyp)["a"], hyp, x[:, 0], out)[:2]

    def latent_function(self, a, d: int):
        """q(f̂_d(a)) at deterministic CP inputs a [N, 1]: (mean, var) [N]."""
        out = torch.full((a.shape[0],), int(d), dtype=torch.long, device=a.device)
        a, out = self.validate(a, out)
        hyp = self._hyper()
        return self._latent_layer(self._posteriors(hyp)["f"], a[:, 0], torch.zeros_like(a[:, 0]),
                                  self._point_values(hyp, out), random_input=False)[:2]

    def warping_function(self, f, d: int):
        """q(ĝ_d(f)) at deterministic warping inputs f [N, 1]: (mean, var) [N] (identity when warping=False)."""
        out = torch.full((f.shape[0],), int(d), dtype=torch.long, device=f.device)
        f, out = self.validate(f, out)
        if not self.warping:
            return f[:, 0], torch.zeros_like(f[:, 0])
        hyp = self._hyper()
        return self._warping_layer(self._posteriors(hyp)["g"], f[:, 0], torch.zeros_like(f[:, 0]), out,
                                   self._point_values(hyp, out))

    def sample(self, x, output, num_samples: int = 100, generator=None, common_noise: bool = False):
        """Samples through the hierarchy (u ~ q(u) per sample, then each layer's conditional at the sampled
        inputs, marginally per point). Returns a dict of [S, N] tensors: a, f, g (noise-free warped value)
        (without the offset b_d) and y_mean, y_var (the Gaussian of y* given the sampled f and u_g).

        common_noise: every point uses the same standard-normal draw per sample and layer (common random
        numbers): each point's samples keep their distribution, and a point's samples no longer depend on
        which other points are drawn with it, so rows can be predicted in chunks with the generator replayed."""
        x, output = self.validate(x, output)
        post = self._sampling_posteriors()
        s, n = int(num_samples), x.shape[0]

        def draw(shape):
            if common_noise:
                shape = shape[:-1] + (1,)
            return torch.randn(shape, dtype=x.dtype, device=x.device, generator=generator)

        if self.alignment:
            var, ls = self._align_params()
            _, _, kinv, chol = post["a"]
            beta = self.align.sample_beta(chol, s, generator)[:, output]  # [S, N, M]
            k = _per_point_psi(x[:, 0], self.align.z[output], var[output], ls[output])  # [N, M]
            cond = var[output] - torch.einsum("nm,nmk,nk->n", k, kinv[output], k)
            a = x[:, 0] + (k * beta).sum(-1) + cond.clamp_min(0).sqrt() * draw((s, n))
            a = a + self.alignment_noise[output].sqrt() * draw((s, n))
        else:
            a = x[:, 0].expand(s, n)
        kinv = self._cp_posterior(post)[2]
        beta = self.latent.sample_beta(post["f"][3], s, generator).reshape(s, -1)  # [S, M_total]
        k = self._cp_psi1(a, torch.zeros_like(a), self._cp_groups(output))  # K_fu at the sampled inputs, [S, N, M]
        cond = self.kernel.diag(x, output) - torch.einsum("snm,mk,snk->sn", k, kinv, k)
        f_mean = (k * beta.unsqueeze(-2)).sum(-1)
        if not self.warping:
            f = f_mean + cond.clamp_min(0).sqrt() * draw((s, n))
            return {"a": a, "f": f, "g": f, "y_mean": f_mean + self.offset[output],
                    "y_var": cond.clamp_min(0) + self.noise[output]}
        f = f_mean + cond.clamp_min(0).sqrt() * draw((s, n))
        f_noisy = f + self.latent_noise[output].sqrt() * draw((s, n))
        var, ls = self._warp_params()
        _, _, kinv, chol = post["g"]
        beta = self.warp.sample_beta(chol, s, generator)[:, output]  # [S, N, M]
        k = _per_point_psi(f_noisy, self.warp.z[output], var[output], ls[output])  # [S, N, M]
        cond = var[output] - torch.einsum("snm,nmk,snk->sn", k, kinv[output], k)
        g_mean = f_noisy + (k * beta).sum(-1)
        g = g_mean + cond.clamp_min(0).sqrt() * draw((s, n))
        return {"a": a, "f": f, "g": g, "y_mean": g_mean + self.offset[output],
                "y_var": cond.clamp_min(0) + self.noise[output]}

    def log_predictive_density(self, x, y, output, num_samples: int = 200, generator=None, method: str = "mc",
                               common_noise: bool = False):
        """Per-point log p(y* | x*), [N]: "mc" averages the conditional Gaussians of `sample` (log-mean-exp),
        "gaussian" uses the moment-matched Gaussian of `predict_y`."""
        x, output, y = self.validate(x, output, y)
        if method == "gaussian":
            mean, var = self.predict_y(x, output)
            return -0.5 * (torch.log(2 * math.pi * var) + (y - mean).square() / var)
        if method != "mc":
            raise ValueError(f"method must be 'mc' or 'gaussian', got {method!r}")
        smp = self.sample(x, output, num_samples, generator, common_noise)
        logp = -0.5 * (torch.log(2 * math.pi * smp["y_var"]) + (y - smp["y_mean"]).square() / smp["y_var"])
        return torch.logsumexp(logp, 0) - math.log(num_samples)


def layer_curves(model: AMOGP, x_grid) -> list:
    """The three layers and the prediction per output, as numbers for `flowgp.reporting.plotting.amogp_layers_figure`.

    Args:
        model: a fitted AMOGP.
        x_grid: 1-D array of inputs (model units).

    Returns one dict per output d with "alignment" (x, mean â_d(x),
    var), "latent" (a, f̂_d(a), var) over the range of â_d ± 0.2, "warping" (f, ĝ_d(f) + b_d, var) over the
    range of f̂_d ± 0.5 (g_d(f) + b_d is the map from f to the mean of y) and "prediction" (x, mean, var of y),
    each a NumPy array [G].

    See Also:
        :class:`flowgp.models.amogp.AMOGP`.
    """
    import numpy as np

    ref = next(model.parameters())
    xg = torch.as_tensor(np.asarray(x_grid, dtype=float), dtype=ref.dtype, device=ref.device).reshape(-1, 1)

    def arrays(*tensors):
        return tuple(t.reshape(-1).cpu().numpy() for t in tensors)

    curves = []
    with torch.no_grad():
        for d in range(model.num_outputs):
            out = torch.full((xg.shape[0],), d, dtype=torch.long, device=ref.device)
            am, av = model.alignment_function(xg, d)
            lay = model.predict_layers(xg, out)
            agrid = torch.linspace(float(am.min()) - 0.2, float(am.max()) + 0.2, 200, dtype=ref.dtype,
                                   device=ref.device).reshape(-1, 1)
            fm, fv = model.latent_function(agrid, d)
            fgrid = torch.linspace(float(fm.min()) - 0.5, float(fm.max()) + 0.5, 200, dtype=ref.dtype,
                                   device=ref.device).reshape(-1, 1)
            gm, gv = model.warping_function(fgrid, d)
            ym, yv = lay["y"]
            curves.append({"alignment": arrays(xg, am, av), "latent": arrays(agrid, fm, fv),
                           "warping": arrays(fgrid, gm + model.offset[d], gv), "prediction": arrays(xg, ym, yv)})
    return curves
