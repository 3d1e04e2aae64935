"""Initial inducing inputs Z: best of several k-means restarts on the training inputs (TGP appendix B.6)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .defaults import DEFAULTS

__all__ = ["kmeans_inducing_points", "initial_inducing_inputs", "KMEANS_MAX_ROWS"]

#: k-means runs on at most this many rows (a seeded random subset beyond it): Lloyd's iterations cost O(N M D)
#: each, 13.5 s per restart at N = 200 000, while the centres of a 20 000-row sample are as good a start for Z.
KMEANS_MAX_ROWS = 20_000


def kmeans_inducing_points(x, num_inducing: int, restarts: int = DEFAULTS.kmeans_restarts, seed: int = 0,
                           max_rows: int | None = KMEANS_MAX_ROWS, large_restarts: int | None = 1) -> np.ndarray:
    """Cluster centres of k-means (best inertia over `restarts` runs) as an [M, D] float64 array.

    With more than `max_rows` rows, k-means runs on `max_rows` rows drawn without replacement by a NumPy
    generator seeded by `seed` (never the global RNG), with at most `large_restarts` restarts (None: `restarts`);
    up to `max_rows` rows (None: no limit) the result is exactly that of k-means on all rows.
    With fewer distinct points than `num_inducing`, all points are used (M is reduced, with a warning),
    since duplicated inducing inputs make K_ZZ singular.
    """
    from sklearn.cluster import KMeans

    x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)
    if not isinstance(num_inducing, (int, np.integer)) or num_inducing < 1:
        raise ValueError(f"num_inducing must be a positive integer, got {num_inducing!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer))
                                 or max_rows < 1):
        raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
    if large_restarts is not None and (isinstance(large_restarts, bool)
                                       or not isinstance(large_restarts, (int, np.integer)) or large_restarts < 1):
        raise ValueError(f"large_restarts must be a positive integer or None, got {large_restarts!r}")
    if max_rows is not None and len(x) > max_rows:
        rows = np.random.default_rng(seed).choice(len(x), size=int(max_rows), replace=False)
        x = x[np.sort(rows)]
        if large_restarts is not None:
            restarts = min(int(restarts), int(large_restarts))
    unique = np.unique(x, axis=0)
    if num_inducing >= len(unique):
        if num_inducing > len(unique):
            warnings.warn(
                f"num_inducing={num_inducing} exceeds the {len(unique)} distinct training inputs; "
                f"using those {len(unique)} inputs as inducing points",
                stacklevel=2,
            )
        return unique.astype(np.float64)
    km = KMeans(n_clusters=int(num_inducing), n_init=int(restarts), random_state=seed)
    km.fit(x)
    return km.cluster_centers_.astype(np.float64)


def initial_inducing_inputs(x, num_inducing: int, restarts: int = DEFAULTS.kmeans_restarts, seed: int = 0,
                            inducing_points=None, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """The initial inducing inputs Z [M, D] of a sparse GP as a tensor: `inducing_points` when given (checked
    to be [M, D]), otherwise the k-means centres of x (`kmeans_inducing_points`, best of `restarts`, seeded by
    `seed`), in `dtype` on `device`. The one place the library's builders initialise Z from."""
    if inducing_points is None:
        return torch.as_tensor(kmeans_inducing_points(x, num_inducing, restarts, seed), dtype=dtype, device=device)
    z = torch.as_tensor(np.asarray(inducing_points) if not isinstance(inducing_points, torch.Tensor)
                        else inducing_points, dtype=dtype, device=device)
    d = x.shape[1]
    if z.dim() != 2 or z.shape[1] != d:
        raise ValueError(f"inducing_points must have shape [M, {d}], got {tuple(z.shape)}")
    return z
