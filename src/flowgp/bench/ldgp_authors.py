"""`flowgp bench ldgp-authors`: Table 1 of the DREG supplement recomputed from the authors' per-split test
log-likelihoods, and paired by split with flowgp's fits.

The authors of the DREG paper published, with their code (github.com/timrudner/snr_issues_in_deep_gps, commit
3d4c3fd, `experiments/figure_data/table_1_tlls.txt`), the standardised test log-likelihood of every Table 1 fit:
20 splits per dataset, REG and DREG, each scored 10 times with 10 000 samples of z. Their `build_run_commands.py`
gives the protocol of those fits: configuration L1_G5 (two GP layers), K = 50 importance samples, minibatch 64,
300 000 iterations. `flowgp/bench/data/dreg_table1_per_split.csv` holds, per fit, the mean, min and max of its
10 scores (derived from that file for power and wine-red). Printed per dataset and estimator: the mean over
splits (what Table 1 reports), median, standard error, the supplement's outlier rule (splits more than 2 s.d.
from the mean dropped for REG and DREG alike) and DREG - REG paired by split.

    flowgp bench ldgp-authors
    flowgp bench ldgp-authors --ours RUN/uci.jsonl RUN/curve.jsonl --preset reference-e3334

A split's test points depend on the row order of the data file. flowgp's wine-red file is in the order of the
authors' download, so split k is theirs; the power file is not, so only power rows fitted in the authors' order
(`row_order: "authors"`: the bench's reference presets, or `--row-order authors` of the learning-curve study)
are paired with theirs.
`--outlying-rows Z` (needs the data) marks the rows of a dataset whose target lies more than Z robust s.d. from
the median target of its 10 nearest neighbours (standardised inputs, the whole file; robust s.d. = 1.4826 x the
median absolute residual), lists the splits whose test set holds one, and gives their means, the spread of their
10 scores and ours - theirs for the splits with and without such a row apart.
Rows of fits with another q(z) network (`encoder_skips`) are paired with theirs when chosen by
`--encoder-skips`, and with ours of the default (dense) network on the same splits.
"""
from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from .ldgp_tables import outlier_splits
from .report import mean_se
from .results import read_row_files
from .uci import load_split, row_order_of

NAME = "ldgp-authors"
HELP = "the DREG supplement's Table 1 from the authors' per-split scores, paired by split with flowgp's fits"

AUTHORS_CSV = Path(__file__).resolve().parent / "data" / "dreg_table1_per_split.csv"
SAME_ROW_ORDER = {"wine-red"}  # data files whose row order is the authors' download's
MODELS = {"reg": "ldgp2-reg", "dreg": "ldgp2-dreg"}


def read_authors(path=AUTHORS_CSV) -> tuple[dict, dict]:
    """({dataset: {estimator: {split: mean of their 10 scores}}}, {(dataset, estimator, split): max - min})."""
    table: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    spread: dict[tuple[str, str, int], float] = {}
    with open(path) as fh:
        for row in csv.DictReader(fh):
            key = (row["dataset"], row["estimator"], int(row["split"]))
            table[key[0]][key[1]][key[2]] = float(row["mean_of_10"])
            spread[key] = float(row["max_of_10"]) - float(row["min_of_10"])
    return table, spread


def ours(rows: list[dict], preset: str | None, iterations: int | None) -> dict:
    """{(dataset, estimator, split, encoder skips): standardised test LL} of the rows that hold the authors'
    split's points (rows trained with the per-slot hidden-layer draw left out: not flowgp's model)."""
    est_of = {m: e for e, m in MODELS.items()}
    out = {}
    for r in rows:
        if r.get("model") not in est_of or (preset is not None and r.get("preset", preset) != preset):
            continue
        if iterations is not None and r.get("iterations", iterations) != iterations:
            continue
        if r["dataset"] not in SAME_ROW_ORDER and row_order_of(r) != "authors":
            continue
        if r.get("draws", "joint") != "joint":
            continue
        value = r["test_ll_std"] if "test_ll_std" in r else -r["nll"] + math.log(r["y_scale"])
        out[(r["dataset"], est_of[r["model"]], int(r["split"]), r.get("encoder_skips", "dense"))] = value
    return out


def outlying_rows(x, y, threshold: float, neighbours: int = 10):
    """Boolean mask of the rows whose target is more than `threshold` robust standard deviations from the median
    target of their `neighbours` nearest rows in standardised input space (the row itself left out), and the
    robust z-scores: a point the regression surface around it does not explain, whatever the model."""
    import numpy as np
    from sklearn.neighbors import NearestNeighbors

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    xs = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)
    _, idx = NearestNeighbors(n_neighbors=neighbours + 1).fit(xs).kneighbors(xs)
    residual = y - np.median(y[idx[:, 1:]], axis=1)
    z = residual / (1.4826 * np.median(np.abs(residual)))
    return np.abs(z) > threshold, z


def splits_holding(dataset: str, splits: list[int], threshold: float, data_dir) -> tuple[dict[int, int], int]:
    """{split: number of outlying rows (`outlying_rows`) in its test set} for the authors' splits of `dataset`
    (their row order), and how many rows the file has that are outlying."""
    import numpy as np

    def split_of(k):
        order = "file" if dataset in SAME_ROW_ORDER else "authors"
        return load_split(dataset, k, data_dir, protocol="reference", row_order=order)

    first = split_of(splits[0])
    x = np.vstack([first.x_train, first.x_test])
    y = np.concatenate([np.ravel(first.y_train), np.ravel(first.y_test)])
    mask, _ = outlying_rows(x, y, threshold)
    flagged = {tuple(r) for r in np.column_stack([x, y])[mask]}
    counts = {}
    for k in splits:
        t = split_of(k)
        counts[k] = sum(tuple(r) in flagged for r in np.column_stack([t.x_test, np.ravel(t.y_test)]))
    return counts, int(mask.sum())


def summary(values: list[float]) -> tuple[float, float, float]:
    """Mean, median and standard error of the mean (the bench report's `mean_se`; NaN se for one value)."""
    mean, se, n = mean_se(values)
    return mean, statistics.median(values), se if n > 1 else float("nan")


def authors_lines(dataset: str, reg: dict, dreg: dict) -> list[str]:
    """Their REG and DREG over the splits both have: mean ± se (median), range, the outlier rule, DREG - REG."""
    splits = sorted(set(reg) & set(dreg))
    lines = [f"{dataset}: {len(splits)} splits ({','.join(map(str, splits))})"]
    for name, values in (("REG", reg), ("DREG", dreg)):
        mean, median, se = summary([values[s] for s in splits])
        lines.append(f"  {name:5s} mean {mean:+.3f} ± {se:.3f} (median {median:+.3f}), "
                     f"range {min(values.values()):+.3f} .. {max(values.values()):+.3f}")
    out = outlier_splits({"reg": {s: reg[s] for s in splits}, "dreg": {s: dreg[s] for s in splits}})
    keep = [s for s in splits if s not in out]
    lines.append(f"  outlier rule: drops {sorted(out)}; "
                 f"REG {summary([reg[s] for s in keep])[0]:+.3f}, DREG {summary([dreg[s] for s in keep])[0]:+.3f}")
    diff = [dreg[s] - reg[s] for s in splits]
    mean, _, se = summary(diff)
    lines.append(f"  DREG - REG {mean:+.3f} ± {se:.3f}, DREG ahead on {sum(d > 0 for d in diff)} of {len(diff)} splits")
    return lines


def paired_lines(dataset: str, name: str, theirs: dict, mine: dict) -> list[str]:
    """Ours against theirs on the splits both have (empty where none)."""
    common = sorted(s for s in theirs if (dataset, name, s) in mine)
    if not common:
        return []
    o = [mine[(dataset, name, s)] for s in common]
    mean, median, se = summary([a - theirs[s] for a, s in zip(o, common)])
    ahead = sum(a > theirs[s] for a, s in zip(o, common))
    return [f"  ours {MODELS[name]} on {len(common)} of their splits: {summary(o)[0]:+.3f} against their "
            f"{summary([theirs[s] for s in common])[0]:+.3f}; ours - theirs {mean:+.3f} ± {se:.3f} "
            f"(median {median:+.3f}), ours ahead on {ahead}",
            "    " + " ".join(f"{s}:{a:+.2f}/{theirs[s]:+.2f}" for s, a in zip(common, o))]


def outlying_lines(dataset: str, name: str, theirs: dict, mine: dict, spread: dict, holding: tuple,
                   threshold: float) -> list[str]:
    """Theirs, the range of their 10 scores and ours - theirs on the splits with an outlying test row and without
    (`holding`: `splits_holding`'s counts per split and number of outlying rows)."""
    counts, n_rows = holding
    lines = [f"    {n_rows} rows of {dataset} lie more than {threshold:g} robust s.d. from their neighbours' "
             f"median; test sets holding one: {[k for k, c in counts.items() if c]}"]
    for label, group in (("with", [k for k, c in counts.items() if c]),
                         ("without", [k for k, c in counts.items() if not c])):
        if not group:
            continue
        paired = [k for k in group if (dataset, name, k) in mine]
        line = (f"      {label:7s} ({len(group):2d} splits): theirs {summary([theirs[k] for k in group])[0]:+.3f}, "
                f"range of their 10 scores {statistics.median(spread[(dataset, name, k)] for k in group):.3f} "
                "(median)")
        if paired:
            mean, median, se = summary([mine[(dataset, name, k)] - theirs[k] for k in paired])
            line += f"; ours - theirs on {len(paired)}: {mean:+.3f} ± {se:.3f} (median {median:+.3f})"
        lines.append(line)
    return lines


def encoder_lines(dataset: str, name: str, skips: str, mine: dict, every: dict, theirs: dict) -> list[str]:
    """Ours with the `skips` q(z) network against ours with the dense one on the splits both have."""
    both = [s for s in sorted(theirs) if (dataset, name, s) in mine and (dataset, name, s, "dense") in every]
    if not both:
        return []
    mean, median, se = summary([mine[(dataset, name, s)] - every[(dataset, name, s, "dense")] for s in both])
    ahead = sum(mine[(dataset, name, s)] > every[(dataset, name, s, "dense")] for s in both)
    return [f"    {skips} − dense encoder on {len(both)} splits: {mean:+.4f} ± {se:.4f} "
            f"(median {median:+.4f}), {skips} ahead on {ahead}"]


def add_arguments(parser) -> None:
    parser.add_argument("--csv", default=str(AUTHORS_CSV), help="the authors' per-split scores (default: shipped)")
    parser.add_argument("--ours", nargs="*", default=[], help="our JSONL rows to pair with theirs by split")
    parser.add_argument("--preset", default=None, help="only our bench rows of this preset label")
    parser.add_argument("--iterations", type=int, default=None, help="only our curve rows at these iterations")
    parser.add_argument("--encoder-skips", default="dense", choices=("dense", "residual"),
                        help="pair theirs with our fits of this q(z) network (default dense, flowgp's)")
    parser.add_argument("--outlying-rows", type=float, default=None, metavar="Z",
                        help="also compare the splits whose test set holds a row more than Z robust s.d. from its "
                             "10 nearest neighbours' median target with the others (reads the data)")
    parser.add_argument("--data-dir", default=None, help="data folder (default: FLOWGP_DATA or ../shared/data)")


def run(args) -> int:
    every = ours(read_row_files(args.ours), args.preset, args.iterations)
    mine = {k[:3]: v for k, v in every.items() if k[3] == args.encoder_skips}
    table, spread = read_authors(args.csv)
    for dataset, by_est in table.items():
        lines = authors_lines(dataset, by_est["reg"], by_est["dreg"])
        holding = None  # the splits' outlying test rows, read once per dataset (REG and DREG share the splits)
        for name in ("reg", "dreg"):
            pair = paired_lines(dataset, name, by_est[name], mine)
            lines += pair
            if pair and args.outlying_rows is not None:
                if holding is None:
                    holding = splits_holding(dataset, sorted(set(by_est["reg"]) & set(by_est["dreg"])),
                                             args.outlying_rows, args.data_dir)
                lines += outlying_lines(dataset, name, by_est[name], mine, spread, holding, args.outlying_rows)
            if pair and args.encoder_skips != "dense":
                lines += encoder_lines(dataset, name, args.encoder_skips, mine, every, by_est[name])
        print("\n".join(lines))
    return 0
