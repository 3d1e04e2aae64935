"""Ψ-statistics of Gaussian-shaped kernels under a diagonal Gaussian input q(a_n) = N(μ_n, diag v_n)
(AMO-GP supplement A.3, eqs. 20, 23-25; Titsias & Lawrence 2010 for the SE special case).

Every kernel here is a sum of terms  k(a, z) = c · exp(-½ Σ_k (a_k - z_k)² / λ_k)  whose prefactor c and
squared lengthscale λ may depend on the pair (n, i) (the CP kernel: λ = ℓ_d² + ℓ_d'²). Per dimension,

    ψ0_n      = E[k(a_n, a_n)] = c_nn                                           (stationary kernels)
    Ψ_ni      = E[k(a_n, z_i)] = c Π_k sqrt(λ/(λ+v)) exp(-(μ-z_i)²/(2(λ+v)))                       (eq. 24)
    Φ_n,ij    = E[k(a_n, z_i) k(a_n, z_j)]
              = c_i c_j Π_k exp(-(z_i-z_j)²/(2(A+B))) sqrt(C/(C+v)) exp(-(μ-m)²/(2(C+v)))         (eq. 25)
                with A = λ_ni, B = λ_nj, C = AB/(A+B), m = (B z_i + A z_j)/(A+B),
    Ξ_n,ik    = E[a_nk k(a_n, z_i)] = Ψ_ni (λ μ_k + v z_ik)/(λ + v)   (needed for an identity mean function).

(Eqs. 24-25 of the supplement write these with precisions 1/λ, printed as ℓ̂.) Φ is returned per data point,
[..., N, M, M]; the bound sums it over the minibatch. Everything broadcasts over leading batch dimensions.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .convolution import ConvolutionKernel

__all__ = ["gaussian_psi1", "gaussian_psi2", "gaussian_psi_mean", "se_psi_statistics", "cp_psi_statistics",
           "PsiStatistics"]

class PsiStatistics(NamedTuple):
    psi0: torch.Tensor  # [..., N]       E[k(a_n, a_n)]
    psi1: torch.Tensor  # [..., N, M]    E[k(a_n, Z)]
    psi2: torch.Tensor  # [..., N, M, M] E[k(Z, a_n) k(a_n, Z)] per point (sum over n gives eq. 20's Φ)


def _check_moments(mean, var):
    if mean.shape != var.shape:
        raise ValueError(f"mean and var must have the same shape [..., N, D], got {tuple(mean.shape)} and "
                         f"{tuple(var.shape)}")
    if torch.any(var < 0):
        raise ValueError("var must be non-negative (the diagonal of q(a)'s covariance)")


def gaussian_psi1(mean, var, z, amp, lsq) -> torch.Tensor:
    """Ψ_ni = E_{N(μ_n, v_n)}[c_ni exp(-½ Σ_k (a_k - z_ik)²/λ_nik)]: mean, var [..., N, D]; z [..., M, D];
    amp [..., N, M]; lsq [..., N, M, D] -> [..., N, M] (eq. 24 with λ the combined squared lengthscale)."""
    _check_moments(mean, var)
    denom = lsq + var.unsqueeze(-2)  # [..., N, M, D]
    diff2 = (mean.unsqueeze(-2) - z.unsqueeze(-3)).square()
    log_term = 0.5 * (lsq / denom).log() - 0.5 * diff2 / denom
    return amp * torch.exp(log_term.sum(-1))


def gaussian_psi2(mean, var, z, amp1, lsq1, amp2=None, lsq2=None) -> torch.Tensor:
    """Φ_n,ij = E[k1(a_n, z_i) k2(a_n, z_j)] for two Gaussian-shaped kernels (eq. 25), [..., N, M, M].

    amp1/amp2 [..., N, M], lsq1/lsq2 [..., N, M, D]; k2 defaults to k1.
    """
    _check_moments(mean, var)
    if amp2 is None:
        amp2, lsq2 = amp1, lsq1
    a = lsq1.unsqueeze(-2)  # [..., N, M, 1, D]   λ for z_i
    b = lsq2.unsqueeze(-3)  # [..., N, 1, M, D]   λ for z_j
    zi = z.unsqueeze(-2).unsqueeze(-4)  # [..., 1, M, 1, D]
    zj = z.unsqueeze(-3).unsqueeze(-4)  # [..., 1, 1, M, D]
    s = a + b
    c = a * b / s
    centre = (b * zi + a * zj) / s
    v = var.unsqueeze(-2).unsqueeze(-2)  # [..., N, 1, 1, D]
    mu = mean.unsqueeze(-2).unsqueeze(-2)
    cv = c + v
    log_term = (-0.5 * (zi - zj).square() / s + 0.5 * (c / cv).log() - 0.5 * (mu - centre).square() / cv)
    return amp1.unsqueeze(-1) * amp2.unsqueeze(-2) * torch.exp(log_term.sum(-1))


def gaussian_psi_mean(mean, var, z, psi1, lsq) -> torch.Tensor:
    """Ξ_n,ik = E[a_nk k(a_n, z_i)] = Ψ_ni (λ μ_k + v z_ik)/(λ + v), [..., N, M, D] (identity mean functions)."""
    v = var.unsqueeze(-2)
    mu = mean.unsqueeze(-2)
    return psi1.unsqueeze(-1) * (lsq * mu + v * z.unsqueeze(-3)) / (lsq + v)


def se_psi_statistics(mean, var, z, variance, lengthscale, with_mean: bool = False):
    """Ψ-statistics of k(a, z) = σ² exp(-½ Σ_k (a_k - z_k)²/ℓ_k²) under N(μ_n, diag v_n).

    mean, var [..., N, D]; z [..., M, D]; variance broadcastable to [..., 1, 1] (e.g. [..., 1, 1]) and
    lengthscale to [..., 1, 1, D]. Returns PsiStatistics (and Ξ [..., N, M, D] when with_mean).
    """
    variance = torch.as_tensor(variance, dtype=mean.dtype, device=mean.device)
    lengthscale = torch.as_tensor(lengthscale, dtype=mean.dtype, device=mean.device)
    n, m = mean.shape[-2], z.shape[-2]
    ones = torch.ones(n, m, dtype=mean.dtype, device=mean.device)
    amp = variance * ones  # [..., N, M]
    lsq = lengthscale.square() * ones.unsqueeze(-1)  # [..., N, M, D]
    psi0 = (variance * ones[:, :1]).squeeze(-1).expand(mean.shape[:-1])
    psi1 = gaussian_psi1(mean, var, z, amp, lsq)
    psi2 = gaussian_psi2(mean, var, z, amp, lsq)
    stats = PsiStatistics(psi0, psi1, psi2)
    if with_mean:
        return stats, gaussian_psi_mean(mean, var, z, psi1, lsq)
    return stats


def cp_psi_statistics(kernel: ConvolutionKernel, mean, var, out, z, z_out) -> PsiStatistics:
    """Ψ-statistics of the convolution-process kernel (supplement A.3, eqs. 23-25, summed over R latents).

    mean, var [..., N, D] are the moments of q(a_n) for the points of output out[n]; z [M, D] are inducing
    inputs of outputs z_out [M]. ψ0_n = Σ_r v_{out[n], r}; Ψ and Φ sum the Gaussian terms over latents
    (Φ over latent pairs r, r', since E[k k] = Σ_{r,r'} E[k_r k_r']).
    """
    amp, lsq = kernel.pair_parameters(out, z_out)  # [R, N, M], [R, N, M, D]
    m_ = mean.unsqueeze(-3)  # [..., 1, N, D]
    v_ = var.unsqueeze(-3)
    psi0 = kernel.variance.sum(-1)[out].expand(mean.shape[:-1])
    psi1 = gaussian_psi1(m_, v_, z, amp, lsq).sum(-3)
    r = kernel.latent_processes
    if r == 1:
        psi2 = gaussian_psi2(m_, v_, z, amp, lsq).sum(-4)
    else:
        m2, v2 = m_.unsqueeze(-4), v_.unsqueeze(-4)  # [..., 1, 1, N, D]
        psi2 = gaussian_psi2(m2, v2, z, amp[:, None], lsq[:, None], amp[None, :], lsq[None, :]).sum((-5, -4))
    return PsiStatistics(psi0, psi1, psi2)


def gaussian_psi2_contract(mean, var, z, weight, amp1, lsq1, amp2=None, lsq2=None) -> torch.Tensor:
    """Σ_ij Φ_n,ij W_ij for kernels whose prefactors/lengthscales depend on (i, j) only, [N].

    The bound and the moments need Φ_n only through such contractions (W = ααᵀ + C - K⁻¹), so this
    avoids materialising per-point Φ in autograd: the (i, j) parts of eq. 25 are precomputed once.
    mean, var [N, D]; z [M, D]; weight [M, M]; amp [M]; lsq [M, D].
    """
    _check_moments(mean, var)
    if amp2 is None:
        amp2, lsq2 = amp1, lsq1
    a, b = lsq1.unsqueeze(-2), lsq2.unsqueeze(-3)  # [M, 1, D], [1, M, D]
    zi, zj = z.unsqueeze(-2), z.unsqueeze(-3)
    s = a + b
    c = a * b / s  # [M, M, D]
    centre = (b * zi + a * zj) / s
    const = (amp1.unsqueeze(-1) * amp2.unsqueeze(-2)).log() - 0.5 * ((zi - zj).square() / s).sum(-1)  # [M, M]
    cv = c + var[:, None, None, :]  # [N, M, M, D]
    log_term = (0.5 * (c / cv).log() - 0.5 * (mean[:, None, None, :] - centre).square() / cv).sum(-1)
    return (torch.exp(log_term + const) * weight).sum((-1, -2))
