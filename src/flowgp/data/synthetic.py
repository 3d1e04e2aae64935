"""Synthetic data sets from the papers.

`make_multimodal_demo`: the 1-D two-mode "demo" set of the DGP-IWVI/DREG supplement (eqs. E.25-E.28, Fig. 7),
which no unimodal predictive (plain or deep GP without a latent input) can fit.
"""
from __future__ import annotations

import numpy as np

__all__ = ["make_multimodal_demo"]

_NOISES = ("exp", "gaussian")


def make_multimodal_demo(num_points: int = 2000, seed: int = 0, x_range=(-2.0, 2.0), noise: str = "exp"):
    """Supplement eqs. E.25-E.28: y = f₁(x) w.p. 0.6, else f₂(x), with ε ~ N(0, 1) drawn per point and
        f₁(x) = sin(4x)/3 + 0.2 e^ε,    f₂(x) = 9x²/30 + 1.5 + 0.2 e^ε.

    The supplement does not state the input distribution; x is drawn uniformly on `x_range`.
    `noise="exp"` takes the noise term 0.2·e^ε literally as printed (log-normal, skewed upwards);
    `noise="gaussian"` reads it as 0.2·ε. Returns (x [N, 1], y [N], mode [N] with 0 for f₁ and 1 for f₂),
    float64 / int64 arrays; the same seed gives the same data.

    Args:
        num_points: N.
        seed: seed of the draws.
        x_range: (low, high) of the inputs.
        noise: "exp" (default) or "gaussian", as above.

    Examples:
        >>> from flowgp.data.synthetic import make_multimodal_demo
        >>> x, y, mode = make_multimodal_demo(num_points=100, seed=0)
        >>> x.shape, y.shape, sorted(set(mode.tolist()))
        ((100, 1), (100,), [0, 1])
    """
    if isinstance(num_points, bool) or not isinstance(num_points, (int, np.integer)) or num_points < 1:
        raise ValueError(f"num_points must be a positive integer, got {num_points!r}")
    if noise not in _NOISES:
        raise ValueError(f"noise must be one of {_NOISES}, got {noise!r}")
    lo, hi = (float(v) for v in x_range)
    if not hi > lo:
        raise ValueError(f"x_range must be (low, high) with high > low, got {x_range!r}")
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, num_points)
    eps = rng.standard_normal(num_points)
    term = 0.2 * (np.exp(eps) if noise == "exp" else eps)
    mode = (rng.uniform(size=num_points) >= 0.6).astype(np.int64)  # P(f₁) = 0.6
    f1 = np.sin(4.0 * x) / 3.0
    f2 = 9.0 * x**2 / 30.0 + 1.5
    y = np.where(mode == 0, f1, f2) + term
    return x[:, None], y, mode
