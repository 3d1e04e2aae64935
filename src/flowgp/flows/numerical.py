"""Guarded numerical inverse of a strictly increasing element-wise map.

Root finding runs without autograd (bracket expansion, then Newton safeguarded by bisection, all
vectorised over elements); one final differentiable Newton step x = x* - (G(x*) - y)/G'(x*) then
gives, by the implicit function theorem, dx/dθ = -(∂G/∂θ)/G' and dx/dy = 1/G' at the root.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = ["monotone_inverse"]


def _converged(g, y, x, deriv, low, high, eps, floor):
    """Residual at the rounding level of evaluating G near x, or x pinned down to a few ulps.

    `floor` is the smallest |x| scale used for the ulp tests: 1 on the real line (so roots near 0
    are located to ~eps absolutely, where rounding in G itself limits accuracy), the smallest
    normal number on the positive half-line (where relative accuracy matters).
    """
    scale = torch.clamp(x.abs(), min=floor)
    small_residual = g.abs() <= 64 * eps * (y.abs() + x.abs() * deriv)
    small_step = g.abs() <= 16 * eps * scale * deriv
    narrow = (high - low) <= 16 * eps * torch.clamp(torch.maximum(low.abs(), high.abs()), min=floor)
    return small_residual | small_step | narrow | (g == 0)


def _bracket(forward, target, domain: str, finfo):
    """(low, high, bracketed): a bracket [low, high] of each root of G(x) = target, grown by doubling from [-1, 1]
    (or [1/2, 2] on the positive half-line); `bracketed` is False where no finite bracket exists."""
    ones = torch.ones(target.shape, dtype=target.dtype, device=target.device)
    if domain == "positive":
        low, high = 0.5 * ones, 2.0 * ones
    else:
        low, high = -ones, ones.clone()
    # Doubling reaches any representable magnitude within the exponent range.
    max_expand = int(math.log2(finfo.max)) + 2 * finfo.bits
    for _ in range(max_expand):
        # Ends that reached inf (or 0 on the half-line) cannot move further: the target is out of reach.
        move_low = (forward(low) > target) & torch.isfinite(low) & (low != 0)
        move_high = (forward(high) < target) & torch.isfinite(high)
        if not bool(torch.any(move_low | move_high)):
            break
        # The old end that overshot becomes the opposite end of the bracket.
        high = torch.where(move_low, low, high)
        low = torch.where(move_low, low * 0.5 if domain == "positive" else low * 2.0, low)
        low = torch.where(move_high, high, low)
        high = torch.where(move_high, high * 2.0, high)
    # An infinite end means the root lies beyond the floating-point range (e.g. logarithmic tails).
    bracketed = (forward(low) <= target) & (forward(high) >= target) & torch.isfinite(low) & torch.isfinite(high)
    return low, high, bracketed


def _newton_bisection(forward, log_derivative, target, low, high, bracketed, domain, eps, floor, max_iter,
                      polish_steps):
    """(x, converged, low, high): Newton steps safeguarded by bisection inside the bracket, then `polish_steps`
    Newton steps once every bracketed element has converged."""
    # Near-identity flows are common, so start at y itself when it lies in the bracket.
    mid = 0.5 * (low + high)
    x = torch.where((target > low) & (target < high), target, mid)
    inf = torch.full_like(x, math.inf)
    width_1, width_2, res_1, res_2 = inf, inf, inf, inf
    polishing = -1
    conv = torch.zeros(target.shape, dtype=torch.bool, device=target.device)
    for _ in range(max_iter):
        g = forward(x) - target
        deriv = torch.exp(log_derivative(x))
        low = torch.where(g < 0, x, low)
        high = torch.where(g > 0, x, high)
        conv = _converged(g, target, x, deriv, low, high, eps, floor)
        if polishing < 0 and bool(torch.all(conv | ~bracketed)):
            polishing = polish_steps
        if polishing == 0:
            break
        newton = x - g / deriv
        inside = torch.isfinite(newton) & (newton > low) & (newton < high)
        if polishing > 0:
            polishing -= 1
            x = torch.where(inside, newton, x)
            continue
        if domain == "positive":
            # Geometric bisection on wide positive brackets: the root may be many decades away.
            mid = torch.where(high > 4.0 * low, torch.sqrt(low * high), 0.5 * (low + high))
        else:
            mid = 0.5 * (low + high)
        # Bisect when Newton leaves the bracket or stalls: neither the bracket nor the residual
        # halved within two iterations. This bounds the work like pure bisection while keeping
        # Newton's quadratic convergence (which may approach the root from one side only).
        width, res = high - low, g.abs()
        stalled = (width > 0.5 * width_2) & (res > 0.5 * res_2)
        width_2, width_1, res_2, res_1 = width_1, width, res_1, res
        x = torch.where(conv, x, torch.where(inside & ~stalled, newton, mid))
    return x, conv, low, high


def monotone_inverse(
    forward: Callable[[Tensor], Tensor],
    log_derivative: Callable[[Tensor], Tensor],
    y: Tensor,
    *,
    domain: str = "real",
    name: str = "flow",
    max_iter: int = 200,
    polish_steps: int = 2,
) -> Tensor:
    """Solve G(x) = y element-wise for a strictly increasing G.

    Args:
        forward: x -> G(x) (element-wise, may broadcast x against its parameters).
        log_derivative: x -> log G'(x).
        y: targets; the result has the broadcast shape of y and G's parameters. Non-finite
            targets give NaN.
        domain: "real" (bracket in R) or "positive" (bracket in (0, inf)).
        name: the flow's name, used in error messages.
    Raises:
        RuntimeError: when some finite target cannot be bracketed or the iteration does not
            converge (e.g. y outside G's range), instead of returning garbage.

    Other Parameters:
        max_iter: the most Newton-bisection iterations.
        polish_steps: Newton steps from the converged point that bring it to full precision.

    Examples:
        >>> import torch
        >>> from flowgp.flows import monotone_inverse
        >>> y = torch.tensor([1.0, 8.0], dtype=torch.float64)
        >>> monotone_inverse(lambda x: x ** 3 + x, lambda x: torch.log(3 * x ** 2 + 1), y)
        tensor([0.6823, 1.8338], dtype=torch.float64)
    """
    if domain not in ("real", "positive"):
        raise ValueError(f"domain must be 'real' or 'positive', got {domain!r}")
    with torch.no_grad():
        y0 = y.detach()
        start = torch.ones_like(y0) if domain == "positive" else torch.zeros_like(y0)
        g_start = forward(start)
        dtype = g_start.dtype
        finfo = torch.finfo(dtype)
        eps = finfo.eps
        floor = finfo.tiny if domain == "positive" else 1.0
        shape = g_start.shape
        y_full = y0.to(dtype).expand(shape)
        finite = torch.isfinite(y_full)
        # A non-finite target is solved as G(x) = G(start) (root = start) and set to NaN at the end.
        target = torch.where(finite, y_full, g_start)

        low, high, bracketed = _bracket(forward, target, domain, finfo)
        x, conv, low, high = _newton_bisection(forward, log_derivative, target, low, high, bracketed, domain, eps,
                                               floor, max_iter, polish_steps)
        g = forward(x) - target
        deriv = torch.exp(log_derivative(x))
        # Polishing can stop a few ulps off where rounding in G dominates; accept any root whose
        # remaining Newton correction is below sqrt(eps) relative, since the differentiable step
        # below removes it to second order. Anything worse is a genuine failure.
        close = g.abs() <= math.sqrt(eps) * torch.clamp(x.abs(), min=floor) * deriv
        conv = conv | close | _converged(g, target, x, deriv, low, high, eps, floor)
        failed = finite & ~(bracketed & conv & torch.isfinite(x) & torch.isfinite(g))
        if bool(torch.any(failed)):
            bad = y_full[failed]
            raise RuntimeError(
                f"numerical inverse of the {name} flow failed for {int(failed.sum())} of {failed.numel()} "
                f"values (e.g. y = {bad.reshape(-1)[0].item():.6g}); y may lie outside the flow's range, its "
                f"preimage beyond the {dtype} range, or the parameters may be degenerate"
            )
        x_star = x

    # Differentiable Newton step: exact value (residual ~ 0) and first-order exact gradients.
    y_b = y.to(dtype).expand(shape)
    y_b = torch.where(finite, y_b, g_start)
    residual = forward(x_star) - y_b
    x = x_star - residual * torch.exp(-log_derivative(x_star))
    return torch.where(finite, x, torch.full_like(x, math.nan))
