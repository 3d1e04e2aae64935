"""Seconds per iteration and per 10 000-sample test scoring of the quick-preset latent deep GPs, REG and DREG
(2026-11-30: REG 0.107, DREG 0.163 s per iteration, 20 s per scoring).

Fits ldgp2-reg and ldgp2-dreg of `flowgp bench uci --preset quick` on wine-red's standard split 0 for
`--epochs` epochs (3 iterations each) and times training and `log_predictive_density` (10 000 samples of z).
The whole quick fit is 1 500 iterations; multiply the per-iteration time to estimate it (interleaved, so both
see the same machine load).

    PYTHONPATH=src python -m benchmarks.perf.ldgp_quick_timing [--epochs 17]
"""
import argparse
import os
import time

import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.uci import load_split


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=17)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    sp = load_split("wine-red", 0, os.environ.get("FLOWGP_DATA"))
    per_iteration = {}
    for name in ("ldgp2-reg", "ldgp2-dreg"):
        est = make_estimator(name, get_preset("quick", epochs=a.epochs), 100, 0, len(sp.y_train))
        t = time.perf_counter()
        est.fit(sp.x_train, sp.y_train)
        train = time.perf_counter() - t
        t = time.perf_counter()
        est.log_predictive_density(sp.x_test, sp.y_test)
        score = time.perf_counter() - t
        its = len(est.history_)
        per_iteration[name] = train / its
        print(f"{name}: {its} iterations in {train:.1f} s ({train / its:.3f} s/iteration, "
              f"~{1500 * train / its / 60:.1f} min for the quick budget); log p(y*) with 10 000 samples {score:.1f} s")
    print(f"DREG / REG per iteration: {per_iteration['ldgp2-dreg'] / per_iteration['ldgp2-reg']:.2f}")


if __name__ == "__main__":
    main()
