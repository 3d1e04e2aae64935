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
The bound only needs Φ_n through tr(Φ_n W): `grouped_psi_statistics` (with Ψ₁) and `grouped_psi2_contract`
compute that without per-point M x M blocks in autograd (the split of eq. 25's exponent is derived above
`_BlockedExpContract`), and `own_group_psi_statistics` for points that each see one small group only.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .convolution import ConvolutionKernel

__all__ = ["gaussian_psi1", "gaussian_psi2", "gaussian_psi_mean", "se_psi_statistics", "cp_psi_statistics",
           "gaussian_psi2_contract", "grouped_psi2_contract", "grouped_psi_statistics", "own_group_psi_statistics",
           "PsiStatistics", "exp_or_zero", "EXPONENT_FLOOR"]

_LOG2E = 1.0 / math.log(2.0)

#: kernel factors whose exponent is below this are exact zeros (e^-100 ≈ 4e-44 of their prefactor: dropped, they
#: change a sum with O(1) terms, even through weights of 1e7, by less than its rounding). Products of a few
#: smaller factors with gradients are subnormal numbers, on which CPU arithmetic (the GEMMs that contract Ψ₁ and
#: the series' factors included) falls to a slow path; in the per-output configuration at a fitted state such
#: factors are common (points far from another output's inducing inputs)
_ZERO_EXPONENT = -100.0

#: exponents of products of kernel factors (Φ's terms) are clamped here where they can fall that low: a term below
#: e^-350 ≈ 1e-152 of |w| is negligible whichever value it takes, and clamping keeps the terms and the gradients
#: formed from them (E w times an upstream gradient) out of the subnormal range, where CPU arithmetic takes a slow
#: path (exp below about -708 itself: 2.5x slower for exp2, 6x for exp). Lower than `exp_or_zero`'s level, whose
#: factors are multiplied in pairs. Shared by every Ψ₂ path (`flowgp.models.amogp.psi_grid` too)
EXPONENT_FLOOR = -350.0


def exp_or_zero(x: torch.Tensor, base2: bool = False) -> torch.Tensor:
    """exp(x) (2^x with base2), with exact zeros where x is below `_ZERO_EXPONENT` (in the same base); NaN stays
    NaN (a diverging fit is reported, not hidden)."""
    floor = _ZERO_EXPONENT * (_LOG2E if base2 else 1.0)
    below = x <= floor
    clamped = torch.where(below, floor, x)
    # out of place: under autograd exp's backward reads its output
    return (clamped.exp2_() if base2 else clamped.exp_()).masked_fill(below, 0.0)


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

    la, lb [N, P, Mg] (<= 0); kappa [N, P, Dx] (>= 0); dz [P, Dx, Mg, Mg] (>= 0); w [P, Mg, Mg]. lb None means
    lb = la (every block is a diagonal block (p, p), with dz and w symmetric): then E_n is symmetric and its column
    sums are its row sums. Points are taken into chunks in the order given, and rows and columns in theirs: the
    callers pass points sorted by input and each group's inducing inputs sorted (`_SortedPoints`), so that a chunk's
    window of rows and columns that matter is narrow (below). The work is done by `_contract_forward` /
    `_contract_backward` (shared with `_DiagonalPsiContract`).

    Work buffers are laid out [P, chunk, ·, ·] so that every contraction is a batched product over P. The
    exponentials are taken in base 2, exp(x) = 2^(x log₂e) with log₂e folded into the small la, lb, κ: the
    vectorised exp2 runs about three times faster than exp on CPU, and the product costs one rounding of the
    exponent (a relative error of |x|·eps in each term, below 1e-14 for every term that is not negligible).

    Gradients: with g = ∂F/∂t, ∂F/∂la_i = g Σ_j E_ij w_ij (row sums of E ∘ w), ∂F/∂lb_j = g Σ_i E_ij w_ij,
    ∂F/∂κ_k = -g Σ_ij E w dz_k, ∂F/∂w = Σ_n g E_n and ∂F/∂dz_k = -w ∘ Σ_n g κ_k E_n: one batched product per chunk
    for ∂w and ∂dz together, and the sums, which do not depend on g. Up to `_KEEP_ELEMENTS` exponentials are one
    chunk kept from the forward (t = E·w there; the backward takes the sums from E ∘ w formed in place on them);
    larger problems take the sums in the forward, where E ∘ w is formed anyway for t = Σ_i (row sum i), and the
    backward recomputes each chunk's exponentials.

    Every term is at most exp(la_i + lb_j), so rows i (columns j) whose la (lb) is below `_NEGLIGIBLE` for every
    point and block of a chunk add less than e^-40 ≈ 4e-18 of |w| and are skipped: each chunk works on the
    window of rows and columns that matter to it (with points sorted by input and inducing inputs sorted within
    their groups, that window is narrow once lengthscales are short).
    """

    _NEGLIGIBLE = -40.0
    #: the forward keeps its exponentials for the backward when they fit in this many elements (8 MiB of
    #: float64), and the backward recomputes them chunk by chunk otherwise: beyond the caches, writing and reading
    #: back the kept exponentials costs more than recomputing them
    _KEEP_ELEMENTS = 1 << 20
    #: exponents are clamped here first where they can fall that low (`EXPONENT_FLOOR`); a chunk needs the
    #: clamp's extra pass only where some exponent falls this low
    _FLOOR = EXPONENT_FLOOR
    #: points per chunk: about this many elements of [P, chunk, Mg, Mg] (2 MiB of float64: the passes over a
    #: chunk stay in the cache) but at least _MIN_CHUNK points (each chunk costs a few dozen small operations),
    #: or all points in one chunk when their exponentials are kept
    _CHUNK_ELEMENTS = 1 << 18
    _MIN_CHUNK = 32
    #: groups smaller than this are not windowed (every row and column counts, no host read): the search
    #: costs more than it can skip
    _MIN_WINDOWED = 16
    #: the most terms `_taylor_terms` looks for (0 turns the series off); which path runs where a series is found
    #: is `_TAYLOR_COST`'s rule, which allows at most 10 terms
    _TAYLOR_MAX_TERMS = 16
    #: cost of one term of the series per (point, i, j) of a window, relative to its exponential (forward and
    #: backward), set above the 0.04-0.07 that CPU timings in float64 at Mg = 50-200 gave, so that the series is
    #: taken only where clearly cheaper (terms x this <= 1); the step times are in docs/results/amogp
    _TAYLOR_COST = 0.1
    #: points per chunk of the series: about this many elements of its products [P, chunk, T, Mg] (1 MiB of
    #: float64); chunks of 2^16-2^18 elements measured alike on CPU, and smaller ones pay more per-chunk operations
    #: than their narrower windows save
    _TAYLOR_CHUNK_ELEMENTS = 1 << 17

    @staticmethod
    def _chunk_size(n, p, mg):
        per_point = max(1, p * mg * mg)
        if n * per_point <= _BlockedExpContract._KEEP_ELEMENTS:
            return max(1, n)
        return max(_BlockedExpContract._MIN_CHUNK, _BlockedExpContract._CHUNK_ELEMENTS // per_point)

    @staticmethod
    def forward(ctx, la, lb, kappa, dz, w, reach=None):
        t, state = _contract_forward(la, lb, kappa, dz, w, any(ctx.needs_input_grad[:5]), reach)
        ctx.state = state  # intermediates (not inputs or outputs), read-only in the backward
        return t

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        need = ctx.needs_input_grad
        return _contract_backward(ctx.state, grad, need[3] or need[4]) + (None,)


def _contract_plan(la2, lb2, kap2, dz, chunk):
    """Per chunk of points (in `[P, N, ·]` layout): (row window, column window, clamp). A window (start, stop)
    holds the indices whose base-2 log factor exceeds _NEGLIGIBLE for some point and block of the chunk ((0, 0)
    where none does); clamp says whether an exponent of the chunk can fall below _FLOOR (la + lb - κ·max dz, a
    lower bound from the small factors). One host read for all chunks, none for small groups (every row and
    column counts, always clamped). A single chunk is not windowed: its window is every point's."""
    p, n, mg = la2.shape
    count = -(-n // chunk)
    if mg < _BlockedExpContract._MIN_WINDOWED:
        return [((0, mg), (0, mg), True)] * count
    floor = _BlockedExpContract._FLOOR * _LOG2E
    sym = lb2 is la2
    low = la2.amin(-1) + (la2 if sym else lb2).amin(-1) - (kap2 * dz.amax((-2, -1)).unsqueeze(1)).sum(-1)  # [P, N]
    if count == 1:
        return [((0, mg), (0, mg), bool(low.amin() < floor))]
    width = 1 + mg * (1 if sym else 2)
    stats = la2.new_full((count * chunk, width), -math.inf)  # padding rows past n: inactive, no clamp
    for factors, cols in ((la2, slice(1, 1 + mg)),) + (() if sym else ((lb2, slice(1 + mg, None)),)):
        if p > 1:  # the largest over the blocks
            torch.amax(factors, 0, out=stats[:n, cols])
        else:
            stats[:n, cols].copy_(factors[0])
    stats[:n, 0] = (low.amin(0) < floor).to(la2.dtype)
    stats = stats.view(count, chunk, width).amax(1)  # [count, 1 + Mg (+ Mg)]
    active = stats[:, 1:].view(count, -1, mg) > _BlockedExpContract._NEGLIGIBLE * _LOG2E
    idx = torch.arange(mg, device=la2.device)
    first = torch.where(active, idx, mg).amin(-1)  # [count, 1 or 2]
    stop = torch.where(active, idx + 1, 0).amax(-1)
    plan = []
    for clamp, a, b in zip(stats[:, 0].tolist(), first.tolist(), stop.tolist()):
        wins = [(i, j) if i < j else (0, 0) for i, j in zip(a, b)]
        plan.append((wins[0], wins[-1], clamp > 0))
    return plan


class _ContractState:
    """What the backward of `_contract_forward` reads: the chunks evaluated (with their windows of rows and
    columns), the base-2 factors in chunk order and `[P, N, ·]` layout, and either the kept exponentials (the row sums Σ_j E w, column sums Σ_i E w and Σ E w dz are then
    taken in the first backward, in place on them) or those sums (taken in the forward, the exponentials
    recomputed for ∂w and ∂dz)."""

    def __init__(self, sym, rows, cols, kap, kappa, dz, w):
        self.sym = sym
        self.pieces = []  # per chunk evaluated: (first point, count, (r0, r1), (c0, c1), clamp)
        self.kept = []  # per piece: its exponentials [P, nc, rows, cols], or None (recomputed)
        self.rows, self.cols, self.kap = rows, cols, kap  # [P, N, Mg, 1], [P, N, 1, Mg], [P, N, Dx, 1, 1]
        self.kappa, self.dz, self.w = kappa, dz, w  # [P, N, Dx], [P, 1, Dx, Mg, Mg], [P, Mg, Mg]
        p, n, mg = rows.shape[:3]
        self.row_sum = rows.new_zeros(p, n, mg)
        self.col_sum = self.row_sum if sym else rows.new_zeros(p, n, mg)
        self.wdz_sum = rows.new_zeros(p, kappa.shape[-1], n)
        self.sums_ready = False


def _is_full(piece, mg):
    _, _, (r0, r1), (c0, c1), _ = piece
    return r0 == 0 and c0 == 0 and r1 == c1 == mg


def _exp_piece(state, piece, out):
    """The exponentials [P, nc, rows, cols] of a piece written into `out` (exp2 of the base-2 exponent)."""
    s, nc, (r0, r1), (c0, c1), clamp = piece
    sl = slice(s, s + nc)
    full = _is_full(piece, state.w.shape[-1])
    rows, cols = state.rows[:, sl], state.cols[:, sl]
    if not full:
        rows, cols = rows[:, :, r0:r1], cols[..., c0:c1]
    torch.add(rows, cols, out=out)
    kap = state.kap[:, sl]
    for k in range(state.dz.shape[2]):
        dz = state.dz[:, :, k] if full else state.dz[:, :, k, r0:r1, c0:c1]
        out.addcmul_(kap[:, :, k], dz, value=-1.0)
    if clamp:
        out.clamp_(min=_BlockedExpContract._FLOOR * _LOG2E)
    return out.exp2_()


def _matvec(a, x, out):
    """out[q] = a[q] @ x[q] for a [P, n, K], x [P, K], out [P, n]: one mv per block (bmm with a single column is
    several times slower than mv on CPU), or for several small blocks one product and sum."""
    p = a.shape[0]
    if p > 1 and a.numel() <= 1 << 16:
        torch.sum(a * x.unsqueeze(1), -1, out=out)
        return
    for q in range(p):
        torch.mv(a[q], x[q], out=out[q])


def _piece_sums(state, piece, e, t=None):
    """E ∘ w in place in a chunk's exponentials `e` [P, nc, rows, cols] (they are not read again), then its row
    sums, column sums and Σ E w dz into the state (and its Σ E w into t [P, N] when given)."""
    s, nc, (r0, r1), (c0, c1), _ = piece
    sl = slice(s, s + nc)
    p = e.shape[0]
    full = _is_full(piece, state.w.shape[-1])
    ew = e.mul_(state.w.unsqueeze(1) if full else state.w[:, None, r0:r1, c0:c1])
    if full:
        rs = torch.sum(ew, -1, out=state.row_sum[:, sl])
        if not state.sym:
            torch.sum(ew, -2, out=state.col_sum[:, sl])
    else:
        rs = ew.sum(-1)
        state.row_sum[:, sl, r0:r1] = rs
        if not state.sym:
            state.col_sum[:, sl, c0:c1] = ew.sum(-2)
    flat = ew.view(p, nc, -1)
    for k in range(state.dz.shape[2]):
        dz = state.dz[:, 0, k] if full else state.dz[:, 0, k, r0:r1, c0:c1]
        _matvec(flat, dz.reshape(p, -1), state.wdz_sum[:, k, sl])
    if t is not None:
        torch.sum(rs, -1, out=t[:, sl])


def _contract_forward(la, lb, kappa, dz, w, grad: bool, reach=None):
    """t [N, P] of `_BlockedExpContract` and the state of its backward (None without grad).

    reach [N, P] (or None): how far the coupling κ dz of each point and block can reach into the terms that matter
    (see the comment above `_taylor_terms`); where every point's coupling is close enough to the block's centre,
    the series of `_taylor_forward` replaces the exponentials. Otherwise:
    small problems (at most `_KEEP_ELEMENTS` exponentials) are one chunk whose exponentials are kept for the
    backward: t = E·w here, and the backward forms E ∘ w in place on them. Larger ones run in chunks through one
    work buffer: E ∘ w in place, and its sums for the backward, here; the backward recomputes E.
    """
    K = _BlockedExpContract
    terms = None
    if reach is not None and kappa.shape[-1] == 1 and la.numel():
        kap = kappa[..., 0].detach()  # [N, P]
        centre = 0.5 * (kap.amin(0) + kap.amax(0))  # [P]
        terms = _taylor_terms(float(((kap - centre).abs() * reach.detach()).amax()), la.dtype)
        if terms is not None and grad:
            # the derivatives in κ and dz are series with one term less (∂/∂κ of the k-th term is the (k-1)-th
            # with w ∘ dz): one more term bounds their remainder as the value's
            terms += 1
        if terms is not None and terms * K._TAYLOR_COST > 1.0:
            terms = None  # the exponentials of the same windows cost less
    sym = lb is None
    n, p, mg = la.shape
    if terms is None:
        chunk = K._chunk_size(n, p, mg)
    else:  # the series' working set per point is its T·Mg products, not Mg² exponentials
        chunk = max(K._MIN_CHUNK, K._TAYLOR_CHUNK_ELEMENTS // (p * terms * mg))
    # [P, N, ·] layouts: a chunk is then a slice along dim 1 and every product is batched over P
    la2 = (la * _LOG2E).transpose(0, 1)
    lb2 = la2 if sym else (lb * _LOG2E).transpose(0, 1)
    kappa = kappa.transpose(0, 1)
    kap2 = kappa * _LOG2E
    plan = _contract_plan(la2, lb2, kap2, dz, chunk)
    if terms is not None:
        state = _TaylorState(sym, la2, lb2, kappa, dz, w, terms, centre)
        return _taylor_forward(state, plan, chunk, grad).transpose(0, 1), (state if grad else None)
    keep = grad and n * p * mg * mg <= K._KEEP_ELEMENTS
    state = _ContractState(sym, la2.unsqueeze(-1), lb2.unsqueeze(-2), kap2[..., None, None], kappa,
                           dz.unsqueeze(1), w)
    work = None if keep else la.new_empty(p * min(chunk, n) * mg * mg)
    t = la.new_zeros(p, n)
    for s, ((r0, r1), (c0, c1), clamp) in zip(range(0, n, chunk), plan):
        if r1 == r0 or c1 == c0:
            continue
        nc = min(chunk, n - s)
        piece = (s, nc, (r0, r1), (c0, c1), clamp)
        shape = (p, nc, r1 - r0, c1 - c0)
        e = la.new_empty(shape) if keep else work[:math.prod(shape)].view(shape)
        _exp_piece(state, piece, e)
        state.pieces.append(piece)
        state.kept.append(e if keep else None)
        if grad and not keep:
            _piece_sums(state, piece, e, t)
        else:
            wc = w if _is_full(piece, mg) else w[:, r0:r1, c0:c1]
            _matvec(e.view(p, nc, -1), wc.reshape(p, -1), t[:, s:s + nc])
    state.sums_ready = grad and not keep
    return t.transpose(0, 1), (state if grad else None)


def _contract_backward(state, grad, need_w: bool):
    """(∂la, ∂lb (None when sym), ∂κ, ∂dz, ∂w) of `_contract_forward` for ∂F/∂t = grad [N, P] (∂dz, ∂w None
    unless need_w)."""
    sym = state.sym
    p, _, mg = state.row_sum.shape
    dx = state.kappa.shape[-1]
    grad_t = grad.transpose(0, 1)  # [P, N]
    g_w = g_dz = None
    if isinstance(state, _TaylorState):
        if need_w:
            g_w, g_dz = _taylor_weight_gradients(state, grad_t)
    elif need_w or not state.sums_ready:
        mg_ = state.w.shape[-1]
        buf = None
        if any(e is None for e in state.kept):
            buf = grad.new_empty(max(p * pc[1] * (pc[2][1] - pc[2][0]) * (pc[3][1] - pc[3][0])
                                     for pc in state.pieces))
        if need_w:
            acc = grad.new_zeros(p, 1 + dx, mg, mg)  # Σ_n g E_n and Σ_n g κ_k E_n
            coeff = torch.cat([grad_t.unsqueeze(1), grad_t.unsqueeze(1) * state.kappa.transpose(1, 2)], 1)
        for piece, e in zip(state.pieces, state.kept):
            s, nc, (r0, r1), (c0, c1), _ = piece
            ri, cj = r1 - r0, c1 - c0
            if e is None:
                e = _exp_piece(state, piece, buf[:p * nc * ri * cj].view(p, nc, ri, cj))
            if need_w:
                if _is_full(piece, mg_):
                    acc.view(p, 1 + dx, -1).baddbmm_(coeff[:, :, s:s + nc], e.view(p, nc, -1))
                else:
                    acc[:, :, r0:r1, c0:c1] += torch.bmm(coeff[:, :, s:s + nc], e.view(p, nc, -1)).view(
                        p, 1 + dx, ri, cj)
            if not state.sums_ready:
                _piece_sums(state, piece, e)
        if not state.sums_ready:  # the kept exponentials are now E ∘ w: a later backward recomputes E
            state.kept = [None] * len(state.kept)
            state.sums_ready = True
        if need_w:
            g_w, g_dz = acc[:, 0], -(state.w.unsqueeze(1) * acc[:, 1:])
    g = grad_t.unsqueeze(-1)
    # la is both the row and the column factor of a symmetric block: its gradient counts twice
    g_la = (2.0 * g if sym else g) * state.row_sum  # [P, N, Mg]
    g_lb = None if sym else g * state.col_sum
    g_kappa = (-grad_t.unsqueeze(1) * state.wdz_sum).transpose(1, 2)  # [P, N, Dx]
    return (g_la.transpose(0, 1), None if sym else g_lb.transpose(0, 1), g_kappa.transpose(0, 1), g_dz, g_w)


# ----- the same contraction as a series of products, where the coupling is weak ---------------------------------
#
# Expanding the coupling factor exp(-κ_n dz_ij) of t_n (one input dimension) around a centre κ₀ of the block's
# couplings (κ₀ = midpoint of the smallest and largest κ_n),
#     exp(-κ_n dz) = exp(-κ₀ dz) Σ_k (-(κ_n - κ₀))^k dz^k / k!,
#     t_n = Σ_k (-(κ_n - κ₀))^k/k! · a_nᵀ (w ∘ exp(-κ₀ dz) ∘ dz^k) b_n,     a_n = exp(la_n), b_n = exp(lb_n),
# turns the N·Mg² exponentials into one matrix product [N, Mg] x [Mg, T·Mg] per block: no exponential of a
# [N, Mg, Mg] array and few passes over [N, T·Mg] in the cache, while the BLAS runs near the core's peak.
# How many terms: the dropped ones are bounded through the row and column factors. With e_i = μ - z_i, a pair's
# factors are at most exp(-E), E = (B e_i² + A e_j²)/(2D), D = AB + (A + B) v, and
# dz_ij = (e_i - e_j)² <= 2(e_i² + e_j²) <= (4D/min(A, B)) E = reach · E. The remainder of the series after T
# terms is at most exp(-min(κ_n, κ₀) dz) |y|^T/T! <= |y|^T/T! with |y| = |κ_n - κ₀| dz <= ρ_n E,
# ρ_n = |κ_n - κ₀| reach_n, so every dropped term is at most |w_ij| max_E e^-E (ρE)^T/T! <= |w_ij| ρ^T/sqrt(2πT)
# (Stirling). T is the least with ρ^T/sqrt(2πT) below 2^-8 of the dtype's eps (float64: 2^-60 ≈ 9e-19 of
# |w_ij|, below the exponential path's own cut of terms under e^-40 ≈ 4e-18), for the largest ρ_n of the call.
# The matrices exp(-κ₀ dz) (s dz)^k/k!, s = max_n |κ_n - κ₀|, are formed once per call and the coefficients
# (-(κ_n - κ₀)/s)^k lie in [-1, 1], so no power over- or underflows; t depends on neither κ₀ nor s. In
# AMO-GP's CP layer the couplings of a fit differ by tens of per cent at most (ρ ≈ 1e-4 or less: 5 terms in
# float64, 1 when every input variance is the same; one more for gradients); see docs/results/amogp.


def _taylor_terms(rho_max: float, dtype) -> int | None:
    """The number T of Taylor terms of exp(-(κ - κ₀) dz) that bounds every dropped term by 2^-8 eps(dtype) |w_ij|
    (ρ^T/sqrt(2πT) below it, see above), or None where more than `_BlockedExpContract._TAYLOR_MAX_TERMS` are
    needed (or ρ is not finite): the exponentials are then cheaper."""
    limit = _BlockedExpContract._TAYLOR_MAX_TERMS
    if not math.isfinite(rho_max) or limit < 1:
        return None
    if rho_max <= 0.0:
        return 1  # every point's coupling is the centre's: t = aᵀ (w ∘ exp(-κ₀ dz)) b exactly
    log_tol = math.log(torch.finfo(dtype).eps) - 8.0 * math.log(2.0)
    for terms in range(1, limit + 1):
        if terms * math.log(rho_max) - 0.5 * math.log(2.0 * math.pi * terms) <= log_tol:
            return terms
    return None


class _TaylorState:
    """The series' counterpart of `_ContractState`, in the same `[P, N, ·]` layout: what
    `_contract_backward` reads (row and column sums Σ_j E_ij w_ij, Σ_i E_ij w_ij, `wdz_sum` = -∂t/∂κ)
    and, for ∂w and ∂dz, the factors a, b, the coefficients c_k, the matrices P_k = exp(-κ₀ dz) (s dz)^k/k!, s,
    κ₀, w and the pieces evaluated."""

    def __init__(self, sym, la2, lb2, kappa, dz, w, terms, centre):
        self.sym = sym
        # exp(la), [P, N, Mg], exact zeros below e^-100 (`exp_or_zero`): the factors of points far from a group,
        # in the per-output configuration, would otherwise make subnormal products in every contraction
        self.a = exp_or_zero(la2, base2=True)
        self.b = self.a if sym else exp_or_zero(lb2, base2=True)
        self.centre = centre.to(la2.dtype).unsqueeze(-1)  # [P, 1]
        dev = kappa[..., 0] - self.centre  # κ - κ₀, [P, N]
        scale = dev.abs().amax(1, keepdim=True)
        self.scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # [P, 1]
        base = dz[:, 0]  # [P, Mg, Mg]
        x = self.scale.unsqueeze(-1) * base
        # P_k = exp(-κ₀ dz) (s dz)^k/k! <= e^-y y^k/k! <= 1 with y = κ₀ dz >= s dz (s = (κ_max - κ_min)/2 <= κ₀ for
        # κ >= 0): the recursion cannot overflow, and where exp(-κ₀ dz) underflows every P_k is negligible
        powers = [torch.exp(-self.centre.unsqueeze(-1) * base)]
        for k in range(1, terms):
            powers.append(powers[-1] * x / k)
        self.powers = torch.stack(powers, 1)  # [P, T, Mg, Mg]
        self.w = w
        self.coef = (-dev / self.scale).unsqueeze(-1).pow(
            torch.arange(terms, dtype=la2.dtype, device=la2.device))  # [P, N, T]
        self.kappa = kappa
        self.pieces = []
        self.row_sum = self.col_sum = self.wdz_sum = None


def _taylor_forward(state, plan, chunk: int, grad: bool):
    """t [P, N] of `_BlockedExpContract` (one input dimension) as the series above, over the same
    chunks of points and windows of rows and columns as the exponential path (`_contract_plan`). With
    c_nk = (-(κ_n - κ₀)/s)^k and W_k = w ∘ P_k, per chunk one product y = a [W_0 | W_1 | ...] on its window
    ([P, chunk, rows] x [rows, T·columns]), then
        q_nk = y_nk · b_n,   t_n = Σ_k c_nk q_nk,   ∂t/∂b_n = Σ_k c_nk y_nk,   ∂t/∂κ_n = -(1/s) Σ_k k c_n,k-1 q_nk
    (and ∂t/∂a_n from b [W_0ᵀ | ...] where a ≠ b). Rows and columns outside a chunk's window add less than e^-40
    of |w| (as on the exponential path) and are skipped; its products stay in the cache. (Folding c_nk into the
    left factor, [a ⊗ c_k] times the stacked W_k, measured slower: a long inner dimension and few columns.)"""
    st = state
    a, b, coef, sym = st.a, st.b, st.coef, st.sym
    p, n, mg = a.shape
    terms = coef.shape[-1]
    wk = st.w.unsqueeze(1) * st.powers  # [P, T, Mg, Mg]
    quad = a.new_zeros(p, n, terms)  # q_nk = a_nᵀ W_k b_n
    if grad:
        st.col_sum = a.new_zeros(p, n, mg)  # ∂t/∂b, then b ∘ it
        st.row_sum = st.col_sum if sym else a.new_zeros(p, n, mg)
    for s, ((r0, r1), (c0, c1), _) in zip(range(0, n, chunk), plan):
        if r1 == r0 or c1 == c0:
            continue
        nc = min(chunk, n - s)
        st.pieces.append((s, nc, (r0, r1), (c0, c1)))
        sl = slice(s, s + nc)
        block = wk[:, :, r0:r1, c0:c1]
        cols = block.transpose(1, 2).reshape(p, r1 - r0, terms * (c1 - c0))
        y = torch.bmm(a[:, sl, r0:r1], cols).view(p, nc, terms, c1 - c0)
        quad[:, sl] = (y * b[:, sl, None, c0:c1]).sum(-1)
        if grad:
            st.col_sum[:, sl, c0:c1] = y.mul_(coef[:, sl].unsqueeze(-1)).sum(2)
            if not sym:
                rows = block.permute(0, 3, 1, 2).reshape(p, c1 - c0, terms * (r1 - r0))
                y = torch.bmm(b[:, sl, c0:c1], rows).view(p, nc, terms, r1 - r0)
                st.row_sum[:, sl, r0:r1] = y.mul_(coef[:, sl].unsqueeze(-1)).sum(2)
    t = (coef * quad).sum(-1)  # [P, N]
    if grad:
        # Σ_i E_ij w_ij and Σ_j E_ij w_ij (the factors of ∂lb, ∂la) and -∂t/∂κ (∂c_k/∂κ = -(k/s) c_{k-1})
        st.col_sum.mul_(b)
        if not sym:
            st.row_sum.mul_(a)
        steps = torch.arange(1, terms, dtype=a.dtype, device=a.device)
        st.wdz_sum = ((quad[..., 1:] * coef[..., :-1] * steps).sum(-1) / st.scale).unsqueeze(1)  # [P, 1, N]
    return t


def _taylor_weight_gradients(state, grad_t):
    """(∂w, ∂dz) of `_taylor_forward` in its [P, N, ·] layout for ∂F/∂t = grad_t [P, N]: with
    G_k = Σ_n t̄_n c_nk a_n b_nᵀ = [a ⊗ t̄ c_k]ᵀ b (one product per piece, on its window) and
    ∂P_k/∂dz = s P_{k-1} - κ₀ P_k:  ∂w = Σ_k P_k ∘ G_k,   ∂dz = w ∘ (s Σ_{k>=1} P_{k-1} ∘ G_k - κ₀ ∂w)."""
    st = state
    p, n, mg = st.a.shape
    terms = st.coef.shape[-1]
    gc = grad_t.unsqueeze(-1) * st.coef  # [P, N, T]
    gk = grad_t.new_zeros(p, terms, mg, mg)
    for s, nc, (r0, r1), (c0, c1) in st.pieces:
        sl = slice(s, s + nc)
        left = (gc[:, sl].unsqueeze(-1) * st.a[:, sl, None, r0:r1]).view(p, nc, terms * (r1 - r0))
        gk[:, :, r0:r1, c0:c1] += torch.bmm(left.transpose(1, 2), st.b[:, sl, c0:c1]).view(
            p, terms, r1 - r0, c1 - c0)
    g_w = (st.powers * gk).sum(1)
    shifted = (st.powers[:, :-1] * gk[:, 1:]).sum(1)
    g_dz = (st.w * (st.scale.unsqueeze(-1) * shifted - st.centre.unsqueeze(-1) * g_w)).unsqueeze(1)
    return g_w, g_dz


def _sum_dims(x):
    """Σ over the input dimensions (the last axis): a view without the axis for one dimension (a reduction over
    one element is a copy and a pass)."""
    return x.squeeze(-1) if x.shape[-1] == 1 else x.sum(-1)


def _point_factors(d, v, lam, amp):
    """The per-point factors of eqs. 24-25 shared by `_DiagonalPsiContract` and `_OwnGroupPsiContract`, with the
    inducing inputs on axis -2 of d = μ - z and the input dimensions on axis -1 (v, λ broadcast against d):
    d², 1/c1, 1/c2, Ψ/c, Ψ₁ = c Ψ/c, la = -Σ_k ½ d²/c2, κ = ½ v/(λ c2) and Π_k sqrt(λ/c2) (c1 = λ + v, c2 = λ + 2v)."""
    d2 = d.square()
    inv1 = (lam + v).reciprocal()  # 1/c1
    q1 = exp_or_zero(_sum_dims(torch.addcmul(0.5 * (lam * inv1).log(), d2, inv1, value=-0.5)))  # Ψ / c
    psi1 = amp.unsqueeze(-1) * q1
    inv2 = (lam + 2.0 * v).reciprocal()  # 1/c2
    la = _sum_dims(d2 * inv2).mul_(-0.5)
    kappa = 0.5 * v * inv2 / lam
    s0 = torch.exp(0.5 * (lam * inv2).log().sum((-2, -1)))  # Π_k sqrt(λ/c2)
    return d2, inv1, inv2, q1, psi1, la, kappa, s0


def _kept(factors):
    """`_point_factors` as a node keeps them for its backward: without la (the backward does not read it; the
    contraction's own state has what it needs) and with Ψ₁ (which the node returns) as a detached alias. A
    returned tensor refers to its node through its grad_fn, so keeping the tensor itself in the node's attributes
    makes a reference cycle, which keeps the whole state (megabytes per step) alive until Python's cyclic collector
    runs (see docs/results/amogp, "Fewer passes, no reference cycles")."""
    return factors[:4] + (factors[4].detach(), None) + factors[6:]


def _point_factor_gradients(u, g_la, g_kappa, gs, g_psi, factors, d, amp, lam, scale):
    """(-∂/∂d, ∂/∂c, ∂/∂λ, ∂/∂v) through `_point_factors` (the backward formulas of `_DiagonalPsiContract`), for
    ū = Ψ̄ Ψ, l̄a, κ̄ (shaped like κ) and s̄ = φ̄ t; ∂/∂λ and ∂/∂v still to be summed over the inducing inputs."""
    d2, inv1, inv2, q1, _, _, kappa, s0 = factors
    uk, lk = u.unsqueeze(-1), g_la.unsqueeze(-1)
    g_d = torch.addcmul(uk * inv1, lk, inv2).mul_(d)  # -∂/∂d
    big_u = u.sum(-1)[..., None, None]
    g_amp = torch.addcmul((g_psi * q1).sum(-1), gs, 2.0 * amp * s0)
    gs = (gs * scale)[..., None, None]  # s̄ · scale
    gk = g_kappa * kappa
    g_c1 = ((uk * d2).sum(-2, keepdim=True) * inv1 - big_u).mul_(0.5 * inv1)
    g_c2 = ((lk * d2).sum(-2, keepdim=True).mul_(0.5 * inv2) - gk - 0.5 * gs).mul_(inv2)
    g_lam = ((0.5 * (big_u + gs) - gk) / lam).add_(g_c1).add_(g_c2)
    g_v = (0.5 * g_kappa * inv2 / lam).add_(g_c1).add_(g_c2, alpha=2.0)
    return g_d, g_amp, g_lam, g_v


class _DiagonalPsiContract(torch.autograd.Function):
    """Ψ₁ [N, G, Mg] and Σ_g scale_ng t_ng [N] for a block-diagonal W (blocks (g, g)), one node for eq. 24 and the
    contraction of eq. 25 together, with the chain rule through the per-point factors written by hand.

    With d = μ - z, c1 = λ + v and c2 = λ + 2v (per point, group and input dimension k; for a diagonal block
    A = B = λ, S = 2λ and AB + S v = λ c2):
        Ψ_ngi = c_ng exp(e1),   e1 = Σ_k ½ log(λ/c1) - ½ d²/c1                                        (eq. 24)
        la_ngi = -Σ_k ½ d²/c2,   κ_ngk = ½ v/(λ c2),   scale_ng = c_ng² Π_k sqrt(λ/c2),   dz = (z_i - z_j)²,
    t from `_contract_forward` (symmetric blocks) and w = ½(W + Wᵀ). Backward, for upstream Ψ̄ and φ̄ (ū = Ψ̄ Ψ):
        ∂/∂c = Σ_i Ψ̄ exp(e1) + 2 c φ̄ t Π sqrt(λ/c2),   ∂/∂d = -ū d/c1 - l̄a d/c2,
        ∂/∂c1 = Σ_i ū (½ d²/c1² - ½/c1),   ∂/∂c2 = Σ_i l̄a ½ d²/c2² - κ̄ κ/c2 - ½ s̄ scale/c2,
        ∂/∂λ = Σ_i ū ½/λ + ∂/∂c1 + ∂/∂c2 - κ̄ κ/λ + ½ s̄ scale/λ,   ∂/∂v = Σ_g (∂/∂c1 + 2 ∂/∂c2 + κ̄ ½/(λ c2)),
    with s̄ = φ̄ t, t̄ = φ̄ scale and (l̄a, κ̄, w̄, dz̄) from `_contract_backward`; μ and z take ∂/∂d (with opposite
    signs) and z also dz's ∂/∂z_i = 2 Σ_j (dz̄_ij + dz̄_ji)(z_i - z_j).
    """

    @staticmethod
    def forward(ctx, mean, var, z, weight, amp, lsq):
        n, dx = mean.shape
        g, mg = z.shape[0], z.shape[1]
        perm = None
        if n > _BlockedExpContract._chunk_size(n, g, mg):
            # several chunks: the node works on points sorted by (first) input and inducing inputs sorted within
            # their groups, so that neighbouring points need a narrow window of rows and columns (see
            # `_BlockedExpContract`); the inputs are permuted here, [N] and [G, Mg] values, rather than the
            # contraction's [N, G, Mg] factors, and only Ψ₁ (and in the backward its upstream) is permuted back
            perm = _SortedPoints(mean[:, 0], z[..., 0])
            mean, var, amp, lsq, z, weight = perm.sort_inputs(mean, var, amp, lsq, z, weight)
        # per (point, group, ·, dimension): [N, G, 1, Dx] factors broadcast against [N, G, Mg, Dx] differences
        v = var[:, None, None, :]
        lam = lsq.unsqueeze(2)
        d = mean[:, None, None, :] - z
        # Ψ₁, la [N, G, Mg]; κ [N, G, 1, Dx]; Π_k sqrt(λ/c2) [N, G]
        factors = _point_factors(d, v, lam, amp)
        _, _, _, _, psi1, la, kappa, s0 = factors
        scale = amp.square() * s0
        dz = (z.unsqueeze(2) - z.unsqueeze(1)).square().permute(0, 3, 1, 2)  # [G, Dx, Mg, Mg]
        grad = any(ctx.needs_input_grad)
        reach = 4.0 * (lam + 2.0 * v)[:, :, 0, 0] if dx == 1 else None  # 4 (AB + S v)/min(A, B) with A = B = λ
        t, state = _contract_forward(la, None, kappa[:, :, 0], dz, 0.5 * (weight + weight.mT), grad, reach)
        phi = (scale * t).sum(-1)
        if grad:
            ctx.state = (state, d, _kept(factors), scale, t, amp, lam, z, perm)
        if perm is None:
            return psi1, phi
        return perm.unsort_psi(psi1), phi[perm.inverse]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_psi, g_phi):
        state, d, factors, scale, t, amp, lam, z, perm = ctx.state
        psi1 = factors[4]
        need = ctx.needs_input_grad
        n, g, mg, dx = d.shape
        if g_psi is None:
            g_psi = psi1.new_zeros(())
        elif perm is not None:
            g_psi = perm.sort_psi(g_psi)
        if g_phi is None:
            g_phi = psi1.new_zeros(n)
        elif perm is not None:
            g_phi = g_phi[perm.order]
        u = g_psi * psi1  # ū = Ψ̄ ∂Ψ/∂e1, [N, G, Mg]
        g_la, _, g_kappa, g_dz, g_w = _contract_backward(state, g_phi.unsqueeze(-1) * scale, need[2] or need[3])
        g_d, g_amp, g_lam, g_v = _point_factor_gradients(u, g_la, g_kappa[:, :, None, :], g_phi.unsqueeze(-1) * t,
                                                         g_psi, factors, d, amp, lam, scale)
        g_z = g_weight = None
        if need[2]:
            g_z = g_d.sum(0)
            if g_dz is not None:
                diff = (z.unsqueeze(2) - z.unsqueeze(1)).permute(0, 3, 1, 2)  # z_i - z_j, [G, Dx, Mg, Mg]
                g_z = g_z + 2.0 * ((g_dz + g_dz.mT) * diff).sum(-1).transpose(1, 2)
        if need[3]:
            g_weight = 0.5 * (g_w + g_w.mT)
        grads = (-g_d.sum((1, 2)), g_v.sum((1, 2)), g_z, g_weight, g_amp, g_lam[:, :, 0])
        return grads if perm is None else perm.unsort_gradients(*grads)


class _SortedPoints:
    """The permutations of the sorted evaluation (`_DiagonalPsiContract`, and `_grouped` for a full W under autograd):
    points by their (first) input, `order` [N],
    and each group's inducing inputs by theirs, `zorder` [G, Mg] (None where they are sorted already, as the
    estimators' inducing inputs start and usually stay: one host read saves permuting Ψ₁'s columns, which costs
    several times its rows); maps the node's inputs to the sorted layout, and Ψ₁ and the gradients back (Ψ₁'s
    upstream gradient the other way). Rows move with `index_select` (contiguous rows, the fastest gather on CPU)."""

    def __init__(self, x, z):
        self.order = torch.argsort(x.detach())
        self.inverse = torch.empty_like(self.order).scatter_(
            0, self.order, torch.arange(len(self.order), device=x.device))
        self.zorder = self.zinverse = None
        if not bool((z[:, 1:] >= z[:, :-1]).all()):
            self.zorder = torch.argsort(z.detach(), dim=1)  # [G, Mg]
            self.zinverse = torch.argsort(self.zorder, dim=1)

    @staticmethod
    def _columns(x, zo):  # x [N, G, Mg] with each group's columns in the order zo [G, Mg]
        return x.gather(2, zo.unsqueeze(0).expand_as(x))

    @staticmethod
    def _blocks(w, zo):  # w [G, Mg, Mg] or [G, Mg, G, Mg] with rows and columns in the order zo
        if w.dim() == 3:
            return w.gather(1, zo.unsqueeze(-1).expand_as(w)).gather(2, zo.unsqueeze(1).expand_as(w))
        g, mg = zo.shape
        return w.gather(1, zo.view(g, mg, 1, 1).expand_as(w)).gather(3, zo.view(1, 1, g, mg).expand_as(w))

    def sort_inputs(self, mean, var, amp, lsq, z, weight):
        o = self.order
        mean, var, amp, lsq = (x.index_select(0, o) for x in (mean, var, amp, lsq))
        if self.zorder is not None:
            z = z.gather(1, self.zorder.unsqueeze(-1).expand_as(z))
            weight = self._blocks(weight, self.zorder)
        return mean, var, amp, lsq, z, weight

    def unsort_psi(self, psi):  # [N, G, Mg] sorted -> the caller's order
        psi = psi.index_select(0, self.inverse)
        return psi if self.zorder is None else self._columns(psi, self.zinverse)

    def sort_psi(self, psi):
        psi = psi.index_select(0, self.order)
        return psi if self.zorder is None else self._columns(psi, self.zorder)

    def unsort_gradients(self, g_mean, g_var, g_z, g_weight, g_amp, g_lsq):
        inv = self.inverse
        if self.zorder is not None:
            if g_z is not None:
                g_z = g_z.gather(1, self.zinverse.unsqueeze(-1).expand_as(g_z))
            if g_weight is not None:
                g_weight = self._blocks(g_weight, self.zinverse)
        return tuple(g.index_select(0, inv) for g in (g_mean, g_var)) + (g_z, g_weight) + tuple(
            g.index_select(0, inv) for g in (g_amp, g_lsq))


def _own_group_upstream(g_psi, g_phi, factors, amp, rs):
    """The own-group nodes' backward inputs: Ψ̄ and φ̄ (zeros where absent), scale = c² Π sqrt(λ/c2), t̄ = φ̄ scale
    and ∂la = 2 t̄ Σ_j E_ij w_ij (la is the row and the column factor)."""
    psi1, s0 = factors[4], factors[7]
    if g_psi is None:
        g_psi = psi1.new_zeros(())
    if g_phi is None:
        g_phi = psi1.new_zeros(rs.shape[0])
    scale = amp.square() * s0
    g_t = g_phi * scale  # [N]
    return g_psi, g_phi, scale, g_t, (2.0 * g_t).unsqueeze(-1) * rs


class _OwnGroupPsiContract(torch.autograd.Function):
    """Ψ₁ [N, Mg] and tr(Φ_n W_g(n)) [N] when point n sees only the inducing inputs of its own group g(n) (one
    prefactor c_n and squared lengthscale λ_n each), materialised per point: for small groups (the per-point
    [Mg, Mg] exponentials are the whole work, no chunks or windows). Same factors as `_DiagonalPsiContract`
    (d = μ - z_g(n), c1 = λ + v, c2 = λ + 2v, la = -Σ_k ½ d²/c2, κ = ½ v/(λ c2), scale = c² Π sqrt(λ/c2)):
        E_n,ij = exp(la_i + la_j - Σ_k κ_k (z_ik - z_jk)²),   t_n = Σ_ij E_n,ij w_g(n),ij,   w = ½(W + Wᵀ),
    and the backward of `_DiagonalPsiContract` per point, with ∂la_i = 2 t̄ Σ_j E_ij w_ij, ∂κ_k = -t̄ Σ_ij E w dz_k,
    ∂w_g = Σ_{n: g(n)=g} t̄_n E_n and ∂dz_k = -κ_k t̄ E ∘ w (gathered per point, summed back per group).
    """

    @staticmethod
    def forward(ctx, mean, var, z, weight, amp, lsq, group):
        g, mg, dx = z.shape
        zg = z[group]  # [N, Mg, Dx]
        v = var.unsqueeze(1)  # [N, 1, Dx]
        lam = lsq.unsqueeze(1)
        d = mean.unsqueeze(1) - zg
        factors = _point_factors(d, v, lam, amp)  # Ψ₁, la [N, Mg]; κ [N, 1, Dx]; Π_k sqrt(λ/c2) [N]
        _, _, _, _, psi1, la, kappa, s0 = factors
        dzg = (zg.unsqueeze(2) - zg.unsqueeze(1)).square()  # [N, Mg, Mg, Dx]
        la2 = la * _LOG2E  # base 2, as in `_BlockedExpContract`
        expo = (la2.unsqueeze(-1) + la2.unsqueeze(-2)).sub_((dzg * (kappa * _LOG2E).unsqueeze(1)).sum(-1))
        e = expo.clamp_(min=_BlockedExpContract._FLOOR * _LOG2E).exp2_()  # [N, Mg, Mg]
        wg = (0.5 * (weight + weight.mT))[group]
        ew = e * wg
        rs = ew.sum(-1)  # [N, Mg]
        t = rs.sum(-1)
        phi = amp.square() * s0 * t
        if any(ctx.needs_input_grad):
            ctx.state = (group, g, zg, d, _kept(factors), t, rs, e, ew, dzg, amp, lam)
        return psi1, phi

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_psi, g_phi):
        group, g, zg, d, factors, t, rs, e, ew, dzg, amp, lam = ctx.state
        kappa = factors[6]
        n, mg, dx = d.shape
        need = ctx.needs_input_grad
        g_psi, g_phi, scale, g_t, g_la = _own_group_upstream(g_psi, g_phi, factors, amp, rs)
        g_kappa = -g_t[:, None, None] * (ew.unsqueeze(-1) * dzg).sum((1, 2)).unsqueeze(1)  # [N, 1, Dx]
        g_d, g_amp, g_lam, g_v = _point_factor_gradients(g_psi * factors[4], g_la, g_kappa, g_phi * t, g_psi, factors, d,
                                                         amp, lam, scale)  # g_d: -∂/∂d, [N, Mg, Dx]
        g_z = g_weight = None
        if need[2]:
            # dz_ij = Σ_k (z_ik - z_jk)²: ∂/∂z_i = 2 Σ_j (dz̄_ij + dz̄_ji)(z_i - z_j), dz̄ = -t̄ κ E ∘ w (symmetric)
            g_dz = (-4.0 * g_t)[:, None, None, None] * ew.unsqueeze(-1) * kappa.unsqueeze(1)  # [N, Mg, Mg, Dx]
            g_zg = (g_dz * (zg.unsqueeze(2) - zg.unsqueeze(1))).sum(2) + g_d  # + g_d: d = μ - z
            g_z = torch.zeros(g, mg, dx, dtype=d.dtype, device=d.device).index_add_(0, group, g_zg)
        if need[3]:
            g_wg = g_t[:, None, None] * e
            g_w = torch.zeros(g, mg, mg, dtype=d.dtype, device=d.device).index_add_(0, group, g_wg)
            g_weight = 0.5 * (g_w + g_w.mT)
        return -g_d.sum(1), g_v.sum(1), g_z, g_weight, g_amp, g_lam[:, 0], None


def _pair_maps(mg, dtype, device):
    """The pairs i <= j of Mg inducing inputs, `rows`, `cols` [K] (K = Mg(Mg+1)/2), and as 0/±1 matrices: S [Mg, K]
    (S_ip = [i_p = i] + [j_p = i], so x S = x_i + x_j per pair, exactly: every other product is a zero added),
    ½ Sᵀ [K, Mg] (∂/∂x of Σ_p y_p (x_ip + x_jp) is y Sᵀ, halved for the callers' 2 t̄ convention) and
    D [K, Mg] (D_pi = [i_p = i] - [j_p = i])."""
    rows, cols = torch.triu_indices(mg, mg, device=device)
    k = torch.arange(rows.shape[0], device=device)
    first = torch.zeros(mg, rows.shape[0], dtype=dtype, device=device)
    first[rows, k] = 1.0
    second = torch.zeros_like(first)
    second[cols, k] = 1.0
    return rows, cols, first + second, 0.5 * (first + second).T, (first - second).T


class _OwnGroupPsiContract1D(torch.autograd.Function):
    """`_OwnGroupPsiContract` for one input dimension, over the pairs i <= j of the own group's inducing inputs
    only (E_n and w are symmetric: a pair i < j counts twice, K = Mg(Mg+1)/2 of the Mg² terms), as a few passes
    over [N, K] arrays and products instead of [N, Mg, Mg, 1] broadcasts (on CPU each pass over a fresh array
    costs more than its arithmetic). With dz [G, K] the groups' (z_i - z_j)² per pair, w'_p = w_ij (2 w_ij for
    i < j) and H [N, G] the one-hot matrix of the points' groups: the exponents are -κ dz_g(n) + (la S)_p (one
    gather and one product with the pair matrix S of `_pair_maps`), t_n = Σ_p E_p w'_p, ∂la = (E ∘ w') Sᵀ,
    Σ E w dz per point the own-group column of (E ∘ w') dzᵀ, and the per-group sums of the backward
    (∂W_ij = ∂W_ji = Σ_n t̄ E_n,p, ∂z through dz = Σ_p (Σ_n -2 t̄ κ E ∘ w')_p (z_i - z_j) D_p) products with Hᵀ.
    Same factors and formulas as `_OwnGroupPsiContract` (tested against it)."""

    @staticmethod
    def forward(ctx, mean, var, z, weight, amp, lsq, group):
        g, mg, _ = z.shape
        zg = z[..., 0]  # [G, Mg]
        onehot = torch.nn.functional.one_hot(group, g).to(mean.dtype)  # H [N, G]
        d = (mean - onehot @ zg).unsqueeze(-1)  # μ - z_g(n), [N, Mg, 1]: the layout of `_point_factors`
        factors = _point_factors(d, var.unsqueeze(1), lsq.unsqueeze(1), amp)
        _, _, _, _, psi1, la, kappa, s0 = factors  # Ψ₁, la [N, Mg]; κ [N, 1, 1]; Π sqrt(λ/c2) [N]
        rows, cols, pair_sum, half_sum_t, pair_diff = _pair_maps(mg, mean.dtype, mean.device)
        diff = zg[:, rows] - zg[:, cols]  # z_i - z_j per pair, [G, K]
        dz = diff.square()
        # base 2, as in `_BlockedExpContract`: exponent -κ dz + la_i + la_j, clamped above exp2's subnormal range
        e = dz.index_select(0, group).mul_(kappa[:, 0] * -_LOG2E).addmm_(la, pair_sum, alpha=_LOG2E)
        e = e.clamp_(min=_BlockedExpContract._FLOOR * _LOG2E).exp2_()
        wsym = 0.5 * (weight + weight.mT)
        wp = wsym[:, rows, cols] * torch.where(rows == cols, 1.0, 2.0).to(wsym.dtype)  # w' [G, K]
        ew = wp.index_select(0, group).mul_(e)
        t = ew.sum(-1)
        phi = amp.square() * s0 * t
        if any(ctx.needs_input_grad):
            ctx.state = (onehot, zg, d, _kept(factors), t, e, ew, dz, diff, amp, lsq.unsqueeze(1), rows, cols,
                         half_sum_t, pair_diff)
        return psi1, phi

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_psi, g_phi):
        onehot, zg, d, factors, t, e, ew, dz, diff, amp, lam, rows, cols, half_sum_t, pair_diff = ctx.state
        kappa = factors[6]
        g, mg = zg.shape
        need = ctx.needs_input_grad
        rs = ew @ half_sum_t  # Σ_j E_ij w_ij, [N, Mg]
        g_psi, g_phi, scale, g_t, g_la = _own_group_upstream(g_psi, g_phi, factors, amp, rs)
        ewdz = (torch.mm(ew, dz.T) * onehot).sum(-1)  # Σ_ij E w dz of the point's own group, [N]
        g_kappa = (-g_t * ewdz)[:, None, None]
        g_d, g_amp, g_lam, g_v = _point_factor_gradients(g_psi * factors[4], g_la, g_kappa, g_phi * t, g_psi, factors, d,
                                                         amp, lam, scale)  # g_d: -∂/∂d, [N, Mg, 1]
        g_z = g_weight = None
        if need[2]:
            # ∂/∂z through dz_p = (z_i - z_j)²: Σ_p (∂t/∂dz_p) 2 (z_i - z_j) D_p, summed over each group's points
            v = torch.mm((onehot * (-2.0 * g_t * kappa[:, 0, 0]).unsqueeze(-1)).T, ew)  # [G, K]
            g_z = ((v * diff) @ pair_diff + onehot.T @ g_d[..., 0]).unsqueeze(-1)
        if need[3]:
            g_pair = torch.mm((onehot * g_t.unsqueeze(-1)).T, e)  # Σ_n t̄ E_n per pair, [G, K]
            g_weight = g_pair.new_zeros(g, mg, mg)
            g_weight[:, rows, cols] = g_pair
            g_weight[:, cols, rows] = g_pair
        return -g_d.sum(1), g_v.sum(1), g_z, g_weight, g_amp, g_lam[:, 0], None


def own_group_psi_statistics(mean, var, z, weight, amp, lsq, group):
    """Ψ₁ and tr(Φ_n W_g(n)) when each point n sees only the inducing inputs of its own group g(n) (e.g. one GP
    per output, each point belonging to one output), for SE-shaped kernels with one prefactor and squared
    lengthscale per point:
        Ψ_n,i = c_n Π_k sqrt(λ_nk/(λ_nk + v_nk)) exp(-(μ_nk - z_g(n),ik)²/(2(λ_nk + v_nk)))           (eq. 24)
        Σ_ij Φ_n,ij W_g(n),ij   with Φ_n of eq. 25 over the group's inducing inputs (its symmetric part of W).

    mean, var [N, Dx]; z [G, Mg, Dx]; weight [G, Mg, Mg]; amp [N]; lsq [N, Dx]; group [N] (long). Returns Ψ₁ [N, Mg]
    and the contraction [N]. The per-point [Mg, Mg] terms are formed at once (N·Mg² memory): meant for small
    groups; `grouped_psi_statistics` handles large ones in chunks.
    """
    if mean.shape[-1] == 1:
        return _OwnGroupPsiContract1D.apply(mean, var, z, weight, amp, lsq, group)
    return _OwnGroupPsiContract.apply(mean, var, z, weight, amp, lsq, group)


def _grouped(mean, var, z, weight, amp, lsq, with_psi1: bool, validate: bool):
    """Ψ₁ [N, G, Mg] (None unless with_psi1) and Σ_ij Φ_n,ij W_ij [N]: see `grouped_psi_statistics`."""
    if validate:
        _check_moments(mean, var)
    n, dx = mean.shape
    g, mg = z.shape[0], z.shape[1]
    diagonal = weight.dim() == 3
    expected = (g, mg, mg) if diagonal else (g, mg, g, mg)
    if weight.shape != expected:
        raise ValueError(f"weight must have shape {list(expected)} to match z, got {tuple(weight.shape)}")
    if amp.shape != (n, g) or lsq.shape != (n, g, dx):
        raise ValueError(f"amp must be [{n}, {g}] and lsq [{n}, {g}, {dx}], got {tuple(amp.shape)} and "
                         f"{tuple(lsq.shape)}")
    if diagonal:
        psi1, phi = _DiagonalPsiContract.apply(mean, var, z, weight, amp, lsq)
        return (psi1 if with_psi1 else None), phi
    perm = None
    if n > _BlockedExpContract._chunk_size(n, g * (g + 1) // 2, mg):
        # several chunks: as in `_DiagonalPsiContract`, points sorted by (first) input and each group's inducing
        # inputs by theirs, so that a chunk of neighbouring points needs a narrow window of rows and columns; the
        # [N] and [G, Mg] inputs are permuted here (autograd takes the gradients back) and Ψ₁ and the contraction
        # are put back in the caller's order
        perm = _SortedPoints(mean[:, 0], z[..., 0])
        mean, var, amp, lsq, z, weight = perm.sort_inputs(mean, var, amp, lsq, z, weight)
    v = var.unsqueeze(1)  # [N, 1, Dx]
    diff2 = (mean[:, None, None, :] - z).square()  # [N, G, Mg, Dx], shared by Ψ₁ and the row/column factors
    psi1 = None
    if with_psi1:  # eq. 24: c Π_k sqrt(λ/(λ+v)) exp(-(μ - z)²/(2(λ+v)))
        den = lsq + v
        expo = torch.addcmul((0.5 * (lsq / den).log()).unsqueeze(2), diff2, (-0.5 / den).unsqueeze(2))
        psi1 = amp.unsqueeze(-1) * exp_or_zero(expo.sum(-1))
    rows, cols = torch.triu_indices(g, g, device=mean.device)  # blocks P = (p, q), p <= q
    a, b = lsq[:, rows], lsq[:, cols]  # [N, P, Dx]
    ab = a * b
    denom = ab + (a + b) * v  # AB + S v = S (C + v)
    # per-(point, block) prefactor c_p c_q Π_k sqrt(C/(C+v)) = c_p c_q Π_k sqrt(AB/(AB + S v))
    scale = amp[:, rows] * amp[:, cols] * torch.exp(0.5 * (ab.log() - denom.log()).sum(-1))
    # [N, P, Mg]: the -½ on the small [N, P, Dx] factors, rows by index_select (its backward is an index_add)
    la = _sum_dims(diff2.index_select(1, rows) * (-0.5 * b / denom).unsqueeze(2))
    lb = _sum_dims(diff2.index_select(1, cols) * (-0.5 * a / denom).unsqueeze(2))
    kappa = 0.5 * v / denom  # [N, P, Dx]
    dz = (z[rows].unsqueeze(2) - z[cols].unsqueeze(1)).square().permute(0, 3, 1, 2)  # [P, Dx, Mg, Mg]
    wsym = 0.5 * (weight + weight.permute(2, 3, 0, 1))
    w = wsym[rows, :, cols, :]  # [P, Mg, Mg]
    w = w * torch.where(rows == cols, 1.0, 2.0).to(w.dtype)[:, None, None]
    reach = (4.0 * denom / torch.minimum(a, b))[..., 0] if dx == 1 else None  # see `_taylor_terms`
    t = _BlockedExpContract.apply(la, lb, kappa, dz, w, reach)
    phi = (scale * t).sum(-1)
    if perm is None:
        return psi1, phi
    return (None if psi1 is None else perm.unsort_psi(psi1)), phi[perm.inverse]


def grouped_psi_statistics(mean, var, z, weight, amp, lsq, validate: bool = True):
    """Ψ₁ and tr(Φ_n W) of SE-shaped kernels whose inducing inputs come in G groups of equal size Mg, with a
    prefactor and squared lengthscale constant over each group (they may depend on the point):
        Ψ_n,gi = c_ng Π_k sqrt(λ_ngk/(λ_ngk + v_nk)) exp(-(μ_nk - z_gik)²/(2(λ_ngk + v_nk)))        (eq. 24)
        Σ_ij Φ_n,ij W_ij   with Φ_n of eq. 25, without materialising Φ_n (comment above `_BlockedExpContract`).

    mean, var [N, Dx] (moments of q(a_n)); z [G, Mg, Dx]; amp [N, G] (c of point n with group g); lsq [N, G, Dx]
    (λ of point n with group g). weight: [G, Mg, G, Mg], W over all G·Mg inducing inputs, or [G, Mg, Mg], a
    block-diagonal W (blocks (g, g) only, e.g. independent GPs of which each point sees one: the sum runs over
    G blocks instead of G(G+1)/2, each block's exponentials symmetric). Only W's symmetric part counts (Φ_n is
    symmetric). Returns Ψ₁ [N, G, Mg] and the contraction [N]. validate=False skips the check that var >= 0
    (a host read) for callers whose variances are non-negative by construction.
    """
    return _grouped(mean, var, z, weight, amp, lsq, True, validate)


def grouped_psi2_contract(mean, var, z, weight, amp, lsq) -> torch.Tensor:
    """Σ_ij Φ_n,ij W_ij [N] for SE-shaped kernels whose inducing inputs come in G groups of equal size Mg with
    a prefactor and squared lengthscale constant over each group (they may depend on the point), eq. 25
    contracted with W without materialising Φ_n (see the comment block above `_BlockedExpContract`).

    mean, var [N, Dx] (moments of q(a_n)); z [G, Mg, Dx]; weight [G, Mg, G, Mg] (W over the G·Mg inducing
    inputs; only its symmetric part matters since Φ_n is symmetric) or [G, Mg, Mg] (a block-diagonal W, see
    `grouped_psi_statistics`); amp [N, G] (c of point n with group g); lsq [N, G, Dx] (λ of point n with group
    g). Equal to `gaussian_psi2_contract` on the ungrouped inputs.
    """
    return _grouped(mean, var, z, weight, amp, lsq, False, True)[1]
