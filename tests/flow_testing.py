"""Helpers shared by the flow tests."""
import torch


def perturb(flow, seed=0, std=0.3):
    """Random parameters in place (the contracts must hold away from the defaults); returns the flow."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return flow
