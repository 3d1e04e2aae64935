"""Files saved by flowgp 0.2.0 (the flat layout, before the modules moved into packages) load and predict
exactly as they did: tests/data/saved_0_2_0 holds one small file per estimator and the predictions 0.2.0 gave."""
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import flowgp
from flowgp.compat import MOVED_MODULES, SavedFileUpgradeWarning, current_class_path

SAVED = Path(__file__).parent / "data" / "saved_0_2_0"
EXPECTED = json.loads((SAVED / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED["predictions"]))
def test_files_saved_by_the_flat_layout_load_and_predict_the_same(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = flowgp.load(SAVED / f"{name}.pt")
    if name == "amogp":
        X = np.asarray(EXPECTED["X_amogp"])
        pred = est.predict(X, output=np.repeat([0], len(X)))
    else:
        X = np.asarray(EXPECTED["X"])
        pred = est.predict_proba(X) if hasattr(est, "predict_proba") else est.predict(X)
    np.testing.assert_allclose(pred, EXPECTED["predictions"][name], rtol=1e-10, atol=1e-12)
    upgraded = [w for w in caught if issubclass(w.category, SavedFileUpgradeWarning)]
    # parameters added since (the regressors' early_stop) take the behaviour the file was fitted with
    parameters = [w for w in upgraded if "predates parameters" in str(w.message)]
    if "early_stop" in est.get_params():
        assert est.early_stop is None and len(parameters) == 1
    # among the classes files record, only the flow-parameter network (a flow object's record) moved
    assert bool([w for w in upgraded if w not in parameters]) == (name == "ba_tgp_object")


def test_class_paths_of_moved_modules_map_to_importable_classes():
    with pytest.warns(SavedFileUpgradeWarning, match="flowgp.flows.networks.BayesianMLP"):
        assert current_class_path("flowgp.bayesian.BayesianMLP") == "flowgp.flows.networks.BayesianMLP"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in ("flowgp.flows.networks.BayesianMLP", "flowgp.flows.elementwise.SinhArcsinh",
                     "flowgp.models.amogp.model.AMOGP", "mypackage.flows.Cubic"):
            assert current_class_path(path) == path  # today's paths and user classes are left alone
    import importlib
    for new in MOVED_MODULES.values():
        importlib.import_module(new)
