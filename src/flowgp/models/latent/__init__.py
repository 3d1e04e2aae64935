"""Latent-variable deep GPs with importance-weighted VI (dgp-iwvi-dreg-supplement): the model, the q(z)
encoders and the gradient signal-to-noise diagnostics."""
from .model import LatentDeepGP, build_latent_deep_gp

__all__ = ["LatentDeepGP", "build_latent_deep_gp"]
