"""scikit-learn's feature-name contract (`flowgp.estimators.features`): `feature_names_in_` from a named table,
scikit-learn's errors for names missing, unseen or reordered, the names kept in the model file, and the command
line taking a table's columns by the names in the model file alone."""
import warnings

import numpy as np
import pyarrow as pa
import pytest
from sklearn.utils import estimator_checks as checks

import flowgp
from flowgp.cli import main

TINY = dict(num_inducing=4, epochs=2, verbose=False, kmeans_restarts=1)
ESTIMATORS = {
    "SVGPRegressor": dict(), "TGPRegressor": dict(), "WarpedGPRegressor": dict(), "SVGPClassifier": dict(),
    "TGPClassifier": dict(), "DeepGPRegressor": dict(layers=2, num_samples_predict=5),
    "DeepGPClassifier": dict(layers=2, num_samples_predict=5), "LatentDeepGPRegressor": dict(num_samples_predict=10),
}
NAMES = ["col_0", "col_1", "col_2", "col_3"]
MISMATCH = "The feature names should match those that were passed during fit.\n"


def _estimator(name):
    return getattr(flowgp, name)(**TINY, **ESTIMATORS[name])


def _table(x, names):
    return pa.table({n: x[:, j] for j, n in enumerate(names)})


def _data(name, n=40):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, len(NAMES)))
    y = (x[:, 0] > 0).astype(int) if "Classifier" in name else np.sin(x[:, 0]) + 0.1 * rng.normal(size=n)
    return x, y


def _methods(est, y):
    """The methods scikit-learn's check calls with X, and flowgp's own that take X."""
    out = {"predict": est.predict, "score": lambda X: est.score(X, y),
           "log_predictive_density": lambda X: est.log_predictive_density(X, y)}
    if hasattr(est, "predict_proba"):
        out["predict_proba"] = est.predict_proba
    return out


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_feature_names_are_kept_and_checked_as_scikit_learn_does(name):
    """`check_dataframe_column_names_consistency`'s assertions, on a pyarrow Table (which the scikit-learn check
    cannot use: it builds pandas DataFrames)."""
    x, y = _data(name)
    est = _estimator(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning about names with the names of the fit
        warnings.filterwarnings("ignore", category=UserWarning, message="(?!X does not have|X has feature)")
        est.fit(_table(x, NAMES), y)
        assert isinstance(est.feature_names_in_, np.ndarray) and est.feature_names_in_.dtype == object
        np.testing.assert_array_equal(est.feature_names_in_, NAMES)
        assert est.n_features_in_ == len(NAMES)
        methods = _methods(est, y)
        for method in methods.values():
            method(_table(x, NAMES))
    invalid = [(NAMES[::-1], "Feature names must be in the same order as they were in fit.\n"),
               ([f"another_prefix_{i}" for i in range(4)],
                "Feature names unseen at fit time:\n- another_prefix_0\n- another_prefix_1\n"),
               (NAMES[:3], "Feature names seen at fit time, yet now missing:\n- col_3\n")]
    for names, detail in invalid:
        bad = _table(x[:, :len(names)], names)
        for label, method in methods.items():
            with pytest.raises(ValueError) as caught:
                method(bad)
            assert str(caught.value).startswith(MISMATCH + detail), (label, str(caught.value))
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        est.predict(x)
    est.fit(x, y)  # a fit on unnamed arrays keeps no names of the fit before
    assert not hasattr(est, "feature_names_in_")
    with pytest.warns(UserWarning, match="X has feature names, but .* was fitted without feature names"):
        est.predict(_table(x, NAMES))


def test_the_multi_output_estimator_keeps_its_input_name():
    rng = np.random.default_rng(0)
    t, o = rng.uniform(0, 5, 30), np.arange(30) % 2
    y = np.sin(t) + o
    est = flowgp.AlignedMultiOutputGPRegressor(epochs=2, verbose=False, num_samples=10)
    est.fit(pa.table({"time": t}), y, o)
    np.testing.assert_array_equal(est.feature_names_in_, ["time"])
    est.predict(pa.table({"time": t}), o)
    with pytest.raises(ValueError, match="Feature names unseen at fit time:\n- hour"):
        est.predict(pa.table({"hour": t}), o)
    with pytest.raises(ValueError, match="Feature names unseen at fit time:\n- hour"):
        est.log_predictive_density(pa.table({"hour": t}), y, o)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_scikit_learns_own_column_name_check(name):
    """scikit-learn's `check_dataframe_column_names_consistency` itself (it needs pandas)."""
    pytest.importorskip("pandas")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message="(?!X does not have|X has feature)")
        checks.check_dataframe_column_names_consistency(name, _estimator(name))


def test_names_are_saved_in_the_model_file(tmp_path):
    x, y = _data("SVGPRegressor")
    est = flowgp.SVGPRegressor(**TINY).fit(_table(x, NAMES), y)
    est.save(tmp_path / "m.pt")
    back = flowgp.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(back.feature_names_in_, NAMES)
    assert back.feature_names_in_.dtype == object
    np.testing.assert_array_equal(back.predict(_table(x, NAMES)), est.predict(_table(x, NAMES)))
    with pytest.raises(ValueError, match="Feature names must be in the same order"):
        back.predict(_table(x[:, ::-1], NAMES[::-1]))
    # an estimator fitted on arrays has none, before and after a round trip
    plain = flowgp.SVGPRegressor(**TINY).fit(x, y)
    plain.save(tmp_path / "p.pt")
    assert not hasattr(flowgp.load(tmp_path / "p.pt"), "feature_names_in_")


def test_predict_to_file_takes_the_columns_of_a_fit_in_memory_by_name(tmp_path):
    x, y = _data("SVGPRegressor")
    est = flowgp.SVGPRegressor(**TINY).fit(_table(x, NAMES), y)
    # the same columns in another order, and an extra one
    columns = {"extra": np.full(len(x), 7.0), **{NAMES[j]: x[:, j] for j in (2, 0, 3, 1)}}
    csv = _csv(tmp_path / "shuffled.csv", columns)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        est.predict_to_file(str(csv), tmp_path / "p.csv", verbose=False)
    pred = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(pred[:, 0], est.predict(_table(x, NAMES)), rtol=1e-12)


def _csv(path, columns: dict):
    names = list(columns)
    rows = np.column_stack([columns[n] for n in names])
    path.write_text(",".join(names) + "\n" + "\n".join(",".join(repr(float(v)) for v in r) for r in rows) + "\n")
    return path


def test_cli_predict_takes_columns_by_the_names_in_the_model_file(tmp_path, capsys):
    """The model file alone (no .json beside it) says which columns are the features: a table with them in
    another order predicts the same; one without a feature column is an error naming it."""
    rng = np.random.default_rng(0)
    u, v = rng.uniform(-2, 2, 50), rng.uniform(-2, 2, 50)
    target = np.sin(u) + 0.3 * v
    train = _csv(tmp_path / "train.csv", {"u": u, "v": v, "target": target})
    model = tmp_path / "m.pt"
    assert main(["fit", "--data", str(train), "--target", "target", "--model", "svgp", "--epochs", "5",
                 "--num-inducing", "6", "--quiet", "--out", str(model)]) == 0
    (tmp_path / "m.pt.json").unlink()
    est = flowgp.load(model)
    assert est.feature_names_ == ["u", "v"] and est.target_name_ == "target"
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), "--data", str(train), "--out", str(out), "--quiet"]) == 0
    assert '"rmse"' in capsys.readouterr().out  # the target column named in the model file is scored
    straight = np.loadtxt(out, delimiter=",", skiprows=1)
    swapped = _csv(tmp_path / "swapped.csv", {"v": v, "u": u})
    assert main(["predict", "--model", str(model), "--data", str(swapped), "--out", str(out), "--quiet"]) == 0
    np.testing.assert_allclose(np.loadtxt(out, delimiter=",", skiprows=1), straight, rtol=1e-12)
    capsys.readouterr()
    missing = _csv(tmp_path / "missing.csv", {"u": u, "w": v})
    assert main(["predict", "--model", str(model), "--data", str(missing), "--out", str(out), "--quiet"]) == 2
    assert "'v'" in capsys.readouterr().err


def test_a_streamed_fit_records_its_columns_and_forgets_those_of_other_fits(tmp_path):
    rng = np.random.default_rng(1)
    t, site = rng.uniform(0, 5, 60), np.arange(60) % 2
    csv = _csv(tmp_path / "long.csv", {"site": site, "time": t, "value": np.sin(t) + site})
    est = flowgp.AlignedMultiOutputGPRegressor(epochs=2, verbose=False, num_samples=10)
    est.fit(pa.table({"time": t}), np.sin(t), site)
    est.fit_stream(str(csv), "value", output="site")
    assert not hasattr(est, "feature_names_in_")
    assert (est.feature_names_, est.target_name_, est.output_name_) == (["site", "time"], "value", "site")
    est.save(tmp_path / "a.pt")
    back = flowgp.load(tmp_path / "a.pt")
    assert (back.feature_names_, back.target_name_, back.output_name_) == (["site", "time"], "value", "site")
    # the output column comes from the model: predict_to_file needs no output=
    assert back.predict_to_file(str(csv), tmp_path / "p.csv", verbose=False)["rows"] == 60
    pred = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(pred[:, 0], back.predict(t[:, None], site), rtol=1e-10)
    est.fit(t[:, None], np.sin(t), site)  # a fit on arrays forgets the table's columns
    assert not any(hasattr(est, a) for a in ("feature_names_", "target_name_", "output_name_", "feature_names_in_"))
