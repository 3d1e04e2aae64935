"""Convolution-process (CP) multi-output kernel with squared-exponential smoothing kernels (AMO-GP §2, eq. 3).

Output d is a smoothed sum of R independent white-noise latents w_r (unit spectral density):

    f_d(x) = Σ_r ∫ T_{d,r}(x - z) w_r(z) dz,     T_{d,r}(τ) = s_{d,r} exp(-½ Σ_k τ_k² / ℓ_{d,r,k}²).

Derivation of the cross-covariance (per input dimension, the Gaussian product integral)

    ∫ exp(-(x-z)²/(2A)) exp(-(x'-z)²/(2B)) dz = sqrt(2π A B / (A + B)) · exp(-(x-x')² / (2(A + B))),

with A = ℓ_{d,r,k}², B = ℓ_{d',r,k}², so

    cov[f_d(x), f_{d'}(x')] = Σ_r c_{dd'r} exp(-½ Σ_k (x_k - x'_k)² / (ℓ_{d,r,k}² + ℓ_{d',r,k}²)),
    c_{dd'r} = s_{d,r} s_{d',r} Π_k sqrt(2π ℓ_{d,r,k}² ℓ_{d',r,k}² / (ℓ_{d,r,k}² + ℓ_{d',r,k}²)).

The combined squared lengthscale is the *sum* of the two smoothing kernels' squared lengthscales (its
inverse, a precision, is what the supplement's eqs. 24-25 call ℓ̂). We parametrise by the output variances
v_{d,r} = c_{ddr} = s_{d,r}² Π_k sqrt(π) ℓ_{d,r,k}, which gives the scale-free form

    c_{dd'r} = sqrt(v_{d,r} v_{d',r}) Π_k sqrt(2 ℓ_{d,r,k} ℓ_{d',r,k} / (ℓ_{d,r,k}² + ℓ_{d',r,k}²)).

The auto-covariance of one output is an SE kernel with variance Σ_r v_{d,r} and lengthscale sqrt(2)·ℓ, so
with one output and R = 1 the CP kernel is exactly an RBF kernel (used as a plain MO-GP baseline too).

Inducing variables on the latents (variational inducing kernels, Álvarez, Luengo, Titsias & Lawrence 2010).
White noise has no pointwise values, so an inducing variable on latent r is a value of a smoothed copy
u_r(z) = ∫ T_{u,r}(z - s) w_r(s) ds with its own smoothing lengthscale ℓ_{u,r} and unit variance. The same
Gaussian product integral gives

    cov[u_r(z), u_r(z')]   = exp(-½ Σ_k (z_k - z'_k)² / (2 ℓ_{u,r,k}²)),
    cov[f_d(x), u_r(z)]    = sqrt(v_{d,r}) Π_k sqrt(2 ℓ_{d,r,k} ℓ_{u,r,k} / (ℓ_{d,r,k}² + ℓ_{u,r,k}²))
                             · exp(-½ Σ_k (x_k - z_k)² / (ℓ_{d,r,k}² + ℓ_{u,r,k}²)),

and u_r, u_r' are independent for r ≠ r' (`inducing_parameters`, `inducing_covariance`).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...numerics.constraints import Positive

__all__ = ["ConvolutionKernel", "check_output_index"]

_POS = Positive(lower=1e-6)
_VAR = Positive(lower=0.0)


def check_output_index(output, num_points: int, num_outputs: int, name: str = "output") -> torch.Tensor:
    """Validate a vector of output indices (0..num_outputs-1) of length num_points; returns a long tensor."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of output indices, got {type(output).__name__}")
    if output.dim() != 1 or output.shape[0] != num_points:
        raise ValueError(f"{name} must have shape [{num_points}] (one output index per row), got {tuple(output.shape)}")
    if output.dtype.is_floating_point:
        if not torch.all(output == output.round()):
            raise ValueError(f"{name} must hold integer output indices, got non-integer values")
    output = output.long()
    if num_points and (int(output.min()) < 0 or int(output.max()) >= num_outputs):
        raise ValueError(
            f"{name} indices must lie in 0..{num_outputs - 1}, got values in {int(output.min())}..{int(output.max())}"
        )
    return output


class ConvolutionKernel(nn.Module):
    """Joint covariance of D outputs built from R white-noise latents and SE smoothing kernels (module docstring).

    Args:
        num_outputs: D.
        input_dim: dimension of the inputs (ARD smoothing lengthscales per output and latent).
        latent_processes: R >= 1.
        lengthscale: initial *auto-covariance* lengthscale of each output (the smoothing lengthscale is this
            over sqrt(2)); with R > 1 latent r starts at lengthscale·2^-r so the latents are not symmetric.
        variance: initial total variance of each output, split evenly over the latents.
        dtype: dtype of the parameters (float64; cast the module afterwards for float32).
    """

    def __init__(self, num_outputs: int, input_dim: int = 1, latent_processes: int = 1, lengthscale=1.0,
                 variance=1.0, dtype: torch.dtype = torch.float64):
        super().__init__()
        for name, value in (("num_outputs", num_outputs), ("input_dim", input_dim),
                            ("latent_processes", latent_processes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.num_outputs, self.input_dim, self.latent_processes = num_outputs, input_dim, latent_processes
        ls = torch.as_tensor(lengthscale, dtype=dtype) / math.sqrt(2.0)
        var = torch.as_tensor(variance, dtype=dtype) / latent_processes
        if torch.any(ls <= 0) or torch.any(var <= 0):
            raise ValueError("lengthscale and variance must be positive")
        scale = 2.0 ** -torch.arange(latent_processes, dtype=dtype)  # [R]
        smoothing = (ls * torch.ones(num_outputs, 1, input_dim, dtype=dtype)) * scale[None, :, None]
        self.raw_lengthscale = nn.Parameter(_POS.inverse(smoothing))  # [D, R, Dx]
        self.raw_variance = nn.Parameter(_VAR.inverse(var * torch.ones(num_outputs, latent_processes, dtype=dtype)))

    # ----- parameters ----------------------------------------------------------------------------------
    @property
    def lengthscale(self) -> torch.Tensor:
        """Smoothing lengthscales ℓ_{d,r,k}, [D, R, Dx]."""
        return _POS(self.raw_lengthscale)

    @property
    def variance(self) -> torch.Tensor:
        """Per-output, per-latent variances v_{d,r} = c_{ddr}, [D, R]."""
        return _VAR(self.raw_variance)

    def smoothing_amplitude(self) -> torch.Tensor:
        """s_{d,r} of T_{d,r}, from v = s² Π_k sqrt(π) ℓ_k, [D, R]."""
        ls = self.lengthscale
        return torch.sqrt(self.variance / torch.prod(math.sqrt(math.pi) * ls, -1))

    def smoothing_kernel(self, tau: torch.Tensor, d: int, r: int = 0) -> torch.Tensor:
        """T_{d,r}(τ) for τ of shape [..., Dx] (used to check the closed form against the integral)."""
        ls = self.lengthscale[d, r]
        return self.smoothing_amplitude()[d, r] * torch.exp(-0.5 * (tau / ls).square().sum(-1))

    # ----- pairwise quantities -------------------------------------------------------------------------
    def pair_parameters(self, out1: torch.Tensor, out2: torch.Tensor):
        """Prefactors c [R, N1, N2] and combined squared lengthscales ℓ_d² + ℓ_d'² [R, N1, N2, Dx]."""
        ls = self.lengthscale.transpose(0, 1)  # [R, D, Dx]
        var = self.variance.transpose(0, 1)  # [R, D]
        l1, l2 = ls[:, out1, None, :], ls[:, None, out2, :]  # [R, N1, 1, Dx], [R, 1, N2, Dx]
        lsq = l1.square() + l2.square()
        shape = torch.prod(torch.sqrt(2.0 * l1 * l2 / lsq), -1)
        amp = torch.sqrt(var[:, out1, None] * var[:, None, out2]) * shape
        return amp, lsq

    def inducing_parameters(self, out: torch.Tensor, inducing_lengthscale: torch.Tensor):
        """Prefactors [R, N] and combined squared lengthscales [R, N, Dx] of cov[f_{out[n]}(x), u_r(z)] for the
        smoothed latents u_r with smoothing lengthscales `inducing_lengthscale` [R, Dx] (module docstring)."""
        ls = self.lengthscale[out].transpose(0, 1)  # [R, N, Dx]
        lu = inducing_lengthscale.unsqueeze(1)  # [R, 1, Dx]
        lsq = ls.square() + lu.square()
        shape = torch.prod(torch.sqrt(2.0 * ls * lu / lsq), -1)  # [R, N]
        return torch.sqrt(self.variance[out].transpose(0, 1)) * shape, lsq

    @staticmethod
    def inducing_covariance(z: torch.Tensor, inducing_lengthscale: torch.Tensor) -> torch.Tensor:
        """cov[u_r(z_i), u_r(z_j)] for z [R, M, Dx] and smoothing lengthscales [R, Dx]: [R, M, M]."""
        diff2 = (z.unsqueeze(-2) - z.unsqueeze(-3)).square()  # [R, M, M, Dx]
        return torch.exp(-0.25 * (diff2 / inducing_lengthscale[:, None, None, :].square()).sum(-1))

    def output_covariance(self) -> torch.Tensor:
        """Covariance between outputs at zero lag, Σ_r c_{dd'r}, [D, D]."""
        idx = torch.arange(self.num_outputs, device=self.raw_variance.device)
        return self.pair_parameters(idx, idx)[0].sum(0)

    def _check(self, x, out, name):
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"{name} must be a tensor of shape [..., N, {self.input_dim}]")
        return check_output_index(out, x.shape[-2], self.num_outputs, name=f"{name}'s output index")

    def forward(self, x1: torch.Tensor, out1: torch.Tensor, x2: torch.Tensor | None = None,
                out2: torch.Tensor | None = None) -> torch.Tensor:
        """K[n, m] = cov[f_{out1[n]}(x1[n]), f_{out2[m]}(x2[m])], shape [..., N1, N2] (x1 may carry leading dims)."""
        out1 = self._check(x1, out1, "x1")
        if x2 is None:
            x2, out2 = x1, out1
        else:
            if out2 is None:
                raise ValueError("out2 is required when x2 is given")
            out2 = self._check(x2, out2, "x2")
        amp, lsq = self.pair_parameters(out1, out2)  # [R, N1, N2], [R, N1, N2, Dx]
        diff2 = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).square().unsqueeze(-4)  # [..., 1, N1, N2, Dx]
        return (amp * torch.exp(-0.5 * (diff2 / lsq).sum(-1))).sum(-3)

    def diag(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """k(x_n, x_n) = Σ_r v_{out[n], r}, shape [..., N]."""
        out = self._check(x, out, "x")
        return self.variance.sum(-1)[out].expand(x.shape[:-1])
