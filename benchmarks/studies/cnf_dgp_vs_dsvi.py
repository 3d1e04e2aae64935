"""Issue 20's scorecard: the `cnf-dgpL` rows of a bench results file against the `dgpL` rows of the same splits.

    python benchmarks/cnf_dgp_vs_dsvi.py docs/results/cnf-dgp-v3/uci.jsonl [more.jsonl ...] [--markdown] [--per-split]

Several files are read as one (a row of a later file replaces an earlier row of the same model, set and split).
`--refit FILE ...` takes refitted cnf rows (e.g. the same fits rerun on newer code), says how many of them differ
from the rows they replace, and scores with them in place.
`--per-split` (with --markdown) also prints one line per pair: DSVI's training ELBO per point on standardised
targets (the bench's ELBO plus n·log y_scale), the flow's gain, the kept (source, λ*) and both test NLLs.

Per depth L: splits where both rows exist; how often the flow's training ELBO is above DSVI's (win), equal to
rounding (tie: |difference| <= 1e-9 of the bound, the flow kept at strength 0, i.e. exactly its DSVI base) or
below (loss); the mean and largest ELBO gain per point; the mean difference of test log-likelihood (−NLL) and
each model's average rank by test NLL over the splits (1 = better; NLLs equal to rounding, 1e-9 relative, tie).
Targets of the issue: >= 50 wins of 60 per depth, mean test log-likelihood no worse than DSVI's by more than
0.01, average rank no worse. For reading a rank difference of a split or two: the paired standard error of the
mean test-LL difference and the exact two-sided sign test of the test-NLL wins against the losses (equal NLLs
left out): the probability, were the two models equally likely to win a split, of a split of wins and losses at
least as uneven as the one seen.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


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


#: test-NLL differences (nats per test point) below this count as ties in the "clear" wins / losses column
TIE_NATS = 1e-3
#: relative size of a difference that is floating-point rounding (the same rule as the training-ELBO tie)
ROUNDING = 1e-9


def rank_by_test_nll(nll_cnf: float, nll_dsvi: float) -> float:
    """The flow's rank on one split by test NLL: 1 better, 2 worse, 1.5 a tie.

    A tie is a difference at rounding level (|difference| <= 1e-9 of the NLL). A flow kept at strength 0 is its
    DSVI base with the same parameters, and its predictive differs from the DSVI row's only by the order of the
    floating-point sums (about 1e-12 nats); ranking that as a win or a loss scores rounding, not the models.
    """
    if abs(nll_cnf - nll_dsvi) <= ROUNDING * max(1.0, abs(nll_dsvi)):
        return 1.5
    return 1.0 if nll_cnf < nll_dsvi else 2.0


def scorecard(rows):
    by_key = pairs_by_key(rows)
    out = {}
    for depth in sorted({k[0] for k in by_key}):
        pairs = [v for k, v in sorted(by_key.items()) if k[0] == depth and len(v) == 2]
        if not pairs:
            continue
        wins = ties = losses = 0
        gains, dll, rank_cnf, rank_dsvi, strengths = [], [], [], [], []
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
            rank_dsvi.append(3.0 - rank_cnf[-1])
            if c.get("flow_strength") is not None:
                strengths.append(c["flow_strength"])
        n = len(pairs)
        mean_dll = sum(dll) / n
        se_dll = math.sqrt(sum((v - mean_dll) ** 2 for v in dll) / (n - 1) / n) if n > 1 else math.nan
        ll_wins, ll_losses = sum(r == 1.0 for r in rank_cnf), sum(r == 2.0 for r in rank_cnf)
        # the same count with differences below TIE_NATS called ties: per-split differences that small are below
        # the S = 100 predictive's own noise (sd 0.003-0.005 nats, cnf_dgp_predictive_noise.py)
        clear_wins, clear_losses = sum(v > TIE_NATS for v in dll), sum(v < -TIE_NATS for v in dll)
        out[depth] = {"splits": n, "wins": wins, "ties": ties, "losses": losses,
                      "mean_gain_per_point": sum(gains) / n, "max_gain_per_point": max(gains),
                      "mean_test_ll_difference": sum(dll) / n, "rank_cnf": sum(rank_cnf) / n,
                      "rank_dsvi": sum(rank_dsvi) / n, "test_ll_difference_se": se_dll,
                      "test_ll_wins": ll_wins, "test_ll_losses": ll_losses,
                      "sign_test_p": sign_test_p(ll_wins, ll_losses),
                      "test_ll_clear_wins": clear_wins, "test_ll_clear_losses": clear_losses,
                      "flow_kept": sum(s > 0 for s in strengths), "datasets": sorted({p["cnf"]["dataset"] for p in pairs})}
    return out


def refit_summary(rows, refits, rel=1e-6) -> str:
    """How the refitted cnf rows compare with the rows they replace (same model, set and split)."""
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--per-split", action="store_true")
    p.add_argument("--refit", nargs="+", default=None, metavar="FILE",
                   help="refitted cnf rows: print how many of them change the row they replace (kept strength or "
                        "source, or test NLL / training ELBO beyond 1e-6 relative), then score with them in place")
    a = p.parse_args()
    rows = []
    for path in a.results:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    if a.refit:
        refits = [json.loads(line) for path in a.refit for line in open(path) if line.strip()]
        print(refit_summary(rows, refits))
        rows += refits
    card = scorecard(rows)
    if not a.markdown:
        print(json.dumps(card, indent=1))
        return
    print("| L | splits | wins / ties / losses (training ELBO) | flow kept (λ* > 0) | mean / max gain per point | "
          "mean test LL cnf − DSVI (± s.e.) | average rank cnf / DSVI | test-LL wins / losses (sign test p) | "
          f"wins / losses beyond {TIE_NATS:g} nats |")
    print("|---|---|---|---|---|---|---|---|---|")
    for depth, c in card.items():
        print(f"| {depth} | {c['splits']} | {c['wins']} / {c['ties']} / {c['losses']} | {c['flow_kept']} | "
              f"{c['mean_gain_per_point']:+.5f} / {c['max_gain_per_point']:+.5f} | "
              f"{c['mean_test_ll_difference']:+.4f} (± {c['test_ll_difference_se']:.4f}) | "
              f"{c['rank_cnf']:.2f} / {c['rank_dsvi']:.2f} | "
              f"{c['test_ll_wins']} / {c['test_ll_losses']} ({c['sign_test_p']:.2f}) | "
              f"{c['test_ll_clear_wins']} / {c['test_ll_clear_losses']} |")
    if a.per_split:
        print("\n| L | set | split | DSVI ELBO/N | cnf − DSVI ELBO/N | flow kept (source, λ*) | test NLL DSVI / cnf |")
        print("|---|---|---|---|---|---|---|")
        for (depth, dataset, split), pair in sorted(pairs_by_key(rows).items()):
            if len(pair) != 2:
                continue
            d, c = pair["dsvi"], pair["cnf"]
            n = d["n_train"]
            standardised = (d["train_elbo"] + n * math.log(d["y_scale"])) / n
            print(f"| {depth} | {dataset} | {split} | {standardised:+.4f} | {(c['train_elbo'] - d['train_elbo']) / n:+.5f} | "
                  f"{c.get('flow_source')}, {c.get('flow_strength')} | {d['nll']:.4f} / {c['nll']:.4f} |")


if __name__ == "__main__":
    main()
