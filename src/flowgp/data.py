"""Data: the embedded demo set (TGP appendix Fig. 4 / paper Fig. 4) and CSV loading with clear errors."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

__all__ = ["make_tanh_sine", "load_csv"]


def make_tanh_sine(num_points: int = 150, noise_std: float = 0.05, seed: int = 0):
    """150 evenly spaced evaluations of a sine passed through a tanh flow plus Gaussian noise (paper Fig. 4).

    y = tanh(4 sin(2π x)) + ε on x ∈ [0, 2]: the steep tanh makes flat plateaus a plain GP cannot fit.
    Returns (x [N, 1], y [N]) as float64 arrays.
    """
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 2.0, num_points)
    f = np.tanh(4.0 * np.sin(2.0 * np.pi * x))
    y = f + noise_std * rng.standard_normal(num_points)
    return x[:, None], y


def load_csv(path, target: str | None, features: list[str] | None = None):
    """Read a numeric CSV with a header; returns (X [N, D], y [N] or None when target is None, feature names).

    Raises FileNotFoundError for a missing file and ValueError naming the column or row for a missing
    target, unknown feature, or a non-numeric/empty cell.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV file at {path}")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ValueError(f"{path} is empty; expected a header row naming the columns") from None
        rows = [row for row in reader if any(cell.strip() for cell in row)]
    if target is not None and target not in header:
        raise ValueError(f"target column '{target}' is not in {path.name}; columns are {header}")
    if features is None:
        features = [h for h in header if h != target]
    unknown = [f for f in features if f not in header]
    if unknown:
        raise ValueError(f"feature columns {unknown} are not in {path.name}; columns are {header}")
    if not features:
        raise ValueError(f"{path.name} has no feature columns besides the target '{target}'")
    cols = [header.index(f) for f in features] + ([header.index(target)] if target is not None else [])
    if not rows:
        raise ValueError(f"{path.name} has a header but no data rows")
    data = np.empty((len(rows), len(cols)))
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"{path.name} row {i + 2} has {len(row)} cells but the header has {len(header)}")
        for j, c in enumerate(cols):
            try:
                data[i, j] = float(row[c])
            except ValueError:
                raise ValueError(
                    f"{path.name} row {i + 2}, column '{header[c]}': '{row[c]}' is not a number"
                ) from None
    if target is None:
        return data, None, list(features)
    return data[:, :-1], data[:, -1], list(features)
