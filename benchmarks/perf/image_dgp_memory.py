"""Memory and time of the CNF-DGP Table III deep GP at MNIST size, on synthetic images, DSVI against the flow
posterior.

Run from the repository root (no image files needed: random 28 x 28 images, 10 classes):

    OMP_NUM_THREADS=1 python -m benchmarks.perf.image_dgp_memory --out runs/image-dgp-memory/memory.json

A 4-layer `DeepGPClassifier` with the convolutional skip-layer connection (784-wide hidden layers sharing one
kernel per layer), M = 100, robust max, float32, trained for one epoch of `--rows` images in batches of 256
(the estimator's whole fit: k-means, build and the steps), with the DSVI and the flow posterior. Reported: the
fit's wall time, the process's peak resident memory after it (ru_maxrss, cumulative over the fits in the order
run) and the number of parameters.
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from flowgp import DeepGPClassifier


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((a.rows, 784))
    y = rng.integers(0, 10, a.rows)
    out = {"rows": a.rows, "batch_size": 256, "dtype": "float32", "layers": 4, "num_inducing": 100}
    for posterior in ("gaussian", "cnf"):
        est = DeepGPClassifier(layers=4, posterior=posterior, skip="conv", image_shape=(1, 28, 28), num_inducing=100,
                               batch_size=256, epochs=1, dtype="float32", verbose=False, kmeans_restarts=1,
                               num_samples_predict=5, flow_selection=False)
        start = time.perf_counter()
        est.fit(x, y)
        out[posterior] = {"fit_seconds": time.perf_counter() - start,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "parameters": sum(p.numel() for p in est.model_.parameters())}
        print(json.dumps(out), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
