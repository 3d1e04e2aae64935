"""The torch threads of an estimator's fits and predictions: its `threads` parameter, applied per call.

Every public method that computes (`THREADED_METHODS`: fit, fit_stream, predict, predict_proba, ...) runs inside
`flowgp.training.threads.thread_limit`: torch's intra-op thread count is set for the call and restored after it,
also when the call raises, so nothing changes for good. `threads` is a positive integer (used as given) or
"auto" (`flowgp.training.threads.choose_threads`): one thread when a step is too small to gain from more, else
the cores this process may use, shared with the other processes of the same job (torchrun's LOCAL_WORLD_SIZE,
joblib's workers through OMP_NUM_THREADS) and less the cores other processes keep busy. The size of a step is
`step_work(rows, M, layers)` with rows the batch (a fit: `batch_size`, or all rows for full batches; a
prediction: the rows given).

The parameter is checked before any work (a ValueError naming `threads`), nested calls (predict_interval calling
predict_quantiles, a fit that predicts) keep the outer call's choice.
"""
from __future__ import annotations

import functools

from ..gp.defaults import DEFAULTS
from ..training.threads import choose_threads, step_work, thread_limit
from .validation import is_integer, rule_for

__all__ = ["THREADED_METHODS", "call_threads", "with_threads"]

#: the public methods run with the estimator's `threads` (where a class defines them)
THREADED_METHODS = ("fit", "fit_stream", "predict", "predict_proba", "predict_quantiles", "predict_interval",
                    "predict_to_file", "log_predictive_density", "predictive_summary", "elbo", "sample_f",
                    "sample_y", "score", "training_objective", "gradient_snr", "warping_functions", "layers")

#: methods that train (their step is a minibatch of `batch_size` rows)
_FITS = ("fit", "fit_stream")


def _rows(X) -> int | None:
    """The rows of an array-like X (None for a table given by path or as chunks)."""
    shape = getattr(X, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    if isinstance(X, (list, tuple)):
        return len(X)
    return None


def _integer(value, default):
    return int(value) if is_integer(value) else default


def step_size(est, X, fitting: bool) -> float | None:
    """Multiply-adds of one step of `est` on X (`step_work`); None where the rows are not known beforehand."""
    rows = _rows(X)
    batch = _integer(getattr(est, "batch_size", None), None) if fitting else None
    if batch is None or (rows is not None and rows < batch):
        batch = rows
    if batch is None:
        return None
    inducing = _integer(getattr(est, "num_inducing", None), DEFAULTS.num_inducing)
    return step_work(batch, inducing, _integer(getattr(est, "layers", None), 1))


def call_threads(est, name: str, X=None) -> int:
    """The thread count of the call `name` of `est` on X; a ValueError naming `threads` for a bad value."""
    value = getattr(est, "threads", DEFAULTS.threads)
    rule_for(est, "threads")(value, "threads")
    if is_integer(value):
        return int(value)
    return choose_threads("auto", work=step_size(est, X, name in _FITS))


def with_threads(method):
    """`method` run with the estimator's thread count (module doc); calls nested in it run as they are."""
    if getattr(method, "sets_threads", False):
        return method

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if vars(self).get("_threads_of_call") is not None:
            return method(self, *args, **kwargs)
        threads = call_threads(self, method.__name__, args[0] if args else kwargs.get("X"))
        self._threads_of_call = threads
        try:
            with thread_limit(threads):
                return method(self, *args, **kwargs)
        finally:
            vars(self).pop("_threads_of_call", None)

    run.sets_threads = True
    return run
