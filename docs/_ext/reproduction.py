"""The ``flowgp-reproduction`` directive: the "Reproducing the papers" page, computed from docs/results.

Every number in "ours" columns is computed when the site is built, from the JSON-line rows that ``flowgp bench``
(and the scripts in ``benchmarks/``) wrote under ``docs/results``, by the table functions of `paper_tables` (with
the functions that ``flowgp bench report`` uses); the published numbers come from ``flowgp.bench.report`` where
the bench already compares with them, else from `paper_tables`. Each table puts ours next to the published value
with the same columns where the rows and the paper allow: mean ± standard error, the difference in standard
errors, the budget ratio. So the page cannot drift from the rows: rerunning a command and committing its rows
changes the page at the next build. The prose per item (command, budget, the cause of each gap) is written here;
it is phrased to stay true while results still being produced land. A result file that is missing makes the build
warn (and fail under ``-W``), except the folders of runs in progress, whose cells say "not run yet".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from paper_tables import (RESULTS, amogp_table, classification_table, cnf_table_i, cnf_table_iii, cnf_vs_dsvi_table,
                          depth_trend_table, curve_rows_as_bench, dgp_uci_table, dreg_table_1, inducing_claim_table, latent_demo_table,
                          paper_comparison_table, rainfall_table, snr_table, timing_table, uci_rank_table)

logger = logging.getLogger(__name__)


# ----- the page's content ---------------------------------------------------------------------------------------
@dataclass
class Item:
    title: str
    command: str | None
    budget: str
    published: str
    cause: str
    table: Callable[[], tuple] | None = None
    source: tuple = field(default_factory=tuple)


#: the folder holding the reference-protocol rows (the batches the splits were run in are merged into its uci.jsonl)
LDGP_FOLDERS = ("ldgp/table1-uci",)
#: Table 1 with both objectives (both estimators, the authors' splits), while its runs land
LDGP_TABLE1 = ("ldgp/table1-uci/table1",)
#: wine-red's REG split 0 at the bench's 10 002 iterations is a point of this learning curve, not a bench row
LDGP_CURVE = "ldgp/table1-uci/wine-red-curve/curve.jsonl"
#: Table III's data sets and the folders of their rows (None: the data are not available here)
IMAGE_FOLDERS = {"mnist": None, "fashion-mnist": "cnf-dgp/table3-images/fashion-mnist/images.jsonl", "cifar10": None}
DEPTH_TREND = ("cnf-dgp/fig3-uci-quick", "cnf-dgp/table1-boston-paper-budget",
               "cnf-dgp/table1-depth-trend/ablation.jsonl")
SWEEP = "tgp/inducing-sweep-uci/uci.jsonl"

TGP = "TGP paper (Maroñas et al., AISTATS 2021) and its appendix"
CNF = "CNF-DGP paper (Yu et al., IJCNN 2021)"
DREG = "DGP-IWVI / DREG supplement (Rudner et al., ICML 2021)"
AMO = "AMO-GP supplement (Kaiser et al., NeurIPS 2018)"

QUICK_UCI = "``--preset quick``: about 1 500 Adam steps (minibatch 512) at M = 100, against the paper's 15 000 epochs"

PAPERS: dict[str, list[Item]] = {
    TGP: [
        Item("Fig. 4: the tanh-warped sine (SVGP, TGP, G-SP)", "flowgp demo --out flowgp-demo",
             "15 fits of 1 000 epochs (3 models × 5 period initialisations); about 30 s on two cores",
             "a figure; no numbers",
             "Reproduced qualitatively: the TGP with a tanh flow fits the plateaus the SVGP cannot "
             "(:doc:`/auto_examples/plot_01_tanh_sine`). ``flowgp demo`` fits the v-WGP where the paper shows the "
             "G-SP; the G-SP is :class:`flowgp.models.GSP`."),
        Item("Table 1: the flows", None, "—", "a table of definitions",
             "Every flow of Table 1 is built in (:doc:`/guide/tgp`), with the linear combination of eq. 26; "
             "invertibility, log-determinants and inverses are tested."),
        Item("Fig. 7 left and appendix Table 4 (left): air quality, RMSE",
             "flowgp bench airquality --preset quick --seeds 0-1 --noise-schemes 0,0.6 --jobs 2 "
             "--out docs/results/tgp/applications-quick",
             "1 000 epochs (200 at 100 % inducing points) against the paper's 10 000; 5 folds × 2 seeds, both "
             "noise schemes",
             "RMSE mean ± std over 5 folds × 2 seeds (Table 4)",
             "Every cell is above the paper's. Three causes, none separable without more compute: **a different "
             "site** (the paper's Honor Oak Park series is not available; the bench uses London N. Kensington, same "
             "dates: another series, so levels do not compare), **10× fewer epochs** (fold 0 at 10 %: 200 epochs "
             "gave RMSE 6.1-6.6, 1 000 epochs 5.1-5.8), and at 100 % inducing points only 200 epochs, so those "
             "fits are under-fitted and show no \"more inducing points help\" trend.",
             lambda: paper_comparison_table(["tgp/applications-quick"], {"airquality"}), ("tgp/applications-quick",)),
        Item("Fig. 7 right and appendix Tables 2 and 4 (right): rainfall, RMSE",
             "flowgp bench rainfall --preset quick --seeds 0-1 --noise-schemes 0,0.6 --jobs 2 "
             "--out docs/results/tgp/applications-quick",
             "1 000 epochs against 20 000, at 25 % inducing points (the paper does not state its M)",
             "RMSE mean ± std over 5 folds × 2 seeds at M = N (Table 4, right); Table 2 averages every flow",
             "Our fits use 25 % of the points as inducing points, so the gap is in units of the paper's fold "
             "standard deviation, not a test (the column \"gap / paper std\"; the difference in combined "
             "standard errors, with the paper's std ÷ √10, is shown too, but it compares fits at different M). "
             "All within one "
             "paper standard deviation except two. Our TGP with SAL+softplus is far better "
             "(about 50 against 73): the paper reports that flow failing on this set, ours starts from the data "
             "initialisation of appendix eq. 30. Our v-WGP with softplus is worse by about one std. As in the "
             "paper, no model beats the plain GP in RMSE beyond the fold-to-fold spread.",
             lambda: rainfall_table("tgp/applications-quick"), ("tgp/applications-quick",)),
        Item("Fig. 8 and appendix B.6.3: UCI, SVGP against PE-TGP and BA-TGP",
             "flowgp bench uci --preset quick --splits 0-9 --inducing 100 --models svgp,tgp,pe-tgp,ba-tgp "
             "--jobs 2 --out docs/results/tgp/uci-quick", QUICK_UCI,
             "NLL and RMSE means on concrete and boston at M = 100 (appendix B.6.3; no spread given)",
             "The gap uses our standard error only (the paper gives none), which overstates it. **boston**: our "
             "models are worse by 1-3 se: a tenth of the budget, no per-set flow or architecture selection on "
             "validation splits (one SAL flow and one 50-unit ReLU layer everywhere), and the standard 90/10 splits "
             "instead of the paper's random 10-fold partitions; PE-TGP overfits there (coverage 0.88), BA-TGP's "
             "dropout average restores 0.93, which is the paper's argument for the Bayesian flow. **concrete**: our "
             "PE-TGP is better than the paper's in NLL and RMSE, our BA-TGP in RMSE (its NLL is within one standard "
             "error of the paper's); we did not find why the paper's PE-TGP is worse than its SVGP there.",
             lambda: paper_comparison_table(["tgp/uci-quick"], {"concrete", "boston"}), ("tgp/uci-quick",)),
        Item("Abstract, Fig. 9 and appendix Fig. 5: 5 inducing points and an input-dependent flow against an "
             "SVGP with 100",
             "flowgp bench uci --models svgp,tgp,pe-tgp,ba-tgp --inducing 5,10,20,50,100 --splits 0-9 --preset quick "
             "--out docs/results/tgp/inducing-sweep-uci",
             "``--preset quick``: about 1 500 Adam steps (minibatch 512) at every M, against the paper's 15 000 "
             "epochs",
             "a claim and plots, no numbers: \"even with only 5 inducing points and an input-dependent flow, our "
             "method is consistently competitive with a standard sparse GP fitted using 100 inducing points\" "
             "(abstract); appendix B.6.1 names kin8nm, power and concrete as the sets where BA-TGP at M = 5 is "
             "similar to M = 100",
             "The claim holds on a set when the M = 5 model's mean test NLL is at most the SVGP's at M = 100 plus the "
             "larger of the two standard errors (``flowgp.reporting.comparison.inducing_claim``, the count in the "
             "last row; ``python -m benchmarks.studies.tgp_inducing_sweep`` writes the same table and the figure of "
             "NLL against M). The difference column compares ours with ours: the M = 5 model against the SVGP at "
             "M = 100, in their combined standard error (negative: the M = 5 model is better). The sweep is still "
             "running: a set appears once both models have rows, with the splits finished so far, and M = 10, 20 "
             "and 50 are not part of the claim. **energy** is where the claim fails at this budget, and at the "
             "paper's 15 000 epochs too (splits 0-2: the gap stays 0.35-0.42 nats, "
             "``docs/results/tgp/inducing-sweep-uci/energy-budget``), so the budget is not the cause; the paper's "
             "appendix does not name energy among the sets where 5 points suffice (its heating load is a smooth "
             "function of 8 inputs that 5 inducing points cannot cover: the SVGP at M = 5 scores far worse there).",
             lambda: inducing_claim_table(SWEEP), (SWEEP,)),
        Item("Fig. 8, Fig. 9 and appendix Figs. 5-7: NLL across the UCI sets and the ranking",
             "flowgp bench report docs/results/tgp/uci-quick --out docs/results/tgp/report-quick", QUICK_UCI,
             "plots only (the ranking: BA-TGP best, then PE-TGP, TGP, SVGP)",
             "Same ordering of the mean ranks as the paper's. On power and wine-red every model is within about "
             "one standard error of the others (these sets are close to homoscedastic Gaussian once standardised). "
             "The paper's smaller numbers of inducing points are in the item on the abstract's claim above; its two "
             "larger sets (Fig. 10) are not run.",
             lambda: uci_rank_table("tgp/uci-quick", ["svgp", "tgp", "pe-tgp", "ba-tgp"]), ("tgp/uci-quick",)),
        Item("Fig. 11: training and prediction time, TGP against a 3-layer deep GP (energy)",
             "flowgp bench timing --dataset energy --models svgp,tgp,dgp3 --epochs 200 --repeats 5 "
             "--out docs/results/tgp/fig11-timing",
             "200 full-batch epochs, medians of 5 interleaved repeats (the paper: 100 runs of 1 200 epochs)",
             "a plot: the TGP trains and predicts far faster than the deep GP",
             "Same conclusion. Absolute times are of a shared 2-core CPU; the ratios are what compares.",
             lambda: timing_table("tgp/fig11-timing"), ("tgp/fig11-timing",)),
        Item("Fig. 12: TGP against deep GPs (NLL, 9 sets)",
             "flowgp bench uci --preset quick --splits 0-9 --inducing 100 --models svgp,dgp2,dgp3,dgp4,cnf-dgp2,"
             "cnf-dgp3,cnf-dgp4 --out docs/results/cnf-dgp/fig3-uci-quick", QUICK_UCI,
             "a plot",
             "Test log-likelihood (higher is better), all from the quick preset on the same ten splits. The deep GPs "
             "are ahead of the TGP where composition helps most (kin8nm, energy); the BA-TGP is within about two "
             "standard errors of the deep GPs on boston, concrete, energy (where it is ahead of them by about one), "
             "power and wine-red, and behind them on kin8nm. So at this budget the paper's claim (a TGP ranks with "
             "3-layer deep GPs) holds for the BA-TGP on five of six sets. The deep GPs were run on six of the paper's nine sets (the shared data "
             "hold seven UCI sets; yacht was not run for the deep GPs).",
             lambda: dgp_uci_table(("tgp/uci-quick", "cnf-dgp/fig3-uci-quick"), ["svgp", "tgp", "ba-tgp", "dgp2", "dgp3", "dgp4"]),
             ("tgp/uci-quick", "cnf-dgp/fig3-uci-quick")),
        Item("Fig. 13 and appendix Fig. 8: classification",
             "python benchmarks/classification.py --splits 3 --multiclass-splits 1 --epochs 300 "
             "--num-inducing 50 --batch-size 512 --flow sal --fix-variance-epochs 30 --max-train 2000 "
             "--max-test 5000",
             "300 epochs at M = 50 on at most 2 000 training rows, against 15 000 epochs at M = 100 with model "
             "selection", "plots",
             "Not comparable in level (a small fraction of the budget, no architecture or dropout search). "
             "PE-TGP's point-estimate network is over-confident (NLL 14-62 on the small sets); the MC-dropout "
             "average (BA-TGP) removes most of that, the paper's own finding.",
             lambda: classification_table("tgp/classification.jsonl"), ("tgp/classification.jsonl",)),
        Item("Figs. 5, 6 (main) and 9, 10 (appendix): maps, fits and the learned warpings", None, "—", "figures",
             "Not reproduced as figures. The learned input-dependent warpings of appendix Fig. 9 are returned "
             "by ``TGPRegressor.warping_functions`` (:doc:`/auto_examples/plot_04_input_dependent_flow`)."),
    ],
    CNF: [
        Item("Table I: training ELBO on boston, 2-5 layers",
             "flowgp bench uci --preset quick --datasets boston --splits 0 --inducing 100 --models "
             "dgp2,dgp3,dgp4,dgp5,cnf-dgp2,cnf-dgp3,cnf-dgp4,cnf-dgp5 --out docs/results/cnf-dgp/flow-vs-dsvi-uci/boston-table1",
             "split 0, quick budget", "mean ELBOs over 10 runs (NF and IPVI), no spread, no units and no budget stated: "
             "the table has no difference or budget-ratio column",
             "Not comparable in level: the paper does not state its normalisation (we report the ELBO for "
             "standardised targets) and IPVI is not implemented (DSVI stands in). Compare orderings: in the "
             "paper the ELBO rises with depth and NF is above IPVI; ours falls with depth at this budget (deeper "
             "models are further from convergence), and CNF is above DSVI at every depth, by construction of the "
             "``cnf`` posterior (it keeps the flow only where it raises the bound). At 10× the steps DSVI's bound is "
             "flat in depth (the deeper model contains the shallower), and so is the quick-budget bound when the hidden "
             "layers start at their identity with no KL; normalisation cannot reverse an ordering, and the paper's "
             "level fits neither reading of its units: ``docs/results/cnf-dgp/table1-depth-trend``.",
             lambda: cnf_table_i("cnf-dgp/flow-vs-dsvi-uci/boston-table1"), ("cnf-dgp/flow-vs-dsvi-uci/boston-table1",)),
        Item("Table I: the ordering with depth, protocol by protocol",
             "python -m benchmarks.studies.cnf_dgp_depth_trend --variant identity-start --layers 2,3,4,5 "
             "--epochs 1500 --out docs/results/cnf-dgp/table1-depth-trend/ablation.jsonl",
             "1 500 steps (quick, full batch) and 15 000 (the bench's paper preset); the paper states no budget, "
             "so there is no budget ratio",
             "NF and IPVI at 2-5 layers, both rising with depth (no spread, no units)",
             "Orderings compare, levels do not: normalisation cannot reverse an ordering (the standardised and "
             "raw-target bounds differ by the same N·log s at every depth), and the paper's level fits neither "
             "reading of its units. With the bench's start DSVI's bound falls with depth at the quick budget: each "
             "hidden layer starts near-deterministic and pays its KL first, so the deeper model is still behind at "
             "1 500 steps. At 15 000 steps it is flat within about a nat, and at 1 500 steps with the hidden layers "
             "started at their identity (no KL) it no longer falls. No protocol makes it rise like the paper's: a "
             "deep GP contains the shallower one, so its converged bound rises only where the extra layer helps the "
             "fit, and on boston it does not. Details, the KL per layer and the learning curves: "
             "``docs/results/cnf-dgp/table1-depth-trend``.",
             lambda: depth_trend_table(*DEPTH_TREND), DEPTH_TREND),
        Item("Fig. 3: test log-likelihood on the UCI sets, DSVI and NF deep GPs",
             "flowgp bench uci --preset quick --splits 0-9 --inducing 100 --models svgp,dgp2,dgp3,dgp4,cnf-dgp2,"
             "cnf-dgp3,cnf-dgp4 --out docs/results/cnf-dgp/flow-vs-dsvi-uci", QUICK_UCI, "a plot (NF best on average)",
             "The current ``cnf`` posterior (DSVI's Gaussian plus a learned flow correction, kept only where it raises "
             "the training bound) against DSVI on the same splits: differences of a few thousandths of a nat, "
             "within about two standard errors almost everywhere. The paper's NF gains over DSVI are not "
             "reproduced at this budget; its exact design (``posterior=\"cnf-paper\"``) trailed DSVI here, "
             "and the measured causes (samples of U per step, the base network) are in "
             "``docs/results/cnf-dgp/paper-design-ablation`` and ``docs/results/cnf-dgp/flow-vs-dsvi-uci``.",
             lambda: cnf_vs_dsvi_table(("cnf-dgp/flow-vs-dsvi-uci", "cnf-dgp/flow-vs-dsvi-uci/L3", "cnf-dgp/flow-vs-dsvi-uci/L4")),
             ("cnf-dgp/flow-vs-dsvi-uci", "cnf-dgp/flow-vs-dsvi-uci/L3", "cnf-dgp/flow-vs-dsvi-uci/L4")),
        Item("Table II: time per step on the airline data", None, "—", "seconds per step of a 5-layer model",
             "Not reproduced: the airline data are not available here. Step times against GPyTorch's deep GP are "
             "in ``docs/results/perf/step-time/dgp_step_time_2026-11-25.json`` and ``docs/results/perf/gpu``."),
        Item("Table III: image classification (MNIST, Fashion-MNIST, CIFAR-10)",
             "flowgp bench images --datasets fashion-mnist --models sgp,dgp4 --skip conv,dense --preset paper "
             "--dtype float32 --out docs/results/cnf-dgp/table3-images/fashion-mnist; flowgp bench images --datasets "
             "fashion-mnist --models dgp4,cnf-dgp4 --skip conv --preset quick --steps 3000 --dtype float32 "
             "--out docs/results/cnf-dgp/table3-images/fashion-mnist",
             "the bench's ``paper`` preset: 20 000 steps of 256 images, M = 100, 100 prediction samples (the paper "
             "states only L = 4, M = 100 and the robust max); the flow posterior 3 000 steps on the CPU, beside DSVI "
             "at the same 3 000",
             "mean test accuracy (%) with convolutions, no spread: SGP and 4-layer DGPs by DSVI, SGHMC, IPVI and NF; "
             "Fashion-MNIST SGP DSVI 86.98 / NF 87.14, DGP 4 DSVI 91.57 / IPVI 91.78 / NF 92.03",
             "MNIST and CIFAR-10 are not available here (no package ships them), so their cells say so. "
             "Fashion-MNIST is (Debian's ``dataset-fashion-mnist``, checked against the published MD5 sums): its "
             "cells fill in from ``docs/results/cnf-dgp/table3-images/fashion-mnist`` as its fits land, and say "
             "\"not run yet\" until then. Our SGP is a DSVI sparse GP, ``dgp4`` the DSVI DGP 4 (with the "
             "convolutional skip, CSC, or the dense one it replaces) and ``cnf-dgp4`` the flow posterior, so each "
             "is set beside the DSVI or NF cell; IPVI and SGHMC are not implemented. The paper gives no spread, so "
             "the difference uses our standard error over seeds (one seed: none). The DGP-4 + CSC step and its "
             "speed-up are in ``docs/results/cnf-dgp/table3-images``, where the same models also run on "
             "scikit-learn's 8×8 digits; that table is not comparable with Table III.",
             lambda: cnf_table_iii(IMAGE_FOLDERS), tuple(f for f in IMAGE_FOLDERS.values() if f)),
    ],
    DREG: [
        Item("Table 1 and Fig. 4: test log-likelihood of a 2-layer latent DGP, REG against DREG",
             "flowgp bench uci --preset reference --datasets wine-red --splits 0-19 --models ldgp2-reg,ldgp2-dreg "
             "--out docs/results/ldgp/table1-uci; flowgp bench uci --datasets wine-red --models ldgp2-reg,ldgp2-dreg,"
             "ldgp2-reg-per-slot,ldgp2-dreg-per-slot --splits 0-19 --inducing 128 --preset reference --epochs 3334 "
             "--out docs/results/ldgp/table1-uci/table1 (power: --epochs 589)",
             "``--preset reference``: the supplement's protocol (K = 5, batch 512) for 10 000 iterations "
             "(3 334 epochs of wine-red, 589 of power), against 300 000",
             "test log-likelihood (standardised targets), 20 splits, REG / DREG: power 0.211 / 0.208, wine-red "
             "0.568 / 0.611; the standard errors are computed from the authors' 20 per-split scores (their code's "
             "published file), which were trained on their per-slot objective",
             "Two objectives: the valid bound flowgp trains (the hidden layer drawn jointly over the K importance "
             "samples) and the authors' per-slot objective (``objective=\"per-slot\"``: each sample's hidden layer "
             "drawn from its own marginal), which is not a bound; the published numbers are of the second. Rows of "
             "the per-slot objective on all splits fill in from ``docs/results/ldgp/table1-uci/table1`` and say "
             "\"not run yet\" until then. "
             "**wine-red**, valid bound: above the paper's level at 3 % of its budget; REG and DREG tie (the paper's "
             "own per-split scores give a difference of +0.043 ± 0.239, also a tie). **power**, valid bound: below "
             "the paper: the fits are still improving at 3 % of the budget (learning curves in "
             "``docs/results/ldgp/table1-uci``), and the rest of the gap is the objective: trained on the per-slot "
             "objective with the authors' K = 50 and batch 64, our model scored 0.2535 at their full budget on their "
             "split 8, against their 0.2556 (``docs/results/ldgp/table1-uci``, \"The power row\").",
             lambda: dreg_table_1(LDGP_FOLDERS, LDGP_TABLE1, extra=curve_rows_as_bench(
                 LDGP_CURVE, 10002, LDGP_FOLDERS)), LDGP_FOLDERS + LDGP_TABLE1 + (LDGP_CURVE,)),
        Item("Figs. 1-3 and 8-9: signal-to-noise ratio of the q(z) gradient against K",
             "flowgp bench snr --dataset demo --layers 1,2,3,4 --num-importance 1,2,5,10,20,50 --gradient reg,dreg "
             "--out docs/results/ldgp/fig3-snr", "models trained 2 500 iterations; Q = 200 gradient draws at 10 points",
             "plots: REG's SNR falls with K, DREG's rises",
             "Same behaviour at every depth. With Q = 200 draws at 10 points single entries are noisy; DREG dips "
             "from K = 1 to K = 2 at depths 3 and 4 and is flat there at depths 1 and 2 (at K = 1 DREG is the "
             "path-derivative estimator).",
             lambda: snr_table("ldgp/fig3-snr/snr.jsonl"), ("ldgp/fig3-snr/snr.jsonl",)),
        Item("Figs. 5 and 7: multimodal predictions on the demo data",
             "python benchmarks/latent_dgp_demo.py --out docs/results --iterations 3000 --test-samples 2000",
             "3 000 iterations", "figures",
             "Reproduced qualitatively: the latent DGP's samples follow both branches "
             "(:doc:`/auto_examples/plot_07_latent_dgp_multimodal`).",
             lambda: latent_demo_table("ldgp/demo/latent_dgp_demo.json"), ("ldgp/demo/latent_dgp_demo.json",)),
    ],
    AMO: [
        Item("Figs. 6-9: joint predictions on the wind-turbine data (GP, MO-GP, DGP, AMO-GP)", None, "—", "figures",
             "Not reproduced: the wind-turbine data were not found in any public repository "
             "(``shared/data/SOURCES.md``). The bench runs the paper's other experiments' analogues instead: the "
             "artificial gap experiment below and the London PM2.5 sites (``docs/results/amogp``)."),
        Item("Artificial gap experiment (no published numbers)",
             "flowgp bench amogp --experiment artificial --artificial-seeds 3 --epochs 300 --baseline-epochs 1000 "
             "--out docs/results/amogp/artificial-gap", "300 epochs (AMO-GP), 1 000 (baselines), 3 seeds",
             "—", "AMO-GP fills the gap from the other outputs; the MO-GP without alignments transfers the "
             "misaligned shape and is confidently wrong.",
             lambda: amogp_table("amogp/artificial-gap"), ("amogp/artificial-gap",)),
    ],
}


def _table_rst(header, table) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [header] + table:
        lines.append("   * - " + (row[0] or " "))
        lines += [f"     - {cell or ' '}" for cell in row[1:]]
    return lines + [""]


def page_rst() -> list[str]:
    lines = []
    for paper, items in PAPERS.items():
        lines += [paper, "-" * len(paper), ""]
        for item in items:
            lines += [item.title, "~" * len(item.title), ""]
            if item.command:
                lines += [".. code-block:: bash", "", f"   {item.command}", ""]
            lines += [f"**Budget.** {item.budget}", "", f"**Published.** {item.published}", ""]
            if item.table is not None:
                header, table = item.table()
                if not table:
                    raise ValueError(f"no rows for {item.title!r} in {item.source}")
                lines += [f"**Ours** (from ``docs/results/{', '.join(item.source)}``):", ""] + _table_rst(header, table)
            lines += [f"**Gaps and their causes.** {item.cause}", ""]
    return lines


class ReproductionDirective(SphinxDirective):
    has_content = False

    def run(self):
        for source in {s for items in PAPERS.values() for i in items for s in i.source}:
            self.env.note_dependency(str(RESULTS / source))
        try:
            text = page_rst()
        except (OSError, ValueError, KeyError) as err:
            logger.warning("Reproducing the papers: %s", err, location=self.get_location())
            return []
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(text, source="docs/results"), self.content_offset, container,
                                match_titles=True)
        return container.children


def setup(app):
    app.add_directive("flowgp-reproduction", ReproductionDirective)
