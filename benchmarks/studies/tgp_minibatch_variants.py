"""Issue 24's minibatch case: the default robust TGP fit against variants of its budget on one UCI split, with the
bench's quick preset (1 500 steps in minibatches of 512), next to the SVGP fitted the same way.

    python benchmarks/tgp_minibatch_variants.py --dataset power --split 0

Prints one JSON line per variant: training bound per point, its SVGP stage's, test RMSE / NLL, seconds.
Variants: default (since this issue: natural gradients γ = 0.1 in a minibatch fit's SVGP stage); ng1 (γ = 1
there, the default before); flow-lr1 (Adam at lr, not lr/2, in the flow stage); long-svgp (the SVGP stage takes
3/4 of the steps).
"""
import argparse
import json
import time

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.runner import evaluate_regression
from flowgp.data.tables import uci_split
from flowgp.estimators import RobustFit

VARIANTS = {"default": {}, "ng1": {"svgp_natural_gradient_minibatch": 1.0}, "flow-lr1": {"flow_lr": 1.0},
            "long-svgp": {"svgp_epochs": 0.75}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="power")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--variants", default="svgp," + ",".join(VARIANTS))
    args = p.parse_args(argv)
    split = uci_split(args.dataset, args.split)
    n = len(split.y_train)
    for variant in args.variants.split(","):
        model = "svgp" if variant == "svgp" else "tgp"
        est = make_estimator(model, get_preset("quick"), 100, args.split, n)
        if model == "tgp":
            est.set_params(robust=RobustFit(**VARIANTS[variant]))
        start = time.perf_counter()
        est.fit(split.x_train, split.y_train)
        row = dict(dataset=args.dataset, split=args.split, variant=variant, seconds=round(time.perf_counter() - start, 1),
                   bound=est.elbo(split.x_train, split.y_train) / n,
                   svgp_stage=getattr(est, "fit_report_", {}).get("svgp_bound"),
                   **evaluate_regression(est, split.x_test, split.y_test))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
