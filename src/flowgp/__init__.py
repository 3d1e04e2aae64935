"""flowgp: scalable Gaussian processes reshaped by normalizing flows (TGP, v-WGP, deep GPs, AMO-GP) in PyTorch."""
from . import flows
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



def _package_version() -> str:
    """The installed distribution's version (importlib.metadata); in a source tree that is not installed, the
    version in its pyproject.toml; "0+unknown" when neither exists."""
    import re
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("flowgp")
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        project = re.search(r"^\[project\]$(.*?)(?=^\[|\Z)", pyproject.read_text(encoding="utf-8"), re.M | re.S)
        found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
        if found:
            return found.group(1)
    return "0+unknown"


__version__ = _package_version()

__all__ = [
    "SVGP", "TGP", "WarpedGP", "SparseVariationalGP", "GaussianLikelihood",
    "SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
    "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor", "load",
    "make_flow", "make_kernel", "flows", "kernels", "likelihoods", "metrics",
]
