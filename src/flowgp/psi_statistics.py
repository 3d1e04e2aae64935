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
The bound only needs Φ_n through tr(Φ_n W): `grouped_psi2_contract` computes that without per-point M x M
blocks in autograd (the split of eq. 25's exponent is derived above `_BlockedExpContract`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .convolution import ConvolutionKernel

__all__ = ["gaussian_psi1", "gaussian_psi2", "gaussian_psi_mean", "se_psi_statistics", "cp_psi_statistics",
           "gaussian_psi2_contract", "grouped_psi2_contract", "PsiStatistics"]

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


# ----- Φ contracted with a weight without per-point M x M blocks in autograd ---------------------------------
#
# For one input dimension, a point N(μ, v) and a pair of SE factors with squared lengthscales A (for z_i) and
# B (for z_j), S = A + B, C = AB/S, m_ij = (B z_i + A z_j)/S (eq. 25), expanding (μ - m_ij)² around the two
# inducing inputs gives, with e_i = μ - z_i and α = B/S, β = A/S (α + β = 1),
#     (μ - m_ij)² = α e_i² + β e_j² - αβ (z_i - z_j)²,
# so eq. 25's exponent -(z_i-z_j)²/(2S) - (μ-m_ij)²/(2(C+v)) splits into a row term, a column term and a term in
# (z_i - z_j)² alone whose coefficient is the only coupling between the point and the pair:
#     Φ_n,ij = c_i c_j sqrt(C/(C+v_n)) exp(-e_i² B/(2(AB + S v_n))) exp(-e_j² A/(2(AB + S v_n)))
#              · exp(-(z_i - z_j)² v_n/(2(AB + S v_n)))                                   (per dimension).
# With v_n = 0 the last factor is 1 and Φ_n = Ψ_nᵀΨ_n. When the inducing inputs come in groups with a
# group-constant prefactor and lengthscale (the CP kernel: one group per output), everything but the last
# factor's exp and the weight is a per-(point, block) or per-(point, row) quantity, and the heavy part is
#     t_n,P = Σ_ij exp(la_n,P,i + lb_n,P,j - Σ_k κ_n,P,k dz_P,k,ij) w_P,ij       (block P = (p, q) of groups),
# which `_BlockedExpContract` evaluates in chunks of points with a hand-written backward: one exp per
# (point, i, j) and never an autograd graph over [N, M, M]. Φ and W are symmetric, so only the blocks p <= q
# are evaluated (p < q twice).


class _BlockedExpContract(torch.autograd.Function):
    """t[n, P] = Σ_ij exp(la[n,P,i] + lb[n,P,j] - Σ_k κ[n,P,k] dz[P,k,i,j]) w[P,i,j], chunked over n.

    la, lb [N, P, Mg] (<= 0); kappa [N, P, Dx] (>= 0); dz [P, Dx, Mg, Mg] (>= 0); w [P, Mg, Mg]. The backward
    recomputes the exponentials chunk by chunk (memory O(chunk · P · Mg²)) and returns the gradients of all five
    inputs. Work buffers are laid out [P, chunk, ·, ·] so that every contraction is a batched matmul over P.

    Every term is at most exp(la_i + lb_j), so rows i (columns j) whose la (lb) is below `_NEGLIGIBLE` for every
    point and block of a chunk add less than e^-40 ≈ 4e-18 of |w| and are skipped: each chunk works on the
    window of rows and columns that matter to it (with points sorted by input and inducing inputs sorted within
    their groups, as `grouped_psi2_contract` does, that window is narrow once lengthscales are short).
    """

    _NEGLIGIBLE = -40.0
    #: the forward keeps its exponentials for the backward when they fit in this many elements (64 MiB of
    #: float64; the exps are most of the cost), and the backward recomputes them chunk by chunk otherwise
    _KEEP_ELEMENTS = 1 << 23
    #: exponents are clamped here first: exp of a number below about -745 underflows through the slow subnormal
    #: path of the vectorised exp (6x slower), and exp(-700) ≈ 1e-304 is already 0 at the scale of any term
    _FLOOR = -700.0

    @staticmethod
    def _window(logf):
        """(start, stop) of the indices whose log factor [nc, P, Mg] exceeds _NEGLIGIBLE somewhere."""
        idx = (logf.amax((0, 1)) > _BlockedExpContract._NEGLIGIBLE).nonzero()
        return (0, 0) if idx.numel() == 0 else (int(idx[0, 0]), int(idx[-1, 0]) + 1)

    @staticmethod
    def _exp_chunk(la, lb, kappa, dz, buf, win):
        """The chunk's exponentials [P, nc, rows, cols] in `buf` (a flat buffer; None: a new tensor)."""
        (i0, i1), (j0, j1) = win
        p, nc = dz.shape[0], la.shape[0]
        shape = (p, nc, i1 - i0, j1 - j0)
        e = la.new_empty(shape) if buf is None else buf.view(-1)[:math.prod(shape)].view(shape)
        torch.add(la[..., i0:i1].transpose(0, 1).unsqueeze(-1), lb[..., j0:j1].transpose(0, 1).unsqueeze(-2), out=e)
        kap = kappa.transpose(0, 1)  # [P, nc, Dx]
        for k in range(dz.shape[1]):
            e.addcmul_(kap[:, :, k, None, None], dz[:, k, i0:i1, j0:j1].unsqueeze(1), value=-1.0)
        return e.clamp_(min=_BlockedExpContract._FLOOR).exp_()

    @staticmethod
    def _matvec(a, x, out):
        """out[q] = a[q] @ x[q] for a [P, n, K], x [P, K] (one mv per block: bmm with a single column is
        several times slower than mv on CPU)."""
        for q in range(a.shape[0]):
            out[q] = torch.mv(a[q], x[q])

    @staticmethod
    def _chunk_size(p, mg):
        return max(1, min(256, (1 << 18) // max(1, p * mg * mg)))  # ~2 MiB of float64 per chunk

    @staticmethod
    def forward(ctx, la, lb, kappa, dz, w):
        n, p, mg = la.shape
        chunk = _BlockedExpContract._chunk_size(p, mg)
        keep = n * p * mg * mg <= _BlockedExpContract._KEEP_ELEMENTS
        buf = None if keep else la.new_empty(p, min(chunk, n), mg, mg)
        out = la.new_zeros(p, n)
        windows, kept = [], []
        for s in range(0, n, chunk):
            sl = slice(s, s + chunk)
            win = (_BlockedExpContract._window(la[sl]), _BlockedExpContract._window(lb[sl]))
            windows.append(win)
            (i0, i1), (j0, j1) = win
            if i1 == i0 or j1 == j0:
                kept.append(None)
                continue
            e = _BlockedExpContract._exp_chunk(la[sl], lb[sl], kappa[sl], dz, buf, win)
            kept.append(e if keep else None)
            _BlockedExpContract._matvec(e.reshape(p, e.shape[1], -1), w[:, i0:i1, j0:j1].reshape(p, -1), out[:, sl])
        ctx.save_for_backward(la, lb, kappa, dz, w)
        ctx.windows = windows
        ctx.kept = kept  # intermediates (not inputs or outputs): kept on ctx, read-only in the backward
        return out.transpose(0, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        # with E = exp(exponent) and G = Σ_n,P g_n,P t_n,P: ∂G/∂w = Σ_n g E_n, ∂G/∂dz_k = -w ∘ Σ_n g κ_k E_n,
        # ∂G/∂κ_k = -g Σ_ij E (w ∘ dz_k), ∂G/∂la_i = g Σ_j E (w), ∂G/∂lb_j = g Σ_i E (w)
        la, lb, kappa, dz, w = ctx.saved_tensors
        n, p, mg = la.shape
        dx = dz.shape[1]
        chunk = _BlockedExpContract._chunk_size(p, mg)
        buf = la.new_empty(p, min(chunk, n), mg, mg)
        g_la, g_lb = la.new_zeros(p, n, mg), lb.new_zeros(p, n, mg)
        g_kappa = kappa.new_zeros(p, n, dx)
        acc = la.new_zeros(p, 1 + dx, mg, mg)  # Σ_n g E_n and Σ_n g κ_k E_n
        grad_t = grad.transpose(0, 1).contiguous()  # [P, N]
        coeff = torch.cat([grad_t.unsqueeze(-1), grad_t.unsqueeze(-1) * kappa.transpose(0, 1)], -1)  # [P, N, 1+Dx]
        wdz = w.unsqueeze(1) * dz  # [P, Dx, Mg, Mg]
        for s, win, kept in zip(range(0, n, chunk), ctx.windows, ctx.kept):
            (i0, i1), (j0, j1) = win
            if i1 == i0 or j1 == j0:
                continue
            sl = slice(s, s + chunk)
            e = kept if kept is not None else _BlockedExpContract._exp_chunk(la[sl], lb[sl], kappa[sl], dz, buf, win)
            nc, ri, cj = e.shape[1], i1 - i0, j1 - j0
            flat = e.reshape(p, nc, ri * cj)
            acc[:, :, i0:i1, j0:j1] += torch.bmm(coeff[:, sl].transpose(1, 2), flat).reshape(p, 1 + dx, ri, cj)
            for k in range(dx):
                _BlockedExpContract._matvec(flat, wdz[:, k, i0:i1, j0:j1].reshape(p, -1), g_kappa[:, sl, k])
            # E ∘ w into the work buffer: a kept E stays intact (a second backward with retain_graph reads it)
            ew = buf.view(-1)[:e.numel()].view(e.shape)
            torch.mul(e, w[:, i0:i1, j0:j1].unsqueeze(1), out=ew)
            g_la[:, sl, i0:i1] = ew.sum(-1)
            g_lb[:, sl, j0:j1] = ew.sum(-2)
        g = grad_t.unsqueeze(-1)
        g_w = acc[:, 0]
        g_dz = -(w.unsqueeze(1) * acc[:, 1:])
        return ((g * g_la).transpose(0, 1), (g * g_lb).transpose(0, 1), (-g * g_kappa).transpose(0, 1), g_dz, g_w)


def grouped_psi2_contract(mean, var, z, weight, amp, lsq) -> torch.Tensor:
    """Σ_ij Φ_n,ij W_ij [N] for SE-shaped kernels whose inducing inputs come in G groups of equal size Mg with
    a prefactor and squared lengthscale constant over each group (they may depend on the point), eq. 25
    contracted with W without materialising Φ_n (see the comment block above `_BlockedExpContract`).

    mean, var [N, Dx] (moments of q(a_n)); z [G, Mg, Dx]; weight [G, Mg, G, Mg] (W over the G·Mg inducing
    inputs; only its symmetric part matters since Φ_n is symmetric); amp [N, G] (c of point n with group g);
    lsq [N, G, Dx] (λ of point n with group g). Equal to `gaussian_psi2_contract` on the ungrouped inputs.
    """
    _check_moments(mean, var)
    n, dx = mean.shape
    g, mg = z.shape[0], z.shape[1]
    if weight.shape != (g, mg, g, mg):
        raise ValueError(f"weight must have shape [{g}, {mg}, {g}, {mg}] to match z, got {tuple(weight.shape)}")
    if amp.shape != (n, g) or lsq.shape != (n, g, dx):
        raise ValueError(f"amp must be [{n}, {g}] and lsq [{n}, {g}, {dx}], got {tuple(amp.shape)} and "
                         f"{tuple(lsq.shape)}")
    # points sorted by (first) input and inducing inputs sorted within groups: a chunk of neighbouring points
    # then only needs a contiguous window of rows and columns (see _BlockedExpContract); the sum is invariant
    order = torch.argsort(mean[:, 0].detach())
    inverse = torch.argsort(order)
    mean, var, amp, lsq = mean[order], var[order], amp[order], lsq[order]
    zorder = torch.argsort(z[..., 0].detach(), dim=1)  # [G, Mg]
    z = torch.gather(z, 1, zorder.unsqueeze(-1).expand_as(z))
    gi = torch.arange(g, device=z.device)
    weight = weight[gi[:, None, None, None], zorder[:, :, None, None], gi[None, None, :, None], zorder[None, None]]
    rows, cols = torch.triu_indices(g, g, device=mean.device)  # blocks P = (p, q), p <= q
    a, b = lsq[:, rows], lsq[:, cols]  # [N, P, Dx]
    s = a + b
    v = var.unsqueeze(1)  # [N, 1, Dx]
    denom = a * b + s * v  # AB + S v = S (C + v)
    # per-(point, block) prefactor c_p c_q Π_k sqrt(C/(C+v)) = c_p c_q Π_k sqrt(AB/(AB + S v))
    scale = amp[:, rows] * amp[:, cols] * torch.exp(0.5 * ((a * b).log() - denom.log()).sum(-1))
    mu = mean[:, None, None, :]  # [N, 1, 1, Dx]
    la = -0.5 * ((mu - z[rows].unsqueeze(0)).square() * (b / denom).unsqueeze(2)).sum(-1)  # [N, P, Mg]
    lb = -0.5 * ((mu - z[cols].unsqueeze(0)).square() * (a / denom).unsqueeze(2)).sum(-1)
    kappa = 0.5 * v / denom  # [N, P, Dx]
    dz = (z[rows].unsqueeze(2) - z[cols].unsqueeze(1)).square().permute(0, 3, 1, 2)  # [P, Dx, Mg, Mg]
    wsym = 0.5 * (weight + weight.permute(2, 3, 0, 1))
    w = wsym[rows, :, cols, :]  # [P, Mg, Mg]
    w = w * torch.where(rows == cols, 1.0, 2.0).to(w.dtype)[:, None, None]
    t = _BlockedExpContract.apply(la, lb, kappa, dz, w)
    return (scale * t).sum(-1)[inverse]
