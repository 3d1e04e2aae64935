"""Tables and figure of docs/results/cnf-dgp/table1-depth-trend from rows already on disk (no fitting).

    python -m benchmarks.studies.cnf_dgp_depth_trend_table                  # markdown to stdout
    python -m benchmarks.studies.cnf_dgp_depth_trend_table --figure docs/results/cnf-dgp/table1-depth-trend/elbo-vs-depth.png

Every ELBO is a total over boston's N = 455 training points, in nats. "std" is the bound for standardised
targets, "raw" the bound for the targets in their own units (the bench's `train_elbo`); they differ by the
Jacobian of y -> y / s, raw = std - N log s, which is the same for every depth on a split. s.e. is over splits.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from flowgp.bench.report import CNF_TABLE_I, standardised_elbo
from flowgp.reporting.comparison import ordering

R = Path("docs/results/cnf-dgp")
DEPTHS = (2, 3, 4, 5)
SPLITS = (0, 1, 2)
N_TRAIN = 455
#: 0.5 log(2πe) per point: the bound of the best constant Gaussian predictor of standardised targets (no KL)
CONSTANT_PER_POINT = 0.5 * math.log(2 * math.pi * math.e)


def _rows(*paths):
    out = []
    for p in paths:
        if Path(p).exists():
            out += [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
    return [r for r in out if r.get("dataset", "boston") == "boston"]


def settings() -> list[tuple[str, dict]]:
    """(label, {depth: {split: row}}) for every setting, existing rows first, then the ablation's."""
    fig3 = _rows(R / "fig3-uci-quick/uci.jsonl")
    grid = _rows(*(R / f"flow-vs-dsvi-uci/{d}/uci.jsonl" for d in ("L2", "L3", "L4")),
                 R / "flow-vs-dsvi-uci/boston-table1/uci.jsonl")
    paper = _rows(R / "table1-boston-paper-budget/uci.jsonl")
    abl = _rows(R / "table1-depth-trend/ablation.jsonl")

    def pick(rows, family, **where):
        out = defaultdict(dict)
        for r in rows:
            for d in DEPTHS:
                if r["model"] == f"{family}{d}" and r["split"] in SPLITS and all(r.get(k) == v for k, v in where.items()):
                    out[d].setdefault(r["split"], r)
        return dict(out)

    found = [
        ("DSVI, quick (1 500 steps), fig3-uci-quick", pick(fig3, "dgp")),
        ("paper's CNF design, quick, fig3-uci-quick", pick(fig3, "cnf-dgp")),
        ("DSVI, quick, flow-vs-dsvi-uci", pick(grid, "dgp")),
        ("flowgp's cnf (flow over DSVI), quick, flow-vs-dsvi-uci", pick(grid, "cnf-dgp")),
        ("DSVI, paper budget (15 000 steps)", pick(paper, "dgp")),
        ("paper's CNF design, paper budget", pick(paper, "cnf-dgp")),
    ]
    for variant, epochs, m in sorted({(r["variant"], r["epochs"], r["num_inducing"]) for r in abl}):
        found.append((f"ablation: DSVI {variant}, {epochs} steps, M = {m}",
                      pick(abl, "dgp", variant=variant, epochs=epochs, num_inducing=m)))
    return [(label, s) for label, s in found if s]


def mean_se(values):
    values = list(values)
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")
    return mean, se, n


def fmt(ms):
    mean, se, n = ms
    return f"{mean:.1f}" + ("" if math.isnan(se) else f" ± {se:.1f}") + f" ({n})"


def table(kind: str = "std") -> list[str]:
    lines = [f"| setting | " + " | ".join(f"L = {d}" for d in DEPTHS) + " | ordering (means) | L5 − L2, paired (splits) |",
             "|---|" + "---|" * (len(DEPTHS) + 2)]
    for label, s in settings():
        cells, means = [], {}
        for d in DEPTHS:
            vals = [standardised_elbo(r) if kind == "std" else r["train_elbo"] for r in s.get(d, {}).values()]
            vals = [v for v in vals if v is not None]
            if vals:
                ms = mean_se(vals)
                means[d] = ms[0]
                cells.append(fmt(ms))
            else:
                cells.append("—")
        lo, hi = min(s), max(s)
        paired = sorted(set(s[lo]) & set(s[hi])) if lo != hi else []
        diff = (fmt(mean_se(standardised_elbo(s[hi][k]) - standardised_elbo(s[lo][k]) for k in paired))
                + f" [L{hi} − L{lo}]") if paired else "—"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ordering(means)} | {diff} |")
    return lines


def jacobian_check() -> str:
    """Largest |(raw_L − raw_2) − (std_L − std_2)| over every paired row: the conversion cannot reorder depths."""
    worst = 0.0
    for _, s in settings():
        base = s.get(min(s), {})
        for d, by_split in s.items():
            for k, r in by_split.items():
                if k in base:
                    raw = r["train_elbo"] - base[k]["train_elbo"]
                    std = standardised_elbo(r) - standardised_elbo(base[k])
                    worst = max(worst, abs(raw - std))
    return f"{worst:.2e}"


def paper_lines(log_s: float) -> list[str]:
    const = -N_TRAIN * CONSTANT_PER_POINT
    lines = ["| depth | paper NF | paper IPVI | NF per point | NF read as raw, converted to standardised (+N log s) |"
             " NF read as standardised, minus the constant predictor's bound |", "|---|---|---|---|---|---|"]
    for d, (nf, ipvi) in sorted(CNF_TABLE_I.items()):
        lines.append(f"| {d} | {nf:.2f} | {ipvi:.2f} | {nf / N_TRAIN:.3f} | {nf + N_TRAIN * log_s:+.1f} "
                     f"({(nf + N_TRAIN * log_s) / N_TRAIN:+.3f} per point) | {nf - const:+.1f} |")
    return lines


def figure(path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for label, s in settings():
        if "salimbeni-init" in label:
            continue  # thousands of nats below the rest at 1 500 steps (its KL is unpaid); in the tables only
        ds = sorted(s)
        stats = [mean_se(r["train_elbo"] for r in s[d].values()) for d in ds]
        ax1.errorbar(ds, [m for m, _, _ in stats], yerr=[0 if math.isnan(e) else e for _, e, _ in stats],
                     marker="o", capsize=3, label=label)
        lo = ds[0]
        rel = []
        for d in ds:
            paired = sorted(set(s[d]) & set(s[lo]))
            rel.append(mean_se(standardised_elbo(s[d][k]) - standardised_elbo(s[lo][k]) for k in paired))
        ax2.errorbar(ds, [m for m, _, _ in rel], yerr=[0 if math.isnan(e) else e for _, e, _ in rel],
                     marker="o", capsize=3, label=label)
    ds = sorted(CNF_TABLE_I)
    for i, name in enumerate(("paper NF", "paper IPVI")):
        vals = [CNF_TABLE_I[d][i] for d in ds]
        ax1.plot(ds, vals, "k--" if i == 0 else "k:", marker="s", label=name + " (as published)")
        ax2.plot(ds, [v - vals[0] for v in vals], "k--" if i == 0 else "k:", marker="s", label=name)
    ax1.set(xlabel="layers L", ylabel="training ELBO, raw targets (nats, total over 455 points)",
            title="boston: ELBO vs depth (ours: mean ± s.e. over splits)")
    ax2.set(xlabel="layers L", ylabel="ELBO(L) − ELBO(shallowest), paired by split (nats)",
            title="change with depth (the ordering)")
    ax2.axhline(0, color="grey", lw=0.5)
    for ax in (ax1, ax2):
        ax.set_xticks(list(DEPTHS))
    ax1.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def decomposition_table() -> list[str]:
    """The ablation rows: ELBO = data term − Σ KL, KL per layer, noise, test NLL (standardised targets)."""
    lines = ["| variant | steps | L | split | ELBO std | data term E log p(y given f), std | KL per layer (nats) | ΣKL | noise var (std) "
             "| test NLL | bound at steps 500 / 1000 / 1500 / ... (history, per point × N) |", "|---|" + "---|" * 10]
    for r in sorted(_rows(R / "table1-depth-trend/ablation.jsonl"),
                    key=lambda r: (r["variant"], r["epochs"], r["layers"], r["split"])):
        every = r["history_every"]
        marks = [r["history"][k // every - 1] * N_TRAIN for k in range(500, r["epochs"] + 1, 500)
                 if k // every - 1 < len(r["history"])]
        lines.append(f"| {r['variant']} | {r['epochs']} | {r['layers']} | {r['split']} | {r['elbo_std']:.1f} | "
                     f"{r['expected_loglik_std']:.1f} | {', '.join(f'{k:.1f}' for k in r['kl_per_layer'])} | "
                     f"{sum(r['kl_per_layer']):.1f} | {r['noise_std'][0]:.4f} | {r['nll']:.4f} | "
                     f"{' / '.join(f'{m:.0f}' for m in marks)} |")
    return lines


def curves(path: str) -> None:
    """Learning curves of the ablation rows: the training bound (single-sample, mean over 50 steps) vs step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for r in sorted(_rows(R / "table1-depth-trend/ablation.jsonl"), key=lambda r: (r["variant"], r["layers"], -r["epochs"])):
        every = r["history_every"]
        steps = [every * (i + 1) for i in range(len(r["history"]))]
        ax.plot(steps, [h * N_TRAIN for h in r["history"]], label=f"{r['variant']}, L = {r['layers']}, {r['epochs']} steps",
                ls="-" if r["variant"] == "default" else "--")
    paper = {r["model"]: standardised_elbo(r) for r in _rows(R / "table1-boston-paper-budget/uci.jsonl")}
    for d in (2, 3, 4):
        if f"dgp{d}" in paper:
            ax.scatter([15000], [paper[f"dgp{d}"]], marker="x", label=f"DSVI L = {d} at 15 000 steps (100-sample bound)")
    ax.set(xscale="log", ylim=(-600, 0), xlabel="Adam step (full batch)",
           ylabel="training ELBO, standardised targets (nats, total over 455)",
           title="boston split 0: learning curves (single-sample bound, mean of 50 steps)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figure", default=None)
    p.add_argument("--curves", default=None)
    args = p.parse_args()
    scales = {r["split"]: r["y_scale"] for _, s in settings() for d in s.values() for r in d.values()}
    log_s = sum(math.log(v) for v in scales.values()) / len(scales)  # mean over splits 0-2
    print("Standardised targets (nats, total over 455 points; mean ± s.e. (splits)):\n")
    print("\n".join(table("std")))
    print("\nRaw targets (the bench's train_elbo):\n")
    print("\n".join(table("raw")))
    print(f"\nLargest |Δ_raw − Δ_std| between depths on a split: {jacobian_check()} nats; mean log s = {log_s:.4f}\n")
    print("\n".join(paper_lines(log_s)))
    print("\nAblation rows (boston; ELBO = E[log p(y|f)] − ΣKL, standardised targets, nats):\n")
    print("\n".join(decomposition_table()))
    if args.figure:
        figure(args.figure)
    if args.curves:
        curves(args.curves)


if __name__ == "__main__":
    main()
