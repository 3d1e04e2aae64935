"""The estimators' `threads` parameter: torch's thread count is set for each fit and prediction and restored
after it (also when the fit raises), bad values are refused before any work, the scikit-learn parameter
contract holds, and files saved before the parameter existed still load."""
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone

import flowgp
from flowgp.estimators import (AlignedMultiOutputGPRegressor, DeepGPClassifier, DeepGPRegressor,
                               LatentDeepGPRegressor, SVGPClassifier, SVGPRegressor, TGPClassifier, TGPRegressor,
                               WarpedGPRegressor)
from flowgp.training.checkpoint import atomic_save, safe_load

FAST = dict(num_inducing=5, epochs=2, kmeans_restarts=1, verbose=False)

#: name -> (estimator with `threads`, kind of data)
CASES = {
    "svgp": (lambda t: SVGPRegressor(**FAST, threads=t), "regression"),
    "tgp": (lambda t: TGPRegressor(flow="sal", robust=False, **FAST, threads=t), "regression"),
    "wgp": (lambda t: WarpedGPRegressor(flow="sal", robust=False, **FAST, threads=t), "regression"),
    "dgp": (lambda t: DeepGPRegressor(layers=2, num_samples_predict=3, **FAST, threads=t), "regression"),
    "ldgp": (lambda t: LatentDeepGPRegressor(layers=2, num_samples_predict=3, batch_size=20, **FAST, threads=t),
             "regression"),
    "svgp-classifier": (lambda t: SVGPClassifier(**FAST, threads=t), "classification"),
    "tgp-classifier": (lambda t: TGPClassifier(flow="sal", robust=False, predict_samples=4, **FAST, threads=t),
                       "classification"),
    "dgp-classifier": (lambda t: DeepGPClassifier(layers=2, num_samples_predict=3, **FAST, threads=t),
                       "classification"),
    "amogp": (lambda t: AlignedMultiOutputGPRegressor(num_inducing=4, num_inducing_alignment=3,
                                                      num_inducing_warping=3, epochs=2, num_samples=3,
                                                      verbose=False, threads=t), "multioutput"),
}


def _data(kind):
    """Fit arguments and predict arguments of a small problem of `kind`."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (40, 2))
    if kind == "regression":
        return (X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)), (X[:5],)
    if kind == "classification":
        return (X, (X[:, 0] > 0).astype(int)), (X[:5],)
    t = np.sort(rng.uniform(0, 5, 40))[:, None]
    o = np.repeat([0, 1], 20)
    return (t, np.sin(t[:, 0]) + 0.3 * o, o), (t[:5], o[:5])


@pytest.fixture
def other_count():
    """A thread count other than torch's current one (the fit must switch to it, then back)."""
    return 2 if torch.get_num_threads() == 1 else 1


@pytest.fixture
def counts_in_backward(monkeypatch):
    """The torch thread count in force at each backward pass of training (every training loop's step)."""
    seen = []
    backward = torch.autograd.backward

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return backward(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "backward", spy)
    return seen


@pytest.mark.parametrize("name", sorted(CASES))
def test_fit_and_predict_run_with_threads_and_restore_torchs_count(name, other_count, counts_in_backward):
    make, kind = CASES[name]
    before = torch.get_num_threads()
    est = make(other_count)
    fit_args, predict_args = _data(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two epochs are far from converged; not what this test is about
        est.fit(*fit_args)
    assert counts_in_backward and set(counts_in_backward) == {other_count}
    assert torch.get_num_threads() == before

    calls = []  # torch.set_num_threads during the prediction: to the estimator's count, then back
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "set_num_threads", _recording(torch.set_num_threads, calls))
        est.predict(*predict_args)
    assert calls == [other_count, before] and torch.get_num_threads() == before


def _recording(set_num_threads, calls):
    def record(n):
        calls.append(n)
        return set_num_threads(n)
    return record


def test_a_fit_that_raises_restores_torchs_count(other_count, monkeypatch):
    import flowgp.estimators.regression as regression

    before = torch.get_num_threads()
    seen = []

    def failing_train(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise RuntimeError("the training step failed")

    monkeypatch.setattr(regression, "train", failing_train)
    (X, y), _ = _data("regression")
    with pytest.raises(RuntimeError, match="training step failed"):
        SVGPRegressor(**FAST, threads=other_count).fit(X, y)
    assert seen == [other_count] and torch.get_num_threads() == before


def test_auto_takes_one_thread_for_a_small_model(monkeypatch):
    from flowgp.training import threads as T

    monkeypatch.setattr(T, "available_cores", lambda: 8)
    monkeypatch.setattr(T, "busy_cores", lambda: 0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls = []  # as if torch ran 8 threads: the thread counts the fits ask for
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    (X, y), _ = _data("regression")
    SVGPRegressor(**FAST).fit(X, y)  # 40 rows x M = 5: far below SMALL_STEP_WORK
    assert calls == [1]
    # the step's size is what decides: a minibatch of 4 096 rows and M = 500 gains from all 8 cores
    from flowgp.estimators.threads import call_threads

    big = np.zeros((100_000, 2))
    assert call_threads(SVGPRegressor(num_inducing=500, batch_size=4096), "fit", big) == 8
    assert call_threads(SVGPRegressor(num_inducing=50, batch_size=4096), "predict", big[:10]) == 1


@pytest.mark.parametrize("bad", [0, -1, "many", True, 2.0, None])
@pytest.mark.parametrize("name", ["svgp", "dgp-classifier", "amogp"])
def test_bad_threads_are_refused_before_any_work(name, bad, monkeypatch):
    make, kind = CASES[name]
    est = make(bad)
    fit_args, _ = _data(kind)
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    with pytest.raises(ValueError, match="threads"):
        est.fit(*fit_args)
    assert calls == [] and not hasattr(est, "model_")


def test_a_bad_threads_set_after_the_fit_is_refused_by_predict():
    (X, y), (Xp,) = _data("regression")
    est = SVGPRegressor(**FAST).fit(X, y)
    est.set_params(threads="many")
    with pytest.raises(ValueError, match="threads"):
        est.predict(Xp)


@pytest.mark.parametrize("name", sorted(CASES))
def test_clone_and_get_params_carry_threads(name):
    est = CASES[name][0](3)
    assert est.get_params()["threads"] == 3
    assert clone(est).threads == 3
    assert clone(est.set_params(threads="auto")).get_params()["threads"] == "auto"
    assert type(est)().threads == "auto"


def test_a_file_saved_before_threads_existed_loads_and_predicts(tmp_path):
    (X, y), (Xp,) = _data("regression")
    est = SVGPRegressor(**FAST, threads=1).fit(X, y)
    expected = est.predict(Xp)
    state = safe_load(est.save(tmp_path / "now.pt"))
    assert state["params"]["threads"] == 1
    for version in (1, 2):  # format version 1 (no version recorded) and 2, both written without `threads`
        old = {k: v for k, v in state.items() if not (version == 1 and k == "format_version")}
        old["params"] = {k: v for k, v in state["params"].items() if k != "threads"}
        atomic_save(old, tmp_path / f"v{version}.pt")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to upgrade: the default applies, without a warning
            loaded = flowgp.load(tmp_path / f"v{version}.pt")
        assert loaded.threads == "auto"
        np.testing.assert_allclose(loaded.predict(Xp), expected)
