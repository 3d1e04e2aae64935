"""AMO-GP, aligned warped multi-output GPs (amogp-supplement): the model, the convolution-process kernel and
the closed-form and grid Ψ-statistics it alone uses."""
from .model import AMOGP, InducingSet, Posterior, layer_curves

__all__ = ["AMOGP", "InducingSet", "Posterior", "layer_curves"]
