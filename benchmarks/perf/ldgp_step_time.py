"""Seconds per training iteration of the reference-preset latent deep GP at a given K and minibatch, REG against
DREG in one run, and each model's ratio to the first of `--models`.

Fits `ldgp2-reg` and `ldgp2-dreg` of `flowgp bench uci --preset reference` on wine-red's reference split 0 for
`--iterations` iterations (K importance samples, minibatch B; the DREG authors' Table 1 runs: K = 50, B = 64) and
reports the median seconds per iteration after the first `--skip`, the two models interleaved `--rounds` times so
that both see the same machine load. Run it once per source tree to compare two versions of the code:

    OMP_NUM_THREADS=1 PYTHONPATH=<tree>/src python -m benchmarks.perf.ldgp_step_time --num-importance 50 --batch-size 64

`--profile` prints the aten operations with the most self time (torch.profiler, input shapes grouped) instead.
"""
import argparse
import math
import os
import statistics
import time

import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.uci import load_split


def fit_seconds_per_iteration(model: str, split, num_importance: int, batch_size: int, iterations: int,
                              skip: int) -> float:
    n = len(split.y_train)
    epochs = math.ceil(iterations / math.ceil(n / batch_size))
    est = make_estimator(model, get_preset("reference", epochs=epochs, batch_size=batch_size), 128, 0, n)
    est.set_params(num_importance=num_importance, verbose=False)
    stamps = []

    def stamp(step, loss, model):  # returns None: training goes on
        stamps.append(time.perf_counter())

    est.fit(split.x_train, split.y_train, callback=stamp)
    gaps = [b - a for a, b in zip(stamps[skip:], stamps[skip + 1:])]
    return statistics.median(gaps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-importance", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--skip", type=int, default=10, help="iterations left out of the median (warm-up)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--models", default="ldgp2-reg,ldgp2-dreg")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--data-dir", default=os.environ.get("FLOWGP_DATA"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    split = load_split("wine-red", 0, a.data_dir, protocol="reference")
    models = a.models.split(",")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for model in models:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                fit_seconds_per_iteration(model, split, a.num_importance, a.batch_size, a.iterations, a.skip)
            print(model)
            print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=15))
        return 0
    times = {m: [] for m in models}
    for _ in range(a.rounds):
        for model in models:
            times[model].append(fit_seconds_per_iteration(model, split, a.num_importance, a.batch_size,
                                                          a.iterations, a.skip))
    for model, values in times.items():
        print(f"{model} K={a.num_importance} B={a.batch_size}: {statistics.median(values):.4f} s/iteration "
              f"(rounds: {', '.join(f'{v:.4f}' for v in values)})")
    first = statistics.median(times[models[0]])
    for model in models[1:]:
        print(f"{model} / {models[0]}: {statistics.median(times[model]) / first:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
