"""scikit-learn style estimators: thin layers over `flowgp.models` and `flowgp.training`.

One module per model family; `load` reads any of them back from a file written by `.save(path)`.
"""
from __future__ import annotations

from ..checkpoint import safe_load
from ._base import _FORMAT
from .regression import SVGPRegressor, TGPRegressor, WarpedGPRegressor
from .classification import SVGPClassifier, TGPClassifier
from .deep import DeepGPClassifier, DeepGPRegressor
from .latent import LatentDeepGPRegressor
from .multioutput import AlignedMultiOutputGPRegressor

__all__ = ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
           "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor", "load"]


def _estimator_classes() -> dict:
    # Explicit list of every estimator family (add new families here, no registry).
    classes = [SVGPRegressor, TGPRegressor, WarpedGPRegressor, SVGPClassifier, TGPClassifier,
               DeepGPRegressor, DeepGPClassifier, LatentDeepGPRegressor, AlignedMultiOutputGPRegressor]
    return {c.__name__: c for c in classes}


def load(path, device=None):
    """Load any flowgp estimator saved with `.save(path)` (weights_only: no code is executed)."""
    state = safe_load(path)
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a flowgp estimator file")
    cls = _estimator_classes().get(state.get("class"))
    if cls is None:
        raise ValueError(f"{path} holds an unknown estimator class {state.get('class')!r}")
    return cls.load(path, device=device)
