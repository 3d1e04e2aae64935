"""flowgp: scalable Gaussian processes reshaped by normalizing flows (TGP, v-WGP, deep GPs, AMO-GP) in PyTorch."""
from . import flows
from .compat import library_version
from .gp import kernels, likelihoods
from .reporting import metrics
from .estimators import (
    AlignedMultiOutputGPRegressor,
    DeepGPClassifier,
    DeepGPRegressor,
    LatentDeepGPRegressor,
    SVGPClassifier,
    SVGPRegressor,
    TGPClassifier,
    TGPRegressor,
    WarpedGPRegressor,
    load,
)
from .flows import make_flow
from .gp.kernels import make_kernel
from .gp.likelihoods import GaussianLikelihood
from .models import SVGP, TGP, WarpedGP
from .gp.variational import SparseVariationalGP

__version__ = library_version()

__all__ = [
    "SVGP", "TGP", "WarpedGP", "SparseVariationalGP", "GaussianLikelihood",
    "SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
    "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor", "load",
    "make_flow", "make_kernel", "flows", "kernels", "likelihoods", "metrics",
]
