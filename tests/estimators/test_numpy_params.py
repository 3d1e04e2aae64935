"""Every value scikit-learn's tools hand over is accepted or refused before training: numpy scalars and arrays
given as hyperparameters are fitted with as Python values (get_params still returns what was set), a value
that save/load could not carry is a TypeError naming the parameter at fit, and a file save() wrote loads."""
import fractions

import numpy as np
import pytest
import sklearn
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import GridSearchCV

import flowgp
import flowgp.estimators as E
import flowgp.estimators.regression as regression
from flowgp.estimators import RobustFit, SVGPRegressor, TGPRegressor

FAST = dict(num_inducing=5, epochs=3, verbose=False, kmeans_restarts=1)


def _data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    return x, np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=n)


NUMPY_VALUES = {
    "noise": np.float64(0.05), "lr": np.float32(0.02), "seed": np.int64(3), "num_inducing": np.int64(5),
    "epochs": np.int32(3), "batch_size": np.int64(16), "learn_inducing": np.bool_(False),
    "lengthscale": np.array([1.0, 2.0]), "kernel": np.str_("matern32"), "fix_noise_fraction": np.float16(0.5),
}


@pytest.mark.parametrize("name", sorted(NUMPY_VALUES))
def test_a_numpy_hyperparameter_is_fitted_saved_and_loaded(name, tmp_path):
    x, y = _data()
    value = NUMPY_VALUES[name]
    est = SVGPRegressor(**{**FAST, name: value}).fit(x, y)
    assert est.get_params()[name] is value  # scikit-learn's contract: what was set comes back
    plain = est.fitted_params_[name]
    assert type(plain) in (int, float, bool, str, list) and plain == (value.tolist())
    est.save(tmp_path / "m.pt")
    loaded = flowgp.load(tmp_path / "m.pt")
    assert loaded.get_params()[name] == plain and type(loaded.get_params()[name]) is type(plain)
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))
    # the same fit with the Python value: numpy values change nothing
    reference = SVGPRegressor(**{**FAST, name: value.tolist()}).fit(x, y)
    np.testing.assert_array_equal(reference.predict(x), est.predict(x))


def test_fit_leaves_the_users_objects_in_place_for_clone(tmp_path):
    x, y = _data()
    ls = np.array([1.0, 2.0])
    est = SVGPRegressor(lengthscale=ls, noise=np.float64(0.1), **FAST)
    est.fit(x, y)
    assert est.lengthscale is ls and isinstance(est.noise, np.float64)
    copy = clone(est)  # scikit-learn checks that the constructor keeps what it is given
    np.testing.assert_array_equal(copy.lengthscale, ls)


@pytest.mark.parametrize("name,value", [("noise", fractions.Fraction(1, 20)), ("lengthscale", {1.0, 2.0}),
                                        ("period", np.datetime64("2020-01-01"))])
def test_a_value_save_could_not_write_is_refused_before_training(name, value, monkeypatch):
    x, y = _data()

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(regression, "train", no_training)
    with pytest.raises(TypeError, match=rf"^{name}: SVGPRegressor\({name}=.*cannot be saved"):
        SVGPRegressor(**{**FAST, name: value}).fit(x, y)


def test_robust_fit_options_are_saved_and_loaded(tmp_path):
    x, y = _data()
    options = RobustFit(refine_flow=False, plateau=(5, 1e-3), flow_lr=np.float64(0.25))
    est = TGPRegressor(robust=options, **FAST).fit(x, y)
    assert est.robust is options
    est.save(tmp_path / "m.pt")
    loaded = flowgp.load(tmp_path / "m.pt")
    assert loaded.robust == RobustFit(refine_flow=False, plateau=(5, 1e-3), flow_lr=0.25)
    assert type(loaded.robust.flow_lr) is float
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))


# ----- GridSearchCV over numpy-typed grids, every public estimator ---------------------------------------------
def _regression(n=24):
    return _data(n)


def _classes(n=24):
    x, _ = _data(n)
    return x, np.where(x[:, 0] + 0.5 * x[:, 1] > 0, "yes", "no")


SMALL = dict(verbose=False, epochs=2)
DEEP = dict(layers=2, num_samples_predict=4, kmeans_restarts=1)
#: estimator -> (constructor arguments with numpy values, data)
GRID_CASES = {
    "SVGPRegressor": (dict(noise=np.float64(0.05), kmeans_restarts=1), _regression),
    "TGPRegressor": (dict(noise=np.float64(0.05), predict_quadrature_points=20, flow_init_epochs=np.int64(2),
                          kmeans_restarts=1), _regression),
    "WarpedGPRegressor": (dict(noise=np.float64(0.05), predict_quadrature_points=20, kmeans_restarts=1),
                          _regression),
    "SVGPClassifier": (dict(mc_samples=np.int64(4), predict_samples=16, kmeans_restarts=1), _classes),
    "TGPClassifier": (dict(mc_samples=np.int64(4), predict_samples=16, flow_init_epochs=np.int64(2),
                           kmeans_restarts=1), _classes),
    "DeepGPRegressor": (dict(noise=np.float64(0.05), predict_quadrature_points=20, **DEEP), _regression),
    "DeepGPClassifier": (dict(**DEEP), _classes),
    "LatentDeepGPRegressor": (dict(noise=np.float64(0.01), num_samples_predict=50, lr_decay=np.float64(0.98),
                                   kmeans_restarts=1), _regression),
    "AlignedMultiOutputGPRegressor": (dict(noise=np.float64(0.05), num_samples=10, patience=np.int64(5)), None),
}


def test_every_public_estimator_has_a_grid_case():
    public = {n for n in E.__all__ if isinstance(getattr(E, n), type) and issubclass(getattr(E, n), BaseEstimator)
              and n != "Estimator"}
    assert public == set(GRID_CASES)


def _grid_search(name):
    cls = getattr(E, name)
    arguments, data = GRID_CASES[name]
    grid = {"lr": np.logspace(-2, -1, 2), "num_inducing": np.arange(4, 5), "seed": np.arange(1, 2)}
    if name == "AlignedMultiOutputGPRegressor":
        rng = np.random.default_rng(0)
        x = rng.uniform(-2, 2, (24, 1))
        output = np.arange(24) % 2
        y = np.sin(2 * x[:, 0]) + 0.5 * output
        with sklearn.config_context(enable_metadata_routing=True):
            est = cls(**SMALL, **arguments).set_fit_request(output=True).set_score_request(output=True)
            search = GridSearchCV(est, grid, cv=2, error_score="raise").fit(x, y, output=output)
        return search, (x, output)
    x, y = data()
    search = GridSearchCV(cls(**SMALL, **arguments), grid, cv=2, error_score="raise").fit(x, y)
    return search, (x,)


@pytest.mark.parametrize("name", sorted(GRID_CASES))
def test_grid_search_over_numpy_grids_saves_and_loads_the_best_estimator(name, tmp_path):
    search, inputs = _grid_search(name)
    best = search.best_estimator_
    assert isinstance(best.lr, np.floating) and isinstance(best.seed, np.integer)  # as GridSearchCV set them
    assert type(best.fitted_params_["lr"]) is float and type(best.fitted_params_["num_inducing"]) is int
    best.save(tmp_path / "best.pt")
    loaded = flowgp.load(tmp_path / "best.pt")
    assert loaded.get_params()["lr"] == float(best.lr)
    if hasattr(best, "predict_proba"):
        np.testing.assert_array_equal(loaded.predict_proba(*inputs), best.predict_proba(*inputs))
    np.testing.assert_array_equal(loaded.predict(*inputs), best.predict(*inputs))
