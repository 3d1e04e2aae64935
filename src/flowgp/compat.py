"""Reading what earlier releases of flowgp wrote: the load-time upgrades of saved files, in one place.

A saved file names the classes of the objects it rebuilds (flows, flow-parameter networks) by their dotted
class path. Release 0.3.0 moved the flat modules of 0.2.0 into packages named after the architecture
(`flowgp.bayesian` became `flowgp.flows.networks`, `flowgp.kernels` became `flowgp.gp.kernels`, ...);
`current_class_path` maps a path recorded by an earlier release to today's, and says so with a
`SavedFileUpgradeWarning`, so that every file an earlier release saved still loads.

Estimator files carry a file-format version (`FORMAT_VERSION`, the key "format_version"; files without it are
version 1). `upgrade_estimator_parameters` turns the constructor parameters a version-1 file recorded into
today's: parameters renamed since (`RENAMED_PARAMETERS`) and parameters added since whose default differs from
the behaviour those files had (`VALUE_BEFORE_PARAMETER`). The state-dict upgrades of modules (flows saved with
separate `raw_<name>` tensors or as several stages, a TGP's flow saved outside its likelihood) are the functions
`packed_rows`, `saved_before_packing` and `move_prefix`, which the modules' load hooks call: a state dict has
no version of its own, so they recognise the old layout by its keys. Every upgrade warns with a
`SavedFileUpgradeWarning`.

This module imports nothing from flowgp: every layer may use it.
"""
from __future__ import annotations

import re
import warnings

__all__ = ["MOVED_MODULES", "SavedFileUpgradeWarning", "current_class_path", "library_version", "FORMAT_VERSION",
           "saved_format_version", "RENAMED_PARAMETERS", "VALUE_BEFORE_PARAMETER", "upgrade_estimator_parameters",
           "packed_rows", "saved_before_packing", "move_prefix", "nest_entries", "convert_entries", "warn_upgrade"]


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


def warn_upgrade(what: str, stacklevel: int = 3) -> None:
    """Say, with a SavedFileUpgradeWarning, that a saved file was upgraded while loading (`what`: how)."""
    warnings.warn(f"{what}; it loads as before (save it again to write today's layout)", SavedFileUpgradeWarning,
                  stacklevel=stacklevel)


# ----- estimator files ------------------------------------------------------------------------------------------
#: the version of the estimator file format `save()` writes (key "format_version"); files without it are version 1
#: (version 3: files record `early_stop`, and SVGPRegressor's `natural_gradient` defaults to "auto")
FORMAT_VERSION = 3


def saved_format_version(state: dict) -> int:
    """The file-format version of a loaded estimator file (1 for files written before versions were recorded)."""
    version = state.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"the file records an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"the file has format version {version}, newer than this flowgp reads ({FORMAT_VERSION}); "
                         "load it with the flowgp release that wrote it or a later one")
    return version


#: (class, old name) -> new name of constructor parameters renamed since files were first saved, so that
#: older files keep loading (the deep GPs' DSVI warm-up fraction was `warm_start`, which scikit-learn reserves)
RENAMED_PARAMETERS = {("DeepGPRegressor", "warm_start"): "dsvi_warmup",
                      ("DeepGPClassifier", "warm_start"): "dsvi_warmup"}

#: (class, parameter) -> the behaviour files saved before the parameter existed had, where its default differs
#: (AMO-GP's CP inducing sets were per output until cp_inducing arrived with the latent form as default). A parameter
#: whose default is right for older files needs no entry: the constructor's default applies to files of every
#: version that lack it (`threads`, which decides how many torch threads run, not what the model computes: files
#: saved before it load with threads="auto", without a warning)
VALUE_BEFORE_PARAMETER = {("AlignedMultiOutputGPRegressor", "cp_inducing"): "output",
                          # AMO-GP files saved before the grid option trained their CP inducing inputs
                          ("AlignedMultiOutputGPRegressor", "cp_grid"): False,
                          # deep GPs saved before DSVI-base training and flow selection
                          ("DeepGPRegressor", "base_gradient"): "joint", ("DeepGPClassifier", "base_gradient"): "joint",
                          ("DeepGPRegressor", "flow_selection"): False, ("DeepGPClassifier", "flow_selection"): False,
                          ("DeepGPRegressor", "flow_lr_scale"): 1.0, ("DeepGPClassifier", "flow_lr_scale"): 1.0,
                          ("DeepGPRegressor", "flow_rows"): None, ("DeepGPClassifier", "flow_rows"): None,
                          # regressors saved before the plateau stop trained all their epochs, and SVGPRegressor
                          # files before natural_gradient existed trained with Adam alone
                          ("SVGPRegressor", "early_stop"): None, ("TGPRegressor", "early_stop"): None,
                          ("WarpedGPRegressor", "early_stop"): None, ("SVGPRegressor", "natural_gradient"): None}


def upgrade_estimator_parameters(class_name: str, params: dict, version: int) -> dict:
    """Today's constructor parameters of a `class_name` estimator from those a file of format `version` recorded
    (a new dict): renamed parameters take their new names, and parameters the file predates get the behaviour
    the file was fitted with. Warns once when anything changed; files of the current version pass unchanged."""
    if version >= FORMAT_VERSION:
        return dict(params)
    renamed = {name: RENAMED_PARAMETERS[(class_name, name)] for name in params
               if (class_name, name) in RENAMED_PARAMETERS}
    out = {renamed.get(name, name): value for name, value in params.items()}
    added = {name: value for (owner, name), value in VALUE_BEFORE_PARAMETER.items()
             if owner == class_name and name not in out}
    out.update(added)
    if renamed or added:
        changes = [f"{old} -> {new}" for old, new in renamed.items()] + [f"{k}={v!r}" for k, v in added.items()]
        warn_upgrade(f"this {class_name} file (format version {version}) predates parameters of today's "
                     f"release; upgraded: {', '.join(changes)}", stacklevel=4)
    return out


# ----- module state dicts ---------------------------------------------------------------------------------------
def packed_rows(state_dict: dict, prefix: str, names) -> list | None:
    """The rows of one saved flow's parameters, popped from `state_dict`: its `raw` tensor, or the separate
    `raw_<name>` tensors of files saved before the parameters were packed (with a warning); None (nothing
    popped) when the entries are not all there (a partial state dict)."""
    if prefix + "raw" in state_dict:
        return list(state_dict.pop(prefix + "raw"))
    keys = [prefix + "raw_" + name for name in names]
    if not all(k in state_dict for k in keys):
        return None
    warn_upgrade(f"the flow under {prefix or 'the root'!r} was saved with separate {', '.join(keys)} entries "
                 "(before a flow's parameters were packed into one 'raw' tensor)", stacklevel=3)
    return [state_dict.pop(k) for k in keys]


def saved_before_packing(state_dict: dict, prefix: str) -> bool:
    """Whether `state_dict` holds, under `prefix`, a stage's separate `raw_<name>` entries (earlier versions)."""
    pattern = re.compile(re.escape(prefix) + r"\d+\.(base\.)?raw_[a-z]+$")
    return any(pattern.match(key) for key in state_dict)


def move_prefix(state_dict: dict, old: str, new: str, why: str) -> bool:
    """Rename, in place, every entry under `old` to `new` (an earlier layout); warns with `why` when anything
    moved. Returns whether it did."""
    keys = [k for k in state_dict if k.startswith(old)]
    if not keys:
        return False
    for key in keys:
        state_dict[new + key[len(old):]] = state_dict.pop(key)
    warn_upgrade(why, stacklevel=3)
    return True


def nest_entries(state_dict: dict, prefix: str, child: str, keep, why: str | None) -> bool:
    """Move, in place, the entries directly under `prefix` whose first name is not in `keep` under
    `prefix + child + "."` (a module that became a wrapper of its former self); warns with `why` when anything
    moved, unless `why` is None (the old layout is also today's layout of a simpler module, loaded on purpose).
    Returns whether it did."""
    keys = [k for k in state_dict if k.startswith(prefix) and k[len(prefix):].split(".", 1)[0] not in keep]
    for key in keys:
        state_dict[f"{prefix}{child}.{key[len(prefix):]}"] = state_dict.pop(key)
    if keys and why is not None:
        warn_upgrade(why, stacklevel=3)
    return bool(keys)


def convert_entries(state_dict: dict, prefix: str, conversions: dict, why: str) -> bool:
    """Replace, in place, each entry `prefix + old` of `conversions` {old: (new, convert)} by
    `prefix + new` = convert(value) where the new entry is absent (a parameter stored differently by an earlier
    layout); warns with `why` when anything changed. Returns whether it did."""
    done = False
    for old, (new, convert) in conversions.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = convert(state_dict.pop(prefix + old))
            done = True
    if done:
        warn_upgrade(why, stacklevel=3)
    return done
