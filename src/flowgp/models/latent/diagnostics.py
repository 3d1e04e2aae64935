"""Gradient diagnostics for latent-variable deep GPs: samples of the q(z) gradient estimators and their SNR.

`gradient_snr` follows the Figure 1/3 procedure of the DGP-IWVI/DREG supplement (E.3): for `points` random
training points, draw Q = `repeats` independent gradient estimates of the importance-weighted bound L_K
(eq. A.9) with respect to every parameter of q(z) (estimator "reg", eq. C.17, or "dreg", eq. D.23), take
SNR = |mean| / std over the Q draws per parameter, average over parameters, then over points.

All Q draws for all chosen points are evaluated in one batched pass per chunk: the repeats are the model's
outer sample dimension and each (repeat, point) slot gets its own copy of q(z)'s (μ, σ), so one backward
pass yields every per-draw gradient with respect to (μ, σ). The chain rule to the parameters φ is exact
and cheap because (μ_n, σ_n) are deterministic functions of φ: ∇_φ = [∂(μ_n, σ_n)/∂φ]ᵀ ∇_(μ_n, σ_n), with
the Jacobian computed once per point (encoder weights) or in closed form (free per-point μ_n and ρ_n with
σ_n = softplus(ρ_n)).
"""
from __future__ import annotations

import torch

from .encoders import FreeLatent
from .model import LatentDeepGP, check_gradient, check_num_importance

__all__ = ["latent_gradient_samples", "gradient_snr"]

_CHUNK_ELEMENTS = 4_000_000


def _check_model(model):
    if not isinstance(model, LatentDeepGP):
        raise TypeError(f"model must be a flowgp LatentDeepGP (e.g. an estimator's .model_), got {type(model).__name__}")


def _jacobian(model: LatentDeepGP, x, y, indices, mean, std):
    """∂(μ_n, σ_n)/∂φ for each point: [B, 2Q, P] (φ = q(z)'s trainable parameters, flattened)."""
    if isinstance(model.qz, FreeLatent):
        # φ_n = (μ_n, ρ_n): the Jacobian is diag(1, softplus'(ρ_n)) = diag(1, sigmoid(ρ_n)) per point
        b, q = mean.shape
        slope = torch.sigmoid(model.qz.raw_std[indices]).detach()
        slope = torch.where(std.detach() > model.qz.raw_std.new_tensor(1e-6), slope, torch.zeros_like(slope))
        diag = torch.cat([torch.ones_like(slope), slope], dim=-1)  # [B, 2Q]
        return torch.diag_embed(diag)  # per-point parameters only: P = 2Q
    params = [p for p in model.qz.parameters() if p.requires_grad]
    outputs = torch.cat([mean, std], dim=-1)  # [B, 2Q]
    rows = []
    for i in range(outputs.shape[0]):
        per_point = []
        for j in range(outputs.shape[1]):
            grads = torch.autograd.grad(outputs[i, j], params, retain_graph=True, allow_unused=True)
            per_point.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                                        for g, p in zip(grads, params)]))
        rows.append(torch.stack(per_point))
    return torch.stack(rows)


def latent_gradient_samples(model: LatentDeepGP, x: torch.Tensor, y: torch.Tensor, indices, num_importance: int,
                            gradient: str, repeats: int = 1000, seed: int = 0,
                            wrt: str = "parameters") -> torch.Tensor:
    """Q independent estimates of ∇_φ of each point's term of L_K: [repeats, B, P].

    `indices` are rows of (x, y) (the training set). wrt="parameters" gives gradients w.r.t. q(z)'s
    parameters (P = all encoder weights, or the point's own (μ_n, ρ_n) for free q(z)); wrt="moments" gives
    them w.r.t. (μ_n, σ_n) directly (P = 2Q).

    Args:
        model: a LatentDeepGP.
        x, y: the training inputs and targets (tensors in the model's units).
        indices: the rows B of (x, y) whose terms are differentiated.
        num_importance: K of the bound.
        gradient: the estimator, "reg" or "dreg" (or an ablation, `LatentDeepGP`).
        repeats: Q, the independent estimates.
        seed: seeds the draws.
        wrt: "parameters" or "moments", as above.

    See Also:
        :func:`flowgp.models.latent.diagnostics.gradient_snr` (its summary).
    """
    _check_model(model)
    k = check_num_importance(num_importance)
    gradient = check_gradient(gradient)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats must be an integer >= 2 (the SNR needs a standard deviation), got {repeats!r}")
    if wrt not in ("parameters", "moments"):
        raise ValueError(f"wrt must be 'parameters' or 'moments', got {wrt!r}")
    x, y = model.validate(x, y)
    idx = torch.as_tensor(indices, dtype=torch.long, device=x.device).reshape(-1)
    xb, yb = x[idx], y[idx]
    q_idx = idx if isinstance(model.qz, FreeLatent) else None
    generator = torch.Generator(device=x.device).manual_seed(int(seed))
    mean, std = model.q_params(xb, yb, q_idx)
    b = xb.shape[0]
    width = max(getattr(layer, "num_inducing", 128) * getattr(layer, "output_dim", 1) for layer in model.layers)
    chunk = max(1, _CHUNK_ELEMENTS // (k * b * width))
    draws = []
    done = 0
    while done < repeats:
        r = min(chunk, repeats - done)
        mu_rep = mean.detach().expand(r, *mean.shape).clone().requires_grad_(True)
        std_rep = std.detach().expand(r, *std.shape).clone().requires_grad_(True)
        terms = model.iw_terms(xb, yb, k, gradient, num_samples=r, indices=q_idx, q_params=(mu_rep, std_rep),
                               generator=generator)  # [r, B]
        g_mu, g_std = torch.autograd.grad(terms.sum(), [mu_rep, std_rep])
        draws.append(torch.cat([g_mu, g_std], dim=-1))  # [r, B, 2Q]
        done += r
    moments = torch.cat(draws, 0)
    if wrt == "moments":
        return moments
    jac = _jacobian(model, xb, yb, q_idx, mean, std)  # [B, 2Q, P]
    return torch.einsum("rbj,bjp->rbp", moments, jac)


def gradient_snr(model: LatentDeepGP, X, y, num_importance: int, gradient: str, repeats: int = 1000,
                 points: int = 10, seed: int = 0, return_details: bool = False):
    """SNR of the q(z) gradient estimator (supplement E.3, Figs. 1 and 3): mean over `points` random training
    points of the mean over q(z)'s parameters of |mean| / std over `repeats` gradient draws.

    `model` is a LatentDeepGP with X [N, D], y [N] or [N, L] tensors in its (standardised) units (a fitted
    `LatentDeepGPRegressor` offers the same measurement in the data's units as its `gradient_snr` method). Parameters whose draws
    are all identical (std 0, e.g. weights fed by a constant input) are left out of the mean. Returns a float,
    or (float, dict with per-point SNRs and the chosen indices) with return_details.

    Args:
        model: a LatentDeepGP.
        X, y: the training inputs and targets, as above.
        num_importance: K of the bound.
        gradient: the estimator, "reg" or "dreg" (or an ablation).
        repeats: gradient draws per point.
        points: the random training points averaged over.
        seed: seeds the choice of points and the draws.
        return_details: also return the per-point values.

    See Also:
        :class:`flowgp.LatentDeepGPRegressor` (its ``gradient_snr`` method, in the data's units).
    """
    _check_model(model)
    X = torch.as_tensor(X)
    y = torch.as_tensor(y, dtype=X.dtype)
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"points must be a positive integer, got {points!r}")
    n = X.shape[0]
    gen = torch.Generator().manual_seed(int(seed))
    idx = torch.randperm(n, generator=gen)[: min(points, n)]
    grads = latent_gradient_samples(model, X, y, idx, num_importance, gradient, repeats, seed=seed)  # [R, B, P]
    mean = grads.mean(0)
    sd = grads.std(0)
    keep = sd > 0
    snr = torch.where(keep, mean.abs() / torch.where(keep, sd, torch.ones_like(sd)), torch.zeros_like(sd))
    per_point = snr.sum(-1) / keep.sum(-1).clamp_min(1)
    value = float(per_point.mean())
    if return_details:
        return value, {"per_point": per_point.tolist(), "indices": idx.tolist(), "num_parameters": grads.shape[-1]}
    return value
