"""Aligned warped multi-output GP (AMO-GP; Kaiser et al. 2018) with nested variational compression.

Output d is y_d = g_d(f_d(a_d(x))) + b_d + noise (b_d a learned constant per output) with (supplement eq. 9)
    a_d = â_d(x) + ε_a,  â_d ~ GP(x, k_a,d)       alignment, prior mean the identity, noise σ²_a,d
    f_d = f̂_d(a) + ε_f,  f̂ ~ CP(T_{d,r}, w_r)   shared convolution-process layer (flowgp.convolution)
    y_d = ĝ_d(f_d) + ε_y, ĝ_d ~ GP(f, k_g,d)     warping, prior mean the identity, noise σ²_y,d
with whitened inducing variables for every alignment, one set per output for the CP layer and every warping.

Bound (supplement eqs. 11-22, re-derived here for identity mean functions). Each layer sees its input as
q(h_n) = N(μ_n, v_n) and, with α = K_uu⁻¹ m_u, C = K_uu⁻¹ S_u K_uu⁻¹ and the Ψ-statistics ψ, Ψ, Φ of
flowgp.psi_statistics, has the exact moments of its noise-free output ĥ_n
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

import torch
from torch import nn

from ..constraints import Positive
from ..convolution import ConvolutionKernel, check_output_index
from ..kernels import LENGTHSCALE_CONSTRAINT, RBF, VARIANCE_CONSTRAINT, Scale
from ..linalg import lower_inverse, robust_cholesky
from ..objective import minibatch_bound
from ..psi_statistics import gaussian_psi1, gaussian_psi_mean, grouped_psi2_contract
from ..variational import WhitenedGaussian

__all__ = ["AMOGP", "InducingSet", "layer_curves"]

_NOISE = Positive(lower=1e-8)
_INDUCING_LS = Positive(lower=1e-6)  # smoothing lengthscales of the latent inducing variables (cp_inducing="latent")


class InducingSet(WhitenedGaussian):
    """G independent sets of M inducing variables at inputs Z [G, M, Dx]: u_g = L_g v_g with the shared whitened
    q(v_g) = N(m_g, R_g R_gᵀ) of `flowgp.variational.WhitenedGaussian` (KL[q(u) || p(u)] = KL[q(v) || N(0, I)]).

    The Ψ-statistics bound works in kernel space, so `posterior(K_uu)` also gives α = K⁻¹m_u, C = K⁻¹S_uK⁻¹, K⁻¹.
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

    def sample_beta(self, chol, num_samples, generator=None):
        """β = K⁻¹ u for u ~ q(u): L⁻ᵀ (m + R ε), shape [S, G, M]."""
        v = self.sample_whitened(num_samples, generator)  # m + R ε, [S, G, M]
        return torch.linalg.solve_triangular(chol.mT, v.unsqueeze(-1), upper=True).squeeze(-1)


def _se_kernel(num_outputs: int, variance: float, lengthscale: float, dtype: torch.dtype) -> Scale:
    """D scalar-input SE kernels σ²_d exp(-(x - x')²/(2ℓ_d²)), one per output (flowgp.kernels, batch (D,))."""
    return Scale(RBF(1, lengthscale=lengthscale, batch_shape=(num_outputs,), dtype=dtype), variance,
                 batch_shape=(num_outputs,), dtype=dtype)


def _per_point_psi(x, z, variance, lengthscale, var=None, with_mean: bool = False):
    """Ψ₁ of each point n under its own output's SE kernel: x [..., N] (with `var` [..., N] the input is
    N(x_n, var_n), without it a point mass, giving k_d(n)(x_n, z)), z [N, M, 1], variance and lengthscale [N]
    -> [..., N, M] (supplement eq. 24); with_mean also returns Ξ [..., N, M] (identity mean functions)."""
    amp = variance[:, None, None].expand(z.shape[0], 1, z.shape[1])  # [N, 1, M]
    lsq = lengthscale.square()[:, None, None, None].expand(z.shape[0], 1, z.shape[1], 1)  # [N, 1, M, 1]
    mean = x[..., None, None]  # [..., N, 1, 1]: each point is its own batch of one input
    v = torch.zeros_like(mean) if var is None else var[..., None, None]
    psi1 = gaussian_psi1(mean, v, z, amp, lsq)
    if not with_mean:
        return psi1[..., 0, :]
    return psi1[..., 0, :], gaussian_psi_mean(mean, v, z, psi1, lsq)[..., 0, :, 0]


#: state-dict keys of the SE hyperparameters before they moved into flowgp.kernels, and their constraints then
_OLD_SE_KEYS = {"raw_align_variance": ("align_kernel.raw_variance", 1e-10),
                "raw_align_lengthscale": ("align_kernel.base.raw_lengthscale", 1e-6),
                "raw_warp_variance": ("warp_kernel.raw_variance", 1e-10),
                "raw_warp_lengthscale": ("warp_kernel.base.raw_lengthscale", 1e-6)}


def _upgrade_state_dict(module, state_dict, prefix, *args):
    """Load files saved before the alignment / warping SE kernels became flowgp.kernels modules: raw [D]
    values (softplus + lower bound of that time) become the kernels' raw [D, 1, 1] parameters."""
    for old, (new, lower) in _OLD_SE_KEYS.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            value = Positive(lower=lower)(state_dict.pop(prefix + old))
            constraint = LENGTHSCALE_CONSTRAINT if new.endswith("lengthscale") else VARIANCE_CONSTRAINT
            state_dict[prefix + new] = constraint.inverse(value).reshape(-1, 1, 1)


def _layer_moments(psi0, psi1, phi_w, alpha, cov, in_mean=None, in_var=None, xi=None):
    """Exact moments of the noise-free layer output under a Gaussian input (module docstring).

    phi_w = tr(Φ_n W) with W = ααᵀ + C - K⁻¹, so var = ψ0 + tr(Φ_n W) - (Ψ_n α)² (+ identity-mean terms).
    Returns (mean [B], var [B], psi_c [B]) with psi_c = Ψ C Ψᵀ. `in_mean` adds the identity mean; with a
    random input, `in_var` adds its variance and `xi` (Ξ, [B, M]) its covariance with the GP part.
    """
    psi_a = (psi1 * alpha).sum(-1)
    # Ψ C Ψᵀ >= 0 (C is PSD); rounding in float32 can leave it slightly negative, which would make the next
    # layer's input variance σ² + ΨCΨᵀ negative
    psi_c = torch.einsum("...m,...mk,...k->...", psi1, cov, psi1).clamp_min(0.0)
    var = psi0 + phi_w - psi_a.square()
    mean = psi_a
    if in_mean is not None:
        mean = mean + in_mean
    if xi is not None:
        var = var + in_var + 2.0 * ((xi * alpha).sum(-1) - in_mean * psi_a)
    return mean, var.clamp_min(0.0), psi_c


def _weight(alpha, cov, kinv):
    """W = ααᵀ + C - K⁻¹ (batched over leading dimensions, e.g. [G, M, M] for G inducing sets)."""
    return alpha.unsqueeze(-1) * alpha.unsqueeze(-2) + cov - kinv


class AMOGP(nn.Module):
    """AMO-GP over D outputs with 1-D inputs (module docstring for the bound and predictions).

    Args:
        z_alignment: [D, M_a] initial inducing inputs of the alignment GPs (ignored if alignment=False).
        z_latent: [D, M_f] initial inducing inputs of the CP layer, one set per output.
        z_warping: [D, M_g] initial inducing inputs of the warping GPs (ignored if warping=False).
        latent_processes: R white-noise latents of the CP layer.
        alignment / warping: False fixes that layer to the identity (no GP, no noise): both False is the
            MO-GP (a sparse GP with the CP kernel), warping=False alone the aligned-only ablation.
        lengthscale, variance: initial CP auto-covariance lengthscale and variance per output.
        alignment_variance/lengthscale, warping_variance/lengthscale: initial SE hyperparameters.
        noise: σ²_y init; alignment_noise σ²_a, latent_noise σ²_f inits (only with the GP layers).
        q_var_init: initial whitened S = q_var_init·I for every inducing set.
        jitter: diagonal jitter of the CP layer's K_uu (None: the dtype default of robust_cholesky).
        cp_inducing: where the CP layer's inducing variables live. "output" (the supplement's choice, §3.1: one
            set u_{f,d} per output, z_latent [D, M_f]); "latent": one set per latent process on a smoothed copy
            of the latent with a learned smoothing lengthscale (Álvarez et al. 2010, flowgp.convolution),
            z_latent [R, M_f], num_outputs required. The prior is the same; only the variational family
            differs. With one latent the outputs are smoothed copies of one process, so per-output sets are
            nearly linearly dependent (cond(K_uu) 1e17-1e19 on the London data, docs/results/amogp); the
            latent sets are not, and R·M_f of them cost (D/R)² less Ψ₂ work than D·M_f per-output ones.
    """

    def __init__(self, z_alignment, z_latent, z_warping, latent_processes: int = 1, alignment: bool = True,
                 warping: bool = True, lengthscale: float = 1.0, variance: float = 1.0,
                 alignment_variance: float = 0.05, alignment_lengthscale: float = 1.0,
                 warping_variance: float = 0.05, warping_lengthscale: float = 1.0, noise: float = 0.05,
                 alignment_noise: float = 1e-3, latent_noise: float = 1e-3, q_var_init: float = 1e-5,
                 jitter: float | None = None, cp_inducing: str = "output", num_outputs: int | None = None):
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
        self.alignment, self.warping = bool(alignment), bool(warping)
        self.kernel = ConvolutionKernel(d, 1, latent_processes, lengthscale=lengthscale, variance=variance,
                                        dtype=dtype)
        # jitter: of the CP layer's K_uu (None: the dtype default). With one latent process and per-output sets
        # at the same places K_uu is close to singular (benchmarks/amogp_sensitivity.py)
        if cp_inducing == "output":
            self.latent = InducingSet(z_latent.reshape(1, d * mf, 1), q_var_init, jitter)
            self.register_buffer("latent_output", torch.arange(d).repeat_interleave(mf), persistent=False)
        else:
            self.latent = InducingSet(z_latent.unsqueeze(-1), q_var_init, jitter)
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

    def cp_kuu(self) -> torch.Tensor:
        """K_uu of the CP layer's inducing sets, [G, M, M]: one [D·M_f]² block over all outputs
        (cp_inducing="output") or one [M_f]² block per latent ("latent")."""
        if self.cp_inducing == "latent":
            return self.kernel.inducing_covariance(self.latent.z, self.inducing_lengthscale)
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
        """(α [M_total], C, K⁻¹ [M_total, M_total]) of the CP layer with its inducing sets stacked."""
        alpha, cov, kinv, _ = post["f"]
        if alpha.shape[0] == 1:
            return alpha[0], cov[0], kinv[0]
        return alpha.reshape(-1), torch.block_diag(*cov), torch.block_diag(*kinv)

    def _posteriors(self):
        post = {"f": self.latent.posterior(self.cp_kuu())}
        if self.alignment:
            post["a"] = self.align.posterior(self.align_kernel(self.align.z))  # K_uu [D, M, M]
        if self.warping:
            post["g"] = self.warp.posterior(self.warp_kernel(self.warp.z))
        return post

    def _alignment_layer(self, post, x, out):
        """Moments (mean, var, ΨCΨᵀ) of â at deterministic x [B, 1]: eq. 15's pieces (Φ_n = Ψ_nᵀΨ_n)."""
        var, ls = self._align_params()
        alpha, cov, _, _ = post["a"]
        psi1 = _per_point_psi(x[:, 0], self.align.z[out], var[out], ls[out])  # deterministic input: Ψ₁ = k(x, Z)
        phi_w = torch.einsum("bm,bmk,bk->b", psi1, _weight(*post["a"][:3])[out], psi1)
        return _layer_moments(var[out], psi1, phi_w, alpha[out], cov[out], in_mean=x[:, 0])

    def _latent_layer(self, post, mean, var, out, random_input: bool):
        """Moments of f̂ under q(a_n) = N(mean, var) with the CP Ψ-statistics (A.3); `random_input` False: var is 0
        (a deterministic input, Φ_n = Ψ_nᵀΨ_n)."""
        alpha, cov, kinv = self._cp_posterior(post)
        groups = self._cp_groups(out)
        psi1 = self._cp_psi1(mean, var, groups)
        w = _weight(alpha, cov, kinv)
        if not random_input:
            phi_w = torch.einsum("bm,mk,bk->b", psi1, w, psi1)
        else:
            # inducing inputs in groups with one prefactor and lengthscale each, so tr(Φ_n W) is evaluated
            # without per-point M x M blocks (flowgp.psi_statistics.grouped_psi2_contract)
            z, amp, lsq, repeats = groups
            g, mg = z.shape[0], z.shape[1]
            wg = w.reshape(1, g // repeats, mg, 1, g // repeats, mg).repeat(repeats, 1, 1, repeats, 1, 1)
            phi_w = grouped_psi2_contract(mean.unsqueeze(-1), var.unsqueeze(-1), z, wg.reshape(g, mg, g, mg), amp,
                                          lsq)
        psi0 = self.kernel.variance.sum(-1)[out]
        return _layer_moments(psi0, psi1, phi_w, alpha, cov)

    def _warping_layer(self, post, mean, var, out, random_input: bool):
        """Moments of ĝ(f) + f under q(f_n) = N(mean, var) with SE Ψ-statistics and Ξ for the identity mean.

        Every output's warping GP has one lengthscale, so eq. 25 with A = B = λ_d reads
            Φ_n,ij = σ⁴_d exp(-(z_i - z_j)²/(4λ_d)) sqrt(c/(c + v_n)) exp(-(μ_n - (z_i + z_j)/2)²/(2(c + v_n))),
        c = λ_d/2: the (i, j) factor and the weight are folded per output once, and the points of all outputs
        are evaluated together (each point against its own output's inducing inputs).
        """
        wvar, wls = self._warp_params()
        alpha, cov, _, _ = post["g"]
        lam = wls.square()  # [D]
        zw = self.warp.z[..., 0]  # [D, M]
        pair = wvar[:, None, None].square() * torch.exp(
            -(zw[:, :, None] - zw[:, None, :]).square() / (4.0 * lam[:, None, None]))  # [D, M, M]
        folded = pair * _weight(*post["g"][:3])  # Σ_ij Φ_n,ij W_ij needs Φ only through this
        centre = 0.5 * (zw[:, :, None] + zw[:, None, :])
        c = 0.5 * lam[out]
        cv = c + var  # [B]
        e = torch.exp(-(mean[:, None, None] - centre[out]).square() / (2.0 * cv)[:, None, None])  # [B, M, M]
        phi_w = torch.sqrt(c / cv) * torch.einsum("bij,bij->b", e, folded[out])
        psi1, xi = _per_point_psi(mean, self.warp.z[out], wvar[out], wls[out], var=var, with_mean=True)
        return _layer_moments(wvar[out], psi1, phi_w, alpha[out], cov[out], in_mean=mean, in_var=var,
                              xi=xi if random_input else None)

    def _propagate(self, x, out, post, exact: bool):
        """Run the three layers. exact=False: the bound's inputs N(mean, σ² + ΨCΨᵀ) and its penalties;
        exact=True: moment matching (input variance = exact var + σ²). Returns per-layer moments and penalty."""
        penalty = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        layers = {}
        if self.alignment:
            m, v, pc = self._alignment_layer(post, x, out)
            s2 = self.alignment_noise[out]
            penalty = penalty + (v - pc) / (2.0 * s2)
            layers["a"] = (m, v)
            a_mean, a_var = m, (v if exact else pc) + s2
        else:
            a_mean, a_var = x[:, 0], torch.zeros_like(x[:, 0])
            layers["a"] = (a_mean, a_var)
        # with an alignment layer the CP input is random (its variance includes σ²_a > 0)
        m, v, pc = self._latent_layer(post, a_mean, a_var, out, random_input=self.alignment)
        layers["f"] = (m, v)
        if not self.warping:
            layers["g"] = (m, v)
            return layers, penalty
        s2 = self.latent_noise[out]
        penalty = penalty + (v - pc) / (2.0 * s2)
        f_mean, f_var = m, (v if exact else pc) + s2
        layers["f_input"] = (f_mean, f_var)
        layers["g"] = self._warping_layer(post, f_mean, f_var, out, random_input=True)[:2]  # σ²_f > 0
        return layers, penalty

    # ----- bound ---------------------------------------------------------------------------------------
    def elbo_terms(self, x, y, out):
        """Per-point expected log-likelihood and compression penalty, each [B] (no KL, no scaling)."""
        post = self._posteriors()
        layers, penalty = self._propagate(x, out, post, exact=False)
        mean, var = layers["g"]
        mean = mean + self.offset[out]
        s2 = self.noise[out]
        ell = -0.5 * torch.log(2.0 * math.pi * s2) - ((y - mean).square() + var) / (2.0 * s2)
        return ell, penalty

    def elbo(self, x: torch.Tensor, y: torch.Tensor, output: torch.Tensor, num_data: int | None = None,
             generator: torch.Generator | None = None):
        """Nested variational compression bound (supplement eq. 22), minibatch-scaled by num_data / B.

        Per-point terms (expected log-likelihood minus compression penalties) and the KL terms are assembled
        by `flowgp.objective.minibatch_bound`. The bound is closed form: `generator` is accepted (the common
        elbo signature) and unused.
        """
        x, output, y = self.validate(x, output, y)
        ell, penalty = self.elbo_terms(x, y, output)
        return minibatch_bound(ell - penalty, [self.kl_divergence()], num_data, x.shape[0])

    # ----- predictions ---------------------------------------------------------------------------------
    def predict_layers(self, x, output, chunk: int = 512):
        """Propagated Gaussian approximation (A.4): dict of (mean, var) [N] for â (alignment, noise-free),
        f̂ (latent CP output at the propagated alignment) and y (warped output, noise included)."""
        x, output = self.validate(x, output)
        post = self._posteriors()
        res = {"a": [], "f": [], "y": []}
        for i in range(0, x.shape[0], chunk):
            xs, os_ = x[i:i + chunk], output[i:i + chunk]
            layers, _ = self._propagate(xs, os_, post, exact=True)
            res["a"].append(layers["a"])
            res["f"].append(layers["f"])
            m, v = layers["g"]
            res["y"].append((m + self.offset[os_], v + self.noise[os_]))
        return {k: (torch.cat([p[0] for p in v]), torch.cat([p[1] for p in v])) for k, v in res.items()}

    def predict_y(self, x, output):
        """Moment-matched predictive mean and variance of y* per point, each [N]."""
        return self.predict_layers(x, output)["y"]

    def alignment_function(self, x, d: int):
        """q(â_d(x)) at deterministic inputs x [N, 1]: (mean, var) [N] (identity when alignment=False)."""
        out = torch.full((x.shape[0],), int(d), dtype=torch.long, device=x.device)
        x, out = self.validate(x, out)
        if not self.alignment:
            return x[:, 0], torch.zeros_like(x[:, 0])
        return self._alignment_layer(self._posteriors(), x, out)[:2]

    def latent_function(self, a, d: int):
        """q(f̂_d(a)) at deterministic CP inputs a [N, 1]: (mean, var) [N]."""
        out = torch.full((a.shape[0],), int(d), dtype=torch.long, device=a.device)
        a, out = self.validate(a, out)
        return self._latent_layer(self._posteriors(), a[:, 0], torch.zeros_like(a[:, 0]), out, random_input=False)[:2]

    def warping_function(self, f, d: int):
        """q(ĝ_d(f)) at deterministic warping inputs f [N, 1]: (mean, var) [N] (identity when warping=False)."""
        out = torch.full((f.shape[0],), int(d), dtype=torch.long, device=f.device)
        f, out = self.validate(f, out)
        if not self.warping:
            return f[:, 0], torch.zeros_like(f[:, 0])
        return self._warping_layer(self._posteriors(), f[:, 0], torch.zeros_like(f[:, 0]), out,
                                   random_input=False)[:2]

    def sample(self, x, output, num_samples: int = 100, generator=None, common_noise: bool = False):
        """Samples through the hierarchy (u ~ q(u) per sample, then each layer's conditional at the sampled
        inputs, marginally per point). Returns a dict of [S, N] tensors: a, f, g (noise-free warped value)
        (without the offset b_d) and y_mean, y_var (the Gaussian of y* given the sampled f and u_g).

        common_noise: every point uses the same standard-normal draw per sample and layer (common random
        numbers): each point's samples keep their distribution, and a point's samples no longer depend on
        which other points are drawn with it, so rows can be predicted in chunks with the generator replayed."""
        x, output = self.validate(x, output)
        post = self._posteriors()
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
    """The three layers and the prediction per output, as numbers for `flowgp.plotting.amogp_layers_figure`.

    x_grid: 1-D array of inputs (model units). Returns one dict per output d with "alignment" (x, mean â_d(x),
    var), "latent" (a, f̂_d(a), var) over the range of â_d ± 0.2, "warping" (f, ĝ_d(f) + b_d, var) over the
    range of f̂_d ± 0.5 (g_d(f) + b_d is the map from f to the mean of y) and "prediction" (x, mean, var of y),
    each a NumPy array [G].
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
