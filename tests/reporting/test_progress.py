"""verbose="auto": progress bars only in an interactive terminal, never when scikit-learn or joblib runs the fit."""
import contextlib
import io
import sys

import joblib
import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, cross_val_score

from flowgp import SVGPRegressor, TGPRegressor
from flowgp.reporting.progress import called_by_meta_estimator, show_progress


class _Terminal(io.StringIO):
    """A stderr that says it is an interactive terminal and keeps what is written to it."""

    def isatty(self):
        return True


@contextlib.contextmanager
def _stderr(stream):
    """sys.stderr replaced inside the test's body (pytest sets its own capture after the fixtures run)."""
    saved = sys.stderr
    sys.stderr = stream
    try:
        yield stream
    finally:
        sys.stderr = saved


def _data(n=40):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (n, 1))
    return x, np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(n)


def _small(cls=SVGPRegressor, **kw):
    return cls(num_inducing=5, epochs=3, kmeans_restarts=1, **kw)


def test_every_estimator_defaults_to_auto():
    import flowgp

    for name in ("SVGPRegressor", "TGPRegressor", "WarpedGPRegressor", "SVGPClassifier", "TGPClassifier",
                 "DeepGPRegressor", "DeepGPClassifier", "LatentDeepGPRegressor", "AlignedMultiOutputGPRegressor"):
        assert getattr(flowgp, name)().get_params()["verbose"] == "auto", name


def test_auto_shows_a_bar_in_a_terminal():
    with _stderr(_Terminal()) as terminal:
        _small().fit(*_data())
    assert "SVGPRegressor" in terminal.getvalue()


def test_auto_is_silent_when_stderr_is_not_a_terminal():
    with _stderr(io.StringIO()) as stream:  # a file or a pipe: isatty() is False
        _small().fit(*_data())
    assert stream.getvalue() == ""
    with _stderr(None):  # pythonw, a closed terminal: no stream at all
        assert show_progress("auto") is False


def test_auto_is_silent_inside_cross_val_score_and_grid_search():
    x, y = _data()
    with _stderr(_Terminal()) as terminal:
        scores = cross_val_score(_small(), x, y, cv=2)
        search = GridSearchCV(_small(TGPRegressor, flow="sal"), {"lr": [0.01, 0.02]}, cv=2).fit(x, y)
    assert np.all(np.isfinite(scores))
    assert search.best_estimator_ is not None
    assert terminal.getvalue() == ""  # no bar from the folds, nor from GridSearchCV's refit


def test_verbose_true_is_honoured_inside_a_meta_estimator():
    x, y = _data()
    with _stderr(_Terminal()) as terminal:
        cross_val_score(_small(verbose=True), x, y, cv=2)
    assert terminal.getvalue().count("SVGPRegressor") >= 2  # asked for: one bar per fold


def test_verbose_false_is_silent_in_a_terminal():
    with _stderr(_Terminal()) as terminal:
        _small(verbose=False).fit(*_data())
    assert terminal.getvalue() == ""


def _probe():
    return called_by_meta_estimator(), show_progress(False), show_progress(1)


# (joblib's process backend, loky, runs the task under the same joblib frames; its workers import torch, which
# takes 10-20 s on two busy cores, so it is left out here)
@pytest.mark.parametrize("backend", ["sequential", "threading"])
def test_joblib_tasks_count_as_called_by_a_meta_estimator(backend):
    assert not called_by_meta_estimator()  # the test itself is not run by joblib
    n_jobs = 1 if backend == "sequential" else 2
    results = joblib.Parallel(n_jobs=n_jobs, backend=backend)(joblib.delayed(_probe)() for _ in range(2))
    assert results == [(True, False, True)] * 2


@pytest.mark.parametrize("bad", ["yes", "always", None, 0.5])
def test_bad_verbose_is_a_value_error_naming_the_choices(bad):
    with pytest.raises(ValueError, match="verbose must be True, False or 'auto'"):
        _small(verbose=bad).fit(*_data())
