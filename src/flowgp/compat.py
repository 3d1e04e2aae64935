"""Reading what earlier releases of flowgp wrote: the load-time upgrades of saved files, in one place.

A saved file names the classes of the objects it rebuilds (flows, flow-parameter networks) by their dotted
class path. Release 0.3.0 moved the flat modules of 0.2.0 into packages named after the architecture
(`flowgp.bayesian` became `flowgp.flows.networks`, `flowgp.kernels` became `flowgp.gp.kernels`, ...);
`current_class_path` maps a path recorded by an earlier release to today's, and says so with a
`SavedFileUpgradeWarning`, so that every file an earlier release saved still loads.

This module imports nothing from flowgp: every layer may use it.
"""
from __future__ import annotations

import re
import warnings

__all__ = ["MOVED_MODULES", "SavedFileUpgradeWarning", "current_class_path", "library_version"]


def library_version() -> str:
    """The installed flowgp's version (its package metadata; in a source tree never installed, its pyproject.toml;
    "0+unknown" without either): `flowgp.__version__`, and written into checkpoints' fingerprints."""
    import re
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("flowgp")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed: its pyproject.toml
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        project = re.search(r"^\[project\]$(.*?)(?=^\[|\Z)", pyproject.read_text(encoding="utf-8"), re.M | re.S)
        found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
        if found:
            return found.group(1)
    return "0+unknown"


class SavedFileUpgradeWarning(UserWarning):
    """A file written by an earlier release was upgraded while loading (it loads; re-save it to silence this)."""


#: module of release 0.2.0 -> its module since 0.3.0
MOVED_MODULES = {
    "flowgp.linalg": "flowgp.numerics.linalg", "flowgp.quadrature": "flowgp.numerics.quadrature",
    "flowgp.constraints": "flowgp.numerics.constraints", "flowgp.needed_gradients": "flowgp.numerics.needed_gradients",
    "flowgp.row_draws": "flowgp.numerics.row_draws",
    "flowgp.kernels": "flowgp.gp.kernels", "flowgp.inducing": "flowgp.gp.inducing",
    "flowgp.variational": "flowgp.gp.variational", "flowgp.likelihoods": "flowgp.gp.likelihoods",
    "flowgp.prediction": "flowgp.gp.prediction", "flowgp.objective": "flowgp.gp.objective",
    "flowgp.bayesian": "flowgp.flows.networks",
    "flowgp.training": "flowgp.training.loop", "flowgp.batches": "flowgp.training.batches",
    "flowgp.checkpoint": "flowgp.training.checkpoint", "flowgp.compiled": "flowgp.training.compiled",
    "flowgp.distributed": "flowgp.training.distributed", "flowgp.optim": "flowgp.training.natural_gradients",
    "flowgp.initialisation": "flowgp.training.initialisation",
    "flowgp.models.amogp": "flowgp.models.amogp.model", "flowgp.convolution": "flowgp.models.amogp.convolution",
    "flowgp.psi_statistics": "flowgp.models.amogp.psi_statistics", "flowgp.psi_grid": "flowgp.models.amogp.psi_grid",
    "flowgp.models.latent_deep_gp": "flowgp.models.latent.model", "flowgp.encoders": "flowgp.models.latent.encoders",
    "flowgp.diagnostics": "flowgp.models.latent.diagnostics",
    "flowgp.data": "flowgp.data.tables", "flowgp.data_sources": "flowgp.data.sources",
    "flowgp.image_data": "flowgp.data.images", "flowgp.synthetic": "flowgp.data.synthetic",
    "flowgp.metrics": "flowgp.reporting.metrics", "flowgp.plotting": "flowgp.reporting.plotting",
}

_CLASS_IN_MOVED_MODULE = re.compile(r"(" + "|".join(re.escape(m) for m in sorted(MOVED_MODULES, key=len, reverse=True))
                                    + r")\.([A-Za-z_][\w.]*)")

_TODAYS_MODULES = tuple(f"{m}." for m in MOVED_MODULES.values())


def current_class_path(path: str) -> str:
    """Today's dotted path of a class that a saved file recorded as `path` (unchanged where it did not move)."""
    if not isinstance(path, str) or path.startswith(_TODAYS_MODULES):
        return path
    match = _CLASS_IN_MOVED_MODULE.fullmatch(path)
    if match is None:
        return path
    new = f"{MOVED_MODULES[match.group(1)]}.{match.group(2)}"
    warnings.warn(f"this file was saved by flowgp 0.2 and names the class {path}, which now lives at {new}; it "
                  "loads as before (save it again to write today's layout)", SavedFileUpgradeWarning, stacklevel=3)
    return new
