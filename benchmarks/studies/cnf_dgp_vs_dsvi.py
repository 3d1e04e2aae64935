"""Does the flow posterior (`cnf-dgpL`) end at or above DSVI (`dgpL`) on the UCI quick grid, in training bound and
on the test set?

Answer (2026-11-29, 6 sets x 10 splits at L = 2, 3, 4): training ELBO wins / ties / losses 57/3/0, 56/4/0, 56/4/0
(never below DSVI); mean test log-likelihood cnf - DSVI +0.0013 (± 0.0007), +0.0004 (± 0.0005), +0.0012
(± 0.0005); average rank by test NLL 1.39 / 1.61, 1.50 / 1.50, 1.37 / 1.63 (sign test p = 0.11, 1.00, 0.04).
The aims were >= 50 wins of 60 per depth, a mean test log-likelihood no worse than DSVI's by more than 0.01 and
an average rank no worse: met at every depth (L = 3 as a tie).

The scorecard reads the `cnf-dgpL` rows of bench results files against the `dgpL` rows of the same splits
(`flowgp.bench.dgp_tables.scorecard`):

    python -m benchmarks.studies.cnf_dgp_vs_dsvi RUN/uci.jsonl [more.jsonl ...] [--markdown] [--per-split]

Several files are read as one (a row of a later file replaces an earlier row of the same model, set and split).
`--refit FILE ...` takes refitted cnf rows (e.g. the same fits rerun on newer code), says how many of them differ
from the rows they replace, and scores with them in place.
`--per-split` (with --markdown) also prints one line per pair: DSVI's training ELBO per point on standardised
targets (the bench's ELBO plus n·log y_scale), the flow's gain, the kept (source, λ*) and both test NLLs.

Per depth L: splits where both rows exist; how often the flow's training ELBO is above DSVI's (win), equal to
rounding (tie: |difference| <= 1e-9 of the bound, the flow kept at strength 0, i.e. exactly its DSVI base) or
below (loss); the mean and largest ELBO gain per point; the mean difference of test log-likelihood (−NLL) and
each model's average rank by test NLL over the splits (1 = better; NLLs equal to rounding, 1e-9 relative, tie).
For reading a rank difference of a split or two: the paired standard error of the
mean test-LL difference and the exact two-sided sign test of the test-NLL wins against the losses (equal NLLs
left out): the probability, were the two models equally likely to win a split, of a split of wins and losses at
least as uneven as the one seen.
"""
from __future__ import annotations

import argparse
import json

from flowgp.bench.dgp_tables import per_split_lines, refit_summary, scorecard, scorecard_lines
from flowgp.bench.results import read_row_files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--per-split", action="store_true")
    p.add_argument("--refit", nargs="+", default=None, metavar="FILE",
                   help="refitted cnf rows: print how many of them change the row they replace (kept strength or "
                        "source, or test NLL / training ELBO beyond 1e-6 relative), then score with them in place")
    a = p.parse_args(argv)
    rows = read_row_files(a.results)
    if a.refit:
        refits = read_row_files(a.refit)
        print(refit_summary(rows, refits))
        rows += refits
    card = scorecard(rows)
    if not a.markdown:
        print(json.dumps(card, indent=1))
        return 0
    print("\n".join(scorecard_lines(card)))
    if a.per_split:
        print("\n" + "\n".join(per_split_lines(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
