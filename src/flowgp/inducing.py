"""Initial inducing inputs Z: best of several k-means restarts on the training inputs (TGP appendix B.6)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["kmeans_inducing_points"]


def kmeans_inducing_points(x, num_inducing: int, restarts: int = 10, seed: int = 0) -> np.ndarray:
    """Cluster centres of k-means (best inertia over `restarts` runs) as an [M, D] float64 array.

    With fewer distinct points than `num_inducing`, all points are used (M is reduced, with a warning),
    since duplicated inducing inputs make K_ZZ singular.
    """
    from sklearn.cluster import KMeans

    x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)
    if not isinstance(num_inducing, (int, np.integer)) or num_inducing < 1:
        raise ValueError(f"num_inducing must be a positive integer, got {num_inducing!r}")
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
