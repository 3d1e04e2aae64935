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

With `--models ldgp2-reg,ldgp2-dreg,ldgp2-dreg-d23,svgp,dgp2` a further table gives every model's mean over its
own splits and its paired difference from `--reference` (default ldgp2-reg) on the splits both have.

A last table pairs DREG with REG on the same splits twice: the test log-likelihood difference with its two-sided
95 % Student-t interval, and the training bound per point (the rows' `train_elbo` / `n_train`, the importance-
weighted bound L_K on the whole training set; a difference of the same split's bounds, so units cancel). Rows
without `train_elbo` (learning-curve rows) enter only the first.

`--score nll_kde` makes every table use the rows' `nll_kde` instead of `nll`: the IWVI authors' public script's
test log-likelihood (a Silverman-bandwidth KDE of 10 000 predictive draws of y per point) in place of the
supplement's E.3 estimate; rows without it (written before 2026-11-29) are left out.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
from scipy import stats

from flowgp.bench.uci import load_split, row_order_of

#: IWVI supplement Table 1 (latent DGP, 300 000 iterations): test log-likelihood of standardised targets, REG → DREG
PAPER = {"wine-red": (0.568, 0.611), "power": (0.211, 0.208)}


def _log_scale(row, data_dir):
    if row.get("y_scale"):
        return math.log(float(row["y_scale"]))
    protocol = "reference" if str(row.get("preset", "")).startswith("reference") else "standard"
    split = load_split(row["dataset"], row["split"], data_dir, protocol=protocol, row_order=row_order_of(row))
    return math.log(float(np.std(split.y_train)))


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
    paper = PAPER.get(dataset)
    ref = f"{paper[0]:.3f} → {paper[1]:.3f}" if paper else "—"
    cells = " | ".join(format_mean_se(v) for v in (reg, dreg, diff))
    return f"| {dataset} | {label} | {n} | {cells} | {int((diff > 0).sum())}/{n} | {ref} |"


def _collect(rows, models, preset, data_dir):
    """{dataset: {model: {split: (ll in y units, standardised ll)}}} for the chosen models and preset."""
    table, orders = {}, {}
    for r in rows:
        if r["model"] in models and (preset is None or r.get("preset") == preset):
            # split k of another row order tests other points: pairing it with split k of this one is wrong
            orders.setdefault(r["dataset"], set()).add(row_order_of(r))
            if len(orders[r["dataset"]]) > 1:
                raise SystemExit(f"{r['dataset']}: the rows mix splits of row orders {sorted(orders[r['dataset']])}; "
                                 "pass the files of one row order (or filter them with --preset)")
            ll_std = -r["nll"] + _log_scale(r, data_dir)
            table.setdefault(r["dataset"], {}).setdefault(r["model"], {})[r["split"]] = (-r["nll"], ll_std)
    return table


def format_mean_se(v) -> str:
    """'mean ± se (median m)' of an array, three decimals (se 0 for one value)."""
    se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0
    return f"{v.mean():.3f} ± {se:.3f} (median {np.median(v):.3f})"


def comparison_lines(dataset, per_model, reference, models):
    """One line per model: its own mean over its splits, and its paired difference from `reference` on the splits
    both have, with the supplement's outlier rule applied to that pair."""
    lines = []
    ref = per_model.get(reference, {})
    for m in models:
        own = per_model.get(m, {})
        if not own:
            continue
        v = np.array([x[1] for x in own.values()])
        paired = ""
        if m != reference and ref:
            common = sorted(set(own) & set(ref))
            pair = {"a": {s: ref[s][1] for s in common}, "b": {s: own[s][1] for s in common}}
            drop = outlier_splits(pair)
            cells = []
            for use in (common, [s for s in common if s not in drop]):
                if not use:
                    cells.append("—")
                    continue
                d = np.array([own[s][1] - ref[s][1] for s in use])
                cells.append(f"{format_mean_se(d)}, wins {int((d > 0).sum())}/{len(d)}")
            paired = f"{cells[0]} | {cells[1]} (dropped {sorted(drop)})"
        else:
            paired = "— | —"
        lines.append(f"| {dataset} | {m} | {len(v)} | {format_mean_se(v)} | {paired} |")
    return lines


def paired_difference(values: np.ndarray) -> str:
    """mean ± se (median), the two-sided 95 % Student-t interval of the mean, and the count of positive values."""
    n = len(values)
    if n < 2:
        return f"{values.mean():+.3f} (one split)" if n else "—"
    se = values.std(ddof=1) / math.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    return (f"{values.mean():+.3f} ± {se:.3f} (median {np.median(values):+.3f}), 95 % interval "
            f"[{values.mean() - half:+.3f}, {values.mean() + half:+.3f}], positive {int((values > 0).sum())}/{n}")


def dreg_minus_reg_lines(rows, preset) -> list:
    """Per dataset: DREG − REG of the test log-likelihood and of the training bound per point, paired by split."""
    by = {}
    for r in rows:
        if r["model"] in ("ldgp2-reg", "ldgp2-dreg") and (preset is None or r.get("preset") == preset):
            by.setdefault(r["dataset"], {}).setdefault(r["split"], {})[r["model"]] = r
    lines = []
    for dataset in sorted(by):
        pairs = [v for _, v in sorted(by[dataset].items()) if len(v) == 2]
        test = np.array([v["ldgp2-reg"]["nll"] - v["ldgp2-dreg"]["nll"] for v in pairs])
        bound = np.array([v["ldgp2-dreg"]["train_elbo"] / v["ldgp2-dreg"]["n_train"]
                          - v["ldgp2-reg"]["train_elbo"] / v["ldgp2-reg"]["n_train"]
                          for v in pairs if "train_elbo" in v["ldgp2-reg"] and "train_elbo" in v["ldgp2-dreg"]])
        lines.append(f"| {dataset} | test log-likelihood | {paired_difference(test)} |")
        lines.append(f"| {dataset} | training bound per point | {paired_difference(bound)} |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="JSON-lines files of flowgp bench uci")
    p.add_argument("--preset", default=None, help="only rows of this preset label (e.g. reference-e300)")
    p.add_argument("--data", default=None, help="data folder (default: FLOWGP_DATA or ../shared/data)")
    p.add_argument("--models", default=None,
                   help="comma-separated models for a further table of every model against --reference "
                        "(e.g. ldgp2-reg,ldgp2-dreg,ldgp2-dreg-d23,svgp,dgp2)")
    p.add_argument("--reference", default="ldgp2-reg", help="the model the --models table is paired against")
    p.add_argument("--curve", action="append", default=[], metavar="FILE:ITERATIONS",
                   help="also take the rows of a learning curve (benchmarks/ldgp_learning_curve.py) scored at "
                        "exactly ITERATIONS iterations, as if the bench had written them under --preset "
                        "(e.g. curve-10k/curve.jsonl:10002 for the split-0 fits of the 10 002-iteration rows)")
    p.add_argument("--score", choices=("nll", "nll_kde"), default="nll",
                   help="the rows' test NLL to use: nll (supplement E.3) or nll_kde (the authors' public script)")
    a = p.parse_args(argv)
    rows = [json.loads(line) for f in a.rows for line in open(f) if line.strip()]
    if a.score != "nll":
        rows = [{**r, "nll": r[a.score]} for r in rows if a.score in r]
    for spec in a.curve:
        path, _, iterations = spec.rpartition(":")
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                if int(r["iterations"]) == int(iterations):
                    rows.append({**r, "preset": a.preset})
    table = _collect(rows, ("ldgp2-reg", "ldgp2-dreg"), a.preset, a.data)
    print("| dataset | split | REG (y units) | DREG (y units) | DREG − REG | REG (standardised) | DREG (standardised) |")
    print("|---|---|---|---|---|---|---|")
    per_dataset = {}
    for dataset in sorted(table):
        reg, dreg = table[dataset].get("ldgp2-reg", {}), table[dataset].get("ldgp2-dreg", {})
        for split in sorted(set(reg) & set(dreg)):
            d = per_dataset.setdefault(dataset, {"reg": {}, "dreg": {}})
            d["reg"][split], d["dreg"][split] = reg[split][1], dreg[split][1]
            print(f"| {dataset} | {split} | {reg[split][0]:.3f} | {dreg[split][0]:.3f} | "
                  f"{dreg[split][0] - reg[split][0]:+.3f} | {reg[split][1]:.3f} | {dreg[split][1]:.3f} |")
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
    if a.models:
        models = [m.strip() for m in a.models.split(",") if m.strip()]
        everything = _collect(rows, models, a.preset, a.data)
        print()
        print(f"Every model on its own splits, and paired with {a.reference} on the splits both have "
              "(standardised test log-likelihood):")
        print()
        print(f"| dataset | model | n | mean ± se (median) | − {a.reference}, all common splits | "
              f"− {a.reference}, outliers out |")
        print("|---|---|---|---|---|---|")
        for dataset in sorted(everything):
            for line in comparison_lines(dataset, everything[dataset], a.reference, models):
                print(line)
            paper = PAPER.get(dataset)
            if paper:
                print(f"| {dataset} | paper Table 1 (20 splits, 300 000 iterations) | 20 | REG {paper[0]:.3f}, "
                      f"DREG {paper[1]:.3f} | | |")
    print()
    print("DREG − REG paired by split (all splits both have):")
    print()
    print("| dataset | quantity | DREG − REG |")
    print("|---|---|---|")
    for line in dreg_minus_reg_lines(rows, a.preset):
        print(line)


if __name__ == "__main__":
    main()
