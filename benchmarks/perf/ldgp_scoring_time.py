"""Time the bench's scoring of a latent-DGP fit: one `predictive_summary` (one set of 10 000 draws of z per test
point) against the three calls it replaced (predict_interval, log_predictive_density, predict; each draws its own).

    FLOWGP_DATA=../shared/data OMP_NUM_THREADS=1 python -m benchmarks.perf.ldgp_scoring_time --dataset power

A 1-epoch reference-preset fit on split 0 (the scores' values do not matter here, only their cost and agreement).
"""
from __future__ import annotations

import argparse
import time

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.runner import evaluate_regression
from flowgp.bench.uci import reference_split
from flowgp.reporting.metrics import coverage, mean_nll, rmse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="power")
    p.add_argument("--model", default="ldgp2-reg")
    a = p.parse_args(argv)
    split = reference_split(a.dataset, 0)
    est = make_estimator(a.model, get_preset("reference", epochs=1), 128, 0, len(split.y_train))
    est.verbose = False
    est.fit(split.x_train, split.y_train)
    start = time.perf_counter()
    scores = evaluate_regression(est, split.x_test, split.y_test)
    one = time.perf_counter() - start
    start = time.perf_counter()
    lower, upper = est.predict_interval(split.x_test, 0.95)
    lpd = est.log_predictive_density(split.x_test, split.y_test)
    mean = est.predict(split.x_test)
    three = time.perf_counter() - start
    print(f"one summary: {one:.1f} s  {scores}")
    print(f"three calls: {three:.1f} s  nll {mean_nll(lpd)!r}, rmse {rmse(split.y_test, mean)!r}, "
          f"coverage95 {coverage(split.y_test, lower, upper)!r}")
    print(f"one summary / three calls: {one / three:.2f}")


if __name__ == "__main__":
    main()
