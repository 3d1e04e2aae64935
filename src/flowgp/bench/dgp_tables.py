"""Deep-GP UCI tables for docs/results/dgp-uci-quick/README.md, over the splits every model finished.

    python benchmarks/dgp_uci_table.py docs/results/dgp-uci-quick/uci.jsonl [--readme docs/results/dgp-uci-quick/README.md]

`flowgp bench report` averages whatever rows exist; while a resumable run is part-way through, models have
different numbers of splits, so this script keeps, per dataset, only the splits that all the models finished
and prints: test log-likelihood (= -NLL, the CNF paper's Fig. 3 metric, higher is better) mean ± standard error,
the average rank per model across datasets (the paper's "ranking summary"), head-to-head split wins, and the
standardised training ELBO per point. It also prints which splits each model has finished (the coverage) and
the CNF paper's Table I comparison: boston's mean standardised training ELBO at 2-5 layers, DSVI and CNF, over
every split each model finished (Table I is a per-model average, so it does not need common splits).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from flowgp.bench.report import CNF_TABLE_I, mean_se, standardised_elbo

MODELS = ["svgp", "dgp2", "dgp3", "dgp4", "cnf-dgp2", "cnf-dgp3", "cnf-dgp4"]
PAIRS = [("dgp2", "svgp"), ("dgp3", "svgp"), ("cnf-dgp2", "svgp"), ("cnf-dgp2", "dgp2"), ("cnf-dgp3", "dgp3"),
         ("cnf-dgp4", "dgp4")]


def _ranges(splits) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], None
    for i, s in enumerate(splits):
        if start is None:
            start = s
        if i + 1 == len(splits) or splits[i + 1] != s + 1:
            out.append(f"{start}-{s}" if s != start else str(s))
            start = None
    return ", ".join(out)


def coverage(rows, models) -> list[str]:
    """Markdown: per dataset, the splits each model finished."""
    done = defaultdict(set)
    for r in rows:
        done[(r["dataset"], r["model"])].add(r["split"])
    present = {m for _, m in done}
    models = [m for m in models if m in present]
    lines = ["| dataset | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for d in sorted({d for d, _ in done}):
        lines.append(f"| {d} | " + " | ".join(_ranges(sorted(done[(d, m)])) or "—" for m in models) + " |")
    return lines


def table_one(rows) -> list[str]:
    """Markdown: boston's standardised training ELBO (mean ± s.e. over the splits run) per depth, DSVI and CNF,
    beside the CNF paper's Table I (NF / IPVI)."""
    lines = ["| layers | DSVI (dgpL) | n | CNF (cnf-dgpL) | n | paper NF | paper IPVI |", "|---|---|---|---|---|---|---|"]
    for depth, (nf, ipvi) in sorted(CNF_TABLE_I.items()):
        cells = []
        for model in (f"dgp{depth}", f"cnf-dgp{depth}"):
            vals = [standardised_elbo(r) for r in rows if r["dataset"] == "boston" and r["model"] == model]
            vals = [v for v in vals if v is not None]
            if vals:
                mean, se, n = mean_se(vals)
                cells += [f"{mean:.1f} ± {se:.1f}", str(n)]
            else:
                cells += ["—", "0"]
        lines.append(f"| {depth} | " + " | ".join(cells) + f" | {nf:.2f} | {ipvi:.2f} |")
    return lines


START, END = "<!-- dgp_uci_table:start -->", "<!-- dgp_uci_table:end -->"


def splice(path: Path, text: str) -> None:
    """Replace what lies between the START and END marker lines of the markdown file `path` by `text`."""
    doc = path.read_text()
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise ValueError(f"--readme {path}: needs one line {START} followed later by one line {END}")
    head, rest = doc.split(START)
    path.write_text(head + START + "\n\n" + text.strip() + "\n\n" + END + rest.split(END, 1)[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jsonl")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--readme", type=Path, default=None,
                   help="also write the tables into this markdown file, between its dgp_uci_table marker lines")
    a = p.parse_args()
    models = a.models.split(",")
    rows = [json.loads(line) for line in open(a.jsonl) if line.strip()]
    text = "\n".join(tables(rows, models)) + "\n"
    print(text, end="")
    if a.readme is not None:
        splice(a.readme, text)


def tables(rows, models) -> list[str]:
    """All the tables as markdown text pieces, to be joined with newlines (some hold several lines): what main
    prints and splices into --readme."""
    out: list[str] = []
    out.append("Splits finished per dataset and model:\n")
    out.append("\n".join(coverage(rows, models + [f"{k}5" for k in ("dgp", "cnf-dgp")])))
    out.append("\nCNF paper Table I: boston standardised training ELBO (elbo + n·log std y, nats), mean ± s.e. over "
               "the splits each model finished:\n")
    out.append("\n".join(table_one(rows)))
    out.append("")
    by = defaultdict(dict)  # (dataset, split) -> model -> row
    for r in rows:
        if r["model"] in models:
            by[(r["dataset"], r["split"])][r["model"]] = r
    datasets = sorted({d for d, _ in by})
    common = {d: sorted(s for (dd, s), ms in by.items() if dd == d and all(m in ms for m in models)) for d in datasets}
    out.append("Test log-likelihood (higher is better), mean ± s.e. over the splits all models finished:\n")
    out.append("| dataset | splits | " + " | ".join(models) + " |\n|---|---|" + "---|" * len(models))
    ranks = defaultdict(list)
    for d in datasets:
        if not common[d]:
            continue
        cells = {m: mean_se([-by[(d, s)][m]["nll"] for s in common[d]]) for m in models}
        best = max(cells, key=lambda m: cells[m][0])
        order = sorted(models, key=lambda m: -cells[m][0])
        for i, m in enumerate(order):
            ranks[m].append(i + 1)
        out.append(f"| {d} | {_ranges(common[d])} | " + " | ".join(
            (f"**{cells[m][0]:.3f} ± {cells[m][1]:.3f}**" if m == best else f"{cells[m][0]:.3f} ± {cells[m][1]:.3f}")
            for m in models) + " |")
    out.append("\nAverage rank across datasets (1 = best):\n")
    out.append("| " + " | ".join(models) + " |\n|" + "---|" * len(models))
    out.append("| " + " | ".join(f"{sum(ranks[m]) / len(ranks[m]):.2f}" if ranks[m] else "—" for m in models) + " |")
    out.append("\nSplit-by-split wins (first model has the higher test log-likelihood), all datasets:\n")
    out.append("| comparison | wins | mean difference (nats) |\n|---|---|---|")
    for m1, m2 in PAIRS:
        if m1 not in models or m2 not in models:
            continue
        diffs = [by[(d, s)][m2]["nll"] - by[(d, s)][m1]["nll"] for d in datasets for s in common[d]]
        if diffs:
            out.append(f"| {m1} vs {m2} | {sum(x > 0 for x in diffs)} / {len(diffs)} | {sum(diffs) / len(diffs):+.3f} |")
    out.append("\nTraining ELBO per point, standardised targets (elbo + n·log std y) / n, mean over the same splits:\n")
    out.append("| dataset | " + " | ".join(models) + " |\n|---|" + "---|" * len(models))
    for d in datasets:
        vals = {}
        for m in models:
            per_point = [standardised_elbo(r) / r["n_train"] for r in (by[(d, s)][m] for s in common[d])
                         if standardised_elbo(r) is not None]
            if per_point:
                vals[m] = sum(per_point) / len(per_point)
        if vals:
            out.append(f"| {d} | " + " | ".join(f"{vals[m]:+.3f}" if m in vals else "—" for m in models) + " |")

    return out



def side_by_side(new_path, baseline_path) -> list[str]:
    """Issue 20: per split, the new `cnf-dgpL` rows of `new_path` next to `dgpL` (DSVI) and the paper's CNF
    (`cnf-paper-dgpL`, or the pre-issue-20 `cnf-dgpL` rows of `baseline_path`, which are that design), for every
    (dataset, split, L) the new posterior finished. Columns: standardised training ELBO per point, test NLL."""
    def load(path):
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]

    new = load(new_path)
    base = load(baseline_path) if baseline_path else []
    index = {}
    for r in base:  # the baseline's cnf-dgpL rows are the paper's design
        name = r["model"].replace("cnf-dgp", "cnf-paper-dgp") if r["model"].startswith("cnf-dgp") else r["model"]
        index[(r["dataset"], r["split"], name)] = r
    for r in new:
        index[(r["dataset"], r["split"], r["model"])] = r
    per_point = lambda r: standardised_elbo(r) / r["n_train"]  # noqa: E731
    nll = lambda r: f"{r['nll']:.3f}"  # noqa: E731
    out = ["| dataset | split | L | ELBO dgp | ELBO cnf (new) | ELBO cnf-paper | NLL dgp | NLL cnf (new) | NLL cnf-paper |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(new, key=lambda r: (r["dataset"], r["model"], r["split"])):
        if not r["model"].startswith("cnf-dgp"):
            continue
        depth = r["model"][len("cnf-dgp"):]
        dsvi = index.get((r["dataset"], r["split"], f"dgp{depth}"))
        paper = index.get((r["dataset"], r["split"], f"cnf-paper-dgp{depth}"))
        cell = lambda row, f: "—" if row is None else f(row)  # noqa: E731
        out.append(f"| {r['dataset']} | {r['split']} | {depth} | {cell(dsvi, lambda x: f'{per_point(x):+.3f}')} | "
                   f"{per_point(r):+.3f} | {cell(paper, lambda x: f'{per_point(x):+.3f}')} | "
                   f"{cell(dsvi, nll)} | {r['nll']:.3f} | "
                   f"{cell(paper, nll)} |")
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--side-by-side":
        # python benchmarks/dgp_uci_table.py --side-by-side NEW.jsonl [BASELINE.jsonl]
        print("\n".join(side_by_side(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)))
    else:
        main()
