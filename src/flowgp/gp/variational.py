"""Whitened sparse variational GP layer, batched over L independent outputs.

q(u) = N(Lz v, ·) with whitened q(v) = N(m, R Rᵀ), v ~ p(v) = N(0, I) a priori (Hensman et al. 2013/2015).
The marginals of q(f) at a minibatch (TGP appendix eq. 12) cost O(B M² + M³):
    A = Lz⁻¹ K_ZX,   mean = Aᵀ m,   var = diag K_XX - Σ A² + Σ (Rᵀ A)² = diag K_XX + Σ A ⊙ (S - I) A.
Inputs of shape [..., N, D] (e.g. [S, N, D] for samples propagated through deep GPs) give marginals of
shape [..., N, L]. Kernels follow flowgp's broadcasting rule (batch_shape sits just before (N, D)).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from ..numerics.linalg import JitterMemory, cholesky_gradient_to_matrix, gram, identity, lower_inverse, robust_cholesky
from ..numerics.needed_gradients import needed_inputs, record_inputs

#: below N = ratio·M points the square-root form of the marginal terms (no S = R Rᵀ) is cheaper
SQUARE_ROOT_FORM_RATIO = 1.5

#: bytes of one chunk of outputs' [M, M] matrices in the many-output forms (`_output_chunks`)
OUTPUT_CHUNK_BYTES = 16 * 2 ** 20

__all__ = ["SparseVariationalGP", "WhitenedGaussian", "Marginals", "gaussian_kl_whitened", "gram_minus_identity"]


class Marginals(NamedTuple):
    mean: torch.Tensor  # [..., N, L]
    var: torch.Tensor  # [..., N, L] (or [..., L, N, N] covariance when full_cov=True)


def _output_chunks(num_outputs: int, size: int, itemsize: int) -> list[slice]:
    """Slices of the outputs whose [size, size] matrices take at most OUTPUT_CHUNK_BYTES together.

    Where L outputs each carry an [M, M] matrix (image layers: L = 784, M = 100: 63 MB in float64), a temporary
    of all of them is a fresh allocation that glibc's malloc serves by mmap (above its 32 MiB threshold) and the
    kernel zero-fills page by page: 40-60 ms of page faults per buffer on this project's CPUs, more than the
    arithmetic. Temporaries of a chunk stay below the threshold and are reused from the heap.
    """
    step = max(1, OUTPUT_CHUNK_BYTES // max(1, size * size * itemsize))
    return [slice(i, min(i + step, num_outputs)) for i in range(0, num_outputs, step)]


def _masked(q_sqrt: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return q_sqrt if mask is None else q_sqrt * mask


def gaussian_kl_whitened(q_mu: torch.Tensor, q_sqrt: torch.Tensor, tril_mask: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """KL[N(m, R Rᵀ) || N(0, I)] summed over the leading batch: ½ Σ (tr S + mᵀm - M - log|S|) (TGP appendix
    eq. 9). `tril_mask`: R is q_sqrt ⊙ tril_mask (the stored factor and its lower-triangular mask)."""
    num_inducing = q_mu.shape[-1]
    trace, logdet = _CovarianceTerms.apply(q_sqrt, tril_mask)
    return 0.5 * (trace + q_mu.square().sum(-1) - num_inducing - logdet).sum()


class _CovarianceTerms(torch.autograd.Function):
    """(tr S, log|S|) = (Σ R², Σ log R_ii²) of S = R Rᵀ, R = q_sqrt (⊙ mask), with q_sqrt's gradient
    2 ḡ_tr R + diag(2 ḡ_log / R_ii) written into one [L, M, M] buffer, its temporaries in chunks of outputs
    (`_output_chunks`): autograd spends a buffer on R, on R², on each gradient term, on the diagonal's zero-filled
    gradient and on the mask's backward, six passes over [L, M, M] tensors that at image layers' L = 784 outputs
    cost as much as their matrix products. Leading axes beyond [L, M, M] are folded into L."""

    @staticmethod
    def forward(ctx, q_sqrt, mask=None):
        m = q_sqrt.shape[-1]
        flat = q_sqrt.reshape(-1, m, m)
        trace = q_sqrt.new_empty(flat.shape[0])
        for part in _output_chunks(flat.shape[0], m, q_sqrt.element_size()):
            r = _masked(flat[part], mask).reshape(-1, 1, m * m)
            trace[part] = (r @ r.mT).reshape(-1)  # Σ R² as a dot product: no R² buffer
        squared = torch.diagonal(q_sqrt, dim1=-2, dim2=-1).square()  # the mask's diagonal is 1
        ctx.save_for_backward(q_sqrt, mask, squared)
        return trace.reshape(q_sqrt.shape[:-2]), squared.log().sum(-1)

    @staticmethod
    def backward(ctx, g_trace, g_logdet):
        q_sqrt, mask, squared = ctx.saved_tensors
        m = q_sqrt.shape[-1]
        if g_trace is None:
            grad = torch.zeros_like(q_sqrt)
        else:
            grad = torch.empty_like(q_sqrt)
            flat, out, scale = q_sqrt.reshape(-1, m, m), grad.view(-1, m, m), (2 * g_trace).reshape(-1, 1, 1)
            for part in _output_chunks(flat.shape[0], m, q_sqrt.element_size()):
                if mask is None:
                    torch.mul(flat[part], scale[part], out=out[part])
                else:
                    torch.mul(flat[part], mask, out=out[part]).mul_(scale[part])
        if g_logdet is not None:  # d log R_ii² / d R_ii = 2 / R_ii, on the diagonal
            diag = torch.diagonal(q_sqrt, dim1=-2, dim2=-1)
            torch.diagonal(grad, dim1=-2, dim2=-1).add_((g_logdet[..., None] / squared) * (2 * diag))
        return grad, None


def _output_grads(g_mean, g_quad, p):
    """The incoming gradients of (mean, quad) as [..., L, 1, N], zeros for an output that was not used."""
    zeros = None if g_mean is not None and g_quad is not None else torch.zeros_like(p[..., 0, :])
    g_mean = zeros if g_mean is None else g_mean
    g_quad = zeros if g_quad is None else g_quad
    return g_mean.unsqueeze(-2), g_quad.unsqueeze(-2)


class _WhitenedMarginalTerms(torch.autograd.Function):
    """A = Lz⁻¹ K_ZX, mean = mᵀA and quad = diag(Aᵀ C A) for symmetric C, with a backward written by hand.

    Autograd would spend four [M, M] x [M, N] products on the backward of these three lines; two suffice:
    for symmetric C the gradient of a_nᵀ C a_n is 2 C a_n (and C A is kept from the forward), and the
    Cholesky factor's gradient -L⁻ᵀ Ā Aᵀ only needs Ā Aᵀ = m (A ḡ_mean)ᵀ + 2 C G with the [M, M] matrix
    G = Σ_n ḡ_n a_n a_nᵀ, which is also C's gradient. So the backward costs G and one product with Lz⁻ᵀ.
    Lz⁻¹ is formed explicitly (M³/3): on CPU an [M, M] x [M, N] GEMM runs about twice as fast as the
    triangular solve, and it returns a row-major A, which the solve does not.

    With `kzz` given (K_ZZ, of which `chol` is the detached factor) the gradient goes to K_ZZ directly,
    -Lz⁻ᵀ Ψ(Ā Aᵀ) Lz⁻¹ (`flowgp.numerics.linalg.cholesky_gradient_to_matrix`), instead of to the factor, whose own
    backward would add a GEMM and two triangular solves.
    """

    @staticmethod
    def forward(ctx, chol, kzx, q_mu, c, kzz=None):
        record_inputs(ctx, chol, kzx, q_mu, c, kzz)
        chol_inv = lower_inverse(chol)
        a = chol_inv @ kzx  # [..., Lb, M, N]
        p = c @ a  # [..., L, M, N]
        quad = (a * p).sum(-2)
        mean = (q_mu.unsqueeze(-2) @ a).squeeze(-2)
        ctx.save_for_backward(chol_inv, a, q_mu, c, p, chol)
        ctx.kzx_shape = kzx.shape
        return mean, quad

    @staticmethod
    def backward(ctx, g_mean, g_quad):
        chol_inv, a, q_mu, c, p, chol = ctx.saved_tensors
        g_mean, g_quad = _output_grads(g_mean, g_quad, p)
        need_chol, need_kzx, need_mu, need_c, need_kzz = (needed_inputs(ctx) + (False,))[:5]
        need_chol = need_chol or need_kzz
        gram = (g_quad * a) @ a.mT if (need_c or need_chol) else None  # G, [..., L, M, M]
        a_gmean = (a @ g_mean.mT).squeeze(-1)  # A ḡ_mean, [..., L, M]
        grad_chol = grad_kzx = grad_mu = grad_c = None
        if need_c:
            grad_c = gram.sum_to_size(c.shape)
        if need_mu:
            grad_mu = a_gmean.sum_to_size(q_mu.shape)
        chol_inv_t = chol_inv.mT
        if need_kzx:
            # 2 ḡ ⊙ P + m ḡ_meanᵀ with one new [M, N] buffer: the outer product is added in place (each new
            # buffer of that size costs page faults on top of its pass)
            grad_a = (p * (2.0 * g_quad)).addcmul_(q_mu.unsqueeze(-1), g_mean).sum_to_size(a.shape)
            grad_kzx = (chol_inv_t @ grad_a).sum_to_size(ctx.kzx_shape)
        grad_kzz = None
        if need_chol:
            abar_at = q_mu.unsqueeze(-1) * a_gmean.unsqueeze(-2) + 2.0 * (c @ gram)  # Ā Aᵀ, [..., L, M, M]
            abar_at = abar_at.sum_to_size(chol_inv.shape)
            if need_kzz:  # Lzᵀ ∂F/∂Lz = -Ā Aᵀ
                grad_kzz, grad_chol = -cholesky_gradient_to_matrix(chol_inv, abar_at, chol), None
            else:
                grad_chol = -(chol_inv_t @ abar_at).tril()
        return (grad_chol, grad_kzx, grad_mu, grad_c, grad_kzz)[:len(ctx.needs_input_grad)]


class _KernelSpaceMarginalTerms(torch.autograd.Function):
    """The same (mᵀA, diag(Aᵀ C A)) computed from K_ZX without forming A: with X = Lz⁻¹, w = Xᵀm and the
    [M, M] matrix B = Xᵀ C X, mean = wᵀ K_ZX and quad = diag(K_XZ B K_ZX).

    One [M, M] x [M, N] product forward (P = B K_ZX) and one backward (G = Σ_n ḡ_n k_n k_nᵀ, B's gradient);
    K_ZX's gradient w ḡ_mean + 2 ḡ ⊙ P is element-wise. Everything else is [M, M] work. That halves the
    dominant cost of `_WhitenedMarginalTerms`, at the price of a cancellation between kdiag and quad that is
    ‖B‖·eps larger (‖B‖ ~ 1/λ_min(K_ZZ)), so it is used for float64 only. `kzz` as in
    `_WhitenedMarginalTerms`.
    """

    @staticmethod
    def forward(ctx, chol, kzx, q_mu, c, kzz=None):
        record_inputs(ctx, chol, kzx, q_mu, c, kzz)
        x = lower_inverse(chol)  # Lz⁻¹
        w = (x.mT @ q_mu.unsqueeze(-1)).squeeze(-1)  # [..., L, M]
        b = x.mT @ c @ x  # [L, M, M]
        b = 0.5 * (b + b.mT)
        p = b @ kzx  # [..., L, M, N]
        quad = (kzx * p).sum(-2)
        mean = (w.unsqueeze(-2) @ kzx).squeeze(-2)
        ctx.save_for_backward(x, kzx, q_mu, c, p, w, b, chol)
        return mean, quad

    @staticmethod
    def backward(ctx, g_mean, g_quad):
        x, kzx, q_mu, c, p, w, b, chol = ctx.saved_tensors
        g_mean, g_quad = _output_grads(g_mean, g_quad, p)
        need_chol, need_kzx, need_mu, need_c, need_kzz = (needed_inputs(ctx) + (False,))[:5]
        grad_chol = grad_kzx = grad_mu = grad_c = grad_kzz = None
        if need_kzx:
            # one new [M, N] buffer, the outer product w ḡ_meanᵀ added in place
            grad_kzx = (p * (2.0 * g_quad)).addcmul_(w.unsqueeze(-1), g_mean).sum_to_size(kzx.shape)
        # [..., L, M]; not needed by a pass that wants K_ZX's gradient alone (DREG's products w.r.t. z)
        grad_w = (kzx @ g_mean.mT).squeeze(-1) if (need_mu or need_chol or need_kzz) else None
        if need_mu:
            grad_mu = (x @ grad_w.unsqueeze(-1)).squeeze(-1).sum_to_size(q_mu.shape)
        if need_c or need_chol or need_kzz:
            # G = Σ_n ḡ_n k_n k_nᵀ (symmetric), summed over sample dims to B's shape
            gram = ((g_quad * kzx) @ kzx.mT).sum_to_size(torch.broadcast_shapes(x.shape, c.shape))
            t = gram @ x.mT  # G Xᵀ, shared by both gradients
            x_t = x @ t if (need_c or need_kzz) else None
            if need_c:
                grad_c = x_t.sum_to_size(c.shape)
            if need_kzz:
                # Lzᵀ ∂F/∂Lz = -(2 C X G Xᵀ + m (X ḡ_w)ᵀ), each term summed to X's shape on its own
                h = (2.0 * (c @ x_t)).sum_to_size(x.shape) + (
                    q_mu.unsqueeze(-1) * (x @ grad_w.unsqueeze(-1)).mT).sum_to_size(x.shape)
                grad_kzz = -cholesky_gradient_to_matrix(x, h, chol)
            elif need_chol:
                # b = Xᵀ C X and w = Xᵀ m give X's gradient 2 C X G + m ḡ_wᵀ, and X = L⁻¹ turns a gradient H
                # into -Xᵀ H Xᵀ: -(2 B G Xᵀ + w (X ḡ_w)ᵀ) with the saved B, three [M, M] products fewer
                # (each term summed on its own: adding them first would broadcast G's term over sample dims)
                grad_x_term = (2.0 * (b @ t)).sum_to_size(x.shape)
                mean_term = (w.unsqueeze(-1) * (x @ grad_w.unsqueeze(-1)).mT).sum_to_size(x.shape)
                grad_chol = -(grad_x_term + mean_term).tril()
        return (grad_chol, grad_kzx, grad_mu, grad_c, grad_kzz)[:len(ctx.needs_input_grad)]


class _SquareRootMarginalTerms(torch.autograd.Function):
    """(mᵀA, diag(Aᵀ (R Rᵀ - I) A)) from the factor R itself, in the point-major layout, backward by hand.

    With Q = Rᵀ A the quadratic form is Σ_j Q_jn² - Σ_j A_jn²: no [M, M] product S = R Rᵀ, no S A, and the
    backward needs no Gram matrix G = Σ_n ḡ_n a_n a_nᵀ either. Its gradients are
        Ā = m ḡ_meanᵀ + 2 (R Q - A) ḡ_quad,   R̄ = 2 (A ḡ_quad) Qᵀ,   K̄_ZX = Lz⁻ᵀ Ā,   Lzᵀ L̄z = -Ā Aᵀ,
    so a step costs six [M, M] x [M, N] products (A and Lz⁻ᵀĀ as triangular solves) and, for K_ZZ's
    gradient, two [M, M] triangular solves (`cholesky_gradient_to_matrix`): no [M, M] x [M, M] GEMM, where
    the S-form (`_WhitenedMarginalTerms`) spends three of them and Lz⁻¹. That wins while N < 1.5 M (the
    minibatch of a large-M model); for N >> M the S-form does fewer FLOPs.

    The products are taken point-major, Aᵀ of shape [..., N, M] (a transposed view of the left solve's A): the
    backward's solve for K̄_XZ then runs from the right with the lower factor, the layout MKL takes at near
    GEMM speed without transposing a copy (its upper-from-the-right solve is about twice as slow). Same arguments as
    `_WhitenedMarginalTerms` with `r` (R, [L, M, M]) in place of C = R Rᵀ - I.
    """

    @staticmethod
    def forward(ctx, chol, kzx, q_mu, r, kzz=None):
        record_inputs(ctx, chol, kzx, q_mu, r, kzz)
        # A = Lz⁻¹ K_ZX as a left solve, read point-major through its transposed view: MKL's right solve
        # that returns Aᵀ directly (K_XZ Lz⁻ᵀ, upper factor from the right) ran 2.8 ms against 1.5 ms for this
        # one at M = 500, N = 512, float32 (2 threads), the single slowest call of the step
        a = torch.linalg.solve_triangular(chol, kzx, upper=False)  # A, [..., Lb, M, N]
        at = a.mT  # Aᵀ, [..., Lb, N, M]
        qt = at @ r  # Qᵀ = Aᵀ R, [..., L, N, M]
        quad = qt.square().sum(-1) - a.square().sum(-2)
        mean = (at @ q_mu.unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(chol, at, qt, q_mu, r)
        ctx.kzx_shape = kzx.shape
        return mean, quad

    @staticmethod
    def backward(ctx, g_mean, g_quad):
        chol, at, qt, q_mu, r = ctx.saved_tensors
        zeros = None if g_mean is not None and g_quad is not None else torch.zeros_like(qt[..., 0])
        g_mean = (zeros if g_mean is None else g_mean).unsqueeze(-1)  # [..., L, N, 1]
        g_quad = (zeros if g_quad is None else g_quad).unsqueeze(-1)
        need_chol, need_kzx, need_mu, need_r, need_kzz = (needed_inputs(ctx) + (False,))[:5]
        grad_chol = grad_kzx = grad_mu = grad_r = grad_kzz = None
        if need_mu:
            grad_mu = (g_mean.mT @ at).squeeze(-2).sum_to_size(q_mu.shape)
        if need_r:
            grad_r = (2.0 * (at * g_quad).mT @ qt).sum_to_size(r.shape)
        if need_kzx or need_chol or need_kzz:
            # Āᵀ = ḡ_mean mᵀ + 2 ḡ_quad (Qᵀ Rᵀ - Aᵀ) (point-major), [..., L, N, M], summed to Aᵀ's shape
            abar_t = (qt @ r.mT).sub_(at).mul_(2.0 * g_quad).addcmul_(g_mean, q_mu.unsqueeze(-2))  # in place
            abar_t = abar_t.sum_to_size(at.shape)
            if need_kzx:  # K̄_XZ = Āᵀ Lz⁻¹ (right solve), returned in K_ZX's layout
                grad_kzx = torch.linalg.solve_triangular(chol, abar_t, upper=False, left=False).mT
                grad_kzx = grad_kzx.sum_to_size(ctx.kzx_shape)
            if need_chol or need_kzz:
                h = (abar_t.mT @ at).sum_to_size(chol.shape)  # Ā Aᵀ = -Lzᵀ L̄z
                if need_kzz:
                    grad_kzz = -cholesky_gradient_to_matrix(None, h, chol)
                else:
                    grad_chol = -torch.linalg.solve_triangular(chol.mT, h, upper=True).tril()
        return (grad_chol, grad_kzx, grad_mu, grad_r, grad_kzz)[:len(ctx.needs_input_grad)]


def _packed_pairs(m: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The M(M+1)/2 index pairs i <= j: rows i, columns j, the flat positions i·M + j, and for each of the M²
    positions (i, j) of a symmetric matrix the pair that holds it."""
    rows, cols = torch.triu_indices(m, m, device=device)
    pair = torch.empty(m, m, dtype=torch.long, device=device)
    number = torch.arange(rows.shape[0], device=device)
    pair[rows, cols] = number
    pair[cols, rows] = number
    return rows, cols, rows * m + cols, pair.reshape(-1)


class _SharedProjectionMarginalTerms(torch.autograd.Function):
    """(mᵀA, diag(Aᵀ (R_l R_lᵀ - I) A)) for L outputs that share one projection A = Lz⁻¹ K_ZX (one kernel and one
    set of inducing inputs: image layers' C·H·W GPs), as one GEMM over the packed outer products of A's columns.

    With v_n = (a_in a_jn) over the pairs i <= j (P = M(M+1)/2 of them) and c_l the pairs of C_l = S_l - I,
    weighted 2 off the diagonal, quad_ln = c_lᵀ v_n, so quad = [L, P] x [P, N], and its gradients are GEMMs too:
        C̄_l = Σ_n ḡ_ln a_n a_nᵀ = (ḡ Vᵀ) unpacked,   R̄_l = 2 C̄_l R_l,   ∂/∂v_n = Σ_l ḡ_ln c_l = (cᵀ ḡ)_n,
    from which Ā takes a_jn per pair (index sums). That is about L·M²·N multiply-adds per pass where the
    per-output forms spend 2·L·M²·N, in one large GEMM instead of L small ones, with no [L, M, N] temporary and
    S_l formed once (M³ per output); the [M, M] work runs in chunks of outputs (`_output_chunks`). It works in
    the whitened space (A), so its rounding does not grow with K_ZZ's condition number: float32 keeps it.

    chol: Lz [M, M]; kzx: [M, N] or [1, M, N]; q_mu: [L, M]; r: R [L, M, M], or with `mask` the stored factor
    of which R = r ⊙ mask (masked chunk by chunk, never as a whole); kzz as in `_WhitenedMarginalTerms`.
    Returns mean and quad, each [L, N].
    """

    @staticmethod
    def forward(ctx, chol, kzx, q_mu, r, kzz=None, mask=None):
        record_inputs(ctx, chol, kzx, q_mu, r, kzz)
        num_outputs, m = r.shape[0], r.shape[-1]
        chol_inv = lower_inverse(chol)
        a = _without_negligible(chol_inv @ kzx.reshape(m, -1))  # [M, N]
        rows, cols, upper, _ = _packed_pairs(m, a.device)
        diagonal = rows == cols
        packed = a.new_empty(num_outputs, rows.shape[0])  # C's pairs, weighted, [L, P]
        for part in _output_chunks(num_outputs, m, r.element_size()):
            block = _masked(r[part], mask)
            torch.index_select((block @ block.mT).reshape(-1, m * m), 1, upper, out=packed[part])
        packed.sub_(diagonal.to(a.dtype)).mul_(torch.where(diagonal, 1.0, 2.0).to(a.dtype))
        mean = q_mu @ a
        if not any(ctx.needs_input_grad):
            # no backward (predictions): the [P, N] outer products in column blocks, whatever N = S·rows is
            quad = a.new_empty(num_outputs, a.shape[-1])
            for cols_block in torch.split(torch.arange(a.shape[-1], device=a.device), _PACKED_COLUMNS):
                block = a[:, cols_block]
                quad[:, cols_block] = packed @ (block[rows] * block[cols])
            return mean, quad
        v = a[rows] * a[cols]  # [P, N]
        quad = packed @ v
        ctx.save_for_backward(chol_inv, a, q_mu, r, packed, v, chol, mask)
        ctx.kzx_shape = kzx.shape
        return mean, quad

    @staticmethod
    def backward(ctx, g_mean, g_quad):
        chol_inv, a, q_mu, r, packed, v, chol, mask = ctx.saved_tensors
        zeros = None if g_mean is not None and g_quad is not None else a.new_zeros(q_mu.shape[0], a.shape[-1])
        g_mean = zeros if g_mean is None else _without_negligible(g_mean)
        g_quad = zeros if g_quad is None else _without_negligible(g_quad)
        need_chol, need_kzx, need_mu, need_r, need_kzz = (needed_inputs(ctx) + (False,) * 2)[:5]
        grad_kzx = grad_mu = grad_r = None
        if need_r:
            grad_r = _shared_factor_gradient(r, mask, g_quad, v)
        if need_mu:
            grad_mu = g_mean @ a.mT
        grad_chol, grad_kzz = None, None
        if need_kzx or need_chol or need_kzz:
            rows, cols, _, _ = _packed_pairs(a.shape[0], a.device)
            per_pair = packed.mT @ g_quad  # [P, N]
            grad_a = q_mu.mT @ g_mean  # [M, N]
            grad_a.index_add_(0, rows, per_pair * a[cols]).index_add_(0, cols, per_pair * a[rows])
            if need_kzx:
                grad_kzx = (chol_inv.mT @ grad_a).reshape(ctx.kzx_shape)
            if need_chol or need_kzz:
                abar_at = grad_a @ a.mT  # Ā Aᵀ = -Lzᵀ L̄z
                if need_kzz:
                    grad_kzz = -cholesky_gradient_to_matrix(chol_inv, abar_at, chol)
                else:
                    grad_chol = -(chol_inv.mT @ abar_at).tril()
        return (grad_chol, grad_kzx, grad_mu, grad_r, grad_kzz, None)[:len(ctx.needs_input_grad)]


def _shared_factor_gradient(r, mask, g_quad, v):
    """R̄ = 2 C̄ R with C̄_l = Σ_n ḡ_ln a_n a_nᵀ from its pairs ḡ Vᵀ, chunk by chunk of outputs (masked like R)."""
    m = r.shape[-1]
    _, _, _, pair = _packed_pairs(m, r.device)
    grad = torch.empty_like(r)
    twice = 2.0 * g_quad
    for part in _output_chunks(r.shape[0], m, r.element_size()):
        dense = (twice[part] @ v.mT).index_select(1, pair).reshape(-1, m, m)  # 2 C̄ of the chunk
        torch.bmm(dense, _masked(r[part], mask), out=grad[part])
    return grad if mask is None else grad.mul_(mask)


#: points per block of the packed outer products when no gradient is needed (a [P, block] temporary)
_PACKED_COLUMNS = 1024


def _without_negligible(x: torch.Tensor) -> torch.Tensor:
    """x with entries below eps·max|x| (eps: x's machine epsilon) set to 0: a change at the rounding level of the
    sums they enter, which keeps their products clear of the subnormal range (see
    `flowgp.gp.kernels.exp_without_subnormals`: far points' projections a ~ 1e-30 made a_i a_j subnormal)."""
    scale = x.abs().amax() * torch.finfo(x.dtype).eps
    return x.masked_fill(x.abs() < scale, 0.0)


def _shares_projection(chol: torch.Tensor, kzx: torch.Tensor, q_mu: torch.Tensor) -> bool:
    """Whether several outputs share one K_ZZ and one K_ZX (no sample axes): `_SharedProjectionMarginalTerms`."""
    return chol.dim() == 2 and q_mu.shape[0] > 1 and (kzx.dim() == 2 or (kzx.dim() == 3 and kzx.shape[0] == 1))


def whitened_marginal_terms(chol: torch.Tensor, kzx: torch.Tensor, q_mu: torch.Tensor, r: torch.Tensor,
                            kzz: torch.Tensor | None = None, tril_mask: torch.Tensor | None = None):
    """(mᵀA, diag(Aᵀ (R Rᵀ - I) A)) with A = Lz⁻¹ K_ZX: the whitened marginal mean and covariance correction
    (TGP appendix eq. 12), with a hand-written backward.

    chol: Lz [Lb, M, M] or [M, M]; kzx: [..., Lb, M, N]; q_mu: m [L, M]; r: R [L, M, M] (S = R Rᵀ).
    kzz: K_ZZ, when `chol` is its (detached) factor: the gradient then goes to K_ZZ without the Cholesky's
    own backward. tril_mask: R is r ⊙ tril_mask (r the stored factor, `WhitenedGaussian.q_sqrt`). Returns mean
    and quad, each [..., L, N].

    Four evaluations of the same terms, chosen by cost: for N < SQUARE_ROOT_FORM_RATIO·M (a minibatch no
    larger than the inducing set) the square-root form, which never forms S (no [M, M] x [M, M] products);
    otherwise S - I is formed once (M³) to save [M, N] products: for several outputs sharing one K_ZZ and
    K_ZX, as one GEMM over packed outer products of A's columns (`_SharedProjectionMarginalTerms`); else in
    float64 through B = Lz⁻ᵀ (S - I) Lz⁻¹ (half the [M, N] products), in lower precisions through A, whose
    rounding error does not grow with K_ZZ's condition number squared.
    """
    if kzz is not None and chol.requires_grad:
        raise ValueError("with kzz given, chol must be its detached factor (the gradient goes to kzz)")
    num_points, num_inducing = kzx.shape[-1], kzx.shape[-2]
    if num_points >= SQUARE_ROOT_FORM_RATIO * num_inducing and _shares_projection(chol, kzx, q_mu):
        return _SharedProjectionMarginalTerms.apply(chol, kzx, q_mu, r, kzz, tril_mask)
    if tril_mask is not None:
        r = r * tril_mask
    if num_points < SQUARE_ROOT_FORM_RATIO * num_inducing:
        return _SquareRootMarginalTerms.apply(chol, kzx, q_mu, r, kzz)
    c = gram_minus_identity(r)
    # the kernel-space form trades two [M, N] products for about eight [M, M] ones: worth it from N >= 2M
    if kzx.dtype == torch.float64 and num_points >= 2 * num_inducing:
        return _KernelSpaceMarginalTerms.apply(chol, kzx, q_mu, c, kzz)
    return _WhitenedMarginalTerms.apply(chol, kzx, q_mu, c, kzz)


def gram_minus_identity(r: torch.Tensor) -> torch.Tensor:
    """S - I = R Rᵀ - I for [..., M, M] R: the part of the whitened covariance q(v) adds to the prior's
    (`flowgp.numerics.linalg.gram`: one [M, M] product in the backward, where autograd's matmul spends two)."""
    return gram(r) - identity(r.shape[-1], r.dtype, r.device)


class WhitenedGaussian(nn.Module):
    """L independent whitened Gaussians q(v_l) = N(m_l, R_l R_lᵀ) over M inducing outputs, p(v) = N(0, I).

    The one variational family over inducing outputs shared by every sparse GP of flowgp (SVGP, TGP, deep-GP
    layers, AMO-GP's alignment, latent and warping GPs): u = Lz v with Lz the Cholesky factor of K_ZZ
    (Hensman et al. 2015), so KL[q(u) || p(u)] = KL[q(v) || N(0, I)] (TGP appendix eq. 9) needs no K_ZZ.
    R is stored full and read through a lower-triangular mask (`q_sqrt_tril`).
    """

    def __init__(self, num_outputs: int, num_inducing: int, q_var_init: float = 1e-5,
                 dtype: torch.dtype = torch.float64, device=None):
        super().__init__()
        m = int(num_inducing)
        self.q_mu = nn.Parameter(torch.zeros(int(num_outputs), m, dtype=dtype, device=device))
        eye = torch.eye(m, dtype=dtype, device=device).expand(int(num_outputs), m, m).clone()
        self.q_sqrt = nn.Parameter(math.sqrt(q_var_init) * eye)
        # a multiplicative mask instead of torch.tril: tril's OpenMP loop stalls for milliseconds on busy cores
        self.register_buffer("_tril_mask", torch.ones(m, m, dtype=dtype, device=device).tril(), persistent=False)

    def q_sqrt_tril(self) -> torch.Tensor:
        """Lower-triangular R of S = R Rᵀ, [L, M, M]."""
        return self.q_sqrt * self._tril_mask

    def kl_divergence(self) -> torch.Tensor:
        """KL[q(v) || N(0, I)] summed over the L outputs (appendix eq. 9)."""
        return gaussian_kl_whitened(self.q_mu, self.q_sqrt, self._tril_mask)

    def sample_whitened(self, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draws v = m + R ε of the whitened inducing outputs, [num_samples, L, M]."""
        eps = torch.randn((int(num_samples),) + self.q_mu.shape + (1,), dtype=self.q_mu.dtype,
                          device=self.q_mu.device, generator=generator)
        return self.q_mu + (self.q_sqrt_tril() @ eps).squeeze(-1)

    def natural_parameter_pair(self) -> tuple[nn.Parameter, nn.Parameter]:
        """(q_mu, q_sqrt): the parameters a natural-gradient optimiser updates (`flowgp.training.natural_gradients`)."""
        return self.q_mu, self.q_sqrt


class SparseVariationalGP(WhitenedGaussian):
    """One (multi-output) sparse GP f ~ GP(mean_function, kernel) with whitened inducing outputs.

    Args:
        kernel: a flowgp kernel; batch_shape () shares hyperparameters across outputs, (L,) gives each its own.
        inducing_points: [M, D] shared, or [L, M, D] per output.
        num_outputs: L.
        mean_function: optional module mapping [..., N, D] to [..., N, L]; None means zero mean.
        q_var_init: initial S = q_var_init·I (appendix B.6 uses 1e-5).
        learn_inducing: whether Z is trained.
        jitter: diagonal jitter for K_ZZ (None: dtype default), grown on Cholesky failure; the grown level
            is kept in `jitter_memory` (later factorisations start there; one warning per fit).

    See Also:
        :class:`flowgp.SVGP` (the model built on it), :class:`flowgp.models.GPLayer` (a deep GP's layer).
    """

    def __init__(
        self,
        kernel: nn.Module,
        inducing_points: torch.Tensor,
        num_outputs: int = 1,
        mean_function: nn.Module | None = None,
        q_var_init: float = 1e-5,
        learn_inducing: bool = True,
        jitter: float | None = None,
    ):
        z = inducing_points if isinstance(inducing_points, torch.Tensor) and inducing_points.is_floating_point() \
            else torch.as_tensor(inducing_points, dtype=torch.float64)
        if z.dim() not in (2, 3):
            raise ValueError(f"inducing_points must have shape [M, D] or [L, M, D], got {tuple(z.shape)}")
        if z.dim() == 3 and z.shape[0] != num_outputs:
            raise ValueError(f"inducing_points has {z.shape[0]} output slices but num_outputs={num_outputs}")
        if not torch.isfinite(z).all():
            raise ValueError("inducing_points contains NaN or inf")
        super().__init__(num_outputs, z.shape[-2], q_var_init, dtype=z.dtype, device=z.device)
        self.kernel = kernel
        self.mean_function = mean_function
        self.num_outputs = int(num_outputs)
        self.jitter = jitter
        # the K_ZZ jitter level that last worked: later steps start there instead of failing and retrying
        self.jitter_memory = JitterMemory()
        self.inducing_points = nn.Parameter(z.detach().clone(), requires_grad=learn_inducing)

    @property
    def num_inducing(self) -> int:
        return self.inducing_points.shape[-2]

    def kzz_cholesky(self) -> torch.Tensor:
        """Lz, the Cholesky factor of K_ZZ (jitter grown and reported on failure), [Lb, M, M] or [M, M]."""
        kzz = self.kernel(self.inducing_points)  # [Lb, M, M] or [M, M]
        return robust_cholesky(kzz, jitter=self.jitter, memory=self.jitter_memory)

    def _kernel_blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K_ZZ, the matrix its Cholesky factor is taken of (detached), and K_ZX.

        For x of shape [N, D] and a kernel whose cross formula covers K_ZZ (`cross_matches_self`: no White
        term) K_ZZ and K_ZX come from one kernel evaluation K(Z, [Z; X]) split in two: one
        pass through the kernel's parameter transforms, centring and norms instead of two (the per-step
        overhead that dominates at small M). K_ZZ is then the cross-covariance formula's, whose diagonal is
        k(z, z) only to rounding (in float32 as large as the jitter); the factor is taken of a detached copy
        with the exact diagonal `kernel.diag(Z)`, and the gradient of the cross formula is exact to rounding.
        """
        z = self.inducing_points
        if x.dim() != 2 or not getattr(self.kernel, "cross_matches_self", False):
            kzz = self.kernel(z)
            return kzz, kzz.detach(), self.kernel(z, x.unsqueeze(-3))
        m = z.shape[-2]
        both = torch.cat([z, x.expand(z.shape[:-2] + x.shape)], dim=-2)  # [Lb?, M + N, D]
        k = self.kernel(z, both)  # [Lb, M, M + N] or [M, M + N]
        # split, not two slices: the backward concatenates the two gradients instead of zero-filling a
        # [M, M + N] buffer for each
        kzz, kzx = k.split([m, x.shape[-2]], dim=-1)
        with torch.no_grad():
            exact = kzz.detach().clone()
            exact.diagonal(dim1=-2, dim2=-1).copy_(self.kernel.diag(z).expand(exact.shape[:-1]))
        return kzz, exact, (kzx if kzx.dim() == 3 else kzx.unsqueeze(-3))

    def projection(self, x: torch.Tensor, transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """A = Lz⁻¹ K_ZX of shape [..., Lb, M, N] and Lz: the whitened cross-covariance of eq. 12. `transposed`:
        Aᵀ = K_XZ Lz⁻ᵀ, [..., Lb, N, M], computed in that layout (M the contiguous axis, for callers whose later
        products contract over M per point)."""
        chol = self.kzz_cholesky()
        # explicit Lz⁻¹ and one GEMM (`lower_inverse`): faster than the triangular solve, and row-major
        if transposed:
            return self.kernel(x.unsqueeze(-3), self.inducing_points) @ lower_inverse(chol).mT, chol
        kzx = self.kernel(self.inducing_points, x.unsqueeze(-3))  # [..., Lb, M, N]
        return lower_inverse(chol) @ kzx, chol

    def marginals(self, x: torch.Tensor, full_cov: bool = False) -> Marginals:
        """q(f(x)) = ∫ p(f | u) q(u) du (appendix eq. 12): mean/var [..., N, L] (cov [..., L, N, N])."""
        num_inducing = self.q_sqrt.shape[-1]
        if not full_cov and (x.shape[-2] >= 2 * num_inducing or torch.is_grad_enabled()):
            # training steps (and N >= 2M): one fused solve / mean / quadratic form with a hand-written
            # backward, which beats autograd of the plain formula at any N (no triangular solves in the
            # backward, two [M, N] products fewer); forming S - I costs M³, cheap next to what it saves.
            # Without gradients and N < 2M (predicting a few points) the plain formula does less work.
            # The factor is taken without autograd: the fused terms send the gradient to K_ZZ directly.
            kzz, factored, kzx = self._kernel_blocks(x)  # [Lb, M, M] or [M, M] (twice); [..., Lb, M, N]
            chol = robust_cholesky(factored, jitter=self.jitter, memory=self.jitter_memory)
            # [..., L, N]; R = q_sqrt ⊙ mask, masked inside (where that saves a pass over [L, M, M])
            mean, quad = whitened_marginal_terms(chol, kzx, self.q_mu, self.q_sqrt, kzz, self._tril_mask)
            var = self.kernel.diag(x.unsqueeze(-3)) + quad
            out = Marginals(mean.transpose(-1, -2), var.transpose(-1, -2).clamp_min(1e-12))
        else:
            r = self.q_sqrt_tril()
            a, _ = self.projection(x)  # [..., Lb, M, N]
            mean = (self.q_mu.unsqueeze(-2) @ a).squeeze(-2).transpose(-1, -2)  # [..., N, L]
            if full_cov:
                kxx = self.kernel(x.unsqueeze(-3))  # [..., Lb, N, N]
                out = Marginals(mean, kxx + self._covariance_correction(a, r, full_cov=True))
            else:
                var = self.kernel.diag(x.unsqueeze(-3)) + self._covariance_correction(a, r, full_cov=False)
                out = Marginals(mean, var.transpose(-1, -2).clamp_min(1e-12))
        if self.mean_function is not None:
            out = Marginals(out.mean + self.mean_function(x), out.var)
        return out

    @staticmethod
    def _covariance_correction(a: torch.Tensor, r: torch.Tensor, full_cov: bool) -> torch.Tensor:
        """Aᵀ (S - I) A (its diagonal unless full_cov), the part of the covariance q(u) adds to K_XX."""
        if full_cov and a.shape[-1] >= 2 * a.shape[-2]:
            # N >= 2M: the M³ product S - I is cheap next to a second [N, M] x [M, N] product
            return a.mT @ (gram_minus_identity(r) @ a)
        # small N (prediction on a few points, M comparable to N): (RᵀA)ᵀ(RᵀA) - AᵀA, no M³ work
        ra = r.mT @ a
        return ra.mT @ ra - a.mT @ a if full_cov else ra.square().sum(-2) - a.square().sum(-2)

    def conditional(self, x: torch.Tensor, v: torch.Tensor) -> Marginals:
        """Marginals of p(f(x) | v) for whitened inducing outputs v [..., L, M] (one draw per leading index).

        mean = Aᵀ v (+ mean function), var = diag K_XX - Σ A², A = Lz⁻¹ K_ZX (TGP appendix eq. 12 with S = 0):
        the conditional used by flow posteriors over U (deep GPs), non-marginal flows and G-SP. x is
        [..., N, D] with the same leading shape as v's (or none, shared by every draw): the leading axes
        are folded into the columns of one [L, M, P] projection (one kernel batch over outputs, no K_ZZ
        factor broadcast over draws). Returns mean [..., N, L] and var [..., N, L].
        """
        if v.shape[-2:] != (self.num_outputs, self.num_inducing):
            raise ValueError(
                f"v must have shape [..., {self.num_outputs}, {self.num_inducing}] (L, M), got {tuple(v.shape)}")
        lead, n = x.shape[:-2], x.shape[-2]
        flat = x.reshape(-1, x.shape[-1])
        a, _ = self.projection(flat)  # [Lb, M, P]: all draws' points as columns
        var = (self.kernel.diag(flat.unsqueeze(-3)) - a.square().sum(-2)).mT.clamp_min(1e-12)  # [P, Lb]
        a = a.expand((self.num_outputs,) + a.shape[-2:]) if a.dim() == 3 else a.expand(
            (self.num_outputs,) + a.shape)
        a = a.reshape(a.shape[:2] + lead + (n,)).movedim(1, -2).movedim(0, -3)  # [..., L, M, N]
        mean = (v.unsqueeze(-2) @ a).squeeze(-2).mT  # [..., N, L]
        var = var.expand(var.shape[0], self.num_outputs).reshape(lead + (n, self.num_outputs))
        if self.mean_function is not None:
            mean = mean + self.mean_function(x)
        return Marginals(mean, var)

    def sample(
        self, x: torch.Tensor, num_samples: int = 1, full_cov: bool = False, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Posterior samples of f(x): [num_samples, ..., N, L]. Marginal (independent per point) unless full_cov."""
        if full_cov:
            mean, cov = self.marginals(x, full_cov=True)
            chol = robust_cholesky(cov)
            shape = (num_samples,) + chol.shape[:-1] + (1,)
            eps = torch.randn(shape, dtype=chol.dtype, device=chol.device, generator=generator)
            draws = (chol @ eps).squeeze(-1)  # [S, ..., L, N]
            return mean + draws.transpose(-1, -2)
        mean, var = self.marginals(x)
        eps = torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        return mean + var.sqrt() * eps
