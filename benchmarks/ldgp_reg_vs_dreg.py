"""REG vs DREG test log-likelihood of the latent-variable deep GP per split, against the IWVI paper's Table 1.

Reads the rows written by

    flowgp bench uci --datasets wine-red,power --models ldgp2-reg,ldgp2-dreg --splits 0-9 --preset quick \
        --out docs/results/ldgp-uci-quick

and prints a markdown table. The rows hold `nll` in the units of y; the paper reports log-likelihoods of
standardised targets, so both are shown: log p(y_std) = log p(y) + log std(y_train) (the estimator
standardises with the training split's mean and std, as the paper's set-up does).

    python benchmarks/ldgp_reg_vs_dreg.py docs/results/ldgp-uci-quick/uci.jsonl
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from flowgp.bench.uci import load_split

#: IWVI supplement Table 1 (latent DGP, 300 000 iterations): test log-likelihood of standardised targets, REG → DREG
PAPER = {"wine-red": (0.568, 0.611), "power": (0.211, 0.208)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="JSON-lines files of flowgp bench uci")
    p.add_argument("--data", default=None, help="data folder (default: FLOWGP_DATA or ../shared/data)")
    a = p.parse_args()
    rows = [json.loads(line) for f in a.rows for line in open(f) if line.strip()]
    table = {}
    for r in rows:
        if r["model"] in ("ldgp2-reg", "ldgp2-dreg"):
            table.setdefault((r["dataset"], r["split"]), {})[r["model"].split("-")[1]] = -r["nll"]
    print("| dataset | split | REG (y units) | DREG (y units) | DREG − REG | REG (standardised) | DREG (standardised) |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for (dataset, split), ll in sorted(table.items()):
        if set(ll) != {"reg", "dreg"}:
            continue
        log_scale = math.log(float(np.std(load_split(dataset, split, a.data).y_train)))
        s = summary.setdefault(dataset, {"reg": [], "dreg": [], "reg_std": [], "dreg_std": []})
        for g in ("reg", "dreg"):
            s[g].append(ll[g])
            s[g + "_std"].append(ll[g] + log_scale)
        print(f"| {dataset} | {split} | {ll['reg']:.3f} | {ll['dreg']:.3f} | {ll['dreg'] - ll['reg']:+.3f} | "
              f"{ll['reg'] + log_scale:.3f} | {ll['dreg'] + log_scale:.3f} |")
    print()
    print("| dataset | splits | REG (std.) mean ± se | DREG (std.) mean ± se | DREG − REG mean ± se | DREG wins | "
          "paper REG → DREG |")
    print("|---|---|---|---|---|---|---|")
    for dataset, s in summary.items():
        n = len(s["reg"])
        diff = np.array(s["dreg"]) - np.array(s["reg"])

        def ms(v):
            v = np.asarray(v)
            return f"{v.mean():.3f} ± {v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0:.3f}"

        paper = PAPER.get(dataset)
        ref = f"{paper[0]:.3f} → {paper[1]:.3f} ({paper[1] - paper[0]:+.3f})" if paper else "—"
        print(f"| {dataset} | {n} | {ms(s['reg_std'])} | {ms(s['dreg_std'])} | {ms(diff)} | "
              f"{int((diff > 0).sum())}/{n} | {ref} |")


if __name__ == "__main__":
    main()
