"""`flowgp bench ldgp-table`: REG vs DREG test log-likelihood of the latent deep GP per split, against Table 1 of
the DGP-IWVI/DREG supplement.

Reads the rows written by `flowgp bench uci` for the models ldgp2-reg / ldgp2-dreg, e.g.

    flowgp bench uci --datasets wine-red,power --models ldgp2-reg,ldgp2-dreg --splits 0-19 --inducing 128 \\
        --preset reference --out runs/ldgp-reference
    flowgp bench ldgp-table runs/ldgp-reference/uci.jsonl [--preset reference-e300]

and prints markdown tables. Rows hold `nll` in the units of y; the paper reports log-likelihoods of standardised
targets: log p(y_std) = log p(y) + log y_scale, y_scale the training targets' standard deviation (the row's
`y_scale`; rows without it: recomputed from the split). Summaries give mean ± standard error, median and DREG's
win count, once over all splits and once with the supplement's outlier rule (E.3): a split whose test
log-likelihood lies more than two standard deviations from the mean of its dataset and model is dropped for REG
and DREG alike.

With `--models ldgp2-reg,ldgp2-dreg,ldgp2-dreg-d23,svgp,dgp2` a further table gives every model's mean over its
own splits and its paired difference from `--reference` (default ldgp2-reg) on the splits both have.
A last table pairs DREG with REG on the same splits twice: the test log-likelihood difference with its two-sided
95 % Student-t interval, and the training bound per point (the rows' `train_elbo` / `n_train`, the importance-
weighted bound L_K on the whole training set; a difference of the same split's bounds, so units cancel). Rows
without `train_elbo` (learning-curve rows) enter only the first.
`--score nll_kde` makes every table use the rows' `nll_kde` instead of `nll`: the IWVI authors' public script's
test log-likelihood (a Silverman-bandwidth KDE of 10 000 predictive draws of y per point) in place of the
supplement's E.3 estimate; rows without it are left out.

`tail_scores` / `paired_differences` score each fit of a learning curve by the mean of its scorings around a
budget (`benchmarks/studies/ldgp_tail_pairs.py`).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from .results import read_row_files
from .uci import load_split, row_order_of

NAME = "ldgp-table"
HELP = "REG vs DREG latent-DGP test log-likelihood per split against the DGP-IWVI/DREG supplement's Table 1"

#: IWVI supplement Table 1 (latent DGP, 300 000 iterations): test log-likelihood of standardised targets, REG → DREG
PAPER = {"wine-red": (0.568, 0.611), "power": (0.211, 0.208)}
PAIR = ("ldgp2-reg", "ldgp2-dreg")


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


def format_mean_se(v) -> str:
    """'mean ± se (median m)' of an array, three decimals (se 0 for one value)."""
    se = v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else 0.0
    return f"{v.mean():.3f} ± {se:.3f} (median {np.median(v):.3f})"


def summary_line(dataset, label, reg, dreg) -> str:
    n = len(reg)
    diff = dreg - reg
    paper = PAPER.get(dataset)
    ref = f"{paper[0]:.3f} → {paper[1]:.3f}" if paper else "—"
    cells = " | ".join(format_mean_se(v) for v in (reg, dreg, diff))
    return f"| {dataset} | {label} | {n} | {cells} | {int((diff > 0).sum())}/{n} | {ref} |"


def collect(rows, models, preset, data_dir=None) -> dict:
    """{dataset: {model: {split: (ll in y units, standardised ll)}}} for the chosen models and preset label."""
    table, orders = {}, {}
    for r in rows:
        if r["model"] in models and (preset is None or r.get("preset") == preset):
            # split k of another row order tests other points: pairing it with split k of this one is wrong
            orders.setdefault(r["dataset"], set()).add(row_order_of(r))
            if len(orders[r["dataset"]]) > 1:
                raise ValueError(f"{r['dataset']}: the rows mix splits of row orders {sorted(orders[r['dataset']])}; "
                                 "pass the files of one row order (or filter them with --preset)")
            ll_std = -r["nll"] + _log_scale(r, data_dir)
            table.setdefault(r["dataset"], {}).setdefault(r["model"], {})[r["split"]] = (-r["nll"], ll_std)
    return table


def comparison_lines(dataset, per_model, reference, models) -> list[str]:
    """One line per model: its own mean over its splits, and its paired difference from `reference` on the splits
    both have, with the supplement's outlier rule applied to that pair."""
    lines = []
    ref = per_model.get(reference, {})
    for m in models:
        own = per_model.get(m, {})
        if not own:
            continue
        v = np.array([x[1] for x in own.values()])
        paired = "— | —"
        if m != reference and ref:
            common = sorted(set(own) & set(ref))
            drop = outlier_splits({"a": {s: ref[s][1] for s in common}, "b": {s: own[s][1] for s in common}})
            cells = []
            for use in (common, [s for s in common if s not in drop]):
                if not use:
                    cells.append("—")
                    continue
                d = np.array([own[s][1] - ref[s][1] for s in use])
                cells.append(f"{format_mean_se(d)}, wins {int((d > 0).sum())}/{len(d)}")
            paired = f"{cells[0]} | {cells[1]} (dropped {sorted(drop)})"
        lines.append(f"| {dataset} | {m} | {len(v)} | {format_mean_se(v)} | {paired} |")
    return lines


def paired_difference(values: np.ndarray) -> str:
    """mean ± se (median), the two-sided 95 % Student-t interval of the mean, and the count of positive values."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return f"{values.mean():+.3f} (one split)" if n else "—"
    se = values.std(ddof=1) / math.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    return (f"{values.mean():+.3f} ± {se:.3f} (median {np.median(values):+.3f}), 95 % interval "
            f"[{values.mean() - half:+.3f}, {values.mean() + half:+.3f}], positive {int((values > 0).sum())}/{n}")


def dreg_minus_reg_lines(rows, preset) -> list[str]:
    """Per dataset: DREG − REG of the test log-likelihood and of the training bound per point, paired by split."""
    by = {}
    for r in rows:
        if r["model"] in PAIR and (preset is None or r.get("preset") == preset):
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


def _split_lines(table) -> tuple[list[str], dict]:
    """The per-split REG / DREG table and {dataset: {"reg": {split: ll}, "dreg": {split: ll}}} (standardised)."""
    lines = ["| dataset | split | REG (y units) | DREG (y units) | DREG − REG | REG (standardised) | DREG (standardised) |",
             "|---|---|---|---|---|---|---|"]
    per_dataset = {}
    for dataset in sorted(table):
        reg, dreg = table[dataset].get("ldgp2-reg", {}), table[dataset].get("ldgp2-dreg", {})
        for split in sorted(set(reg) & set(dreg)):
            d = per_dataset.setdefault(dataset, {"reg": {}, "dreg": {}})
            d["reg"][split], d["dreg"][split] = reg[split][1], dreg[split][1]
            lines.append(f"| {dataset} | {split} | {reg[split][0]:.3f} | {dreg[split][0]:.3f} | "
                         f"{dreg[split][0] - reg[split][0]:+.3f} | {reg[split][1]:.3f} | {dreg[split][1]:.3f} |")
    return lines, per_dataset


def _summary_lines(per_dataset) -> list[str]:
    lines = ["| dataset | splits used | n | REG (std.) mean ± se | DREG (std.) mean ± se | DREG − REG mean ± se | "
             "DREG wins | paper REG → DREG |", "|---|---|---|---|---|---|---|---|"]
    for dataset, d in per_dataset.items():
        splits = sorted(d["reg"])
        drop = outlier_splits(d)
        for label, use in (("all", splits), (f"outliers out {sorted(drop)}", [s for s in splits if s not in drop])):
            if use:
                lines.append(summary_line(dataset, label, np.array([d["reg"][s] for s in use]),
                                          np.array([d["dreg"][s] for s in use])))
    return lines


def _models_lines(rows, models, reference, preset, data_dir) -> list[str]:
    lines = [f"Every model on its own splits, and paired with {reference} on the splits both have "
             "(standardised test log-likelihood):", "",
             f"| dataset | model | n | mean ± se (median) | − {reference}, all common splits | "
             f"− {reference}, outliers out |", "|---|---|---|---|---|---|"]
    everything = collect(rows, models, preset, data_dir)
    for dataset in sorted(everything):
        lines += comparison_lines(dataset, everything[dataset], reference, models)
        paper = PAPER.get(dataset)
        if paper:
            lines.append(f"| {dataset} | paper Table 1 (20 splits, 300 000 iterations) | 20 | REG {paper[0]:.3f}, "
                         f"DREG {paper[1]:.3f} | | |")
    return lines


def table_lines(rows, preset=None, data_dir=None, models=None, reference="ldgp2-reg") -> list[str]:
    """Every table of the subcommand as markdown lines (see the module docstring)."""
    split_lines, per_dataset = _split_lines(collect(rows, PAIR, preset, data_dir))
    lines = split_lines + [""] + _summary_lines(per_dataset)
    if models:
        lines += [""] + _models_lines(rows, models, reference, preset, data_dir)
    return lines + ["", "DREG − REG paired by split (all splits both have):", "", "| dataset | quantity | DREG − REG |",
                    "|---|---|---|"] + dreg_minus_reg_lines(rows, preset)


def curve_rows(spec: str, preset) -> list[dict]:
    """The rows of a learning curve ('FILE:ITERATIONS') scored at exactly ITERATIONS, labelled with `preset`."""
    path, _, iterations = spec.rpartition(":")
    if not path or not iterations.isdigit():
        raise ValueError(f"--curve takes FILE:ITERATIONS, got {spec!r}")
    return [{**r, "preset": preset} for r in read_row_files([path]) if int(r["iterations"]) == int(iterations)]


# ----- a fit scored by the mean of its last scorings (learning-curve rows) ----------------------------------
def tail_scores(rows: list[dict], end: int, window: int) -> dict[tuple[str, int], list[float]]:
    """{(model, split): standardised test LLs of the rows with iterations in [end - window, end + window)} for the
    fits that reached `end`; a fit without a row at or beyond `end` is still running and is left out."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
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


# ----- the subcommand ---------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("rows", nargs="+", help="JSON-lines files of flowgp bench uci")
    parser.add_argument("--preset", default=None, help="only rows of this preset label (e.g. reference-e300)")
    parser.add_argument("--data-dir", default=None, help="data folder (default: FLOWGP_DATA or ../shared/data)")
    parser.add_argument("--models", default=None,
                        help="comma-separated models for a further table of every model against --reference "
                             "(e.g. ldgp2-reg,ldgp2-dreg,ldgp2-dreg-d23,svgp,dgp2)")
    parser.add_argument("--reference", default="ldgp2-reg", help="the model the --models table is paired against")
    parser.add_argument("--curve", action="append", default=[], metavar="FILE:ITERATIONS",
                        help="also take the rows of a learning curve (benchmarks/studies/ldgp_learning_curve.py) "
                             "scored at exactly ITERATIONS iterations, as if the bench had written them under --preset")
    parser.add_argument("--score", choices=("nll", "nll_kde"), default="nll",
                        help="the rows' test NLL to use: nll (supplement E.3) or nll_kde (the authors' public script)")


def run(args) -> int:
    rows = read_row_files(args.rows)
    if args.score != "nll":
        rows = [{**r, "nll": r[args.score]} for r in rows if args.score in r]
    for spec in args.curve:
        rows += curve_rows(spec, args.preset)
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    print("\n".join(table_lines(rows, args.preset, args.data_dir, models, args.reference)))
    return 0
