"""Gauss-Hermite quadrature for expectations under (batched) univariate Gaussians.

E_{N(f; mu, var)}[h(f)] ~= sum_q w_q/sqrt(pi) h(mu + sqrt(2 var) x_q) (Hensman et al. 2015; TGP appendix
A.2.5 eq. 14 and A.4 eq. 19). Nodes are placed on a new leading dimension so that any batch shape
(MC samples x data x outputs) broadcasts through h.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch

__all__ = ["gauss_hermite", "gh_points", "expectation", "log_expectation_exp"]


@functools.lru_cache(maxsize=64)
def _gh_numpy(num_points: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite.hermgauss(num_points)
    return x, w / math.sqrt(math.pi)


@functools.lru_cache(maxsize=256)
def _gh_torch(num_points: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # cached per (Q, dtype, device): building the tensors from NumPy every ELBO evaluation is per-step
    # Python and copy overhead on the training hot path; callers never modify them in place
    x, w = _gh_numpy(num_points)
    with torch.inference_mode(False):  # a cached inference tensor could not be saved for backward later
        nodes = torch.as_tensor(x * math.sqrt(2.0), dtype=dtype, device=device)
        weights = torch.as_tensor(w, dtype=dtype, device=device)
    return nodes, weights


@torch.compiler.assume_constant_result
def _gh_floats(num_points: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    # the nodes as Python floats, which a compiled graph takes as constants (it cannot trace NumPy's hermgauss)
    x, w = _gh_numpy(num_points)
    return tuple(float(v) * math.sqrt(2.0) for v in x), tuple(float(v) for v in w)


def gauss_hermite(num_points: int, dtype=torch.float64, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes z_q and normalised weights w_q with sum_q w_q h(z_q sqrt2) ~= E_{N(0,1)}[h]; returns (sqrt2*x, w).

    The returned tensors are cached and shared: treat them as read-only.
    """
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1:
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}")
    if torch.compiler.is_compiling():  # constants of the compiled graph (flowgp.training.compiled)
        nodes, weights = _gh_floats(num_points)
        return (torch.tensor(nodes, dtype=dtype, device=device), torch.tensor(weights, dtype=dtype, device=device))
    return _gh_torch(num_points, dtype, torch.device("cpu") if device is None else torch.device(device))


def gh_points(mean: torch.Tensor, var: torch.Tensor, num_points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadrature locations f_q = mean + sqrt(var) z_q of shape [Q, *mean.shape] and weights of shape [Q, 1, ..]."""
    nodes, weights = gauss_hermite(num_points, mean.dtype, mean.device)
    shape = (num_points,) + (1,) * mean.dim()
    f = mean.unsqueeze(0) + var.clamp_min(0).sqrt().unsqueeze(0) * nodes.view(shape)
    return f, weights.view(shape)


def expectation(
    fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, var: torch.Tensor, num_points: int = 20
) -> torch.Tensor:
    """E_{N(f; mean, var)}[fn(f)] element-wise; fn receives f of shape [Q, *mean.shape]."""
    f, w = gh_points(mean, var, num_points)
    return (w * fn(f)).sum(0)


def log_expectation_exp(
    log_fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, var: torch.Tensor, num_points: int = 100
) -> torch.Tensor:
    """log E_{N(f; mean, var)}[exp(log_fn(f))] with log-sum-exp, for predictive log densities (appendix A.4)."""
    f, w = gh_points(mean, var, num_points)
    return torch.logsumexp(w.log() + log_fn(f), dim=0)
