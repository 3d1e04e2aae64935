"""DREG against REG per split from learning-curve rows, each fit scored by the mean over its last iterations (issue 25).

With a small minibatch and the step sizes far from decayed, one iterate's test log-likelihood moves by up to
0.15-0.2 between scoring points (docs/results/ldgp-uci-reference/README.md, thirty-second session). So a fit's
score at `--end` iterations is the mean of its rows (`benchmarks/ldgp_learning_curve.py`'s curve.jsonl) with
iterations in [end - window, end + window), the scorings around `end` (a fit carried on past `end` keeps its later
rows out). The script pairs the two models per split and prints each split's difference and, as
`ldgp_reg_vs_dreg.py` does for the bench's tables, the mean difference ± s.e. (median), its 95 % interval and the
count of splits the second model wins.

    python benchmarks/ldgp_tail_pairs.py docs/results/ldgp-uci-reference/wine-k50-b64/curve.jsonl --end 20000
"""
import argparse
import statistics

import numpy as np

from flowgp.bench.results import read_rows


def tail_scores(rows: list[dict], end: int, window: int) -> dict[tuple[str, int], list[float]]:
    """{(model, split): standardised test LLs of the rows with iterations in [end - window, end + window)} for the
    fits that reached `end`; a fit without a row at or beyond `end` is still running and is left out."""
    reached = {(r["model"], r["split"]) for r in rows if r["iterations"] >= end}
    scores: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        key = (r["model"], r["split"])
        if key in reached and end - window <= r["iterations"] < end + window:
            scores.setdefault(key, []).append(r["test_ll_std"])
    return scores


def paired_differences(scores: dict[tuple[str, int], list[float]], first: str, second: str) -> list[dict]:
    """One dict per split that both models reached: each one's mean and s.d. over its tail scores, and the
    difference second - first of the means."""
    out = []
    for split in sorted({s for (m, s) in scores if m == first} & {s for (m, s) in scores if m == second}):
        a, b = scores[(first, split)], scores[(second, split)]
        out.append({"split": split, first: statistics.fmean(a), second: statistics.fmean(b),
                    f"{first}_sd": statistics.stdev(a) if len(a) > 1 else 0.0,
                    f"{second}_sd": statistics.stdev(b) if len(b) > 1 else 0.0,
                    "n": (len(a), len(b)), "difference": statistics.fmean(b) - statistics.fmean(a)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("curve", help="a learning-curve folder's curve.jsonl")
    p.add_argument("--end", type=int, required=True, help="the fits' iteration budget")
    p.add_argument("--window", type=int, default=1000, help="rows from end - window on count (default 1000)")
    p.add_argument("--first", default="ldgp2-reg")
    p.add_argument("--second", default="ldgp2-dreg")
    a = p.parse_args(argv)
    if a.window <= 0:
        raise ValueError(f"--window must be positive, got {a.window}")
    from ldgp_reg_vs_dreg import paired_difference  # a sibling script (its directory is on sys.path)

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
