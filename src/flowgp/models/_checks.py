"""Input checks shared by the models: clear errors naming the argument and the fix."""
from __future__ import annotations

import torch

__all__ = ["as_inputs", "as_targets"]


def as_inputs(x, input_dim: int | None = None, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [N, D], got {tuple(x.shape)}")
    if input_dim is not None and x.shape[-1] != input_dim:
        raise ValueError(f"{name} has {x.shape[-1]} features but the model was built for {input_dim}")
    # (skipped inside a compiled step: a NaN there makes the loss NaN and flowgp.training.compiled re-runs it eagerly)
    if not torch.compiler.is_compiling() and not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return x


def as_targets(y, num_points: int, num_outputs: int, name: str = "y") -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    if y.dim() != 2 or y.shape[0] != num_points or y.shape[1] != num_outputs:
        raise ValueError(
            f"{name} must have shape [{num_points}] or [{num_points}, {num_outputs}] to match x, got {tuple(y.shape)}"
        )
    if not torch.compiler.is_compiling() and not torch.isfinite(y).all():
        raise ValueError(f"{name} contains NaN or inf; drop or impute those rows first")
    return y
