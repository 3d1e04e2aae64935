"""DREG against REG per split from learning-curve rows, each fit scored by the mean over its last iterations (issue 25).

With a small minibatch and the step sizes far from decayed, one iterate's test log-likelihood moves by up to
0.15-0.2 between scoring points (docs/results/ldgp-uci-reference/README.md, thirty-second session). So a fit's
score at `--end` iterations is the mean of its rows (`benchmarks/ldgp_learning_curve.py`'s curve.jsonl) from
`--end - --window` to the end of the fit; the script pairs the two models per split and prints each split's
difference, the mean difference with its standard error, the median and the second model's win count.

    python benchmarks/ldgp_tail_pairs.py docs/results/ldgp-uci-reference/wine-k50-b64/curve.jsonl --end 20000
"""
import argparse
import json
import math
import statistics
from pathlib import Path


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
    rows = [json.loads(line) for line in Path(a.curve).read_text().splitlines() if line.strip()]
    pairs = paired_differences(tail_scores(rows, a.end, a.window), a.first, a.second)
    if not pairs:
        print(f"no split where both {a.first} and {a.second} reached {a.end} iterations")
        return 1
    print(f"| split | {a.first} (mean ± s.d., scorings) | {a.second} | {a.second} − {a.first} |")
    print("|---|---|---|---|")
    for r in pairs:
        print(f"| {r['split']} | {r[a.first]:.3f} ± {r[a.first + '_sd']:.3f} ({r['n'][0]}) | "
              f"{r[a.second]:.3f} ± {r[a.second + '_sd']:.3f} ({r['n'][1]}) | {r['difference']:+.3f} |")
    d = [r["difference"] for r in pairs]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    print(f"{len(d)} splits: {a.second} − {a.first} mean {statistics.fmean(d):+.3f} ± {se:.3f} (s.e.), median "
          f"{statistics.median(d):+.3f}, {a.second} wins {sum(x > 0 for x in d)} of {len(d)}; "
          f"{a.first} {statistics.fmean(r[a.first] for r in pairs):.3f}, "
          f"{a.second} {statistics.fmean(r[a.second] for r in pairs):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
