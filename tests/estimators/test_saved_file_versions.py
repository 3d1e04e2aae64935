"""Saved estimator files carry a file-format version; loading a file of an earlier version upgrades it in
`flowgp.compat` and says so with a SavedFileUpgradeWarning, and a file of the current version loads silently."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import flowgp
from flowgp.compat import (FORMAT_VERSION, SavedFileUpgradeWarning, saved_format_version,
                           upgrade_estimator_parameters)
from flowgp.flows import make_flow
from flowgp.training.checkpoint import atomic_save, safe_load


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (30, 1))
    est = flowgp.SVGPRegressor(num_inducing=4, epochs=2, kmeans_restarts=1, verbose=False).fit(x, np.sin(3 * x[:, 0]))
    path = tmp_path_factory.mktemp("saved") / "svgp.pt"
    est.save(path)
    return est, path, x


def test_save_writes_the_current_format_version_and_it_loads_silently(saved):
    est, path, x = saved
    assert safe_load(path)["format_version"] == FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error", SavedFileUpgradeWarning)
        loaded = flowgp.load(path)
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))


def test_a_version_one_file_loads_silently_where_nothing_changed(saved, tmp_path):
    est, path, x = saved
    state = safe_load(path)
    del state["format_version"]
    old = tmp_path / "old.pt"
    atomic_save(state, old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SavedFileUpgradeWarning)
        np.testing.assert_array_equal(flowgp.load(old).predict(x), est.predict(x))


def test_a_version_one_file_with_a_renamed_parameter_is_upgraded_with_a_warning(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (24, 1))
    est = flowgp.DeepGPRegressor(layers=2, posterior="cnf", num_inducing=4, epochs=1, kmeans_restarts=1,
                                 dsvi_warmup=0.25, num_samples_predict=4,
                                 verbose=False).fit(x, np.sin(3 * x[:, 0]))
    est.save(tmp_path / "new.pt")
    state = safe_load(tmp_path / "new.pt")
    del state["format_version"]
    state["params"] = {("warm_start" if k == "dsvi_warmup" else k): v for k, v in state["params"].items()}
    atomic_save(state, tmp_path / "old.pt")
    with pytest.warns(SavedFileUpgradeWarning, match="warm_start -> dsvi_warmup"):
        loaded = flowgp.load(tmp_path / "old.pt")
    assert loaded.dsvi_warmup == 0.25
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))
    state["format_version"] = FORMAT_VERSION  # the same parameters in a current file are not renamed
    atomic_save(state, tmp_path / "bad.pt")
    with pytest.raises(TypeError, match="warm_start"):
        flowgp.load(tmp_path / "bad.pt")


def test_version_one_parameters_are_renamed_and_completed_with_a_warning():
    with pytest.warns(SavedFileUpgradeWarning, match="warm_start -> dsvi_warmup"):
        params = upgrade_estimator_parameters("DeepGPRegressor", {"warm_start": 0.3, "layers": 2}, 1)
    assert params["dsvi_warmup"] == 0.3 and "warm_start" not in params
    assert params["base_gradient"] == "joint" and params["flow_rows"] is None and params["layers"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", SavedFileUpgradeWarning)
        current = {"dsvi_warmup": 0.3}
        assert upgrade_estimator_parameters("DeepGPRegressor", current, FORMAT_VERSION) == current
        recorded = {"epochs": 3, "early_stop": "auto", "natural_gradient": "auto"}  # nothing missing: unchanged
        assert upgrade_estimator_parameters("SVGPRegressor", recorded, 1) == recorded


def test_format_versions_are_checked():
    assert saved_format_version({}) == 1
    assert saved_format_version({"format_version": FORMAT_VERSION}) == FORMAT_VERSION
    with pytest.raises(ValueError, match="newer than this flowgp reads"):
        saved_format_version({"format_version": FORMAT_VERSION + 1})
    with pytest.raises(ValueError, match="invalid format_version"):
        saved_format_version({"format_version": "2"})


def test_a_flow_saved_before_its_parameters_were_packed_loads_with_a_warning():
    flow = make_flow("sinharcsinh")
    names = [s.name for s in flow.param_specs]
    with torch.no_grad():
        flow.raw.add_(0.25)
    old = {f"raw_{name}": row.clone() for name, row in zip(names, flow.state_dict()["raw"])}
    fresh = make_flow("sinharcsinh")
    with pytest.warns(SavedFileUpgradeWarning, match="separate"):
        fresh.load_state_dict(old)
    assert torch.equal(fresh.raw, flow.raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SavedFileUpgradeWarning)
        make_flow("sinharcsinh").load_state_dict(flow.state_dict())
