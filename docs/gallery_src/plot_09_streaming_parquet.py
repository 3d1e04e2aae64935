"""
Fitting from a Parquet file that is read block by block
=======================================================

``fit`` takes a path as well as arrays: a CSV file, a Parquet file (or a folder of them) or a 2-D ``.npy``
file, with the name (or index) of the target column. The table is streamed: one pass computes the
standardisation and a reservoir sample on which k-means places the inducing inputs, then every epoch reads
the row groups in a shuffled order. Memory depends on the batch size, the number of inducing points and the
row-group size, not on the number of rows. ``predict_to_file`` writes predictions the same way.

This example writes a 50 000-row file to a temporary folder; the same code works for files much larger than
memory.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowgp import SVGPRegressor

folder = Path(tempfile.mkdtemp())
rng = np.random.default_rng(0)
n = 50_000
x1, x2 = rng.uniform(-3, 3, n), rng.uniform(-3, 3, n)
table = pa.table({"x1": x1, "x2": x2, "y": np.sin(x1) * np.cos(x2) + 0.1 * rng.standard_normal(n)})
pq.write_table(table, folder / "train.parquet", row_group_size=5_000)
print(f"wrote {n} rows in {pq.ParquetFile(folder / 'train.parquet').num_row_groups} row groups")

model = SVGPRegressor(num_inducing=50, batch_size=2048, epochs=2, verbose=False)
model.fit(folder / "train.parquet", "y")  # the target column's name; every other column is a feature
print("features used:", list(model.feature_names_))

# %%
# Predictions for a new table, written chunk by chunk: mean, standard deviation and the 95 % interval of y.
g1, g2 = np.meshgrid(np.linspace(-3, 3, 60), np.linspace(-3, 3, 60))
pq.write_table(pa.table({"x1": g1.ravel(), "x2": g2.ravel()}), folder / "new.parquet")
model.predict_to_file(folder / "new.parquet", folder / "predictions.parquet", verbose=False)
pred = pq.read_table(folder / "predictions.parquet")
print("prediction columns:", pred.column_names)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
im = axes[0].pcolormesh(g1, g2, pred.column("mean").to_numpy().reshape(g1.shape), cmap="viridis")
fig.colorbar(im, ax=axes[0])
axes[0].set_title("predictive mean", fontsize=9)
truth = np.sin(g1) * np.cos(g2)
im = axes[1].pcolormesh(g1, g2, np.abs(pred.column("mean").to_numpy().reshape(g1.shape) - truth), cmap="magma")
fig.colorbar(im, ax=axes[1])
axes[1].set_title("|mean - true function|", fontsize=9)
for ax in axes:
    ax.set_xlabel("x1")
axes[0].set_ylabel("x2")
fig.tight_layout()
