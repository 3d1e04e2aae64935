"""Table 1 of the DREG supplement recomputed from the authors' per-split test log-likelihoods (issue 25).

The authors of the DREG paper published, with their code (github.com/timrudner/snr_issues_in_deep_gps, commit
3d4c3fd, `experiments/figure_data/table_1_tlls.txt`), the standardised test log-likelihood of every Table 1 fit:
20 splits per dataset, REG and DREG, each scored 10 times with 10 000 samples of z. Their `build_run_commands.py`
gives the protocol of those fits: configuration L1_G5 (two GP layers), K = 50 importance samples, minibatch 64,
300 000 iterations. docs/results/ldgp-uci-reference/authors-table1/per_split.csv holds, per fit, the mean, min
and max of its 10 scores (derived by us from that file for power and wine-red). This script prints, per dataset
and estimator, the mean over splits (what Table 1 reports), median, standard error, the supplement's outlier rule
(splits more than 2 s.d. from the mean dropped for REG and DREG alike) and DREG - REG paired by split.

    python benchmarks/ldgp_authors_table1.py
    # paired with our fits on the same splits (rows of `flowgp bench uci` or of ldgp_learning_curve.py)
    python benchmarks/ldgp_authors_table1.py --ours R/uci.jsonl R/splits-5-19/uci.jsonl --preset reference-e3334

A split's test points depend on the row order of the data file. Our wine-red file is in the order of the authors'
download, so our split k is theirs; our power file is not, so only power rows fitted in the authors' order
(`row_order: "authors"`: ldgp_learning_curve.py `--row-order authors`, or the bench's reference presets) are
paired with theirs.
`--outlying-rows Z` (needs the data: FLOWGP_DATA or `--data-dir`) marks the rows of a dataset whose target lies
more than Z robust s.d. from the median target of its 10 nearest neighbours (standardised inputs, the whole file;
robust s.d. = 1.4826 x the median absolute residual), lists the splits whose test set holds one, and gives their
means, the spread of their 10 scores and ours - theirs for the splits with and without such a row apart.
Rows of fits with another q(z) network (`encoder_skips`, ldgp_learning_curve.py `--encoder-skips`) are paired with
theirs when chosen by `--encoder-skips`, and with ours of the default (dense) network on the same splits.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
from collections import defaultdict
from pathlib import Path

from flowgp.bench.report import mean_se
from flowgp.bench.uci import row_order_of
from ldgp_reg_vs_dreg import outlier_splits  # the supplement's rule as our own tables apply it (s.d. with ddof 1)

DEFAULT = Path(__file__).resolve().parents[1] / "docs/results/ldgp-uci-reference/authors-table1/per_split.csv"
SAME_ROW_ORDER = {"wine-red"}  # data files whose row order is the authors' download's
MODELS = {"reg": "ldgp2-reg", "dreg": "ldgp2-dreg"}


def _ours(paths: list[str], preset: str | None, iterations: int | None) -> dict:
    """{(dataset, estimator, split, encoder skips): standardised test LL} of our rows that hold the authors'
    split's points (rows trained with the per-slot draw of `--draws per-slot` left out)."""
    est_of = {m: e for e, m in MODELS.items()}
    out = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("model") not in est_of or (preset is not None and r.get("preset", preset) != preset):
                continue
            if iterations is not None and r.get("iterations", iterations) != iterations:
                continue
            if r["dataset"] not in SAME_ROW_ORDER and row_order_of(r) != "authors":
                continue
            if r.get("draws", "joint") != "joint":  # the per-slot ablation (ldgp_learning_curve.py --draws) is not ours
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


def _splits_holding(dataset: str, splits: list[int], threshold: float, data_dir) -> tuple[dict[int, int], int]:
    """{split: number of outlying rows (`outlying_rows`) in its test set} for the authors' splits of `dataset`
    (their row order), and how many rows the file has that are outlying."""
    import numpy as np

    from flowgp.bench.uci import load_split

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


def _stats(values: list[float]) -> tuple[float, float, float]:
    """Mean, median and standard error of the mean (the bench report's `mean_se`; NaN se for one value)."""
    mean, se, n = mean_se(values)
    return mean, statistics.median(values), se if n > 1 else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(DEFAULT))
    parser.add_argument("--ours", nargs="*", default=[], help="our JSONL rows to pair with theirs by split")
    parser.add_argument("--preset", default=None, help="only our bench rows of this preset label")
    parser.add_argument("--iterations", type=int, default=None, help="only our curve rows at these iterations")
    parser.add_argument("--encoder-skips", default="dense", choices=("dense", "residual"),
                        help="pair theirs with our fits of this q(z) network (default dense, flowgp's)")
    parser.add_argument("--outlying-rows", type=float, default=None, metavar="Z",
                        help="also compare the splits whose test set holds a row more than Z robust s.d. from its "
                             "10 nearest neighbours' median target with the others (reads the data)")
    parser.add_argument("--data-dir", default=os.environ.get("FLOWGP_DATA"))
    args = parser.parse_args(argv)
    every = _ours(args.ours, args.preset, args.iterations)
    ours = {k[:3]: v for k, v in every.items() if k[3] == args.encoder_skips}
    table: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    spread: dict[tuple[str, str, int], float] = {}
    with open(args.csv) as fh:
        for row in csv.DictReader(fh):
            table[row["dataset"]][row["estimator"]][int(row["split"])] = float(row["mean_of_10"])
            spread[(row["dataset"], row["estimator"], int(row["split"]))] = (float(row["max_of_10"])
                                                                             - float(row["min_of_10"]))
    for dataset, by_est in table.items():
        reg, dreg = by_est["reg"], by_est["dreg"]
        splits = sorted(set(reg) & set(dreg))
        print(f"{dataset}: {len(splits)} splits ({','.join(map(str, splits))})")
        for name, values in (("REG", reg), ("DREG", dreg)):
            mean, median, se = _stats([values[s] for s in splits])
            print(f"  {name:5s} mean {mean:+.3f} ± {se:.3f} (median {median:+.3f}), "
                  f"range {min(values.values()):+.3f} .. {max(values.values()):+.3f}")
        out = outlier_splits({"reg": {s: reg[s] for s in splits}, "dreg": {s: dreg[s] for s in splits}})
        keep = [s for s in splits if s not in out]
        print(f"  outlier rule: drops {sorted(out)}; "
              f"REG {_stats([reg[s] for s in keep])[0]:+.3f}, DREG {_stats([dreg[s] for s in keep])[0]:+.3f}")
        diff = [dreg[s] - reg[s] for s in splits]
        mean, _, se = _stats(diff)
        print(f"  DREG - REG {mean:+.3f} ± {se:.3f}, DREG ahead on {sum(d > 0 for d in diff)} of {len(diff)} splits")
        holding = None  # the splits' outlying test rows, read once per dataset (REG and DREG share the splits)
        for name, theirs in (("reg", reg), ("dreg", dreg)):
            common = sorted(s for s in theirs if (dataset, name, s) in ours)
            if not common:
                continue
            o = [ours[(dataset, name, s)] for s in common]
            d = [a - theirs[s] for a, s in zip(o, common)]
            mean, median, se = _stats(d)
            print(f"  ours {MODELS[name]} on {len(common)} of their splits: {_stats(o)[0]:+.3f} against their "
                  f"{_stats([theirs[s] for s in common])[0]:+.3f}; ours - theirs {mean:+.3f} ± {se:.3f} "
                  f"(median {median:+.3f}), ours ahead on {sum(v > 0 for v in d)}")
            print("    " + " ".join(f"{s}:{a:+.2f}/{theirs[s]:+.2f}" for s, a in zip(common, o)))
            if args.outlying_rows is not None:
                if holding is None:
                    holding = _splits_holding(dataset, splits, args.outlying_rows, args.data_dir)
                _by_outlying_rows(dataset, name, theirs, ours, spread, holding, args.outlying_rows)
            if args.encoder_skips != "dense":
                both = [s for s in common if (dataset, name, s, "dense") in every]
                if both:
                    d = [ours[(dataset, name, s)] - every[(dataset, name, s, "dense")] for s in both]
                    mean, median, se = _stats(d)
                    print(f"    {args.encoder_skips} − dense encoder on {len(both)} splits: {mean:+.4f} ± {se:.4f} "
                          f"(median {median:+.4f}), {args.encoder_skips} ahead on {sum(v > 0 for v in d)}")
    return 0


def _by_outlying_rows(dataset: str, name: str, theirs: dict, ours: dict, spread: dict, holding: tuple,
                      threshold: float) -> None:
    """Theirs, the range of their 10 scores and ours - theirs on the splits with an outlying test row and without
    (`holding`: `_splits_holding`'s counts per split and number of outlying rows)."""
    counts, n_rows = holding
    print(f"    {n_rows} rows of {dataset} lie more than {threshold:g} robust s.d. from their neighbours' "
          f"median; test sets holding one: {[k for k, c in counts.items() if c]}")
    for label, group in (("with", [k for k, c in counts.items() if c]), ("without", [k for k, c in counts.items()
                                                                                        if not c])):
        if not group:
            continue
        paired = [k for k in group if (dataset, name, k) in ours]
        line = (f"      {label:7s} ({len(group):2d} splits): theirs {_stats([theirs[k] for k in group])[0]:+.3f}, "
                f"range of their 10 scores {statistics.median(spread[(dataset, name, k)] for k in group):.3f} "
                "(median)")
        if paired:
            mean, median, se = _stats([ours[(dataset, name, k)] - theirs[k] for k in paired])
            line += f"; ours - theirs on {len(paired)}: {mean:+.3f} ± {se:.3f} (median {median:+.3f})"
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
