"""The tables of the "Reproducing the papers" page, computed from the result rows under docs/results.

Each table function returns (header, rows of cells) and puts ours next to the published value with the same
columns wherever the rows and the paper allow: ours as mean ± standard error (n runs or splits), the published
value, the difference in standard errors and the budget ratio (our training budget over the paper's). All the
arithmetic goes through `flowgp.reporting.comparison` (`mean_se`, `difference_in_se`), the helper `compare`
below builds the three comparison cells, and `budget_ratio` the last one. The difference uses the combined
standard error where the paper gives a spread and ours alone where it gives none; the header says which.

A result folder that a table needs is read with `rows` (missing: an error, the page warns); one that is still
being produced with `optional_rows` (missing: its cells say "not run yet"). No Sphinx here, so that the tests can
import this module without the documentation's dependencies.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from flowgp.reporting.comparison import (difference_in_se, inducing_claim, inducing_claim_counts,
                                         inducing_summary, mean_se, ordering)

RESULTS = Path(__file__).resolve().parents[1] / "results"
NOT_RUN = "not run yet"
NO_DATA = "data not available here"
#: the header of a difference column, by what its standard error combines
DIFF_COMBINED = "difference / combined s.e."
DIFF_OURS = "difference / our s.e. (no published spread)"
DIFF_MIXED = "difference / s.e. (combined where the paper gives a spread, else ours)"


# ----- reading rows -------------------------------------------------------------------------------------------
def _files(p: str) -> list[Path]:
    path = RESULTS / p
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return [f for f in files if f.exists() and not f.name.endswith(".errors.jsonl")]


def rows(*paths: str, unique: bool = True) -> list[dict]:
    """The rows of these result files or folders (folders: every *.jsonl in them). `unique`: rows repeating an
    earlier row's identity (`flowgp.bench.report.row_identity`) dropped; give False for rows of a study whose
    settings are not key fields of the bench (they would all look alike)."""
    from flowgp.bench.report import deduplicate
    from flowgp.bench.results import read_rows

    out = []
    for p in paths:
        files = _files(p)
        if not files:
            raise FileNotFoundError(f"docs/results/{p} has no result rows")
        for f in files:
            out += [r for r in read_rows(f) if isinstance(r, dict)]
    return deduplicate(out)[0] if unique else out


def optional_rows(*paths: str) -> list[dict]:
    """Like `rows`, for results still being produced: paths without rows are skipped."""
    present = [p for p in paths if _files(p)]
    return rows(*present) if present else []


def steps(row: dict) -> int:
    """Training steps of a row: epochs × ⌈n_train / batch size⌉ (the training loop's last batch of an epoch may
    be short, and is a step)."""
    return int(row["epochs"]) * math.ceil(int(row["n_train"]) / int(row["batch_size"]))


# ----- cells --------------------------------------------------------------------------------------------------
def fmt(mean: float | None, se: float | None = None, digits: int = 3) -> str:
    if mean is None or not math.isfinite(mean):
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None and math.isfinite(se) else "")


def estimate_cell(estimate: tuple, digits: int = 3) -> str:
    """"mean ± s.e. (n)" of a `mean_se` result; NOT_RUN for n = 0."""
    mean, se, n = estimate
    return f"{fmt(mean, se, digits)} ({n})" if n else NOT_RUN


def compare(values, published: float | None, published_se: float | None = None, digits: int = 3,
            published_text: str | None = None) -> list[str]:
    """The three cells every side-by-side table shows: ours (mean ± s.e. (n) of `values`, one per run or
    split), the published value (± its standard error when given; `published_text` replaces the cell), and the
    difference in standard errors (`difference_in_se`: combined s.e., or ours alone without a published one)."""
    ours = mean_se(values)
    paper = published_text if published_text is not None else (
        "not published" if published is None else fmt(published, published_se, digits))
    gap = float("nan") if published is None else difference_in_se(ours[0], ours[1], published, published_se)
    return [estimate_cell(ours, digits), paper, f"{gap:+.1f}" if math.isfinite(gap) else "—"]


def budget_ratio(ours, theirs: float) -> str:
    """Our budget over the paper's (epochs, steps or iterations, as the paper counts them); several budgets of
    ours (e.g. per data set) give their range."""
    values = sorted({float(v) / theirs for v in ([ours] if isinstance(ours, (int, float)) else ours)})
    if not values:
        return "—"
    return f"{values[0]:.2g}" if len(values) == 1 else f"{values[0]:.2g}-{values[-1]:.2g}"


def difference_header(published_ses) -> str:
    """DIFF_COMBINED if every published value has a spread, DIFF_OURS if none has, else DIFF_MIXED."""
    given = {se is not None for se in published_ses}
    return DIFF_COMBINED if given == {True} else DIFF_OURS if given == {False} else DIFF_MIXED


# ----- TGP paper ----------------------------------------------------------------------------------------------
#: epochs of the TGP appendix per data set (B.5: air quality 10 000, rainfall 20 000; B.6: UCI 15 000)
TGP_EPOCHS = {"airquality": 10000, "rainfall": 20000}
TGP_UCI_EPOCHS = 15000


def _epochs_by_size(rs) -> dict:
    """{(dataset, inducing fraction or M): {epochs}} of application and UCI rows."""
    out = defaultdict(set)
    for r in rs:
        size = r.get("inducing_fraction", r.get("num_inducing"))
        if size is not None and r.get("epochs") is not None:
            out[(r["dataset"], round(float(size), 6))].add(int(r["epochs"]))
    return out


def paper_comparison_table(folders, datasets):
    """Ours against the TGP appendix's published numbers (``flowgp.bench.report.paper_comparison``); a published
    std over the paper's runs is turned into a standard error (÷ √runs)."""
    from flowgp.bench.report import PAPER_RUNS, paper_comparison

    rs = rows(*folders)
    epochs, table, ses = _epochs_by_size(rs), [], []
    for c in paper_comparison(rs):
        if c["dataset"] not in datasets:
            continue
        p_se = c["paper_std"] / math.sqrt(PAPER_RUNS[c["dataset"]]) if c["paper_std"] is not None else None
        ses.append(p_se)
        gap = difference_in_se(c["ours_mean"], c["ours_se"], c["paper_mean"], p_se)
        paper = fmt(c["paper_mean"], c["paper_std"]) + (" (std)" if c["paper_std"] is not None else "")
        scheme = "" if c["scheme"] is None else ("joint" if c["scheme"] == 0 else f"noise fixed {c['scheme']:g}")
        ratio = budget_ratio(epochs[(c["dataset"], round(float(c["size"]), 6))],
                             TGP_EPOCHS.get(c["dataset"], TGP_UCI_EPOCHS))
        table.append([c["dataset"], c["model"], c["flow"], f"{c['size']:g}", scheme, c["metric"].upper(),
                      f"{fmt(c['ours_mean'], c['ours_se'])} ({c['n']})", paper,
                      f"{gap:+.1f}" if math.isfinite(gap) else "—", ratio, c["source"]])
    header = ["data", "model", "flow", "M or fraction", "scheme", "metric", "ours: mean ± s.e. (n)", "paper",
              difference_header(ses), "budget ratio (epochs)", "source"]
    return header, table


def rainfall_table(folder):
    """Rainfall RMSE per model, flow and noise scheme beside Table 4 (right), which is at M = N."""
    from flowgp.bench.report import PAPER_REFERENCE, PAPER_RUNS, mean_std

    published = {(model, flow): (mean, std) for ds, model, flow, _size, metric, mean, std, _src in PAPER_REFERENCE
                 if ds == "rainfall" and metric == "rmse"}
    groups, epochs = defaultdict(list), defaultdict(set)
    for r in rows(folder):
        if r.get("dataset") == "rainfall" and "rmse" in r:
            flow = f"{r['flow']}:{r.get('flow_init', 'identity')}" if r.get("flow") else None
            key = (r["model"], flow, r.get("inducing_fraction"), r.get("fix_noise_fraction"))
            groups[key].append(r["rmse"])
            epochs[key].add(r["epochs"])
    header = ["model", "flow:init", "inducing fraction", "scheme", "ours RMSE: mean ± s.e. (n)", "paper (M = N), std",
              DIFF_COMBINED, "gap / paper std", "budget ratio (epochs)"]
    table = []
    for key, values in sorted(groups.items(), key=str):
        model, flow, frac, scheme = key
        ref = published.get((model, flow)) or (published.get((model, None)) if model == "svgp" else None)
        ours = compare(values, ref[0] if ref else None, ref[1] / math.sqrt(PAPER_RUNS["rainfall"]) if ref else None,
                       digits=1, published_text=fmt(*ref, 1) if ref else None)
        gap_std = f"{(mean_std(values)[0] - ref[0]) / ref[1]:+.1f}" if ref else "—"
        table.append([model, flow if model != "svgp" else "—", f"{frac:g}",
                      "joint" if not scheme else f"noise fixed {scheme:g}", *ours, gap_std,
                      budget_ratio(epochs[key], TGP_EPOCHS["rainfall"])])
    return header, table


def uci_rank_table(folder, models):
    """Mean NLL per UCI set and model and the average NLL rank (the paper's Figs. 8 and appendix 5-7 are plots)."""
    from flowgp.bench.report import benchmark_summary, rankings

    rs = [r for r in rows(folder) if r.get("model") in models]
    summary, epochs = benchmark_summary(rs), _epochs_by_size(rs)
    header, table = ["data", "M"] + list(models) + ["budget ratio (epochs)"], []
    for (preset, task), t in sorted(summary.items()):
        for (ds, m) in sorted(t):
            cells = t[(ds, m)]
            table.append([ds, str(m)] + [fmt(*cells[mod]["nll"][:2]) if mod in cells else "—" for mod in models]
                         + [budget_ratio(epochs[(ds, float(m))], TGP_UCI_EPOCHS)])
        for m, ranks in sorted(rankings(t, "nll").items()):
            table.append(["**mean NLL rank**", str(m)] + [f"{ranks[mod][0]:.2f}" if mod in ranks else "—"
                                                          for mod in models] + [""])
    return header, table


#: TGP paper, Fig. 11: 100 runs of 1 200 epochs on energy
TGP_TIMING_EPOCHS = 1200


def timing_table(folder):
    from flowgp.bench.timing import summarise

    rs = rows(folder)
    epochs = {m: {r["epochs"] for r in rs if r["model"] == m} for m in {r["model"] for r in rs}}
    header = ["model", "repeats", "train median (s)", "ratio", "predict median (s)", "ratio",
              "budget ratio (epochs)"]
    table = [[s["model"], str(s["repeats"]), f"{s['train_median_s']:.2f}", f"{s['train_ratio']:.2f}",
              f"{s['predict_median_s']:.4f}", f"{s['predict_ratio']:.2f}",
              budget_ratio(epochs[s["model"]], TGP_TIMING_EPOCHS)] for s in summarise(rs)]
    return header, table


def classification_table(path):
    rs = rows(path)
    config = next((r["config"] for r in rs if "config" in r), {})
    groups = defaultdict(list)
    for r in rs:
        if "method" in r:
            groups[(r["dataset"], r["method"])].append(r)
    ratio = budget_ratio(config["epochs"], TGP_UCI_EPOCHS) if "epochs" in config else "—"
    header = ["data", "method", "n", "accuracy", "test NLL", "budget ratio (epochs)"]
    table = [[ds, method, str(len(g)), fmt(*mean_se(r["accuracy"] for r in g)[:2]),
              fmt(*mean_se(r["nll"] for r in g)[:2]), ratio] for (ds, method), g in groups.items()]
    return header, table


def dgp_uci_table(folders, models):
    """Mean test log-likelihood (original units, higher is better) per UCI set and model."""
    groups, epochs = defaultdict(list), defaultdict(set)
    for r in rows(*folders):
        if r.get("preset") == "quick" and r.get("num_inducing") == 100:
            groups[(r["dataset"], r["model"])].append(-r["nll"])
            epochs[r["dataset"]].add(r["epochs"])
    header = ["data"] + models + ["budget ratio (epochs)"]
    datasets = sorted({ds for ds, m in groups if m in models and m.startswith("dgp")})
    table = [[ds] + [fmt(*mean_se(groups[(ds, m)])[:2], digits=2) if groups.get((ds, m)) else "—" for m in models]
             + [budget_ratio(epochs[ds], TGP_UCI_EPOCHS)] for ds in datasets]
    return header, table


def inducing_claim_table(path):
    """The abstract's claim (5 inducing points and an input-dependent flow against the SVGP with 100), per data
    set: the M = 5 models' test NLL next to the SVGP's at M = 100, the difference in combined standard errors,
    whether the claim holds (`flowgp.reporting.comparison.inducing_claim`) and the count over the data sets."""
    summary = inducing_summary(rows(path))
    claim = inducing_claim(summary)
    header = ["data", "SVGP M = 100: NLL ± s.e. (splits)", "BA-TGP M = 5", DIFF_COMBINED, "holds",
              "PE-TGP M = 5", DIFF_COMBINED, "holds", "budget ratio (epochs)"]
    table = []
    for r in claim:
        ds = r["dataset"]
        cells = [ds, f"{fmt(r['svgp_m100_nll'], r['svgp_m100_se'])} ({r['svgp_splits']})"]
        for model in ("ba-tgp", "pe-tgp"):
            if f"{model}_holds" not in r:
                cells += [NOT_RUN, "—", ""]
                continue
            gap = difference_in_se(r[f"{model}_m5_nll"], r[f"{model}_m5_se"], r["svgp_m100_nll"], r["svgp_m100_se"])
            cells += [f"{fmt(r[f'{model}_m5_nll'], r[f'{model}_m5_se'])} ({r[f'{model}_splits']})",
                      f"{gap:+.1f}" if math.isfinite(gap) else "—", "yes" if r[f"{model}_holds"] else "no"]
        epochs = [e for (d, _m, _k), s in summary.items() if d == ds for e in s["epochs"]]
        table.append(cells + [budget_ratio(epochs, TGP_UCI_EPOCHS)])
    counts = inducing_claim_counts(claim)
    table.append(["**holds on**", "", "", "", f"{counts['ba-tgp'][0]} of {counts['ba-tgp'][1]}", "", "",
                  f"{counts['pe-tgp'][0]} of {counts['pe-tgp'][1]}", ""])
    return header, table


# ----- CNF-DGP paper ------------------------------------------------------------------------------------------
def cnf_table_i(folder):
    from flowgp.bench.report import CNF_TABLE_I, standardised_elbo

    groups = defaultdict(list)
    for r in rows(folder):
        if r.get("dataset") == "boston" and standardised_elbo(r) is not None:
            groups[r["model"]].append(standardised_elbo(r))
    header = ["depth", "ours DSVI (n)", "ours CNF (n)", "paper NF", "paper IPVI"]
    table = []
    for depth, (nf, ipvi) in sorted(CNF_TABLE_I.items()):
        dsvi, cnf = mean_se(groups.get(f"dgp{depth}", [])), mean_se(groups.get(f"cnf-dgp{depth}", []))
        table.append([str(depth), f"{fmt(dsvi[0], None, 1)} ({dsvi[2]})", f"{fmt(cnf[0], None, 1)} ({cnf[2]})",
                      f"{nf:.2f}", f"{ipvi:.2f}"])
    return header, table


DEPTHS = (2, 3, 4, 5)


def _by_depth(rs, family: str = "dgp") -> dict:
    """{depth: {split: standardised training ELBO}} of the rows of `family`L models (dgp2 ... dgp5)."""
    from flowgp.bench.report import standardised_elbo

    out = defaultdict(dict)
    for r in rs:
        for d in DEPTHS:
            if r.get("model") == f"{family}{d}" and standardised_elbo(r) is not None:
                out[d].setdefault(r["split"], standardised_elbo(r))
    return dict(out)


def _trend_cells(by_depth: dict) -> list[str]:
    """L = 2 ... 5 as mean ± s.e. (splits), the ordering of the means, and deepest − shallowest paired by split."""
    cells, means = [], {}
    for d in DEPTHS:
        est = mean_se(by_depth.get(d, {}).values())
        cells.append(estimate_cell(est, 1) if est[2] else "—")
        if est[2]:
            means[d] = est[0]
    lo, hi = min(means), max(means)
    paired = sorted(set(by_depth[lo]) & set(by_depth[hi]))
    change = mean_se(by_depth[hi][k] - by_depth[lo][k] for k in paired)
    spread = f" ± {change[1]:.1f}" if math.isfinite(change[1]) else ""
    splits = f"{change[2]} split" + ("s" if change[2] != 1 else "")
    return cells + [ordering(means), f"{change[0]:+.1f}{spread} (L{hi} − L{lo}, {splits})"]


#: the starts of docs/results/cnf-dgp/table1-depth-trend's ablation (`variant` of its rows)
DEPTH_TREND_STARTS = {
    "default": "the bench's start: every q(u) N(0, 1e-5 I)",
    "identity-start": "hidden layers at their identity, no KL",
    "qvar-1": "every q(u) at the prior N(0, I)",
    "salimbeni-init": "the DSVI script's start (hidden q(u) variance 1e-10)",
}


def depth_trend_table(quick, paper_budget, ablation):
    """CNF-DGP Table I's ordering with depth: our DSVI bound (standardised targets, total over boston's training
    points) under each protocol of docs/results/cnf-dgp/table1-depth-trend, next to the paper's NF and IPVI."""
    from flowgp.bench.report import CNF_TABLE_I

    bench_start = DEPTH_TREND_STARTS["default"]
    settings = [(f"DSVI, {bench_start}", rows(quick), "dgp"), (f"DSVI, {bench_start}", rows(paper_budget), "dgp")]
    abl = rows(ablation, unique=False)
    settings += [(f"DSVI (ablation), {DEPTH_TREND_STARTS.get(v, v)}", [r for r in abl if r["variant"] == v], "dgp")
                 for v in sorted({r["variant"] for r in abl})]
    header = ["protocol (cells: mean ± s.e. (splits))", "steps"] + [f"L = {d}" for d in DEPTHS] \
        + ["ordering (means)", "deepest − shallowest, paired by split"]
    table = []
    for label, rs, family in settings:
        rs = [r for r in rs if r.get("dataset") == "boston"]
        by_depth = _by_depth(rs, family)
        if by_depth:
            budget = sorted({steps(r) if "batch_size" in r else int(r["epochs"]) for r in rs})
            table.append([label, ", ".join(f"{b:,}".replace(",", " ") for b in budget)] + _trend_cells(by_depth))
    for i, name in enumerate(("paper NF", "paper IPVI")):
        values = {d: v[i] for d, v in CNF_TABLE_I.items()}
        table.append([f"{name} (units not stated)", "not stated"] + [f"{values[d]:.2f}" for d in DEPTHS]
                     + [ordering(values), f"{values[max(values)] - values[min(values)]:+.2f} (L5 − L2)"])
    return header, table


def cnf_vs_dsvi_table(folders, depths=(2, 3, 4)):
    """The current ``cnf`` posterior against DSVI: test log-likelihood, paired by split."""
    values = defaultdict(dict)
    for r in rows(*folders):
        if "nll" in r and "split" in r and r.get("preset") == "quick":
            values[(r["dataset"], r["model"])][r["split"]] = -r["nll"]
    header = ["data", "depth", "splits", "DSVI test LL", "cnf test LL", "cnf − DSVI (paired)"]
    table = []
    for ds in sorted({k[0] for k in values}):
        for d in depths:
            a, b = values.get((ds, f"dgp{d}"), {}), values.get((ds, f"cnf-dgp{d}"), {})
            paired = sorted(set(a) & set(b))
            if not paired:
                continue
            diff = mean_se(b[s] - a[s] for s in paired)
            table.append([ds, str(d), str(len(paired)), fmt(*mean_se(a[s] for s in paired)[:2]),
                          fmt(*mean_se(b[s] for s in paired)[:2]), fmt(*diff[:2], digits=4)])
    return header, table


#: CNF-DGP Table III: mean test accuracy (%) with convolutions, {dataset: {method: (SGP, DGP 4)}}
CNF_TABLE_III = {
    "mnist": {"DSVI": (97.32, 99.16), "SGHMC": (96.41, 98.15), "IPVI": (97.02, 99.32), "NF": (97.37, 99.43)},
    "fashion-mnist": {"DSVI": (86.98, 91.57), "SGHMC": (85.84, 88.14), "IPVI": (87.29, 91.78), "NF": (87.14, 92.03)},
    "cifar10": {"DSVI": (47.15, 75.05), "SGHMC": (47.32, 70.78), "IPVI": (48.07, 76.11), "NF": (48.13, 76.81)},
}
#: our image models and the Table III cell each stands for: (method, 0 = SGP / 1 = DGP 4)
CNF_TABLE_III_CELL = {"sgp": ("DSVI", 0), "dgp4": ("DSVI", 1), "cnf-dgp4": ("NF", 1)}
#: the bench's `paper` preset for images (the paper states no number of steps)
CNF_IMAGE_STEPS = 20000


def _image_groups(rs) -> dict:
    """{(model, skip, steps, training cap): [rows]} of one data set's image rows (one row per seed)."""
    groups = defaultdict(list)
    for r in rs:
        groups[(r["model"], r.get("skip", "none"), steps(r), r.get("max_train"))].append(r)
    return groups


def cnf_table_iii(folders_by_dataset: dict):
    """Accuracy (%), NLL and ECE per model and skip beside Table III; `folders_by_dataset` maps a data set to
    its result folder, or to None where the data are not available here."""
    header = ["data", "model", "skip", "ours accuracy %: mean ± s.e. (seeds)", "paper", DIFF_OURS, "NLL", "ECE",
              f"budget ratio (steps / {CNF_IMAGE_STEPS:,})".replace(",", " ")]
    table = []
    for ds, folder in folders_by_dataset.items():
        # a learning curve's points (`--curve-every`, rows with a "step") may sit beside the rows: not fits
        groups = _image_groups(r for r in optional_rows(folder) if r.get("dataset") == ds and "step" not in r) \
            if folder else {}
        for model, (method, column) in CNF_TABLE_III_CELL.items():
            published = CNF_TABLE_III[ds][method][column]
            paper = f"{published:.2f} ({method})"
            mine = sorted(((k, g) for k, g in groups.items() if k[0] == model), key=lambda kg: str(kg[0]))
            if not mine:
                missing = NO_DATA if folder is None else NOT_RUN
                table.append([ds, model, "—", missing, paper, "—", "—", "—", "—"])
            for (_, skip, n_steps, cap), g in mine:
                cells = compare([100 * r["accuracy"] for r in g], published, digits=2, published_text=paper)
                label = skip + (f" ({cap} training images)" if cap else "")
                table.append([ds, model, label, *cells, fmt(*mean_se(r["nll"] for r in g)[:2]),
                              fmt(*mean_se(r["ece"] for r in g)[:2]), budget_ratio(n_steps, CNF_IMAGE_STEPS)])
    return header, table


# ----- DGP-IWVI / DREG supplement -----------------------------------------------------------------------------
#: supplement E.3: every Table 1 fit ran 300 000 iterations
DREG_ITERATIONS = 300000
#: the latent DGPs of Table 1: model name -> estimator (the -per-slot models train the authors' objective)
LDGP_ESTIMATORS = {"ldgp2-reg": "REG", "ldgp2-dreg": "DREG", "ldgp2-reg-per-slot": "REG",
                   "ldgp2-dreg-per-slot": "DREG"}
#: a row's `row_order` in words: which splits it holds
ROW_ORDERS = {"file": "our splits", "authors": "the authors' splits"}
OBJECTIVES = (("bound", "valid bound (joint draw)"), ("per-slot", "the authors' per-slot objective (not a bound)"))


def dreg_published() -> dict:
    """{(dataset, "REG"/"DREG"): (mean, s.e.)} of Table 1 from the authors' 20 per-split scores
    (`flowgp.bench.ldgp_authors.read_authors`)."""
    from flowgp.bench.ldgp_authors import read_authors

    table, _ = read_authors()
    return {(ds, est.upper()): mean_se(by_split.values())[:2] for ds, ests in table.items()
            for est, by_split in ests.items()}


def _ldgp_groups(rs) -> dict:
    """{(dataset, objective, estimator): {(preset, row order): {split: standardised test LL}}} of Table 1 rows
    (`--preset reference*`; the 300-epoch smoke run left out); test LL = -nll + log(y_scale)."""
    groups = defaultdict(lambda: defaultdict(dict))
    for r in rs:
        est, preset = LDGP_ESTIMATORS.get(r.get("model")), r.get("preset") or ""
        if est is None or not preset.startswith("reference") or preset == "reference-e300":
            continue
        objective = r.get("objective") or ("per-slot" if r["model"].endswith("-per-slot") else "bound")
        value = r["test_ll_std"] if "test_ll_std" in r else -r["nll"] + math.log(r["y_scale"])
        protocol = (preset, ROW_ORDERS.get(r.get("row_order", "file"), r.get("row_order")), steps(r))
        groups[(r["dataset"], objective, est)][protocol][int(r["split"])] = value
    return groups


def curve_rows_as_bench(path: str, iterations: int, folders) -> list[dict]:
    """The points of a learning curve (benchmarks/studies/ldgp_learning_curve.py) scored at `iterations`, as bench
    rows: each takes the preset, epochs, training rows and batch size of the bench row of its data set and model
    in `folders` whose budget is those iterations, so it joins that protocol (wine-red's REG split 0 at 10 002
    iterations is such a point: `flowgp bench ldgp-table --curve`)."""
    bench = [r for r in rows(*folders) if "epochs" in r and "n_train" in r and "batch_size" in r]
    out = []
    for point in rows(path, unique=False):
        if int(point.get("iterations", -1)) != int(iterations):
            continue
        twin = next((r for r in bench if r["dataset"] == point["dataset"] and r["model"] == point["model"]
                     and steps(r) == int(iterations)), None)
        if twin is not None:
            out.append({**point, **{k: twin[k] for k in ("preset", "epochs", "n_train", "batch_size")},
                        "row_order": twin.get("row_order", "file")})
    return out


def dreg_table_1(folders, optional=(), extra=()):
    """Table 1 per data set, objective and estimator: ours (mean ± s.e. over splits) against the authors' 20
    splits, the difference in combined standard errors and our iterations over 300 000. Cells without rows
    (e.g. the per-slot objective before its runs land) say "not run yet"; `extra`: further rows (e.g.
    `curve_rows_as_bench`)."""
    groups = _ldgp_groups(rows(*folders) + optional_rows(*optional) + list(extra))
    published = dreg_published()
    header = ["data", "objective", "estimator", "protocol", "ours: mean ± s.e. (splits)",
              "published: mean ± s.e. (20 splits)", DIFF_COMBINED,
              f"budget ratio (iterations / {DREG_ITERATIONS:,})".replace(",", " ")]
    table = []
    for ds in ("power", "wine-red"):
        for objective, label in OBJECTIVES:
            for est in ("REG", "DREG"):
                pub = published[(ds, est)]
                by_protocol = groups.get((ds, objective, est), {})
                if not by_protocol:
                    table.append([ds, label, est, "—", NOT_RUN, fmt(*pub), "—", "—"])
                for (preset, order, iters), scores in sorted(by_protocol.items()):
                    cells = compare(scores.values(), *pub)
                    table.append([ds, label, est, f"{preset}, {order}", *cells, budget_ratio(iters, DREG_ITERATIONS)])
    return header, table


def snr_table(path):
    groups = {}
    for r in rows(path):
        groups[(r["layers"], r["gradient"], r["num_importance"])] = r["snr"]
    ks = sorted({k[2] for k in groups})
    header = ["depth", "gradient"] + [f"K = {k}" for k in ks]
    table = [[str(d), g.upper()] + [fmt(groups.get((d, g, k)), None) for k in ks]
             for d in sorted({k[0] for k in groups}) for g in ("reg", "dreg")]
    return header, table


def latent_demo_table(path):
    data = json.loads((RESULTS / path).read_text())
    header = ["model", "test log-likelihood per point"]
    return header, [[name, fmt(m["test_log_likelihood"])] for name, m in data["models"].items()]


# ----- AMO-GP supplement --------------------------------------------------------------------------------------
def amogp_table(path):
    groups = defaultdict(list)
    for r in rows(path):
        groups[r["model"]].append(r)
    header = ["model", "seeds", "gap RMSE", "gap test log-lik per point"]
    table = [[m, str(len(rs)), fmt(*mean_se(r["rmse"] for r in rs)[:2]),
              fmt(*mean_se(r["test_ll"] for r in rs)[:2])]
             for m, rs in groups.items()]
    return header, table
