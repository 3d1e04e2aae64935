"""scikit-learn style deep-GP estimators (flowgp.estimators.deep)."""
import numpy as np
import pytest
from sklearn.base import clone

import flowgp
from flowgp import DeepGPClassifier, DeepGPRegressor


def _data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    y = 5.0 + 2.0 * np.sin(1.5 * X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X, y


@pytest.mark.parametrize("posterior,flow_base", [("gaussian", "network"), ("cnf", "network"), ("cnf-paper", "free")])
def test_regressor_fits_predicts_and_round_trips(tmp_path, posterior, flow_base):
    X, y = _data()
    est = DeepGPRegressor(layers=2, posterior=posterior, flow_base=flow_base, num_inducing=12, epochs=300, lr=0.03,
                          num_samples_predict=20, kmeans_restarts=1, verbose=False)
    est.fit(X, y)
    mean, std = est.predict(X, return_std=True)
    assert mean.shape == std.shape == (80,) and (std > 0).all()
    assert np.sqrt(np.mean((mean - y) ** 2)) < 0.5 * y.std()  # learned much of the signal, in y's units
    lo, hi = est.predict_interval(X, 0.9)
    assert (lo < mean).all() and (mean < hi).all()
    lpd = est.log_predictive_density(X, y)
    assert lpd.shape == (80,) and np.isfinite(lpd).all()
    assert np.isfinite(est.elbo(X, y)) and est.score(X, y) > 0.7
    assert est.sample_f(X[:4], num_samples=3).shape == (3, 4)
    # seeded predictions are reproducible, and save/load restores the same model
    np.testing.assert_allclose(est.predict(X), mean)
    est.save(tmp_path / "dgp.pt")
    back = flowgp.load(tmp_path / "dgp.pt")
    assert isinstance(back, DeepGPRegressor) and back.posterior == posterior and back.flow_base == flow_base
    np.testing.assert_allclose(back.predict(X), mean, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(back.log_predictive_density(X, y), lpd, rtol=1e-10, atol=1e-10)


def test_regressor_is_a_sklearn_estimator():
    est = DeepGPRegressor(layers=4, posterior="flow-layerwise", num_samples_train=2)
    params = clone(est).get_params()
    assert params["layers"] == 4 and params["posterior"] == "flow-layerwise" and params["num_samples_train"] == 2


def test_regressor_bad_input():
    X, y = _data(20)
    with pytest.raises(ValueError, match="posterior"):
        DeepGPRegressor(posterior="ipvi").fit(X, y)
    with pytest.raises(ValueError, match="layers"):
        DeepGPRegressor(layers=0).fit(X, y)
    with pytest.raises(ValueError, match="flow_base"):
        DeepGPRegressor(posterior="cnf", flow_base="mlp").fit(X, y)
    with pytest.raises(TypeError, match="kernel"):
        DeepGPRegressor(kernel=flowgp.make_kernel("rbf", 2)).fit(X, y)
    with pytest.raises(RuntimeError, match="not fitted"):
        DeepGPRegressor().predict(X)
    with pytest.raises(ValueError, match="2-D"):
        DeepGPRegressor(epochs=1, num_inducing=4, verbose=False).fit(X[:, 0], y)


def test_binary_classifier(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((60, 2))
    y = np.where(X[:, 0] + X[:, 1] > 0, "pos", "neg")
    est = DeepGPClassifier(layers=2, num_inducing=8, epochs=100, lr=0.03, num_samples_predict=10,
                           kmeans_restarts=1, verbose=False).fit(X, y)
    probs = est.predict_proba(X)
    assert probs.shape == (60, 2)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert (est.predict(X) == y).mean() > 0.85
    assert (est.log_predictive_density(X, y) < 0).all()
    est.save(tmp_path / "c.pt")
    np.testing.assert_allclose(flowgp.load(tmp_path / "c.pt").predict_proba(X), probs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["robustmax", "softmax"])
def test_multiclass_classifier(likelihood):
    rng = np.random.default_rng(2)
    centres = np.array([[0.0, 3.0], [3.0, -2.0], [-3.0, -2.0]])
    labels = rng.integers(0, 3, 60)
    X = centres[labels] + 0.5 * rng.standard_normal((60, 2))
    est = DeepGPClassifier(layers=2, posterior="cnf", likelihood=likelihood, num_inducing=6, epochs=80, lr=0.05,
                           num_samples_predict=10, kmeans_restarts=1, verbose=False).fit(X, labels)
    probs = est.predict_proba(X)
    assert probs.shape == (60, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)
    assert (est.predict(X) == labels).mean() > 0.9
    with pytest.raises(ValueError, match="not seen"):
        est.log_predictive_density(X[:2], np.array([0, 7]))


def test_bench_model_table_entries():
    from flowgp.bench.models import make_estimator, model_names, supports_task
    from flowgp.bench.presets import get_preset

    names = [f"{kind}{n}" for kind in ("dgp", "cnf-dgp") for n in range(2, 6)]
    assert set(names) <= set(model_names())
    est = make_estimator("cnf-dgp4", get_preset("tiny"), 20, 3, 100)
    assert isinstance(est, DeepGPRegressor) and est.layers == 4 and est.posterior == "cnf" and est.seed == 3
    assert make_estimator("dgp2", get_preset("tiny"), 20, 0, 100).posterior == "gaussian"
    assert supports_task("dgp3", "classification")
    assert isinstance(make_estimator("dgp3", get_preset("tiny"), 20, 0, 100, task="classification"), DeepGPClassifier)
    with pytest.raises(TypeError, match="options"):
        make_estimator("dgp2", get_preset("tiny"), 20, 0, 100, flow="sal")


def test_deep_fits_checkpoint_at_least_every_thousand_steps(monkeypatch, tmp_path):
    """100 epochs between checkpoints, or fewer where an epoch has many steps (Fashion-MNIST: 235 of 256 images),
    so that a killed fit keeps most of its work."""
    import flowgp.estimators.deep as deep

    assert deep.checkpoint_epochs(60000, 256) == 5 and deep.checkpoint_epochs(1347, 256) == 100
    assert deep.checkpoint_epochs(40, None) == 100 and deep.checkpoint_epochs(40, 2) == 50
    seen = []
    original = deep.train
    monkeypatch.setattr(deep, "train", lambda *a, **kw: seen.append(kw["checkpoint_every"]) or original(*a, **kw))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)), rng.integers(0, 2, 40)
    deep.DeepGPClassifier(layers=2, num_inducing=4, batch_size=2, epochs=1, verbose=False, kmeans_restarts=1,
                          checkpoint=str(tmp_path / "fit.pt")).fit(x, y)
    assert seen == [50]


class _Steps:
    """A caller's training callback with state: counts the steps it saw; raises KeyboardInterrupt (a Ctrl-C)
    after step `stop` (1-based) if given."""

    def __init__(self, stop=None):
        self.stop, self.seen, self.loaded = stop, 0, None

    def __call__(self, step, loss, model):
        self.seen += 1
        if self.stop is not None and step + 1 == self.stop:
            raise KeyboardInterrupt

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.loaded = dict(state)


def test_a_fit_callback_runs_next_to_the_flow_average_and_resumes_with_it(tmp_path):
    # DeepGP*.fit(callback=...) goes to the training loop next to the flow posterior's own averaging callback: the
    # fit is the one without it, an interrupted fit resumes both states (the average's, hence the same selected
    # flow), and checkpoints written with and without the caller's callback resume either way
    import torch
    from flowgp.training.loop import TrainingInterrupted

    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (60, 2))
    y = np.tanh(3 * X[:, 0]) + 0.05 * rng.standard_normal(60)

    def fit(path=None, callback=None):
        est = DeepGPRegressor(layers=2, posterior="cnf", num_inducing=8, epochs=6, batch_size=20, verbose=False,
                              checkpoint=None if path is None else str(path))
        return est.fit(X, y, callback=callback)

    def same(est):
        return all(torch.equal(state[k], v) for k, v in est.model_.state_dict().items())

    state = fit().model_.state_dict()
    steps = _Steps()
    assert same(fit(callback=steps)) and steps.seen == 18
    with pytest.raises(TrainingInterrupted):
        fit(tmp_path / "a.pt", _Steps(stop=7))
    again = _Steps()
    assert same(fit(tmp_path / "a.pt", again)) and (again.seen, again.loaded) == (11, {"seen": 7})
    assert same(fit(tmp_path / "a.pt"))  # its finished state, read by the flow average alone
    fit(tmp_path / "b.pt")  # a finished state written without the caller's callback ...
    later = _Steps()
    assert same(fit(tmp_path / "b.pt", later)) and (later.seen, later.loaded) == (0, None)  # ... read with one
