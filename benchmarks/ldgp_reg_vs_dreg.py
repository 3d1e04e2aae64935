"""REG vs DREG test log-likelihood of the latent-variable deep GP per split, against the IWVI paper's Table 1.

Reads the rows written by `flowgp bench uci` for the models ldgp2-reg / ldgp2-dreg, e.g.

    flowgp bench uci --datasets wine-red,power --models ldgp2-reg,ldgp2-dreg --splits 0-19 --inducing 128 \
        --preset reference --out docs/results/ldgp-uci-reference

and prints markdown tables. Rows hold `nll` in the units of y; the paper reports log-likelihoods of standardised
targets: log p(y_std) = log p(y) + log y_scale, y_scale the training targets' standard deviation (the row's
`y_scale`; older rows without it: recomputed from the split). Summaries give mean ± standard error, median and
DREG's win count, once over all splits and once with the supplement's outlier rule (E.3): a split whose test
log-likelihood lies more than two standard deviations from the mean of its dataset and model is dropped for
REG and DREG alike.

    python benchmarks/ldgp_reg_vs_dreg.py docs/results/ldgp-uci-reference/uci.jsonl [--preset reference-e300]
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from flowgp.bench.uci import load_split

#: IWVI supplement Table 1 (latent DGP, 300 000 iterations): test log-likelihood of standardised targets, REG → DREG
PAPER = {"wine-red": (0.568, 0.611), "power": (0.211, 0.208)}


def _log_scale(row, data_dir):
    if row.get("y_scale"):
        return math.log(float(row["y_scale"]))
    protocol = "reference" if str(row.get("preset", "")).startswith("reference") else "standard"
    return math.log(float(np.std(load_split(row["dataset"], row["split"], data_dir, protocol=protocol).y_train)))


def outlier_splits(values: dict) -> set:
    """Splits more than 2 s.d. (ddof=1) from the mean for either estimator (values: {g: {split: ll}})."""
    out = set()
    for per_split in values.values():
        v = np.array(list(per_split.values()))
        if len(v) < 3:
            continue
        mean, sd = v.mean(), v.std(ddof=1)
        out |= {s for s, x in per_split.items() if abs(x - mean) > 2 * sd}
    return out


def summary_line(dataset, label, reg, dreg):
    n = len(reg)
    diff = dreg - reg

    def ms(v):
        se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0
        return f"{v.mean():.3f} ± {se:.3f} (median {np.median(v):.3f})"

    paper = PAPER.get(dataset)
    ref = f"{paper[0]:.3f} → {paper[1]:.3f}" if paper else "—"
    return (f"| {dataset} | {label} | {n} | {ms(reg)} | {ms(dreg)} | {ms(diff)} | {int((diff > 0).sum())}/{n} | "
            f"{ref} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="JSON-lines files of flowgp bench uci")
    p.add_argument("--preset", default=None, help="only rows of this preset label (e.g. reference-e300)")
    p.add_argument("--data", default=None, help="data folder (default: FLOWGP_DATA or ../shared/data)")
    a = p.parse_args(argv)
    rows = [json.loads(line) for f in a.rows for line in open(f) if line.strip()]
    table = {}
    for r in rows:
        if r["model"] in ("ldgp2-reg", "ldgp2-dreg") and (a.preset is None or r.get("preset") == a.preset):
            ll_std = -r["nll"] + _log_scale(r, a.data)
            table.setdefault((r["dataset"], r["split"]), {})[r["model"].split("-")[1]] = (-r["nll"], ll_std)
    print("| dataset | split | REG (y units) | DREG (y units) | DREG − REG | REG (standardised) | DREG (standardised) |")
    print("|---|---|---|---|---|---|---|")
    per_dataset = {}
    for (dataset, split), ll in sorted(table.items()):
        if set(ll) != {"reg", "dreg"}:
            continue
        d = per_dataset.setdefault(dataset, {"reg": {}, "dreg": {}})
        for g in ("reg", "dreg"):
            d[g][split] = ll[g][1]
        print(f"| {dataset} | {split} | {ll['reg'][0]:.3f} | {ll['dreg'][0]:.3f} | {ll['dreg'][0] - ll['reg'][0]:+.3f} | "
              f"{ll['reg'][1]:.3f} | {ll['dreg'][1]:.3f} |")
    print()
    print("| dataset | splits used | n | REG (std.) mean ± se | DREG (std.) mean ± se | DREG − REG mean ± se | "
          "DREG wins | paper REG → DREG |")
    print("|---|---|---|---|---|---|---|---|")
    for dataset, d in per_dataset.items():
        splits = sorted(d["reg"])
        drop = outlier_splits(d)
        for label, use in (("all", splits), (f"outliers out {sorted(drop)}", [s for s in splits if s not in drop])):
            if not use:
                continue
            reg = np.array([d["reg"][s] for s in use])
            dreg = np.array([d["dreg"][s] for s in use])
            print(summary_line(dataset, label, reg, dreg))


if __name__ == "__main__":
    main()
