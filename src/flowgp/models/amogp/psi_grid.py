"""Ψ₁ and tr(Φ_n W) of the CP layer when its inducing inputs are a fixed uniform grid (one input dimension).

With z_i = a + i·h (i = 0..M-1) the M² pairs of inducing inputs have only 2M - 1 midpoints m_s = a + s·h/2
(s = i + j) and M squared gaps (z_i - z_j)² = d²h² (d = |i - j|). For SE-shaped factors with squared lengthscale
λ_n and a Gaussian input N(μ_n, v_n), eq. 25 of the AMO-GP supplement contracted with a symmetric w = ½(W + Wᵀ)
is then (c1 = λ + v, c2 = λ + 2v, per point and group)
    Ψ_n,i = c_n sqrt(λ/c1) exp(-(μ - z_i)²/(2 c1))                                                   (eq. 24)
    Σ_ij Φ_n,ij w_ij = c_n² sqrt(λ/c2) Σ_s exp(-(μ - m_s)²/c2) Σ_d A_ds exp(-d²h²/(4λ)),              (eq. 25)
    A_ds = Σ_{i+j=s, |i-j|=d} w_ij,
since Φ_n,ij = c² sqrt(λ/c2) exp(-(z_i - z_j)²/(4λ)) exp(-(μ - m_ij)²/c2) (the product of the two kernel factors
is a Gaussian in the pair's midpoint). The heavy part is one [N, 2M-1] x [2M-1, M] product and element-wise
work on [N, 2M-1] and [N, M] arrays per group, against N·M² terms (or a series of [N, M] x [M, T·M] products) for
free inducing inputs (`flowgp.models.amogp.psi_statistics.grouped_psi_statistics`, which this equals; tested). The grid is
not trained: the node returns no gradient for it.

Numerics: inputs and midpoints are taken relative to the grid's centre (the backward's sums of powers of the
midpoints then cancel at the scale of the inputs' spread, not their offset); exponents are clamped at -350 as on
the other paths (terms below e^-350 of |w| are negligible, and the clamp keeps products out of the subnormal
range), and Ψ₁'s factors below e^-100 are exact zeros (`exp_or_zero`).
"""
from __future__ import annotations

import torch

from .psi_statistics import EXPONENT_FLOOR, exp_or_zero

__all__ = ["grid_psi_statistics"]


def _grid_tables(start, step, mg):
    """Per group: inducing inputs and midpoints relative to the grid's centre, zc [G, M] and mc [G, 2M-1], the
    centre [G], the squared gaps (d h)² [G, M], and the (d, s) cell of every pair (i, j), flat [M²]."""
    k = torch.arange(mg, dtype=start.dtype, device=start.device)
    half = 0.5 * (mg - 1)
    zc = step[:, None] * (k - half)
    mc = step[:, None] * (0.5 * torch.arange(2 * mg - 1, dtype=start.dtype, device=start.device) - half)
    i, j = torch.meshgrid(torch.arange(mg, device=start.device), torch.arange(mg, device=start.device), indexing="ij")
    cell = ((i - j).abs() * (2 * mg - 1) + (i + j)).reshape(-1)
    return zc, mc, start + step * half, (step[:, None] * k).square(), cell


class _GridPsiContract(torch.autograd.Function):
    """Ψ₁ [N, G, M] and Σ_g c² sqrt(λ/c2) t_g [N] on grid inducing inputs (module docstring), with the chain rule
    by hand. In [G, N, ·] layouts, with ed_d = exp(-d²h²/(4λ)), gm_s = exp(-(μ - m_s)²/c2), Gd = gm Aᵀ and
    t = Σ_d ed_d Gd_d; backward for upstream Ψ̄ and φ̄ (ū = Ψ̄ Ψ, t̄ = φ̄ c² sqrt(λ/c2)), with q = gm ∘ (ed A) and
    Q_k = Σ_s q_s (m_s - centre)^k:
        ∂t/∂μ = -2 (μ Q0 - Q1)/c2,   ∂t/∂c2 = (μ² Q0 - 2μ Q1 + Q2)/c2²,   ∂t/∂λ|ed = Σ_d Gd_d ed_d d²h²/(4λ²),
        ∂A = Σ_n t̄_n ed_n gm_nᵀ (∂W_ij = ∂A_{|i-j|, i+j}),
    and for Ψ₁ (e1 = ½ log(λ/c1) - ½ (μ - z)²/c1): ∂μ = -Σ_i ū (μ - z_i)/c1, ∂c1 = Σ_i ū ((μ - z_i)²/c1 - 1)/(2 c1),
    ∂λ|direct = Σ_i ū/(2λ), ∂c = Σ_i Ψ̄ Ψ/c; c1 = λ + v and c2 = λ + 2v carry these to λ and v."""

    @staticmethod
    def forward(ctx, mean, var, start, step, weight, amp, lsq):
        g, mg = weight.shape[0], weight.shape[-1]
        zc, mc, centre, gaps2, cell = _grid_tables(start, step, mg)
        mu = mean[:, 0].unsqueeze(0) - centre[:, None]  # [G, N], relative to each grid's centre
        v = var[:, 0].unsqueeze(0)
        lam, c = lsq[..., 0].T, amp.T  # [G, N]
        c1, c2 = lam + v, lam + 2.0 * v
        diff = mu.unsqueeze(-1) - zc.unsqueeze(1)  # [G, N, M]
        q1 = exp_or_zero(torch.addcmul((0.5 * (lam / c1).log()).unsqueeze(-1), diff.square(),
                                       (-0.5 / c1).unsqueeze(-1)))
        psi1 = c.unsqueeze(-1) * q1
        ws = 0.5 * (weight + weight.mT)
        a = ws.new_zeros(g, mg * (2 * mg - 1)).index_add_(1, cell, ws.reshape(g, -1)).view(g, mg, 2 * mg - 1)
        ed = (gaps2.unsqueeze(1) * (-0.25 / lam).unsqueeze(-1)).clamp_(min=EXPONENT_FLOOR).exp_()  # [G, N, M]
        gm = (mu.unsqueeze(-1) - mc.unsqueeze(1)).square_().mul_((-1.0 / c2).unsqueeze(-1))
        gm = gm.clamp_(min=EXPONENT_FLOOR).exp_()  # [G, N, 2M-1]
        edg = torch.bmm(gm, a.mT).mul_(ed)  # ed_d Gd_d, [G, N, M]
        t = edg.sum(-1)
        s0 = (lam / c2).sqrt()
        scale = c.square() * s0
        phi = (scale * t).sum(0)
        ctx.save_for_backward(mu, lam, c, c1, c2, diff, q1, a, ed, gm, edg, t, s0, mc, gaps2, cell)
        return psi1.permute(1, 0, 2), phi

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_psi, g_phi):
        mu, lam, c, c1, c2, diff, q1, a, ed, gm, edg, t, s0, mc, gaps2, cell = ctx.saved_tensors
        g, n, mg = diff.shape
        need = ctx.needs_input_grad
        zero = mu.new_zeros(g, n)
        g_mu, g_c1, g_lam, g_c = zero, zero, zero, zero
        if g_psi is not None:
            # ū = Ψ̄ Ψ = c Ψ̄ q1: the three sums over i from two products with diff (fewer passes over [G, N, M])
            gq = g_psi.permute(1, 0, 2) * q1
            g_c = gq.sum(-1)
            gqd = gq.mul_(diff)  # in place: gq is not read again
            u1 = c * gqd.sum(-1)  # Σ_i ū (μ - z_i)
            u2 = c * torch.linalg.vecdot(gqd, diff)  # Σ_i ū (μ - z_i)²
            u0 = c * g_c  # Σ_i ū
            g_mu = -u1 / c1
            g_c1 = (u2 / c1 - u0) * (0.5 / c1)
            g_lam = u0 * (0.5 / lam)
        g_c2 = zero
        g_weight = None
        if g_phi is not None:
            gphi = g_phi.unsqueeze(0)  # [1, N]
            scale = c.square() * s0
            tbar = gphi * scale
            g_c = g_c + gphi * 2.0 * c * s0 * t
            g_lam = g_lam + gphi * t * scale * (0.5 / lam)
            q = torch.bmm(ed, a).mul_(gm)  # [G, N, 2M-1]
            powers = torch.stack([torch.ones_like(mc), mc, mc.square()], -1)  # [G, 2M-1, 3]
            q0, q1s, q2 = torch.bmm(q, powers).unbind(-1)  # [G, N]
            g_mu = g_mu + tbar * (-2.0 / c2) * (mu * q0 - q1s)
            g_c2 = tbar * (mu.square() * q0 - 2.0 * mu * q1s + q2) / c2.square() - gphi * t * scale * (0.5 / c2)
            g_lam = g_lam + tbar * torch.bmm(edg, gaps2.unsqueeze(-1))[..., 0] * (0.25 / lam.square())
            if need[4]:
                g_a = torch.bmm((ed * tbar.unsqueeze(-1)).mT, gm)  # Σ_n t̄ ed gmᵀ, [G, M, 2M-1]
                g_weight = g_a.reshape(g, -1)[:, cell].view(g, mg, mg)  # symmetric: ∂W = ∂w
        g_lam = g_lam + g_c1 + g_c2
        g_v = (g_c1 + 2.0 * g_c2).sum(0)
        return (g_mu.sum(0).unsqueeze(-1) if need[0] else None, g_v.unsqueeze(-1) if need[1] else None,
                None, None, g_weight, g_c.T if need[5] else None, g_lam.T.unsqueeze(-1) if need[6] else None)


def grid_psi_statistics(mean, var, start, step, weight, amp, lsq, validate: bool = True):
    """Ψ₁ and tr(Φ_n W) of `flowgp.models.amogp.psi_statistics.grouped_psi_statistics` for a block-diagonal W when each group's
    inducing inputs are the fixed uniform grid z_gi = start_g + i·step_g (module docstring for the formulas).

    mean, var [N, 1] (moments of q(a_n), one input dimension); start, step [G] (the grids; not differentiated: pass
    tensors that do not require grad); weight [G, M, M] (only its symmetric part counts); amp [N, G] (c of point n
    with group g); lsq [N, G, 1] (λ of point n with group g). Returns Ψ₁ [N, G, M] and the contraction [N].
    validate=False skips the check that var >= 0 (a host read).
    """
    if mean.dim() != 2 or mean.shape[1] != 1 or var.shape != mean.shape:
        raise ValueError(f"mean and var must both be [N, 1] (one input dimension), got {tuple(mean.shape)} and "
                         f"{tuple(var.shape)}")
    if weight.dim() != 3 or weight.shape[1] != weight.shape[2]:
        raise ValueError(f"weight must be [G, M, M] (a block-diagonal W), got {tuple(weight.shape)}")
    g, n = weight.shape[0], mean.shape[0]
    if start.shape != (g,) or step.shape != (g,):
        raise ValueError(f"start and step must be [{g}] (one grid per group), got {tuple(start.shape)} and "
                         f"{tuple(step.shape)}")
    if start.requires_grad or step.requires_grad:
        raise ValueError("start and step: the grid is fixed (no gradient flows to it); pass detached tensors")
    if amp.shape != (n, g) or lsq.shape != (n, g, 1):
        raise ValueError(f"amp must be [{n}, {g}] and lsq [{n}, {g}, 1], got {tuple(amp.shape)} and "
                         f"{tuple(lsq.shape)}")
    if validate and bool((var < 0).any()):
        raise ValueError("var must be >= 0")
    return _GridPsiContract.apply(mean, var, start, step, weight, amp, lsq)
