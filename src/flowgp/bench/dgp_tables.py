"""`flowgp bench dgp-table`: the deep-GP UCI tables of the CNF-DGP paper from `flowgp bench uci` rows.

    flowgp bench dgp-table RUN/uci.jsonl [--readme RUN/README.md]
    flowgp bench dgp-table NEW/uci.jsonl --side-by-side [--baseline OLD/uci.jsonl]

`flowgp bench report` averages whatever rows exist; while a resumable run is part-way through, models have
different numbers of splits, so these tables keep, per dataset, only the splits that all the models finished:
test log-likelihood (= -NLL, the CNF-DGP paper's Fig. 3 metric, higher is better) mean ± standard error, the
average rank per model across datasets (the paper's ranking summary), head-to-head split wins, and the
standardised training ELBO per point. Also printed: which splits each model has finished, and the paper's
Table I comparison (boston's mean standardised training ELBO at 2-5 layers, DSVI and CNF, over every split each
model finished; Table I is a per-model average, so it does not need common splits).
`--side-by-side` prints, per split, each `cnf-dgpL` row next to DSVI (`dgpL`) and the paper's CNF design
(`cnf-paper-dgpL`; the `cnf-dgpL` rows of `--baseline` count as that design).

The scorecard of the flow posterior against DSVI (`scorecard`: wins, ties and losses of the training bound, the
test log-likelihood's paired difference, ranks and a sign test) is the library half of
`benchmarks/studies/cnf_dgp_vs_dsvi.py`.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .report import CNF_TABLE_I, mean_se, standardised_elbo
from .results import read_row_files

NAME = "dgp-table"
HELP = "deep-GP UCI tables over the splits every model finished (CNF-DGP Fig. 3 metric, ranks, Table I)"

MODELS = ["svgp", "dgp2", "dgp3", "dgp4", "cnf-dgp2", "cnf-dgp3", "cnf-dgp4"]
PAIRS = [("dgp2", "svgp"), ("dgp3", "svgp"), ("cnf-dgp2", "svgp"), ("cnf-dgp2", "dgp2"), ("cnf-dgp3", "dgp3"),
         ("cnf-dgp4", "dgp4")]
#: the marker lines between which `--readme` writes the tables
START, END = "<!-- dgp_uci_table:start -->", "<!-- dgp_uci_table:end -->"


def split_ranges(splits) -> str:
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
        lines.append(f"| {d} | " + " | ".join(split_ranges(sorted(done[(d, m)])) or "—" for m in models) + " |")
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


def splice(path: Path, text: str) -> None:
    """Replace what lies between the START and END marker lines of the markdown file `path` by `text`."""
    doc = Path(path).read_text()
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise ValueError(f"--readme {path}: needs one line {START} followed later by one line {END}")
    head, rest = doc.split(START)
    Path(path).write_text(head + START + "\n\n" + text.strip() + "\n\n" + END + rest.split(END, 1)[1])


def _common_splits(rows, models):
    """({(dataset, split): {model: row}}, the datasets, {dataset: the splits every model finished})."""
    by = defaultdict(dict)
    for r in rows:
        if r["model"] in models:
            by[(r["dataset"], r["split"])][r["model"]] = r
    datasets = sorted({d for d, _ in by})
    common = {d: sorted(s for (dd, s), ms in by.items() if dd == d and all(m in ms for m in models)) for d in datasets}
    return by, datasets, common


def _test_ll_lines(by, datasets, common, models) -> list[str]:
    """The test log-likelihood table over common splits and the average rank of each model across datasets."""
    out = ["Test log-likelihood (higher is better), mean ± s.e. over the splits all models finished:\n",
           "| dataset | splits | " + " | ".join(models) + " |\n|---|---|" + "---|" * len(models)]
    ranks = defaultdict(list)
    for d in datasets:
        if not common[d]:
            continue
        cells = {m: mean_se([-by[(d, s)][m]["nll"] for s in common[d]]) for m in models}
        best = max(cells, key=lambda m: cells[m][0])
        for i, m in enumerate(sorted(models, key=lambda m: -cells[m][0])):
            ranks[m].append(i + 1)
        out.append(f"| {d} | {split_ranges(common[d])} | " + " | ".join(
            (f"**{cells[m][0]:.3f} ± {cells[m][1]:.3f}**" if m == best else f"{cells[m][0]:.3f} ± {cells[m][1]:.3f}")
            for m in models) + " |")
    out += ["\nAverage rank across datasets (1 = best):\n", "| " + " | ".join(models) + " |\n|" + "---|" * len(models),
            "| " + " | ".join(f"{sum(ranks[m]) / len(ranks[m]):.2f}" if ranks[m] else "—" for m in models) + " |"]
    return out


def _wins_and_elbo_lines(by, datasets, common, models) -> list[str]:
    """Split-by-split wins of the model pairs in PAIRS, and the standardised training ELBO per point."""
    out = ["\nSplit-by-split wins (first model has the higher test log-likelihood), all datasets:\n",
           "| comparison | wins | mean difference (nats) |\n|---|---|---|"]
    for m1, m2 in PAIRS:
        if m1 not in models or m2 not in models:
            continue
        diffs = [by[(d, s)][m2]["nll"] - by[(d, s)][m1]["nll"] for d in datasets for s in common[d]]
        if diffs:
            out.append(f"| {m1} vs {m2} | {sum(x > 0 for x in diffs)} / {len(diffs)} | {sum(diffs) / len(diffs):+.3f} |")
    out += ["\nTraining ELBO per point, standardised targets (elbo + n·log std y) / n, mean over the same splits:\n",
            "| dataset | " + " | ".join(models) + " |\n|---|" + "---|" * len(models)]
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


def tables(rows, models) -> list[str]:
    """All the tables as markdown text pieces, to be joined with newlines (some hold several lines): what the
    subcommand prints and splices into --readme."""
    out: list[str] = ["Splits finished per dataset and model:\n",
                      "\n".join(coverage(rows, models + [f"{k}5" for k in ("dgp", "cnf-dgp")])),
                      "\nCNF paper Table I: boston standardised training ELBO (elbo + n·log std y, nats), mean ± s.e. "
                      "over the splits each model finished:\n",
                      "\n".join(table_one(rows)), ""]
    by, datasets, common = _common_splits(rows, models)
    return out + _test_ll_lines(by, datasets, common, models) + _wins_and_elbo_lines(by, datasets, common, models)


def side_by_side(new, baseline=()) -> list[str]:
    """Per split, the `cnf-dgpL` rows of `new` next to `dgpL` (DSVI) and the paper's CNF (`cnf-paper-dgpL`, or
    the `cnf-dgpL` rows of `baseline`, which count as that design), for every (dataset, split, L) the new
    posterior finished. Columns: standardised training ELBO per point, test NLL."""
    index = {}
    for r in baseline:
        name = r["model"].replace("cnf-dgp", "cnf-paper-dgp") if r["model"].startswith("cnf-dgp") else r["model"]
        index[(r["dataset"], r["split"], name)] = r
    for r in new:
        index[(r["dataset"], r["split"], r["model"])] = r

    def elbo(row):
        return "—" if row is None else f"{standardised_elbo(row) / row['n_train']:+.3f}"

    def nll(row):
        return "—" if row is None else f"{row['nll']:.3f}"

    out = ["| dataset | split | L | ELBO dgp | ELBO cnf (new) | ELBO cnf-paper | NLL dgp | NLL cnf (new) | NLL cnf-paper |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(new, key=lambda r: (r["dataset"], r["model"], r["split"])):
        if not r["model"].startswith("cnf-dgp"):
            continue
        depth = r["model"][len("cnf-dgp"):]
        dsvi = index.get((r["dataset"], r["split"], f"dgp{depth}"))
        paper = index.get((r["dataset"], r["split"], f"cnf-paper-dgp{depth}"))
        out.append(f"| {r['dataset']} | {r['split']} | {depth} | {elbo(dsvi)} | {elbo(r)} | {elbo(paper)} | "
                   f"{nll(dsvi)} | {nll(r)} | {nll(paper)} |")
    return out


# ----- the flow posterior against DSVI (cnf-dgpL against dgpL on the same splits) ----------------------------
#: test-NLL differences (nats per test point) below this count as ties in the "clear" wins / losses columns
TIE_NATS = 1e-3
#: relative size of a difference that is floating-point rounding (the same rule as the training-ELBO tie)
ROUNDING = 1e-9


def pairs_by_key(rows):
    """{(L, set, split): {"cnf": row, "dsvi": row}} (later rows replace earlier ones)."""
    by_key = defaultdict(dict)
    for r in rows:
        model = r["model"]
        for prefix, name in (("cnf-dgp", "cnf"), ("dgp", "dsvi")):
            if model.startswith(prefix) and model[len(prefix):].isdigit():
                by_key[(int(model[len(prefix):]), r["dataset"], r["split"])][name] = r
    return by_key


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: P(a Binomial(wins + losses, 1/2) count at least as far from its mean as wins)."""
    n = wins + losses
    if n == 0:
        return 1.0
    low = min(wins, losses)
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def rank_by_test_nll(nll_cnf: float, nll_dsvi: float) -> float:
    """The flow's rank on one split by test NLL: 1 better, 2 worse, 1.5 a tie.

    A tie is a difference at rounding level (|difference| <= 1e-9 of the NLL). A flow kept at strength 0 is its
    DSVI base with the same parameters, and its predictive differs from the DSVI row's only by the order of the
    floating-point sums (about 1e-12 nats); ranking that as a win or a loss scores rounding, not the models.
    """
    if abs(nll_cnf - nll_dsvi) <= ROUNDING * max(1.0, abs(nll_dsvi)):
        return 1.5
    return 1.0 if nll_cnf < nll_dsvi else 2.0


def _depth_card(pairs) -> dict:
    """The scorecard entries of one depth's (cnf, dsvi) row pairs."""
    wins = ties = losses = 0
    gains, dll, rank_cnf, strengths = [], [], [], []
    for p in pairs:
        c, d = p["cnf"], p["dsvi"]
        diff = c["train_elbo"] - d["train_elbo"]
        tol = ROUNDING * abs(d["train_elbo"])
        wins += diff > tol
        ties += abs(diff) <= tol
        losses += diff < -tol
        gains.append(diff / c["n_train"])
        dll.append(d["nll"] - c["nll"])
        rank_cnf.append(rank_by_test_nll(c["nll"], d["nll"]))
        if c.get("flow_strength") is not None:
            strengths.append(c["flow_strength"])
    n = len(pairs)
    mean_dll = sum(dll) / n
    se_dll = math.sqrt(sum((v - mean_dll) ** 2 for v in dll) / (n - 1) / n) if n > 1 else math.nan
    ll_wins, ll_losses = sum(r == 1.0 for r in rank_cnf), sum(r == 2.0 for r in rank_cnf)
    # the same count with differences below TIE_NATS called ties: per-split differences that small are below
    # the S = 100 predictive's own noise (sd 0.003-0.005 nats)
    return {"splits": n, "wins": wins, "ties": ties, "losses": losses,
            "mean_gain_per_point": sum(gains) / n, "max_gain_per_point": max(gains),
            "mean_test_ll_difference": mean_dll, "rank_cnf": sum(rank_cnf) / n,
            "rank_dsvi": sum(3.0 - r for r in rank_cnf) / n, "test_ll_difference_se": se_dll,
            "test_ll_wins": ll_wins, "test_ll_losses": ll_losses, "sign_test_p": sign_test_p(ll_wins, ll_losses),
            "test_ll_clear_wins": sum(v > TIE_NATS for v in dll), "test_ll_clear_losses": sum(v < -TIE_NATS for v in dll),
            "flow_kept": sum(s > 0 for s in strengths), "datasets": sorted({p["cnf"]["dataset"] for p in pairs})}


def scorecard(rows) -> dict:
    """{L: the flow posterior (`cnf-dgpL`) against DSVI (`dgpL`) over the splits both finished}: wins, ties
    (|difference| <= 1e-9 of the bound: a flow kept at strength 0) and losses of the training ELBO, the mean and
    largest gain per point, the mean test log-likelihood difference with its paired standard error, each model's
    average rank by test NLL, the test-NLL wins and losses with the exact two-sided sign test, and those beyond
    TIE_NATS."""
    by_key = pairs_by_key(rows)
    out = {}
    for depth in sorted({k[0] for k in by_key}):
        pairs = [v for k, v in sorted(by_key.items()) if k[0] == depth and len(v) == 2]
        if pairs:
            out[depth] = _depth_card(pairs)
    return out


def scorecard_lines(card: dict) -> list[str]:
    """The scorecard as one markdown table, one line per depth."""
    lines = ["| L | splits | wins / ties / losses (training ELBO) | flow kept (λ* > 0) | mean / max gain per point | "
             "mean test LL cnf − DSVI (± s.e.) | average rank cnf / DSVI | test-LL wins / losses (sign test p) | "
             f"wins / losses beyond {TIE_NATS:g} nats |", "|---|---|---|---|---|---|---|---|---|"]
    for depth, c in card.items():
        lines.append(f"| {depth} | {c['splits']} | {c['wins']} / {c['ties']} / {c['losses']} | {c['flow_kept']} | "
                     f"{c['mean_gain_per_point']:+.5f} / {c['max_gain_per_point']:+.5f} | "
                     f"{c['mean_test_ll_difference']:+.4f} (± {c['test_ll_difference_se']:.4f}) | "
                     f"{c['rank_cnf']:.2f} / {c['rank_dsvi']:.2f} | "
                     f"{c['test_ll_wins']} / {c['test_ll_losses']} ({c['sign_test_p']:.2f}) | "
                     f"{c['test_ll_clear_wins']} / {c['test_ll_clear_losses']} |")
    return lines


def per_split_lines(rows) -> list[str]:
    """One markdown line per (cnf, dsvi) pair: DSVI's training ELBO per point on standardised targets, the flow's
    gain, the kept (source, λ*) and both test NLLs."""
    lines = ["| L | set | split | DSVI ELBO/N | cnf − DSVI ELBO/N | flow kept (source, λ*) | test NLL DSVI / cnf |",
             "|---|---|---|---|---|---|---|"]
    for (depth, dataset, split), pair in sorted(pairs_by_key(rows).items()):
        if len(pair) != 2:
            continue
        d, c = pair["dsvi"], pair["cnf"]
        n = d["n_train"]
        standardised = (d["train_elbo"] + n * math.log(d["y_scale"])) / n
        lines.append(f"| {depth} | {dataset} | {split} | {standardised:+.4f} | "
                     f"{(c['train_elbo'] - d['train_elbo']) / n:+.5f} | {c.get('flow_source')}, "
                     f"{c.get('flow_strength')} | {d['nll']:.4f} / {c['nll']:.4f} |")
    return lines


def refit_summary(rows, refits, rel=1e-6) -> str:
    """How refitted cnf rows compare with the rows they replace (same model, set and split): unchanged (same kept
    strength and source, NLL and ELBO within `rel`), changed (listed), or without an earlier row."""
    old = {(r["model"], r["dataset"], r["split"]): r for r in rows}
    same, changed, new = 0, [], 0
    for r in refits:
        o = old.get((r["model"], r["dataset"], r["split"]))
        if o is None:
            new += 1
            continue
        moved = (r.get("flow_strength") != o.get("flow_strength") or r.get("flow_source") != o.get("flow_source")
                 or abs(r["nll"] - o["nll"]) > rel * abs(o["nll"])
                 or abs(r["train_elbo"] - o["train_elbo"]) > rel * abs(o["train_elbo"]))
        if moved:
            changed.append(f"{r['model']} {r['dataset']} {r['split']}: λ* {o.get('flow_strength')} → "
                           f"{r.get('flow_strength')} ({o.get('flow_source')} → {r.get('flow_source')}), test NLL "
                           f"{o['nll']:.6f} → {r['nll']:.6f}")
        else:
            same += 1
    lines = [f"Refitted rows: {len(refits)}; unchanged (same kept strength and source, NLL and ELBO within "
             f"{rel:g} relative): {same}; changed: {len(changed)}; without an earlier row: {new}"]
    return "\n".join(lines + ["  " + c for c in changed]) + "\n"


# ----- the subcommand ---------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("rows", nargs="+", help="JSON-lines files of `flowgp bench uci` (read as one)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models of the tables")
    parser.add_argument("--readme", type=Path, default=None,
                        help="also write the tables into this markdown file, between its lines "
                             f"{START} and {END}")
    parser.add_argument("--side-by-side", action="store_true",
                        help="instead: per split, each cnf-dgpL row next to dgpL and the paper's CNF design")
    parser.add_argument("--baseline", nargs="*", default=[],
                        help="with --side-by-side: rows whose cnf-dgpL models are the paper's CNF design")


def run(args) -> int:
    rows = read_row_files(args.rows)
    if args.side_by_side:
        if args.readme is not None:
            raise ValueError("--readme takes the tables, not --side-by-side; drop one of them")
        print("\n".join(side_by_side(rows, read_row_files(args.baseline))))
        return 0
    if args.readme is not None and not args.readme.is_file():
        raise FileNotFoundError(f"--readme {args.readme} does not exist (it must hold the marker lines)")
    text = "\n".join(tables(rows, [m for m in args.models.split(",") if m])) + "\n"
    print(text, end="")
    if args.readme is not None:
        splice(args.readme, text)
    return 0

