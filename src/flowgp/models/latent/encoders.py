"""Variational distributions q(z_n) = N(μ_n, diag σ_n²) over the latent inputs of latent-variable deep GPs.

Both expose `forward(x, y, indices) -> (mean [B, Q], std [B, Q])` so the model treats them alike:
- `AmortizedLatentEncoder`: (μ_n, σ_n) = network(x_n, y_n) (DGP-IWVI/DREG supplement E.2): two tanh hidden
  layers of 20 units with skip connections (dense, or residual as in the DREG authors' code), a mean head and a
  std head σ = max(softplus(a - 3), 1e-6), Glorot initialisation, so q(z) starts narrow (σ ≈ softplus(-3) ≈ 0.049).
- `FreeLatent`: one free (μ_n, σ_n) per training point, selected by `indices`.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...numerics.constraints import softplus_positive

__all__ = ["AmortizedLatentEncoder", "FreeLatent", "normal_log_prob", "ENCODER_SKIPS", "STD_BIAS", "STD_FLOOR"]

#: bias added to the std head before the softplus (supplement E.2) so the initial q(z) is narrow
STD_BIAS = -3.0
#: floor of σ (supplement E.2 clips positive parameters at 1e-6)
STD_FLOOR = 1e-6
#: how the encoder's layers skip: "dense" (each layer sees the inputs and every earlier layer) or "residual"
#: (a layer whose input and output widths agree adds its input to its output, as the DREG authors' `Encoder`)
ENCODER_SKIPS = ("dense", "residual")


def _check_dim(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class AmortizedLatentEncoder(nn.Module):
    """q(z_n | x_n, y_n) from a small MLP with skip connections (supplement E.2, which does not say which).

    a = [x, y], then with `skips`:
    - "dense" (default): h₁ = tanh(W₁ a);  h₂ = tanh(W₂ [a, h₁]);  s = [a, h₁, h₂] (everything earlier into each layer);
    - "residual" (the DREG authors' `Encoder`): h₁ = tanh(W₁ a) (+ a if a has the hidden width);
      s = h₂ = tanh(W₂ h₁) + h₁;
    μ = W_μ s,   σ = max(softplus(W_σ s + b_σ - 3), 1e-6).

    Weights are Glorot-uniform U(±√(6 / (fan_in + fan_out))) (Glorot & Bengio 2010) drawn from `generator`
    (torch's global RNG when None), biases zero; parameters in `dtype` (float64; cast afterwards for float32).
    """

    def __init__(self, input_dim: int, output_dim: int = 1, latent_dim: int = 1, hidden: int = 20,
                 generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
                 skips: str = "dense"):
        super().__init__()
        input_dim = _check_dim(input_dim, "input_dim")
        output_dim = _check_dim(output_dim, "output_dim")
        self.latent_dim = _check_dim(latent_dim, "latent_dim")
        hidden = _check_dim(hidden, "hidden")
        if skips not in ENCODER_SKIPS:
            raise ValueError(f"skips must be one of {ENCODER_SKIPS}, got {skips!r}")
        self.skips = skips
        a = input_dim + output_dim
        width2, width_out = (a + hidden, a + 2 * hidden) if skips == "dense" else (hidden, hidden)
        # skip nn.Linear's own (Kaiming) initialisation: it would draw from the global RNG only to be overwritten
        self.layer1 = nn.utils.skip_init(nn.Linear, a, hidden, dtype=dtype)
        self.layer2 = nn.utils.skip_init(nn.Linear, width2, hidden, dtype=dtype)
        self.mean_head = nn.utils.skip_init(nn.Linear, width_out, latent_dim, dtype=dtype)
        self.std_head = nn.utils.skip_init(nn.Linear, width_out, latent_dim, dtype=dtype)
        with torch.no_grad():
            for lin in (self.layer1, self.layer2, self.mean_head, self.std_head):
                nn.init.xavier_uniform_(lin.weight, generator=generator)  # Glorot & Bengio (2010)
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor | None = None):
        """(μ, σ) of q(z_n), each [B, latent_dim]; x [B, D], y [B, L]; `indices` is ignored."""
        a = torch.cat([x, y], dim=-1)
        h1 = torch.tanh(self.layer1(a))
        if self.skips == "dense":
            h2 = torch.tanh(self.layer2(torch.cat([a, h1], dim=-1)))
            s = torch.cat([a, h1, h2], dim=-1)
        else:
            if a.shape[-1] == h1.shape[-1]:
                h1 = h1 + a
            s = torch.tanh(self.layer2(h1)) + h1
        std = softplus_positive(self.std_head(s) + STD_BIAS, floor=STD_FLOOR)
        return self.mean_head(s), std


class FreeLatent(nn.Module):
    """Free per-point q(z_n) = N(μ_n, σ_n²) for n = 0..num_data-1; σ = max(softplus(ρ), 1e-6).

    Initialised at μ = 0 and σ = softplus(-3) like the amortized network's starting point (no draws);
    parameters in `dtype` (float64; cast afterwards for float32).
    """

    def __init__(self, num_data: int, latent_dim: int = 1, dtype: torch.dtype = torch.float64):
        super().__init__()
        num_data = _check_dim(num_data, "num_data")
        self.latent_dim = _check_dim(latent_dim, "latent_dim")
        self.mean = nn.Parameter(torch.zeros(num_data, latent_dim, dtype=dtype))
        self.raw_std = nn.Parameter(torch.full((num_data, latent_dim), STD_BIAS, dtype=dtype))

    @property
    def num_data(self) -> int:
        return self.mean.shape[0]

    def forward(self, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor | None = None):
        """(μ, σ) of the points `indices` (all points when None), each [B, latent_dim]."""
        if indices is None:
            if x.shape[0] != self.num_data:
                raise ValueError(
                    f"free per-point q(z) holds {self.num_data} points but got a batch of {x.shape[0]} "
                    "without `indices`; pass the batch's row indices into the training set"
                )
            return self.mean, softplus_positive(self.raw_std, floor=STD_FLOOR)
        indices = torch.as_tensor(indices, dtype=torch.long, device=self.mean.device)
        if indices.shape != (x.shape[0],):
            raise ValueError(f"indices must have shape [{x.shape[0]}] to match x, got {tuple(indices.shape)}")
        if indices.numel() and (indices.min() < 0 or indices.max() >= self.num_data):
            raise ValueError(f"indices must lie in [0, {self.num_data}), got range "
                             f"[{int(indices.min())}, {int(indices.max())}]")
        return self.mean[indices], softplus_positive(self.raw_std[indices], floor=STD_FLOOR)


def normal_log_prob(z: torch.Tensor, mean: torch.Tensor | None = None, std: torch.Tensor | None = None):
    """Σ_q log N(z_q; μ_q, σ_q²) over the last dimension (standard normal when mean/std are None)."""
    if mean is None:
        return -0.5 * (z.square() + math.log(2 * math.pi)).sum(-1)
    r2 = ((z - mean) / std).square()
    return (-0.5 * (r2 + math.log(2 * math.pi)) - std.log()).sum(-1)
