"""The parameters an estimator is fitted with, as a saved model and a training checkpoint record them.

scikit-learn's tools hand hyperparameters over as numpy values (GridSearchCV over np.logspace or np.arange
gives np.float64 and np.int64; users pass lengthscale=np.array([...])), and scikit-learn requires that
`get_params` return exactly what was set (`clone` checks identity) and that `fit` leave it so. A fit therefore
works on a normalised copy, taken before any work:

- `fitted_params(est)`: `get_params()` with numpy scalars made Python scalars, numpy arrays lists, paths
  strings; every value checked to survive `save`/`load` (the saved form of the parameters goes through
  torch.save and torch.load(weights_only=True) and must come back with the same content digest). A value that
  would not is a TypeError naming the parameter, at `fit`, never after training.
- `fitting(fit)`: wraps an estimator's `fit` (`Estimator.__init_subclass__` applies it to every `fit` and
  `fit_stream`): the snapshot becomes `fitted_params_`, the estimator's attributes hold the plain values while
  the fit runs (every check and the training see Python values), and the user's own objects are put back
  afterwards. The previous fit's model is dropped first, so a fit that raises leaves no model rather than the
  previous one under this fit's parameters.
- `params_for_file(est)`: what `save` writes: the snapshot (the parameters the model was fitted with, not a
  `set_params` made after the fit), without `checkpoint`: a training checkpoint belongs to the fit that wrote
  it, so a refit of a loaded model trains afresh. `params_from_file` is its inverse for `load`.
- `params_fingerprint(est)`: the parameters' part of a training checkpoint's fingerprint.
"""
from __future__ import annotations

import dataclasses
import functools
import io
from pathlib import PurePath

import numpy as np
import torch

from ..training.checkpoint import content_digest
from ..flows import Flow
from ..flows.serialization import flow_from_record, flow_to_record
from ..training.early_stop import EarlyStop
from .robust import RobustFit

__all__ = ["plain_value", "fitted_params", "fitting", "params_for_file", "params_from_file", "params_fingerprint",
           "NOT_SAVED", "NOT_IN_FINGERPRINT"]

#: parameters a saved model does not record: a training checkpoint path belongs to the fit that wrote it
NOT_SAVED = ("checkpoint",)

#: parameters that do not change what a resumed training run computes: where it is written, how it is shown,
#: compiled, placed or threaded, and the budget (the training loop checks that itself, `extend_budget` included); nor do
#: those of predictions alone, named "*predict*" (e.g. num_samples_predict), which a resume may change. `shard_reads`
#: is how the processes split the reading, which a checkpoint resumes under another choice as under another number of
#: processes (flowgp.training.batches.BlockBatches)
NOT_IN_FINGERPRINT = ("checkpoint", "extend_checkpoint", "epochs", "verbose", "compile", "device", "threads",
                      "shard_reads")

#: random-number generators given as a parameter (a seed): drawn from at fit, saved as the seed drawn
RANDOM_STATES = (np.random.Generator, np.random.RandomState)


def plain_value(value):
    """`value` with numpy scalars as Python scalars, numpy arrays as (nested) lists and paths as strings, inside
    lists, tuples and the fields of dataclasses (e.g. a RobustFit) too; anything else unchanged."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return plain_value(value.tolist())
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_value(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # options objects such as RobustFit
        return dataclasses.replace(value, **{f.name: plain_value(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _robust_to_file(value: RobustFit) -> dict:
    return {"flowgp_robust_fit": {f.name: plain_value(getattr(value, f.name)) for f in dataclasses.fields(value)}}


def _saved_form(est, name: str, value):
    """(section, value) of one parameter in a saved file: "records" for a Flow object, "spec" for the other
    object parameters (a spec string, None, or a Kernel object's spec), else "params"."""
    if isinstance(value, Flow):
        return "records", {"record": flow_to_record(value)}
    if name in est.OBJECT_PARAMS:
        if value is None or isinstance(value, str):
            return "spec", value
        spec = getattr(value, "spec", None)
        if not isinstance(spec, str):
            raise TypeError(f"{name}: a {type(value).__name__} has no spec string to save")
        return "spec", spec
    if isinstance(value, RobustFit):
        return "params", _robust_to_file(value)
    if isinstance(value, EarlyStop):  # a plain dict, as weights_only loading needs
        return "params", {"flowgp_early_stop": dataclasses.asdict(value)}
    if name == "seed" and getattr(est, "seed_", None) is not None:
        return "params", int(est.seed_)  # the integer seed the fit used (drawn for None or a generator)
    if isinstance(value, RANDOM_STATES):
        return "params", plain_value(getattr(est, f"{name}_", None))  # the seed the fit drew from it, if recorded
    return "params", value


def _sections(est, params: dict) -> dict:
    sections = {"params": {}, "spec": {}, "records": {}}
    for name, value in params.items():
        if name in NOT_SAVED:
            continue
        section, saved = _saved_form(est, name, value)
        sections[section][name] = saved
    return sections


def _round_trips(obj) -> bool:
    """Whether `obj` comes back from torch.save / torch.load(weights_only=True) with the same content."""
    try:
        expected = content_digest(obj)
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return content_digest(torch.load(buffer, weights_only=True)) == expected
    except Exception:  # noqa: BLE001 - pickling, unpickling and the digest each refuse in their own way
        return False


def _refuse(est, name: str, value, reason: str = "") -> None:
    raise TypeError(
        f"{name}: {type(est).__name__}({name}={value!r}) cannot be saved with the fitted model (a "
        f"{type(value).__name__}{reason}); pass a number, string, bool, None, or a list or tuple of them (numpy "
        "values are converted)")


def fitted_params(est) -> dict:
    """The estimator's parameters as a fit uses and `save` records them (see the module doc); TypeError naming
    the first parameter whose value would not survive save and load."""
    params = {name: plain_value(value) for name, value in est.get_params(deep=False).items()}
    try:
        sections = _sections(est, params)
    except (TypeError, ValueError):
        sections = None
    if sections is not None and _round_trips(sections):
        return params
    for name, value in params.items():  # find the culprit, to name it
        try:
            part = _sections(est, {name: value})
        except (TypeError, ValueError) as err:
            _refuse(est, name, value, f": {err}")
        if not _round_trips(part):
            _refuse(est, name, value)
    raise AssertionError("the parameters do not round-trip, yet each one does")  # pragma: no cover


def fitting(fit):
    """`fit` (or `fit_stream`) run on the normalised parameters (see the module doc); nested calls (a fit that
    calls its parent's fit, or fit_stream) run as they are."""
    if getattr(fit, "normalises_params", False):
        return fit

    @functools.wraps(fit)
    def run(self, *args, **kwargs):
        if vars(self).get("_fit_in_progress"):
            return fit(self, *args, **kwargs)
        given = self.get_params(deep=False)
        fitted = fitted_params(self)  # refuses a value that could not be saved, before any work
        self._start_fit(fitted)
        swapped = {name: value for name, value in given.items() if fitted[name] is not value}
        for name, value in swapped.items():
            setattr(self, name, fitted[name])
        self._fit_in_progress = True
        try:
            return fit(self, *args, **kwargs)
        finally:
            del self._fit_in_progress
            for name, value in swapped.items():
                setattr(self, name, value)  # the user's own objects, as scikit-learn requires

    run.normalises_params = True
    return run


def params_for_file(est) -> dict:
    """{"params", "spec", "records"}: the fitted parameters as `save` writes them (see the module doc)."""
    params = getattr(est, "fitted_params_", None)
    if params is None:  # fitted before snapshots existed (e.g. an estimator unpickled from an older version)
        params = fitted_params(est)
    return _sections(est, params)


def params_from_file(params: dict, records: dict) -> dict:
    """Constructor arguments from a saved file's "params" and "records" sections (inverse of
    `params_for_file`; files written before `checkpoint` was left out drop it here)."""
    out = {}
    for name, value in params.items():
        if name in NOT_SAVED:
            continue
        if isinstance(value, dict) and set(value) == {"flowgp_robust_fit"}:
            value = RobustFit(**value["flowgp_robust_fit"])
        elif isinstance(value, dict) and set(value) == {"flowgp_early_stop"}:
            value = EarlyStop(**value["flowgp_early_stop"])
        out[name] = value
    out.update({name: flow_from_record(saved["record"]) for name, saved in records.items()})
    return out


def params_fingerprint(est) -> dict:
    """{"parameter <name>": text} of the fitted parameters that decide what training computes (all but
    `NOT_IN_FINGERPRINT` and the prediction ones): a Flow object by the digest of its record, everything else by
    its saved form."""
    params = getattr(est, "fitted_params_", None)
    if params is None:
        params = fitted_params(est)
    sections = _sections(est, {k: v for k, v in params.items()
                               if k not in NOT_IN_FINGERPRINT and "predict" not in k})
    out = {f"parameter {name}": repr(value) for name, value in {**sections["params"], **sections["spec"]}.items()}
    out.update({f"parameter {name}": f"flow record sha256 {content_digest(saved)}"
                for name, saved in sections["records"].items()})
    return out
