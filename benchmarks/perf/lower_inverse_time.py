"""L⁻¹ of batched Cholesky factors: the left triangular solve (L X = I) against the right one (X L = I).

    python -m benchmarks.perf.lower_inverse_time                 # float64 and float32, 1 and 8 factors, M = 20..500

Both return the same X in the same (column-major) layout; `flowgp.numerics.linalg.lower_inverse` picks the faster one by
dtype and M from this table (CPU, MKL). Prints microseconds per call and the ratio right / left; `--json` writes
the rows. Run on a quiet machine (other processes on the cores distort OpenMP timings many-fold).
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def seconds_per_call(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="20,50,100,128,200,500")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for batch in (int(b) for b in args.batches.split(",")):
            for m in (int(s) for s in args.sizes.split(",")):
                a = torch.randn(batch, m, m, generator=g, dtype=torch.float64)
                chol = torch.linalg.cholesky(a @ a.mT + m * torch.eye(m, dtype=torch.float64)).to(dtype)
                eye = torch.eye(m, dtype=dtype).expand_as(chol)
                left = seconds_per_call(lambda: torch.linalg.solve_triangular(chol, eye, upper=False), args.repeats)
                right = seconds_per_call(
                    lambda: torch.linalg.solve_triangular(chol, eye, upper=False, left=False), args.repeats)
                row = {"dtype": dtype_name, "batch": batch, "M": m, "left_us": 1e6 * left, "right_us": 1e6 * right,
                       "right_over_left": right / left, "threads": torch.get_num_threads()}
                rows.append(row)
                print(f"{dtype_name} batch {batch:2d} M {m:4d}: left {row['left_us']:8.0f} us  right "
                      f"{row['right_us']:8.0f} us  right/left {row['right_over_left']:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
