"""Does DREG beat REG on wine-red with the DREG authors' K = 50 and batch 64, each fit scored by the mean of its
last scorings?

Answer (2026-11-30, splits 0-4 at 20 000 iterations): no, a tie. DREG - REG -0.003 ± 0.065 (median +0.068, 95 %
interval [-0.185, +0.179]), DREG ahead on 3 of 5 splits, as at K = 5 (-0.002 ± 0.014 over all 20 splits) and as in
the paper's own 20 scores (+0.043 ± 0.239).

With a small minibatch and the step sizes far from decayed, one iterate's test log-likelihood moves by up to
0.15-0.2 between scoring points (measured 2026-11-30). So a fit's
score at `--end` iterations is the mean of its rows (`benchmarks/studies/ldgp_learning_curve.py`'s curve.jsonl) with
iterations in [end - window, end + window), the scorings around `end` (a fit carried on past `end` keeps its later
rows out). The script pairs the two models per split and prints each split's difference and, as
`flowgp bench ldgp-table` does for the bench's tables, the mean difference ± s.e. (median), its 95 % interval and the
count of splits the second model wins.

    python -m benchmarks.studies.ldgp_tail_pairs RUN/curve.jsonl --end 20000
"""
import argparse
import statistics

import numpy as np

from flowgp.bench.ldgp_tables import paired_difference, paired_differences, tail_scores
from flowgp.bench.results import read_rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("curve", help="a learning-curve folder's curve.jsonl")
    p.add_argument("--end", type=int, required=True, help="the fits' iteration budget")
    p.add_argument("--window", type=int, default=1000, help="rows from end - window on count (default 1000)")
    p.add_argument("--first", default="ldgp2-reg")
    p.add_argument("--second", default="ldgp2-dreg")
    a = p.parse_args(argv)
    if a.window <= 0:
        p.error(f"--window must be positive, got {a.window}")
    rows = read_rows(a.curve)  # a curve still being written may end in a torn line
    pairs = paired_differences(tail_scores(rows, a.end, a.window), a.first, a.second)
    if not pairs:
        print(f"no split where both {a.first} and {a.second} reached {a.end} iterations")
        return 1
    print(f"| split | {a.first} (mean ± s.d., scorings) | {a.second} | {a.second} − {a.first} |")
    print("|---|---|---|---|")
    for r in pairs:
        print(f"| {r['split']} | {r[a.first]:.3f} ± {r[a.first + '_sd']:.3f} ({r['n'][0]}) | "
              f"{r[a.second]:.3f} ± {r[a.second + '_sd']:.3f} ({r['n'][1]}) | {r['difference']:+.3f} |")
    d = np.array([r["difference"] for r in pairs])
    print(f"{len(d)} splits: {a.second} − {a.first} {paired_difference(d)}; "
          f"{a.first} {statistics.fmean(r[a.first] for r in pairs):.3f}, "
          f"{a.second} {statistics.fmean(r[a.second] for r in pairs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
