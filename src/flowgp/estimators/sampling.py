"""Draws from a fitted regressor's predictive distribution, `est.sample_y(X, n_samples, random_state)`.

The signature and the shape are scikit-learn's (`GaussianProcessRegressor.sample_y(X, n_samples=1,
random_state=0)` -> [n_samples_X, n_samples]): each column is one draw of y at every row of X, in the units of y.
Sparse GPs, TGPs and v-WGPs draw the latent function jointly over the rows of X (as `sample_f` does; the
memory grows as the square of the rows), the deep and latent-variable deep GPs draw each row independently
(their predictive is a Monte Carlo mixture), in chunks of rows. Every draw comes from a torch.Generator seeded
from `random_state`, never from a global random state.
"""
from __future__ import annotations

import numpy as np
import torch

from ..models import SVGP
from .base import positive_int

__all__ = ["predictive_draws", "resolve_seed"]


def resolve_seed(random_state, default: int) -> int:
    """The integer seed of `random_state`: None gives `default` (the estimator's `seed`, so draws repeat); an int
    itself; a numpy RandomState or Generator the next integer it draws (as scikit-learn's `check_random_state`
    accepts them). TypeError otherwise."""
    if random_state is None:
        return int(default)
    if isinstance(random_state, (bool, np.bool_)):
        raise TypeError(f"random_state must be None, an int or a numpy RandomState/Generator, got {random_state!r}")
    if isinstance(random_state, (int, np.integer)):
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int64).max))
    raise TypeError(f"random_state must be None, an int or a numpy RandomState/Generator, got "
                    f"{type(random_state).__name__}")


def predictive_draws(est, X, n_samples: int = 1, random_state=None) -> np.ndarray:
    """`n_samples` draws of y at the rows of X from the fitted regressor `est`: array [n_samples_X, n_samples]."""
    xt = est.scaled_inputs(X)
    n = positive_int(n_samples, "n_samples")
    generator = est.generator(resolve_seed(random_state, est.seed), xt.device)
    model = est.model_
    with torch.no_grad():
        if isinstance(model, SVGP):  # one joint draw of f over the rows, as sample_f
            draws = model.sample_y(xt, n, generator=generator)
        else:  # rows independent: chunks of rows from one generator stream
            draws = est.predict_in_chunks(lambda x: model.sample_y(x, n, generator=generator), [xt],
                                          num_samples=n, dim=1)
    draws = np.ascontiguousarray((draws[..., 0].cpu().numpy() * est.y_scale_ + est.y_shift_).T)
    if not np.isfinite(draws).all():
        raise FloatingPointError(f"{type(est).__name__} drew {int((~np.isfinite(draws)).sum())} non-finite values "
                                 "of y: the fitted model is numerically degenerate")
    return draws
