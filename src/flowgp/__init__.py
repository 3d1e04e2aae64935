"""flowgp: scalable Gaussian processes reshaped by normalizing flows (TGP, v-WGP, SVGP) in PyTorch."""
from . import flows, kernels, likelihoods, metrics
from .estimators import SVGPRegressor, TGPRegressor, WarpedGPRegressor, load
from .estimators import SVGPClassifier, TGPClassifier
from .estimators import DeepGPClassifier, DeepGPRegressor
from .estimators import LatentDeepGPRegressor
from .estimators import AlignedMultiOutputGPRegressor
from .flows import make_flow
from .kernels import make_kernel
from .likelihoods import GaussianLikelihood
from .models import SVGP, TGP, WarpedGP
from .variational import SparseVariationalGP

__version__ = "0.1.0"

__all__ = [
    "SVGP", "TGP", "WarpedGP", "SparseVariationalGP", "GaussianLikelihood",
    "SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "load", "SVGPClassifier", "TGPClassifier",
    "make_flow", "make_kernel", "flows", "kernels", "likelihoods", "metrics",
]
__all__ += ["DeepGPRegressor", "DeepGPClassifier"]
__all__ += ["LatentDeepGPRegressor"]
__all__ += ["AlignedMultiOutputGPRegressor"]
