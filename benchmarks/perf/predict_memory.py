"""Peak memory of `predict` on 200 000 rows for every regression estimator.

Run from the repository root:

    OMP_NUM_THREADS=1 python -m benchmarks.perf.predict_memory --rows 200000 --out runs/predict-memory

Each estimator is fitted on 2 000 rows of an 8-feature synthetic problem with a short budget, then, in a fresh
process (so the fit's allocations do not count), loaded and asked for `predict` (and `predict_interval` /
`predict_quantiles` where it has one) on ROWS rows. The peak resident set size of that process (getrusage's
ru_maxrss) and the time are written to OUT/predict_memory.json; the aim is under 2 GB.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ESTIMATORS = {
    "SVGPRegressor": dict(num_inducing=100),
    "TGPRegressor": dict(num_inducing=100, flow="sal+softplus"),
    "WarpedGPRegressor": dict(num_inducing=100),
    "DeepGPRegressor": dict(layers=3, num_inducing=100),
    "LatentDeepGPRegressor": dict(num_inducing=100),
    # fit(X, y, output): 1-D inputs, 3 series; predict_interval by Monte Carlo through the hierarchy
    "AlignedMultiOutputGPRegressor": dict(),
}
MULTI_OUTPUT = "AlignedMultiOutputGPRegressor"
#: Monte Carlo samples per prediction of the deep estimators where --num-samples-predict overrides the default
DEEP = ("DeepGPRegressor", "LatentDeepGPRegressor")


def data(rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * rng.normal(size=rows)
    return x, np.exp(y / 2)  # positive targets so every flow of TGPRegressor applies


def series(rows, seed):
    """Three series on one time axis for the multi-output estimator: (x [rows, 1], y, output)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, (rows, 1))
    output = np.arange(rows) % 3
    return x, np.sin(x[:, 0] + output) + 0.1 * rng.normal(size=rows), output


def fit(name, path):
    import flowgp
    if name == MULTI_OUTPUT:
        est = flowgp.AlignedMultiOutputGPRegressor(epochs=20, verbose=False).fit(*series(2000, 0))
    else:
        x, y = data(2000, 0)
        est = getattr(flowgp, name)(epochs=20, verbose=False, kmeans_restarts=1, **ESTIMATORS[name]).fit(x, y)
    est.save(path)


def predict(name, path, rows, num_samples=None):
    import flowgp
    est = getattr(flowgp, name).load(path)
    if num_samples and name in DEEP:
        # rows per chunk shrink as 1/S (estimators.chunking), so the peak does not depend on S; the time does
        est.num_samples_predict = num_samples
    start = time.perf_counter()
    if name == MULTI_OUTPUT:
        x, _, output = series(rows, 1)
        mean = est.predict(x, output)
        est.predict_interval(x, output, method="samples")
        calls = ["predict", "predict_interval(method='samples')"]
    else:
        x, _ = data(rows, 1)
        mean = est.predict(x)
        calls = ["predict"]
        if hasattr(est, "predict_interval"):
            est.predict_interval(x)
            calls.append("predict_interval")
    elapsed = time.perf_counter() - start
    assert mean.shape == (rows,) and np.isfinite(mean).all()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(estimator=name, rows=rows, calls=calls, peak_rss_mb=round(peak_mb, 1),
                          seconds=round(elapsed, 1), num_samples_predict=getattr(est, "num_samples_predict", None))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out", default="runs/predict-memory")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--num-samples-predict", type=int, default=None,
                        help="Monte Carlo samples of the deep estimators' predictions (default: their own; the latent "
                             "deep GP's 10 000 take hours on 200 000 CPU rows)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, name, path = args.worker
        fit(name, path) if mode == "fit" else predict(name, path, args.rows, args.num_samples_predict)
        return
    os.makedirs(args.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.estimators.split(","):
            path = os.path.join(tmp, f"{name}.flowgp")
            subprocess.run([sys.executable, __file__, "--worker", "fit", name, path], check=True)
            extra = [] if args.num_samples_predict is None else ["--num-samples-predict", str(args.num_samples_predict)]
            out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), *extra, "--worker", "predict",
                                  name, path], check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    path = os.path.join(args.out, "predict_memory.json")
    earlier = []
    if os.path.exists(path):  # keep the other estimators' / settings' rows of earlier runs
        with open(path) as fh:
            earlier = [r for r in json.load(fh)
                       if not any(r.get("estimator") == n["estimator"] and r.get("rows") == n["rows"]
                                  and r.get("num_samples_predict") == n.get("num_samples_predict") for n in rows)]
    with open(path, "w") as fh:
        json.dump(earlier + rows, fh, indent=1)


if __name__ == "__main__":
    main()
