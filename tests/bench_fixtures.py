"""Tiny synthetic data folders in the shared-data layout, for the bench tests (no real data needed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def make_data_dir(root: Path, n: int = 40, n_splits: int = 3, seed: int = 0) -> Path:
    """root/uci/toy (standard-split layout), classification/*, sic97_rainfall/, air_quality/ with tiny data."""
    rng = np.random.default_rng(seed)
    uci = root / "uci" / "toy"
    uci.mkdir(parents=True)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.standard_normal(n)
    np.savetxt(uci / "data.txt", np.column_stack([x, y]))
    (uci / "index_features.txt").write_text("0\n1\n")
    (uci / "index_target.txt").write_text("2\n")
    (uci / "n_splits.txt").write_text(f"{n_splits}\n")
    for i in range(n_splits):
        perm = np.random.default_rng(100 + i).permutation(n)
        n_test = n // 5
        np.savetxt(uci / f"index_test_{i}.txt", np.sort(perm[:n_test]), fmt="%d")
        np.savetxt(uci / f"index_train_{i}.txt", np.sort(perm[n_test:]), fmt="%d")
    cls = root / "classification"
    cls.mkdir()
    xb = rng.standard_normal((60, 4))
    lab = (xb[:, 0] > 0).astype(int)
    (cls / "banknote_authentication.txt").write_text(
        "\n".join(",".join(f"{v:.4f}" for v in row) + f",{c}" for row, c in zip(xb, lab)) + "\n")
    rain = root / "sic97_rainfall"
    rain.mkdir()
    lines = ["id,x_km,y_km,altitude,rainfall,split"]
    for i in range(30):
        lines.append(f"{i},{rng.uniform(0, 100):.3f},{rng.uniform(0, 100):.3f},500,{rng.uniform(1, 300):.1f},"
                     f"{'train100' if i < 10 else 'test367'}")
    (rain / "sic97_all.csv").write_text("\n".join(lines) + "\n")
    air = root / "air_quality"
    air.mkdir()
    lines = ["datetime_gmt,hours_since_start,pm25"] + [f"t{i},{i},{5 + 3 * np.sin(i / 5) + rng.uniform(0.1, 1):.3f}"
                                                       for i in range(40)]
    (air / "london_n_kensington_pm25_2019-03-15_2019-04-15.csv").write_text("\n".join(lines) + "\n")
    return root
