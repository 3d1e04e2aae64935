"""Does GPflow 1's jittered natural-gradient step, which the DREG authors' runs use, explain part of the gap to
their power scores?

Answer (2026-11-30): no. To first order it moves the test log-likelihood by -0.0015 on our power split 0 at
300 016 iterations and by -0.0004 on the authors' split 8 at 150 166: far below the gap.

The DREG authors train the last layer's q(u) with GPflow 1's `NatGradOptimizer` (natural parameters, γ = 0.01,
× 0.98 per 1 000 iterations). After each step it maps the natural parameters back to (m, chol S) and takes that
Cholesky of S + 10⁻⁶ I (`_cholesky_with_jitter`, settings.jitter), so every step adds 10⁻⁶ I to the whitened S;
`flowgp.training.natural_gradients.NaturalGradient` adds nothing. In the conjugate case the step is, per eigen-direction of the
optimum S* (eigenvalue s*, the same basis throughout since ε I commutes with everything),

    p' = (1 - γ)/s + γ/s*,   θ₁' = (1 - γ) m/s + γ m*/s*,   m' = θ₁'/p',   s' = 1/p' + ε,

with fixed point s = [(s* + ε) + √((s* + ε)² + 4(1 - γ) ε s*/γ)]/2, about √(ε s*/γ) when s* ≪ ε/γ: as γ is annealed
the small eigenvalues of S grow (×78 for s* = 7·10⁻⁶ by 300 016 iterations), while m stays at m*.

This script runs that recursion (`flowgp.bench.ldgp_ablations.jittered_state`) over the schedule up to a checkpoint's step for every eigenvalue of the fitted
last layer's S (our fit, without the jitter, stands in for S*), puts the result into the state and scores the
test set as `ldgp_learning_curve.py` does (10 000 z per point, prediction seed 0), beside the unchanged state.
Nothing else is refitted, so it measures the first-order effect, not the co-adapted one.

    FLOWGP_DATA=../shared/data python -m benchmarks.studies.ldgp_natgrad_jitter \\
        --checkpoint docs/results/ldgp/table1-uci/power-curve/ldgp2-reg-power-0.ckpt --split 0
    ... --checkpoint docs/results/ldgp/table1-uci/power-authors-splits/ldgp2-reg-power-8-rows-authors.ckpt \\
        --split 8 --row-order authors --iterations 300000
"""
from __future__ import annotations

import json
import math

import numpy as np

from benchmarks.lib.ldgp_runs import checkpoint_parser, fit_from_state, reference_estimator, split_and_checkpoint
from flowgp.bench.ldgp_ablations import jittered_state


def main(argv=None) -> int:
    p = checkpoint_parser(__doc__.splitlines()[0], "a ldgp_learning_curve.py checkpoint of ldgp2-reg on power")
    p.add_argument("--iterations", type=int, default=None, help="the run's budget (default: the checkpoint's step)")
    p.add_argument("--num-importance", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--samples", type=int, default=10000)
    args = p.parse_args(argv)
    split, n, saved = split_and_checkpoint(args)
    step = int(saved["step"])
    est, _, _ = reference_estimator(n, args.split, args.batch_size, args.iterations or step,
                                    num_importance=args.num_importance, num_samples_predict=args.samples,
                                    verbose=False)
    jittered, growth = jittered_state(saved["model"], step)
    for name, model_state in (("as fitted", saved["model"]), ("GPflow's natgrad jitter", jittered)):
        est.set_params(seed=args.split)  # the fit's own seed, for the resume's check (the scores use seed 0)
        fit_from_state(est, dict(saved, model=model_state), split)
        est.set_params(seed=0)
        lpd = est.log_predictive_density(split.x_test, split.y_test) + math.log(est.y_scale_)
        row = {"checkpoint": args.checkpoint, "step": step, "state": name, "test_ll_std": float(lpd.mean()),
               "median": float(np.median(lpd)), "q05": float(np.quantile(lpd, 0.05))}
        if name != "as fitted":
            row["eigenvalue_growth_quantiles"] = [round(float(v), 3) for v in np.quantile(growth, [0, .1, .5, .9, 1])]
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
