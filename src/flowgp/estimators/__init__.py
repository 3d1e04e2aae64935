"""scikit-learn style estimators: thin layers over `flowgp.models` and `flowgp.training.loop`.

One module per model family, all built on `base.Estimator`: each translates its scikit-learn parameters into a
`flowgp.build` config and calls `flowgp.build.build`. `load` reads any of them back from a file written by
`.save(path)` (the saved class name is looked up among `Estimator`'s subclasses).
"""
from __future__ import annotations

from .base import Estimator
from .regression import BoundBelowSVGPWarning, RobustFit, SVGPRegressor, TGPRegressor, WarpedGPRegressor
from .classification import SVGPClassifier, TGPClassifier
from .deep import DeepGPClassifier, DeepGPRegressor
from .latent import LatentDeepGPRegressor
from .multioutput import AlignedMultiOutputGPRegressor

__all__ = ["SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
           "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor", "Estimator", "load",
           "RobustFit", "BoundBelowSVGPWarning"]


def load(path, device=None):
    """Load any flowgp estimator saved with `.save(path)` (weights_only: no code is executed).

    Args:
        path: the file `save` wrote.
        device: where to put the model; None keeps the device it was saved from where this machine has it (see
            `Estimator.load`).

    Examples:
        >>> import os, tempfile
        >>> import numpy as np
        >>> import flowgp
        >>> X = np.linspace(0, 1, 30)[:, None]
        >>> est = flowgp.SVGPRegressor(num_inducing=5, epochs=5, verbose=False).fit(X, np.sin(6 * X[:, 0]))
        >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
        >>> _ = est.save(path)  # returns the path
        >>> np.allclose(flowgp.load(path).predict(X), est.predict(X))
        True
    """
    return Estimator.load(path, device=device)
