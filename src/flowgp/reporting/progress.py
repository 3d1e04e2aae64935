"""Whether a fit shows progress: the one place that turns a `verbose` setting into yes or no.

scikit-learn's estimators print nothing unless asked (`verbose=0`), and their meta-estimators (cross_val_score,
GridSearchCV, Pipeline, BaggingRegressor, ...) clone and fit an estimator many times, in this process or in
joblib's worker processes and threads. flowgp's `verbose="auto"` (every estimator's default) follows that: a
progress bar only when someone is watching a terminal, and never when scikit-learn or joblib runs the fit.

    show_progress(True)    # True: asked for, always
    show_progress(False)   # False
    show_progress("auto")  # True only if stderr is an interactive terminal and no scikit-learn / joblib code
                           # is on the calling thread's stack
"""
from __future__ import annotations

import inspect
import sys

import numpy as np

__all__ = ["show_progress", "VERBOSE_CHOICES", "called_by_meta_estimator", "stderr_is_terminal"]

#: the values `verbose` takes besides integers (0 = False, anything else = True, as scikit-learn's)
VERBOSE_CHOICES = (True, False, "auto")

#: packages whose code on the stack means the fit was started by a meta-estimator or a parallel helper: scikit-learn's
#: model selection, ensembles, pipelines and checks all call `fit` from their own modules, and every joblib backend
#: (sequential, threads, loky/multiprocessing workers) calls the task from joblib's
_CALLERS = ("sklearn", "joblib")


def stderr_is_terminal() -> bool:
    """Whether sys.stderr is an interactive terminal (False for files, pipes, captured or missing streams)."""
    stream = sys.stderr
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def called_by_meta_estimator() -> bool:
    """Whether code of scikit-learn or joblib is on the calling thread's stack (a meta-estimator, a joblib task)."""
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if module.split(".", 1)[0] in _CALLERS:
            return True
        frame = frame.f_back
    return False


def show_progress(verbose) -> bool:
    """Whether to show a progress bar for `verbose`: True/False (or an integer, 0 = False) as given; "auto" True
    only when stderr is an interactive terminal and the call does not come from scikit-learn or joblib.

    ValueError for anything else, naming the choices."""
    if isinstance(verbose, str):
        if verbose == "auto":
            return stderr_is_terminal() and not called_by_meta_estimator()
    elif isinstance(verbose, (bool, np.bool_, int, np.integer)):
        return bool(verbose)
    raise ValueError(f"verbose must be True, False or 'auto' (progress only in an interactive terminal and never "
                     f"inside scikit-learn's meta-estimators), got {verbose!r}")
