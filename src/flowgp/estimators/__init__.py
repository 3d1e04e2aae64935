"""scikit-learn style estimators: thin layers over `flowgp.models` and `flowgp.training`.

One module per model family, all built on `_base._Estimator`; `load` reads any of them back from a file
written by `.save(path)` (the saved class name is looked up among `_Estimator`'s subclasses).
"""
from __future__ import annotations

from ._base import _Estimator
from .regression import SVGPRegressor, TGPRegressor, WarpedGPRegressor
from .classification import SVGPClassifier, TGPClassifier
from .deep import DeepGPClassifier, DeepGPRegressor
from .latent import LatentDeepGPRegressor
from .multioutput import AlignedMultiOutputGPRegressor

__all__ = ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
           "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor", "load"]


def load(path, device=None):
    """Load any flowgp estimator saved with `.save(path)` (weights_only: no code is executed)."""
    return _Estimator.load(path, device=device)
