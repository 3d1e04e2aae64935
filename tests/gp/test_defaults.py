"""The default values are defined once (`flowgp.gp.defaults.DEFAULTS`) and every layer reads them from there."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import flowgp.build as build
from flowgp.bench.presets import Preset
from flowgp.estimators import (DeepGPClassifier, DeepGPRegressor, SVGPClassifier, SVGPRegressor, TGPClassifier,
                               TGPRegressor, WarpedGPRegressor)
from flowgp.gp.defaults import DEFAULTS, Defaults
from flowgp.gp.inducing import kmeans_inducing_points
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP
from flowgp.training import train

SHARED = ("num_inducing", "quadrature_points", "predict_quadrature_points", "kmeans_restarts", "noise", "epochs", "lr",
          "threads")


def _default(obj, name):
    if dataclasses.is_dataclass(obj):
        return {f.name: f.default for f in dataclasses.fields(obj)}[name]
    return inspect.signature(obj).parameters[name].default


def test_defaults_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.num_inducing = 5
    assert Defaults() == DEFAULTS


@pytest.mark.parametrize("owner", [SVGPRegressor, TGPRegressor, WarpedGPRegressor, SVGPClassifier, TGPClassifier,
                                   DeepGPRegressor, DeepGPClassifier, build.SparseGPConfig,
                                   build.ClassificationConfig, build.DeepGPConfig, Preset],
                         ids=lambda o: o.__name__)
def test_estimators_configs_and_presets_read_the_one_defaults(owner):
    # a preset's epoch count is None unless the preset fixes one (it counts steps otherwise)
    names = [n for n in SHARED if n in inspect.signature(owner).parameters and not (owner is Preset and n == "epochs")]
    assert names, f"{owner.__name__} shares none of the defaults"
    for name in names:
        assert _default(owner, name) == getattr(DEFAULTS, name), (owner.__name__, name)


def test_model_parts_read_the_one_defaults():
    assert _default(GaussianLikelihood, "noise") == DEFAULTS.noise
    assert _default(SVGP, "quadrature_points") == DEFAULTS.quadrature_points
    assert _default(SVGP, "predict_quadrature_points") == DEFAULTS.predict_quadrature_points
    assert _default(kmeans_inducing_points, "restarts") == DEFAULTS.kmeans_restarts
    assert _default(train, "epochs") == DEFAULTS.epochs and _default(train, "lr") == DEFAULTS.lr

