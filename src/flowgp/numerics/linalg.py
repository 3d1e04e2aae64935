"""Linear-algebra helpers for GP numerics: a Cholesky that retries with growing jitter and says so."""
from __future__ import annotations

import functools
import warnings

import torch

from .needed_gradients import needed_inputs, record_inputs

__all__ = ["CholeskyJitterWarning", "CholeskyError", "JitterMemory", "robust_cholesky", "lower_inverse", "identity",
           "gram",
           "shared_left_products", "cholesky_gradient_to_matrix",
           "DEFAULT_JITTER"]

#: jitter added to the diagonal of every kernel matrix before factorising (relative to dtype below)
DEFAULT_JITTER = {torch.float64: 1e-8, torch.float32: 1e-6}


class CholeskyJitterWarning(RuntimeWarning):
    """Emitted when a Cholesky factorisation only succeeded after adding extra jitter."""


class CholeskyError(torch.linalg.LinAlgError):
    """A Cholesky factorisation failed even with the largest jitter tried (a RuntimeError, as torch's own
    linear-algebra errors are): the matrix is not positive definite."""


class JitterMemory:
    """The last jitter level at which a recurring factorisation (one model's K_ZZ) succeeded.

    Passed to `robust_cholesky` as `memory`: each call starts from max(jitter, level) instead of the default,
    so that a kernel matrix that needed more jitter once does not fail and retry at every optimisation step
    (and the loss does not jump between jitter levels from one step to the next). The level only grows.
    It warns at most once between calls of `start_fit()` (the training loop calls it at the start of a fit).
    """

    def __init__(self):
        self.level: float | None = None
        self.warned = False

    def start_fit(self) -> None:
        """Allow one CholeskyJitterWarning in the fit that starts now."""
        self.warned = False

    def __repr__(self) -> str:
        return f"JitterMemory(level={self.level!r})"


def robust_cholesky(
    matrix: torch.Tensor,
    jitter: float | None = None,
    max_tries: int = 6,
    growth: float = 10.0,
    memory: JitterMemory | None = None,
) -> torch.Tensor:
    """Lower Cholesky factor of a (batched) symmetric PSD matrix, retrying with growing diagonal jitter.

    The first attempt adds `jitter` (default: 1e-8 in float64, 1e-6 in float32), or the level remembered in
    `memory` if larger; each failure multiplies it by `growth` (a zero jitter first becomes the dtype default),
    up to `max_tries` attempts. A success after a retry raises a CholeskyJitterWarning naming the jitter used
    (with `memory`: once per fit, and the level is remembered); exhausting the tries raises a CholeskyError (a
    RuntimeError) rather than returning garbage.
    """
    default = DEFAULT_JITTER.get(matrix.dtype, 1e-6)
    if jitter is None:
        jitter = default
    if not jitter >= 0:
        raise ValueError(f"jitter must be >= 0 (or None for the dtype default), got {jitter}")
    n = matrix.shape[-1]
    current = jitter if memory is None or memory.level is None else max(jitter, memory.level)
    if torch.compiler.is_compiling():
        # inside a compiled graph (flowgp.training.compiled): the first attempt only, without branching on the data;
        # a failure poisons the factor with NaN, and the caller re-runs the step eagerly, which retries here
        chol, info = torch.linalg.cholesky_ex(_add_jitter(matrix, current))
        return torch.where((info == 0)[..., None, None], chol, torch.nan)
    for attempt in range(max_tries):
        chol, info = torch.linalg.cholesky_ex(_add_jitter(matrix, current))
        if not torch.any(info):
            if attempt > 0:
                if memory is not None:
                    memory.level = current
                if memory is None or not memory.warned:
                    note = "" if memory is None else " (remembered for later factorisations; warned once per fit)"
                    warnings.warn(
                        f"Cholesky of a {n}x{n} matrix needed jitter {current:.1e} "
                        f"(asked {jitter:.1e}){note}; consider fewer/more spread inducing points or float64",
                        CholeskyJitterWarning,
                        stacklevel=2,
                    )
                    if memory is not None:
                        memory.warned = True
            return chol
        # a zero jitter cannot grow by multiplication: the first retry uses the dtype default
        current = current * growth if current > 0 else default
    raise CholeskyError(
        f"Cholesky failed for a {n}x{n} matrix even with jitter {current / growth:.1e} after {max_tries} "
        "tries; the kernel matrix is not positive definite (NaN parameters, duplicated inducing points "
        "or a float32 overflow are the usual causes)"
    )


@functools.lru_cache(maxsize=64)
def _identity(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # cached per (n, dtype, device): building it every step is per-step allocation and dispatch on the hot
    # path; nobody writes into it (it only enters out-of-place sums and solves)
    with torch.inference_mode(False):
        return torch.eye(n, dtype=dtype, device=device)


def identity(n: int, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """The n x n identity, cached and shared: treat it as read-only."""
    if torch.compiler.is_compiling():  # a graph constant there; the cache is for eager steps
        return torch.eye(n, dtype=dtype, device=device)
    return _identity(int(n), dtype, torch.device("cpu") if device is None else torch.device(device))


@functools.lru_cache(maxsize=64)
def _half_diagonal_tril(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.ones(n, n, dtype=dtype, device=device).tril() - 0.5 * torch.eye(n, dtype=dtype, device=device)


def cholesky_gradient_to_matrix(chol_inv: torch.Tensor, h: torch.Tensor, chol: torch.Tensor | None = None
                                ) -> torch.Tensor:
    """∂F/∂K for L = chol(K), given X = L⁻¹ and H = Lᵀ ∂F/∂L (∂F/∂L as a full matrix, before the lower
    triangle is taken): ∂F/∂K = Xᵀ Ψ(H) X with Ψ(H) = ½(P + Pᵀ), P = H ⊙ (lower triangle, diagonal ½).

    From dL = L Φ(X dK Xᵀ), Φ = lower triangle with the diagonal halved (Murray 2016, "Differentiation of the
    Cholesky decomposition"): dF = <H, Φ(X dK Xᵀ)> = <Xᵀ Ψ(H) X, dK> for symmetric dK. With X at
    hand this is two GEMMs, where the factor's own backward costs a GEMM and two triangular solves (which run
    several times slower than a GEMM on CPU). With `chol` (L) given it is two triangular solves from the right
    instead, Y L = Ψ and then (Yᵀ L⁻¹)ᵀ: half the FLOPs, and the right solve is the layout LAPACK runs at GEMM
    speed. Returns a symmetric matrix of h's shape.
    """
    n = h.shape[-1]
    if torch.compiler.is_compiling():
        mask = torch.ones(n, n, dtype=h.dtype, device=h.device).tril() - 0.5 * torch.eye(n, dtype=h.dtype,
                                                                                      device=h.device)
    else:
        mask = _half_diagonal_tril(n, h.dtype, h.device)
    p = h * mask
    psi = 0.5 * (p + p.mT)
    if chol is not None:
        y = torch.linalg.solve_triangular(chol, psi, upper=False, left=False)  # Ψ L⁻¹
        return torch.linalg.solve_triangular(chol, y.mT, upper=False, left=False).mT  # L⁻ᵀ Ψ L⁻¹
    return chol_inv.mT @ psi @ chol_inv


def _add_jitter(matrix: torch.Tensor, jitter: float) -> torch.Tensor:
    """matrix + jitter·I (the matrix itself for zero jitter)."""
    if jitter == 0:
        return matrix
    return matrix + jitter * identity(matrix.shape[-1], matrix.dtype, matrix.device)


def lower_inverse(chol: torch.Tensor) -> torch.Tensor:
    """L⁻¹ of a (batched) lower-triangular factor, formed explicitly (M³/3).

    Worth it wherever L⁻¹ then multiplies [M, N] blocks: on CPU a GEMM runs about twice as fast as the triangular
    solve (and its backward) and returns a row-major result, which the solve does not.
    """
    eye = identity(chol.shape[-1], chol.dtype, chol.device).expand_as(chol)
    # L X = I (left) or X L = I (right) give the same X, in the same layout, at different speeds (MKL, 2 threads,
    # torch 2.13; `benchmarks/perf/lower_inverse_time.py`, docs/results/perf/step-time/lower_inverse_2026-11-29.json): the left
    # solve is 1.04-1.95x faster in float64 at every M from 20 to 500 (M = 100, 8 factors: 246 against 349 µs)
    # and 1.15-2.2x in float32 up to M = 100; the right one is 3-14 % faster in float32 from M = 128
    left = chol.dtype == torch.float64 or chol.shape[-1] <= LEFT_INVERSE_MAX_FLOAT32_SIZE
    return torch.linalg.solve_triangular(chol, eye, upper=False, left=left)


#: `lower_inverse` solves from the left in float32 up to this M (from the right above it)
LEFT_INVERSE_MAX_FLOAT32_SIZE = 100


class _Gram(torch.autograd.Function):
    """X Xᵀ with the backward (Ḡ + Ḡᵀ) X: one product, where autograd of x @ x.mT takes one per operand and adds
    the two [..., K, M] gradients."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x @ x.mT

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad + grad.mT) @ x


def gram(x: torch.Tensor) -> torch.Tensor:
    """X Xᵀ [..., K, K] of x [..., K, M] (differentiable, also twice: the backward is made of torch operations)."""
    return _Gram.apply(x)


class _SharedLeftProducts(torch.autograd.Function):
    """[x @ mats[l] for l] as [L, N, P], one GEMM per l in both passes: broadcasting x over a batch instead
    makes `matmul` transpose-copy the result, and the backward of an expanded x copies it per batch entry and
    sums an [L, N, M] gradient, each costing as much as the products at N = 2 560, M = 128, L = 5."""

    @staticmethod
    def forward(ctx, x, mats):
        record_inputs(ctx, x, mats)
        ctx.save_for_backward(x, mats)
        return torch.bmm(x.expand(mats.shape[0], -1, -1), mats)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, mats = ctx.saved_tensors
        need_x, need_mats = needed_inputs(ctx)  # DREG's products w.r.t. z alone need no gradient of mats
        g_x = g_mats = None
        if need_x:
            g_x = grad[0] @ mats[0].mT
            for i in range(1, mats.shape[0]):
                g_x.addmm_(grad[i], mats[i].mT)
        if need_mats:
            g_mats = torch.empty_like(mats)
            for i in range(mats.shape[0]):
                torch.mm(x.mT, grad[i], out=g_mats[i])
        return g_x, g_mats


def shared_left_products(x: torch.Tensor, mats: torch.Tensor) -> torch.Tensor:
    """x [N, M] times each of mats [L, M, P]: [L, N, P] (= x @ mats, differentiable once)."""
    if x.dim() != 2 or mats.dim() != 3 or x.shape[-1] != mats.shape[-2]:
        raise ValueError(f"x must be [N, M] and mats [L, M, P], got {tuple(x.shape)} and {tuple(mats.shape)}")
    return _SharedLeftProducts.apply(x, mats)
