"""Our results next to a paper's: mean ± standard error over runs, the difference in standard errors, the
ordering of a quantity with depth, and the count behind the TGP paper's few-inducing-points claim.

Used by the documentation's "Reproducing the papers" page (computed from the committed result rows when the
site is built) and by the study scripts that write the same tables, so both read the rows one way.
"""
from __future__ import annotations

import math
from collections import defaultdict

__all__ = ["mean_se", "difference_in_se", "ordering", "INDUCING_CLAIM_MODELS", "INDUCING_CLAIMANTS",
           "inducing_summary", "inducing_claim", "inducing_claim_counts"]


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the finite values among `values`.

    The standard error is s / √n with the sample standard deviation s (ddof 1); it is NaN for n = 1 (one run has
    no spread) and the mean is NaN too for n = 0.

    Examples:
        >>> from flowgp.reporting.comparison import mean_se
        >>> mean_se([1.0, 2.0, 4.0, 5.0])
        (3.0, 0.9128709291752769, 4)
    """
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = sum(v) / n
    if n == 1:
        return mean, float("nan"), 1
    return mean, math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1) / n), n


def difference_in_se(mean: float, se: float | None, reference: float, reference_se: float | None = None) -> float:
    """(mean − reference) / √(se² + reference_se²): the gap in units of the combined standard error.

    A spread that is not known (None or NaN: a published number without one, or a single run of ours) is left
    out, so the gap is in units of the other side's standard error alone (which overstates it). NaN when neither
    side has a spread or both are 0.

    Examples:
        >>> from flowgp.reporting.comparison import difference_in_se
        >>> difference_in_se(1.5, 0.3, 1.0, 0.4)
        1.0
    """
    known = [s for s in (se, reference_se) if s is not None and math.isfinite(s)]
    variance = sum(s * s for s in known)
    if mean is None or reference is None or not known or variance <= 0:
        return float("nan")
    return (mean - reference) / math.sqrt(variance)


def ordering(means: dict) -> str:
    """How a quantity moves with depth: "rises", "falls" or "mixed", with the step signs, e.g.
    ``"falls: 2 > 3 > 4"`` for {2: -1, 3: -2, 4: -3}; "—" for fewer than two depths."""
    depths = sorted(means)
    if len(depths) < 2:
        return "—"
    signs = ["<" if means[b] > means[a] else ">" for a, b in zip(depths, depths[1:])]
    word = "rises" if set(signs) == {"<"} else "falls" if set(signs) == {">"} else "mixed"
    return word + ": " + "".join(f"{a} {s} " for a, s in zip(depths, signs)) + f"{depths[-1]}"


# ----- the TGP paper's claim: 5 inducing points and an input-dependent flow against a sparse GP with 100 -------
#: the models of the inducing-point sweep (TGP paper, Fig. 9 and appendix Fig. 5)
INDUCING_CLAIM_MODELS = ("svgp", "tgp", "pe-tgp", "ba-tgp")
#: the models the abstract's claim is about: the input-dependent flows, Bayesian and point estimate
INDUCING_CLAIMANTS = ("ba-tgp", "pe-tgp")


def inducing_summary(rows) -> dict:
    """{(dataset, model, M): {"nll": (mean, se), "rmse": (mean, se), "splits": n, "epochs": sorted epochs}} of the
    regression rows of the sweep's models (`flowgp bench uci` rows: dataset, model, num_inducing, nll, rmse)."""
    groups = defaultdict(lambda: {"nll": [], "rmse": [], "epochs": set()})
    for r in rows:
        if r.get("task", "regression") != "regression" or r.get("model") not in INDUCING_CLAIM_MODELS:
            continue
        g = groups[(r["dataset"], r["model"], int(r["num_inducing"]))]
        g["nll"].append(float(r["nll"]))
        g["rmse"].append(float(r["rmse"]))
        if r.get("epochs") is not None:
            g["epochs"].add(int(r["epochs"]))
    return {k: {"nll": mean_se(v["nll"])[:2], "rmse": mean_se(v["rmse"])[:2], "splits": len(v["nll"]),
                "epochs": sorted(v["epochs"])} for k, v in groups.items()}


def inducing_claim(summary: dict, few: int = 5, many: int = 100) -> list[dict]:
    """One row per data set where the SVGP at M = `many` and a claimant at M = `few` both have rows.

    The claim holds for a claimant when its mean test NLL is at most the SVGP's mean plus the larger of the two
    standard errors (a single split has none: then only "better than" counts). Keys: dataset, svgp_m100_nll,
    svgp_m100_se, svgp_splits, and per claimant present `<model>_m5_nll`, `_m5_se`, `_splits`, `_holds` (the
    names say 5 and 100 whatever `few` and `many` are, the paper's numbers)."""
    if few >= many:
        raise ValueError(f"few ({few}) must be smaller than many ({many}): the claim compares few inducing points "
                         "with many")
    table = []
    for dataset in sorted({k[0] for k in summary}):
        ref = summary.get((dataset, "svgp", many))
        if ref is None:
            continue
        row = {"dataset": dataset, "svgp_m100_nll": ref["nll"][0], "svgp_m100_se": ref["nll"][1],
               "svgp_splits": ref["splits"]}
        for model in INDUCING_CLAIMANTS:
            got = summary.get((dataset, model, few))
            if got is None:
                continue
            tolerance = max((se for se in (ref["nll"][1], got["nll"][1]) if not math.isnan(se)), default=0.0)
            row[f"{model}_m5_nll"], row[f"{model}_m5_se"] = got["nll"]
            row[f"{model}_splits"] = got["splits"]
            row[f"{model}_holds"] = bool(got["nll"][0] <= ref["nll"][0] + tolerance)
        table.append(row)
    return table


def inducing_claim_counts(table: list[dict]) -> dict[str, tuple[int, int]]:
    """{claimant: (data sets where the claim holds, data sets where the claimant has rows)}."""
    return {m: (sum(bool(r.get(f"{m}_holds")) for r in table), sum(f"{m}_holds" in r for r in table))
            for m in INDUCING_CLAIMANTS}
