"""How the compiled deep-GP training step splits into graphs: `DeepGPRegressor(compile=True)` fits of a few epochs
for each posterior, with torch._dynamo's counters (graph breaks by reason, graphs compiled, recompilations) and
the fit's wall time. A step that is one graph is what a GPU's CUDA graphs (`compile="reduce-overhead"`) replay
whole; every break is a return to eager Python between graphs.

    python -m benchmarks.perf.dgp_compile_graphs [--posteriors gaussian,cnf] [--epochs 4]

Synthetic data (N = 2 000, D = 4), 3 layers, M = 50, batch 256.
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from flowgp.estimators import DeepGPRegressor


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--posteriors", default="gaussian,cnf")
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4))
    y = np.sin(x[:, 0]) + 0.1 * rng.normal(size=2000)
    for posterior in args.posteriors.split(","):
        counters.clear()
        torch._dynamo.reset()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            DeepGPRegressor(layers=3, num_inducing=50, posterior=posterior, epochs=args.epochs, batch_size=256,
                            compile=True, verbose=False, kmeans_restarts=1).fit(x, y)
        seconds = time.perf_counter() - start
        stats = counters["stats"]
        breaks = counters["graph_break"]
        print(f"{posterior}: fit of {args.epochs} epochs {seconds:.1f} s; graphs compiled "
              f"{stats.get('unique_graphs', 0)} ({stats.get('calls_captured', 0)} operations captured); "
              f"graph breaks {sum(breaks.values())} ({len(breaks)} reasons)")
        for reason, count in sorted(breaks.items(), key=lambda kv: -kv[1])[:5]:
            print(f"    {count:4d}  {reason.splitlines()[0][:110]}")
        if counters["recompiles"]:
            print(f"    recompiles: {sum(counters['recompiles'].values())}")


if __name__ == "__main__":
    main()
