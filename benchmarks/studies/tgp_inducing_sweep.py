"""Question: with only 5 inducing points and an input-dependent flow, is the TGP competitive with a sparse GP
using 100 (TGP paper, abstract and Figs. 5 and 9)?

Reads the rows of `flowgp bench uci --models svgp,tgp,pe-tgp,ba-tgp --inducing 5,10,20,50,100 --preset quick`
and writes, per data set, the test NLL and RMSE against M (mean ± standard error over the splits present; the
paper's Fig. 9 layout: one column per data set, NLL on top, RMSE below) and a table: for each set, whether
BA-TGP / PE-TGP at M = 5 is within one standard error of, or better than, the SVGP at M = 100 (the claim holds
when the M = 5 model's mean NLL is at most the SVGP's mean plus the larger of the two standard errors). The
count is `flowgp.reporting.comparison.inducing_claim`, which the documentation's "Reproducing the papers" page
also computes from the same rows when the site is built.

    python -m benchmarks.studies.tgp_inducing_sweep docs/results/tgp/inducing-sweep-uci/uci.jsonl \\
        --out docs/results/tgp/inducing-sweep-uci

Answer (2026-12-07, quick preset, the splits finished so far; see that folder's README for the current table):
on boston (splits 0-5) BA-TGP at M = 5 reaches NLL 2.40 against the SVGP's 2.43 at M = 100, so the claim holds
there; the other sets were still running.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from flowgp.bench.results import read_rows
from flowgp.reporting.comparison import INDUCING_CLAIM_MODELS as MODELS
from flowgp.reporting.comparison import INDUCING_CLAIMANTS as CLAIMANTS
from flowgp.reporting.comparison import inducing_claim, inducing_claim_counts, inducing_summary


def figure(summary, path):
    from matplotlib.figure import Figure

    datasets = sorted({k[0] for k in summary})
    fig = Figure(figsize=(3.0 * max(1, len(datasets)), 5.5), layout="constrained")
    axes = fig.subplots(2, max(1, len(datasets)), squeeze=False)
    for j, dataset in enumerate(datasets):
        for i, metric in enumerate(("nll", "rmse")):
            ax = axes[i][j]
            for model in MODELS:
                pts = sorted((m, v[metric]) for (d, mod, m), v in summary.items() if d == dataset and mod == model)
                if pts:
                    ax.errorbar([m for m, _ in pts], [v[0] for _, v in pts], yerr=[v[1] for _, v in pts],
                                marker="o", capsize=3, label=model.upper())
            ax.set_xscale("log")
            ax.set_xlabel("inducing points M")
            ax.set_ylabel("test NLL (nats, lower is better)" if metric == "nll" else "test RMSE (y units)")
            if i == 0:
                ax.set_title(dataset)
    axes[0][0].legend(title="mean ± s.e. over splits", fontsize=8)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", help="uci.jsonl of the sweep")
    p.add_argument("--out", required=True, help="folder for claim.json, claim.md and nll_rmse_vs_m.png")
    args = p.parse_args(argv)
    summary = inducing_summary(read_rows(args.rows))
    table = inducing_claim(summary)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "claim.json").write_text(json.dumps(table, indent=1) + "\n")
    lines = ["| data set | SVGP M=100 NLL (splits) | BA-TGP M=5 NLL (splits) | holds | PE-TGP M=5 NLL (splits) | holds |",
             "|---|---|---|---|---|---|"]
    for r in table:
        cells = [r["dataset"], f"{r['svgp_m100_nll']:.3f} ± {r['svgp_m100_se']:.3f} ({r['svgp_splits']})"]
        for model in CLAIMANTS:
            if f"{model}_holds" in r:
                cells += [f"{r[f'{model}_m5_nll']:.3f} ± {r[f'{model}_m5_se']:.3f} ({r[f'{model}_splits']})",
                          "yes" if r[f"{model}_holds"] else "no"]
            else:
                cells += ["not run", ""]
        lines.append("| " + " | ".join(cells) + " |")
    counts = inducing_claim_counts(table)
    lines.append("")
    lines.append(f"Sets where the claim holds: BA-TGP {counts['ba-tgp'][0]} of {counts['ba-tgp'][1]}, "
                 f"PE-TGP {counts['pe-tgp'][0]} of {counts['pe-tgp'][1]}.")
    (out / "claim.md").write_text("\n".join(lines) + "\n")
    figure(summary, out / "nll_rmse_vs_m.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
